"""Speed of FlowControl-v0 against Gymnasium's CartPole, every figure measured in the same run.

Prints, with the machine, the versions and the load average (the 1-minute load
before and after: other processes on the machine slow every figure alike, so
read the ratios):

1. single environment, both via ``gym.make`` (same default wrappers):
   FlowControl-v0 steps/s (unknown and known output lengths) vs CartPole-v1,
   with the compiled kernels (numba, ``flowgym[fast]``; the default when
   installed) and on the numpy path (``Engine.jit = False``);
2. the batched vector environment (``gym.make_vec("FlowControl-v0", num_envs=N)``,
   :class:`flowgym.envs.vector.FlowControlVectorEnv`) at N = 64 and 256 vs
   Gymnasium's ``CartPoleVectorEnv`` (``gym.make_vec("CartPole-v1", num_envs=N,
   vectorization_mode="vector_entry_point")``), in environment steps per second
   (N per call), plus Gymnasium's ``SyncVectorEnv`` over FlowControl-v0 for scale;
3. one full paper-synthetic ``T = 10000`` rollout (lambda = 5 per class,
   ``B = 12``, reset + steps + metrics), single environment;
4. PPO end to end (Stable-Baselines3 ``PPO("MlpPolicy")`` on
   :class:`flowgym.envs.sb3.FlowControlSB3VecEnv`): environment steps per second of
   ``model.learn`` (rollouts + updates), after one warm-up rollout.

FlowControl-v0 runs the paper's three classes at lambda = 2.1 per class
(rho = 0.52, about 250 requests active) with a fixed budget ``B = 8`` and a
1000-slot horizon (episodes end and reset during the measurement).

    python benchmarks/bench_vector.py [--steps 30000] [--vec-steps 2000] [--repeats 5]
                                      [--ppo-steps 65536] [--torch-threads 1] [--quick]

Goals (issue 7): single env >= 0.5x CartPole-v1; batched N = 256 >= 0.5x
CartPoleVectorEnv at N = 256; PPO end to end >= 5,000 steps/s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from _args import at_least

import flowgym  # noqa: F401  (registers FlowControl-v0)
from flowgym.sim import kernels

PAPER = [[10, 20], [10, 40], [10, 60]]
BENCH = {"horizon": 1000, "workload": {"kind": "poisson", "classes": PAPER, "rates": 2.1}}
BUDGET = 8


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def load() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def flowcontrol(jit: bool, **kwargs: Any) -> gym.Env:
    """``gym.make("FlowControl-v0", **BENCH, **kwargs)`` on the compiled or the numpy path."""
    env = gym.make("FlowControl-v0", **BENCH, **kwargs)
    env.unwrapped.engine.jit = jit  # read at reset
    return env


def single_run(env: gym.Env, action: Any, steps: int, seed: int, warmup: int = 2000) -> float:
    """Steps/s of one run of ``steps`` steps after ``warmup`` (resetting when an episode ends)."""
    env.reset(seed=seed)
    for _ in range(warmup):
        _, _, te, tr, _ = env.step(action)
        if te or tr:
            env.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, te, tr, _ = env.step(action)
        if te or tr:
            env.reset()
    return steps / (time.perf_counter() - t0)


def vector_run(env: gym.vector.VectorEnv, action: np.ndarray, calls: int, seed: int, warmup: int = 200) -> float:
    """Environment steps/s (``num_envs`` per call) of one run of ``calls`` calls; the env autoresets itself."""
    env.reset(seed=seed)
    for _ in range(warmup):
        env.step(action)
    t0 = time.perf_counter()
    for _ in range(calls):
        env.step(action)
    return env.num_envs * calls / (time.perf_counter() - t0)


def best_of(runs: dict[str, Callable[[int], float]], repeats: int) -> dict[str, float]:
    """The best figure of each run over ``repeats`` rounds; each round runs every one once, in turn.

    Interleaving puts a transient slowdown of the machine on both sides of a ratio
    (back-to-back blocks of repeats can put it on one side only).
    """
    best = dict.fromkeys(runs, 0.0)
    for r in range(repeats):
        for name, run in runs.items():
            best[name] = max(best[name], run(r))
    return best


def rollout_seconds(repeats: int) -> tuple[float, dict[str, Any]]:
    env = gym.make("FlowControl-v0", horizon=10_000, workload={"kind": "poisson", "classes": PAPER, "rates": 5.0})
    times, m = [], {}
    for r in range(repeats):
        t0 = time.perf_counter()
        env.reset(seed=r)
        done = False
        while not done:
            _, _, te, tr, _ = env.step(12)
            done = te or tr
        m = env.unwrapped.metrics()
        times.append(time.perf_counter() - t0)
    return min(times), m


def ppo_sps(num_envs: int, n_steps: int, batch_size: int, n_epochs: int, total: int, threads: int) -> float | None:
    try:
        import torch
        from stable_baselines3 import PPO

        from flowgym.envs.sb3 import FlowControlSB3VecEnv
    except ImportError as e:
        print(f"PPO end to end: skipped ({e})")
        return None
    torch.set_num_threads(threads)
    venv = FlowControlSB3VecEnv(num_envs, observation="flat", **BENCH)
    venv.seed(0)
    model = PPO("MlpPolicy", venv, n_steps=n_steps, batch_size=batch_size, n_epochs=n_epochs, seed=0, device="cpu")
    model.learn(num_envs * n_steps)  # warm-up rollout and update
    t0 = time.perf_counter()
    model.learn(total, reset_num_timesteps=False)
    return (model.num_timesteps - num_envs * n_steps) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=at_least(1), default=None, help="single-env steps per repeat (default 30,000)")
    ap.add_argument("--vec-steps", type=at_least(1), default=None, help="vector env calls per repeat (default 2,000)")
    ap.add_argument("--repeats", type=at_least(1), default=None,
                    help="rounds; each runs every measurement once, in turn (default 5)")
    ap.add_argument("--ppo-envs", type=at_least(1), default=64)
    ap.add_argument("--ppo-n-steps", type=at_least(2), default=128)
    ap.add_argument("--ppo-batch", type=at_least(2), default=1024)
    ap.add_argument("--ppo-epochs", type=at_least(1), default=4)
    ap.add_argument("--ppo-steps", type=at_least(1), default=None, help="timed PPO environment steps (default 65,536)")
    ap.add_argument("--torch-threads", type=at_least(1), default=1)
    ap.add_argument("--quick", action="store_true",
                    help="a few seconds, for a smoke run (noisy figures): the four sizes above default to 3,000, 200, "
                    "1 and 8,192 instead (a size given explicitly is kept)")
    args = ap.parse_args()
    sizes = (3000, 200, 1, 8192) if args.quick else (30_000, 2_000, 5, 65_536)
    for name, default in zip(("steps", "vec_steps", "repeats", "ppo_steps"), sizes):
        if getattr(args, name) is None:
            setattr(args, name, default)
    versions = f"python {platform.python_version()}, numpy {np.__version__}, gymnasium {gym.__version__}"
    if kernels.AVAILABLE:
        from importlib.metadata import version

        versions += f", numba {version('numba')} (kernels {'on' if kernels.ENABLED else 'off: FLOWGYM_JIT'})"
    try:
        import stable_baselines3
        import torch

        versions += f", stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__}"
    except ImportError:
        pass
    print(f"machine: {machine()}")
    print(f"versions: {versions}")
    print(f"load average at start (1, 5, 15 min): {load()}")
    print(f"best of {args.repeats} (interleaved); FlowControl-v0: lambda=2.1 x 3 classes, B={BUDGET}, horizon 1000\n")

    paths = [(True, "compiled")] if kernels.AVAILABLE else []
    paths.append((False, "numpy"))
    cart = gym.make("CartPole-v1")
    runs: dict[str, Callable[[int], float]] = {"cart": lambda r: single_run(cart, 1, args.steps, r)}
    for jit, label in paths:
        for known in (False, True):
            env = flowcontrol(jit, output_length_known=known)
            runs[f"{label}-{known}"] = lambda r, env=env: single_run(env, BUDGET, args.steps, r)
    single = best_of(runs, args.repeats)
    s_cart = single["cart"]
    print("single environment (gym.make)                 steps/s    / CartPole-v1")
    print(f"  CartPole-v1                              {s_cart:11.0f}")
    s_fc = 0.0
    for jit, label in paths:
        s_unk, s_known = single[f"{label}-False"], single[f"{label}-True"]
        s_fc = max(s_fc, s_unk)
        print(f"  FlowControl-v0 (unknown lengths, {label:8s}) {s_unk:9.0f}    {s_unk / s_cart:6.3f}"
              + ("   (goal >= 0.5)" if jit == paths[0][0] else ""))
        print(f"  FlowControl-v0 (known lengths, {label:8s})   {s_known:9.0f}    {s_known / s_cart:6.3f}")
    if not kernels.AVAILABLE:
        print("  (numba not installed: no compiled figures; pip install -e '.[fast]' in the flowgym checkout)")

    print("\nvector environments (gym.make_vec)            env steps/s  / CartPoleVectorEnv")
    ratios = {}
    for N in (64, 256):
        cv = gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="vector_entry_point")
        fv = gym.make_vec("FlowControl-v0", num_envs=N, **BENCH)
        assert fv.backend == "batched"
        fk = gym.make_vec("FlowControl-v0", num_envs=N, output_length_known=True, **BENCH)
        a_fc = np.full(N, BUDGET, np.int64)
        vec = best_of({"cart": lambda r: vector_run(cv, np.ones(N, np.int64), args.vec_steps, r),
                       "fc": lambda r: vector_run(fv, a_fc, args.vec_steps, r),
                       "known": lambda r: vector_run(fk, a_fc, args.vec_steps, r)}, args.repeats)
        v_cart, v_fc, v_known = vec["cart"], vec["fc"], vec["known"]
        sync_calls = max(1, args.vec_steps * 64 // (N * 8))
        fs = gym.make_vec("FlowControl-v0", num_envs=N, vectorization_mode="sync", **BENCH)
        v_sync = vector_run(fs, a_fc, sync_calls, 0, warmup=10)
        ratios[N] = v_fc / v_cart
        goal = "   (goal >= 0.5)" if N == 256 else ""
        print(f"  N={N:<4d} CartPoleVectorEnv                {v_cart:11.0f}")
        print(f"  N={N:<4d} FlowControl-v0 batched            {v_fc:11.0f}    {v_fc / v_cart:6.3f}{goal}")
        print(f"  N={N:<4d} FlowControl-v0 batched, known     {v_known:11.0f}    {v_known / v_cart:6.3f}")
        print(f"  N={N:<4d} FlowControl-v0 SyncVectorEnv      {v_sync:11.0f}    {v_sync / v_cart:6.3f}")

    secs, m = rollout_seconds(args.repeats)
    print(f"\nT=10000 paper-synthetic rollout (lambda=5 x 3, B=12, single env): {secs:.3f} s "
          f"({10_000 / secs:.0f} steps/s; {m['arrived']} requests, {m['completed']} completed)")

    ppo = ppo_sps(args.ppo_envs, args.ppo_n_steps, args.ppo_batch, args.ppo_epochs, args.ppo_steps,
                  args.torch_threads)
    if ppo is not None:
        print(f"PPO end to end (MlpPolicy, {args.ppo_envs} batched envs, n_steps={args.ppo_n_steps}, "
              f"batch={args.ppo_batch}, epochs={args.ppo_epochs}, torch threads={args.torch_threads}): "
              f"{ppo:.0f} steps/s   (goal >= 5000)")
    print(f"\nload average at end (1, 5, 15 min): {load()}")
    print("goals: single {} | batched N=256 {} | PPO {}".format(
        "met" if s_fc / s_cart >= 0.5 else "missed",
        "met" if ratios[256] >= 0.5 else "missed",
        "n/a" if ppo is None else ("met" if ppo >= 5000 else "missed")))


if __name__ == "__main__":
    main()
