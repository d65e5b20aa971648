"""Admit at the pace requests leave, but only while the load holds steady? (2026-11-29, a probe)

``completion_cap.py`` capped the generalist's rate anchor at ``c`` times the completion rate everywhere: it took
what it was meant to take under steady overload (adaptive-high, the Azure replay) and throttled every burst and
every change to a busier phase, because the departures lag a rise of the load. This probe caps only while the
load looks steady and overloaded:

    B_t = max(k_safe x safe budget, min(k_rate x lambda_head, c x mu))   if |log(rate_32 / rate_512)| < eps
                                                                       and rate_512 > theta x safe budget,
    B_t = ars9's budget                                                 otherwise,

``rate_32`` and ``rate_512`` the tracker's arrival rates with time constants 32 and 512 decision points, ``mu`` its
completion rate (``completion_cap.completion_rate``). A rule is written ``c,eps`` or ``c,eps,theta`` (no
``theta``: the rate test alone). Three sets, each played by ars9 and every rule on the same seeds:

* ``report``: the 15 report scenarios on the screening seeds 7000-7003, ratios to the tuned rate-switch;
* ``stationary``: the eight loads of ``stationary_sweep.py`` that ars9 misses and three it meets, report seeds
  8000-8009, ratios to ars9 (the sweep's table gives ars9's ratio to the best fixed budget);
* ``nonstationary``: the 48 loads of ``nonstationary_sweep.py`` (seeds 9000-9031 and the blind 9100-9115), report
  seeds 8000-8004, ratios to ars9.

The cap changes the environment's mapping of an action to a budget (``_unrounded_budget`` of
:mod:`flowgym.envs.spaces`) in this process only: an experiment, not an option of the package. Results:
``docs/training.md``, "Stationary overload, continued".

    python benchmarks/learned_experiments/steady_cap.py --rate-switch runs/bench_rs.json --rules 1,0.1 1,0.1,1
    python benchmarks/learned_experiments/steady_cap.py --set nonstationary --rules 1,0.1 1,0.1,1   # 1 min
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
import nonstationary_sweep  # noqa: E402
import stationary_sweep  # noqa: E402
from anchors import scenario, seeds_of, tuned_rate_switch  # noqa: E402
from bench_learned import held_out  # noqa: E402
from completion_cap import completion_rate  # noqa: E402
from fractional import play_patched, play_ratio_table  # noqa: E402

import flowgym.envs.spaces as spaces  # noqa: E402
from flowgym.agents import make_agent  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402

_UNROUNDED = spaces._unrounded_budget

#: The stationary sweep's loads of the ``stationary`` set: ars9's eight misses, then three it meets.
STATIONARY = ("chat M=8192 rho=1.05", "chat M=8192 rho=1.3", "chat M=32768 rho=1.05", "chat M=32768 rho=1.3",
              "mid M=32768 rho=1.05", "mid M=32768 rho=1.3", "long-gen M=32768 rho=1.05", "long-prompt M=8192 rho=0.9",
              "chat M=32768 rho=0.6", "mid M=8192 rho=0.9", "chat M=8192 rho=0.9")
#: The non-stationary sweep's scenario seeds of the ``nonstationary`` set.
NONSTATIONARY = (*range(9000, 9032), *range(9100, 9116))


def parse_rule(text: str) -> tuple[float, float, float | None]:
    """``"c,eps"`` or ``"c,eps,theta"`` as numbers, each positive (a bad rule is refused by name)."""
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or not all(v > 0 and math.isfinite(v) for v in values):
        raise ValueError(f"rule {text!r}: give c,eps or c,eps,theta, each a positive number")
    return values[0], values[1], (values[2] if len(values) == 3 else None)


def steady_budget(c: float, eps: float, theta: float | None) -> Callable[..., float]:
    """``_unrounded_budget`` of ``of="max-head"`` with the rate anchor capped at ``c x mu`` while the load is steady
    (and, with ``theta``, overloaded); elsewhere the environment's own."""

    def budget(k: Any, tracker: Any, of: str, max_budget: int) -> float:
        if of != "max-head":
            raise ValueError(f"the steady cap is for multiplier_of='max-head', got {of!r}")
        r = tracker.rates
        steady = r[1] > 0 and r[3] > 0 and abs(math.log(r[1] / r[3])) < eps
        if not steady or (theta is not None and not r[3] > theta * tracker.safe_budget()):
            return _UNROUNDED(k, tracker, of, max_budget)
        rate = min(float(k[0]) * spaces._rate_anchor(tracker, of), c * completion_rate(tracker))
        return min(float(max(rate, float(k[1]) * tracker.safe_budget())), max_budget)

    return budget


def _load(name: str) -> tuple[dict[str, Any], int]:
    """The environment arguments and horizon of a scenario of any of the three sets."""
    if name.startswith("ns"):
        return nonstationary_sweep.draw(int(name[2:]))[1], nonstationary_sweep.HORIZON
    if name in stationary_sweep.scenarios():
        return stationary_sweep.scenarios()[name], stationary_sweep.HORIZON
    return scenario(name)


#: The rules that are not caps: the tuned rate-switch and the shipped generalist as it is.
_REFERENCES = ("rate-switch (tuned)", "ars9")


def _job(task: tuple[str, str, int, dict[str, Any]]) -> tuple[str, str, float]:
    name, rule, seed, rs = task
    kw, H = _load(name)
    mapping = _UNROUNDED if rule in _REFERENCES else steady_budget(*parse_rule(rule))
    agent = make_agent("rate-switch", **rs) if rule == "rate-switch (tuned)" else make_agent("learned")
    return name, rule, play_patched("_unrounded_budget", mapping, agent, kw, seed, H)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("report", "stationary", "nonstationary"), default="report")
    ap.add_argument("--rate-switch", help="bench_learned.py's JSON (the tuned rate-switch parameters; --set report)")
    ap.add_argument("--rules", nargs="+", default=["1,0.1", "1,0.1,1"], help="c,eps or c,eps,theta")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    for r in args.rules:
        try:
            parse_rule(r)
        except ValueError as e:
            ap.error(f"--rules: {e}")
    if len(set(args.rules)) < len(args.rules):
        ap.error("--rules: each rule once")
    if args.rate_switch and args.set != "report":
        ap.error(f"--rate-switch is read by --set report only, not --set {args.set}")
    if args.set == "report":
        if not args.rate_switch:
            ap.error("--set report needs --rate-switch FILE (bench_learned.py --out's JSON)")
        rs = tuned_rate_switch(args.rate_switch)
        names = [*ADAPTIVE_SCENARIOS, *held_out()]
        rules = ["rate-switch (tuned)", "ars9", *args.rules]
        tasks = [(n, r, s, rs[n]) for n in names for r in rules for s in seeds_of(n)]
    else:
        names = list(STATIONARY) if args.set == "stationary" else [f"ns{s}" for s in NONSTATIONARY]
        seeds = range(8000, 8010) if args.set == "stationary" else range(8000, 8005)
        rules = ["ars9", *args.rules]
        tasks = [(n, r, s, {}) for n in names for r in rules for s in seeds]
    play_ratio_table(_job, tasks, names, rules, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
