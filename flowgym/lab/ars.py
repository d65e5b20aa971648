"""Augmented random search (ARS) of a small numpy policy on the scale-free load features.

``flowgym train --algo ars`` (the shipped generalist's recipe, :meth:`ARSConfig.generalist`).
Why a derivative-free search next to PPO (docs/training.md, "The generalist"): PPO's policies
on the random-mix distribution stayed near a *constant* multiplier of the arrival rate (a
near-uniform softmax, or a Gaussian mean that trades light loads for heavy ones), because the
per-step advantages are mostly Poisson noise. ARS (Mania, Guy & Recht 2018, "Simple random
search provides a competitive approach to reinforcement learning", version V1 with antithetic
directions) instead compares whole episodes of the metric we report, and here with **common
random numbers**: in one iteration every perturbed policy runs on the *same* draws of the
workload distribution with the *same* seeds (the arrivals do not depend on the policy), so the
difference between ``theta + nu * delta`` and ``theta - nu * delta`` is the policy's effect on
those draws, not the draws' spread. The objective is the geometric mean of the time in system
over the draws (minus the mean of its log), the selection metric of every generalist, which
weighs a light draw (10-20 slots) and an overloaded one (hundreds) alike.

The policy is :class:`flowgym.agents.learned.ArrayPolicy`, a linear map (``hidden=()``) or a
small tanh network of the 20 load features of ``observation="load-v2"`` (the 17 of ``"load"`` with
``observation="load"``; normalised by their mean and spread under the
initial policy on ``norm_draws`` draws, then frozen) to the continuous ``log-multiplier``
action with two anchors (``multiplier_of="max-head"``, the default since 2026-11-26): two
multipliers between the smallest and the largest of ``multipliers`` (0.5-4 by default) on a log
scale, ``k_rate`` of the arrival rate and ``k_safe`` of the safe budget ``M / E_hat[w]``, and
``B_t = round(max(k_rate * rate, k_safe * safe budget))``, with ``rate`` the larger of the
arrival rate now and when the request at the queue head arrived (``"max"``: the rate now, the
action of the generalists shipped before it); ``theta = 0`` is
``k_rate = k_safe = sqrt(0.5 * 4) = 1.41``. ``multiplier_of="rate"`` is the one-anchor action
of the generalist shipped before (``B_t = round(k * rate)``, one output). Every candidate runs through
:func:`flowgym.lab.evaluation.run_episode` with
:meth:`flowgym.agents.LearnedBudget.from_policy`, the same code path as the saved model.

Same configuration, same model, whatever ``workers`` is (each episode is deterministic in its
draw's seed and the update sums in a fixed order). With ``workers > 1`` the episodes run in
spawned processes, so a script calling :func:`train_ars` needs ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowgym.agents.learned import (
    ARRAYS_FILE,
    DEFAULT_MODEL,
    FORMAT_VERSION,
    META_FILE,
    NORM_FILE,
    ArrayPolicy,
    LearnedBudget,
    MemoryArrayPolicy,
    describe_action_space,
)
from flowgym.sim import _json
from flowgym.sim._checks import is_finite_real, is_real

__all__ = ["ARSConfig", "ARSResult", "train_ars", "CURVE_COLUMNS", "ITERATES_FILE"]

#: Columns of an ARS run's ``curves.csv`` (one row per iteration; ``eval_geo_time_in_system`` on
#: evaluation iterations only).
CURVE_COLUMNS = ("iteration", "episodes", "decisions", "wall_seconds", "train_log_time_in_system",
                 "step_norm", "eval_geo_time_in_system")

#: The policy's weight vector after every update (row 0: the start), ``iterations + 1`` rows, in a run's
#: directory (not read by the loader).
ITERATES_FILE = "iterates.npy"


@dataclass
class ARSConfig:
    """Settings of :func:`train_ars` (``flowgym train --algo ars``). Defaults: the shipped generalist."""

    #: Workloads to train on: ``"random-mix"``, its mapping ``{"kind": "random-mix", ...}``, a callable
    #: ``rng -> FlowControl-v0 arguments``, or ``None``: the scenario's own workload (its seeds vary).
    distribution: Any = "random-mix"
    #: The report scenario of the final table (zero-shot with a distribution), or the training
    #: workload without one: a built-in name or a scenario file. With a distribution its other engine
    #: arguments apply over every draw, but never what a draw decides itself
    #: (:data:`flowgym.lab.distributions.DRAW_KEYS`: its cache, workload, horizon and time model).
    scenario: str = "adaptive-mix"
    rate: float | None = None
    #: Hidden layer sizes of the policy (``()``: linear in the load features).
    hidden: tuple[int, ...] = ()
    #: Units of a memory carried from decision to decision (0: none, the shipped recipe): a
    #: :class:`~flowgym.agents.learned.MemoryArrayPolicy`, whose leaky tanh units average learned
    #: projections of the features at fixed time constants from 2 to 128 decisions, and whose network reads
    #: the features and the memory. The memory's input weights start random (spread ``1/sqrt(n)``), its
    #: recurrent weights and biases at zero, and the output layer's weights on it at zero (with
    #: :attr:`hidden`, the first hidden layer reads it with random weights, as it reads the features), so
    #: update 0 plays the memoryless policy (with :attr:`init`, that model's). With :attr:`init` a memoryless
    #: model, ``search="new-inputs"`` moves the memory (its weights, the network's on it, the output biases).
    #: Not with :attr:`input_noise`. docs/training.md, "A memory searched by ARS".
    memory: int = 0
    #: A model directory of an earlier ``--algo ars`` run (same observation and hidden sizes) whose
    #: weights and frozen normalisation start the search (``None``: zero output weights, a fresh
    #: normalisation). An action with more outputs than that model's starts each new output as a copy
    #: of its last (``"max-head"`` to ``"max-drain"``: ``k_drain = k_safe``, where the drain term never
    #: decides, so the search starts from that model's policy exactly). A model of a shorter load
    #: observation whose features begin this search's (``"load-v2"`` to ``"load-v3"``) starts with zero
    #: weights on the new features and its own normalisation of the old ones (the new ones are
    #: normalised as in a fresh search), so again update 0 plays that model's policy. ``"shipped"``: the
    #: shipped generalist (``flowgym/data/models/generalist``), to tune it to one scenario
    #: (docs/training.md, "Tune the generalist to your workload").
    init: str | None = None
    #: Which weights the search moves: ``"all"``, or ``"new-inputs"``: only the weights on the inputs
    #: :attr:`init`'s model lacks (a longer load observation than its own) and the output biases, the
    #: rest held at that model's. A search of a few numbers (12 for a ``load-v2`` model and ``"load-v4"``) that
    #: asks what the new features add to that policy, without moving the policy elsewhere on the
    #: plateau of the training distribution (docs/training.md, "How much the load swings").
    search: str = "all"
    #: Updates of the policy.
    iterations: int = 80
    #: Random directions per update (each run twice: ``+`` and ``-``).
    directions: int = 8
    #: Draws (episodes) per candidate per update, common to all candidates of that update.
    draws: int = 8
    #: Standard deviation of the perturbation of each weight.
    noise: float = 0.05
    #: Step size (ARS's ``alpha``; the step is divided by the spread of the candidates' scores).
    step_size: float = 0.02
    #: The multiplier range of the ``log-multiplier`` action (its smallest and largest value count).
    multipliers: tuple[float, ...] = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
    #: What the multiplier multiplies (``FlowControlConfig.multiplier_of``): ``"max-head"``, a multiplier
    #: of the arrival rate (the larger of the rate now and when the queue head arrived) and one of the
    #: safe budget, the budget the larger product (two outputs); ``"max"``, the same with the rate now;
    #: or one anchor, ``"rate"``, ``"safe"`` or ``"min"`` (one output).
    multiplier_of: str = "max-head"
    #: The policy's observation: ``"load-v2"`` (the 17 load features and three more:
    #: :data:`~flowgym.sim.estimators.LOAD_FEATURES_V2`; the default since ars9, 2026-11-26) or
    #: ``"load"`` (the 17, as every generalist before) or ``"load-v3"`` (the 20 and two moving averages
    #: of the backlog, :data:`~flowgym.sim.estimators.LOAD_FEATURES_V3`) or ``"load-v4"`` (those 22 and
    #: how much the load swung over about the last 1,000 slots, :data:`~flowgym.sim.estimators.LOAD_FEATURES_V4`).
    observation: str = "load-v2"
    #: Largest budget (the cap of ``k * rate``).
    max_budget: int = 256
    #: Slots each decision is held for.
    action_repeat: int = 8
    #: Draws whose observations, under the initial policy, set the normalisation (seeds below ``seed``).
    norm_draws: int = 16
    #: Evaluate the current policy every this many iterations (and after the last) on the
    #: ``eval_episodes`` fixed draws from ``eval_seed``; the best evaluated policy is kept.
    eval_every: int = 5
    eval_episodes: int = 12
    eval_seed: int = 20_000
    #: Update ``u = 1, 2, ...`` trains on draws ``seed + (u - 1) * draws + j``; the normalisation draws are
    #: ``seed - 1 - j``; the directions come from ``numpy.random.default_rng(seed)``.
    seed: int = 40_000
    #: Weight ``w`` of a penalty on losing to the untuned two-anchor rule (0: none, the shipped recipe). With
    #: ``w > 0`` a candidate's score on a draw is ``-(log t + w * max(0, log t - log t_ref))``, ``t`` its mean
    #: time in system and ``t_ref`` that of the fixed two-anchor rule (``k_rate`` 1.4, ``k_safe`` 1, on the
    #: same anchors as :attr:`multiplier_of`; :class:`~flowgym.agents.adaptive.TwoAnchorBudget`) on the same
    #: draw and arrivals: the draws where the policy loses to that rule weigh ``1 + w`` times as much. The
    #: selection evaluations score the same way (their ``eval_geo_time_in_system`` is then the penalised
    #: geometric mean). docs/training.md, "Losing less often".
    hinge: float = 0.0
    #: Standard deviation of Gaussian noise added to the policy's normalised inputs in the training episodes
    #: (0: none, the shipped recipe): a regulariser (input noise, as in Bishop 1995: for a linear policy
    #: close to a penalty on its weights), so that no weight leans on a feature's exact value. Each decision
    #: draws its own noise from the draw's seed, so the candidates of an update see the same noise (common
    #: random numbers). The selection evaluations run without it, as the saved model plays.
    #: docs/training.md, "Feature noise".
    input_noise: float = 0.0
    #: Processes running episodes (1: this one).
    workers: int = 1
    #: Overrides of the environment arguments (e.g. ``{"reward_weights": ...}``; not the workload).
    env_overrides: dict[str, Any] = field(default_factory=dict)
    #: Reporting seeds ``0..final_eval_seeds-1`` of the final table on ``scenario`` (0: none).
    final_eval_seeds: int = 3
    tune_seeds: int = 2
    out: str = "runs/ars-generalist"
    progress: bool = True

    @classmethod
    def generalist(cls, **overrides: Any) -> ARSConfig:
        """The shipped generalist's recipe (``flowgym train`` with no scenario)."""
        return cls(**overrides)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid setting."""

        def pos_int(name: str, zero: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if zero else 1):
                raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} integer, got {v!r}")

        for name in ("iterations", "directions", "draws", "max_budget", "action_repeat", "eval_every",
                     "eval_episodes", "workers", "norm_draws"):
            pos_int(name)
        for name in ("eval_seed", "seed", "final_eval_seeds", "tune_seeds"):
            pos_int(name, zero=True)
        from flowgym.lab.train import check_tune_seeds

        check_tune_seeds(self.scenario, self.rate, self.final_eval_seeds, self.tune_seeds)
        if self.seed < self.norm_draws:
            raise ValueError(f"seed must be at least norm_draws ({self.norm_draws}): the normalisation draws are "
                             f"seeds seed-1 down to seed-norm_draws, got seed={self.seed}")
        # the model is selected on seeds it did not train on
        used = [(name, lo, hi) for name, (lo, hi) in self.seed_ranges().items() if hi >= lo]
        for i, (a, alo, ahi) in enumerate(used):
            for b, blo, bhi in used[i + 1:]:
                if alo <= bhi and blo <= ahi:
                    raise ValueError(f"the {a} seeds {alo}..{ahi} overlap the {b} seeds {blo}..{bhi}: "
                                     "choose seed and eval_seed so that every use has its own seeds")
        if not is_finite_real(self.hinge) or not self.hinge >= 0:
            raise ValueError(f"hinge must be a non-negative number, got {self.hinge!r}")
        if self.hinge > 0 and self.multiplier_of not in ("max", "max-head"):
            raise ValueError("hinge needs a two-anchor action (multiplier_of 'max' or 'max-head', the reference "
                             f"rule's), got multiplier_of={self.multiplier_of!r}")
        if not is_finite_real(self.input_noise) or not 0 <= self.input_noise <= 100:
            raise ValueError(f"input_noise must be a number in [0, 100] (spreads of the normalised inputs), "
                             f"got {self.input_noise!r}")
        for name in ("noise", "step_size"):
            v = getattr(self, name)
            if not is_finite_real(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if not isinstance(self.hidden, (tuple, list)) or any(
                isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in self.hidden):
            raise ValueError(f"hidden must be a list of positive layer sizes (empty: linear), got {self.hidden!r}")
        pos_int("memory", zero=True)
        if self.memory > 0 and self.input_noise > 0:
            raise ValueError("input_noise is not implemented for a policy with a memory (memory > 0): choose one")
        if not isinstance(self.env_overrides, Mapping):
            raise ValueError(f"env_overrides must be a mapping, got {self.env_overrides!r}")
        from flowgym.envs.flow_control import FlowControlConfig

        FlowControlConfig.check_names(self.env_overrides, "env_overrides: ")
        for bad in ("workload", "observation", "action", "max_budget", "multipliers", "multiplier_of"):
            if bad in self.env_overrides:
                raise ValueError(f"env_overrides may not set {bad!r}: the workload comes from the distribution or "
                                 "the scenario, and the observation and action are the search's own settings")
        if self.distribution is not None:  # each draw sets these: an override would be dropped silently
            from flowgym.lab.distributions import check_overrides

            check_overrides(self.env_overrides)
        from flowgym.envs.spaces import LOAD_OBSERVATIONS, one_of

        if self.observation not in LOAD_OBSERVATIONS:
            raise ValueError(f"observation must be {one_of(tuple(LOAD_OBSERVATIONS))}, got {self.observation!r}")
        from flowgym.agents.learned import MAX_ARRAY_ELEMENTS
        from flowgym.envs.spaces import log_multiplier_size
        from flowgym.sim.estimators import FEATURE_VERSIONS

        n_obs = len(FEATURE_VERSIONS[LOAD_OBSERVATIONS[self.observation]])
        sizes = [n_obs + self.memory, *[int(h) for h in self.hidden], log_multiplier_size(self.multiplier_of)]
        n = _count_weights(sizes, self.memory, n_obs)
        if n > MAX_ARRAY_ELEMENTS:  # the loader refuses a policy.npz of more (agents/learned.py)
            raise ValueError(f"hidden={list(self.hidden)!r} and memory={self.memory} make {n} weights, more than the "
                             f"{MAX_ARRAY_ELEMENTS} a model file may hold")
        from flowgym.lab.scenarios import get_scenario
        from flowgym.lab.train import learned_env_kwargs

        sc = get_scenario(self.scenario, rate=self.rate)
        # the environment of the search's first episode, as train_ars builds it (with a distribution, its first
        # training draw under the scenario's other arguments): max_budget and env_overrides are checked here,
        # before the output directory is made
        env_kw = learned_env_kwargs(sc.tune_env_kwargs(), self.max_budget, self.env_overrides,
                                    observation=self.observation, action="log-multiplier",
                                    multipliers=tuple(self.multipliers), multiplier_of=self.multiplier_of)
        horizon = env_kw.get("horizon")
        if self.distribution is not None:
            from flowgym.lab.distributions import DRAW_KEYS, make_distribution

            sampler = make_distribution(self.distribution)
            drawn = dict(sampler(np.random.default_rng(self.seed)))
            env_kw = {**drawn, **{k: v for k, v in env_kw.items() if k not in DRAW_KEYS}}
            horizon = getattr(sampler, "horizon", drawn.get("horizon"))
        FlowControlConfig(**env_kw).validate()
        if is_finite_real(horizon) and self.action_repeat > horizon:
            raise ValueError(f"action_repeat {self.action_repeat} exceeds the episode ({horizon:g} slots): the "
                             "policy would decide once an episode")
        if not self.out:
            raise ValueError("out (the output directory) must be given")
        if self.init == "shipped" and not os.path.isdir(DEFAULT_MODEL):
            raise ValueError(f"init='shipped': the shipped generalist is not at {DEFAULT_MODEL} (a broken install?)")
        if self.init is not None and not (isinstance(self.init, (str, os.PathLike)) and os.path.isdir(self.init_path)):
            raise ValueError(f"init must be a model directory of flowgym train --algo ars or 'shipped', got {self.init!r}")
        if self.search not in ("all", "new-inputs"):
            raise ValueError(f"search must be 'all' or 'new-inputs', got {self.search!r}")
        if self.search == "new-inputs" and self.init is None:
            raise ValueError("search='new-inputs' needs init (the model whose other weights are held)")

    @property
    def init_path(self) -> str | None:
        """The directory of :attr:`init` (``"shipped"`` resolved to the shipped generalist's)."""
        if self.init is None:
            return None
        return DEFAULT_MODEL if self.init == "shipped" else os.fspath(self.init)

    def seed_ranges(self) -> dict[str, tuple[int, int]]:
        """The first and last seed of each use (a use with no seed has last < first)."""
        return {
            "training": (self.seed, self.seed + self.iterations * self.draws - 1),
            "normalisation": (self.seed - self.norm_draws, self.seed - 1),
            "selection (eval_seed)": (self.eval_seed, self.eval_seed + self.eval_episodes - 1),
            "report (final_eval_seeds)": (0, self.final_eval_seeds - 1),
            "tuning (tune_seeds)": (1000, 999 + self.tune_seeds),
        }

    def hyperparameters(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        d["multipliers"] = list(self.multipliers)
        if self.distribution is not None:
            from flowgym.lab.distributions import make_distribution

            dist = make_distribution(self.distribution)
            d["distribution"] = dist.to_spec() if hasattr(dist, "to_spec") else repr(self.distribution)
        return d


@dataclass
class ARSResult:
    """What :func:`train_ars` produced."""

    out: str
    iterations: int
    episodes: int
    wall_seconds: float
    #: Iteration of the kept policy and its evaluation (geometric mean time in system).
    best_iteration: int
    best_eval: float
    curves: list[dict[str, Any]]
    table: Any = None


# --------------------------------------------------------------------------- one episode (runs in workers)

_SPEC: dict[str, Any] = {}


def _init_worker(spec: dict[str, Any]) -> None:
    _SPEC.clear()
    _SPEC.update(spec)


class _NoisyInputs(ArrayPolicy):
    """An :class:`ArrayPolicy` that adds Gaussian noise of spread ``sigma`` to its (normalised) inputs, from
    its own stream (``ARSConfig.input_noise``; training episodes only)."""

    sigma: float = 0.0
    rng: np.random.Generator | None = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float64)
        if self.sigma > 0 and self.rng is not None:
            x = x + self.rng.normal(0.0, self.sigma, x.shape)
        return super().__call__(x)


#: Second word of the noise stream's seed (``[draw seed, this]``), apart from every other use of a draw's seed.
_NOISE_STREAM = 0x1A5E


def _count_weights(sizes: list[int], memory: int, n_obs: int) -> int:
    """Weights of a policy of layer ``sizes`` (the first ``n_obs`` inputs plus ``memory`` units) with a memory of
    ``memory`` units (0: none)."""
    return MemoryArrayPolicy.n_weights(sizes, memory, n_obs) if memory else ArrayPolicy.n_weights(sizes)


def _n_weights(spec: dict[str, Any]) -> int:
    """The search's number of weights: the network's, and the memory's (``spec["leak"]``: its rates, or none)."""
    leak = spec.get("leak")
    return _count_weights(spec["sizes"], 0 if leak is None else len(leak), len(spec["obs_low"]))


def _policy(theta: np.ndarray, spec: dict[str, Any], noisy: bool = False) -> ArrayPolicy:
    """The policy of weights ``theta`` under the search's ``spec`` (layer sizes, observation bounds, memory)."""
    if spec.get("leak") is not None:
        return MemoryArrayPolicy.from_vector(theta, spec["sizes"], spec["obs_low"], spec["obs_high"], spec["leak"])
    return (_NoisyInputs if noisy else ArrayPolicy).from_vector(theta, spec["sizes"], spec["obs_low"],
                                                                spec["obs_high"])


def _episode(task: tuple[Any, ...]) -> float:
    """Mean time in system of the policy with weights ``theta`` and normalisation ``norm`` on one draw
    (seed, its arguments), with ``input_noise`` (a fifth element, 0 if absent) on its inputs."""
    from flowgym.lab.evaluation import run_episode

    theta, norm, seed, env_kwargs = task[:4]
    sigma = float(task[4]) if len(task) > 4 else 0.0
    s = _SPEC
    policy = _policy(np.asarray(theta), s, noisy=sigma > 0)
    if isinstance(policy, _NoisyInputs):
        policy.sigma, policy.rng = sigma, np.random.default_rng([int(seed), _NOISE_STREAM])
    agent = LearnedBudget.from_policy(policy, norm, s["env_options"], s["action_repeat"])
    ep = run_episode(agent, env_kwargs, seed, env_kwargs.get("horizon"))
    return float(ep.metrics()["mean_time_in_system"])


def _reference_episode(task: tuple[int, dict[str, Any]]) -> float:
    """Mean time in system of the untuned two-anchor rule (the reference of ``ARSConfig.hinge``) on one draw."""
    from flowgym.agents.adaptive import TwoAnchorBudget
    from flowgym.lab.evaluation import run_episode

    seed, env_kwargs = task
    opts = _SPEC["env_options"]
    agent = TwoAnchorBudget(head=opts.get("multiplier_of") == "max-head", cap=int(opts.get("max_budget", 256)))
    # the candidates' environment: every option of theirs but the action's and the observation's own (the
    # reference sets its action; the observation does not change the dynamics, but e.g. rate_window,
    # eviction and output_length_known do)
    own = ("observation", "action", "multipliers", "multiplier_of", "max_budget")
    env_kwargs = {**env_kwargs, **{k: v for k, v in opts.items() if k not in own}}
    ep = run_episode(agent, env_kwargs, seed, env_kwargs.get("horizon"))
    return float(ep.metrics()["mean_time_in_system"])


def _observations(task: tuple[int, dict[str, Any]]) -> np.ndarray:
    """The raw load observations at the decision points of the initial policy (zero weights) on one draw."""
    from flowgym.lab.evaluation import run_episode

    seed, env_kwargs = task
    s = _SPEC
    policy = _policy(np.zeros(_n_weights(s)), s)
    agent = LearnedBudget.from_policy(policy, None, s["env_options"], s["action_repeat"])
    seen: list[np.ndarray] = []
    act = agent.act

    def record(observation: Any, view: Any) -> Any:
        if agent.decides_next:
            seen.append(np.asarray(observation, dtype=np.float64))
        return act(observation, view)

    agent.act = record  # type: ignore[method-assign]
    run_episode(agent, env_kwargs, seed, env_kwargs.get("horizon"))
    return np.stack(seen) if seen else np.zeros((0, len(s["obs_low"])))


class _Runner:
    """Runs tasks here (``workers == 1``) or in a process pool, results in task order."""

    def __init__(self, spec: dict[str, Any], workers: int) -> None:
        self.spec, self.pool, self.workers = spec, None, workers
        _init_worker(spec)
        if workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_init_worker, initargs=(spec,))

    def map(self, fn: Any, tasks: list[Any]) -> list[Any]:
        if self.pool is None:
            return [fn(t) for t in tasks]
        return list(self.pool.map(fn, tasks, chunksize=max(1, len(tasks) // (4 * self.workers))))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _log_scores(values: Sequence[float], n_candidates: int, n_draws: int,
                reference: Sequence[float] | None = None, hinge: float = 0.0) -> np.ndarray:
    """Minus the mean log time in system of each candidate over the draws where every candidate has one;
    with ``hinge > 0``, plus ``hinge`` times its log excess over ``reference`` (one value per draw) where it
    exceeds it (draws where the reference has no finite time are left out)."""
    v = np.asarray(values, dtype=np.float64).reshape(n_candidates, n_draws)
    ok = _scored_draws(v, reference, hinge)
    if not ok.any():
        return np.zeros(n_candidates)
    lv = np.log(v[:, ok])
    if hinge > 0 and reference is not None:
        lv = lv + hinge * np.maximum(0.0, lv - np.log(np.asarray(reference, dtype=np.float64)[ok]))
    return -lv.mean(axis=1)


def _scored_draws(v: np.ndarray, reference: Sequence[float] | None, hinge: float) -> np.ndarray:
    """The draws :func:`_log_scores` scores (``v``: candidates x draws): every candidate finished a request there
    and, with ``hinge > 0``, so did the reference."""
    ok = np.all(np.isfinite(v) & (v > 0), axis=0)
    if hinge > 0 and reference is not None:
        r = np.asarray(reference, dtype=np.float64)
        if r.shape != (v.shape[1],):
            raise ValueError(f"reference must hold one time per draw ({v.shape[1]}), got shape {r.shape}")
        ok &= np.isfinite(r) & (r > 0)
    return ok


def _unscorable(cfg: ARSConfig, unscored: int, empty: int) -> str:
    """Why a search whose selection draws never scored stops, naming what to change."""
    who = "the policy, or the reference rule (hinge > 0)," if cfg.hinge > 0 else "the policy"
    n = cfg.iterations * cfg.draws
    where = ("a cache too small for the requests: M_range or azure_M_range; too few arrivals: rho_range, "
             "overload_rho_range or horizon" if cfg.distribution is not None else
             "the scenario's cache, arrival rates or horizon")
    return (f"no selection draw (seeds {cfg.eval_seed}..{cfg.eval_seed + cfg.eval_episodes - 1}) could be scored: on "
            f"each, {who} finished no request under every policy evaluated; of the {n} training draws, {empty} "
            f"finished no request under any candidate and {unscored} were left out of the scores. Nothing was "
            f"trained; check {where}")


# --------------------------------------------------------------------------- the search


def _same_option(a: Any, b: Any) -> bool:
    """Whether two option values are the same (numbers by value, so 32 is 32.0; lists and tuples alike)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_option(x, y) for x, y in zip(a, b))
    if is_real(a) and is_real(b):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def _init_from(path: str, sizes: list[int], observation: str, env_options: dict[str, Any] | None = None,
               action_repeat: int | None = None, memory: int = 0) -> tuple[np.ndarray, tuple[Any, Any, float, float]]:
    """The weight vector (layer sizes ``sizes``) and the normalisation ``(mean, var, eps, clip)`` of the
    ``--algo ars`` model in ``path``; outputs it lacks copy its last output, inputs it lacks (a longer
    load observation that begins with its own) get zero weights. The normalisation covers the model's
    own inputs only. ``env_options`` (the search's agent options) and ``action_repeat``, when given, must be
    the model's (but for the longer load observation above and ``multiplier_of`` ``"max-head"`` to
    ``"max-drain"``): the same weights under another action, rate window or decision interval would be
    another policy. A model with a memory (:class:`MemoryArrayPolicy`) starts a search with a memory of as
    many units on the same observation (its memory's weights follow its network's); a memoryless model starts
    a search with a memory too (the network's weights on the memory start at zero, and the search adds the
    memory's own). Raises ``ValueError`` naming what does not fit."""
    from flowgym.envs.spaces import LOAD_OBSERVATIONS
    from flowgym.sim.estimators import FEATURE_VERSIONS

    agent = LearnedBudget(path)
    where = f"init: the model in {path!r}"
    if not isinstance(agent.model, ArrayPolicy):
        raise ValueError(f"{where} is a {agent.meta.get('algo')!r} model; only an --algo ars model (policy.npz) "
                         "can start the search")
    trained = agent.meta["agent_env_options"]  # what it was trained with (its needs leave out what it does not read)
    have = trained.get("observation")
    if have != observation:
        mine = FEATURE_VERSIONS[LOAD_OBSERVATIONS[observation]]
        theirs = FEATURE_VERSIONS.get(LOAD_OBSERVATIONS.get(have, 0), ())
        if not theirs or len(theirs) > len(mine) or mine[:len(theirs)] != theirs:
            raise ValueError(f"{where} sees observation={have!r}; this search's is {observation!r} (a model of the "
                             "same observation, or of a shorter load observation that begins this one's, is needed)")
    for key in sorted(set(env_options or {}) | set(trained)):
        if key == "observation":
            continue  # checked above
        theirs, mine = trained.get(key), (env_options or {}).get(key)
        if key == "multiplier_of" and (theirs, mine) == ("max-head", "max-drain"):
            continue  # the new output starts as a copy of k_safe: the drain term never decides
        if key not in trained or key not in (env_options or {}) or not _same_option(theirs, mine):
            said = f"{key}={theirs!r}" if key in trained else f"no {key} (it does not declare one)"
            now = f"{key}={mine!r}" if key in (env_options or {}) else f"no {key}"
            raise ValueError(f"{where} was trained with {said}; this search's is {now} (the same weights would "
                             "be another policy: start from a model of the same options)")
    if action_repeat is not None and agent.action_repeat != action_repeat:
        raise ValueError(f"{where} decides every {agent.action_repeat} slots (action_repeat); this search's "
                         f"action_repeat is {action_repeat}")
    theirs_m = getattr(agent.model, "memory", 0)
    if theirs_m and (theirs_m != memory or have != observation):
        raise ValueError(f"{where} has a memory of {theirs_m} units and sees observation={have!r}; this search's "
                         f"memory is {memory} and its observation {observation!r} (a model with a memory starts "
                         "only a search with the same memory and observation)")
    if theirs_m and not np.array_equal(agent.model.mem_leak, MemoryArrayPolicy.leaks(memory)):
        raise ValueError(f"{where} has memory leak rates {agent.model.mem_leak.tolist()}, not the search's "
                         f"{MemoryArrayPolicy.leaks(memory).tolist()}")
    layers = agent.model.layers
    old = [layers[0][0].shape[1]] + [w.shape[0] for w, _ in layers]
    if old[1:-1] != sizes[1:-1] or old[0] > sizes[0] or old[-1] > sizes[-1]:
        raise ValueError(f"{where} has layer sizes {old}; this search's are {sizes} (the same hidden layers, and "
                         "at most as many inputs and outputs, are needed)")
    parts = []
    for i, (w, b) in enumerate(layers):
        if i == 0 and w.shape[1] < sizes[0]:  # new inputs start unread
            w = np.hstack([w, np.zeros((w.shape[0], sizes[0] - w.shape[1]))])
        if i == len(layers) - 1 and w.shape[0] < sizes[-1]:  # new outputs copy the last one
            extra = sizes[-1] - w.shape[0]
            w = np.vstack([w] + [w[-1:]] * extra)
            b = np.concatenate([b] + [b[-1:]] * extra)
        parts += [w.reshape(-1), b]
    if theirs_m:
        parts += [agent.model.mem_u.reshape(-1), agent.model.mem_a.reshape(-1), agent.model.mem_b]
    with np.load(os.path.join(path, NORM_FILE), allow_pickle=False) as z:  # checked by LearnedBudget above
        norm = (z["obs_mean"].astype(np.float64), z["obs_var"].astype(np.float64), float(z["epsilon"]),
                float(z["clip_obs"]))
    return np.concatenate(parts), norm


def _new_input_mask(sizes: list[int], n_old: int) -> np.ndarray:
    """1 on the first layer's weights from inputs ``n_old..`` and on the last layer's biases, 0 elsewhere
    (the layout of :meth:`ArrayPolicy.from_vector`: per layer, its ``(out, in)`` weights row by row, then
    its biases). Raises ``ValueError`` if there is no new input."""
    if n_old >= sizes[0]:
        raise ValueError(f"search='new-inputs': the init model reads all {sizes[0]} inputs of this search's "
                         "observation; there is no new input to search (use a longer load observation)")
    mask = np.zeros(ArrayPolicy.n_weights(sizes))
    k = 0
    for li, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if li == 0:
            w = mask[k:k + a * b].reshape(b, a)  # a view
            w[:, n_old:] = 1.0
        k += a * b
        if li == len(sizes) - 2:
            mask[k:k + b] = 1.0
        k += b
    return mask


def train_ars(cfg: ARSConfig | None = None, *, on_iteration: Any = None, **overrides: Any) -> ARSResult:
    """Run the search; write the model directory ``cfg.out`` (``policy.npz``, ``normalization.npz``,
    ``flowgym_agent.json``, ``curves.csv``, and ``iterates.npy``: the weights after every update); return an
    :class:`ARSResult`.

    ``on_iteration(row)`` is called after every iteration with its row of ``curves.csv``.
    """
    from flowgym.lab.evaluation import Progress
    from flowgym.lab.scenarios import get_scenario
    from flowgym.lab.train import _agent_options, _versions, final_evaluation, learned_env_kwargs

    cfg = dataclasses.replace(cfg or ARSConfig(), **overrides)
    cfg.validate()
    sc = get_scenario(cfg.scenario, rate=cfg.rate)
    env_kw = learned_env_kwargs(sc.tune_env_kwargs(), cfg.max_budget, cfg.env_overrides, observation=cfg.observation,
                                action="log-multiplier", multipliers=cfg.multipliers,
                                multiplier_of=cfg.multiplier_of)
    env_options = _agent_options(env_kw)
    # an episode's arguments: the draw's (or the scenario's) without the agent's options, which
    # run_episode adds from the agent (as for any learned agent)
    base = {k: v for k, v in env_kw.items() if k not in env_options}
    if cfg.distribution is not None:
        from flowgym.lab.distributions import DRAW_KEYS, make_distribution

        sampler = make_distribution(cfg.distribution)
        # the draw's own load: its cache, arrivals, length and clock (a trace piece brings its time model; a
        # report scenario's, e.g. --scenario azure-conv's, would put every slot draw in continuous time)
        fixed = {k: v for k, v in base.items() if k not in DRAW_KEYS}

        def draw(seed: int) -> dict[str, Any]:
            return {**dict(sampler(np.random.default_rng(seed))), **fixed}
    else:
        if "horizon" not in base and not sc.finite:  # the environment's default episode, as the SB3 path trains on
            from flowgym.envs.flow_control import FlowControlConfig

            base["horizon"] = FlowControlConfig.horizon

        def draw(seed: int) -> dict[str, Any]:
            return dict(base)

    from flowgym.envs.flow_control import FlowControlEnv

    probe = FlowControlEnv(**{**draw(cfg.seed), **env_options})
    obs_low, obs_high = np.asarray(probe.observation_space.low), np.asarray(probe.observation_space.high)
    n_obs = int(obs_low.shape[0])
    # the network reads the observation and, with a memory, the memory after it
    sizes = [n_obs + cfg.memory, *[int(h) for h in cfg.hidden], int(probe.action_space.shape[0])]
    leak = MemoryArrayPolicy.leaks(cfg.memory) if cfg.memory else None
    spec = {"sizes": sizes, "obs_low": obs_low, "obs_high": obs_high,
            "env_options": env_options, "action_repeat": cfg.action_repeat, "leak": leak}
    n_w = _n_weights(spec)
    n_net = ArrayPolicy.n_weights(sizes)
    rng = np.random.default_rng(cfg.seed)
    theta = np.zeros(n_w)
    start = None if cfg.init is None else _init_from(cfg.init_path, sizes, cfg.observation, env_options,
                                                         cfg.action_repeat, memory=cfg.memory)
    mask = None  # the weights the search moves (None: all)
    if start is not None:
        theta[:len(start[0])] = start[0]  # the network's (and the memory's, from a model with one)
        if cfg.search == "new-inputs":
            if len(start[0]) == n_w and len(start[1][0]) == n_obs:  # a model with this memory and observation
                raise ValueError(f"search='new-inputs': the init model {cfg.init_path!r} has this search's memory "
                                 "and observation; there is no new input to search")
            mask = np.ones(n_w)  # the memory's weights move
            mask[:n_net] = _new_input_mask(sizes, len(start[1][0]))
    elif cfg.hidden:  # a network needs random hidden weights (the output layer starts at zero: every k = 1.41)
        k = 0
        for a, b in zip(sizes[:-2], sizes[1:-1]):
            theta[k:k + a * b] = rng.normal(0.0, 1.0 / math.sqrt(a), a * b)
            k += a * b + b
    if cfg.memory and (start is None or len(start[0]) == n_net):  # a fresh memory: random input weights, A = c = 0
        theta[n_net:n_net + cfg.memory * n_obs] = rng.normal(0.0, 1.0 / math.sqrt(n_obs), cfg.memory * n_obs)
    made_out = not os.path.exists(cfg.out)  # removed again if the run stops before writing anything
    os.makedirs(cfg.out, exist_ok=True)
    runner = _Runner(spec, cfg.workers)
    t0 = time.perf_counter()
    try:
        if start is None or len(start[1][0]) < n_obs:  # the features' mean and spread under zero weights
            obs = runner.map(_observations, [(cfg.seed - 1 - j, draw(cfg.seed - 1 - j)) for j in range(cfg.norm_draws)])
            allobs = np.concatenate(obs)
            mean, var = allobs.mean(axis=0), allobs.var(axis=0)
            eps, clip = 1e-8, 10.0
        if start is not None:  # the starting model's normalisation of its inputs, which its weights were found with
            m0, v0, eps, clip = start[1]
            if len(m0) < n_obs:  # new inputs: their fresh normalisation
                mean, var = np.concatenate([m0, mean[len(m0):]]), np.concatenate([v0, var[len(m0):]])
            else:
                mean, var = m0, v0
        norm = (mean, np.sqrt(var + eps), clip)

        eval_kw = [draw(cfg.eval_seed + j) for j in range(cfg.eval_episodes)]
        hinge = float(cfg.hinge)
        eval_ref = (runner.map(_reference_episode, [(cfg.eval_seed + j, eval_kw[j]) for j in range(cfg.eval_episodes)])
                    if hinge > 0 else None)

        def evaluate(th: np.ndarray) -> float:
            v = np.asarray(runner.map(_episode, [(th, norm, cfg.eval_seed + j, eval_kw[j])
                                                 for j in range(cfg.eval_episodes)]), dtype=np.float64)
            if not _scored_draws(v[None, :], eval_ref, hinge).any():  # nothing to score (not exp(0) = 1): never kept
                return math.inf
            return float(math.exp(-_log_scores(v, 1, len(v), eval_ref, hinge)[0]))

        bar = Progress(cfg.iterations, enabled=cfg.progress)
        rows: list[dict[str, Any]] = []
        best = (evaluate(theta), 0)  # the best evaluation and its update (its weights: iterates[update])
        episodes, decisions = cfg.eval_episodes + (len(eval_ref) if eval_ref is not None else 0), 0
        rows.append({"iteration": 0, "episodes": episodes, "decisions": 0, "wall_seconds": 0.0,
                     "eval_geo_time_in_system": best[0]})
        iterates = [theta.copy()]
        unscored = 0  # training draws left out of the scores: some candidate (or the reference) finished no request
        empty = 0  # of those, the draws where no candidate finished one
        for it in range(1, cfg.iterations + 1):
            seeds = [cfg.seed + (it - 1) * cfg.draws + j for j in range(cfg.draws)]
            kws = [draw(s) for s in seeds]
            deltas = rng.normal(size=(cfg.directions, n_w))
            if mask is not None:
                deltas *= mask
            cands = [theta + cfg.noise * d for d in deltas] + [theta - cfg.noise * d for d in deltas]
            ref = runner.map(_reference_episode, list(zip(seeds, kws))) if hinge > 0 else None
            vals = runner.map(_episode, [(c, norm, s, kw, cfg.input_noise) for c in cands for s, kw in zip(seeds, kws)])
            v = np.asarray(vals, dtype=np.float64).reshape(len(cands), cfg.draws)
            unscored += cfg.draws - int(_scored_draws(v, ref, hinge).sum())
            empty += int((~np.any(np.isfinite(v) & (v > 0), axis=0)).sum())
            scores = _log_scores(vals, len(cands), cfg.draws, ref, hinge)
            rp, rm = scores[:cfg.directions], scores[cfg.directions:]
            spread = float(np.std(scores))
            step = cfg.step_size / (cfg.directions * spread) * ((rp - rm) @ deltas) if spread > 0 else np.zeros(n_w)
            theta = theta + step
            iterates.append(theta.copy())
            episodes += len(vals) + (len(ref) if ref is not None else 0)
            decisions += sum(int(kw.get("horizon") or 0) for kw in kws) * len(cands) // cfg.action_repeat
            row: dict[str, Any] = {"iteration": it, "episodes": episodes, "decisions": decisions,
                                   "wall_seconds": time.perf_counter() - t0,
                                   "train_log_time_in_system": float(-scores.mean()),
                                   "step_norm": float(np.linalg.norm(step))}
            if it % cfg.eval_every == 0 or it == cfg.iterations:
                e = evaluate(theta)
                episodes += cfg.eval_episodes
                row["eval_geo_time_in_system"] = e
                if e < best[0]:
                    best = (e, it)
            rows.append(row)
            bar.update(f"iteration {it}, best {best[0]:.2f} at {best[1]}")
            if on_iteration is not None:
                on_iteration(row)
        bar.close()
    finally:
        runner.close()
    wall = time.perf_counter() - t0
    if not math.isfinite(best[0]):  # not one selection episode could be scored: nothing was measured
        if made_out and not os.listdir(cfg.out):
            os.rmdir(cfg.out)
        raise ValueError(_unscorable(cfg, unscored, empty))
    if unscored and cfg.progress:  # recorded in flowgym_agent.json either way
        print(f"note: {unscored} of the {cfg.iterations * cfg.draws} training draws were left out of the scores "
              f"(some candidate{', or the reference rule,' if hinge > 0 else ''} finished no request there; "
              f"on {empty} no candidate did)", file=sys.stderr)

    policy = _policy(iterates[best[1]], spec)
    seed_ranges = cfg.seed_ranges()
    norm_from: Any = list(seed_ranges["normalisation"])
    if start is not None:
        norm_from = f"from {cfg.init_path}" + ("" if len(start[1][0]) == n_obs else f"; its new inputs from {norm_from}")
    np.savez(os.path.join(cfg.out, ARRAYS_FILE), **policy.arrays())
    np.savez(os.path.join(cfg.out, NORM_FILE), obs_low=obs_low, obs_high=obs_high, obs_mean=mean, obs_var=var,
             epsilon=np.float64(eps), clip_obs=np.float64(clip))
    meta = {
        "format": FORMAT_VERSION,
        "algo": "ars",
        "algo_class": "flowgym.lab.ars:train_ars",
        "scenario": sc.name,
        "rate": cfg.rate,
        "scenario_data": sc.to_dict(),
        "trained_on": "scenario" if cfg.distribution is None else cfg.hyperparameters()["distribution"],
        "observation": cfg.observation,
        "action": "log-multiplier",
        "env_kwargs": env_kw,
        "agent_env_options": env_options,
        "observation_shape": [int(obs_low.shape[0])],
        "action_n": 0,
        "action_space": describe_action_space(policy.action_space),
        "action_repeat": int(cfg.action_repeat),
        "budget_levels": None,
        "action_rule": "mode",
        "layer_sizes": sizes,
        **({"memory": cfg.memory} if cfg.memory else {}),
        "hyperparameters": cfg.hyperparameters(),
        "seeds": {"train": list(seed_ranges["training"]),
                  "normalisation": norm_from,
                  "eval_during_training": [cfg.eval_seed + i for i in range(cfg.eval_episodes)],
                  "tune": [1000 + i for i in range(cfg.tune_seeds)],
                  "report": list(range(cfg.final_eval_seeds))},
        "selected": "best",
        "best_iteration": best[1],
        "best_eval_time_in_system": best[0],
        "unscored_draws": unscored,
        "episodes": episodes,
        "decisions": decisions,
        "wall_seconds": wall,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": _versions(("gymnasium", "numpy")),  # ARS needs neither torch nor SB3
    }

    with open(os.path.join(cfg.out, META_FILE), "w") as fh:
        _json.dump(meta, fh, indent=1)
    np.save(os.path.join(cfg.out, ITERATES_FILE), np.stack(iterates))
    with open(os.path.join(cfg.out, "curves.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(CURVE_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    res = ARSResult(cfg.out, cfg.iterations, episodes, wall, best[1], best[0], rows)
    if cfg.final_eval_seeds > 0:
        res.table = final_evaluation(cfg.out, seeds=list(range(cfg.final_eval_seeds)),
                                     tune_seeds=[1000 + i for i in range(cfg.tune_seeds)], progress=cfg.progress)
    return res
