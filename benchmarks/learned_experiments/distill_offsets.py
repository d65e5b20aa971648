"""Distilled per-draw offsets: how far each training draw wants the generalist moved, learned from its features.

The experiment of docs/training.md, "Per-draw offsets, distilled". The explicit load classifier ("An explicit
load classifier") found that two family experts have little to switch between (each under 1% better on its own
family), while the generalist searched on one scenario gains 3-13% ("The generalist tuned per scenario"). This
script asks the finer question in between: how much a *constant* offset on the shipped generalist's two
log-multipliers, picked per training draw, is worth, and whether a regression on the features can predict it.

* ``labels``: for ``--draws`` draws of ``RandomMix()`` (seeds 87000..; every kind of draw, trace pieces too),
  the shipped generalist plus each offset of a 5 x 5 grid (``STEPS`` on each action, in action units: 0.3 is a
  multiplier about 1.37 times larger) on three episodes of the draw (episode seeds ``s``, ``s + 500000``,
  ``s + 1000000``); and the shipped model's normalised features at every decision point of the first. Written to
  ``--labels`` (npz). About 12 minutes for 96 draws on 2 cores.
* ``fit``: the **ceiling** (each draw's best offset on two episodes, played on the third, against offset 0 on
  it), then a **student**: a ridge regression from the features and their exponential averages over 16 and 64
  decisions (the load classifier's inputs) to each draw's soft-best offset (the grid's offsets weighted by
  ``exp(-(loss - best) / TAU)``), every draw weighing alike. Its worth is read off the grids, cross-validated by
  draws (4 folds): the held-out draw's loss at the grid point nearest the student's mean offset over the
  episode. Prints both for each ridge and each shrink of the student's offset.
* ``scenarios``: the ceiling on the report scenarios instead (their screening seeds 7000-7003: each scenario's
  best grid offset on three seeds, played on the fourth), for comparison with the training draws'.
* ``experts --experts DIR``: a state-dependent label instead of a constant one. The shipped generalist is
  searched on each of the first ``--draws`` labelled draws alone (``per_scenario.py``'s budget: 200 episodes,
  about 20 s a draw on 2 cores), into ``DIR/<seed>``. ``draws`` and ``screen`` with ``--experts DIR`` then fit the
  student, by the same ridge, to each expert's per-decision offset from the shipped model's action at the
  expert's own decision points on its draw.
* ``draws`` / ``screen``: the student (``--ridge``, ``--shrink``; fitted on every labelled draw) as a recurrent
  policy through ``LearnedBudget.from_policy`` (the shipped generalist's action plus the offset, clipped to
  ``[-1, 1]``), against the shipped model on 192 new draws of ``RandomMix()`` (seeds 30000.., as
  ``select_generalist.py``) with 95% paired bootstrap intervals, or on the report scenarios' screening seeds as
  ratios to the tuned rate-switch (``anchors.py screen``).

Commands::

    python benchmarks/learned_experiments/distill_offsets.py labels --labels runs/offsets.npz
    python benchmarks/learned_experiments/distill_offsets.py fit --labels runs/offsets.npz
    python benchmarks/learned_experiments/distill_offsets.py scenarios
    python benchmarks/learned_experiments/distill_offsets.py experts --draws 64 --experts runs/pdx
    python benchmarks/learned_experiments/distill_offsets.py draws --experts runs/pdx --draws 192 --ridge 10
    python benchmarks/learned_experiments/distill_offsets.py screen --experts runs/pdx --ridge 10 --rate-switch FILE
    python benchmarks/learned_experiments/distill_offsets.py draws --labels runs/offsets.npz --ridge 10 --shrink 1
    python benchmarks/learned_experiments/distill_offsets.py screen --labels runs/offsets.npz --ridge 10 \\
        --shrink 1 --rate-switch FILE

Not a timed test.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from anchors import decision_points, scenario, seeds_of, tuned_rate_switch  # noqa: E402
from bench_learned import held_out  # noqa: E402
from load_classifier import LEAKS, averages, carry_averages, gate_inputs, print_screen, ratio_line  # noqa: E402
from replay_tuning import Offset  # noqa: E402

from flowgym.agents import LearnedBudget, make_agent  # noqa: E402
from flowgym.agents.learned import ArrayPolicy  # noqa: E402
from flowgym.lab.distributions import RandomMix  # noqa: E402
from flowgym.lab.evaluation import run_episode  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402

#: The offsets tried on each of the two actions (action units; the action spans [-1, 1]).
STEPS = (-0.6, -0.3, 0.0, 0.3, 0.6)
GRID = np.array([(a, b) for a in STEPS for b in STEPS])
ZERO = int(np.flatnonzero((GRID == 0).all(axis=1))[0])
LABEL_SEED = 87000
EPISODE_SHIFTS = (0, 500000, 1000000)   # a draw's three episodes: seeds s, s + 500000, s + 1000000
TAU = 0.01                              # the soft-best offset's temperature, in log time in system
FOLDS = 4


class OffsetStudent(ArrayPolicy):
    """``a = clip(base(x) + shrink (V [x, z] + d), -1, 1)``: the linear ``base`` policy plus a linear offset of the
    features ``x`` and their exponential averages ``z`` (the policy's state, carried as an LSTM state is)."""

    recurrent = True

    def __init__(self, base: ArrayPolicy, V: np.ndarray, d: np.ndarray, shrink: float) -> None:
        space = base.observation_space
        super().__init__(base.layers, space.low, space.high)
        self.base, self.V, self.d, self.shrink = base, np.asarray(V, np.float64), np.asarray(d, np.float64), shrink
        self.leak = np.repeat(LEAKS, space.shape[0])

    def offset(self, x: np.ndarray, z: np.ndarray) -> np.ndarray:
        """The offset of each row of features ``x`` and their averages ``z``, shape ``(n, 2)``."""
        return self.shrink * (gate_inputs(x, z) @ self.V + self.d)

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[override]
        x = np.asarray(obs, dtype=np.float64)
        z = carry_averages(x, state, episode_start, self.leak)
        return np.clip(self.base(x) + self.offset(x, z), -1.0, 1.0).astype(np.float32), z

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """The actions of a batch of observations, each an episode's first decision."""
        return self.predict(obs)[0].astype(np.float64)

    def arrays(self) -> dict[str, np.ndarray]:
        raise ValueError("OffsetStudent is an experiment's policy: it has no model-directory format")


def offset_agent(delta: np.ndarray) -> Offset:
    """The shipped generalist with the constant offset ``delta`` on its two actions (the replay probe's agent)."""
    return Offset(LearnedBudget(None), delta)


def student_agent(V: np.ndarray, d: np.ndarray, shrink: float) -> LearnedBudget:
    """The shipped generalist with the student's offset."""
    shipped = LearnedBudget(None)
    return LearnedBudget.from_policy(OffsetStudent(shipped.model, V, d, shrink), shipped.normalization,
                                     shipped.meta["agent_env_options"], shipped.meta["action_repeat"],
                                     label="learned + distilled offset")


def _label_job(task: tuple[int, int, int]) -> float:
    seed, g, k = task
    kw = RandomMix()(np.random.default_rng(seed))
    return float(np.log(run_episode(offset_agent(GRID[g]), kw, seed + EPISODE_SHIFTS[k], kw.get("horizon"))
                        .metrics()["mean_time_in_system"]))


def _points_job(seed: int) -> np.ndarray:
    kw = RandomMix()(np.random.default_rng(seed))
    xs = decision_points(LearnedBudget(None), kw, seed, kw.get("horizon"))
    return gate_inputs(xs, averages(xs))


def make_labels(n: int, workers: int, out: str) -> None:
    """The grids of ``n`` draws and the shipped model's inputs on each, written to ``out``."""
    seeds = list(range(LABEL_SEED, LABEL_SEED + n))
    tasks = [(s, g, k) for s in seeds for g in range(len(GRID)) for k in range(len(EPISODE_SHIFTS))]
    with mp.get_context("spawn").Pool(workers) as pool:
        loss = np.asarray(pool.map(_label_job, tasks, chunksize=8)).reshape(n, len(GRID), len(EPISODE_SHIFTS))
        pts = pool.map(_points_job, seeds, chunksize=1)
    if not np.all(np.isfinite(loss)):
        raise ValueError("labels: an episode has no finite time in system")
    lengths = np.array([len(p) for p in pts])
    np.savez(out, seeds=np.array(seeds), grid=GRID, loss=loss, points=np.vstack(pts), lengths=lengths)
    print(f"wrote {out}: {n} draws, {len(tasks)} episodes, {lengths.sum()} decision points")


def load_labels(path: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(loss (n, grid, episodes), inputs per draw)`` of a ``labels`` output; ``ValueError`` if it is not one."""
    with np.load(path) as z:
        loss, points, lengths, grid = z["loss"], z["points"], z["lengths"], z["grid"]
    if not np.array_equal(grid, GRID) or loss.shape[1:] != (len(GRID), len(EPISODE_SHIFTS)) \
            or len(lengths) != len(loss) or lengths.sum() != len(points):
        raise ValueError(f"{path} is not a labels output of this script's grid")
    return loss, np.split(points, np.cumsum(lengths)[:-1])


def soft_best(loss: np.ndarray) -> np.ndarray:
    """Each draw's soft-best offset ``(n, 2)`` from its grid's mean loss over the episodes ``loss[:, :, ks]``."""
    m = loss.mean(axis=2)
    w = np.exp(-(m - m.min(axis=1, keepdims=True)) / TAU)
    return (w / w.sum(axis=1, keepdims=True)) @ GRID


def fit_student(points: list[np.ndarray], targets: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Ridge regression of each draw's target offset on its decision points' inputs, every draw weighing alike."""
    return fit_points(points, [np.repeat(t[None], len(p), axis=0) for p, t in zip(points, targets)], ridge)


def nearest(delta: np.ndarray) -> int:
    """The grid point nearest the offset ``delta``."""
    return int(np.argmin(((GRID - delta) ** 2).sum(axis=1)))


def fit_report(loss: np.ndarray, points: list[np.ndarray]) -> None:
    """The ceiling, and the cross-validated student for each ridge and shrink."""
    n = len(loss)
    zero = loss[:, ZERO, :]
    print(f"{n} draws; the grid's best offset per draw, on all three episodes (in-sample): "
          f"{math.exp((loss.mean(axis=2).min(axis=1) - zero.mean(axis=1)).mean()):.4f} of offset 0 (geometric)")
    gains = []
    for k in range(loss.shape[2]):  # picked on the other two episodes, played on this one
        others = [j for j in range(loss.shape[2]) if j != k]
        pick = loss[:, :, others].mean(axis=2).argmin(axis=1)
        gains.append(loss[np.arange(n), pick, k] - zero[:, k])
    g = np.concatenate(gains)
    print(f"ceiling (best of two episodes, played on the third): {math.exp(g.mean()):.4f} of offset 0; "
          f"draws better by 2%: {np.mean(np.mean(gains, axis=0) < math.log(0.98)):.2f}, worse by 2%: "
          f"{np.mean(np.mean(gains, axis=0) > math.log(1.02)):.2f}")
    best = soft_best(loss)
    print("soft-best offsets: mean %s, spread %s" % (np.round(best.mean(axis=0), 3), np.round(best.std(axis=0), 3)))
    folds = np.arange(n) % FOLDS
    for ridge in (1.0, 10.0, 100.0, 1000.0):
        pred = np.zeros((n, 2))
        for f in range(FOLDS):
            tr, te = np.flatnonzero(folds != f), np.flatnonzero(folds == f)
            V, d = fit_student([points[i] for i in tr], best[tr], ridge)
            for i in te:
                pred[i] = (points[i] @ V + d).mean(axis=0)
        line = []
        for shrink in (0.5, 1.0):
            idx = np.array([nearest(shrink * p) for p in pred])
            r = loss.mean(axis=2)[np.arange(n), idx] - zero.mean(axis=1)
            line.append(f"shrink {shrink}: {math.exp(r.mean()):.4f}")
        corr = [np.corrcoef(pred[:, j], best[:, j])[0, 1] for j in range(2)]
        print(f"ridge {ridge:g}: cross-validated, of offset 0: " + ", ".join(line)
              + f"; correlation with the soft-best offset {corr[0]:.2f} / {corr[1]:.2f}")


def search_experts(n: int, out: str, workers: int) -> None:
    """An expert per labelled draw: the shipped generalist searched on that draw alone (``per_scenario.py``'s budget:
    12 updates of 8 directions on one episode, the best of four evaluations on two kept, update 0 the generalist
    itself), into ``out/<seed>``; an expert already there is kept."""
    from per_scenario import _Fixed

    from flowgym.lab.ars import ARSConfig, train_ars

    os.makedirs(out, exist_ok=True)
    for seed in range(LABEL_SEED, LABEL_SEED + n):
        where = os.path.join(out, str(seed))
        if os.path.isdir(where):
            continue
        kw = RandomMix()(np.random.default_rng(seed))
        res = train_ars(ARSConfig(distribution=_Fixed(f"RandomMix draw {seed}", kw), init="shipped", iterations=12,
                                  directions=8, draws=1, eval_every=4, eval_episodes=2, workers=workers,
                                  final_eval_seeds=0, out=where, progress=False))
        print(f"draw {seed}: kept update {res.best_iteration} ({res.best_eval:.2f}), {res.wall_seconds:.0f} s",
              flush=True)


def _expert_points_job(task: tuple[str, int]) -> tuple[np.ndarray, np.ndarray, int]:
    """An expert's inputs at its own decision points on its draw, the offset of its action from the shipped
    model's there, and its kept update."""
    path, seed = task
    kw = RandomMix()(np.random.default_rng(seed))
    agent = LearnedBudget(path)
    xs = decision_points(agent, kw, seed, kw.get("horizon"))
    return gate_inputs(xs, averages(xs)), agent.model(xs) - LearnedBudget(None).model(xs), \
        int(agent.meta.get("best_iteration", -1))


def expert_targets(out: str, workers: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every expert in ``out``: its inputs and its per-decision offsets from the shipped model."""
    seeds = sorted(int(d) for d in os.listdir(out) if d.isdigit())
    if not seeds:
        raise ValueError(f"{out} holds no experts (run the experts command first)")
    with mp.get_context("spawn").Pool(workers) as pool:
        res = pool.map(_expert_points_job, [(os.path.join(out, str(s)), s) for s in seeds], chunksize=1)
    moved = sum(1 for _, y, _ in res if np.abs(y).max() > 0)
    print(f"{len(res)} experts in {out}: {moved} moved from the shipped model (the others kept update 0); mean "
          f"absolute offset {np.mean([np.abs(y).mean() for _, y, _ in res]):.3f}")
    return [p for p, _, _ in res], [y for _, y, _ in res]


def fit_points(points: list[np.ndarray], targets: list[np.ndarray], ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Ridge regression of per-decision target offsets on the inputs, every draw weighing alike."""
    X, Y = np.vstack(points), np.vstack(targets)
    sw = np.concatenate([np.full(len(p), 1.0 / len(p)) for p in points])
    sw *= len(X) / sw.sum()
    mu, ym = np.average(X, axis=0, weights=sw), np.average(Y, axis=0, weights=sw)
    Xc, Yc = X - mu, Y - ym
    A = (Xc * sw[:, None]).T @ Xc + ridge * len(X) / 1000.0 * np.eye(X.shape[1])
    V = np.linalg.solve(A, (Xc * sw[:, None]).T @ Yc)
    return V, ym - mu @ V


def _draw_job(task: tuple[Any, ...]) -> float:
    spec, V, d, shrink, seed = task
    kw = RandomMix()(np.random.default_rng(seed))
    agent = student_agent(V, d, shrink) if spec == "student" else make_agent("learned")
    return run_episode(agent, kw, seed, kw.get("horizon")).metrics()["mean_time_in_system"]


def _screen_job(task: tuple[Any, ...]) -> tuple[str, str, float]:
    spec, V, d, shrink, name, seed, rs = task
    kw, H = scenario(name)
    agent = (make_agent("rate-switch", **rs) if spec == "rate-switch"
             else student_agent(V, d, shrink) if spec == "student" else make_agent("learned"))
    return spec, name, run_episode(agent, kw, seed, H).metrics(H)["mean_time_in_system"]


def _grid_job(task: tuple[str, int, int]) -> tuple[str, int, int, float]:
    name, g, seed = task
    kw, H = scenario(name)
    return name, g, seed, float(np.log(run_episode(offset_agent(GRID[g]), kw, seed, H).metrics(H)["mean_time_in_system"]))


def scenario_ceiling(workers: int) -> None:
    """The same ceiling on the report scenarios: each scenario's best grid offset on all but one screening seed,
    played on that seed, against offset 0 (a scenario of one seed, the Azure replay: in-sample, marked)."""
    names = [*ADAPTIVE_SCENARIOS, *held_out()]
    tasks = [(n, g, seed) for n in names for seed in seeds_of(n) for g in range(len(GRID))]
    with mp.get_context("spawn").Pool(workers) as pool:
        out = pool.map(_grid_job, tasks, chunksize=4)
    print("| scenario | best offset (all seeds) | in-sample, / offset 0 | picked on the other seeds, / offset 0 |")
    print("|---|---|---:|---:|")
    logs = []
    for n in names:
        seeds = seeds_of(n)
        L = np.array([[v for m, g, s, v in out if m == n and s == seed and g == gi] for gi in range(len(GRID))
                      for seed in seeds]).reshape(len(GRID), len(seeds))
        inside = L.mean(axis=1).min() - L[ZERO].mean()
        if len(seeds) > 1:
            held = [L[np.delete(L, k, axis=1).mean(axis=1).argmin(), k] - L[ZERO, k] for k in range(len(seeds))]
            out_of = float(np.mean(held))
        else:
            out_of = inside
        logs.append(out_of)
        mark = "" if len(seeds) > 1 else " (one seed: in-sample)"
        print(f"| {n} | {GRID[L.mean(axis=1).argmin()].tolist()} | {math.exp(inside):.3f} | {math.exp(out_of):.3f}{mark} |")
    print(f"| geometric mean over {len(names)} | - | - | {math.exp(np.mean(logs)):.3f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["labels", "fit", "draws", "screen", "scenarios", "experts"])
    ap.add_argument("--experts", help="experts: where to write the per-draw experts; draws, screen: fit the student "
                    "to these experts' per-decision offsets instead of the grid's labels")
    ap.add_argument("--labels", help="the labels file (labels: where to write it); every command but scenarios")
    ap.add_argument("--draws", type=int, default=96, help="labels: training draws (default 96); draws: new "
                    "RandomMix() draws to evaluate on (default 96 there too; 192 as select_generalist.py with --draws 192)")
    ap.add_argument("--ridge", type=float, default=10.0, help="draws, screen: the student's ridge")
    ap.add_argument("--shrink", type=float, default=1.0, help="draws, screen: the factor on the student's offset")
    ap.add_argument("--rate-switch", help="screen: the tuned rate-switch JSON (bench_learned.py --out)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    if args.draws < 2 or args.workers < 1 or not args.ridge >= 0 or not args.shrink >= 0:
        ap.error("--draws must be at least 2, --workers at least 1, --ridge and --shrink non-negative")
    if args.cmd == "screen" and not args.rate_switch:
        ap.error("screen needs --rate-switch")
    if args.cmd == "scenarios":
        scenario_ceiling(args.workers)
        return 0
    if args.cmd == "experts":
        if not args.experts:
            ap.error("experts needs --experts (where to write them)")
        search_experts(args.draws, args.experts, args.workers)
        return 0
    if args.experts and args.cmd in ("draws", "screen"):
        try:
            pts, ys = expert_targets(args.experts, args.workers)
        except (OSError, ValueError) as e:
            ap.error(f"--experts {args.experts}: {e}")
        V, d = fit_points(pts, ys, args.ridge)
        return evaluate_student(args, V, d)
    if not args.labels:
        ap.error(f"{args.cmd} needs --labels")
    if args.cmd == "labels":
        make_labels(args.draws, args.workers, args.labels)
        return 0
    try:
        loss, points = load_labels(args.labels)
    except (OSError, KeyError, ValueError) as e:
        ap.error(f"--labels {args.labels}: {e}")
    if args.cmd == "fit":
        fit_report(loss, points)
        return 0
    V, d = fit_student(points, soft_best(loss), args.ridge)
    return evaluate_student(args, V, d)


def evaluate_student(args: argparse.Namespace, V: np.ndarray, d: np.ndarray) -> int:
    """``draws`` or ``screen`` of the student ``(V, d)``."""
    specs = ["shipped", "student"]
    if args.cmd == "draws":
        seeds = list(range(30000, 30000 + args.draws))
        with mp.get_context("spawn").Pool(args.workers) as pool:
            out = np.asarray(pool.map(_draw_job, [(s, V, d, args.shrink, seed) for s in specs for seed in seeds],
                                      chunksize=4)).reshape(len(specs), len(seeds))
        print(f"RandomMix(), {len(seeds)} draws (seeds {seeds[0]}-{seeds[-1]}), ridge {args.ridge:g}, "
              f"shrink {args.shrink:g}:")
        for s, v in zip(specs, out):
            print("  " + ratio_line(s, v, out[0]))
        return 0
    rs = tuned_rate_switch(args.rate_switch)
    names = [n for n in [*ADAPTIVE_SCENARIOS, *held_out()] if n in rs]
    tasks = [(s, V, d, args.shrink, n, seed, rs.get(n)) for n in names for s in ["rate-switch", *specs]
             for seed in seeds_of(n)]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        out = pool.map(_screen_job, tasks, chunksize=1)
    print_screen(out, names, specs, ["shipped", f"student (ridge {args.ridge:g}, shrink {args.shrink:g})"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
