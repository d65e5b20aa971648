"""Learned budget (PPO) against the best fixed budget and the greedy baselines, per adaptive scenario.

For each scenario it loads (or, with ``--train``, first trains) the model directory
``<models>/ppo-<scenario>`` written by ``flowgym train``, then on held-out seeds
(reports ``0..N-1``; training used 10,000.., evaluation during training 20,000..):

* tunes the fixed budget (flow control, Algorithm 2, ``b`` over the scenario's grid)
  and alpha-greedy on tuning seeds 1000.. (lowest mean time in system), as
  ``flowgym compare`` does;
* also finds the fixed budget that is best *on the report seeds themselves*
  (``--oracle``; a hindsight choice no deployable fixed budget can beat);
* runs the learned agent, the tuned fixed budget, every greedy baseline (alpha-greedy,
  MC, A_min, greedy-LIFO) through :func:`flowgym.lab.evaluation.evaluate`;
* prints and writes (``--out``) a Markdown table of average and p95 latency, mean time
  in system, request and token throughput and evictions, the learned agent's latency
  relative to the best fixed budget with the issue's goal (within 2% on stationary
  load, at least 10% better on non-stationary load) marked met or missed, and the
  training wall time and environment steps per second read from the model directory;
* copies each model's ``curves.png`` to ``--figures`` as ``learned_<scenario>.png``.

The Azure scenario is one trace replay (the same for every seed), so it has one report run.
Not a timed test: run it by hand, e.g. ::

    python benchmarks/bench_learned.py --models runs --seeds 5 --out results/bench_learned \\
        --figures docs/figures
    python benchmarks/bench_learned.py --train --total-timesteps 1500000   # train missing models first
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS, get_scenario

#: Stationary scenarios (goal: within 2% of the best fixed budget's average latency).
STATIONARY = ("adaptive-low", "adaptive-high")
COLUMNS = ("avg_latency", "p95_latency", "mean_time_in_system", "request_throughput", "token_throughput",
           "evictions")


def _oracle_fixed(sc: Any, seeds: list[int], horizons: Any) -> tuple[Any, dict[str, Any]]:
    """The fixed budget of the scenario's grid with the lowest mean time in system on the report seeds."""
    from flowgym.lab.evaluation import tune

    spec = sc.agents[0]
    best, rows = tune(spec, sc.env_kwargs(), seeds, None if horizons is None else horizons[0])
    return best, {r["value"]: r["mean_time_in_system"] for r in rows}


