"""Fill the cache's free room? Learned budgets with a floor set by the room the running requests leave
(2026-11-29, a probe)

Every search on the two-anchor action has traded the same two kinds of load: a steady overload wants fewer
admissions than the generalist makes, and a backlog that waits while the cache is part empty (H4-short-phases:
a queue of short requests after the arrivals slowed, the cache 20-40% full) wants more. The two differ in how
full the cache is. This probe plays a model with its budget floored by the room left,

    B_t = max(the model's budget, c x free / s),   free = M - held - active x (s - l) / 2,

``s`` the tracker's mean ``l + o`` of completed requests and ``l`` its mean arriving prompt (``free`` as in
``completion_cap.py --headroom``, which *capped* the budget by it). A full cache (steady overload, where the
running requests' expected growth passes ``M``) gives a floor of 0, so the model's budget stands; a cache left
part empty while a queue waits is filled at once. If the floor took H4 back from a model searched with more
steady overload (ars26s), the trade would be split between the action and the policy.

``--models`` names model directories (``shipped``: the generalist), ``--floors`` the constants ``c``; the
report scenarios' screening seeds 7000-7003 (the Azure replay: one episode), ratios to the tuned rate-switch.
The floor changes the environment's mapping of an action to a budget (``_unrounded_budget`` of
:mod:`flowgym.envs.spaces`) in this process only: an experiment, not an option of the package. Results:
``docs/training.md``, "Stationary overload, continued".

    python benchmarks/learned_experiments/fill_floor.py --rate-switch runs/bench_rs.json --models shipped runs/ars26s
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


def free_room(tracker: Any) -> float:
    """Tokens of the cache left after the running requests' expected growth (the tracker's estimates)."""
    s = tracker.mean_length or 1.0
    l_in = tracker._lA / tracker._lN if tracker._lN > 1e-6 else 0.0
    return float(tracker.M - (tracker._held + tracker._nact * 0.5 * max(s - l_in, 1.0)))


def floored_budget(c: float) -> Callable[..., float]:
    """``_unrounded_budget`` floored at ``c x free / s`` (capped at the largest budget as before); no floor before
    the first completion, while ``s`` is unknown."""
    if not (isinstance(c, float) and c > 0):
        raise ValueError(f"floor c must be a positive number, got {c!r}")

    def budget(k: Any, tracker: Any, of: str, max_budget: int) -> float:
        b = _UNROUNDED(k, tracker, of, max_budget)
        s = tracker.mean_length
        if s is None:  # nothing has completed yet: no estimate of a request's size, no floor
            return b
        return min(max(b, c * free_room(tracker) / s), float(max_budget))

    return budget


def _job(task: tuple[str, str, int, dict[str, Any]]) -> tuple[str, str, float]:
    name, rule, seed, rs = task
    kw, H = scenario(name)
    model, _, c = rule.partition(" f=")
    if rule == "rate-switch (tuned)":
        agent = make_agent("rate-switch", **rs)
    else:
        agent = make_agent("learned") if model == "shipped" else make_agent("learned", path=model)
    mapping = floored_budget(float(c)) if c else _UNROUNDED
    return name, rule, play_patched("_unrounded_budget", mapping, agent, kw, seed, H)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ap.add_argument("--models", nargs="+", default=["shipped"], help="model directories ('shipped': the generalist)")
    ap.add_argument("--floors", type=positive_float, nargs="+", default=[0.5, 1.0], help="constants c of the floor")
    ap.add_argument("--scenarios", nargs="+", default=None, help="a subset of the report scenarios")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    rs = tuned_rate_switch(args.rate_switch)
    names = args.scenarios or [*ADAPTIVE_SCENARIOS, *held_out()]
    unknown = [n for n in names if n not in rs]
    if unknown:
        ap.error(f"--scenarios: no tuned rate-switch for {', '.join(unknown)} in {args.rate_switch}; "
                 f"the report scenarios are: {', '.join(rs)}")
    if len(set(args.models)) < len(args.models) or len(set(args.floors)) < len(args.floors):
        ap.error("--models and --floors: each value once")
    for m in args.models:
        if m != "shipped" and not os.path.isfile(os.path.join(m, "flowgym_agent.json")):
            ap.error(f"--models: {m!r} is not a model directory (no flowgym_agent.json)")
    rules = ["rate-switch (tuned)", *(r for m in args.models for r in (m, *(f"{m} f={c:g}" for c in args.floors)))]
    tasks = [(n, r, s, rs[n]) for n in names for r in rules for s in seeds_of(n)]
    play_ratio_table(_job, tasks, names, rules, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
