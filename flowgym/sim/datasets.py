"""The data behind the real and published-figure workloads, as plain arrays.

* :func:`azure_columns` - the Azure LLM inference traces 2023 (``"conv"``,
  ``"code"``; Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0, see
  ``flowgym/data/NOTICE``): timestamps (seconds from the first request) and
  lengths, optionally sped up by ``rate_multiplier`` and cut to a ``window``;
  :func:`azure_pairs` - their distinct ``(prompt, output)`` pairs with counts.
* :data:`LMSYS_SAMPLE` - the published median and mean lengths of a
  10,000-conversation LMSYS-Chat-1M sample (Jaillet et al. 2025; words as
  tokens), from which :func:`flowgym.sim.workloads.lmsys_like_lengths` builds a
  clearly labelled **synthetic** stand-in (the dataset itself may not be
  passed on).

The workloads built from them (:func:`flowgym.sim.workloads.azure_trace`,
:func:`~flowgym.sim.workloads.azure_lengths`,
:func:`~flowgym.sim.workloads.lmsys_like_lengths`) live in
:mod:`flowgym.sim.workloads`, which imports this module. The package data are
compact ``.npz`` files built from the original CSVs by :func:`build_azure_npz`
(the original files are in the project's shared data).
"""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np

from flowgym.sim._checks import is_finite_real


__all__ = [
    "AZURE_KINDS",
    "azure_columns",
    "azure_pairs",
    "build_azure_npz",
    "LMSYS_SAMPLE",
]

AZURE_KINDS = ("conv", "code")

#: Published figures of a 10,000-conversation LMSYS-Chat-1M sample (Jaillet et al. 2025), in words.
LMSYS_SAMPLE = {"prompt_median": 11.0, "prompt_mean": 40.62, "output_median": 45.0, "output_mean": 85.32}


def build_azure_npz(csv_path: str, npz_path: str) -> int:
    """Convert an Azure trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens) to the package's npz form.

    Timestamps become float64 seconds since the first request; lengths int32.
    Returns the row count. A row that is short, has a timestamp numpy cannot read or a length that is not an
    integer from 1 to ``2**31 - 1`` raises ``ValueError`` naming the file, the row (the header is row 1) and the
    column; so does a file with no rows.
    """
    ts, ctx, gen = [], [], []
    with open(csv_path, newline="") as fh:
        rd = csv.reader(fh)
        header = next(rd, [])
        if [h.strip() for h in header[:3]] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"{csv_path}: unexpected header {header}")
        for i, row in enumerate(rd, start=2):
            if len(row) < 3:
                raise ValueError(f"{csv_path}, row {i}: expected TIMESTAMP, ContextTokens, GeneratedTokens, got {row}")
            stamp = row[0].strip().replace(" ", "T")
            try:
                when = np.datetime64(stamp)  # its own unit: a date beyond what nanoseconds hold must not wrap
                bad = np.isnat(when)  # "" and "NaT" read as not-a-time
            except (ValueError, OverflowError):
                bad = True
            if bad:
                raise ValueError(f"{csv_path}, row {i}: TIMESTAMP {row[0]!r} is not a date and time")
            if not _NS_FIRST <= when < _NS_END:
                raise ValueError(f"{csv_path}, row {i}: TIMESTAMP {row[0]!r} is outside the years 1678-2261 that "
                                 "nanosecond times hold")
            ts.append(stamp)
            ctx.append(_length(csv_path, i, "ContextTokens", row[1]))
            gen.append(_length(csv_path, i, "GeneratedTokens", row[2]))
    if not ts:
        raise ValueError(f"{csv_path}: no requests after the header")
    t = np.array(ts, dtype="datetime64[ns]")
    sec = (t - t.min()).astype(np.int64) / 1e9
    order = np.argsort(sec, kind="stable")
    np.savez_compressed(
        npz_path,
        time=sec[order],
        prompt_len=np.asarray(ctx, dtype=np.int32)[order],
        output_len=np.asarray(gen, dtype=np.int32)[order],
    )
    return len(ts)


#: The span of ``datetime64[ns]`` (whole days inside it): a time outside would wrap around silently.
_NS_FIRST, _NS_END = np.datetime64("1678-01-01"), np.datetime64("2262-01-01")


def _length(path: str, row: int, column: str, text: str) -> int:
    """``text`` as a token count from 1 to ``2**31 - 1`` (stored as int32), else ``ValueError`` naming where."""
    t = text.strip()
    if not (t.isascii() and t.isdigit() and len(t) <= 12 and 1 <= int(t) <= 2**31 - 1):  # no sign, point, exponent
        raise ValueError(f"{path}, row {row}: {column} must be an integer from 1 to 2**31 - 1, got {text!r}")
    return int(t)


def _load(kind: str) -> dict[str, np.ndarray]:
    if kind not in AZURE_KINDS:
        raise ValueError(f"Azure trace kind must be one of {AZURE_KINDS}, got {kind!r}")
    with resources.files("flowgym.data").joinpath(f"azure_{kind}_2023.npz").open("rb") as fh:
        with np.load(fh) as z:
            return {k: z[k] for k in z.files}


def azure_columns(trace: str = "conv", *, rate_multiplier: float = 1.0,
                  window: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Azure 2023 trace's ``(time, prompt_len, output_len)`` columns (float64 s, int64, int64).

    Args:
        trace: ``"conv"`` (19,366 requests) or ``"code"`` (8,819).
        rate_multiplier: divide all inter-arrival times by this (2.0 = twice the load).
        window: keep requests whose original time (seconds from the first) is in
            ``[start, end)``; times are then shifted to start at 0.
    """
    d = _load(trace)
    t = d["time"]
    keep = np.ones(t.size, bool)
    if window is not None:
        if (isinstance(window, (str, bytes, dict)) or not hasattr(window, "__len__") or len(window) != 2
                or not all(is_finite_real(x) for x in window)):
            raise ValueError(f"window must be two numbers [start, end] (seconds), got {window!r}")
        lo, hi = float(window[0]), float(window[1])
        if not 0 <= lo < hi:
            raise ValueError(f"window must satisfy 0 <= start < end, got {window!r}")
        keep = (t >= lo) & (t < hi)
        if not keep.any():
            raise ValueError(f"window {window!r} holds no request (trace spans 0..{t[-1]:.0f} s)")
    if not (is_finite_real(rate_multiplier) and rate_multiplier > 0):
        raise ValueError(f"rate_multiplier must be positive and finite (a number), got {rate_multiplier!r}")
    tt = t[keep]
    tt = (tt - tt[0]) / float(rate_multiplier)
    return tt, d["prompt_len"][keep].astype(np.int64), d["output_len"][keep].astype(np.int64)


def azure_pairs(trace: str = "conv") -> tuple[np.ndarray, np.ndarray]:
    """The trace's distinct ``(prompt, output)`` pairs (rows) and how often each occurs."""
    d = _load(trace)
    return np.unique(np.stack([d["prompt_len"], d["output_len"]], axis=1), axis=0, return_counts=True)