def bench_scenario(name: str, model_dir: str, seeds: list[int], tune_seeds: list[int],
                   oracle: bool) -> dict[str, Any]:
    """Evaluate one scenario's model against its baselines; the summary rows and the goal check."""
    from flowgym.lab.evaluation import evaluate
    from flowgym.lab.scenarios import AgentSpec
    from flowgym.lab.train import final_evaluation

    sc = get_scenario(name)
    report = [seeds[0]] if sc.finite else seeds  # a trace replay is the same for every seed
    tune_seeds = tune_seeds[:1] if sc.finite else tune_seeds
    t0 = time.perf_counter()
    table = final_evaluation(model_dir, scenario=name, seeds=report, tune_seeds=tune_seeds, write=False)
    summary = {r["agent"]: r for r in table.summary()}
    learned = table.agents[0]
    fixed = next(a for a in table.agents if a.startswith("flow-control"))
    out: dict[str, Any] = {"scenario": name, "description": sc.description, "seeds": report,
                           "tune_seeds": tune_seeds, "learned": learned, "fixed": fixed,
                           "rows": [{"agent": a, **{k: summary[a][k] for k in COLUMNS},
                                     **{k + "_ci": summary[a][k + "_ci"] for k in COLUMNS}} for a in table.agents]}
    if oracle:
        horizons = None if sc.finite else table.horizons
        b, grid = _oracle_fixed(sc, report, horizons)
        t2 = evaluate([AgentSpec("flow-control", {"b": b}, label=f"fixed b={b} (best on report seeds)")],
                      sc.env_kwargs(), report, horizons)
        r = t2.summary()[0]
        out["rows"].append({"agent": r["agent"], **{k: r[k] for k in COLUMNS}, **{k + "_ci": r[k + "_ci"] for k in COLUMNS}})
        out["oracle_b"], out["oracle_grid"] = b, grid
    lr = summary[learned]
    fr = summary[fixed]
    out["latency_ratio"] = lr["avg_latency"] / fr["avg_latency"]
    out["time_in_system_ratio"] = lr["mean_time_in_system"] / fr["mean_time_in_system"]
    if name in STATIONARY:
        out["goal"] = "within 2% of best fixed avg latency"
        out["goal_met"] = bool(out["latency_ratio"] <= 1.02)
    else:
        out["goal"] = "avg latency >= 10% below best fixed"
        out["goal_met"] = bool(out["latency_ratio"] <= 0.90)
    meta = json.load(open(os.path.join(model_dir, "flowgym_agent.json")))
    out["train_wall_seconds"] = meta.get("wall_seconds")
    out["train_timesteps"] = meta.get("timesteps")
    out["train_steps_per_second"] = meta.get("steps_per_second")
    out["train_slots_per_second"] = meta.get("env_slots_per_second")
    out["action_repeat"] = meta.get("action_repeat", 1)
    out["action_rule"] = meta.get("action_rule", "mode")
    out["selected"] = meta.get("selected")
    out["bench_seconds"] = time.perf_counter() - t0
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    """The results as Markdown: one table per scenario, then the summary of goals and training cost."""
    lines = []
    for res in results:
        lines.append(f"### {res['scenario']}\n")
        lines.append(f"{res['description']} Report seeds {res['seeds']}, baselines tuned on {res['tune_seeds']}.\n")
        lines.append("| agent | avg latency | p95 latency | mean time in system | requests/unit | tokens/unit | evictions |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for r in res["rows"]:
            cells = []
            for k in COLUMNS:
                ci = r.get(k + "_ci")
                cells.append(f"{r[k]:.4g}" + (f" ± {ci:.2g}" if ci == ci and ci is not None else ""))
            lines.append(f"| {r['agent']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("### Goals and training cost\n")
    lines.append("| scenario | learned / best fixed, avg latency | mean time in system | goal | met | "
                 "decisions (slots) | train wall s | decisions/s (slots/s) |")
    lines.append("|---|---:|---:|---|---|---:|---:|---:|")
    for res in results:
        lines.append(f"| {res['scenario']} | {res['latency_ratio']:.3f} | {res['time_in_system_ratio']:.3f} | "
                     f"{res['goal']} | {'yes' if res['goal_met'] else 'no'} | "
                     f"{res['train_timesteps']} ({res['train_timesteps'] * res['action_repeat']}) | "
                     f"{res['train_wall_seconds']:.0f} | {res['train_steps_per_second']:.0f} "
                     f"({res['train_steps_per_second'] * res['action_repeat']:.0f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(ADAPTIVE_SCENARIOS), help="comma-separated (default: all six)")
    ap.add_argument("--models", default="runs", help="folder holding ppo-<scenario>/ model directories (default runs)")
    ap.add_argument("--model", action="append", default=[], metavar="SCENARIO=DIR",
                    help="use DIR for SCENARIO instead of <models>/ppo-<scenario> (repeatable)")
    ap.add_argument("--seeds", type=int, default=5, help="report seeds 0..N-1 (default 5)")
    ap.add_argument("--tune-seeds", type=int, default=2, help="tuning seeds 1000.. (default 2)")
    ap.add_argument("--no-oracle", dest="oracle", action="store_false",
                    help="skip the fixed budget tuned on the report seeds themselves")
    ap.add_argument("--train", action="store_true", help="train the missing models first (flowgym train defaults)")
    ap.add_argument("--total-timesteps", type=int, default=None, help="with --train: steps per scenario")
    ap.add_argument("--out", default="results/bench_learned", help="writes <out>.md and <out>.json")
    ap.add_argument("--figures", default=None, help="copy each curves.png here as learned_<scenario>.png")
    args = ap.parse_args(argv)

    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    chosen = dict(m.split("=", 1) for m in args.model)
    results = []
    for name in names:
        model_dir = chosen.get(name, os.path.join(args.models, f"ppo-{name}"))
        if not os.path.exists(os.path.join(model_dir, "model.zip")):
            if not args.train:
                print(f"skip {name}: no model in {model_dir} (train it: flowgym train --scenario {name} "
                      f"--out {model_dir}, or pass --train)", file=sys.stderr)
                continue
            from flowgym.lab.train import train

            kw = {} if args.total_timesteps is None else {"total_timesteps": args.total_timesteps}
            train(scenario=name, out=model_dir, final_eval_seeds=0, **kw)
        print(f"== {name}", file=sys.stderr, flush=True)
        res = bench_scenario(name, model_dir, list(range(args.seeds)), [1000 + i for i in range(args.tune_seeds)],
                             args.oracle)
        results.append(res)
        print(markdown([res]), flush=True)
        if args.figures:
            src = os.path.join(model_dir, "curves.png")
            if os.path.exists(src):
                os.makedirs(args.figures, exist_ok=True)
                shutil.copy(src, os.path.join(args.figures, f"learned_{name}.png"))
    if not results:
        print("nothing to benchmark", file=sys.stderr)
        return 1
    text = markdown(results)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out + ".md", "w") as fh:
            fh.write(text)
        with open(args.out + ".json", "w") as fh:
            json.dump(results, fh, indent=1, default=float)
        print(f"wrote {args.out}.md and {args.out}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
