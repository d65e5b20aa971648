"""The generalist tuned per scenario, against the rate-switch tuned per scenario (docs/training.md, "The
generalist tuned per scenario").

The issue's goal is zero-shot: one model against a three-number rule tuned on each scenario. This asks the
question the other way round, with both sides tuned: starting from the shipped generalist, a short random
search (``flowgym.lab.ars.train_ars``, the generalist's code path) on one scenario's own workload, on its own
training seeds (``40000..``) and selection seeds (``20000..``), none of them a report, tuning or screening
seed. Its budget of episodes is set near the rate-switch's (the benchmark's coordinate search: two rounds
over ``low``, ``high`` and the threshold on the tuning seeds 1000-1001). If the tuned policy beats the tuned
rate-switch where the zero-shot one loses, the zero-shot loss is the price of not knowing the scenario;
if it loses there too, the policy's action is the limit.

Then every scenario's tuned model, the shipped generalist, the tuned rate-switch and the best fixed budget
(both from ``bench_learned.py --out``'s JSON) run on the report seeds 0-19; ratios of means with a 95%
paired bootstrap interval::

    python benchmarks/learned_experiments/per_scenario.py --rate-switch results/bench_learned.json \\
        --out runs/per-scenario [--scenarios H4-short-phases,H8-overload-then-light] [--iterations 12]
    python benchmarks/learned_experiments/per_scenario.py --out runs/per-scenario --cosines

Models already in ``--out`` are not searched again (delete one to redo it; one searched with other settings is
refused), and ``--out``'s ``report.json`` keeps the rows of earlier runs into it, each scenario's replaced by a new one. ``--cosines`` prints instead the
cosine between every two scenarios' weight changes (tuned minus the generalist's weights): changes that point
opposite ways are what one zero-shot policy cannot make at once without telling the loads apart.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_learned import _fmt, ratio_ci, scenario_arguments  # noqa: E402

from flowgym.agents.learned import ARRAYS_FILE, DEFAULT_MODEL, META_FILE  # noqa: E402
from flowgym.lab.ars import ARSConfig, train_ars  # noqa: E402
from flowgym.lab.evaluation import evaluate  # noqa: E402
from flowgym.lab.scenarios import AgentSpec  # noqa: E402

#: The search's settings that a model already in ``--out`` must share to be reused.
BUDGET = ("iterations", "directions", "draws", "eval_every", "eval_episodes")


class _Fixed:
    """A distribution that is always one scenario's arguments (its seeds vary the arrivals); picklable. The
    model's ``flowgym_agent.json`` records it under ``trained_on`` (its ``scenario`` field stays the
    generalist's ``adaptive-mix``, whose agent options the generalist was trained with)."""

    def __init__(self, name: str, kw: dict[str, Any]) -> None:
        self.name, self.kw = name, kw

    def __call__(self, rng: np.random.Generator) -> dict[str, Any]:
        return copy.deepcopy(self.kw)

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "fixed", "scenario": self.name, "arguments": "the scenario's tuning arguments"}


def _budget(args: argparse.Namespace, finite: bool) -> dict[str, int]:
    """The search's settings (a finite trace is one episode whatever the seed: one draw, one evaluation)."""
    b = {k: int(getattr(args, k)) for k in BUDGET}
    if finite:
        b.update(draws=1, eval_episodes=1)
    return b


def tune_model(name: str, out: str, budget: dict[str, int], workers: int) -> float:
    """Search from the shipped generalist on scenario ``name``'s tuning arguments; the wall seconds."""
    _, kw, _, _ = scenario_arguments(name)
    t0 = time.perf_counter()
    train_ars(ARSConfig(distribution=_Fixed(name, kw), init="shipped", workers=workers, final_eval_seeds=0,
                        out=out, progress=False, **budget))
    return time.perf_counter() - t0


def report(name: str, model: str, refs: dict[str, Any], seeds: list[int], backend: str) -> dict[str, Any]:
    """Mean time in system of the tuned model and the references on the report seeds, and the ratios."""
    kw, _, H, finite = scenario_arguments(name)
    specs = [AgentSpec("learned", {"path": model}, label="tuned here"),
             AgentSpec("learned", {}, label="generalist"),
             AgentSpec("rate-switch", refs["rate_switch"], label="rate-switch (tuned)"),
             AgentSpec("flow-control", {"b": refs["fixed_b"]}, label="best fixed")]
    table = evaluate(specs, kw, seeds[:1] if finite else seeds, None if H is None else [H], backend=backend)
    per = {lab: np.array([r["mean_time_in_system"] for r in table.rows if r["agent"] == lab]) for lab in table.agents}
    return {"scenario": name,
            "mean_time_in_system": {k: float(v.mean()) for k, v in per.items()},
            "tuned / rate-switch": ratio_ci(per["tuned here"], per["rate-switch (tuned)"]),
            "tuned / generalist": ratio_ci(per["tuned here"], per["generalist"]),
            "tuned / best fixed": ratio_ci(per["tuned here"], per["best fixed"]),
            "generalist / rate-switch": ratio_ci(per["generalist"], per["rate-switch (tuned)"])}


