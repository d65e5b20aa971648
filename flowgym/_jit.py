"""Optional compiled kernels (numba) for the engine's per-slot loops.

The engine's hot path is a handful of small numpy calls per slot; at the sizes
of one slot (a few admissions, a few hundred active requests) their fixed cost
dominates. When numba is installed (``pip install flowgym[fast]``) these
kernels replace them:

* :func:`fill_range`: append a slot's arrivals (consecutive ids) to a FIFO lane;
* :func:`admit_lane`: move the first ``k`` ids of a queue lane into the active
  arrays and book their completions in the calendar (:func:`count_classes`
  keeps the per-class queue counts when they are observed);
* :func:`histogram_into`: the generated-tokens histogram of the observation;
* :func:`projected_demand`: the known-length projection ``D_{t+h}``.

They touch no random generator and compute exactly what the numpy code does
(same integers), so results do not depend on whether numba is present
(``tests/test_jit.py`` runs both paths side by side). Set the environment
variable ``FLOWGYM_JIT=0`` to use the numpy code even when numba is installed;
:attr:`flowgym.engine.Engine.jit` switches one engine.

Kernels are compiled on first use and cached next to this file
(``cache=True``), so only the first process after an install pays the
compilation (about a second).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np

__all__ = ["AVAILABLE", "ENABLED", "load", "admit_lane", "count_classes", "fill_range", "histogram_into",
           "projected_demand"]

#: numba is installed (it is imported only when the kernels are used).
AVAILABLE: bool = importlib.util.find_spec("numba") is not None
#: New engines use the kernels (numba available and ``FLOWGYM_JIT`` not ``0``).
ENABLED: bool = AVAILABLE and os.environ.get("FLOWGYM_JIT", "1").strip().lower() not in ("0", "false", "no", "off")

_numba: Any = None  # the numba module, once loaded


def _admit_lane(buf, head, k, a_id, a_start, a_fin, tail, t, output, prompt, finish, cal_n, cal_tok):
    # pragma: no cover - compiled
    """Activate ``buf[head:head+k]`` at slot ``t`` into ``[tail, tail+k)``; return their prompt tokens.

    The calendar's size is a power of two (a ring indexed by ``f & (size - 1)``).
    """
    mask = cal_n.size - 1
    p = 0
    for r in range(k):
        i = buf[head + r]
        f = output[i] + t  # finishes at f_i = t + o_i unless evicted
        a_id[tail + r] = i
        a_start[tail + r] = t
        a_fin[tail + r] = f
        finish[i] = f
        c = f & mask
        ln = prompt[i]
        cal_n[c] += 1
        cal_tok[c] += ln + f - t  # l + o
        p += ln
    return p


def _count_classes(buf, head, k, cls, class_queue):  # pragma: no cover - compiled
    """``class_queue[cls[i]] -= 1`` for the ids ``buf[head:head+k]`` (admitted, with per-class counts)."""
    for r in range(k):
        class_queue[cls[buf[head + r]]] -= 1


def _fill_range(buf, start, lo, hi):  # pragma: no cover - compiled
    """``buf[start + r] = lo + r`` for ``r < hi - lo``."""
    for r in range(hi - lo):
        buf[start + r] = lo + r


def _histogram_into(starts, fin, h, tail, t, edges, out, off):  # pragma: no cover - compiled
    """``out[off + k]`` = alive entries of ``[h, tail)`` with ``t - start`` in ``[edges[k], edges[k+1])`` (last open)."""
    K = edges.size
    for k in range(K):
        out[off + k] = 0
    for r in range(h, tail):
        if fin[r] > t:
            j = t - starts[r]
            if j < edges[0]:  # below the first bin: not counted (as the numpy path)
                continue
            k = K - 1
            while j < edges[k]:  # ends at k = 0 at the latest, since edges[0] <= j
                k -= 1
            out[off + k] += 1


def _projected_demand(held, act, t, mask, cal_n, cal_tok, offsets, out):  # pragma: no cover - compiled
    """``out[j] = D_{t + offsets[j]}`` from the completion calendar (see ``Engine.projected_demand``)."""
    H = 0
    for j in range(offsets.size):
        out[j] = 0
        if offsets[j] > H:
            H = offsets[j]
    for j in range(offsets.size):
        if offsets[j] == 0:
            out[j] = held + act
    sum_act = 0
    tok = 0
    for h in range(1, H + 1):
        sum_act += act
        i = (t + h) & mask
        act -= cal_n[i]
        tok += cal_tok[i]
        if act == 0:  # everyone has finished: D is 0 from here on
            break
        d = held + sum_act - tok + act
        for j in range(offsets.size):
            if offsets[j] == h:
                out[j] = d


#: The compiled kernels (``None`` until :func:`load`).
fill_range: Any = None
admit_lane: Any = None
count_classes: Any = None
histogram_into: Any = None
projected_demand: Any = None


def load() -> None:
    """Import numba and set up the kernels (compiled on first call); raises ``RuntimeError`` without numba."""
    global _numba, fill_range, admit_lane, count_classes, histogram_into, projected_demand
    if _numba is not None:
        return
    try:
        import numba
    except ImportError:
        raise RuntimeError("the compiled kernels need numba: pip install 'flowgym[fast]'") from None
    njit = numba.njit(cache=True, nogil=True)
    fill_range, admit_lane, count_classes = njit(_fill_range), njit(_admit_lane), njit(_count_classes)
    histogram_into, projected_demand = njit(_histogram_into), njit(_projected_demand)
    _numba = numba


if ENABLED:
    load()


def check_kernels() -> None:
    """Run each kernel once on tiny inputs (compiles them; raises if numba cannot)."""
    if not AVAILABLE:
        return
    load()
    z = np.zeros(8, np.int64)
    e = np.array([0, 2], np.int64)
    f32 = np.zeros(4, np.float32)
    fill_range(z, 0, 0, 0)
    admit_lane(z, 0, 0, z, z, z, 0, 0, z, z, z, z, z)
    count_classes(z, 0, 0, z, z)
    histogram_into(z, z, 0, 0, 0, e, f32, 0)
    projected_demand(0, 0, 0, 7, z, z, e, z)
