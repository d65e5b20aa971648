"""Input checks shared by the modules: each error names the field and the value."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["is_real", "is_finite_real", "is_count", "holds_bool", "non_negative", "positive", "positive_int", "int_array",
           "calendar_span", "MAX_OUTPUT_SLOTS", "MAX_COUNT"]

#: Longest output (in tokens, so in slots of decoding) the engines can schedule: their completion
#: calendars and per-token tables have one entry per slot of the longest output (2**24: 16.8M
#: tokens, 128 MiB per int64 table).
MAX_OUTPUT_SLOTS = 2**24
#: Largest count (``M``, a horizon, a token or sequence option): 2**53, below which every integer is also an
#: exact float, and sums of a few stay within int64.
MAX_COUNT = 2**53


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number: a Python or numpy integer or float, not a bool (``True`` is an
    ``int`` to Python, never a count or a rate to flowgym), not a numpy ``timedelta64`` and not a string or a
    complex number. Finite or not: the caller checks its range."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_, np.timedelta64))  # numpy's timedelta64 is an integer type to isinstance


def is_finite_real(value: Any) -> bool:
    """Whether ``value`` is a real number (:func:`is_real`) that is finite as a float: not nan or inf, and not
    an integer too large for a float (``10**400``, which ``math.isfinite`` would raise on)."""
    if not is_real(value):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_)) or (isinstance(x, np.ndarray) and x.dtype.kind == "b")


def holds_bool(value: Any) -> bool:
    """``value`` is a bool, or a list or tuple holding one at any depth (which ``numpy.asarray`` would turn
    into integers: ``[True, 2]``, ``[[True], [2]]``)."""
    return _is_bool(value) or (isinstance(value, (list, tuple)) and any(holds_bool(x) for x in value))


def is_count(value: Any) -> bool:
    """Whether ``value`` is a Python or numpy integer ``>= 0`` and not a bool (a budget, a horizon: no float,
    however whole, and no ``True``)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0


def non_negative(name: str, value: Any) -> float:
    """``value`` as a finite float >= 0, else ``ValueError`` naming ``name`` (a string is refused, even ``"12"``:
    a number written as text in a scenario file is a mistake to point at, not to guess)."""
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r} (text, not a number)")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer too large for a float (10**400)
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}") from None
    if isinstance(value, (bool, np.bool_)) or not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return x


def positive(name: str, value: Any) -> float:
    """``value`` as a finite float > 0, else ``ValueError`` naming ``name``."""
    x = non_negative(name, value)
    if x == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return x


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1 (whole floats accepted; no string, no bool), else ``ValueError`` naming ``name``."""
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a positive integer, got {value!r} (text, not a number)")
    try:
        ok = float(value) == int(value) and int(value) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def int_array(name: str, x: Any, n: int | None, minimum: int) -> np.ndarray:
    """``x`` as a one-dimensional int64 array of ``n`` entries (any length if ``None``), each ``>= minimum``;
    whole floats accepted. Else ``ValueError`` naming ``name`` and the first bad index and value."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a one-dimensional sequence, got shape {arr.shape}")
    if n is not None and arr.size != n:
        raise ValueError(f"{name} has {arr.size} entries, expected {n} (one per request)")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{name} must hold integers, got {arr.dtype} values")
        wrong = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if wrong.size:
            bad = int(wrong[0])
            raise ValueError(f"{name}[{bad}] = {arr[bad].item()!r} is not an integer")
    # beyond int64 with room for sums, the cast would wrap: floats either way, integers (int64, uint64) upward
    big = np.flatnonzero((np.abs(arr) if np.issubdtype(arr.dtype, np.floating) else arr) >= 2**62) if arr.size else []
    if len(big):
        bad = int(big[0])
        raise ValueError(f"{name}[{bad}] = {arr[bad].item()!r} is too large (it must be below 2**62)")
    out = arr.astype(np.int64)
    low = np.flatnonzero(out < minimum)
    if low.size:
        i = int(low[0])
        raise ValueError(f"{name}[{i}] = {int(out[i])} must be >= {minimum}")
    return out


def calendar_span(M: int, max_output: int | None) -> int:
    """The longest output an engine must schedule: ``min(M, max_output)`` (an admitted request has
    ``o < M``); ``ValueError`` naming both, before any allocation, beyond :data:`MAX_OUTPUT_SLOTS`."""
    span = int(M) if max_output is None else min(int(M), int(max_output))
    if span > MAX_OUTPUT_SLOTS:
        raise ValueError(f"outputs of up to {span} tokens (the workload's longest output "
                         f"{'unknown' if max_output is None else int(max_output)}, M={int(M)}) are beyond what the "
                         f"engine schedules: at most {MAX_OUTPUT_SLOTS} tokens per request")
    return span
