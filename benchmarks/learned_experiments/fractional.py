"""Is the budget's rounding to a whole number what costs the generalist at low arrival rates? (2026-11-29)

On three of the scenarios where the shipped generalist (ars9) still trails the tuned rate-switch, the budget
is often a few requests per slot or less: H8's overloaded phase of long generations (about 0.7 arrivals a slot;
the tuned rate-switch plays ``low = 1`` there), the Azure replay (best fixed budget 1) and H5. There
``B_t = round(k x anchor)`` (at least 1) moves in steps of 30-100% of the budget, so the question is whether
a budget that can be fractional on average would help. This script plays, on the screening seeds 7000-7003
(the Azure replay: one episode):

* ``ars9 fractional``: ars9's own multipliers and anchors, the budget rounded by **error diffusion**
  (``B_t = floor(c + b)``, ``c`` the fraction carried from the slots before): the mean of ``B_t`` is ``b``
  exactly, and it can be below 1;
* the tuned rate-switch with a fractional ``low`` (0.5, 0.7, 0.85), the same rounding, on the scenarios whose
  tuned ``low`` is 1.

The fractional ars9 changes the environment's mapping of an action to a budget (``_scaled_budget`` of
:mod:`flowgym.envs.spaces`), in this process only: an experiment, not an option of the package. Results:
``docs/training.md``, "Every configuration tried" (row "fractional").

    python benchmarks/learned_experiments/fractional.py --rate-switch runs/bench_rs.json   # about 4 min on 2 cores
    python benchmarks/learned_experiments/fractional.py --budgets H8-overload-then-light H5-rag-vs-reasoning  # 10 s
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: _args, bench_learned
from anchors import SEEDS, scenario, seeds_of, tuned_rate_switch  # noqa: E402
from bench_learned import held_out  # noqa: E402

import flowgym.envs.spaces as spaces  # noqa: E402
from flowgym.agents import make_agent  # noqa: E402
from flowgym.agents.base import Agent  # noqa: E402
from flowgym.lab.evaluation import run_episode  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402

#: The fractional ``low`` budgets tried in place of a tuned ``low = 1``.
LOWS = (0.5, 0.7, 0.85)
_ROUNDED = spaces._scaled_budget


class Diffusion:
    """Error-diffusion rounding: ``take(b)`` returns ``floor(c + b)`` and carries the rest, so the budgets'
    running sum never differs from that of the ``b`` by a whole request or more."""

    def __init__(self) -> None:
        self.carry = 0.0

    def take(self, b: float) -> int:
        c = self.carry + max(float(b), 0.0)
        out = int(math.floor(c))
        self.carry = c - out
        return out


def fractional_budget(k: Any, tracker: Any, of: str, max_budget: int) -> int:
    """``_scaled_budget`` of the two-anchor actions with error diffusion in place of ``max(round(b), 1)``
    (one carry per tracker, that is per environment)."""
    if of not in spaces.TWO_ANCHORS or of == "max-drain":
        raise ValueError(f"fractional budgets are for the 'max' and 'max-head' actions, got {of!r}")
    d = tracker.__dict__.setdefault("_fractional", Diffusion())
    return d.take(spaces._unrounded_budget(k, tracker, of, max_budget))


class FractionalRateSwitch(Agent):
    """The rate-switch rule (``high`` above ``threshold`` arrivals per slot, else ``low``) with fractional
    budgets, rounded by :class:`Diffusion`."""

    name = "rate-switch-fractional"

    def __init__(self, high: float, low: float, threshold: float) -> None:
        self.high, self.low, self.threshold = float(high), float(low), float(threshold)
        self.requires = {"eviction": "lifo", "observation": "dict", "max_budget": int(max(1, high, low))}
        self._d = Diffusion()

    def reset(self, config: Any, seed: int | None = None) -> None:
        super().reset(config, seed)
        self._d = Diffusion()

    def act(self, observation: Any, view: Any) -> int:
        fast = float(observation["arrival_rate"][0]) > self.threshold
        return self._d.take(self.high if fast else self.low)

    def label(self) -> str:
        return f"rate-switch fractional high={self.high:g} low={self.low:g} threshold={self.threshold:g}"


def _job(task: tuple[str, str, int, dict[str, Any]]) -> tuple[str, str, float]:
    name, rule, seed, rs = task
    kw, H = scenario(name)
    if rule == "rate-switch (tuned)":
        agent: Agent = make_agent("rate-switch", **rs)
    elif rule.startswith("ars9"):
        agent = make_agent("learned")
    else:
        agent = FractionalRateSwitch(rs["high"], float(rule.split("=")[1]), rs["threshold"])
    mapping = fractional_budget if rule == "ars9 fractional" else _ROUNDED
    return name, rule, play_patched("_scaled_budget", mapping, agent, kw, seed, H)


def budgets(name: str, seed: int = SEEDS[0]) -> np.ndarray:
    """The budget the shipped generalist plays in every slot of one episode of scenario ``name`` (whole numbers, as
    the environment rounds them): how often it is a few requests a slot or less."""
    from flowgym.lab.evaluation import env_for

    kw, H = scenario(name)
    agent = make_agent("learned")
    env = env_for(agent, kw, H)
    obs, _ = env.reset(seed=seed)
    agent.reset(env.config, seed=seed)
    mapping = spaces.LogMultiplierBudget(agent.requires["multipliers"], env.config.max_budget, env.tracker,
                                         of=agent.requires["multiplier_of"])
    out, done = [], False
    while not done:
        a = agent.act(obs, env.view())
        out.append(mapping.budget(a))  # the budget this slot's step admits by
        obs, _, te, tr, _ = env.step(a)
        done = te or tr
    return np.array(out)


def play_patched(attr: str, mapping: Callable[..., Any], agent: Agent, kw: dict[str, Any], seed: int, H: int) -> float:
    """The mean time in system of ``agent`` on one episode with :mod:`flowgym.envs.spaces`' ``attr`` (its mapping of an
    action to a budget) replaced by ``mapping`` in this process; the module's own is back afterwards."""
    saved = getattr(spaces, attr)
    setattr(spaces, attr, mapping)
    try:
        return run_episode(agent, kw, seed, H).metrics(H)["mean_time_in_system"]
    finally:
        setattr(spaces, attr, saved)


