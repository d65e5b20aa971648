"""Wall time of one full T = 10000 run of paper-synthetic-known (lambda = 5 per class) per agent.

About 150,000 requests arrive in such a run. Each agent is timed end to end
(environment, agent decisions, metrics) on seed 0, best of ``--repeats``.

    python benchmarks/bench_agents.py [--horizon 10000] [--repeats 1] [--scenario paper-synthetic-known]
"""

from __future__ import annotations

import argparse
import time

from flowgym.lab.evaluation import build_agent, run_episode
from flowgym.lab.scenarios import get_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--horizon", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scenario", default="paper-synthetic-known")
    ap.add_argument("--rate", type=float, default=None)
    args = ap.parse_args()
    sc = get_scenario(args.scenario, rate=args.rate)
    print(sc.description)
    print(f"{'agent':34s} {'wall s':>8} {'requests':>9} {'completed':>9} {'us/slot':>8}")
    for spec in sc.agents:
        best = float("inf")
        for _ in range(args.repeats):
            agent = build_agent(spec)
            t0 = time.perf_counter()
            ep = run_episode(agent, sc.env_kwargs(), seed=0, horizon=args.horizon)
            m = ep.metrics()
            best = min(best, time.perf_counter() - t0)
        print(f"{spec.label or agent.label():34s} {best:8.2f} {m['arrived']:9d} {m['completed']:9d} "
              f"{best / args.horizon * 1e6:8.1f}")


if __name__ == "__main__":
    main()
