"""Command line: ``flowgym run`` simulates a scenario under a fixed activation budget."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgym.env import FlowControlEnv
from flowgym.metrics import METRIC_NAMES
from flowgym.theory import max_global_budget


def _run(args: argparse.Namespace) -> int:
    kwargs: dict[str, Any] = {"horizon": args.horizon, "M": args.M, "eviction": args.eviction}
    if args.rate is not None:
        kwargs["workload"] = {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": args.rate}
    if args.trace is not None:
        kwargs["workload"] = {"kind": "trace", "path": args.trace}
        kwargs["horizon"] = args.horizon if args.horizon_given else None
    env = FlowControlEnv(**kwargs)
    mean_work = env.workload.mean_work()
    budget = args.budget
    if budget is None:
        if mean_work is None:
            print("error: give --budget (this workload's mean work is unknown)", file=sys.stderr)
            return 2
        budget = max(1, max_global_budget(args.M, mean_work))
    if budget > env.config.max_budget:  # the action space must hold the budget
        env = FlowControlEnv(**kwargs, max_budget=budget)
    t0 = time.perf_counter()
    _, info = env.reset(seed=args.seed)
    rho = info["rho"]
    done = False
    while not done:
        _, _, te, tr, _ = env.step(budget)
        done = te or tr
    wall = time.perf_counter() - t0
    m = env.metrics()
    m.pop("kv_usage")
    result = {"budget": budget, "rho": rho, "seed": args.seed, "wall_seconds": wall, **m}
    if args.json:
        print(json.dumps(result, indent=2, default=float))
        return 0
    print(f"FlowControl-v0  M={args.M}  load rho={rho:.3f}  fixed budget B_t={budget}  "
          f"eviction={args.eviction}  seed={args.seed}")
    print(f"{m['T']} slots in {wall:.2f} s")
    for name in METRIC_NAMES:
        v = m[name]
        print(f"  {name:28s} {v:12.4f}" if isinstance(v, float) else f"  {name:28s} {v:12d}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowgym", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run",
        help="simulate a scenario under a fixed activation budget and print the metrics",
        description="Simulate FlowControl-v0 (default: the paper's three classes at lambda = 3.5 per class, "
        "M = 16492, 1000 slots) under a fixed budget B_t = b (Algorithm 2; default: the largest b "
        "with b E[w] <= M, Theorem 2) and print the metrics of docs/model.md.",
    )
    r.add_argument("--budget", type=int, default=None, help="fixed activation budget b (default: Theorem 2's largest)")
    r.add_argument("--horizon", type=int, default=None, help="slots to simulate (default 1000)")
    r.add_argument("--rate", type=float, default=None, help="arrival rate per class per slot (default 3.5)")
    r.add_argument("--M", type=int, default=16492, help="KV-cache budget in tokens (default 16492)")
    r.add_argument("--eviction", choices=["lifo", "all"], default="lifo")
    r.add_argument("--trace", default=None, help="replay a CSV trace (columns arrival,prompt_len,output_len)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true", help="print the metrics as JSON")
    r.set_defaults(func=_run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowgym`` command."""
    args = build_parser().parse_args(argv)
    if getattr(args, "horizon", None) is None:
        args.horizon_given = False
        args.horizon = 1000
    else:
        args.horizon_given = True
    try:
        return int(args.func(args))
    except ValueError as e:  # bad input: say what, not where in the engine
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
