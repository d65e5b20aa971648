"""Steps per second of FlowControl-v0 against CartPole-v1, measured in the same run.

Both environments are built with ``gym.make`` (so both carry the same default
wrappers) and stepped with a fixed action. FlowControl-v0 runs the paper's three
classes at a stable load chosen so that about 250 requests are active
(lambda = 2.1 per class, rho = 0.52) under a fixed budget. Then a full
T = 10000 rollout of the paper's setting (lambda = 5 per class) with a fixed
budget is timed end to end (reset, steps, metrics).

    python benchmarks/bench_env.py [--steps 50000] [--repeats 3]

Goal (issue: FlowControl-v0): FlowControl-v0 / CartPole-v1 >= 0.5.
The full suite (vector environments, PPO end to end) is ``benchmarks/bench_vector.py``;
results in ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import platform
import time

import gymnasium as gym
import numpy as np

import flowgym  # noqa: F401  (registers FlowControl-v0)

PAPER = [[10, 20], [10, 40], [10, 60]]


def steps_per_second(env: gym.Env, action, steps: int, repeats: int, warmup: int = 2000) -> float:
    best = 0.0
    for r in range(repeats):
        env.reset(seed=r)
        for _ in range(warmup):
            _, _, te, tr, _ = env.step(action)
            if te or tr:
                env.reset()
        t0 = time.perf_counter()
        for _ in range(steps):
            _, _, te, tr, _ = env.step(action)
            if te or tr:
                env.reset()
        best = max(best, steps / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, gymnasium {gym.__version__}, "
          f"{platform.machine()}, best of {args.repeats} x {args.steps} steps")

    cart = gym.make("CartPole-v1")
    sps_cart = steps_per_second(cart, 1, args.steps, args.repeats)

    fc = gym.make("FlowControl-v0", horizon=10**9,
                  workload={"kind": "poisson", "classes": PAPER, "rates": 2.1})
    sps_fc = steps_per_second(fc, 8, args.steps, args.repeats)
    active = fc.unwrapped.engine.n_active
    fc_known = gym.make("FlowControl-v0", horizon=10**9, output_length_known=True,
                        workload={"kind": "poisson", "classes": PAPER, "rates": 2.1})
    sps_known = steps_per_second(fc_known, 8, args.steps, args.repeats)

    print(f"CartPole-v1                          {sps_cart:10.0f} steps/s")
    print(f"FlowControl-v0 (unknown lengths)     {sps_fc:10.0f} steps/s   ({active} active at the end)")
    print(f"FlowControl-v0 (known lengths)       {sps_known:10.0f} steps/s")
    print(f"ratio FlowControl-v0 / CartPole-v1   {sps_fc / sps_cart:10.3f}   (goal >= 0.5)")
    print(f"ratio, known lengths                 {sps_known / sps_cart:10.3f}")

    env = gym.make("FlowControl-v0", horizon=10_000,
                   workload={"kind": "poisson", "classes": PAPER, "rates": 5.0})
    times = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        env.reset(seed=r)
        done = False
        while not done:
            _, _, te, tr, _ = env.step(12)
            done = te or tr
        m = env.unwrapped.metrics()
        times.append(time.perf_counter() - t0)
    print(f"T=10000 paper-synthetic rollout (lambda=5, B=12): {min(times):.3f} s "
          f"({m['arrived']} requests, {m['completed']} completed)")


if __name__ == "__main__":
    main()
