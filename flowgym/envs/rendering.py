"""Frames of FlowControl-v0 drawn with numpy alone (``render_mode="rgb_array"`` and ``"human"``).

:func:`draw_frame` paints an ``(H, W, 3)`` uint8 picture of the system at the decision
point, top to bottom:

* a header: slot (or clock), completed requests, evictions so far;
* KV usage: the tokens the active set holds as a bar against ``M`` (green; amber above
  90%; red when the last slot overflowed and evicted);
* the queue: waiting requests on a log scale up to ``queue_cap`` and their prompt tokens
  as a share of ``M``;
* the active set: requests by tokens generated (x) and, when output lengths are known,
  tokens still to generate (y), as a 2-D histogram (darker = more); with unknown lengths,
  a histogram of tokens generated (the rest is not revealed, as in the observation);
* a short history: KV usage of the last slots, with ``M`` as a red line.

Text uses a built-in 5x7 pixel font, so no font file or plotting library is needed.
:class:`HumanWindow` shows the frames in a matplotlib window (``flowgym[plot]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["draw_frame", "HumanWindow", "FRAME_SHAPE"]

#: Height, width and channels of every frame.
FRAME_SHAPE = (400, 600, 3)

_WHITE = (255, 255, 255)
_INK = (40, 40, 40)
_GRID = (200, 200, 200)
_GREEN = (60, 160, 90)
_AMBER = (230, 160, 40)
_RED = (210, 50, 50)
_BLUE = (50, 100, 190)

# 5x7 glyphs, one string of 7 rows of 5 bits per character
_FONT_ROWS = {
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11110 00001 00001 01110 00001 00001 11110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
    "A": "01110 10001 10001 11111 10001 10001 10001", "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110", "D": "11110 10001 10001 10001 10001 10001 11110",
    "E": "11111 10000 10000 11110 10000 10000 11111", "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111", "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110", "J": "00111 00010 00010 00010 00010 10010 01100",
    "K": "10001 10010 10100 11000 10100 10010 10001", "L": "10000 10000 10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10101 10001 10001 10001", "N": "10001 10001 11001 10101 10011 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110", "P": "11110 10001 10001 11110 10000 10000 10000",
    "Q": "01110 10001 10001 10001 10101 10010 01101", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "V": "10001 10001 10001 10001 10001 01010 00100",
    "W": "10001 10001 10001 10101 10101 10101 01010", "X": "10001 10001 01010 00100 01010 10001 10001",
    "Y": "10001 10001 01010 00100 00100 00100 00100", "Z": "11111 00001 00010 00100 01000 10000 11111",
    " ": "00000 00000 00000 00000 00000 00000 00000", ".": "00000 00000 00000 00000 00000 01100 01100",
    ",": "00000 00000 00000 00000 01100 00100 01000", ":": "00000 01100 01100 00000 01100 01100 00000",
    ";": "00000 01100 01100 00000 01100 00100 01000",
    "=": "00000 00000 11111 00000 11111 00000 00000", "%": "11000 11001 00010 00100 01000 10011 00011",
    "/": "00000 00001 00010 00100 01000 10000 00000", "-": "00000 00000 00000 11111 00000 00000 00000",
    "(": "00010 00100 01000 01000 01000 00100 00010", ")": "01000 00100 00010 00010 00010 00100 01000",
    "+": "00000 00100 00100 11111 00100 00100 00000", "_": "00000 00000 00000 00000 00000 00000 11111",
    "<": "00010 00100 01000 10000 01000 00100 00010", ">": "01000 00100 00010 00001 00010 00100 01000",
}
_FONT = {c: np.array([[b == "1" for b in row] for row in rows.split()], bool) for c, rows in _FONT_ROWS.items()}


def _text(img: np.ndarray, x: int, y: int, s: str, color: tuple[int, int, int] = _INK, scale: int = 1) -> None:
    """Write ``s`` (upper-cased; unknown characters as blanks) with its top-left corner at ``(x, y)``."""
    for ch in s.upper():
        g = _FONT.get(ch, _FONT[" "])
        if scale > 1:
            g = np.kron(g, np.ones((scale, scale), bool))
        h, w = g.shape
        if x + w > img.shape[1] or y + h > img.shape[0]:
            return
        img[y : y + h, x : x + w][g] = color
        x += w + scale


def _box(img: np.ndarray, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
    img[y0:y1, x0] = color
    img[y0:y1, x1 - 1] = color
    img[y0, x0:x1] = color
    img[y1 - 1, x0:x1] = color


def _fmt(v: float) -> str:
    v = float(v)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}K"
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def draw_frame(
    *,
    t: int,
    clock: float | None,
    M: int,
    held: int,
    overflowed: bool,
    completed: int,
    evictions: int,
    n_queued: int,
    queued_prompt_tokens: int,
    queue_cap: int,
    generated: np.ndarray,
    remaining: np.ndarray | None,
    max_output_len: int,
    usage_history: np.ndarray,
) -> np.ndarray:
    """One frame (``FRAME_SHAPE``, uint8 RGB) of the state described by the arguments.

    ``generated`` and ``remaining`` are per active request (``remaining`` is ``None``
    when output lengths are not known; the x axis then spans the next power of two
    above the most tokens generated, at least 16, and ``max_output_len`` is not used);
    ``usage_history`` is the KV tokens held at the end of each recent slot, oldest first.
    """
    H, W, _ = FRAME_SHAPE
    img = np.full(FRAME_SHAPE, 255, np.uint8)
    left, right = 16, W - 16

    # header
    when = f"T={t}" if clock is None else f"T={clock:.1f} S  ITER {t}"
    _text(img, left, 8, f"FLOWCONTROL-V0  {when}", scale=2)
    _text(img, left, 28, f"COMPLETED {completed}   EVICTIONS {evictions}")

    # KV usage bar
    frac = held / M if M > 0 else 0.0
    y0, y1 = 56, 80
    _text(img, left, y0 - 11, f"KV USAGE {frac:.1%} OF M={M}")
    color = _RED if overflowed else (_AMBER if frac > 0.9 else _GREEN)
    x_fill = left + int(round(min(frac, 1.0) * (right - left)))
    img[y0:y1, left:x_fill] = color
    _box(img, left, y0, right, y1, _INK)

    # queue bar (log scale)
    y0, y1 = 104, 120
    qshare = queued_prompt_tokens / M if M > 0 else 0.0
    _text(img, left, y0 - 11, f"QUEUE {n_queued} REQUESTS, PROMPTS {qshare:.1%} OF M  (LOG SCALE TO {queue_cap})")
    qfrac = np.log1p(min(n_queued, queue_cap)) / np.log1p(queue_cap) if queue_cap > 0 else 0.0
    img[y0:y1, left : left + int(round(qfrac * (right - left)))] = _BLUE
    _box(img, left, y0, right, y1, _INK)

    # active set
    y0, y1 = 146, 272
    n = int(generated.size)
    top_gen = int(generated.max()) + 1 if n else 1
    if remaining is not None:
        xmax = max(int(max_output_len), top_gen)
    else:  # from what has been generated only (the workload's bound could reveal output lengths)
        xmax = 1 << max(4, (top_gen - 1).bit_length())
    if remaining is not None:
        _text(img, left, y0 - 11, f"ACTIVE {n}: TOKENS GENERATED (X, 0..{xmax}) AND TO GO (Y)")
    else:
        _text(img, left, y0 - 11, f"ACTIVE {n}: TOKENS GENERATED (X, 0..{xmax}); OUTPUT LENGTHS HIDDEN")
    pw, ph = right - left - 2, y1 - y0 - 2
    if n:
        gx = np.minimum((generated.astype(np.float64) / xmax * pw).astype(np.int64), pw - 1)
        if remaining is not None:
            gy = np.minimum((remaining.astype(np.float64) / xmax * ph).astype(np.int64), ph - 1)
            counts = np.zeros((ph, pw))
            np.add.at(counts, (ph - 1 - gy, gx), 1.0)
            # grow each point to 3x3 so single requests stay visible
            padded = np.pad(counts, 1)
            grown = sum(padded[1 + dy : 1 + dy + ph, 1 + dx : 1 + dx + pw] for dy in (-1, 0, 1) for dx in (-1, 0, 1))
            norm = np.clip(grown / max(grown.max(), 1.0), 0, 1)
            shade = np.where(grown > 0, 0.4 + 0.6 * norm, 0.0)[..., None]  # a single request stays visible
        else:
            if xmax < pw:  # one bar per token count, as wide as it gets
                counts = np.bincount(np.minimum(generated, xmax - 1), minlength=xmax).astype(np.float64)
                col = counts[np.arange(pw) * xmax // pw]
            else:
                col = np.bincount(gx, minlength=pw).astype(np.float64)
            heights = (col / max(col.max(), 1.0) * ph).astype(np.int64)
            rows = np.arange(ph)[:, None]
            shade = (rows >= ph - heights[None, :]).astype(np.float64)[..., None]
        ink = np.array(_BLUE, np.float64)
        region = img[y0 + 1 : y1 - 1, left + 1 : right - 1].astype(np.float64)
        img[y0 + 1 : y1 - 1, left + 1 : right - 1] = (region * (1 - shade) + ink * shade).astype(np.uint8)
    _box(img, left, y0, right, y1, _INK)

    # usage history
    y0, y1 = 298, H - 16
    hist = np.asarray(usage_history, np.float64)[-(right - left - 2) :]
    _text(img, left, y0 - 11, f"KV USAGE, LAST {hist.size} {'ITERATIONS' if clock is not None else 'SLOTS'} (RED: M)")
    ph = y1 - y0 - 2
    top = 1.1  # the plot spans 0..1.1 M, so M is a visible line
    if hist.size:
        heights = np.clip(hist / (top * M), 0, 1) * ph
        rows = np.arange(ph)[:, None]
        mask = rows >= ph - heights[None, :].astype(np.int64)
        area = img[y0 + 1 : y1 - 1, left + 1 : left + 1 + hist.size]
        area[mask] = _GRID
        area[mask & (hist[None, :] > 0.9 * M)] = _AMBER
    y_m = y0 + 1 + ph - int(round(ph / top))
    img[y_m, left + 1 : right - 1] = _RED
    _box(img, left, y0, right, y1, _INK)
    return img


class HumanWindow:
    """A matplotlib window that shows successive frames (``render_mode="human"``).

    Raises ``ImportError`` naming the ``flowgym[plot]`` extra when matplotlib is missing.
    """

    def __init__(self, fps: float) -> None:
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("render_mode='human' shows frames with matplotlib: pip install -e '.[plot]' in the flowgym checkout "
                              "(or use render_mode='rgb_array' for frames as arrays)") from None
        self._plt = plt
        self._fps = float(fps)
        self._fig: Any = None
        self._im: Any = None

    def show(self, frame: np.ndarray) -> None:
        plt = self._plt
        if self._fig is None or not plt.fignum_exists(self._fig.number):
            self._fig = plt.figure("FlowControl-v0", figsize=(frame.shape[1] / 100, frame.shape[0] / 100))
            ax = self._fig.add_axes((0, 0, 1, 1))
            ax.set_axis_off()
            self._im = ax.imshow(frame)
        else:
            self._im.set_data(frame)
        self._fig.canvas.draw_idle()
        plt.pause(1.0 / self._fps)

    def close(self) -> None:
        if self._fig is not None:
            self._plt.close(self._fig)
            self._fig = None
