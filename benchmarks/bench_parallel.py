"""Sweeps on several cores: the same grid on the serial, process and Ray backends.

The grid is flow control with ``b`` in 8..32 (9 values) on the paper's unknown-length
synthetic setting (``paper-synthetic-unknown``) at ``T = 50000`` slots, 12 seeds: 108
episodes of about 0.55 s each. Each backend runs the whole grid through
:func:`flowgym.lab.evaluation.evaluate`; the script checks that every table equals the
serial one, then prints wall times and speed-ups against serial measured in the same run,
and Ray's per-task overhead (empty tasks, after start-up) and start-up time.

    python benchmarks/bench_parallel.py [--workers 2] [--seeds 12] [--no-ray]

Goal (issue: sweeps on Ray): process and ray with 2 workers at least 1.7x serial on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

from _args import at_least

from flowgym.lab.evaluation import evaluate
from flowgym.lab.parallel import make_backend
from flowgym.lab.scenarios import AgentSpec, get_scenario

B_VALUES = [8, 10, 12, 14, 16, 20, 24, 28, 32]
HORIZON = 50_000


def grid(seeds: int) -> tuple[list[AgentSpec], dict, list[int]]:
    env = get_scenario("paper-synthetic-unknown", rate=3.5).env_kwargs()
    agents = [AgentSpec("flow-control", {"b": b}, label=f"b={b}") for b in B_VALUES]
    return agents, env, list(range(seeds))


def run(backend: str, workers: int, seeds: int) -> tuple[float, float, object]:
    agents, env, seed_list = grid(seeds)
    t0 = time.perf_counter()
    with make_backend(backend, workers=None if backend == "serial" else workers) as be:
        t1 = time.perf_counter()
        # start the workers (and, on every backend, load the compiled kernels) before timing the grid
        evaluate(agents[:1], env, seed_list[:workers], [100], backend=be, keep_kv_usage=False)
        t2 = time.perf_counter()
        table = evaluate(agents, env, seed_list, [HORIZON], backend=be, keep_kv_usage=False)
        t3 = time.perf_counter()
        overhead = float("nan")
        if backend == "ray":
            import ray

            @ray.remote(num_cpus=1)
            def nothing() -> int:
                return 0

            ray.get([nothing.remote() for _ in range(50)])
            t4 = time.perf_counter()
            ray.get([nothing.remote() for _ in range(500)])
            overhead = (time.perf_counter() - t4) / 500
    startup = (t1 - t0) + (t2 - t1)
    print(f"{backend:8s} grid {t3 - t2:7.2f} s  (start-up {startup:5.2f} s"
          + (f", Ray per-task overhead {overhead * 1e3:.2f} ms" if backend == "ray" else "") + ")", flush=True)
    return t3 - t2, startup, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=at_least(1), default=2)
    ap.add_argument("--seeds", type=at_least(1), default=12)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    n = len(B_VALUES) * args.seeds
    print(f"grid: flow control b in {B_VALUES} x {args.seeds} seeds = {n} episodes of T = {HORIZON} slots "
          f"(paper-synthetic-unknown, lambda = 3.5); {args.workers} workers")
    serial, _, ref = run("serial", 1, args.seeds)
    print(f"         {serial / n:.2f} s per episode (serial)")
    backends = ["process"] + ([] if args.no_ray or importlib.util.find_spec("ray") is None else ["ray"])
    for b in backends:
        wall, _, table = run(b, args.workers, args.seeds)
        same = table.rows == ref.rows  # type: ignore[attr-defined]
        print(f"         {b}: {serial / wall:.2f}x serial, tables {'identical' if same else 'DIFFER'}")
        if not same:
            raise SystemExit(f"{b} backend's table differs from the serial one")


if __name__ == "__main__":
    main()
