"""Online policies against the hindsight optimum (integer program, SciPy's HiGHS).

Reproduces, at the scale an open solver proves in seconds, the synthetic test of
Jaillet et al. (2025) and the hindsight comparison of Dong & Cao's Appendix B.
Every optimum is replayed in the simulator (finish slots and ``U_t <= M`` checked)
before it is used.

Parts (``--part``):

* ``offline``: Jaillet et al.'s instances: ``M ~ U[30, 50]``, one prompt size
  ``s ~ U{1..5}``, ``n ~ U{n_lo..n_hi}`` requests (``--n``, theirs is 40:60) with
  ``o_i ~ U{1..M-s}``, all arriving at slot 0. Minimum total latency.
* ``online``: the same lengths with Poisson arrivals at load ``--load``
  (``rate = load * M / E[w]``, ``w = s o + o (o + 1) / 2``).
* ``appendix-b``: the paper's three classes scaled down to ``(1, 2), (1, 4), (1, 6)``
  with ``M = 187`` (so Algorithm 1's ``b = (4, 4, 4)`` peaks at ``184 <= M``, the
  paper's ``16240 <= 16492``), Poisson ``--rate`` per class per slot for
  ``--span`` slots; *hindsight1* (minimum maximum latency, then minimum total
  latency at that maximum), *hindsight2* (minimum total latency) and the most
  completions by ``T = span``.

For each agent: the ratio of its total latency to the optimum's, mean and worst
over the instances *proven optimal*; on instances the time limit stopped, the
ratio is only known to lie between agent/best-found and agent/bound, and is
reported separately. Flow control (Algorithm 2) and the alpha-greedy are tuned
on each instance in hindsight (best of their grid), which favours them.

    python benchmarks/hindsight_jaillet.py --part offline --instances 25 --n 8:12 --time-limit 20
    python benchmarks/hindsight_jaillet.py --part offline --instances 3 --n 40:60 --time-limit 30
    python benchmarks/hindsight_jaillet.py --part online --instances 15 --n 10:15 --load 0.8 --time-limit 20
    python benchmarks/hindsight_jaillet.py --part appendix-b --instances 2 --rate 3.5 --span 6 --time-limit 20
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import numpy as np
from _args import at_least, positive_float, writable_file

from flowgym.lab.hindsight import run_agent_on_trace, solve_hindsight
from flowgym.lab.reproduce import APPB_M
from flowgym.lab.reproduce import appb_instance as reproduce_appb_instance
from flowgym.lab.scenarios import ALPHA_GRID
from flowgym.sim import _json

AGENTS = ["mc-sf", "mc", "a-min", "greedy-lifo"]
B_GRID_SMALL = [1, 2, 3, 4, 6, 8]


def jaillet_instance(rng: np.random.Generator, n_lo: int, n_hi: int, load: float | None) -> dict[str, Any]:
    M = int(rng.integers(30, 51))
    s = int(rng.integers(1, 6))
    n = int(rng.integers(n_lo, n_hi + 1))
    o = rng.integers(1, M - s + 1, size=n)
    l = np.full(n, s)
    if load is None:
        a = np.zeros(n, dtype=np.int64)
    else:
        rate = load * M / float((l * o + o * (o + 1) / 2).mean())
        a = np.floor(np.cumsum(rng.exponential(1.0 / rate, n))).astype(np.int64)
    return {"a": a, "l": l, "o": o, "M": M, "cls": None, "desc": f"n={n} M={M} s={s}"}


def appb_instance(rng: np.random.Generator, rate: float, span: int) -> dict[str, Any]:
    """flowgym reproduce's Appendix-B instance, with the cache size and a description."""
    inst = reproduce_appb_instance(rng, rate, span)
    return {**inst, "M": APPB_M, "desc": f"n={inst['a'].size} span={span}"}


def tuned(name: str, param: str, grid: list[Any], inst: dict[str, Any]) -> dict[str, Any]:
    """Best total latency over the grid (runs that never finish the trace are skipped)."""
    best = None
    for v in grid:
        run = run_agent_on_trace(f"{name}:{param}={v}", inst["a"], inst["l"], inst["o"], inst["M"], cls=inst["cls"])
        if np.isfinite(run["total_latency"]) and (best is None or run["total_latency"] < best["total_latency"]):
            best = run
    if best is None:
        best = {"total_latency": math.nan, "max_latency": math.nan, "avg_latency": math.nan, "p95_latency": math.nan,
                "finish": np.full(inst["a"].size, -1), "evictions": -1}
    best["label"] = f"{name} (tuned on the instance)"
    return best


