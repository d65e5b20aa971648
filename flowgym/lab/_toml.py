"""Reading and writing the TOML of scenario files (tables, arrays, strings, numbers, booleans).

Reading is the standard library's ``tomllib`` (``tomli`` on Python 3.10). Writing covers
what a scenario holds: nested tables become ``[a.b]`` sections, lists of tables
``[[a.b]]`` arrays of tables, and tables inside plain arrays inline tables. TOML has no
null, so ``None`` values are refused (a scenario file leaves such keys out).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["loads", "dumps", "TOMLDecodeError"]

TOMLDecodeError = tomllib.TOMLDecodeError
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def loads(text: str) -> dict[str, Any]:
    """Parse TOML text."""
    return tomllib.loads(text)


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _value(v: Any, where: str) -> str:
    if v is None:
        raise ValueError(f"{where}: TOML has no null; leave the key out")
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(float(v))  # a numpy float's repr is np.float64(1.5)
    if isinstance(v, str):  # a JSON string is a TOML basic string, but for DEL, which TOML wants escaped
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(x, f'{where}.{k}')}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, f"{where}[{i}]") for i, x in enumerate(v)) + "]"
    raise ValueError(f"{where}: cannot write a {type(v).__name__} to TOML")


def _is_table_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, Mapping) for x in v)


def _inline(v: Any, path: list[str]) -> bool:
    """A small flat table below the top level is written inline (``params = {b = 12}``)."""
    if not path or not isinstance(v, Mapping) or any(isinstance(x, Mapping) or _is_table_list(x) for x in v.values()):
        return False
    return len(_value(v, "")) <= 100


def _emit(table: Mapping[str, Any], path: list[str], out: list[str]) -> None:
    plain = [(k, v) for k, v in table.items()
             if (not isinstance(v, Mapping) or _inline(v, path + [k])) and not _is_table_list(v)]
    for k, v in plain:
        out.append(f"{_key(k)} = {_value(v, '.'.join(path + [k]))}")
    for k, v in table.items():
        if isinstance(v, Mapping) and not _inline(v, path + [k]):
            out.append("")
            out.append("[" + ".".join(_key(p) for p in path + [k]) + "]")
            _emit(v, path + [k], out)
    for k, v in table.items():
        if _is_table_list(v):
            for item in v:
                out.append("")
                out.append("[[" + ".".join(_key(p) for p in path + [k]) + "]]")
                _emit(item, path + [k], out)


def dumps(data: Mapping[str, Any], header: str = "") -> str:
    """TOML text of ``data`` (``header`` lines are written first as comments)."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    _emit(data, [], out)
    text = "\n".join(out).lstrip("\n") + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)
