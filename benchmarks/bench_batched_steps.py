"""Where the time of the batched vector environment goes: step times by kind, at N environments.

Runs ``gym.make_vec("FlowControl-v0", num_envs=N)`` on the workload of
``bench_vector.py`` (three classes at lambda = 2.1 each, ``B = 8``, horizon 1000)
and times every ``step`` call. Steps fall into three kinds, told apart by the
engine's clock (not by their duration):

* plain steps: one compiled pass over all environments (slot + observation);
* chunk steps: the environments also draw their next 256-slot workload chunk
  (every 256 slots; all at once here, since they reset together);
* reset steps: the step after the horizon, where every environment resets
  (its generator re-seeded) and draws its first chunk.

Prints the median of each kind, its share of the total time, and the mean step
time, against ``CartPoleVectorEnv`` at the same N measured in the same run
(repeats interleaved; the best of each).

    python benchmarks/bench_batched_steps.py [--num-envs 256] [--steps 4000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
from _args import at_least

import flowgym  # noqa: F401  (registers FlowControl-v0)
from flowgym.sim.workloads import CHUNK_SLOTS

PAPER = [[10, 20], [10, 40], [10, 60]]
BENCH = {"horizon": 1000, "workload": {"kind": "poisson", "classes": PAPER, "rates": 2.1}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-envs", type=at_least(1), default=256)
    ap.add_argument("--steps", type=at_least(1), default=4000, help="timed steps per repeat (after one warm-up episode)")
    ap.add_argument("--repeats", type=at_least(1), default=3)
    args = ap.parse_args()
    N = args.num_envs

    cart = gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="vector_entry_point")
    cart.reset(seed=0)
    ones = np.ones(N, np.int64)
    env = gym.make_vec("FlowControl-v0", num_envs=N, **BENCH)
    assert env.backend == "batched"
    env.reset(seed=0)
    a = np.full(N, 8, np.int64)
    for _ in range(1000):  # one warm-up episode each
        env.step(a)
        cart.step(ones)
    eng = env.unwrapped.engine
    cart_us = np.inf
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for _ in range(args.repeats):  # interleaved, best of each
        t0 = time.perf_counter()
        for _ in range(args.steps):
            cart.step(ones)
        cart_us = min(cart_us, (time.perf_counter() - t0) / args.steps * 1e6)
        times = np.empty(args.steps)
        kinds = np.empty(args.steps, dtype=object)
        for s in range(args.steps):
            t = int(eng.t[0])  # slot this step serves (all environments share the clock here)
            t0 = time.perf_counter()
            env.step(a)
            times[s] = (time.perf_counter() - t0) * 1e6
            kinds[s] = "reset" if t >= BENCH["horizon"] else ("chunk" if (t + 1) % CHUNK_SLOTS == 0 else "plain")
        if best is None or times.sum() < best[0]:
            best = (float(times.sum()), times, kinds)
    assert best is not None
    total, times, kinds = best
    print(f"N={N}, {args.steps} steps, best of {args.repeats}; CartPoleVectorEnv: {cart_us:.1f} us per step")
    print(f"{'kind':6s} {'steps':>6s} {'median us':>10s} {'share of time':>14s}")
    for kind in ("plain", "chunk", "reset"):
        sel = times[kinds == kind]
        if sel.size:
            print(f"{kind:6s} {sel.size:6d} {np.median(sel):10.1f} {sel.sum() / total:14.1%}")
    mean = total / args.steps
    print(f"mean step: {mean:.1f} us ({N / mean * 1e6:,.0f} env steps/s), {cart_us / mean:.3f} x CartPoleVectorEnv")


if __name__ == "__main__":
    main()
