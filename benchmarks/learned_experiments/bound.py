"""Where the goal "0.90x the best fixed budget" is out of reach of every policy: a lower bound.

The issue's non-stationary goal asks the learned budget for <= 0.90x the per-scenario best fixed budget's
mean time in system. :func:`flowgym.sim.theory.time_in_system_bound` bounds from below the mean time in
system of *any* schedule of a request stream (any budget, queue order or eviction rule; the paper's engine in
the slot model): the larger, in every slot, of the requests that cannot have finished yet (a request decodes
one token a slot) and the requests that shortest-remaining-work-first would still hold on a machine serving
``M`` token-slots a slot; and the linear relaxation of the hindsight program (``flowgym.lab.hindsight``) by
Lagrangian prices on the cache, at a scale the integer program cannot reach (the largest of these is the
bound; on most loaded scenarios it is the relaxation).
Per scenario this script tunes the best fixed budget as the benchmark does (``FIXED_GRID`` on seeds
1000-1001), runs it and the learned model on the report seeds, computes the bound on each seed's requests
(the same for every policy: arrivals and lengths do not depend on the actions) and prints ratios of means
with 95% paired bootstrap intervals:

* ``bound / best fixed``: above 0.90 (its interval too), no policy can meet the goal's second half there;
* ``learned / bound`` and ``best fixed / bound``: at most how much any policy could still gain.

The bound is loose where a long queue builds under memory pressure (the relaxation reorders, knows every
length and packs fractions), so a ratio below 0.90 says only that the goal is not excluded::

    python benchmarks/learned_experiments/bound.py                      # bench_learned's slot-model scenarios, seeds 0-19
    python benchmarks/learned_experiments/bound.py --set nonstationary --refs refs.json   # the sweep's 9000-9031, seeds 8000-8009

The Azure replay is left out: it runs in continuous time (seconds), where the bound in slots does not
apply. ``--refs`` reads the best fixed budget of a sweep scenario from ``nonstationary_sweep.py``'s cache
(keyed the same way) instead of tuning it again. About 7 minutes for the report scenarios on one core, 8
for the sweep's 32.
Results: docs/training.md, "What no policy can reach".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_learned import ADAPTIVE_SCENARIOS, FIXED_GRID, held_out, is_stationary, ratio_ci, scenario_arguments  # noqa: E402

from flowgym.envs.flow_control import FlowControlEnv  # noqa: E402
from flowgym.lab.evaluation import bound_unsupported, build_agent, run_episode, tune  # noqa: E402
from flowgym.lab.scenarios import AgentSpec  # noqa: E402
from flowgym.sim.theory import time_in_system_bound  # noqa: E402

TUNE_SEEDS = [1000, 1001]


def seed_figures(kw: dict[str, Any], b: int, model: str | None, seed: int, H: int | None) -> dict[str, float]:
    """One report seed: the best fixed budget's and the model's mean time in system and the bound's parts."""
    fixed = run_episode(build_agent(AgentSpec("flow-control", {"b": b})), kw, seed, H)
    learned = run_episode(build_agent(AgentSpec("learned", {} if model is None else {"path": model})), kw, seed, H)
    for key in ("arrival", "prompt_len", "output_len"):  # the bound is the same for both: check it
        if not np.array_equal(fixed.log[key], learned.log[key]):
            raise RuntimeError(f"seed {seed}: the requests' {key} differ between two policies")
    lg, T = fixed.log, int(fixed.series["usage"].size)
    bd = time_in_system_bound(lg["arrival"], lg["prompt_len"], lg["output_len"], int(kw["M"]), T)
    return {"fixed": fixed.metrics()["mean_time_in_system"], "learned": learned.metrics()["mean_time_in_system"],
            "bound": bd.bound, "service": bd.service, "memory": bd.memory, "lagrangian": bd.lagrangian}


def scenario_row(kw: dict[str, Any], b: int, model: str | None, seeds: Sequence[int], H: int | None) -> dict[str, Any]:
    """The bound's figures on one scenario over ``seeds`` (means, and ratios with intervals)."""
    per = [seed_figures(kw, b, model, s, H) for s in seeds]
    col = {k: np.array([p[k] for p in per]) for k in per[0]}
    return {"b": int(b), "mean": {k: float(v.mean()) for k, v in col.items()},
            "bound_over_fixed": ratio_ci(col["bound"], col["fixed"]),
            "fixed_over_bound": ratio_ci(col["fixed"], col["bound"]),
            "learned_over_bound": ratio_ci(col["learned"], col["bound"])}


