"""Quickstart: drive FlowControl-v0 with a few fixed budgets and compare their metrics.

    python examples/quickstart.py
"""

from __future__ import annotations

import gymnasium as gym

import flowgym  # noqa: F401  (registers FlowControl-v0)
from flowgym.sim import theory

PAPER = [[10, 20], [10, 40], [10, 60]]


def run(budget: int, *, rate: float = 3.5, horizon: int = 3000, seed: int = 0) -> dict:
    env = gym.make("FlowControl-v0", horizon=horizon,
                   workload={"kind": "poisson", "classes": PAPER, "rates": rate})
    env.reset(seed=seed)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(budget)
        done = terminated or truncated
    return env.unwrapped.metrics()


if __name__ == "__main__":
    w = theory.work(10, 20), theory.work(10, 40), theory.work(10, 60)
    print("w_k =", w, " rho(lambda=3.5) =", round(theory.load(16492, 3.5, PAPER), 3))
    b_star = theory.max_global_budget(16492, sum(w) / 3)
    print("largest budget with b E[w] <= M (the edge of Theorem 2's memory condition):", b_star)
    print(f"{'B_t':>4} {'avg lat':>8} {'p95 lat':>8} {'req/slot':>9} {'evictions':>9} {'mean U/M':>8}")
    for b in (11, b_star, 16, 64):
        m = run(b)
        print(f"{b:>4} {m['avg_latency']:8.1f} {m['p95_latency']:8.1f} {m['request_throughput']:9.2f} "
              f"{m['evictions']:9d} {m['mean_kv_usage']:8.3f}")