def agent_runs(inst: dict[str, Any], appb: bool) -> list[dict[str, Any]]:
    runs = []
    if appb:
        runs.append(run_agent_on_trace("flow-control:b=[4,4,4]", inst["a"], inst["l"], inst["o"], inst["M"],
                                       cls=inst["cls"], label="flow-control Alg. 1 b=(4,4,4)"))
        runs.append(run_agent_on_trace("flow-control:b=12", inst["a"], inst["l"], inst["o"], inst["M"],
                                       label="flow-control Alg. 2 b=12"))
    for name in AGENTS:
        runs.append(run_agent_on_trace(name, inst["a"], inst["l"], inst["o"], inst["M"], cls=inst["cls"]))
    if not appb:
        runs.append(tuned("flow-control", "b", B_GRID_SMALL, inst))
    runs.append(tuned("alpha-greedy", "alpha", ALPHA_GRID, inst))
    return runs


def solve(inst: dict[str, Any], objective: str, T: int | None, time_limit: float) -> Any:
    r = solve_hindsight(inst["a"], inst["l"], inst["o"], inst["M"], objective=objective, horizon=T,
                        time_limit=time_limit)
    r.replay()  # raises if the program and the simulator disagree
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["offline", "online", "appendix-b"], default="offline")
    ap.add_argument("--instances", type=at_least(1), default=10)
    ap.add_argument("--n", default="8:12", help="request count range lo:hi, both included (Jaillet et al.: 40:60)")
    ap.add_argument("--load", type=positive_float, default=0.8, help="online: load rho of the Poisson arrivals")
    ap.add_argument("--rate", type=positive_float, default=3.5, help="appendix-b: arrivals per class per slot")
    ap.add_argument("--span", type=at_least(1), default=6,
                    help="appendix-b: slots with arrivals (and T of the throughput objective)")
    ap.add_argument("--time-limit", type=positive_float, default=20.0, help="seconds per integer program")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--json", default=None, help="write every instance's numbers here")
    args = ap.parse_args()
    try:
        n_lo, n_hi = (int(x) for x in args.n.split(":"))
    except ValueError:
        ap.error(f"argument --n: must be lo:hi, two integers, got {args.n!r}")
    if not 1 <= n_lo <= n_hi:
        ap.error(f"argument --n: must be lo:hi with 1 <= lo <= hi, got {args.n!r}")
    writable_file(ap, "--json", args.json)  # before hours of solving, not after
    rng = np.random.default_rng(args.seed)
    appb = args.part == "appendix-b"
    t_start = time.perf_counter()
    records = []
    for i in range(args.instances):
        if appb:
            inst = appb_instance(rng, args.rate, args.span)
        else:
            inst = jaillet_instance(rng, n_lo, n_hi, args.load if args.part == "online" else None)
        rec: dict[str, Any] = {"instance": i, "desc": inst["desc"], "n": int(inst["a"].size), "M": inst["M"]}
        opt = solve(inst, "total_latency", None, args.time_limit)
        rec["opt"] = {"value": opt.value, "bound": opt.bound, "optimal": opt.optimal, "status": opt.status,
                      "horizon_exact": opt.horizon_exact, "seconds": opt.solve_seconds, "heuristic": opt.heuristic,
                      "avg_latency": opt.avg_latency, "max_latency": opt.max_latency,
                      "p95_latency": float(np.percentile(opt.latency, 95))}
        if appb:
            h1 = solve(inst, "max_latency", None, args.time_limit)
            thr = solve(inst, "completed", args.span, args.time_limit)
            rec["hindsight1"] = {"value": h1.value, "bound": h1.bound, "optimal": h1.optimal, "status": h1.status,
                                 "refine": h1.refine_status, "avg_latency": h1.avg_latency,
                                 "p95_latency": float(np.percentile(h1.latency, 95)), "seconds": h1.solve_seconds}
            rec["throughput"] = {"value": thr.value, "bound": thr.bound, "optimal": thr.optimal, "status": thr.status,
                                 "seconds": thr.solve_seconds}
        rec["agents"] = {}
        for run in agent_runs(inst, appb):
            fin = np.asarray(run["finish"])
            row = {k: run[k] for k in ("total_latency", "avg_latency", "p95_latency", "max_latency", "evictions")}
            row["ratio"] = run["total_latency"] / opt.value
            row["ratio_max"] = run["total_latency"] / opt.bound
            if appb:
                row["ratio_tail"] = run["max_latency"] / h1.value
                row["completed_by_T"] = int(((fin >= 0) & (fin <= args.span)).sum())
            rec["agents"][run["label"]] = row
        records.append(rec)
        mcsf = rec["agents"]["mc-sf"]["ratio"]
        print(f"[{i + 1}/{args.instances}] {inst['desc']}: {opt.status}, opt {opt.value:g} (bound {opt.bound:g}, "
              f"{opt.solve_seconds:.1f} s), MC-SF/opt {mcsf:.4f}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start
    report(records, args, wall)
    if args.json:
        with open(args.json, "w") as fh:
            _json.dump({"args": vars(args), "wall_seconds": wall, "records": records}, fh, indent=1)
    return 0


def report(records: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> None:
    n_opt = sum(r["opt"]["optimal"] for r in records)
    n_exact = sum(r["opt"]["optimal"] and r["opt"]["horizon_exact"] for r in records)
    print(f"part {args.part}: {len(records)} instances, time limit {args.time_limit:g} s per program, seed {args.seed}, "
          f"wall {wall:.0f} s")
    print(f"minimum total latency proven optimal on {n_opt}/{len(records)} instances "
          f"({n_exact} of them with a horizon proven not to bind); "
          f"mean solve {np.mean([r['opt']['seconds'] for r in records]):.1f} s")
    gaps = [(r["opt"]["value"] - r["opt"]["bound"]) / r["opt"]["value"] for r in records if not r["opt"]["optimal"]]
    if gaps:
        print(f"  unproven instances: gap mean {100 * np.mean(gaps):.1f}%, max {100 * np.max(gaps):.1f}%")
    labels = list(records[0]["agents"])
    print()
    print("| agent | total latency / optimum, proven instances: mean | worst | n | unproven instances: mean ratio in | failed |")
    print("|---|---|---|---|---|---|")
    for lab in labels:
        pr = [r["agents"][lab]["ratio"] for r in records if r["opt"]["optimal"]]
        ok = [x for x in pr if np.isfinite(x)]
        un_lo = [r["agents"][lab]["ratio"] for r in records if not r["opt"]["optimal"]]
        un_hi = [r["agents"][lab]["ratio_max"] for r in records if not r["opt"]["optimal"]]
        un_ok = [(lo, hi) for lo, hi in zip(un_lo, un_hi) if np.isfinite(lo)]
        failed = sum(not np.isfinite(r["agents"][lab]["total_latency"]) for r in records)
        mean = f"{np.mean(ok):.4f}" if ok else "-"
        worst = f"{np.max(ok):.4f}" if ok else "-"
        un = (f"[{np.mean([x[0] for x in un_ok]):.3f}, {np.mean([x[1] for x in un_ok]):.3f}]" if un_ok else "-")
        print(f"| {lab} | {mean} | {worst} | {len(ok)} | {un} | {failed} |")
    if args.part == "appendix-b":
        print()
        print("Means over instances (latencies in slots; done by T = requests finished by the end of arrivals):")
        print("| schedule | avg latency | p95 latency | max latency | done by T |")
        print("|---|---|---|---|---|")
        h2 = [r["opt"] for r in records]
        h1 = [r["hindsight1"] for r in records]
        th = [r["throughput"] for r in records]
        print(f"| hindsight2 (min total latency) | {np.mean([x['avg_latency'] for x in h2]):.2f} | "
              f"{np.mean([x['p95_latency'] for x in h2]):.2f} | {np.mean([x['max_latency'] for x in h2]):.2f} | |")
        print(f"| hindsight1 (min max latency) | {np.mean([x['avg_latency'] for x in h1]):.2f} | "
              f"{np.mean([x['p95_latency'] for x in h1]):.2f} | {np.mean([x['value'] for x in h1]):.2f} | |")
        print(f"| max completions by T | | | | {np.mean([x['value'] for x in th]):.1f} |")
        for lab in labels:
            rows = [r["agents"][lab] for r in records]
            def m(k: str, rows: list[dict[str, Any]] = rows) -> str:
                v = [x[k] for x in rows if np.isfinite(x[k])]
                return f"{np.mean(v):.2f}" if len(v) == len(rows) else "-"
            print(f"| {lab} | {m('avg_latency')} | {m('p95_latency')} | {m('max_latency')} | "
                  f"{np.mean([x['completed_by_T'] for x in rows]):.1f} |")
        print()
        print("statuses: " + "; ".join(
            f"#{r['instance']}: h2 {r['opt']['status']}, h1 {r['hindsight1']['status']} "
            f"(refine {r['hindsight1']['refine']}), T {r['throughput']['status']}" for r in records))


if __name__ == "__main__":
    sys.exit(main())
