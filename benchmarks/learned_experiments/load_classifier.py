"""An explicit load classifier: two expert policies blended by a gate trained on labelled loads.

The experiment of docs/training.md, "An explicit load classifier". The per-scenario searches ("The
generalist tuned per scenario") moved the generalist's weights two opposite ways: the short-phase
mixes (a request mix that changes every few hundred slots) wanted both multipliers higher, the slow or
overloaded loads (one mix whose rate changes, or stationary overload) lower. One linear policy serves
both only where its features tell the two apart, and ``RandomMix`` gives the search no reason to learn
to (it carries no label). This script gives it the label:

* two sub-families of ``RandomMix``, defined from the *named* ``adaptive-*`` scenarios' kinds (not the
  held-out H1-H8): **A**, short-phase mixes (``stationary_p=0``, ``phase_range=[200, 1000]``, the streams'
  own lengths) and **B**, slow or overloaded loads (``stationary_p=0.5`` (40% of those overloaded), the
  others switching with shared lengths, ``phase_range=[1000, 3000]``); no trace pieces in either;
* an expert for each, searched from the shipped generalist on its family (``flowgym train --init shipped
  --iterations 40 --distribution FAMILY``; seeds 80000 and 81000);
* a **gate**: a logistic regression on the normalised features and their exponential averages over 16 and
  64 decisions (128 and 512 slots), fitted on the shipped model's decision points of 64 draws of each
  family (seeds 82000.. and 83000..) to say which family the load is from; its accuracy is measured on
  32 other draws of each (seeds 82100.., 83100..);
* the **gated policy**: ``a = g A(x) + (1 - g) B(x)`` (``g`` the gate's probability of family A), a
  recurrent policy (the averages are its state), run through ``LearnedBudget.from_policy``, the code path
  of a saved model.

Commands (every one fits the gate first, in about 40 s, and prints its accuracy; ``fit`` does only that)::

    python benchmarks/learned_experiments/load_classifier.py fit
    python benchmarks/learned_experiments/load_classifier.py gates
    python benchmarks/learned_experiments/load_classifier.py search --experts runs/expA,runs/expB --theta runs/gated1s.npz
    python benchmarks/learned_experiments/load_classifier.py draws --experts runs/expA,runs/expB [--theta runs/gated1s.npz]
    python benchmarks/learned_experiments/load_classifier.py screen --experts runs/expA,runs/expB --rate-switch FILE

``search``: both experts' weights searched together on ``RandomMix()`` with the gate fixed (ARS V1 with
``flowgym train``'s constants; training seeds 86000..), the best of the evaluations on the selection draws
20000-20011 written to ``--theta`` with the gate; ``--theta`` then plays those weights and that gate.

``draws``: the gated policy, each expert and the shipped model on new draws of ``RandomMix()`` (seeds
30000.., as ``select_generalist.py``) and of each family (seeds 84000.., 85000..), geometric mean time
in system and ratios to the shipped model with 95% paired bootstrap intervals. ``screen``: the same
policies on the report scenarios' screening seeds (``anchors.py screen``), as ratios to the tuned
rate-switch. ``gates``: the gate's mean probability of family A on each report scenario (the shipped
model's decision points, screening seeds). Not a timed test.
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
from select_generalist import geometric_ratio_ci  # noqa: E402

from flowgym.agents import LearnedBudget, make_agent  # noqa: E402
from flowgym.agents.learned import ArrayPolicy  # noqa: E402
from flowgym.lab.distributions import RandomMix  # noqa: E402
from flowgym.lab.evaluation import run_episode  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402

#: The two labelled families (``RandomMix`` fields); A is the gate's positive class.
FAMILY_A = {"stationary_p": 0.0, "trace_p": 0.0, "phase_range": (200, 1000)}
FAMILY_B = {"stationary_p": 0.5, "trace_p": 0.0, "shared_lengths_p": 1.0, "phase_range": (1000, 3000)}
#: The gate's exponential averages: leak rates per decision (time constants 16 and 64 decisions).
LEAKS = (1.0 / 16.0, 1.0 / 64.0)
FIT_SEEDS = (82000, 83000)      # 64 draws of A, of B: the gate's training draws
TEST_SEEDS = (82100, 83100)     # 32 draws of each: its accuracy
DRAW_SEEDS = (84000, 85000)     # the families' draws for ``draws``
L2 = 1.0                        # the ridge on the gate's weights (per 1,000 decision points)


def gate_inputs(x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The gate's inputs: the features ``x`` ``(n, f)`` and their averages ``z`` ``(n, len(LEAKS) * f)``."""
    return np.hstack([x, z])


