"""Why the rate-anchored generalist loses on short phases, and the fixed rules that led to two anchors.

Part 1 (``trace``): queue length, evictions and cache use every 50 slots of one episode of a
scenario, for the fixed rules ``ceil(c x arrival rate)`` (the one-anchor generalist played
``c ~ 1.4``), the untuned two-anchor rule and the shipped generalist; on
H4-short-phases the queue of short requests left from a chat phase waits for hundreds of slots
with the cache 20-40% full, because the arrival rate (the anchor) fell when the long phase began.

Part 2 (``screen``): untuned fixed rules on every ``adaptive-*`` and held-out scenario of
``benchmarks/bench_learned.py``, on screening seeds 7000-7003 (not the report seeds 0-19 nor the
tuning seeds 1000-1001), each mean time in system over the tuned rate-switch's (whose parameters
come from the benchmark's tuning, passed as ``--rate-switch FILE``: the JSON that
``bench_learned.py --out`` writes). The rules read the environment's online estimates (arrival
rate and safe budget ``M / E_hat[w]``) through ``action="log-multiplier"``'s anchors, as the
learned policy does::

Part 3 (``plays``): what a two-anchor model plays on one episode of each scenario named: the 5%,
50% and 95% quantiles of ``k_rate`` and ``k_safe`` at its decision points, and how often the rate
anchor gives the budget::

    python benchmarks/learned_experiments/anchors.py trace H4-short-phases --seed 7000
    python benchmarks/learned_experiments/anchors.py screen --rate-switch results/bench_learned.json
    python benchmarks/learned_experiments/anchors.py screen --rules gated --rate-switch results/bench_learned.json
    python benchmarks/learned_experiments/anchors.py screen --rules head --rate-switch results/bench_learned.json
    python benchmarks/learned_experiments/anchors.py screen --models runs/ars7,runs/ars8 --rate-switch results/bench_learned.json
    python benchmarks/learned_experiments/anchors.py plays H4-short-phases adaptive-high --seed 7000
    python benchmarks/learned_experiments/anchors.py regret --model runs/ars4
    python benchmarks/learned_experiments/anchors.py phases H4-short-phases 1000 300 --rate-switch results/bench_learned.json --models runs/ars8

Part 4 (``regret``): a model's time in system on draws of the training distribution over the best
of six fixed two-anchor pairs chosen per draw with hindsight (where it could still gain).

Part 5 (``pairs``): the best constant head-era two-anchor pair of each scenario named, on the screening
seeds and picked on them (hindsight), over the tuned rate-switch: what one constant of the generalist's
own action reaches (about 35 s a scenario)::

    python benchmarks/learned_experiments/anchors.py pairs H8-overload-then-light H4-short-phases --rate-switch results/bench_learned.json

Part 6 (``swings``): how much each scenario's load swings under a model (the three features ``load-v4``
adds: moving means over about 1,000 slots of how far a fast estimate of the arrival rate, the arriving
prompt and the completed length is from a slow one), and as much for new draws of the training
distribution (``--draws``)::

    python benchmarks/learned_experiments/anchors.py swings H4-short-phases adaptive-high --draws 24

Part 7 (``ranges``): how often each scenario drives a model's normalised inputs beyond 3 and 5 spreads from
their means, against new draws of the training distribution pooled (``--draws``): whether a report scenario
asks the linear policy to extrapolate (results: docs/training.md, "Beyond the report scenarios")::

    python benchmarks/learned_experiments/anchors.py ranges H4-short-phases H8-overload-then-light --draws 48

(``screen`` about a minute on 2 cores, after ``python benchmarks/bench_learned.py --out
results/bench_learned`` has tuned the rate-switch, about 18 minutes; ``trace`` and ``plays``
seconds). The results are in docs/training.md, "Two anchors".
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_learned import held_out, scenario_arguments  # noqa: E402

from flowgym.agents import make_agent  # noqa: E402
from flowgym.agents.base import Agent  # noqa: E402
from flowgym.lab.evaluation import run_episode  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS, get_scenario  # noqa: E402

#: Screening seeds (used by no report, tuning, training or selection).
SEEDS = [7000, 7001, 7002, 7003]


class RateMultiple(Agent):
    """``B_t = ceil(c x arrival rate)`` (the dict observation's moving average), capped at 256."""

    name = "rate-multiple"

    def __init__(self, c: float) -> None:
        self.c = float(c)
        self.requires = {"observation": "dict", "eviction": "lifo", "max_budget": 256}

    def act(self, observation: Any, view: Any) -> int:
        return int(min(256, max(1, math.ceil(self.c * float(observation["arrival_rate"][0])))))

    def label(self) -> str:
        return f"{self.c:g} x rate"


def scenario(name: str) -> tuple[dict[str, Any], int | None]:
    """A scenario's environment arguments and the horizon the benchmark reports it at."""
    kw, _, H, _ = scenario_arguments(name)
    return kw, H


RULES: dict[str, Any] = {
    "1.4 x rate": lambda: RateMultiple(1.4),
    "2 x rate": lambda: RateMultiple(2.0),
    "safe-budget k=1": lambda: make_agent("safe-budget", k=1.0),
    "safe-budget k=2": lambda: make_agent("safe-budget", k=2.0),
    "max(1.4 rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.0),
    "max(1.4 rate, 1.4 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.4),
    "max(1.2 rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.2, k_safe=1.0),
    "max(1 rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.0, k_safe=1.0),
}


class GatedAnchors(Agent):
    """Two anchors whose multipliers switch on a load feature: ``under`` = ``(k_rate, k_safe)`` while
    ``rho`` (arrival rate x E_hat[w] / M at one time constant) is below ``threshold``, else ``over``.

    The rule a policy would need if overload (where both multipliers should be ~1) could be told
    from a switching load by ``rho``; it cannot (docs/training.md, "Short phases and trace pieces").
    """

    name = "gated-anchors"
    LO, HI = 0.5, 4.0

    def __init__(self, tau: int, threshold: float, under: tuple[float, float], over: tuple[float, float]) -> None:
        from flowgym.sim.estimators import LOAD_FEATURES

        self.feature = LOAD_FEATURES.index(f"rho_{tau}")
        self.threshold = float(threshold)
        to_a = lambda k: 2.0 * math.log(k / self.LO) / math.log(self.HI / self.LO) - 1.0  # noqa: E731
        self.under = np.array([to_a(k) for k in under], np.float32)
        self.over = np.array([to_a(k) for k in over], np.float32)
        self.requires = {"observation": "load", "action": "log-multiplier", "multiplier_of": "max",
                         "multipliers": (self.LO, self.HI), "max_budget": 256}

    def act(self, observation: Any, view: Any) -> np.ndarray:
        return (self.under if float(observation[self.feature]) < self.threshold else self.over).copy()


#: ``screen --rules gated``: two-anchor multipliers switched on the estimated load ``rho``.
GATED: dict[str, Any] = {
    "max(1.4 rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.0),
    "max(1.4 rate, 1.4 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.4),
    "rho_128 < 0.95 ? (1.4, 1.4) : (1, 1)": lambda: GatedAnchors(128, 0.95, (1.4, 1.4), (1.0, 1.0)),
    "rho_128 < 0.95 ? (1.4, 1.4) : (0.5, 1)": lambda: GatedAnchors(128, 0.95, (1.4, 1.4), (0.5, 1.0)),
    "rho_512 < 0.95 ? (1.4, 1.4) : (1, 1)": lambda: GatedAnchors(512, 0.95, (1.4, 1.4), (1.0, 1.0)),
    "rho_32 < 0.95 ? (1.4, 1.4) : (1, 1)": lambda: GatedAnchors(32, 0.95, (1.4, 1.4), (1.0, 1.0)),
    "rho_128 < 0.9 ? (1.4, 1.6) : (1, 1)": lambda: GatedAnchors(128, 0.9, (1.4, 1.6), (1.0, 1.0)),
    "rho_128 < 1 ? (1.4, 1.4) : (0.5, 1)": lambda: GatedAnchors(128, 1.0, (1.4, 1.4), (0.5, 1.0)),
}


#: ``screen --rules head``: two anchors whose rate anchor is the larger of the rate now and when the queue
#: head arrived (``multiplier_of="max-head"``; docs/training.md, "Head-era rate").
HEAD: dict[str, Any] = {
    "max(1.4 rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.0),
    "max(1.4 head rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.0, head=True),
    "max(1.2 head rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.2, k_safe=1.0, head=True),
    "max(1.4 head rate, 0.8 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=0.8, head=True),
    "max(1 head rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.0, k_safe=1.0, head=True),
    "max(1.7 head rate, 0.8 safe)": lambda: make_agent("two-anchor", k_rate=1.7, k_safe=0.8, head=True),
}


class DrainAnchors(Agent):
    """``max(1.4 x head-era rate, 1 x safe budget, min(queue / tau, c x safe budget))``: the head-era two-anchor
    rule with a third, fixed term that drains the queue in about ``tau`` slots, capped at ``c`` safe budgets.

    Read from the ``load-v2`` features (the safe budget from ``log2(bs) / 8``, the queue from
    ``log(1 + q / bs)``, the rates from ``log(1 + r / bs)``), so it sees what the learned policy sees.
    With ``tau`` infinite it is ``two-anchor:head=true`` up to the features' float32 rounding (checked
    on H4 and H8, screening seeds: the same time in system to three digits).
    """

    name = "drain-anchors"

    def __init__(self, tau: float, c: float) -> None:
        from flowgym.sim.estimators import LOAD_FEATURES_V2

        self.tau, self.c = float(tau), float(c)
        self._i = {k: LOAD_FEATURES_V2.index(k) for k in ("log_safe_budget", "backlog_slots", "rate_32",
                                                          "head_rate")}
        self.requires = {"observation": "load-v2", "action": "budget", "max_budget": 256}

    def act(self, observation: Any, view: Any) -> int:
        o, i = observation, self._i
        bs = 2.0 ** (8.0 * float(o[i["log_safe_budget"]]))
        rate = bs * max(math.expm1(float(o[i["head_rate"]])), math.expm1(float(o[i["rate_32"]])))
        q = bs * math.expm1(float(o[i["backlog_slots"]]))
        return int(min(256, max(1, round(max(1.4 * rate, bs, min(q / self.tau, self.c * bs))))))

    def label(self) -> str:
        return f"drain tau={self.tau:g} c={self.c:g}"


#: ``screen --rules drain``: the head-era two-anchor rule with a fixed drain term (docs/training.md, "Why H8 is lost").
DRAIN: dict[str, Any] = {
    "max(1.4 head rate, 1 safe)": lambda: make_agent("two-anchor", k_rate=1.4, k_safe=1.0, head=True),
    "drain tau=50 c=2": lambda: DrainAnchors(50, 2.0),
    "drain tau=100 c=2": lambda: DrainAnchors(100, 2.0),
    "drain tau=100 c=3": lambda: DrainAnchors(100, 3.0),
    "drain tau=200 c=3": lambda: DrainAnchors(200, 3.0),
}

#: ``screen --rules``: the rule sets by name.
RULE_SETS: dict[str, dict[str, Any]] = {"anchors": RULES, "gated": GATED, "head": HEAD, "drain": DRAIN}


def _job(task: tuple[str, str, int, dict[str, Any] | None]) -> tuple[str, str, float]:
    name, rule, seed, rs = task
    kw, H = scenario(name)
    if rule == "rate-switch (tuned)":
        agent = make_agent("rate-switch", **rs)
    elif rule.startswith("model "):
        agent = make_agent("learned", path=rule[len("model "):])
    else:
        agent = next(rules[rule] for rules in RULE_SETS.values() if rule in rules)()
    return name, rule, run_episode(agent, kw, seed, H).metrics(H)["mean_time_in_system"]


def screen(rate_switch: dict[str, dict[str, Any]], workers: int = 2,
           rules_set: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """Mean time in system of each rule (and the tuned rate-switch) per scenario over :data:`SEEDS`."""
    names = [*ADAPTIVE_SCENARIOS, *held_out()]
    rules = ["rate-switch (tuned)", *(RULES if rules_set is None else rules_set)]

    tasks = [(n, r, s, rate_switch.get(n)) for n in names for r in rules for s in seeds_of(n)
             if r != "rate-switch (tuned)" or n in rate_switch]
    with mp.get_context("spawn").Pool(workers) as pool:
        out = pool.map(_job, tasks, chunksize=1)
    acc: dict[str, dict[str, list[float]]] = {}
    for n, r, v in out:
        acc.setdefault(n, {}).setdefault(r, []).append(v)
    return {n: {r: float(np.mean(v)) for r, v in d.items()} for n, d in acc.items()}


def seeds_of(name: str) -> list[int]:
    """The screening seeds of scenario ``name``: :data:`SEEDS`, or the first only for a finite trace (the Azure
    replay), which is one episode whatever the seed."""
    return SEEDS[:1] if name in ADAPTIVE_SCENARIOS and get_scenario(name).finite else SEEDS


def tuned_rate_switch(path: str) -> dict[str, dict[str, Any]]:
    """The tuned rate-switch parameters per scenario from ``bench_learned.py --out``'s JSON."""
    with open(path) as fh:
        return {r["scenario"]: r["rate_switch"] for r in json.load(fh)}


def trace(name: str, seed: int, model: str | None = None) -> str:
    """Queue, evictions and cache use every 50 slots under two rate multiples (the one-anchor generalist
    played ``k ~ 1.4``), the untuned two-anchor rule and the shipped generalist."""
    kw, H = scenario(name)
    agents = [RateMultiple(1.4), RateMultiple(2.0), make_agent("two-anchor"),
              make_agent("learned", **({} if model is None else {"path": model}))]
    eps = [run_episode(a, kw, seed, H) for a in agents]
    lines = ["| slots | " + " | ".join(f"{a.label()}: queue, evicted, cache" for a in agents) + " |",
             "|---|" + "---|" * len(agents)]
    n = min(ep.series["queue_len"].size for ep in eps)
    for t0 in range(0, n, 50):
        sl = slice(t0, t0 + 50)
        cells = [f"{ep.series['queue_len'][sl].mean():.0f}, {int(ep.series['evicted'][sl].sum())}, "
                 f"{ep.series['usage'][sl].mean() / ep.config.M:.2f}" for ep in eps]
        lines.append(f"| {t0}-{t0 + 49} | " + " | ".join(cells) + " |")
    tis = ", ".join(f"{a.label()} {ep.metrics(H)['mean_time_in_system']:.1f}" for a, ep in zip(agents, eps))
    return "\n".join(lines) + f"\n\nmean time in system: {tis}"


def plays(names: list[str], seed: int, model: str | None = None) -> list[str]:
    """Quantiles of a two-anchor model's multipliers at its decision points, and the rate anchor's share."""
    from flowgym.envs.spaces import TWO_ANCHORS, LogMultiplierBudget
    from flowgym.lab.evaluation import env_for

    agent = make_agent("learned", **({} if model is None else {"path": model}))
    of = agent.requires.get("multiplier_of")
    if of not in TWO_ANCHORS:
        raise ValueError(f"{agent.label()} is not a two-anchor model (multiplier_of={of!r})")
    out = []
    for name in names:
        kw, H = scenario(name)
        env = env_for(agent, kw, H)
        obs, _ = env.reset(seed=seed)
        agent.reset(env.config, seed=seed)
        # the environment's mapping of an action to its two multipliers
        mapping = LogMultiplierBudget(agent.requires["multipliers"], env.config.max_budget, env.tracker, of=of)
        ks, rate_decides, drain_decides, done = [], [], [], False
        while not done:
            decides = agent.decides_next
            a = agent.act(obs, env.view())
            if decides:
                k = mapping.multipliers(a)
                ks.append(k)
                by_rate, safe = k[0] * mapping.rate_anchor(), env.safe_budget()
                rate_decides.append(by_rate >= k[1] * safe)
                if len(k) == 3:  # max-drain: the drain term decides where it exceeds both anchors
                    drain_decides.append(mapping.drain_term(k[2]) > max(by_rate, k[1] * safe))
            obs, _, te, tr, _ = env.step(a)
            done = te or tr
        K = np.array(ks)
        q = lambda v: "-".join(f"{x:.2f}" for x in np.quantile(v, [0.05, 0.5, 0.95]))  # noqa: E731
        drain = (f", k_drain {q(K[:, 2])}, drain term decides {100 * np.mean(drain_decides):.0f}%"
                 if drain_decides else "")
        out.append(f"{name}: k_rate {q(K[:, 0])}, k_safe {q(K[:, 1])}, rate anchor decides "
                   f"{100 * np.mean(rate_decides):.0f}% of {len(K)} decisions{drain}")
    return out


def _swings(kw: dict[str, Any], seed: int, H: int | None, model: str | None) -> np.ndarray:
    """The mean of the tracker's three swings (``load-v4``), read every 50 decision points over the last
    three quarters of one episode under a model (the first quarter is the swings' warm-up)."""
    from flowgym.lab.evaluation import env_for

    agent = make_agent("learned", **({} if model is None else {"path": model}))
    env = env_for(agent, kw, H)
    env.tracker.keeps_swings = True  # the environment keeps them for a load-v4 observation only
    obs, _ = env.reset(seed=seed)
    agent.reset(env.config, seed=seed)
    seen, done, t = [], False, 0
    while not done:
        obs, _, te, tr, _ = env.step(agent.act(obs, env.view()))
        done, t = te or tr, t + 1
        if t % 50 == 0:
            seen.append(env.tracker.swings.copy())
    x = np.array(seen)
    return x[len(x) // 4:].mean(axis=0)


def swings(names: list[str], seeds: list[int], draws: int, model: str | None = None) -> list[str]:
    """How much each scenario's load swings (``load-v4``'s three features, mean over seeds) and, with ``draws``,
    as much for new draws of the training distribution (seeds 33000..), one line each."""
    from flowgym.lab.distributions import RandomMix

    out = ["| load | rate_swing | prompt_swing | length_swing |", "|---|---:|---:|---:|"]
    for name in names:
        kw, H = scenario(name)
        m = np.mean([_swings(kw, s, H, model) for s in seeds], axis=0)
        out.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in m) + " |")
    dist = RandomMix()
    for seed in range(33000, 33000 + draws):
        kw = dict(dist(np.random.default_rng(seed)))
        w = kw["workload"]
        kind = "trace piece" if w.get("kind") == "azure" else (
            "switching" if w.get("kind") == "mix" else "stationary")
        m = _swings(kw, seed, None, model)
        out.append(f"| draw {seed} ({kind}) | " + " | ".join(f"{v:.3f}" for v in m) + " |")
    return out


def decision_points(agent: Any, kw: dict[str, Any], seed: int, H: int | None) -> np.ndarray:
    """A learned ``agent``'s normalised observation (as its policy reads it) at every decision point of one
    episode of ``kw`` at horizon ``H`` (``None``: ``kw``'s own)."""
    from flowgym.lab.evaluation import env_for

    env = env_for(agent, kw, H)
    obs, _ = env.reset(seed=seed)
    agent.reset(env.config, seed=seed)
    seen, done = [], False
    while not done:
        if agent.decides_next:
            seen.append(agent.normalize(obs))
        obs, _, te, tr, _ = env.step(agent.act(obs, env.view()))
        done = te or tr
    return np.array(seen, dtype=np.float64)


def _normalised(kw: dict[str, Any], seed: int, H: int | None, model: str | None) -> np.ndarray:
    """The model's normalised observation at every decision point of one episode, in absolute value."""
    agent = make_agent("learned", **({} if model is None else {"path": model}))
    return np.abs(decision_points(agent, kw, seed, H))


def ranges(names: list[str], seed: int, draws: int, model: str | None = None) -> list[str]:
    """How far outside its normalisation each scenario (and, with ``draws``, new draws of the training
    distribution, seeds 33000..) drives the model's inputs: the share of decision points where some
    normalised feature is beyond 3 and beyond 5 (in spreads from the mean), and the two features most often
    beyond 3. A scenario far more often out there than the training draws would be one the linear policy
    extrapolates on."""
    from flowgym.envs.spaces import LOAD_OBSERVATIONS
    from flowgym.lab.distributions import RandomMix
    from flowgym.sim.estimators import FEATURE_VERSIONS

    observation = make_agent("learned", **({} if model is None else {"path": model})).requires.get("observation")
    version = LOAD_OBSERVATIONS.get(str(observation))
    names_of = FEATURE_VERSIONS[version] if version else None
    out = ["| load | some \\|z\\| > 3 | some \\|z\\| > 5 | most often beyond 3 |", "|---|---:|---:|---|"]

    def row(label: str, z: np.ndarray) -> str:
        share = (z > 3).mean(axis=0)
        top = [int(i) for i in np.argsort(-share)[:2] if share[i] > 0]
        name = (lambda i: names_of[i] if names_of and i < len(names_of) else f"feature {i}")
        return (f"| {label} | {(z > 3).any(axis=1).mean():.3f} | {(z > 5).any(axis=1).mean():.3f} | "
                + ", ".join(f"{name(i)} {share[i]:.3f}" for i in top) + " |")

    for n in names:
        kw, H = scenario(n)
        out.append(row(n, _normalised(kw, seed, H, model)))
    dist, zs = RandomMix(), []
    for s in range(33000, 33000 + draws):
        kw = dict(dist(np.random.default_rng(s)))
        zs.append(_normalised(kw, s, None, model))
    if zs:
        out.append(row(f"{draws} draws of RandomMix() (seeds 33000-{33000 + draws - 1}), pooled", np.concatenate(zs)))
    return out


def phases(name: str, cycle: float, on: float, rs: dict[str, Any], models: list[str]) -> list[str]:
    """Summed time in system (slots, mean over :data:`SEEDS`) of the requests arriving in each phase of a
    two-phase cycle (phase A: ``arrival % cycle < on``), for the tuned rate-switch, the fixed head-era
    two-anchor rule and each model: which phase's requests carry a loss."""
    kw, H = scenario(name)
    agents = {"rate-switch (tuned)": lambda: make_agent("rate-switch", **rs),
              "max(1.4 head rate, 1 safe)": lambda: make_agent("two-anchor", head=True),
              **{m: (lambda m=m: make_agent("learned", path=m)) for m in models}}
    out = []
    for label, build in agents.items():
        a_sum, b_sum, tis = [], [], []
        for seed in SEEDS:
            ep = run_episode(build(), kw, seed, H)
            arr, fin = np.asarray(ep.log["arrival"]), np.asarray(ep.log["finish"])
            t = np.where(fin >= 0, fin, H) - arr  # unfinished requests count until the horizon
            in_a = (arr % cycle) < on
            a_sum.append(float(t[in_a].sum()))
            b_sum.append(float(t[~in_a].sum()))
            tis.append(ep.metrics(H)["mean_time_in_system"])
        out.append(f"{label}: time in system {np.mean(tis):.1f}; summed over phase A's arrivals "
                   f"{np.mean(a_sum) / 1e3:.0f}k, phase B's {np.mean(b_sum) / 1e3:.0f}k")
    return out


#: ``pairs``: the grid of constant head-era two-anchor pairs ``(k_rate, k_safe)`` searched per scenario.
GRID_K_RATE = (0.7, 1.0, 1.4, 2.0, 2.8, 4.0)
GRID_K_SAFE = (0.5, 0.7, 1.0, 1.4, 2.0, 2.8)


def best_pairs(names: list[str], rs: dict[str, dict[str, Any]]) -> list[str]:
    """The best constant ``two-anchor:head=true`` pair of each scenario on :data:`SEEDS`, picked on those same
    seeds (hindsight: what one constant of the generalist's action family reaches there), over the tuned
    rate-switch, and the untuned ``(1.4, 1)``."""
    import itertools

    out = []
    for name in names:
        if name not in rs:
            raise SystemExit(f"pairs: {name!r} has no tuned rate-switch in the --rate-switch JSON (it has {sorted(rs)})")
        kw, H = scenario(name)

        def tis(build: Any) -> float:
            return float(np.mean([run_episode(build(), kw, s, H).metrics(H)["mean_time_in_system"]
                                  for s in seeds_of(name)]))

        base = tis(lambda: make_agent("rate-switch", **rs[name]))
        res = {(a, b): tis(lambda a=a, b=b: make_agent("two-anchor", k_rate=a, k_safe=b, head=True))
               for a, b in itertools.product(GRID_K_RATE, GRID_K_SAFE)}
        best = min(res, key=res.__getitem__)
        out.append(f"{name}: best pair k_rate={best[0]:g} k_safe={best[1]:g}: {res[best] / base:.3f} of the tuned "
                   f"rate-switch; (1.4, 1): {res[(1.4, 1.0)] / base:.3f}")
    return out


#: ``regret``: fixed two-anchor pairs ``(k_rate, k_safe)``, the best of which per draw is the reference.
PAIRS = [(1.4, 1.0), (1.4, 1.4), (1.0, 1.0), (2.0, 1.0), (1.0, 2.0), (0.7, 0.8)]


def _regret_job(task: tuple[int, str | None, dict[str, Any], bool]) -> tuple[int, str, float, dict[str, float]]:
    from flowgym.lab.distributions import RandomMix

    seed, model, over, head = task
    kw = RandomMix.from_spec(over)(np.random.default_rng(seed))
    H = kw["horizon"]
    learned = run_episode(make_agent("learned", **({} if model is None else {"path": model})), kw, seed, H)
    pairs = {f"({a:g}, {b:g})": run_episode(make_agent("two-anchor", k_rate=a, k_safe=b, head=head), kw, seed, H)
             .metrics()["mean_time_in_system"] for a, b in PAIRS}
    wl = kw["workload"]
    kind = wl["kind"] if wl["kind"] != "mix" else f"{len(wl['streams'])} streams, cycle {wl['streams'][0]['rate']['period']:.0f}"
    return seed, kind, learned.metrics()["mean_time_in_system"], pairs


def regret(seeds: list[int], model: str | None, over: dict[str, Any], workers: int = 2,
           head: bool = False) -> list[str]:
    """The model's time in system over the best fixed two-anchor pair's, per draw (largest first);
    ``head``: the pairs' rate anchor is the queue head's (``two-anchor`` with ``head=True``)."""
    with mp.get_context("spawn").Pool(workers) as pool:
        out = pool.map(_regret_job, [(s, model, over, head) for s in seeds], chunksize=1)
    rows = sorted(((tl / min(p.values()), s, kind, tl, min(p, key=p.get)) for s, kind, tl, p in out), reverse=True)
    lines = [f"seed {s} ({kind}): {tl:.1f}, {r:.3f} x the best pair {best}" for r, s, kind, tl, best in rows[:10]]
    lines.append(f"geometric mean over {len(rows)} draws: {math.exp(np.mean([math.log(r[0]) for r in rows])):.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace")
    t.add_argument("scenario")
    t.add_argument("--seed", type=int, default=SEEDS[0])
    t.add_argument("--model", default=None, help="model directory (default: the shipped generalist)")
    pl = sub.add_parser("plays")
    pl.add_argument("scenarios", nargs="+")
    pl.add_argument("--seed", type=int, default=SEEDS[0])
    pl.add_argument("--model", default=None, help="model directory (default: the shipped generalist)")
    sw = sub.add_parser("swings")
    sw.add_argument("scenarios", nargs="*")
    sw.add_argument("--seeds", default="7000,7001", help="comma-separated seeds of each scenario")
    sw.add_argument("--draws", type=int, default=0, help="also this many RandomMix draws (seeds 33000..)")
    sw.add_argument("--model", default=None, help="model directory (default: the shipped generalist)")
    rn = sub.add_parser("ranges")
    rn.add_argument("scenarios", nargs="*")
    rn.add_argument("--seed", type=int, default=SEEDS[0])
    rn.add_argument("--draws", type=int, default=0, help="also this many RandomMix draws (seeds 33000..), pooled")
    rn.add_argument("--model", default=None, help="model directory (default: the shipped generalist)")
    ph = sub.add_parser("phases")
    ph.add_argument("scenario")
    ph.add_argument("cycle", type=float, help="the cycle's length (slots)")
    ph.add_argument("on", type=float, help="phase A's length (slots from each cycle's start)")
    ph.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ph.add_argument("--models", default="", help="comma-separated model directories")
    rg = sub.add_parser("regret")
    rg.add_argument("--draws", type=int, default=48, help="RandomMix draws, seeds 30000.. (the selection draws)")
    rg.add_argument("--model", default=None, help="model directory (default: the shipped generalist)")
    rg.add_argument("--distribution", default='{"trace_p": 0, "phase_scale": "uniform"}',
                    help="JSON overrides of RandomMix (default: the distribution before 2026-11-26)")
    rg.add_argument("--head", action="store_true", help="the fixed pairs with the head-era rate anchor (max-head)")
    bp = sub.add_parser("pairs")
    bp.add_argument("scenarios", nargs="+")
    bp.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    s = sub.add_parser("screen")
    s.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--rules", choices=list(RULE_SETS), default="anchors",
                   help="the fixed anchors (default), the two anchors gated on the estimated load, with the "
                   "rate anchor at the queue head's arrival rate, or the head-era rule with a fixed drain term")
    s.add_argument("--models", default=None,
                   help="comma-separated model directories to screen instead of fixed rules (e.g. runs/ars7,runs/ars8)")
    args = ap.parse_args(argv)
    if args.cmd == "trace":
        print(trace(args.scenario, args.seed, args.model))
        return 0
    if args.cmd == "regret":
        print("\n".join(regret(list(range(30000, 30000 + args.draws)), args.model, json.loads(args.distribution),
                               head=args.head)))
        return 0
    if args.cmd == "phases":
        rs1 = tuned_rate_switch(args.rate_switch)[args.scenario]
        print("\n".join(phases(args.scenario, args.cycle, args.on, rs1, [m for m in args.models.split(",") if m])))
        return 0
    if args.cmd == "pairs":
        print("\n".join(best_pairs(args.scenarios, tuned_rate_switch(args.rate_switch))))
        return 0
    if args.cmd == "swings":
        print("\n".join(swings(args.scenarios, [int(s) for s in args.seeds.split(",")], args.draws, args.model)))
        return 0
    if args.cmd == "ranges":
        print("\n".join(ranges(args.scenarios, args.seed, args.draws, args.model)))
        return 0
    if args.cmd == "plays":
        print("\n".join(plays(args.scenarios, args.seed, args.model)))
        return 0
    rs = tuned_rate_switch(args.rate_switch)
    chosen = RULE_SETS[args.rules]
    if args.models:
        chosen = {f"model {m}": None for m in args.models.split(",")}
    res = screen(rs, args.workers, chosen)
    rules = list(chosen)
    print("| scenario | tuned rate-switch TIS | " + " | ".join(rules) + " |")
    print("|---|---:|" + "---:|" * len(rules))
    for n, d in res.items():
        base = d.get("rate-switch (tuned)", math.nan)
        print(f"| {n} | {base:.1f} | " + " | ".join(f"{d[r] / base:.2f}" for r in rules) + " |")
    tuned = [d for d in res.values() if "rate-switch (tuned)" in d]  # scenarios the JSON has parameters for
    geo = {r: math.exp(np.mean([math.log(d[r] / d["rate-switch (tuned)"]) for d in tuned])) for r in rules}
    print(f"| geometric mean over {len(tuned)} | - | " + " | ".join(f"{geo[r]:.3f}" for r in rules) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
