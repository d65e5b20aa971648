"""Generalist models compared on new draws of their training distribution (model selection).

The protocol that chose the shipped generalist (docs/training.md, "The generalist"): each model
runs one episode on each of ``--draws`` draws of ``RandomMix()`` (seeds ``30000..``, used by no
training run, no in-training evaluation and no report); the figure is the geometric mean of the
time in system (a light draw of 10 slots and an overloaded one of 1,000 weigh alike), and each
model's ratio to the first one with a 95% paired bootstrap interval over the draws, also split into
light draws (the first model's time in system below 50 slots) and heavy ones. Not a timed test;
about a minute per model on one core::

    python benchmarks/select_generalist.py examples/ppo_generalist shipped
    python benchmarks/select_generalist.py shipped runs/ars-generalist --draws 48
    python benchmarks/select_generalist.py shipped runs/rppo1 --draws 48 --memoryless

``shipped`` is the default learned agent (``learned`` with no path). ``--distribution`` overrides
fields of ``RandomMix``: ``'{"trace_p": 0, "phase_scale": "uniform"}'`` gives the draws of the
distribution before 2026-11-26 (no Azure trace pieces, uniform phase lengths), on which the
selections in docs/training.md before ars6 were made. Trace pieces (continuous time, seconds)
are also reported on their own.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from flowgym.agents import LearnedBudget
from flowgym.lab.distributions import RandomMix
from flowgym.lab.evaluation import run_episode
from flowgym.sim import _json

FIRST_SEED = 30_000
LIGHT = 50.0


def time_in_system(model: str, seeds: Sequence[int], dist: RandomMix | None = None,
                   carry_state: bool = True) -> np.ndarray:
    """The model's mean time in system on the draw of each seed (of ``dist``, default ``RandomMix()``);
    ``carry_state=False`` plays a recurrent model from a zero state at every decision."""
    agent = LearnedBudget(None if model == "shipped" else model, carry_state=carry_state)
    dist = dist or RandomMix()
    out = []
    for seed in seeds:
        kw = dist(np.random.default_rng(seed))
        out.append(run_episode(agent, kw, seed, kw.get("horizon")).metrics()["mean_time_in_system"])
    return np.asarray(out, dtype=np.float64)


def geometric_ratio_ci(d: np.ndarray) -> tuple[float, float, float]:
    """The ratio of geometric means ``exp(mean(d))`` of paired log differences ``d`` (one per draw) and its 95%
    paired bootstrap interval (4,000 resamples of the draws, seed 0)."""
    idx = np.random.default_rng(0).integers(0, len(d), size=(4000, len(d)))
    lo, hi = np.exp(np.quantile(d[idx].mean(axis=1), [0.025, 0.975]))
    return float(np.exp(d.mean())), float(lo), float(hi)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="model directories, or 'shipped'; ratios are to the first")
    ap.add_argument("--draws", type=int, default=48, help="draws (seeds 30000..; default 48)")
    ap.add_argument("--distribution", default="{}",
                    help='JSON overrides of RandomMix fields, e.g. \'{"trace_p": 0, "phase_scale": "uniform"}\'')
    ap.add_argument("--memoryless", action="store_true",
                    help="also play each recurrent model (an LSTM, or an --algo ars model with --memory) with its "
                    "state zeroed before every decision (the row '<model> (state zeroed)'): what its memory is worth")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this script's folder (imported as a module too)
    from _args import model_dir

    if args.draws < 2:
        ap.error("--draws must be at least 2")
    for m in args.models:  # every model checked before the first one's draws run
        model_dir(ap, "models", m)
    try:
        over = _json.loads(args.distribution)  # a key given twice is refused (a ValueError)
        if not isinstance(over, dict):
            raise ValueError(f"expected a JSON object of RandomMix fields, got {args.distribution!r}")
        dist = RandomMix.from_spec(over)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        ap.error(f"--distribution: {e}")
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.draws))
    piece = np.array([dist(np.random.default_rng(s))["workload"]["kind"] == "azure" for s in seeds])
    logs = {m: np.log(time_in_system(m, seeds, dist)) for m in args.models}
    if args.memoryless:
        for m in args.models:
            if m != "shipped" and LearnedBudget(m).recurrent:
                logs[f"{m} (state zeroed)"] = np.log(time_in_system(m, seeds, dist, carry_state=False))
    base = logs[args.models[0]]
    light = (base < np.log(LIGHT)) & ~piece
    shown = ", ".join(f"{k}={v!r}" for k, v in over.items())
    print(f"{args.draws} draws of RandomMix({shown}) (seeds {seeds[0]}-{seeds[-1]}); "
          f"{int(light.sum())} light (time in system of {args.models[0]} below {LIGHT:g} slots), "
          f"{int(piece.sum())} Azure trace pieces (seconds), the other {int((~light & ~piece).sum())} heavy")
    for m, v in logs.items():
        d = v - base
        r, lo, hi = geometric_ratio_ci(d)
        heavy = ~light & ~piece
        split = "".join(f", {name} {np.exp(d[sel].mean()):.3f}" for name, sel in
                        (("light", light), ("heavy", heavy), ("pieces", piece)) if sel.any())
        print(f"{m}: geometric mean {np.exp(v.mean()):.2f}; / {args.models[0]} {r:.3f} "
              f"[{lo:.3f}, {hi:.3f}]{split}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
