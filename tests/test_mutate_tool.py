"""tools/mutate.py: the pieces that decide what a mutant run tests (not the run itself: that takes hours)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("_flowgym_mutate_tool", ROOT / "tools" / "mutate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def test_interpreted_pcg_step_is_numpys_pcg64_transition(mutate):
    """The plugin's Python PCG64 step (it stands in for the LLVM intrinsic) advances as numpy does."""
    ns: dict = {}
    exec(mutate._INTERP_PLUGIN, ns)
    for seed in (0, 1, 2**40 + 7):
        bg = np.random.PCG64(seed)
        st = bg.state["state"]
        s, inc = st["state"], st["inc"]
        bg.random_raw()  # one transition
        want = bg.state["state"]["state"]
        hi, lo = ns["_pcg_step"](np.uint64(s >> 64), np.uint64(s & (2**64 - 1)), np.uint64(inc >> 64),
                                 np.uint64(inc & (2**64 - 1)))
        assert type(hi) is np.uint64 and type(lo) is np.uint64
        assert (int(hi) << 64) | int(lo) == want


def test_interpreted_boxing_is_numbas(mutate):
    """Return values are boxed as numba boxes them: Python scalars, tuples element by element, arrays kept."""
    ns: dict = {}
    exec(mutate._INTERP_PLUGIN, ns)
    a = np.arange(3)
    out = ns["_box"]((np.int64(3), (np.float64(0.5), np.bool_(True)), a, 7))
    assert out[0] == 3 and type(out[0]) is int
    assert type(out[1][0]) is float and out[1][1] is True
    assert out[2] is a and out[3] == 7


def test_interpreted_env_disables_numba_only_there(mutate, tmp_path):
    assert mutate._env(tmp_path, "py")["NUMBA_DISABLE_JIT"] == "1"
    assert mutate._env(tmp_path, "py")["FLOWGYM_JIT"] == "1"
    for jit in ("0", "1"):
        env = mutate._env(tmp_path, jit)
        assert env["FLOWGYM_JIT"] == jit and env.get("NUMBA_DISABLE_JIT") == __import__("os").environ.get(
            "NUMBA_DISABLE_JIT")
    cmd = mutate._pytest(tmp_path, "py")
    assert "_mutate_interp" in cmd and (tmp_path / "_mutate_interp.py").exists()
    assert "tests/test_kernels.py::test_kernels_compile" in cmd
    assert "_mutate_interp" not in mutate._pytest(tmp_path, "1")


def test_body_lines_are_the_function_bodies(mutate):
    src = "X = 1\n\ndef f(a=2):\n    y = a + 1\n    return y\n\nZ = f()\n"
    body = mutate._body_lines(ast.parse(src))
    assert body == {4, 5}  # not the module lines, not the def line with its default


def test_selection_is_fastest_first_and_cached(mutate, tmp_path):
    """line_map orders the tests by their traced time and reuses a cached trace of the same text and tests."""
    module = "m.py"
    (tmp_path / module).write_text("x = 1\n")
    key = json.dumps(["1", __import__("hashlib").sha256(b"x = 1\n").hexdigest(), ["t.py"]])
    data = {"ok": True, "lines": {"3": ["t.py::slow", "t.py::fast"]}, "order": ["t.py::slow", "t.py::fast"],
            "seconds": {"t.py::slow": 9.0, "t.py::fast": 0.1}}
    cache = tmp_path / "lines.json"
    cache.write_text(json.dumps({key: data}))
    lines, order, took = mutate.line_map(tmp_path, module, ["t.py"], "1", cache)  # no pytest run: it is cached
    assert mutate._select(lines, order, 3, 3) == ["t.py::fast", "t.py::slow"]
    assert mutate._select(lines, order, 4, 9) is None
    assert took == data["seconds"]