def averages(xs: np.ndarray) -> np.ndarray:
    """The exponential averages of one episode's decision points ``xs`` ``(T, f)``, as the policy keeps them."""
    z = np.empty((len(xs), len(LEAKS) * xs.shape[1]))
    cur = np.tile(xs[0], len(LEAKS))
    leak = np.repeat(LEAKS, xs.shape[1])
    for t, x in enumerate(xs):
        cur = (1 - leak) * cur + leak * np.tile(x, len(LEAKS))
        z[t] = cur
    return z


def carry_averages(x: np.ndarray, state: Any, episode_start: Any, leak: np.ndarray) -> np.ndarray:
    """The exponential averages after the decision on the features ``x`` ``(n, f)``: ``state`` (``None`` at an
    episode's start) moved toward ``x`` by ``leak``, each row where ``episode_start`` is set started at ``x``."""
    rep = np.tile(x, len(LEAKS))
    z = rep.copy() if state is None else np.array(state, dtype=np.float64)
    if episode_start is not None:
        s = np.asarray(episode_start, dtype=bool).reshape(len(x))
        z[s] = rep[s]
    return (1 - leak) * z + leak * rep


def print_screen(out: list[tuple[str, str, float]], names: list[str], specs: list[str], header: list[str]) -> None:
    """The screen's table from the ``(spec, scenario, time in system)`` episodes ``out`` (the tuned rate-switch's
    under ``"rate-switch"``): each spec's mean over the seeds / the rate-switch's, and the geometric mean over
    ``names``; ``header`` names the columns of ``specs``."""
    tis: dict[tuple[str, str], list[float]] = {}
    for s, n, v in out:
        tis.setdefault((s, n), []).append(v)
    print("| scenario | tuned rate-switch TIS | " + " | ".join(header) + " |")
    print("|---|---:|" + "---:|" * len(specs))
    logs: dict[str, list[float]] = {s: [] for s in specs}
    for n in names:
        base = float(np.mean(tis[("rate-switch", n)]))
        r = {s: float(np.mean(tis[(s, n)])) / base for s in specs}
        for s in specs:
            logs[s].append(math.log(r[s]))
        print(f"| {n} | {base:.1f} | " + " | ".join(f"{r[s]:.3f}" for s in specs) + " |")
    print(f"| geometric mean over {len(names)} | - | "
          + " | ".join(f"{math.exp(np.mean(logs[s])):.3f}" for s in specs) + " |")


class GatedPolicy(ArrayPolicy):
    """``a = g(x, z) A(x) + (1 - g(x, z)) B(x)``: two linear experts blended by a logistic gate on the features
    ``x`` and their exponential averages ``z`` (the policy's state, carried as an LSTM state is)."""

    recurrent = True

    def __init__(self, a: ArrayPolicy, b: ArrayPolicy, w: np.ndarray, c: float) -> None:
        space = a.observation_space
        super().__init__(a.layers, space.low, space.high)
        self.a, self.b, self.w, self.c = a, b, np.asarray(w, dtype=np.float64), float(c)
        self.leak = np.repeat(LEAKS, space.shape[0])

    def gate(self, x: np.ndarray, z: np.ndarray) -> np.ndarray:
        """The probability of family A of each row of features ``x`` and their averages ``z``."""
        return 1.0 / (1.0 + np.exp(-(gate_inputs(x, z) @ self.w + self.c)))

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[override]
        x = np.asarray(obs, dtype=np.float64)
        z = carry_averages(x, state, episode_start, self.leak)
        g = self.gate(x, z)[:, None]
        return (g * self.a(x) + (1 - g) * self.b(x)).astype(np.float32), z

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """The blended actions of a batch of observations, each an episode's first decision (not expert A's
        alone, which the layers inherited from ``ArrayPolicy`` would give)."""
        return self.predict(obs)[0].astype(np.float64)

    def arrays(self) -> dict[str, np.ndarray]:
        raise ValueError("GatedPolicy is an experiment's policy: it has no model-directory format")


def expert(path: str) -> LearnedBudget:
    """The model ``path`` (``"shipped"``: the shipped generalist) as an expert; ``ValueError`` (raised in the main
    process by :func:`main`'s check, never first in a pool worker, which would not pass on an exit) unless it is a
    memoryless linear ``--algo ars`` model."""
    agent = LearnedBudget(None if path == "shipped" else path)
    if not isinstance(agent.model, ArrayPolicy) or agent.model.recurrent or len(agent.model.layers) != 1:
        raise ValueError(f"{path}: an expert must be a memoryless linear --algo ars model")
    return agent


