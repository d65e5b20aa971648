"""Strict JSON for every file and line flowgym writes (in the lowest layer, so that every layer writes it):
numpy scalars and arrays as plain numbers and lists, and a number that is not finite (a metric with no
finished request, an unbounded score) as ``null``, never as the bare ``NaN`` / ``Infinity`` that Python's
:mod:`json` writes by default and that other JSON readers (``jq``, JavaScript, most databases) refuse.
And one strict reader, :func:`loads`, for the JSON a user gives: a key given twice in one object is refused,
where :func:`json.loads` would silently keep the last one."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

__all__ = ["plain", "dump", "dumps", "loads", "DuplicateKeyError"]


def plain(o: Any) -> Any:
    """``o`` with numpy values made Python values, tuples lists, paths their text, and non-finite floats
    ``None``."""
    if isinstance(o, Mapping):  # numpy keys as Python ones (JSON keys are strings; json writes these as such)
        return {(k.item() if isinstance(k, np.generic) else k): plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [plain(v) for v in o]
    if isinstance(o, np.ndarray):
        return plain(o.tolist())
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return f if math.isfinite(f) else None
    if isinstance(o, os.PathLike):  # a path (e.g. a learned agent's model directory) as its text
        return os.fspath(o)
    return o


def dump(obj: Any, fh: IO[str], **kwargs: Any) -> None:
    """:func:`json.dump` of :func:`plain` ``(obj)``, refusing anything still not JSON."""
    json.dump(plain(obj), fh, allow_nan=False, **kwargs)


def dumps(obj: Any, **kwargs: Any) -> str:
    """:func:`json.dumps` of :func:`plain` ``(obj)``."""
    return json.dumps(plain(obj), allow_nan=False, **kwargs)


class DuplicateKeyError(ValueError):
    """A key given twice in one JSON object (its message names the key)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(f"key {k!r} is given twice in one object")
        out[k] = v
    return out


def loads(text: str | bytes) -> Any:
    """:func:`json.loads` that refuses a key given twice in one object (:class:`DuplicateKeyError`, a
    ``ValueError``); malformed JSON raises :class:`json.JSONDecodeError` as :func:`json.loads` does."""
    return json.loads(text, object_pairs_hook=_unique)