def play_ratio_table(job: Callable[[Any], tuple[str, str, float]], tasks: Sequence[Any], names: Sequence[str],
                     rules: Sequence[str], workers: int) -> None:
    """Run ``job`` on every task in ``workers`` spawned processes and print :func:`print_ratio_table` of the
    results, every rule after the first in the geometric means (the probes' common ending)."""
    with mp.get_context("spawn").Pool(workers) as pool:
        out = pool.map(job, tasks, chunksize=1)
    print_ratio_table(out, names, rules, geo=rules[1:])


def print_ratio_table(out: Sequence[tuple[str, str, float]], names: Sequence[str], rules: Sequence[str],
                      geo: Sequence[str]) -> None:
    """Print the mean time in system of each rule of ``rules[1:]`` over that of ``rules[0]`` (the reference), per
    scenario (``-`` where a rule did not run), as a markdown table, then the geometric means of the ``geo``
    rules over the scenarios. ``out``: ``(scenario, rule, time in system)`` per episode."""
    acc: dict[str, dict[str, list[float]]] = {}
    for n, r, v in out:
        acc.setdefault(n, {}).setdefault(r, []).append(v)
    print(f"| scenario (/ {rules[0]}) | " + " | ".join(rules[1:]) + " |")
    print("|---|" + "---:|" * (len(rules) - 1))
    logs: dict[str, list[float]] = {r: [] for r in geo}
    for n in names:
        base = float(np.mean(acc[n][rules[0]]))
        ratio = {r: float(np.mean(v)) / base for r, v in acc[n].items()}
        for r in logs:
            logs[r].append(math.log(ratio[r]))
        print(f"| {n} | " + " | ".join(f"{ratio[r]:.3f}" if r in ratio else "-" for r in rules[1:]) + " |")
    print("\ngeometric mean over the scenarios: " + ", ".join(f"{r} {math.exp(np.mean(v)):.3f}" for r, v in logs.items()))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-switch", help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budgets", nargs="+", metavar="SCENARIO", default=None,
                    help="instead: the shipped generalist's median budget and share of slots at 3 or less on these "
                    "scenarios (screening seed 7000)")
    args = ap.parse_args(argv)
    if args.budgets:
        for name in args.budgets:
            b = budgets(name)
            print(f"{name}: median budget {np.median(b):g}, {np.mean(b <= 3):.0%} of {b.size} slots at 3 or less")
        return 0
    if args.rate_switch is None:
        ap.error("--rate-switch is needed (or --budgets SCENARIO ...)")
    rs = tuned_rate_switch(args.rate_switch)
    names = [*ADAPTIVE_SCENARIOS, *held_out()]
    rules = ["rate-switch (tuned)", "ars9", "ars9 fractional", *(f"low={x:g}" for x in LOWS)]
    tasks = [(n, r, s, rs[n]) for n in names for r in rules for s in seeds_of(n)
             if not (r.startswith("low=") and rs[n]["low"] != 1)]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        out = pool.map(_job, tasks, chunksize=1)
    print_ratio_table(out, names, rules, geo=("ars9", "ars9 fractional"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
