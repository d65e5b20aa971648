#!/usr/bin/env python
"""Mutation testing of chosen modules: does a one-token change make some test fail?

For each target module, every mutable spot is changed in turn (one mutant at a time):
comparison operators (``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``), arithmetic
(``+`` <-> ``-``, ``*`` <-> ``//`` or ``/``), integer constants (``n`` -> ``n + 1``), boolean
operators (``and`` <-> ``or``), ``not x`` -> ``x``, unary minus dropped, ``min`` <-> ``max`` and
``sum``/``mean`` <-> ``max``. The run works in a temporary copy of the repository (its tracked
and untracked files; ``agents/`` linked as ``flowgym/agents``): each mutant is written into the
copy, the module's tests run there (``pytest -x -q``, a time limit per mutant, with the numba
kernels and then on the numpy path), and the copy is deleted at the end. The working tree is
never written. ``--paths interpreted`` runs numba's kernels as plain Python (for mutants of
``flowgym/sim/kernels.py``: compiled, each mutant recompiles every kernel).
A mutant is *killed* when a test fails, *survived* otherwise; survivors are printed with their
line, for a test that kills them or a reason they are equivalent (docs/testing.md records them).

    python tools/mutate.py flowgym/sim/metrics.py --tests tests/test_metrics_by_hand.py tests/test_env.py
    python tools/mutate.py --preset core           # the modules and tests of docs/testing.md
    python tools/mutate.py --preset engine --by-line --lines 495-851   # slot phases (2026-11-29; docs/testing.md)
    python tools/mutate.py flowgym/sim/kernels.py --tests tests/test_kernels.py --paths interpreted --by-line

The standard library's ``ast`` makes the mutants (maintained mutation tools did not fit this
repository's layout: ``agents/`` is installed as ``flowgym.agents``, and they rewrite the tree
they test into a copy of their own).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Modules and the tests that are meant to pin them (docs/testing.md).
ENGINE_TESTS = ["tests/test_reference_rules.py", "tests/test_semantics.py", "tests/test_engine.py",
                "tests/test_metrics_by_hand.py", "tests/test_continuous.py", "tests/test_engine_mutants.py",
                "tests/test_streaming.py", "tests/test_env.py"]
AGENT_TESTS = ["tests/test_agents.py", "tests/test_agents_mutants.py"]

#: Modules and the tests that are meant to pin them (docs/testing.md).
PRESETS = {
    "core": [
        ("flowgym/sim/metrics.py", ["tests/test_metrics_by_hand.py", "tests/test_env.py", "tests/test_evaluation.py"]),
        ("flowgym/sim/rules.py", ["tests/test_engine.py", "tests/test_semantics.py", "tests/test_reference_rules.py",
                                  "tests/test_agents.py"]),
        ("agents/flow_control.py", AGENT_TESTS),
        ("agents/memory_check.py", AGENT_TESTS),
        ("agents/greedy.py", AGENT_TESTS),
    ],
    # the engine (several hundred mutants): run it with --by-line (and --lines for a part)
    "engine": [("flowgym/sim/engine.py", ENGINE_TESTS)],
}

_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
_CALLS = {"min": "max", "max": "min", "sum": "max", "mean": "max"}


@dataclass
class Mutant:
    index: int
    line: int
    what: str


def _spots(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every node a mutation applies to, with a description, in a fixed order."""
    out: list[tuple[ast.AST, str]] = []
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            out.append((node, f"{type(node.ops[0]).__name__} -> {_CMP[type(node.ops[0])].__name__}"))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            out.append((node, f"{type(node.op).__name__} -> {_BIN[type(node.op)].__name__}"))
        elif isinstance(node, ast.BoolOp) and type(node.op) in _BOOL:
            out.append((node, f"{type(node.op).__name__} -> {_BOOL[type(node.op)].__name__}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            out.append((node, f"drop {type(node.op).__name__}"))
        elif isinstance(node, ast.Constant) and type(node.value) is int and id(node) not in docstrings:
            out.append((node, f"{node.value} -> {node.value + 1}"))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in _CALLS:
                out.append((node, f"{name}() -> {_CALLS[name]}()"))
    return out


def _mutate(tree: ast.Module, k: int) -> tuple[str, Mutant]:
    t = copy.deepcopy(tree)
    node, what = _spots(t)[k]
    if isinstance(node, ast.Compare):
        node.ops = [_CMP[type(node.ops[0])]()]
    elif isinstance(node, ast.BinOp):
        node.op = _BIN[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = _BOOL[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        # replace the operation by its operand, in its parent
        for parent in ast.walk(t):
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, node.operand)
                elif isinstance(value, list):
                    for i, v in enumerate(value):
                        if v is node:
                            value[i] = node.operand
    elif isinstance(node, ast.Constant):
        node.value = node.value + 1
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            node.func.attr = _CALLS[node.func.attr]
        else:
            node.func.id = _CALLS[node.func.id]
    first = getattr(node, "lineno", 0)
    last = getattr(node, "end_lineno", None) or first
    return ast.unparse(ast.fix_missing_locations(t)), Mutant(k, first, what), first, last


def make_copy(dest: Path) -> Path:
    """A copy of the repository's files (tracked and untracked, not ignored) under ``dest``.

    Mutants are written into the copy, never into the working tree (other people edit it while
    a run lasts). ``agents/`` is linked as ``flowgym/agents`` so that ``import flowgym.agents``
    reads the copy (the editable install maps it to the original folder), and ``../shared`` is
    linked beside the copy, as beside the repository.
    """
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    root = dest / REPO.name
    for f in files:
        if not f or not (REPO / f).is_file():
            continue
        target = root / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, target)
    link = root / "flowgym" / "agents"
    if not link.exists():
        link.symlink_to(Path("..") / "agents")
    shared = REPO.parent / "shared"
    if shared.exists() and not (dest / "shared").exists():
        (dest / "shared").symlink_to(shared)
    return root


def _check_copy(root: Path) -> None:
    """The copy's tests import the copy's modules (not the working tree's)."""
    code = "import flowgym, flowgym.agents; print(flowgym.__file__); print(flowgym.agents.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=_env(root, "0"), capture_output=True,
                         text=True, check=True).stdout.split()
    for f in out:
        if not Path(f).absolute().is_relative_to(root):
            raise SystemExit(f"the copy at {root} imports {f}, outside the copy: refusing to run mutants")


def _env(root: Path, jit: str) -> dict[str, str]:
    """The environment of a test run on one path: ``"1"`` compiled, ``"0"`` numpy, ``"py"`` interpreted kernels."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "FLOWGYM_JIT": "1" if jit == "py" else jit,
           "PYTHONPATH": str(root)}
    if jit == "py":
        env["NUMBA_DISABLE_JIT"] = "1"
    return env


#: A pytest plugin (written into the copy) that runs the numba kernels as plain Python.
#:
#: With ``NUMBA_DISABLE_JIT=1`` numba's ``njit`` returns the Python function itself, so the
#: engine calls ``kernels._batched_step`` & co. interpreted: a kernel mutant costs a test run, not
#: a recompilation of every kernel (``cache=True`` keys on the file, which each mutant changes).
#: Two things numba does are redone here: the PCG64 step (an LLVM intrinsic, which only runs
#: compiled) in Python integers, and the boxing of return values (numba returns ``int`` and
#: ``float``, not numpy scalars; ``tests/test_kernels.py`` checks the types). With
#: ``MUTATE_TEST_LIMITS`` (a JSON file: node id -> seconds), a test past its limit fails: a
#: mutant that loops forever is killed in seconds, not at the whole run's timeout.
_INTERP_PLUGIN = """
import json, os, signal
import numpy as np
import pytest

_MULT = (2549297995355413924 << 64) + 4865540595714422341
_M128, _M64 = (1 << 128) - 1, (1 << 64) - 1


def _pcg_step(shi, slo, ihi, ilo):
    s = ((((int(shi) << 64) | int(slo)) * _MULT) + ((int(ihi) << 64) | int(ilo))) & _M128
    return np.uint64(s >> 64), np.uint64(s & _M64)


def _box(v):
    if isinstance(v, tuple):
        return tuple(_box(x) for x in v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def _boxed(f):
    def call(*a):
        return _box(f(*a))
    return call


_LIMITS = json.loads(open(os.environ["MUTATE_TEST_LIMITS"]).read()) if os.environ.get("MUTATE_TEST_LIMITS") else {}


class TestTimeLimit(Exception):
    pass


def _alarm(signum, frame):
    raise TestTimeLimit("MUTANT-TEST-TIME-LIMIT: the test ran past its limit (three times its traced time)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    lim = _LIMITS.get(item.nodeid)
    if lim:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, lim)
    try:
        yield
    finally:
        if lim:
            signal.setitimer(signal.ITIMER_REAL, 0)


def pytest_configure(config):
    from flowgym.sim import kernels
    assert kernels._numba is not None and kernels._numba.config.DISABLE_JIT, "the kernels are not interpreted"
    for n in [n for n in dir(kernels) if not n.startswith("_") and callable(getattr(kernels, "_" + n, None))]:
        setattr(kernels, n, _boxed(getattr(kernels, "_" + n)))  # every kernel ``x`` is ``njit(_x)``
    kernels.pcg_step = _pcg_step
"""

#: Tests left out on the interpreted path: the first checks that numba compiled the kernels; the
#: other two take minutes interpreted (a survivor there is rerun compiled with every test).
_COMPILED_ONLY = ["tests/test_kernels.py::test_kernels_compile",
                  "tests/test_kernels.py::test_batched_completion_tokens_beyond_int32",
                  "tests/test_kernels.py::test_uniforms_held_over_stay_bounded_after_a_retry"]


def _pytest(root: Path, jit: str) -> list[str]:
    """``python -m pytest`` with the options of one path."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0"]
    if jit == "py":
        (root / "_mutate_interp.py").write_text(_INTERP_PLUGIN)
        cmd += ["-p", "_mutate_interp"] + [a for t in _COMPILED_ONLY for a in ("--deselect", t)]
    return cmd


#: A pytest plugin (written into the copy) that records, per test, the lines of one file it runs.
_TRACE_PLUGIN = """
import json, os, sys, threading, time
import pytest

_TARGET = os.path.realpath(os.environ["MUTATE_TRACE_FILE"])
_OUT = os.environ["MUTATE_TRACE_OUT"]
_lines = {}
_order = []
_dur = {}
_cur = set()
_is_target = {}


def _local(frame, event, arg):
    _cur.add(frame.f_lineno)
    return _local


def _global(frame, event, arg):
    f = frame.f_code.co_filename
    hit = _is_target.get(f)
    if hit is None:
        hit = _is_target[f] = os.path.realpath(f) == _TARGET
    if hit:
        _cur.add(frame.f_lineno)
        return _local
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _cur.clear()
    threading.settrace(_global)
    sys.settrace(_global)
    t0 = time.perf_counter()
    yield
    _dur[item.nodeid] = time.perf_counter() - t0
    sys.settrace(None)
    threading.settrace(None)
    _order.append(item.nodeid)
    for ln in _cur:
        _lines.setdefault(ln, []).append(item.nodeid)


def pytest_sessionfinish(session, exitstatus):
    with open(_OUT, "w") as f:
        json.dump({"ok": exitstatus == 0, "lines": _lines, "order": _order, "seconds": _dur}, f)
"""


def line_map(root: Path, module: str, tests: list[str], jit: str,
             cache: Path | None = None) -> tuple[dict[int, list[str]], dict[str, int], dict[str, float]]:
    """For each line of ``module``, the tests (node ids) that execute it on one path; their order; their times.

    The order is by the time each test took (fastest first), so that a mutant meets its quickest
    killer first. With ``cache`` (a JSON file), a trace of the same module text, tests and path is
    read from it instead of run again, and a new trace is added to it (parallel runs over parts of
    one module share one trace).
    """
    key = json.dumps([jit, hashlib.sha256((root / module).read_bytes()).hexdigest(), tests])
    stored = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    data = stored.get(key)
    if data is None:
        (root / "_mutate_trace.py").write_text(_TRACE_PLUGIN)
        out = root / f"_mutate_lines_{jit}.json"
        env = {**_env(root, jit), "MUTATE_TRACE_FILE": str(root / module), "MUTATE_TRACE_OUT": str(out)}
        subprocess.run([*_pytest(root, jit), "-p", "_mutate_trace", *tests], cwd=root, env=env,
                       capture_output=True, text=True)
        data = json.loads(out.read_text())
        if not data["ok"]:
            raise SystemExit(f"the tests fail without a mutant while their lines are traced (FLOWGYM_JIT={jit})")
        if cache is not None:  # read again: a parallel run may have added its trace meanwhile
            stored = json.loads(cache.read_text()) if cache.exists() else {}
            stored[key] = data
            cache.write_text(json.dumps(stored))
    seconds = data.get("seconds", {})
    ranked = sorted(data["order"], key=lambda nid: seconds.get(nid, 0.0))
    return {int(k): v for k, v in data["lines"].items()}, {nid: i for i, nid in enumerate(ranked)}, seconds


def _body_lines(tree: ast.Module) -> set[int]:
    """The lines inside function bodies: they run only when the function is called (not at import)."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.update(range(n.body[0].lineno, (n.end_lineno or n.body[0].lineno) + 1))
    return out


def _select(lines: dict[int, list[str]], order: dict[str, int], first: int, last: int) -> list[str] | None:
    """The tests that run any of the lines ``first..last`` (in run order); None if none does."""
    ids = set()
    for ln in range(first, last + 1):
        ids.update(lines.get(ln, ()))
    return sorted(ids, key=order.__getitem__) if ids else None


def run_module(module: str, tests: list[str], timeout: float, limit: int | None,
               paths: tuple[str, ...] = ("1", "0"), root: Path | None = None,
               only: set[int] | None = None, by_line: bool = False,
               span: list[tuple[int, int]] | None = None,
               cache: Path | None = None) -> list[tuple[Mutant, str]]:
    """Run every mutant of ``module`` (or the indices in ``only``) in the copy at ``root``.

    With ``by_line``, each mutant runs only the tests that execute its lines on the unmutated
    module (per path), fastest first; a mutant on lines no test executes outside function bodies
    (a default argument, a module constant: they run at import) runs all of ``tests``; one inside
    a function body that no test executes on any path *survives* without a run ("no test runs
    it"); a path on which no test executes lines that another path executes (the numpy twin of a
    kernel, or a kernel call) is skipped. ``cache``: see :func:`line_map`.
    """
    path = root / module
    for jit in paths if not by_line else ():  # the unmutated module must pass (the trace checks it too)
        r = subprocess.run([*_pytest(root, jit), "-x", *tests], cwd=root, env=_env(root, jit), capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit(f"the tests fail without a mutant (FLOWGYM_JIT={jit}):\n{r.stdout[-3000:]}")
    original = path.read_text()
    tree = ast.parse(original)
    n = len(_spots(tree))
    body = _body_lines(tree)
    maps: dict[str, tuple[dict[int, list[str]], dict[str, int], dict[str, float]]] = {}
    if by_line:
        for jit in paths:
            maps[jit] = line_map(root, module, tests, jit, cache)
            print(f"traced the tests' lines of {module} (FLOWGYM_JIT={jit}): {len(maps[jit][1])} tests, "
                  f"{len(maps[jit][0])} lines", flush=True)
        if "py" in maps:  # interpreted, each test may take three times its traced time, plus 10 s
            limits = {t: 10.0 + 3.0 * v for t, v in maps["py"][2].items()}
            (root / "_mutate_limits.json").write_text(json.dumps(limits))
    results = []
    try:
        for k in range(n if limit is None else min(n, limit)):
            if only is not None and k not in only:
                continue
            source, mut, first, last = _mutate(tree, k)
            if span is not None and not any(lo <= first <= hi for lo, hi in span):
                continue
            path.write_text(source)
            t0 = time.perf_counter()
            verdict = "survived"
            ran = 0
            if by_line and first in body and not any(_select(*maps[p][:2], first, last) for p in paths):
                verdict = "survived (no test runs it)"
                paths_to_run: tuple[str, ...] = ()
            else:
                paths_to_run = paths
            for jit in paths_to_run:  # the compiled kernels, then the numpy twins (CI runs both)
                selected = tests
                if by_line:
                    run_lines, seq, took = maps[jit]
                    selected = _select(run_lines, seq, first, last)
                    if selected is None:
                        # no test runs these lines on this path: if one does on another path, the
                        # mutant is code of the other path only (a numpy twin, a kernel call) and
                        # cannot act here; if none does anywhere, they run at import: run all
                        if any(_select(maps[p][0], maps[p][1], first, last) for p in paths if p != jit):
                            continue
                        selected = tests
                ran += len(selected)
                # a mutant times out (and is killed) only past twice what its tests took traced: the
                # import-time lines run every test, which can take longer than ``timeout``
                limit_s = timeout
                if by_line:
                    limit_s = max(timeout, 30.0 + 2.0 * sum(took.values() if selected is tests else
                                                            (took.get(t, 0.0) for t in selected)))
                env = _env(root, jit)
                if by_line and jit == "py":
                    env["MUTATE_TEST_LIMITS"] = str(root / "_mutate_limits.json")
                try:
                    r = subprocess.run([*_pytest(root, jit), "-x", *selected], cwd=root, env=env,
                                       capture_output=True, text=True, timeout=limit_s)
                except subprocess.TimeoutExpired:
                    verdict = f"killed (timeout, FLOWGYM_JIT={jit})"
                    break
                if r.returncode != 0:
                    verdict = f"killed (FLOWGYM_JIT={jit})" if jit != "py" else "killed (interpreted)"
                    if jit == "py" and "MUTANT-TEST-TIME-LIMIT" in r.stdout:
                        verdict = "killed (interpreted, a test past 3x its time)"
                    elif jit == "py" and "IndexError" in r.stdout:
                        # compiled numba does not check bounds: this kill may not happen in CI
                        verdict = "killed (interpreted, IndexError)"
                    break
            results.append((mut, verdict))
            print(f"{module}:{mut.line}: #{k} {mut.what}: {verdict} ({time.perf_counter() - t0:.0f} s"
                  + (f", {ran} tests/files)" if by_line else ")"), flush=True)
    finally:
        path.write_text(original)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("module", nargs="?", help="a module to mutate (a path from the repository's top)")
    ap.add_argument("--tests", nargs="+", default=None, help="the tests to run against each mutant")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant (default 300)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many mutants per module")
    ap.add_argument("--only", default=None, help="run only these mutants (comma-separated numbers, the #k printed)")
    ap.add_argument("--lines", default=None,
                    help="only mutants starting on these lines (e.g. 233-520, or ranges: 1-308,603-989)")
    ap.add_argument("--by-line", action="store_true",
                    help="run against each mutant only the tests that execute its lines (traced once per path on "
                    "the unmutated module; lines run only at import, e.g. defaults, run all the tests; a path on "
                    "which no test runs lines that another path runs is skipped)")
    ap.add_argument("--line-map", type=Path, default=None,
                    help="with --by-line: a JSON file that keeps the traces (reused by runs over other --lines of "
                    "the same module text and tests)")
    ap.add_argument("--paths", choices=["both", "compiled", "numpy", "interpreted"], default="both",
                    help="run the tests with the numba kernels, on the numpy path (FLOWGYM_JIT=0), or both "
                    "(default: a mutant survives only if it survives both, as in CI); 'interpreted' runs the "
                    "kernels as plain Python (NUMBA_DISABLE_JIT=1), for mutants of flowgym/sim/kernels.py: "
                    "no recompilation per mutant, and --by-line sees their lines")
    args = ap.parse_args()
    # a terminated run still deletes its copy (SystemExit unwinds the temporary directory)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.preset:
        targets = PRESETS[args.preset]
    elif args.module and args.tests:
        targets = [(args.module, args.tests)]
    else:
        ap.error("give a module and --tests, or --preset")
    span = None
    if args.lines:
        span = []
        for part in args.lines.split(","):
            lo, _, hi = part.strip().partition("-")
            span.append((int(lo), int(hi or lo)))
    only = None
    if args.only:
        only = {int(x) for x in args.only.split(",") if x.strip()}
    survivors = []
    total = 0
    paths = {"both": ("1", "0"), "compiled": ("1",), "numpy": ("0",), "interpreted": ("py",)}[args.paths]
    with tempfile.TemporaryDirectory(prefix="flowgym-mutate-") as tmp:
        root = make_copy(Path(tmp))
        _check_copy(root)
        print(f"mutants run in a copy of the repository: {root}", flush=True)
        for module, tests in targets:
            res = run_module(module, tests, args.timeout, args.limit, paths, root=root, only=only,
                             by_line=args.by_line, span=span, cache=args.line_map)
            total += len(res)
            survivors += [(module, m, v) for m, v in res if v.startswith("survived")]
    print(f"\n{total} mutants, {total - len(survivors)} killed, {len(survivors)} survived")
    for module, m, v in survivors:
        print(f"  {v}: {module}:{m.line}: #{m.index} {m.what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
