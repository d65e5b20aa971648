"""Input checks shared by the modules: each error names the field and the value."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["non_negative", "positive", "positive_int"]


def non_negative(name: str, value: Any) -> float:
    """``value`` as a finite float >= 0, else ``ValueError`` naming ``name``."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return x


def positive(name: str, value: Any) -> float:
    """``value`` as a finite float > 0, else ``ValueError`` naming ``name``."""
    x = non_negative(name, value)
    if x == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return x


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1 (whole floats accepted), else ``ValueError`` naming ``name``."""
    try:
        ok = float(value) == int(value) and int(value) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or isinstance(value, bool):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