def _family_points(task: tuple[dict[str, Any], int]) -> np.ndarray:
    over, seed = task
    kw = RandomMix(**over)(np.random.default_rng(seed))
    xs = decision_points(LearnedBudget(None), kw, seed, kw.get("horizon"))
    return gate_inputs(xs, averages(xs))


def labelled(first: tuple[int, int], n: int, workers: int) -> list[tuple[np.ndarray, int]]:
    """The gate's inputs of the shipped model's episodes on ``n`` draws of each family, with their labels."""
    tasks = [(FAMILY_A, first[0] + i) for i in range(n)] + [(FAMILY_B, first[1] + i) for i in range(n)]
    with mp.get_context("spawn").Pool(workers) as pool:
        pts = pool.map(_family_points, tasks, chunksize=1)
    return [(p, 1 if i < n else 0) for i, p in enumerate(pts)]


def fit_gate(episodes: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, float]:
    """A ridge logistic regression (Newton's method); every episode weighs alike whatever its length."""
    X = np.vstack([p for p, _ in episodes])
    y = np.concatenate([np.full(len(p), lab, dtype=np.float64) for p, lab in episodes])
    sw = np.concatenate([np.full(len(p), 1.0 / len(p)) for p, _ in episodes])
    sw *= len(X) / sw.sum()
    A = np.hstack([X, np.ones((len(X), 1))])
    theta = np.zeros(A.shape[1])
    ridge = L2 * len(X) / 1000.0 * np.eye(A.shape[1])
    ridge[-1, -1] = 0.0
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(A @ theta)))
        grad = A.T @ (sw * (p - y)) + ridge @ theta
        H = (A * (sw * p * (1 - p))[:, None]).T @ A + ridge
        step = np.linalg.solve(H, grad)
        theta -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return theta[:-1], float(theta[-1])


def accuracy(w: np.ndarray, c: float, episodes: list[tuple[np.ndarray, int]]) -> tuple[float, float, float]:
    """Per decision point (episodes weighing alike), per episode (the mean probability's side), and after the
    first 128 decisions (1,024 slots, the averages warmed up)."""
    point, draw, late = [], [], []
    for p, lab in episodes:
        g = 1.0 / (1.0 + np.exp(-(p @ w + c)))
        point.append(np.mean((g > 0.5) == bool(lab)))
        draw.append(float((g.mean() > 0.5) == bool(lab)))
        late.append(np.mean((g[128:] > 0.5) == bool(lab)) if len(g) > 128 else point[-1])
    return float(np.mean(point)), float(np.mean(draw)), float(np.mean(late))


def check_experts(experts: list[str]) -> tuple[LearnedBudget, LearnedBudget]:
    """The two experts ``[DIR_A, DIR_B]``, loaded; ``ValueError`` unless they read the same features alike."""
    a, b = expert(experts[0]), expert(experts[1])
    for key in ("agent_env_options", "action_repeat", "observation_shape"):
        if a.meta[key] != b.meta[key]:
            raise ValueError(f"the experts differ in {key}: {a.meta[key]!r} and {b.meta[key]!r}")
    na, nb = a.normalization, b.normalization  # the experts must read the same normalised features
    if na is None or nb is None or not all(np.array_equal(u, v) for u, v in zip(na, nb)):
        raise ValueError("the experts normalise their observations differently (both must start from one model)")
    return a, b


def gated(experts: list[str], w: np.ndarray, c: float) -> LearnedBudget:
    """The gated policy of the two experts ``[DIR_A, DIR_B]`` and the gate ``(w, c)``, as a learned agent."""
    a, b = check_experts(experts)
    na = a.normalization
    policy = GatedPolicy(a.model, b.model, w, c)
    return LearnedBudget.from_policy(policy, na, a.meta["agent_env_options"], a.meta["action_repeat"],
                                     label="learned (gated experts)")


def gated_theta(experts: list[str], w: np.ndarray, c: float, theta: np.ndarray) -> LearnedBudget:
    """The gated policy with the experts' weights replaced by ``theta`` (A's, then B's, as ``ArrayPolicy.from_vector``)."""
    agent = gated(experts, w, c)
    pol = agent.model
    sizes = [pol.observation_space.shape[0], pol.action_space.shape[0]]
    lo, hi = pol.observation_space.low, pol.observation_space.high
    n = ArrayPolicy.n_weights(sizes)
    pol.a, pol.b = ArrayPolicy.from_vector(theta[:n], sizes, lo, hi), ArrayPolicy.from_vector(theta[n:], sizes, lo, hi)
    return agent


