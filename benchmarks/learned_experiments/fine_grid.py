"""Do the benchmark's goal verdicts hold with references tuned on a finer grid? (2026-11-29, an audit)

Until 2026-11-29 ``benchmarks/bench_learned.py`` tuned the best fixed budget, and the rate-switch's ``high``, over
``COARSE_GRID`` (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ...): no 5, 7, 9-11, 13-15. A scenario whose best budget is
between two grid points got a weaker reference than its own file's tuning grid gives it (adaptive-high's best
fixed budget is 13, which ``flowgym compare`` finds). This script reruns the benchmark's own tuning
(``tune_fixed_and_rate_switch``, the same seeds 1000-1001 and horizon) over its grid now, ``FIXED_GRID`` (every
budget 1-16, then 20, 24, 28, ...: :data:`FINE_GRID`), and the shipped generalist, the best fixed budget and the
tuned rate-switch on the report seeds, with the benchmark's ratios (ratio of means, 95% paired bootstrap) and its
goal rule, without the other references (a quicker check of the verdicts than the whole benchmark). Results:
``docs/training.md``, "The references on a finer grid".

    python benchmarks/learned_experiments/fine_grid.py --scenarios adaptive-low,adaptive-high,S1-stationary
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_learned as bl  # noqa: E402

from flowgym.lab.evaluation import evaluate  # noqa: E402
from flowgym.lab.scenarios import AgentSpec  # noqa: E402

#: Every budget up to 16, then steps of 4 to 64, then 96-256: the benchmark's grid since 2026-11-29.
FINE_GRID = bl.FIXED_GRID


def fine(name: str, seeds: list[int], tune_seeds: list[int], backend: str = "serial") -> dict[str, object]:
    """The benchmark's references for ``name`` tuned over :data:`FINE_GRID`, and the ratios on ``seeds``."""
    kw, tune_kw, H, finite = bl.scenario_arguments(name)
    report = [seeds[0]] if finite else seeds
    saved = bl.FIXED_GRID
    bl.FIXED_GRID = FINE_GRID
    try:
        b, rs = bl.tune_fixed_and_rate_switch(tune_kw, tune_seeds[:1] if finite else tune_seeds, H, backend)
    finally:
        bl.FIXED_GRID = saved
    specs = [AgentSpec("learned", {}, label="learned"), AgentSpec("flow-control", {"b": b}, label="best fixed"),
             AgentSpec("rate-switch", rs, label="rate-switch")]
    table = evaluate(specs, kw, report, None if H is None else [H], backend=backend)
    per = {lab: np.array([r["mean_time_in_system"] for r in table.rows if r["agent"] == lab]) for lab in table.agents}
    r_fixed = bl.ratio_ci(per["learned"], per["best fixed"])
    r_rs = bl.ratio_ci(per["learned"], per["rate-switch"])
    stationary = bl.is_stationary(kw)
    return {"scenario": name, "b": b, "rate_switch": rs, "fixed": r_fixed, "rs": r_rs, "stationary": stationary,
            "goal": "met" if bl.goal_met(stationary, r_fixed[0], r_rs[0]) else "missed"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", required=True, help="comma-separated names (as bench_learned.py takes them)")
    ap.add_argument("--seeds", type=int, default=20, help="report seeds 0..N-1 (default 20)")
    ap.add_argument("--backend", choices=["serial", "process"], default="process")
    args = ap.parse_args(argv)
    print("| scenario | best fixed b (fine grid) | / best fixed | tuned rate-switch (fine grid) | / tuned rate-switch | goal |")
    print("|---|---:|---:|---|---:|---|")
    for name in args.scenarios.split(","):
        r = fine(name.strip(), list(range(args.seeds)), [1000, 1001], args.backend)
        rs = r["rate_switch"]
        print(f"| {r['scenario']}{' (stationary)' if r['stationary'] else ''} | {r['b']} | {bl._fmt(r['fixed'])} | "
              f"high {rs['high']}, low {rs['low']}, threshold {rs['threshold']:g} | {bl._fmt(r['rs'])} | {r['goal']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
