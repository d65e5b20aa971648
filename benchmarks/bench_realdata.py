"""Wall time of continuous-time runs in "CartPole seconds": one 50,000-request paper-realdata-high
run per agent, and a full Azure conv replay.

    python benchmarks/bench_realdata.py [--scenario paper-realdata-high] [--no-azure] [--stepped]

A CartPole second is the wall time of 133,000 ``CartPole-v1`` steps (``gym.make``, random
actions, resets included), measured in the same run before the agents (and again after them,
printed as a check that the machine's load did not change). Each agent's run (seed 0, the scenario's default parameters, to
the end of its workload or the scenario's iteration cap) is divided by it.

Goals (issue: continuous time at the speed of the slot model): flow control <= 1.0,
every agent <= 3.0. Scripted agents that state their ``admission_rule`` run in one compiled
loop (``FlowControlEnv.run_rule``); ``--stepped`` also times the Python path (every
iteration through ``env.step`` and ``agent.act``), the reference the loop replaced.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
from _args import scenario

from flowgym.lab.evaluation import build_agent, run_episode
from flowgym.lab.scenarios import get_scenario

CARTPOLE_STEPS = 133_000


def cartpole_seconds(steps: int = CARTPOLE_STEPS) -> float:
    """Wall time of ``steps`` CartPole-v1 steps through ``gym.make`` (random actions, resets included)."""
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.action_space.seed(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    return time.perf_counter() - t0


def bench(name: str, ref: float, stepped: bool, goals: bool) -> list[tuple[str, float]]:
    sc = get_scenario(name)
    print(sc.description)
    cap = sc.env_kwargs().get("horizon")
    head = f"{'agent':28s} {'wall s':>7} {'CP s':>6} {'requests':>9} {'iterations':>10} {'us/iter':>8} {'sim s':>8}"
    print(head + ("  stepped s  speed-up" if stepped else ""))
    out = []
    for spec in sc.agents:
        agent = build_agent(spec)
        run_episode(agent, {**sc.env_kwargs(), "horizon": 50}, seed=0, horizon=None)  # compile, warm caches
        t0 = time.perf_counter()
        ep = run_episode(agent, sc.env_kwargs(), seed=0, horizon=None)
        wall = time.perf_counter() - t0
        m = ep.metrics()
        label = spec.label or agent.label()
        line = (f"{label:28s} {wall:7.2f} {wall / ref:6.2f} {m['arrived']:9d} {m['T']:10d} "
                f"{wall / m['T'] * 1e6:8.1f} {m['elapsed']:8.0f}")
        if cap is not None and m["T"] >= cap:
            label += " [cap]"
            line = f"{label:28s}" + line[28:]
        if stepped:
            t0 = time.perf_counter()
            run_episode(build_agent(spec), sc.env_kwargs(), seed=0, horizon=None, compiled=False)
            slow = time.perf_counter() - t0
            line += f"  {slow:9.2f}  {slow / wall:7.1f}x"
        print(line, flush=True)
        out.append((label, wall / ref))
    if goals:
        fc = [r for lab, r in out if lab.startswith("flow-control")]
        worst = max(r for _, r in out)
        flow = f"flow control {fc[0]:.2f} CP s (<= 1.0: {'met' if fc[0] <= 1.0 else 'MISSED'})" if fc else \
            "no flow-control agent in this scenario (its goal is not measured)"
        print(f"goals: {flow}; slowest agent {worst:.2f} CP s (<= 3.0: {'met' if worst <= 3.0 else 'MISSED'})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="paper-realdata-high")
    ap.add_argument("--no-azure", action="store_true", help="skip the Azure conv replay")
    ap.add_argument("--stepped", action="store_true", help="also time the Python path of every agent (slow)")
    args = ap.parse_args()
    scenario(ap, args.scenario)  # a bad name fails here, before the reference runs
    before = cartpole_seconds()
    print(f"reference: {CARTPOLE_STEPS:,} CartPole-v1 steps in {before:.3f} s")
    out = bench(args.scenario, before, args.stepped, goals=True)
    if not args.no_azure:
        print()
        bench("azure-conv", before, args.stepped, goals=False)
    after = cartpole_seconds()
    print(f"reference again: {after:.3f} s (the CP s above use {before:.3f} s; with {after:.3f} s the slowest "
          f"agent of {args.scenario} would be {max(r for _, r in out) * before / after:.2f} CP s)")


if __name__ == "__main__":
    main()