def verdict(r: tuple[float, float, float]) -> str:
    """Whether 0.90x the best fixed budget is out of reach, from ``bound / best fixed`` and its interval."""
    if r[1] > 0.90:
        return "out of reach"
    if r[0] > 0.90:
        return "out of reach on the mean (interval crosses 0.90)"
    return "not excluded"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("report", "nonstationary"), default="report",
                    help="bench_learned's slot-model scenarios (default) or the random non-stationary sweep")
    ap.add_argument("--model", default=None, help="model directory (default: the shipped generalist)")
    ap.add_argument("--seeds", type=int, default=None,
                    help="report seeds (default: 20 from 0 for the report set, 10 from 8000 for the sweep)")
    ap.add_argument("--first", type=int, default=9000, help="the sweep's first scenario seed (default 9000)")
    ap.add_argument("--scenarios", type=int, default=32, help="sweep scenarios (default 32)")
    ap.add_argument("--refs", default=None, help="nonstationary_sweep.py's --refs file, for the tuned budgets")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    cases: list[tuple[str, dict[str, Any], int | None, Any]] = []  # (name, kw, horizon, b or None)
    if args.set == "report":
        seeds = list(range(args.seeds or 20))
        for name in [*ADAPTIVE_SCENARIOS, *held_out()]:
            kw, tune_kw, H, finite = scenario_arguments(name)
            why = bound_unsupported(FlowControlEnv(**kw).config)
            if why is not None:
                print(f"({name} left out: {why})", file=sys.stderr)
                continue
            cases.append((name, kw, H, None))
    else:
        import nonstationary_sweep as ns

        seeds = list(range(8000, 8000 + (args.seeds or 10)))
        cache: dict[str, Any] = {}
        if args.refs and os.path.exists(args.refs):
            with open(args.refs) as fh:
                cache = json.load(fh)
        for s in range(args.first, args.first + args.scenarios):
            label, kw = ns.draw(s)
            hit = cache.get(str(s))
            b = hit["b"] if hit is not None and hit.get("key") == ns.reference_key(kw) else None
            cases.append((f"{s} {label}", kw, ns.HORIZON, b))
    print("| scenario | best fixed b | best fixed TIS | service floor | memory floor | LP bound | bound | "
          "bound / best fixed | best fixed / bound | learned / bound | 0.90x best fixed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = []
    f = (lambda r: f"{r[0]:.3f} [{r[1]:.2f}, {r[2]:.2f}]")  # noqa: E731
    for name, kw, H, b in cases:
        tune_kw = scenario_arguments(name)[1] if args.set == "report" else kw
        if b is None:
            b, _ = tune(AgentSpec("flow-control", {}, tune=("b", FIXED_GRID)), tune_kw, TUNE_SEEDS, H)
        r = scenario_row(kw, int(b), args.model, seeds, H)
        stationary = is_stationary(kw)
        r.update(scenario=name, verdict="(stationary: goal 1.02x)" if stationary else verdict(r["bound_over_fixed"]))
        rows.append(r)
        m = r["mean"]
        print(f"| {name} | {r['b']} | {m['fixed']:.2f} | {m['service']:.2f} | {m['memory']:.2f} | {m['lagrangian']:.2f} | {m['bound']:.2f} | "
              f"{f(r['bound_over_fixed'])} | {f(r['fixed_over_bound'])} | {f(r['learned_over_bound'])} | "
              f"{r['verdict']} |", flush=True)
    out_of_reach = [r for r in rows if r["verdict"] == "out of reach"]
    non_stat = [r for r in rows if not r["verdict"].startswith("(stationary")]
    g = math.exp(np.mean([math.log(r["learned_over_bound"][0]) for r in rows]))
    print(f"\n0.90x the best fixed budget out of reach of every policy on {len(out_of_reach)} of {len(non_stat)} "
          f"non-stationary scenarios; learned / bound geometric mean {g:.3f} over {len(rows)}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
