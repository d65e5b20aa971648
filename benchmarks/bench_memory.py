"""Memory of long runs: RSS growth from 100k to 1M slots, ``record="stream"`` against ``record="full"``.

Runs FlowControl-v0 at its default load (the paper's three classes at ``lambda = 3.5`` per
class, ``rho = 0.86``, ``M = 16492``, unknown output lengths) with a fixed budget
``B_t = 12`` for ``--slots`` slots (default 1,000,000), once per record mode, each in a fresh
process. Prints the resident set size (``VmRSS`` of ``/proc/self/status``) after 100k slots
and at the end, its growth between them, the engine's own arrays (``Engine.memory_bytes``),
the wall time of the run and of ``metrics()``, and checks that both modes give the same
metrics (counts and sums exactly; float means to 1e-12 relative; ``p95_latency`` exactly,
as latencies in slots below 65,536 are counted exactly by the sketch).

    python benchmarks/bench_memory.py [--slots 1000000] [--budget 12]

Goal (issue: hardening): RSS growth from 100k to 1M slots <= 50 MB in streaming mode.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

from _args import at_least

RUN = r"""
import sys, time
import numpy as np
from flowgym.envs.flow_control import FlowControlEnv
from flowgym.sim import _json

def rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")

record, slots, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
env = FlowControlEnv(horizon=slots, record=record)
env.reset(seed=0)
mark = 100_000
t0 = time.perf_counter()
for i in range(slots):
    env.step(budget)
    if i + 1 == mark:
        rss_100k, eng_100k = rss_mb(), env.engine.memory_bytes() / 2**20
wall = time.perf_counter() - t0
rss_end, eng_end = rss_mb(), env.engine.memory_bytes() / 2**20
t1 = time.perf_counter()
m = env.metrics()
wall_m = time.perf_counter() - t1
m = {k: v for k, v in m.items() if not isinstance(v, np.ndarray)}
print(_json.dumps({"record": record, "rss_100k": rss_100k, "rss_end": rss_end, "engine_100k": eng_100k,
                   "engine_end": eng_end, "wall": wall, "wall_metrics": wall_m, "metrics": m}))
"""

COUNTS = ("T", "completed", "arrived", "rejected", "unfinished", "evictions", "overflow_events", "wasted_tokens")


def run(record: str, slots: int, budget: int) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, record, str(slots), str(budget)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the record={record!r} run failed:\n{out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=at_least(200_000), default=1_000_000,
                    help="slots per run (at least 200,000: the growth is measured from slot 100,000)")
    ap.add_argument("--budget", type=at_least(0), default=12)
    args = ap.parse_args()
    res = {rec: run(rec, args.slots, args.budget) for rec in ("stream", "full")}
    print(f"FlowControl-v0 default load (rho = 0.86), B_t = {args.budget}, {args.slots:,} slots")
    print(f"{'record':<8} {'RSS@100k MB':>12} {'RSS@end MB':>11} {'growth MB':>10} {'engine@100k MB':>15} "
          f"{'engine@end MB':>14} {'run s':>7} {'metrics() s':>12}")
    for rec, r in res.items():
        print(f"{rec:<8} {r['rss_100k']:>12.1f} {r['rss_end']:>11.1f} {r['rss_end'] - r['rss_100k']:>10.1f} "
              f"{r['engine_100k']:>15.1f} {r['engine_end']:>14.1f} {r['wall']:>7.1f} {r['wall_metrics']:>12.3f}")
    ms, mf = res["stream"]["metrics"], res["full"]["metrics"]
    bad = []
    for k, v in mf.items():
        w = ms[k]
        if k in COUNTS or k == "p95_latency":
            ok = v == w
        elif isinstance(v, float) and math.isnan(v):
            ok = isinstance(w, float) and math.isnan(w)
        else:
            ok = math.isclose(v, w, rel_tol=1e-12, abs_tol=1e-15)
        if not ok:
            bad.append(f"{k}: full {v!r} stream {w!r}")
    print("metrics:", ", ".join(f"{k}={mf[k]:.6g}" for k in ("avg_latency", "p95_latency", "mean_time_in_system",
                                                             "request_throughput", "mean_kv_usage", "completed",
                                                             "evictions")))
    if bad:
        print("MISMATCH between record modes:\n  " + "\n  ".join(bad))
        sys.exit(1)
    print(f"same metrics in both modes ({len(mf)} keys: counts, sums and p95 equal, float means to 1e-12)")
    growth = res["stream"]["rss_end"] - res["stream"]["rss_100k"]
    print(f"streaming RSS growth {growth:.1f} MB: goal <= 50 MB {'met' if growth <= 50 else 'NOT met'}")


if __name__ == "__main__":
    main()