def start_theta(experts: list[str]) -> np.ndarray:
    """The two experts' weights, A's then B's (``W`` row-major, then ``b``)."""
    out = []
    for path in experts:
        ((w, b),) = expert(path).model.layers
        out += [w.ravel(), b]
    return np.concatenate(out)


def build(spec: str, experts: list[str], gate: tuple[np.ndarray, float], theta: np.ndarray | None = None) -> Any:
    """The agent ``spec`` names: ``"gated"`` (with ``theta``: the searched weights), ``"shipped"`` or a model path."""
    if spec == "gated":
        return gated(experts, *gate) if theta is None else gated_theta(experts, *gate, theta)
    return make_agent("learned", **({} if spec == "shipped" else {"path": spec}))


def _draw_job(task: tuple[Any, ...]) -> float:
    spec, experts, gate, over, seed, theta = task
    kw = RandomMix(**over)(np.random.default_rng(seed))
    agent = build(spec, experts, gate, theta)
    return run_episode(agent, kw, seed, kw.get("horizon")).metrics()["mean_time_in_system"]


def search(experts: list[str], gate: tuple[np.ndarray, float], iterations: int, workers: int, out: str) -> None:
    """ARS V1 (antithetic, common random numbers; ``flowgym train --algo ars``'s constants: 8 directions, 8 draws,
    noise 0.05, step 0.02) over both experts' weights together, the gate fixed, on ``RandomMix()`` draws (training
    seeds 86000..); every 5 updates the 12 selection draws (seeds 20000-20011, as ``flowgym train``), the best kept
    and written to ``out`` (``theta``, and the gate ``w``, ``c``)."""
    theta = start_theta(experts)
    rng = np.random.default_rng(86000)
    sel = list(range(20000, 20012))
    with mp.get_context("spawn").Pool(workers) as pool:
        def run(cands: list[np.ndarray], seeds: list[int]) -> np.ndarray:
            tasks = [("gated", experts, gate, {}, s, th) for th in cands for s in seeds]
            v = np.asarray(pool.map(_draw_job, tasks, chunksize=4))
            if not np.all(np.isfinite(v) & (v > 0)):  # flowgym train drops such a draw; here it stops the search
                raise ValueError(f"search: a draw of seeds {seeds[0]}-{seeds[-1]} has no finite time in system")
            return np.log(v).reshape(len(cands), len(seeds))

        best = (float(np.exp(run([theta], sel).mean())), 0, theta.copy())
        print(f"update 0: selection geometric mean {best[0]:.2f}", flush=True)
        for it in range(1, iterations + 1):
            seeds = [86000 + 8 * (it - 1) + j for j in range(8)]
            deltas = rng.normal(size=(8, len(theta)))
            scores = -run([theta + 0.05 * d for d in deltas] + [theta - 0.05 * d for d in deltas], seeds).mean(axis=1)
            spread = float(np.std(scores))
            if spread > 0:
                theta = theta + 0.02 / (8 * spread) * ((scores[:8] - scores[8:]) @ deltas)
            if it % 5 == 0 or it == iterations:
                e = float(np.exp(run([theta], sel).mean()))
                print(f"update {it}: selection geometric mean {e:.2f}", flush=True)
                if e < best[0]:
                    best = (e, it, theta.copy())
    print(f"kept update {best[1]} ({best[0]:.2f}); wrote {out}")
    np.savez(out, theta=best[2], w=gate[0], c=np.float64(gate[1]))


def _gate_job(task: tuple[str, int, tuple[np.ndarray, float]]) -> tuple[str, float]:
    name, seed, (w, c) = task
    kw, H = scenario(name)
    xs = decision_points(LearnedBudget(None), kw, seed, H)
    return name, float(np.mean(1.0 / (1.0 + np.exp(-(gate_inputs(xs, averages(xs)) @ w + c)))))


def _screen_job(task: tuple[Any, ...]) -> tuple[str, str, float]:
    spec, experts, gate, name, seed, rs, theta = task
    kw, H = scenario(name)
    agent = make_agent("rate-switch", **rs) if spec == "rate-switch" else build(spec, experts, gate, theta)
    return spec, name, run_episode(agent, kw, seed, H).metrics(H)["mean_time_in_system"]