def cosines(out: str) -> list[str]:
    """The cosine between the weight changes of every two tuned models in ``out`` (those that moved)."""
    def flat(path: str) -> np.ndarray:
        with np.load(os.path.join(path, ARRAYS_FILE), allow_pickle=False) as z:
            return np.concatenate([z[k].ravel() for k in sorted(z.files)])

    base = flat(DEFAULT_MODEL)
    moved = {}
    for name in sorted(os.listdir(out)):
        if os.path.exists(os.path.join(out, name, ARRAYS_FILE)):
            d = flat(os.path.join(out, name)) - base
            if np.linalg.norm(d) > 0:
                moved[name] = d / np.linalg.norm(d)
    names = list(moved)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for a in names:
        lines.append(f"| {a} | " + " | ".join(f"{moved[a] @ moved[b]:.2f}" for b in names) + " |")
    lines.append(f"(two unrelated directions in {base.size} weights: cosines of about +-{1 / np.sqrt(base.size):.2f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-switch", help="bench_learned.py's JSON (tuned rate-switch, best fixed; not with --cosines)")
    ap.add_argument("--out", required=True, help="directory of the tuned models and report.json")
    ap.add_argument("--scenarios", default="", help="comma-separated (default: every scenario of the JSON)")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--directions", type=int, default=8)
    ap.add_argument("--draws", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=20, help="report seeds 0..N-1")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cosines", action="store_true", help="print the cosines of the weight changes in --out, then stop")
    args = ap.parse_args(argv)
    if args.cosines:
        print("\n".join(cosines(args.out)))
        return 0
    if not args.rate_switch:
        ap.error("--rate-switch is needed (bench_learned.py --out's JSON)")
    with open(args.rate_switch) as fh:
        refs = {r["scenario"]: r for r in json.load(fh)}
    names = [n for n in args.scenarios.split(",") if n] or list(refs)
    unknown = [n for n in names if n not in refs]
    if unknown:
        ap.error(f"--scenarios: {', '.join(unknown)} not in {args.rate_switch} (it has {', '.join(refs)})")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "report.json")
    kept: dict[str, Any] = {}  # the rows of earlier runs into --out, replaced scenario by scenario
    if os.path.exists(path):
        with open(path) as fh:
            kept = {r["scenario"]: r for r in json.load(fh)}
    rows = []
    for name in names:
        model = os.path.join(args.out, name)
        budget = _budget(args, scenario_arguments(name)[3])
        wall = None
        if not os.path.exists(os.path.join(model, ARRAYS_FILE)):
            wall = tune_model(name, model, budget, args.workers)
        with open(os.path.join(model, META_FILE)) as fh:
            meta = json.load(fh)
        had = {k: meta["hyperparameters"].get(k) for k in BUDGET}
        if had != budget:
            ap.error(f"{model} was searched with {had}, not {budget}: delete it or give its settings")
        row = report(name, model, refs[name], list(range(args.seeds)), "process" if args.workers > 1 else "serial")
        row.update({"search_seconds": wall, "kept_update": meta.get("best_iteration"), "budget": budget,
                    "episodes": meta.get("episodes")})
        rows.append(row)
        print(f"{name}: tuned / rate-switch {_fmt(row['tuned / rate-switch'])}, / generalist "
              f"{_fmt(row['tuned / generalist'])}, / best fixed {_fmt(row['tuned / best fixed'])}; generalist "
              f"/ rate-switch {_fmt(row['generalist / rate-switch'])}"
              + ("" if wall is None else f" (search {wall:.0f} s)"), flush=True)
        kept[name] = row
        with open(path, "w") as fh:
            json.dump(list(kept.values()), fh, indent=1)
    gm = {k: float(np.exp(np.mean([np.log(r[k][0]) for r in rows])))
          for k in ("tuned / rate-switch", "tuned / generalist", "tuned / best fixed", "generalist / rate-switch")}
    print(f"geometric means over the {len(rows)} scenarios of this run ({len(kept)} in {path}): "
          + ", ".join(f"{k} {v:.3f}" for k, v in gm.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
