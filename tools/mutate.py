#!/usr/bin/env python
"""Mutation testing of chosen modules: does a one-token change make some test fail?

For each target module, every mutable spot is changed in turn (one mutant at a time):
comparison operators (``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``), arithmetic
(``+`` <-> ``-``, ``*`` <-> ``//`` or ``/``), integer constants (``n`` -> ``n + 1``), boolean
operators (``and`` <-> ``or``), ``not x`` -> ``x``, unary minus dropped, ``min`` <-> ``max`` and
``sum``/``mean`` <-> ``max``. The mutated module is written in place, the module's tests run
(``pytest -x -q``, a time limit per mutant), and the original is restored whatever happens.
A mutant is *killed* when a test fails, *survived* otherwise; survivors are printed with their
line, for a test that kills them or a reason they are equivalent (docs/testing.md records them).

    python tools/mutate.py flowgym/sim/metrics.py --tests tests/test_metrics_by_hand.py tests/test_env.py
    python tools/mutate.py --preset core           # the modules and tests of docs/testing.md

The standard library's ``ast`` makes the mutants (maintained mutation tools did not fit this
repository's layout: ``agents/`` is installed as ``flowgym.agents``, and they rewrite the tree
they test into a copy of their own).
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Modules and the tests that are meant to pin them (docs/testing.md).
PRESETS = {
    "core": [
        ("flowgym/sim/metrics.py", ["tests/test_metrics_by_hand.py", "tests/test_env.py", "tests/test_evaluation.py"]),
        ("flowgym/sim/rules.py", ["tests/test_engine.py", "tests/test_semantics.py", "tests/test_agents.py"]),
        ("agents/flow_control.py", ["tests/test_agents.py"]),
        ("agents/memory_check.py", ["tests/test_agents.py"]),
        ("agents/greedy.py", ["tests/test_agents.py"]),
    ],
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
    return ast.unparse(ast.fix_missing_locations(t)), Mutant(k, getattr(node, "lineno", 0), what)


def run_module(module: str, tests: list[str], timeout: float, limit: int | None,
               paths: tuple[str, ...] = ("1", "0")) -> list[tuple[Mutant, str]]:
    path = REPO / module
    original = path.read_text()
    tree = ast.parse(original)
    n = len(_spots(tree))
    results = []
    try:
        for k in range(n if limit is None else min(n, limit)):
            source, mut = _mutate(tree, k)
            path.write_text(source)
            t0 = time.perf_counter()
            verdict = "survived"
            for jit in paths:  # the compiled kernels, then the numpy twins (CI runs both)
                env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "FLOWGYM_JIT": jit}
                try:
                    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                        "--hypothesis-seed=0", *tests], cwd=REPO, env=env, capture_output=True,
                                       text=True, timeout=timeout)
                except subprocess.TimeoutExpired:
                    verdict = f"killed (timeout, FLOWGYM_JIT={jit})"
                    break
                if r.returncode != 0:
                    verdict = f"killed (FLOWGYM_JIT={jit})"
                    break
            results.append((mut, verdict))
            print(f"{module}:{mut.line}: {mut.what}: {verdict} ({time.perf_counter() - t0:.0f} s)", flush=True)
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
    ap.add_argument("--paths", choices=["both", "compiled", "numpy"], default="both",
                    help="run the tests with the numba kernels, on the numpy path (FLOWGYM_JIT=0), or both "
                    "(default: a mutant survives only if it survives both, as in CI)")
    args = ap.parse_args()
    if args.preset:
        targets = PRESETS[args.preset]
    elif args.module and args.tests:
        targets = [(args.module, args.tests)]
    else:
        ap.error("give a module and --tests, or --preset")
    survivors = []
    total = 0
    for module, tests in targets:
        paths = {"both": ("1", "0"), "compiled": ("1",), "numpy": ("0",)}[args.paths]
        res = run_module(module, tests, args.timeout, args.limit, paths)
        total += len(res)
        survivors += [(module, m) for m, v in res if v == "survived"]
    print(f"\n{total} mutants, {total - len(survivors)} killed, {len(survivors)} survived")
    for module, m in survivors:
        print(f"  survived: {module}:{m.line}: {m.what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