def ratio_line(label: str, v: np.ndarray, base: np.ndarray) -> str:
    """``v``'s geometric mean and its ratio to ``base``'s with a 95% paired bootstrap interval over the draws."""
    r, lo, hi = geometric_ratio_ci(np.log(v) - np.log(base))
    return f"{label}: geometric mean {np.exp(np.log(v).mean()):.2f}; / shipped {r:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["fit", "gates", "search", "draws", "screen"])
    ap.add_argument("--theta", help="draws, screen: play the gated policy with the weights of this search output "
                    "(its gate too) instead of the experts'; search: where to write it")
    ap.add_argument("--iterations", type=int, default=40, help="search: updates (default 40)")
    ap.add_argument("--experts", help="search, draws, screen: DIR_A,DIR_B, the two experts' model directories "
                    "('shipped': the shipped generalist)")
    ap.add_argument("--draws", type=int, default=192, help="draws: new RandomMix() draws (seeds 30000..)")
    ap.add_argument("--family-draws", type=int, default=64, help="draws: draws of each family")
    ap.add_argument("--rate-switch", help="screen: the tuned rate-switch JSON (bench_learned.py --out)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    if args.draws < 2 or args.family_draws < 2 or args.workers < 1 or args.iterations < 1:
        ap.error("--draws and --family-draws must be at least 2, --workers and --iterations at least 1")
    experts: list[str] = []
    if args.cmd in ("search", "draws", "screen"):
        experts = (args.experts or "").split(",")
        if len(experts) != 2:
            ap.error("--experts takes two directories, DIR_A,DIR_B")
        try:  # checked here, before the gate's fit and before any pool worker builds them
            check_experts(experts)
        except (OSError, ValueError) as e:
            ap.error(f"--experts: {e}")
    if args.cmd == "search" and not args.theta:
        ap.error("search needs --theta (where to write the searched weights)")
    if args.cmd == "screen" and not args.rate_switch:
        ap.error("screen needs --rate-switch")
    theta, saved = None, None
    if args.theta and args.cmd in ("draws", "screen"):  # a search's output: its weights and its gate
        try:
            with np.load(args.theta) as z:
                theta, saved = z["theta"], (z["w"], float(z["c"]))
            gated_theta(experts, *saved, theta)
        except (OSError, KeyError, ValueError) as e:
            ap.error(f"--theta {args.theta}: not a search output of these experts ({e})")
    train = labelled(FIT_SEEDS, 64, args.workers)
    w, c = fit_gate(train)
    test = labelled(TEST_SEEDS, 32, args.workers)
    print("gate (logistic, %d inputs): accuracy per decision / per draw / per decision after 1,024 slots: fit draws "
          "%.3f / %.3f / %.3f, new draws %.3f / %.3f / %.3f" % (len(w), *accuracy(w, c, train), *accuracy(w, c, test)))
    gate = (w, c) if saved is None else saved
    specs = ["shipped", experts[0], experts[1], "gated"]
    if args.cmd == "search":
        search(experts, gate, args.iterations, args.workers, args.theta)
    elif args.cmd == "draws":
        sets = [("RandomMix()", {}, list(range(30000, 30000 + args.draws))),
                ("family A", FAMILY_A, list(range(DRAW_SEEDS[0], DRAW_SEEDS[0] + args.family_draws))),
                ("family B", FAMILY_B, list(range(DRAW_SEEDS[1], DRAW_SEEDS[1] + args.family_draws)))]
        for title, over, seeds in sets:
            tasks = [(s, experts, gate, over, seed, theta) for s in specs for seed in seeds]
            with mp.get_context("spawn").Pool(args.workers) as pool:
                out = np.asarray(pool.map(_draw_job, tasks, chunksize=4)).reshape(len(specs), len(seeds))
            print(f"{title}, {len(seeds)} draws (seeds {seeds[0]}-{seeds[-1]}):")
            for s, v in zip(specs, out):
                print("  " + ratio_line(s, v, out[0]))
    elif args.cmd == "gates":  # the gate's view of each report scenario (screening seeds), no expert played
        names = [*ADAPTIVE_SCENARIOS, *held_out()]
        with mp.get_context("spawn").Pool(args.workers) as pool:
            out = pool.map(_gate_job, [(n, seed, gate) for n in names for seed in seeds_of(n)], chunksize=1)
        for n in names:
            print(f"  {n}: P(A) {np.mean([g for m, g in out if m == n]):.2f}")
    elif args.cmd == "screen":
        rs = tuned_rate_switch(args.rate_switch)
        names = [n for n in [*ADAPTIVE_SCENARIOS, *held_out()] if n in rs]
        tasks = [(s, experts, gate, n, seed, rs.get(n), theta) for n in names for s in ["rate-switch", *specs]
                 for seed in seeds_of(n)]
        with mp.get_context("spawn").Pool(args.workers) as pool:
            out = pool.map(_screen_job, tasks, chunksize=1)
        print_screen(out, names, specs, specs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
