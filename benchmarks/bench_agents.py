"""Wall time of one full T = 10000 run of paper-synthetic-known (lambda = 5 per class) per agent.

About 150,000 requests arrive in such a run. Each agent is timed end to end
(environment, agent decisions, metrics) on seed 0, best of ``--repeats``, after one short
warm-up run of every agent (so loading the compiled kernels is not charged to the first).
The reference, measured in the same run the same way, is the environment with a fixed
budget (``fixed:b=12``): ``x fixed`` is each agent's wall time over it, the cost of its
decisions on top of the simulation.

    python benchmarks/bench_agents.py [--horizon 10000] [--repeats 1] [--scenario paper-synthetic-known]
"""

from __future__ import annotations

import argparse
import time

from _args import at_least, positive_float, scenario

from flowgym.lab.evaluation import build_agent, run_episode
from flowgym.lab.scenarios import AgentSpec

WARMUP = 200


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--horizon", type=at_least(1), default=10_000)
    ap.add_argument("--repeats", type=at_least(1), default=1)
    ap.add_argument("--scenario", default="paper-synthetic-known")
    ap.add_argument("--rate", type=positive_float, default=None)
    args = ap.parse_args()
    sc = scenario(ap, args.scenario, args.rate)
    env = sc.env_kwargs()
    print(sc.description)
    specs = [AgentSpec("fixed", {"b": 12}, label="reference: fixed b=12"), *sc.agents]
    for spec in specs:  # warm-up: kernels compiled or loaded before anything is timed
        run_episode(build_agent(spec), env, seed=0, horizon=min(WARMUP, args.horizon))
    print(f"{'agent':34s} {'wall s':>8} {'x fixed':>8} {'requests':>9} {'completed':>9} {'us/slot':>8}")
    ref = None
    for spec in specs:
        best = float("inf")
        for _ in range(args.repeats):
            agent = build_agent(spec)
            t0 = time.perf_counter()
            ep = run_episode(agent, env, seed=0, horizon=args.horizon)
            m = ep.metrics()
            best = min(best, time.perf_counter() - t0)
        ref = best if ref is None else ref
        print(f"{spec.label or agent.label():34s} {best:8.2f} {best / ref:8.2f} {m['arrived']:9d} {m['completed']:9d} "
              f"{best / args.horizon * 1e6:8.1f}")


if __name__ == "__main__":
    main()
