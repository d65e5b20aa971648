"""Wall time of continuous-time runs: one 50,000-request paper-realdata-high run per agent, and a
full Azure conv replay.

    python benchmarks/bench_realdata.py [--scenario paper-realdata-high] [--no-azure]

Goal (issue: continuous time and real workloads): one agent's 50,000-request run in about a second.
"""

from __future__ import annotations

import argparse
import time

from flowgym.lab.evaluation import build_agent, run_episode
from flowgym.lab.scenarios import get_scenario


def bench(name: str, rate: float | None = None) -> None:
    sc = get_scenario(name, rate=rate)
    print(sc.description)
    print(f"{'agent':28s} {'wall s':>7} {'requests':>9} {'iterations':>10} {'us/iter':>8} {'sim s':>8}")
    for spec in sc.agents:
        agent = build_agent(spec)
        t0 = time.perf_counter()
        ep = run_episode(agent, sc.env_kwargs(), seed=0, horizon=None)
        m = ep.metrics()
        wall = time.perf_counter() - t0
        print(f"{spec.label or agent.label():28s} {wall:7.2f} {m['arrived']:9d} {m['T']:10d} "
              f"{wall / m['T'] * 1e6:8.1f} {m['elapsed']:8.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="paper-realdata-high")
    ap.add_argument("--no-azure", action="store_true", help="skip the Azure conv replay")
    args = ap.parse_args()
    bench(args.scenario)
    if not args.no_azure:
        bench("azure-conv")


if __name__ == "__main__":
    main()
