"""Admit at the pace requests leave? The shipped generalist with its rate anchor capped by the completion rate
(2026-11-29, a probe)

Where the shipped generalist (ars9) trails the tuned rate-switch most (H8: an overload phase then a light one;
adaptive-high: stationary overload; the Azure replay, where ``b = 1`` is best), its rate anchor
``k_rate x lambda_head`` admits faster than the server completes, and the surplus is evicted. TCP's answer
to the same problem is *ack clocking*: send a new packet as an old one leaves. This script plays ars9 with
its budget

    B_t = max(k_safe x safe budget, min(k_rate x lambda_head, c x mu))

where ``mu`` is the completion rate (requests finished per slot, moving average with time constant 16: the
tracker's own, feature ``completion_rate`` of ``load-v2``) and ``c`` a fixed constant of ``--caps``: the rate
anchor may not run more than ``c`` times ahead of the departures; the safe anchor is untouched (so an empty
system, whose ``mu`` is 0, still admits). ``c = inf`` is ars9. The report scenarios' screening seeds
7000-7003 (the Azure replay: one episode), ratios to the tuned rate-switch.

``--headroom c ...`` plays instead a cap by the cache's free room, ``B_t = min(ars9's budget, max(1, c x free / s))``,
``free = M - held - active x (s - l) / 2`` (the tokens the running requests are expected to add), ``s`` and ``l``
the tracker's moving means of a completed request's ``l + o`` and of an arriving prompt: a memory check in the
manner of MC, on estimates.

The cap changes the environment's mapping of an action to a budget (``_unrounded_budget`` of
:mod:`flowgym.envs.spaces`), in this process only: an experiment, not an option of the package. Results:
``docs/training.md``, "Admitting at the pace of completions".

    python benchmarks/learned_experiments/completion_cap.py --rate-switch runs/bench_rs.json   # about 1 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: _args, bench_learned
from anchors import scenario, seeds_of, tuned_rate_switch  # noqa: E402
from _args import positive_float  # noqa: E402
from bench_learned import held_out  # noqa: E402
from fractional import play_patched, play_ratio_table  # noqa: E402

import flowgym.envs.spaces as spaces  # noqa: E402
from flowgym.agents import make_agent  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402

_UNROUNDED = spaces._unrounded_budget


def completion_rate(tracker: Any) -> float:
    """Requests completed per decision point, moving average with time constant 16 (the tracker's sums)."""
    return float(tracker._Nf) / 16.0


def capped_budget(c: float) -> Callable[..., float]:
    """``_unrounded_budget`` of ``of="max-head"`` with the rate anchor capped at ``c`` times the completion rate."""
    if not (isinstance(c, float) and c > 0):
        raise ValueError(f"cap c must be a positive number, got {c!r}")

    def budget(k: Any, tracker: Any, of: str, max_budget: int) -> float:
        if of != "max-head":
            raise ValueError(f"the completion cap is for multiplier_of='max-head', got {of!r}")
        rate = min(float(k[0]) * spaces._rate_anchor(tracker, of), c * completion_rate(tracker))
        return min(float(max(rate, float(k[1]) * tracker.safe_budget())), max_budget)

    return budget


def headroom_budget(c: float) -> Callable[..., float]:
    """``_unrounded_budget`` capped at ``max(1, c x free / s)``: ``free`` the cache's room after the running requests'
    expected growth, ``s`` the mean ``l + o`` of completed requests (the tracker's estimates)."""
    if not (isinstance(c, float) and c > 0):
        raise ValueError(f"headroom c must be a positive number, got {c!r}")

    def budget(k: Any, tracker: Any, of: str, max_budget: int) -> float:
        b = _UNROUNDED(k, tracker, of, max_budget)
        s = tracker.mean_length or 1.0
        l_in = tracker._lA / tracker._lN if tracker._lN > 1e-6 else 0.0
        free = tracker.M - (tracker._held + tracker._nact * 0.5 * max(s - l_in, 1.0))
        return min(b, max(1.0, c * free / s))

    return budget


def _job(task: tuple[str, str, int, dict[str, Any]]) -> tuple[str, str, float]:
    name, rule, seed, rs = task
    kw, H = scenario(name)
    c = float(rule.split("=")[1]) if "=" in rule else 0.0
    mapping = (capped_budget(c) if rule.startswith("c=") else headroom_budget(c)
               if rule.startswith("h=") else _UNROUNDED)
    agent = make_agent("rate-switch", **rs) if rule == "rate-switch (tuned)" else make_agent("learned")
    return name, rule, play_patched("_unrounded_budget", mapping, agent, kw, seed, H)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ap.add_argument("--caps", type=positive_float, nargs="+", default=[1.0, 1.25, 1.5, 2.0], help="multiples of the completion rate")
    ap.add_argument("--headroom", type=positive_float, nargs="+", default=[],
                    help="instead of (or beside) --caps: caps by the cache's free room, c x free / s")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    rs = tuned_rate_switch(args.rate_switch)
    names = [*ADAPTIVE_SCENARIOS, *held_out()]
    rules = ["rate-switch (tuned)", "ars9", *(f"c={c:g}" for c in args.caps), *(f"h={c:g}" for c in args.headroom)]
    tasks = [(n, r, s, rs[n]) for n in names for r in rules for s in seeds_of(n)]
    play_ratio_table(_job, tasks, names, rules, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
