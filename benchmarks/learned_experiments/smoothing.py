"""Would a steadier budget serve better? The shipped generalist with its budget smoothed (2026-11-29, a probe)

Where the shipped generalist (ars9) trails the tuned rate-switch on a load that hardly changes (adaptive-high,
the Azure replay, H5, H7), the best fixed budget is the best schedule there is, and ars9's budget moves from
slot to slot with its load estimates. This script plays ars9 with its unrounded budget ``b_t`` (the
environment's ``min(k x anchor, max_budget)``) replaced by an exponential average over ``tau`` slots,
``s_t = s_{t-1} + (b_t - s_{t-1}) / tau`` (``s`` starts at the first ``b``), rounded as the environment
rounds (``max(round(s_t), 1)``), for each ``tau`` of ``--taus``, on the report scenarios' screening seeds
7000-7003 (the Azure replay: one episode), as ratios to the tuned rate-switch.

The smoothing changes the environment's mapping of an action to a budget (``_scaled_budget`` of
:mod:`flowgym.envs.spaces`), in this process only: an experiment, not an option of the package. Results:
``docs/training.md``, "A steadier budget".

    python benchmarks/learned_experiments/smoothing.py --rate-switch runs/bench_rs.json   # about 30 s on 2 cores
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: _args, bench_learned
from anchors import scenario, seeds_of, tuned_rate_switch  # noqa: E402
from bench_learned import held_out  # noqa: E402
from fractional import play_patched, play_ratio_table  # noqa: E402

import flowgym.envs.spaces as spaces  # noqa: E402
from flowgym.agents import make_agent  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402

_ROUNDED = spaces._scaled_budget


def smoothed_budget(tau: float) -> Callable[..., int]:
    """``_scaled_budget`` with the unrounded budget averaged exponentially over ``tau`` slots (one average per
    tracker, that is per environment; ``tau = 1`` is the environment's own mapping)."""
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau >= 1):
        raise ValueError(f"tau (slots) must be a finite number of at least 1, got {tau!r}")
    step = 1.0 / float(tau)

    def budget(k: Any, tracker: Any, of: str, max_budget: int) -> int:
        b = spaces._unrounded_budget(k, tracker, of, max_budget)
        s = tracker.__dict__.get("_smoothed")
        s = b if s is None else s + step * (b - s)
        tracker.__dict__["_smoothed"] = s
        return int(max(round(s), 1))

    return budget


def _job(task: tuple[str, str, int, dict[str, Any]]) -> tuple[str, str, float]:
    name, rule, seed, rs = task
    kw, H = scenario(name)
    mapping = smoothed_budget(float(rule.split("=")[1])) if rule.startswith("tau=") else _ROUNDED
    agent = make_agent("rate-switch", **rs) if rule == "rate-switch (tuned)" else make_agent("learned")
    return name, rule, play_patched("_scaled_budget", mapping, agent, kw, seed, H)


def _tau(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a time constant in slots, got {text!r}") from None
    if not (math.isfinite(v) and v >= 1):
        raise argparse.ArgumentTypeError(f"a time constant must be a finite number of slots, at least 1, got {text!r}")
    return v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ap.add_argument("--taus", type=_tau, nargs="+", default=[8.0, 32.0, 128.0], help="time constants, in slots")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    rs = tuned_rate_switch(args.rate_switch)
    names = [*ADAPTIVE_SCENARIOS, *held_out()]
    rules = ["rate-switch (tuned)", "ars9", *(f"tau={t:g}" for t in args.taus)]
    tasks = [(n, r, s, rs[n]) for n in names for r in rules for s in seeds_of(n)]
    play_ratio_table(_job, tasks, names, rules, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
