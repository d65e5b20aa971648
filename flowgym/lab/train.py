"""Train a learned activation budget with Stable-Baselines3 (``flowgym train``).

:func:`train` trains an SB3 algorithm (PPO by default) on a named scenario
(:mod:`flowgym.lab.scenarios`, ``adaptive-mix`` by default) with

* vectorised environments (``DummyVecEnv`` by default, ``SubprocVecEnv`` on request)
  over ``gym.make("FlowControl-v0", ...)`` with the flat observation, each decision
  held for ``action_repeat`` slots;
* observation and reward normalisation (``VecNormalize``; its statistics are saved
  with the model);
* evaluation during training (a subclass of SB3's ``EvalCallback``) on separate
  seeds, recording the return *and* the latency metrics of each evaluation
  episode, acting by ``action_rule`` as :class:`flowgym.agents.LearnedBudget` will; the
  model with the lowest mean time in system is kept;
* checkpoints, a progress bar on stderr, a CSV (and optionally PNG) of the curves;
* a final evaluation table against the scenario's baselines (fixed budget tuned by
  grid search on tuning seeds, greedy baselines) through
  :func:`flowgym.lab.evaluation.evaluate`, the same path every scripted agent takes.

The result is a directory that :class:`flowgym.agents.LearnedBudget` loads::

    <out>/policy.pt            the selected policy as plain tensors (what LearnedBudget loads)
    <out>/normalization.npz    its observation normalisation and bounds as plain arrays
    <out>/model.zip            the same policy in SB3's zip (to continue training; pickle inside)
    <out>/vecnormalize.pkl     its VecNormalize (pickle; read by LearnedBudget only with trust=True)
    <out>/flowgym_agent.json   scenario, environment arguments, hyperparameters, seeds, timings
    <out>/curves.csv           training reward and evaluation metrics against steps
    <out>/curves.png           the same, plotted (when matplotlib is installed)
    <out>/eval.txt|.csv|.json  the final evaluation table (unless disabled)
    <out>/checkpoints/         periodic checkpoints (model + normalisation)
    <out>/last_model.zip, last_vecnormalize.pkl   the policy at the end of training

Seeds: training environments ``seed, seed + 1, ...`` (default 10,000..), evaluation
during training ``eval_seed..`` (default 20,000..), tuning of the baselines 1000..,
reports 0..N-1. Stable-Baselines3 and torch are imported lazily: ``import flowgym``
works without them; :func:`train` raises an ``ImportError`` naming the
``flowgym[train]`` extra when they are missing.
"""

from __future__ import annotations

import contextlib
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
    ACTION_RULES,
    ALGORITHMS,
    FORMAT_VERSION,
    LSTM_KWARGS,
    META_FILE,
    MODEL_FILE,
    VECNORM_FILE,
    LearnedBudget,
    algorithm_class,
    describe_action_space,
    is_recurrent,
    policy_action,
    policy_alias,
    recurrent_action,
    require_sb3,
    valid_levels,
    write_safe,
)
from flowgym.envs.flow_control import MAX_COUNT, OBSERVATION_OPTIONS
from flowgym.sim import _json
from flowgym.sim._checks import is_finite_real, is_real

__all__ = [
    "TrainConfig",
    "TrainResult",
    "train",
    "learned_env_kwargs",
    "make_vec_env",
    "final_evaluation",
    "plot_curves",
    "train_search",
    "SEARCH_SPACE",
    "DEFAULT_TRAIN_MINUTES",
    "GENERALIST_TRAIN_MINUTES",
]

CURVES_FILE = "curves.csv"
#: Wall minutes of the default ``flowgym train`` on 2 CPU cores (measured; docs/training.md).
DEFAULT_TRAIN_MINUTES = 6
#: Wall minutes of the default ``flowgym train`` (the generalist: ``--algo ars``, 2 processes) on 2 CPU
#: cores (measured; docs/training.md). PPO's generalist (``--algo ppo``) took 9-15.
GENERALIST_TRAIN_MINUTES = 25
#: PPO's generalist's actions, ``B_t = k * (arrival rate)`` for these ``k`` (starts per arrival); their
#: smallest and largest are the range of the ARS generalist's two multipliers (``ARSConfig.multipliers``).
GENERALIST_MULTIPLIERS = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
#: The PPO generalist's training distribution (``examples/ppo_generalist``): ``RandomMix`` as it was before
#: 2026-11-26, so ``flowgym train --algo ppo`` still reproduces that model.
PPO_GENERALIST_DISTRIBUTION = {"kind": "random-mix", "phase_scale": "uniform", "trace_p": 0.0}


#: The most vectorised environments (and torch threads) a training run takes.
MAX_N_ENVS = 4096


@dataclass
class TrainConfig:
    """Every setting of :func:`train`, with the defaults of ``flowgym train``.

    The defaults train PPO on ``adaptive-mix`` in about 6 minutes on 2 CPU cores
    (``total_timesteps=1_000_000`` decisions, each held for ``action_repeat=8`` slots,
    the scenario's log-spaced budget levels, 8 evaluation episodes per evaluation; measured
    2026-11-23 on an idle machine: 3,038 decisions (24,306 slots) per second with 8
    environments in one process, 330 s, then about 15 s of final evaluation, 345 s in all;
    see ``docs/training.md``).
    """

    #: A named scenario (:data:`flowgym.lab.scenarios.SCENARIOS`), a scenario file (``.toml`` or
    #: ``.json``, docs/scenarios.md) or scenario data (a dict, as in such a file).
    scenario: str | dict[str, Any] = "adaptive-mix"
    #: Its ``rate`` argument (``None``: the scenario's default).
    rate: float | None = None
    #: ``ppo``, ``a2c``, ``dqn`` or ``"package.module:Class"`` of any SB3-compatible algorithm.
    algo: str = "ppo"
    #: Decisions of training (SB3 timesteps, summed over the vectorised environments);
    #: the environments run ``action_repeat`` times as many slots.
    total_timesteps: int = 1_000_000
    #: Number of environments stepped together.
    n_envs: int = 8
    #: ``"auto"`` (the batched SB3 VecEnv, :class:`flowgym.envs.sb3.FlowControlSB3VecEnv`, where the
    #: configuration allows it, else ``"dummy"``; :func:`batched_reason` says why not), ``"batched"``
    #: (that VecEnv, or an error naming why it cannot), ``"dummy"`` (SB3's ``DummyVecEnv`` over
    #: ``gym.make`` environments, one process) or ``"subproc"`` (one process per environment).
    vec_env: str = "auto"
    #: Seed of the algorithm and of the first training environment (the others: ``seed + i``).
    seed: int = 10_000
    learning_rate: float = 3e-4
    #: Rollout length per environment (PPO, A2C).
    n_steps: int = 512
    #: Minibatch size (PPO, DQN).
    batch_size: int = 256
    #: Optimisation epochs per rollout (PPO).
    n_epochs: int = 10
    gamma: float = 0.99
    gae_lambda: float = 0.95
    #: PPO clip range.
    clip_range: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    #: Hidden layers of the policy and value networks.
    net_arch: tuple[int, ...] = (64, 64)
    #: Initial log standard deviation of a Gaussian policy (continuous actions,
    #: ``action="log-multiplier"``, whose range is ``[-1, 1]``); ``None``: SB3's default, 0.
    log_std_init: float | None = None
    #: Extra keyword arguments of the algorithm's constructor (override the above).
    algo_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Largest budget the learned policy may choose (its action is ``Discrete(max_budget + 1)``).
    #: ``None``: the scenario's ``learned_max_budget``, 16 on most (it keeps exploration near the
    #: useful range: their best fixed budgets are 4..14) and 64 on ``adaptive-mix`` (whose chat
    #: phase needs about 40).
    max_budget: int | None = None
    #: The budgets the policy chooses among (ascending, distinct, >= 0), e.g. log-spaced
    #: ``(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64)``: the action is the index of a level,
    #: and the environment's ``max_budget`` is the largest level. ``None``: every budget
    #: ``0..max_budget``. Both unset: the scenario's defaults (``learned_budget_levels``, else every
    #: budget up to ``learned_max_budget``); ``max_budget`` alone: every budget up to it.
    budget_levels: tuple[int, ...] | None = None
    #: Slots each decision is held for (1: a decision every slot). ``total_timesteps`` counts
    #: decisions; the environment runs ``action_repeat`` times as many slots.
    action_repeat: int = 8
    #: Train on a distribution of workloads instead of the scenario's one: ``"random-mix"``
    #: (:class:`flowgym.lab.distributions.RandomMix`), its mapping ``{"kind": "random-mix", ...}`` or a
    #: callable ``rng -> FlowControl-v0 arguments``; a new draw every episode, evaluation during
    #: training on fixed draws (seeds ``eval_seed..``). The scenario is then only the report scenario
    #: of the final table (zero-shot). Needs a load observation (``"load"``, ``"load-v2"``, ``"load-v3"``, ``"load-v4"``). ``None``: train on the scenario.
    distribution: Any = None
    #: The policy's observation: ``"flat"`` (the environment's flat observation), ``"load"`` (the
    #: scale-free load features, :mod:`flowgym.sim.estimators`; any ``M``, rate and length scale) or
    #: ``"load-v2"`` (those and three more) or ``"load-v3"`` (those and the backlog's moving averages) or
    #: ``"load-v4"`` (those and how much the load swung over the last thousand slots).
    observation: str = "flat"
    #: The policy's action: ``"budget"`` (a budget, or the index of one of ``budget_levels``) or
    #: ``"multiplier"`` (the index of a multiplier ``k`` of the online safe budget ``M / E_hat[w]``
    #: or of the arrival rate, ``multiplier_of``; capped at ``max_budget``, default 256) or
    #: ``"log-multiplier"`` (one float in ``[-1, 1]``, two with ``multiplier_of="max"`` or ``"max-head"``, a
    #: multiplier between the smallest and the largest of ``multipliers`` on a log scale, for a Gaussian policy;
    #: ``FlowControlConfig.action``).
    action: str = "budget"
    #: The multipliers of ``action="multiplier"``.
    multipliers: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    #: What they multiply: ``"safe"`` (``M / E_hat[w]``), ``"rate"`` (the arrival rate), or another
    #: choice of ``FlowControlConfig.multiplier_of`` (``"max"`` or ``"max-head"``: both, with
    #: ``action="log-multiplier"``).
    multiplier_of: str = "safe"
    #: Overrides of the scenario's environment arguments for training and for the agent
    #: (e.g. ``{"reward_weights": {...}}``); the workload is always the scenario's.
    env_overrides: dict[str, Any] = field(default_factory=dict)
    norm_obs: bool = True
    norm_reward: bool = True
    clip_obs: float = 10.0
    #: Evaluate every this many decisions (0: never; then the last model is kept).
    eval_freq: int = 50_000
    #: Episodes per evaluation (one per evaluation environment; the same seeds every time, so
    #: checkpoints are compared on common arrivals). 8: on adaptive-mix one episode's time in
    #: system varies by 25-30% across seeds, and the paired difference of two close policies has
    #: a standard error of 3.9% of their mean with 2 episodes, 2.0% with 8 (docs/training.md,
    #: "Model selection"); 2 episodes kept policies no better than a fixed budget on fresh seeds.
    eval_episodes: int = 8
    #: First seed of the evaluation episodes (the same seeds at every evaluation).
    eval_seed: int = 20_000
    #: Save a checkpoint every this many decisions (0: never).
    checkpoint_freq: int = 200_000
    #: Reporting seeds ``0..final_eval_seeds-1`` of the final table (0: no final table).
    final_eval_seeds: int = 3
    #: Tuning seeds ``1000..`` of the baselines in the final table.
    tune_seeds: int = 2
    #: Output directory.
    out: str = "runs/ppo-adaptive-mix"
    #: How the trained policy picks a budget, in evaluations and in :class:`flowgym.agents.LearnedBudget`:
    #: ``"mean"`` (expected budget of its action distribution, rounded; with ``budget_levels`` the
    #: expected level index, rounded, then its level) or ``"mode"`` (its argmax,
    #: SB3's ``deterministic=True``). See :func:`flowgym.agents.learned.policy_action`.
    action_rule: str = "mean"
    #: ``"best"`` (lowest evaluation time in system) or ``"last"``: which policy becomes ``model.zip``.
    select: str = "best"
    progress: bool = True
    #: Torch threads (1 is fastest for these small networks on a small machine).
    torch_threads: int = 1
    device: str = "cpu"
    #: Write ``curves.png`` (needs matplotlib; skipped with a note when missing).
    plot: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid setting."""

        def pos_int(name: str, v: Any, zero: bool = False) -> None:
            hi = MAX_N_ENVS if name in ("n_envs", "torch_threads") else MAX_COUNT  # processes/arrays vs. counts
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not (0 if zero else 1) <= v <= hi:
                raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} integer "
                                 f"(at most {hi:g}), got {v!r}")

        def pos_num(name: str, v: Any, zero: bool = False) -> None:
            if not is_finite_real(v) or v < 0 or (v == 0 and not zero):
                raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} number, got {v!r}")

        from flowgym.lab.scenarios import get_scenario

        get_scenario(self.scenario, rate=self.rate)  # raises naming the file, key and allowed values
        if self.algo not in ALGORITHMS and ":" not in self.algo:
            raise ValueError(f"algo must be one of {sorted(ALGORITHMS)} or 'package.module:Class', got {self.algo!r}")
        for name in ("total_timesteps", "n_envs", "n_steps", "batch_size", "n_epochs",
                     "eval_episodes", "torch_threads", "action_repeat"):
            pos_int(name, getattr(self, name))
        if self.max_budget is not None:
            pos_int("max_budget", self.max_budget)
        if self.budget_levels is not None:
            if not valid_levels(self.budget_levels):
                raise ValueError(f"budget_levels must be at least two ascending distinct non-negative integers, "
                                 f"got {self.budget_levels!r}")
            lv = list(self.budget_levels)
            if self.max_budget is not None and self.max_budget != lv[-1]:
                raise ValueError(f"max_budget ({self.max_budget}) must be the largest of budget_levels ({lv[-1]}) "
                                 f"or left unset")
        for name in ("eval_freq", "checkpoint_freq", "final_eval_seeds", "tune_seeds", "seed", "eval_seed"):
            pos_int(name, getattr(self, name), zero=True)
        check_tune_seeds(self.scenario, self.rate, self.final_eval_seeds, self.tune_seeds)
        pos_num("learning_rate", self.learning_rate)
        pos_num("clip_range", self.clip_range)
        pos_num("clip_obs", self.clip_obs)
        pos_num("max_grad_norm", self.max_grad_norm)
        pos_num("ent_coef", self.ent_coef, zero=True)
        pos_num("vf_coef", self.vf_coef, zero=True)
        if self.log_std_init is not None and (isinstance(self.log_std_init, bool)
                                              or not isinstance(self.log_std_init, (int, float))
                                              or not is_finite_real(self.log_std_init)):
            raise ValueError(f"log_std_init must be a finite number or None, got {self.log_std_init!r}")
        if self.log_std_init is not None and self.action != "log-multiplier":
            raise ValueError(f"log_std_init sets a Gaussian policy's spread: it needs action='log-multiplier', "
                             f"got action={self.action!r}")
        for name in ("gamma", "gae_lambda"):
            v = getattr(self, name)
            if not is_real(v) or not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")
        if self.vec_env not in ("auto", "batched", "dummy", "subproc"):
            raise ValueError(f"vec_env must be 'auto', 'batched', 'dummy' or 'subproc', got {self.vec_env!r}")
        if self.action_rule not in ACTION_RULES:
            raise ValueError(f"action_rule must be one of {list(ACTION_RULES)}, got {self.action_rule!r}")
        if self.select not in ("best", "last"):
            raise ValueError(f"select must be 'best' or 'last', got {self.select!r}")
        arch = list(self.net_arch)
        if not arch or any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in arch):
            raise ValueError(f"net_arch must be a non-empty list of positive layer sizes, got {self.net_arch!r}")
        if not isinstance(self.algo_kwargs, Mapping):
            raise ValueError(f"algo_kwargs must be a mapping, got {self.algo_kwargs!r}")
        pk = self.algo_kwargs.get("policy_kwargs", {})
        if not isinstance(pk, Mapping) or set(pk) - set(POLICY_KWARGS):
            raise ValueError(f"algo_kwargs: policy_kwargs may only hold {', '.join(POLICY_KWARGS)} (what the "
                             f"model directory records and loads), got {pk!r}")
        if not isinstance(self.env_overrides, Mapping):
            raise ValueError(f"env_overrides must be a mapping, got {self.env_overrides!r}")
        from flowgym.envs.flow_control import FlowControlConfig

        FlowControlConfig.check_names(self.env_overrides, "env_overrides: ")
        for bad in ("workload", "observation", "max_budget"):
            if bad in self.env_overrides:
                raise ValueError(f"env_overrides may not set {bad!r}: the scenario gives the workload (write your "
                                 "own in a scenario file: flowgym scenario show adaptive-mix > my.toml, edit it, then "
                                 "--scenario my.toml; docs/scenarios.md), observation= is the training setting of that name, "
                                 "and max_budget= or budget_levels= set the action range")
        if self.distribution is not None:  # each draw sets these: an override would be dropped silently
            from flowgym.lab.distributions import check_overrides

            check_overrides(self.env_overrides)
        from flowgym.envs.spaces import LOAD_OBSERVATIONS, one_of

        if self.observation not in ("flat", *LOAD_OBSERVATIONS):
            raise ValueError(f"observation must be {one_of(('flat', *LOAD_OBSERVATIONS))}, got {self.observation!r}")
        if self.action not in ("budget", "multiplier", "log-multiplier"):
            raise ValueError(f"action must be 'budget', 'multiplier' or 'log-multiplier', got {self.action!r}")
        if self.action != "budget" and self.budget_levels is not None:
            raise ValueError(f"budget_levels are the actions of action='budget'; action={self.action!r} chooses "
                             "among multipliers= instead")
        from flowgym.envs.flow_control import FlowControlConfig

        # with action='budget' the environment is built without them (learned_env_kwargs): values other than the
        # defaults would be dropped, so FlowControlConfig refuses them, as the environment does
        FlowControlConfig(multipliers=tuple(self.multipliers), multiplier_of=self.multiplier_of,
                          action=self.action).validate()  # names a bad value
        if self.distribution is not None:
            from flowgym.lab.distributions import make_distribution

            make_distribution(self.distribution)  # raises naming the field
            if self.observation not in LOAD_OBSERVATIONS:
                raise ValueError(f"distribution= needs observation={one_of(tuple(LOAD_OBSERVATIONS))} (the flat "
                                 "observation's bounds and meaning change with M and the request scale)")
        if not self.out:
            raise ValueError("out (the output directory) must be given")

    @classmethod
    def generalist(cls, **overrides: Any) -> TrainConfig:
        """The recipe of the shipped generalist (``flowgym train`` with no scenario; docs/training.md).

        PPO on :class:`~flowgym.lab.distributions.RandomMix` draws (as they were when it was trained:
        uniform phase lengths, no Azure trace pieces; :data:`PPO_GENERALIST_DISTRIBUTION`), scale-free observation,
        the action a multiplier of the arrival rate (:data:`GENERALIST_MULTIPLIERS`), discount
        0.995, 1M decisions, evaluated every 100k on 12 fixed draws (geometric mean of the time
        in system), reported zero-shot on ``adaptive-mix``.
        """
        base: dict[str, Any] = dict(
            distribution=dict(PPO_GENERALIST_DISTRIBUTION), observation="load", action="multiplier", multiplier_of="rate",
            multipliers=GENERALIST_MULTIPLIERS, gamma=0.995, total_timesteps=1_000_000, eval_freq=100_000,
            eval_episodes=12, checkpoint_freq=0, scenario="adaptive-mix", out="runs/ppo-generalist",
        )
        if overrides.get("action") == "budget":  # the generalist's multipliers shape its multiplier action only
            for k in ("multipliers", "multiplier_of"):
                if k not in overrides:
                    base.pop(k)
        base.update(overrides)
        return cls(**base)

    def hyperparameters(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["net_arch"] = list(self.net_arch)
        d["multipliers"] = list(self.multipliers)
        if self.distribution is not None and not isinstance(self.distribution, (str, Mapping)):
            d["distribution"] = repr(self.distribution)
        elif self.distribution is not None:
            from flowgym.lab.distributions import make_distribution

            dist = make_distribution(self.distribution)
            d["distribution"] = dist.to_spec() if hasattr(dist, "to_spec") else repr(dist)
        return d


@dataclass
class TrainResult:
    """What :func:`train` produced."""

    out: str
    #: Environment steps actually run.
    timesteps: int
    wall_seconds: float
    #: Environment steps per second during training (learning included).
    steps_per_second: float
    #: Rows of the curves (``kind`` ``train`` or ``eval``).
    curves: list[dict[str, Any]]
    #: ``"best"`` or ``"last"``: which policy is ``model.zip``.
    selected: str
    #: The final evaluation table (``None`` when disabled).
    table: Any = None


class _RuleModel:
    """Wraps an SB3 model so ``predict`` applies an action rule (for ``EvalCallback``); a recurrent model's
    LSTM state goes through, as :class:`flowgym.agents.LearnedBudget` carries it."""

    def __init__(self, model: Any, rule: str) -> None:
        self._model, self._rule = model, rule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None, deterministic: bool = True) -> Any:
        if is_recurrent(self._model):
            return recurrent_action(self._model, obs, state, episode_start, self._rule)
        return policy_action(self._model, obs, self._rule), state


def learned_env_kwargs(scenario_env: Mapping[str, Any], max_budget: int,
                       overrides: Mapping[str, Any] | None = None, *, observation: str = "flat",
                       action: str = "budget", multipliers: Sequence[float] | None = None,
                       multiplier_of: str = "safe") -> dict[str, Any]:
    """Environment arguments of a learned agent: the scenario's, the overrides, its observation
    (``flat`` or ``load``) and action (a budget up to ``max_budget``, or a multiplier of the safe budget)."""
    kw = {**dict(scenario_env), **dict(overrides or {})}
    kw["observation"] = observation
    kw["max_budget"] = int(max_budget)
    if action != "budget":
        kw["action"] = action
        if multipliers is None:
            from flowgym.envs.flow_control import FlowControlConfig

            multipliers = FlowControlConfig().multipliers
        kw["multipliers"] = tuple(float(k) for k in multipliers)
        kw["multiplier_of"] = multiplier_of
    return kw


def _action_repeat_wrapper() -> type:
    import gymnasium as gym

    class ActionRepeat(gym.Wrapper):
        """Holds each action for ``repeat`` slots (fewer, coarser decisions); the reward is their sum.

        Stops early when the episode ends. :class:`flowgym.agents.LearnedBudget` repeats its
        actions the same way, so it acts as it was trained.
        """

        def __init__(self, env: Any, repeat: int) -> None:
            super().__init__(env)
            self.repeat = int(repeat)

        def step(self, action: Any) -> Any:
            total = 0.0
            for _ in range(self.repeat):
                obs, r, te, tr, info = self.env.step(action)
                total += float(r)
                if te or tr:
                    break
            return obs, total, te, tr, info

    return ActionRepeat


def _budget_levels_wrapper() -> type:
    import gymnasium as gym

    class BudgetLevels(gym.ActionWrapper):
        """The action is the index of a budget level: ``Discrete(len(levels))`` -> ``levels[a]``.

        :class:`flowgym.agents.LearnedBudget` maps its actions the same way (``budget_levels`` in
        ``flowgym_agent.json``).
        """

        def __init__(self, env: Any, levels: Sequence[int]) -> None:
            super().__init__(env)
            self.levels = [int(v) for v in levels]
            self.action_space = gym.spaces.Discrete(len(self.levels))

        def action(self, action: Any) -> int:
            return self.levels[int(action)]

    return BudgetLevels


def batched_reason(env_kwargs: Mapping[str, Any], action_repeat: int = 1, distribution: Any = None) -> str | None:
    """Why training cannot run on the batched VecEnv (naming the argument), or ``None`` when it can."""
    if distribution is not None:
        return "distribution= (each environment draws its own workload)"
    from flowgym.envs.flow_control import FlowControlConfig
    from flowgym.envs.vector import batched_unsupported

    cfg = FlowControlConfig.from_any(dict(env_kwargs))
    why = batched_unsupported(cfg)
    if why is not None:
        return why
    if cfg.horizon is None or cfg.horizon % action_repeat:
        return (f"horizon={cfg.horizon} is not a multiple of action_repeat={action_repeat} (the batched "
                "environments end their episodes together, between two decisions)")
    return None


def _vec_repeat_wrapper() -> type:
    from gymnasium import spaces
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class VecRepeatLevels(VecEnvWrapper):
        """Action repeat and budget levels on a whole VecEnv (the batched one): each decision held for
        ``repeat`` slots, rewards summed; with ``levels`` the action is a level's index. The batched
        environments share one horizon, a multiple of ``repeat``, so all episodes end together at
        the end of a decision (as :func:`_action_repeat_wrapper` ends them one by one)."""

        def __init__(self, venv: Any, repeat: int, levels: Sequence[int] | None) -> None:
            space = spaces.Discrete(len(levels)) if levels is not None else venv.action_space
            super().__init__(venv, action_space=space)
            self.repeat = int(repeat)
            self.levels = None if levels is None else np.asarray(levels, dtype=np.int64)
            self._actions: Any = None

        def reset(self) -> Any:
            return self.venv.reset()

        def step_async(self, actions: np.ndarray) -> None:
            a = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)
            self._actions = a if self.levels is None else self.levels[a]

        def step_wait(self) -> Any:
            total = np.zeros(self.num_envs, dtype=np.float32)
            for _ in range(self.repeat):
                self.venv.step_async(self._actions)
                obs, rew, dones, infos = self.venv.step_wait()
                total += rew
                if dones.any():
                    break
            return obs, total, dones, infos

    return VecRepeatLevels


def _metrics_wrapper() -> type:
    import gymnasium as gym

    class EpisodeMetrics(gym.Wrapper):
        """Adds the latency metrics of the finished episode to the last step's ``info``."""

        KEYS = ("avg_latency", "p95_latency", "mean_time_in_system", "request_throughput",
                "token_throughput", "evictions", "completed")

        def step(self, action: Any) -> Any:
            obs, r, te, tr, info = self.env.step(action)
            if te or tr:
                m = self.env.unwrapped.metrics()
                info["flowgym_metrics"] = {k: float(m[k]) for k in self.KEYS}
            return obs, r, te, tr, info

    return EpisodeMetrics


def make_vec_env(env_kwargs: Mapping[str, Any], n_envs: int, seed: int, *, kind: str = "dummy",
                 metrics: bool = False, action_repeat: int = 1,
                 budget_levels: Sequence[int] | None = None, distribution: Any = None) -> Any:
    """``n_envs`` FlowControl-v0 environments (``gym.make``) in an SB3 VecEnv, seeded ``seed + i``.

    Each is wrapped in SB3's ``Monitor`` (episode returns), with ``action_repeat > 1``
    in a wrapper holding each action for that many slots, with ``budget_levels`` in one
    whose action is the index of a level and, with ``metrics``, in a wrapper adding the
    episode's latency metrics to the last ``info``. With ``distribution`` (a name, mapping or
    sampler) each environment is a :class:`~flowgym.envs.randomized.RandomizedFlowControlEnv`
    drawing its workload from it, with ``env_kwargs`` applied over every draw.
    """
    require_sb3()
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import flowgym  # noqa: F401  (registers FlowControl-v0)

    kw = dict(env_kwargs)
    if kind in ("auto", "batched"):
        why = ("evaluation environments (they report each episode's latency metrics)" if metrics
               else batched_reason(kw, action_repeat, distribution))
        if why is None:
            from stable_baselines3.common.vec_env import VecMonitor  # noqa: F401  (SB3 check)

            from flowgym.envs.sb3 import FlowControlSB3VecEnv

            venv = FlowControlSB3VecEnv(n_envs, **kw)
            venv.seed(seed)
            return _vec_repeat_wrapper()(venv, action_repeat, budget_levels)
        if kind == "batched":
            raise ValueError(f"vec_env='batched' cannot run this configuration: {why}; use vec_env='auto' or 'dummy'")
        kind = "dummy"
    layers: list[Any] = []
    if action_repeat > 1:
        layers.append(lambda e, _cls=_action_repeat_wrapper(): _cls(e, action_repeat))
    if budget_levels is not None:
        layers.append(lambda e, _cls=_budget_levels_wrapper(): _cls(e, budget_levels))
    if metrics:
        layers.append(_metrics_wrapper())

    def wrapper(env: Any) -> Any:
        for layer in layers:
            env = layer(env)
        return env

    cls = SubprocVecEnv if kind == "subproc" else DummyVecEnv
    if distribution is not None:
        from flowgym.envs.randomized import RandomizedFlowControlEnv
        from flowgym.lab.distributions import DRAW_KEYS, make_distribution

        sampler = make_distribution(distribution)
        fixed = {k: v for k, v in kw.items() if k not in DRAW_KEYS}  # the draw's load and clock are its own
        return sb3_make_vec_env(lambda **_: RandomizedFlowControlEnv(sampler, **fixed), n_envs=n_envs, seed=seed,
                                vec_env_cls=cls, wrapper_class=wrapper if layers else None)
    return sb3_make_vec_env(lambda **_: gym.make("FlowControl-v0", **kw), n_envs=n_envs, seed=seed,
                            vec_env_cls=cls, wrapper_class=wrapper if layers else None)


# --------------------------------------------------------------------------- callbacks


def _callbacks(cfg: TrainConfig, eval_venv: Any, n_eval: int, out: str, t_start: float,
               on_eval: Any = None) -> tuple[Any, Any]:
    """The callback list of a run and the recorder holding the curves."""
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback, EvalCallback

    class Recorder(BaseCallback):
        """Mean raw (unnormalised) reward per step of each rollout, a progress bar, the curves."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, Any]] = []
            self._sum, self._n = 0.0, 0
            self._last_print = 0.0
            self._done = False
            self.last_eval: dict[str, float] = {}

        def _on_step(self) -> bool:
            venv = self.training_env
            raw = venv.get_original_reward() if hasattr(venv, "get_original_reward") else self.locals.get("rewards")
            if raw is not None:
                self._sum += float(np.sum(raw))
                self._n += int(np.size(raw))
            if cfg.progress and not self._done:
                now = time.perf_counter()
                self._done = self.num_timesteps >= cfg.total_timesteps
                if now - self._last_print > 1.0 or self._done:  # the full bar once, then silence
                    self._last_print = now
                    self._bar(now)
            return True

        def _bar(self, now: float) -> None:
            frac = min(1.0, self.num_timesteps / cfg.total_timesteps)
            el = now - t_start
            eta = el / frac - el if frac > 0 else 0.0
            sps = self.num_timesteps / el if el > 0 else 0.0
            bar = "#" * int(frac * 30)
            ev = ""
            if self.last_eval:
                ev = f" eval time-in-sys {self.last_eval['mean_time_in_system']:.1f}"
            sys.stderr.write(f"\r[{bar:<30}] {self.num_timesteps}/{cfg.total_timesteps} {el:5.0f}s "
                             f"eta {eta:4.0f}s {sps:6.0f} steps/s{ev:<28}")
            if frac >= 1.0:
                sys.stderr.write("\n")
            sys.stderr.flush()

        def _on_rollout_end(self) -> None:
            if self._n:
                self.rows.append({"kind": "train", "timesteps": self.num_timesteps,
                                  "wall_seconds": time.perf_counter() - t_start,
                                  "mean_step_reward": self._sum / self._n})
            self._sum, self._n = 0.0, 0

    rec = Recorder()

    class LatencyEval(EvalCallback):
        """SB3's ``EvalCallback`` on fixed seeds, also recording latency metrics; keeps the policy
        (and its normalisation) with the lowest mean time in system."""

        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self._episodes: list[dict[str, float]] = []
            self.best_time_in_system = math.inf

        def _log_success_callback(self, locals_: dict[str, Any], globals_: dict[str, Any]) -> None:
            super()._log_success_callback(locals_, globals_)
            if locals_["done"] and "flowgym_metrics" in locals_["info"]:
                self._episodes.append(locals_["info"]["flowgym_metrics"])

        def _on_step(self) -> bool:
            due = self.eval_freq > 0 and self.n_calls % self.eval_freq == 0
            if due:  # the same seeds at every evaluation, so evaluations compare
                self.eval_env.seed(cfg.eval_seed)
                self._episodes = []
            model = self.model
            self.model = _RuleModel(model, cfg.action_rule)  # evaluate as LearnedBudget will act
            try:
                ok = super()._on_step()
            finally:
                self.model = model
            if due and self._episodes:
                mean = {k: _finite_mean([e[k] for e in self._episodes]) for k in self._episodes[0]}
                tis = [e["mean_time_in_system"] for e in self._episodes]
                mean["geo_time_in_system"] = (float(np.exp(np.mean(np.log(tis))))
                                              if all(math.isfinite(x) and x > 0 for x in tis) else math.inf)
                row = {"kind": "eval", "timesteps": self.num_timesteps,
                       "wall_seconds": time.perf_counter() - t_start, "mean_return": float(self.last_mean_reward), **mean}
                rec.rows.append(row)
                rec.last_eval = mean
                for k, v in mean.items():
                    self.logger.record(f"eval/{k}", v)
                score = mean[select_key]
                if score < self.best_time_in_system:
                    self.best_time_in_system = score
                    self.model.save(os.path.join(out, "best_model.zip"))
                    venv = self.model.get_vec_normalize_env()
                    if venv is not None:
                        venv.save(os.path.join(out, "best_vecnormalize.pkl"))
                if on_eval is not None:  # e.g. a Ray Tune trial's report (its scheduler may stop the trial)
                    on_eval({**row, "best_time_in_system": self.best_time_in_system})
            return ok

    # on a distribution the episodes' scales differ by orders of magnitude: select on the geometric
    # mean (the mean log ratio to any per-draw reference), not on the heaviest draws' arithmetic mean
    select_key = "geo_time_in_system" if cfg.distribution is not None else "mean_time_in_system"
    cbs: list[Any] = [rec]
    evaluator = None
    if cfg.eval_freq > 0:
        evaluator = LatencyEval(eval_venv, n_eval_episodes=n_eval,
                                eval_freq=max(1, cfg.eval_freq // cfg.n_envs), deterministic=True,
                                verbose=0, warn=False)
        cbs.append(evaluator)
    if cfg.checkpoint_freq > 0:
        cbs.append(CheckpointCallback(save_freq=max(1, cfg.checkpoint_freq // cfg.n_envs),
                                      save_path=os.path.join(out, "checkpoints"), name_prefix="model",
                                      save_vecnormalize=True))
    return CallbackList(cbs), (rec, evaluator)


# --------------------------------------------------------------------------- training


def train(cfg: TrainConfig | None = None, *, on_eval: Any = None, **overrides: Any) -> TrainResult:
    """Train a learned budget; write the model directory ``cfg.out``; return a :class:`TrainResult`.

    Keyword arguments override fields of ``cfg`` (or of the defaults). ``on_eval(row)`` is
    called after each evaluation during training with its row of ``curves.csv`` (plus
    ``best_time_in_system`` so far). Same configuration and seed, same model (single process,
    ``torch_threads=1``).
    """
    cfg = dataclasses.replace(cfg or TrainConfig(), **overrides)
    cfg.validate()
    require_sb3()
    import torch
    from stable_baselines3.common.vec_env import VecNormalize

    from flowgym.lab.scenarios import get_scenario

    torch.set_num_threads(cfg.torch_threads)
    algo_cls = algorithm_class(cfg.algo)
    sc = get_scenario(cfg.scenario, rate=cfg.rate)
    range_from = "the training settings"
    if cfg.action != "budget":
        if cfg.max_budget is None:
            cfg = dataclasses.replace(cfg, max_budget=256)
            range_from = "the multiplier action's default cap (256)"
    elif cfg.budget_levels is None and cfg.max_budget is None:  # the scenario's defaults (derived when it has none)
        max_budget, levels, range_from = sc.learned_action_range()
        cfg = dataclasses.replace(cfg, budget_levels=levels, max_budget=max_budget)
    if cfg.budget_levels is not None:
        cfg = dataclasses.replace(cfg, budget_levels=tuple(cfg.budget_levels), max_budget=int(cfg.budget_levels[-1]))
    assert cfg.max_budget is not None
    train_kw = learned_env_kwargs(sc.tune_env_kwargs(), cfg.max_budget, cfg.env_overrides,
                                  observation=cfg.observation, action=cfg.action, multipliers=cfg.multipliers,
                                  multiplier_of=cfg.multiplier_of)
    dist = cfg.distribution
    out = cfg.out
    os.makedirs(out, exist_ok=True)
    for stale in ("best_model.zip", "best_vecnormalize.pkl"):  # an interrupted run's in a reused --out: selecting
        with contextlib.suppress(FileNotFoundError):  # "best" must read only what this run's evaluations saved
            os.remove(os.path.join(out, stale))

    venv = make_vec_env(train_kw, cfg.n_envs, cfg.seed, kind=cfg.vec_env, action_repeat=cfg.action_repeat,
                        budget_levels=cfg.budget_levels, distribution=dist)
    venv = VecNormalize(venv, norm_obs=cfg.norm_obs, norm_reward=cfg.norm_reward, clip_obs=cfg.clip_obs,
                        gamma=cfg.gamma)
    eval_venv, n_eval = None, 0
    if cfg.eval_freq > 0:
        # a trace replay is the same episode for every seed: one evaluation episode suffices
        n_eval = 1 if sc.finite and dist is None else cfg.eval_episodes
        raw_eval = make_vec_env(train_kw, n_eval, cfg.eval_seed, metrics=True, action_repeat=cfg.action_repeat,
                                budget_levels=cfg.budget_levels, distribution=dist)
        if type(venv.venv).__name__ == "VecRepeatLevels":  # SB3 syncs normalisation along equal wrapper chains
            raw_eval = _vec_repeat_wrapper()(raw_eval, 1, None)  # (a pass-through layer)
        eval_venv = VecNormalize(raw_eval,
                                 training=False, norm_obs=cfg.norm_obs, norm_reward=False, clip_obs=cfg.clip_obs)

    kwargs = _algo_kwargs(cfg, algo_cls)
    model = algo_cls(policy_alias(algo_cls), venv, seed=cfg.seed, device=cfg.device, verbose=0, **kwargs)
    t0 = time.perf_counter()
    callbacks, (rec, evaluator) = _callbacks(cfg, eval_venv, n_eval, out, t0, on_eval)
    model.learn(total_timesteps=cfg.total_timesteps, callback=callbacks, progress_bar=False)
    wall = time.perf_counter() - t0
    steps = int(model.num_timesteps)

    model.save(os.path.join(out, "last_model.zip"))
    venv.save(os.path.join(out, "last_vecnormalize.pkl"))
    selected = "last"
    if cfg.select == "best" and evaluator is not None and os.path.exists(os.path.join(out, "best_model.zip")):
        selected = "best"
    src = "best" if selected == "best" else "last"
    os.replace(os.path.join(out, f"{src}_model.zip"), os.path.join(out, MODEL_FILE))
    os.replace(os.path.join(out, f"{src}_vecnormalize.pkl"), os.path.join(out, VECNORM_FILE))
    if selected == "best":  # keep the last policy too, for reference
        model.save(os.path.join(out, "last_model.zip"))
        venv.save(os.path.join(out, "last_vecnormalize.pkl"))
    venv.close()
    if eval_venv is not None:
        eval_venv.close()

    obs_shape = list(model.observation_space.shape)
    meta = {
        "format": FORMAT_VERSION,
        "algo": cfg.algo,
        "algo_class": f"{algo_cls.__module__}:{algo_cls.__name__}",
        "scenario": sc.name,
        "rate": cfg.rate,
        # the whole scenario as data (at its default rate), so the model is evaluated in any process
        "scenario_data": sc.to_dict(),
        "action_range_from": range_from,
        # what it was trained on: the scenario's one workload, or a distribution (then the scenario
        # is only the report scenario of the final table: the model never saw it)
        "trained_on": "scenario" if dist is None else cfg.hyperparameters()["distribution"],
        "observation": cfg.observation,
        "action": cfg.action,
        "env_kwargs": train_kw,
        "agent_env_options": _agent_options(train_kw),
        "observation_shape": obs_shape,
        "action_n": int(model.action_space.n) if hasattr(model.action_space, "n") else 0,
        "action_space": describe_action_space(model.action_space),
        "action_repeat": int(cfg.action_repeat),
        "budget_levels": None if cfg.budget_levels is None else [int(v) for v in cfg.budget_levels],
        "action_rule": cfg.action_rule,
        "hyperparameters": cfg.hyperparameters(),
        "algo_kwargs_used": {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()
                             if k != "policy_kwargs"},
        "seeds": {"train": [cfg.seed + i for i in range(cfg.n_envs)],
                  "eval_during_training": [cfg.eval_seed + i for i in range(n_eval)],
                  "tune": [1000 + i for i in range(cfg.tune_seeds)],
                  "report": list(range(cfg.final_eval_seeds))},
        "selected": selected,
        "best_eval_time_in_system": None if evaluator is None or not math.isfinite(evaluator.best_time_in_system)
        else evaluator.best_time_in_system,
        "timesteps": steps,
        "env_slots": steps * cfg.action_repeat,  # exact unless an episode ends inside a held decision
        "wall_seconds": wall,
        "steps_per_second": steps / wall if wall > 0 else None,
        "env_slots_per_second": steps * cfg.action_repeat / wall if wall > 0 else None,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": _versions(),
    }
    # the selected policy again as plain tensors and arrays: what LearnedBudget loads (no pickle)
    kept = algo_cls.load(os.path.join(out, MODEL_FILE), device="cpu")
    kept_norm = VecNormalize.load(os.path.join(out, VECNORM_FILE), make_vec_env(train_kw, 1, cfg.seed,
                                                                              budget_levels=cfg.budget_levels,
                                                                              distribution=dist))
    meta = write_safe(out, kept.policy, kept_norm, meta)
    with open(os.path.join(out, META_FILE), "w") as fh:
        _json.dump(meta, fh, indent=1)
    _check_safe_copy(out, kept, kept_norm)
    _write_curves(rec.rows, os.path.join(out, CURVES_FILE))
    if cfg.plot:
        try:
            plot_curves(rec.rows, os.path.join(out, "curves.png"), title=f"{cfg.algo.upper()} on {sc.name}")
        except ImportError:
            print("note: matplotlib is not installed; curves.png skipped (pip install -e '.[plot]' in the flowgym checkout)",
                  file=sys.stderr)
    res = TrainResult(out, steps, wall, steps / wall if wall > 0 else float("nan"), rec.rows, selected)
    if cfg.final_eval_seeds > 0:
        res.table = final_evaluation(out, seeds=list(range(cfg.final_eval_seeds)),
                                     tune_seeds=[1000 + i for i in range(cfg.tune_seeds)], progress=cfg.progress,
                                     trust=True)  # this run wrote it, with the class its caller named
    return res


def _check_safe_copy(out: str, model: Any, norm: Any) -> None:
    """The pickle-free files act as the SB3 model does (same budgets on random observations; for a
    recurrent model, on a sequence of them, its LSTM state carried along)."""
    agent = LearnedBudget(out, trust=True)  # written by this run; trust only lets it import the class it trained
    rng = np.random.default_rng(0)
    space = model.observation_space
    raw = rng.uniform(0, 1, size=(64, *space.shape)) * np.minimum(space.high, 100.0)
    for rule in ACTION_RULES:
        ours = norm.normalize_obs(raw) if norm.norm_obs else raw
        theirs = np.stack([agent.normalize(r) for r in raw])
        if is_recurrent(model):
            want, got, s_want, s_got = [], [], None, None
            for i in range(len(raw)):
                a, s_want = recurrent_action(model, ours[i:i + 1], s_want, [i == 0], rule)
                b, s_got = recurrent_action(agent.model, theirs[i:i + 1], s_got, [i == 0], rule)
                want.append(a)
                got.append(b)
        else:
            want, got = policy_action(model, ours, rule), policy_action(agent.model, theirs, rule)
        if not np.array_equal(np.asarray(want), np.asarray(got)):
            raise RuntimeError(f"the pickle-free copy of the policy in {out!r} acts differently from the SB3 model")


#: The ``policy_kwargs`` a training run may set (``algo_kwargs``): those a model directory records and loads back
#: (``net_arch``; an LSTM's shape) or that only shape the initial weights.
POLICY_KWARGS = ("net_arch", "log_std_init", "ortho_init", *LSTM_KWARGS)


def check_tune_seeds(scenario: Any, rate: float | None, final_eval_seeds: int, tune_seeds: int) -> None:
    """``ValueError`` when a final table is asked for (``final_eval_seeds > 0``) on a scenario that tunes an agent,
    with no seed to tune it on (``tune_seeds < 1``); the check of both training configurations."""
    if final_eval_seeds > 0 and tune_seeds < 1:
        from flowgym.lab.scenarios import get_scenario

        tuned = [a.label or a.name for a in get_scenario(scenario, rate=rate).agents if a.tune]
        if tuned:
            raise ValueError(f"tune_seeds must be at least 1 when final_eval_seeds > 0: the final table tunes "
                             f"{', '.join(tuned)} on them, got {tune_seeds}")


def _algo_kwargs(cfg: TrainConfig, algo_cls: type) -> dict[str, Any]:
    """Constructor arguments for ``algo_cls``: the ones of ``cfg`` it accepts, then ``algo_kwargs`` (its
    ``policy_kwargs`` merged into those of ``cfg``: ``net_arch``, ``log_std_init``)."""
    import inspect

    params = inspect.signature(algo_cls.__init__).parameters
    accepted = set(params)
    common = {
        "learning_rate": cfg.learning_rate, "n_steps": cfg.n_steps, "batch_size": cfg.batch_size,
        "n_epochs": cfg.n_epochs, "gamma": cfg.gamma, "gae_lambda": cfg.gae_lambda, "clip_range": cfg.clip_range,
        "ent_coef": cfg.ent_coef, "vf_coef": cfg.vf_coef, "max_grad_norm": cfg.max_grad_norm,
    }
    try:
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

        on_policy = issubclass(algo_cls, OnPolicyAlgorithm)
    except ImportError:  # pragma: no cover - SB3 is required before this point
        on_policy = True
    if not on_policy:
        # ``n_steps`` is the rollout length of on-policy algorithms; off-policy ones (DQN in
        # SB3 >= 2.7) read it as n-step returns. Set it there through ``algo_kwargs``.
        common.pop("n_steps")
    kw = {k: v for k, v in common.items() if k in accepted}
    kw["policy_kwargs"] = {"net_arch": list(cfg.net_arch)}
    if cfg.log_std_init is not None:
        kw["policy_kwargs"]["log_std_init"] = float(cfg.log_std_init)
    extra = dict(cfg.algo_kwargs)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [] if takes_any else sorted(set(extra) - accepted - {"self"})
    if unknown:  # found before training, not as a TypeError from the constructor
        raise ValueError(f"algo_kwargs {unknown} are not arguments of {algo_cls.__name__}")
    if isinstance(extra.get("policy_kwargs"), Mapping):  # merged: e.g. an LSTM's size beside --net-arch
        extra["policy_kwargs"] = {**kw["policy_kwargs"], **extra["policy_kwargs"]}
    kw.update(extra)
    return kw


def _agent_options(env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The options a learned agent declares: flat observation, its action range, and every
    observation-shaping argument at its trained value."""
    from flowgym.envs.flow_control import FlowControlConfig

    defaults = FlowControlConfig()
    opts: dict[str, Any] = {"observation": env_kwargs.get("observation", "flat"),
                            "max_budget": int(env_kwargs["max_budget"])}
    if env_kwargs.get("action", "budget") != "budget":
        opts["action"] = env_kwargs["action"]
        opts["multipliers"] = [float(k) for k in env_kwargs["multipliers"]]
        opts["multiplier_of"] = env_kwargs.get("multiplier_of", "safe")
    for k in OBSERVATION_OPTIONS:
        v = env_kwargs.get(k, getattr(defaults, k))
        opts[k] = list(v) if isinstance(v, tuple) else v
    return opts


def _finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none (e.g. no request completed)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def _versions(modules: Sequence[str] = ("stable_baselines3", "sb3_contrib", "torch", "gymnasium", "numpy")
              ) -> dict[str, str]:
    """The versions of ``modules`` (those importable) and of flowgym, for a model's ``meta.json``."""
    out = {}
    for mod in modules:
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover - informational only
            pass
    import flowgym

    out["flowgym"] = flowgym.__version__
    return out


def _write_curves(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    # geo_time_in_system: the evaluations' geometric mean, what selects the model on a distribution
    cols = ["kind", "timesteps", "wall_seconds", "mean_step_reward", "mean_return", "mean_time_in_system",
            "geo_time_in_system", "avg_latency", "p95_latency", "request_throughput", "token_throughput", "evictions",
            "completed"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def read_curves(path: str) -> list[dict[str, Any]]:
    """Rows of a ``curves.csv`` (numbers as floats, empty cells dropped)."""
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            rows.append({k: (v if k == "kind" else float(v)) for k, v in r.items() if v != ""})
    return rows


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str, title: str = "") -> None:
    """Two panels against decisions (SB3 timesteps): mean raw reward per decision of each rollout, and the
    evaluation episodes' average latency and mean time in system. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = [r for r in rows if r["kind"] == "train"]
    ev = [r for r in rows if r["kind"] == "eval"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    if tr:
        x = np.asarray([r["timesteps"] for r in tr])
        y = np.asarray([r["mean_step_reward"] for r in tr])
        a1.plot(x, y, lw=0.6, alpha=0.5, label="per rollout")
        k = max(1, len(y) // 25)
        if len(y) >= k > 1:
            a1.plot(x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid"), lw=1.5, label=f"moving mean ({k})")
        a1.legend()
    a1.set_xlabel("decisions (SB3 timesteps)")
    a1.set_ylabel("mean reward per decision (raw)")
    a1.set_title("training reward")
    if ev:
        x = [r["timesteps"] for r in ev]
        a2.plot(x, [r["mean_time_in_system"] for r in ev], "o-", label="mean time in system")
        a2.plot(x, [r["avg_latency"] for r in ev], "s--", label="avg latency (completed)")
        a2.plot(x, [r["p95_latency"] for r in ev], "^:", label="p95 latency")
        a2.legend()
    a2.set_xlabel("decisions (SB3 timesteps)")
    a2.set_ylabel("slots (seconds in continuous time)")
    a2.set_title("evaluation on held-out seeds (deterministic policy)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- final table


def final_evaluation(model_dir: str, *, scenario: str | None = None, rate: float | None = None,
                     seeds: Sequence[int] = (0, 1, 2), tune_seeds: Sequence[int] = (1000, 1001),
                     baselines: bool = True, progress: bool = False, write: bool = True,
                     trust: bool = False) -> Any:
    """The learned agent of ``model_dir`` against the scenario's agents, tuned on ``tune_seeds``.

    The scenario defaults to the one the model was trained on. It is reported at the horizons
    ``flowgym compare`` reports it at (:meth:`~flowgym.lab.scenarios.Scenario.report_horizons`), with the
    baselines tuned at compare's default tuning horizon (the scenario's ``tune_horizon``, else the longest
    horizon up to 2,000; a finite workload runs to its end). Tunable baselines
    (flow control's ``b``, alpha-greedy's ``alpha``) are grid-searched on
    ``tune_seeds`` (minimising mean time in system; the scenario's tuning
    environment) before the report on ``seeds``. Everything runs through
    :func:`flowgym.lab.evaluation.evaluate`. Returns its
    :class:`~flowgym.lab.evaluation.ResultTable` (with ``tuned`` filled) and, with
    ``write``, saves ``eval.txt``, ``eval.csv`` and ``eval.json`` in ``model_dir``. ``trust`` is
    :class:`~flowgym.agents.learned.LearnedBudget`'s (only for a directory you trust: the training run
    that wrote it passes ``True``, so an algorithm named ``package.module:Class`` is imported).
    """
    from flowgym.lab.evaluation import evaluate, tune
    from flowgym.lab.scenarios import AgentSpec, get_scenario

    agent = LearnedBudget(model_dir, trust=trust)
    if scenario is not None:
        sc = get_scenario(scenario, rate=rate)
    else:  # the scenario it was trained on, as the model directory stores it (older models: by name)
        sc = get_scenario(agent.meta.get("scenario_data") or agent.meta["scenario"], rate=agent.meta.get("rate"))
    env_kwargs = sc.env_kwargs()
    horizons = sc.report_horizons()  # as flowgym compare reports it (None: run to the end of a finite workload)
    horizons = None if horizons is None else sorted(set(horizons))
    tune_h = None if horizons is None else (sc.tune_horizon or min(horizons[-1], 2000))  # compare's default too
    specs: list[Any] = []
    tuned: dict[str, Any] = {}
    if baselines:
        for spec in sc.agents:
            if spec.tune:
                param = spec.tune[0]
                best, _ = tune(spec, sc.tune_env_kwargs(), list(tune_seeds), tune_h)
                label = f"{spec.label or spec.name} {param}={best}"
                tuned[label] = {param: best}
                spec = AgentSpec(spec.name, {**spec.params, param: best}, None, label)
            specs.append(spec)
    table = evaluate([agent, *specs], env_kwargs, list(seeds), horizons, progress=progress)
    table.tuned = tuned
    if write:
        text = sc.description + "\n" + table.format()
        with open(os.path.join(model_dir, "eval.txt"), "w") as fh:
            fh.write(text + "\n")
        table.to_csv(os.path.join(model_dir, "eval.csv"))
        table.to_json(os.path.join(model_dir, "eval.json"), scenario=sc.name, tune_seeds=list(tune_seeds))
    return table


# --------------------------------------------------------------------------- searches on Ray Tune

#: What ``train_search`` varies by default: the seed and the settings that mattered most in
#: docs/training.md (learning rate, entropy bonus, discount).
SEARCH_SPACE = {
    "seed": ("choice", [10_000, 11_000, 12_000, 13_000, 14_000, 15_000, 16_000, 17_000]),
    "learning_rate": ("loguniform", [1e-4, 1e-3]),
    "ent_coef": ("choice", [0.0, 0.003, 0.01]),
    "gamma": ("choice", [0.99, 0.995, 0.998]),
}


def _tune_space(space: Mapping[str, Any]) -> dict[str, Any]:
    from ray import tune

    out: dict[str, Any] = {}
    for key, (kind, args) in space.items():
        if key not in TrainConfig.__dataclass_fields__:
            raise ValueError(f"search space: {key!r} is not a TrainConfig field")
        if kind == "choice":
            out[key] = tune.choice(list(args))
        elif kind == "grid":
            out[key] = tune.grid_search(list(args))
        elif kind == "uniform":
            out[key] = tune.uniform(*args)
        elif kind == "loguniform":
            out[key] = tune.loguniform(*args)
        else:
            raise ValueError(f"search space: {key!r}: kind must be choice, grid, uniform or loguniform, got {kind!r}")
    return out


def _trial(config: dict[str, Any]) -> None:
    """One Ray Tune trial: one SB3 training run reporting each evaluation's time in system."""
    from ray import tune

    base = dict(config.pop("__base__"))
    out = os.path.join(base.pop("out"), "trials", tune.get_context().get_trial_id())
    cfg = TrainConfig(**{**base, **config, "out": out, "progress": False, "plot": False, "final_eval_seeds": 0})

    def report(row: Mapping[str, Any]) -> None:
        tune.report({"time_in_system": row["mean_time_in_system"], "best_time_in_system": row["best_time_in_system"],
                     "timesteps": row["timesteps"], "model_dir": out})

    train(cfg, on_eval=report)


def train_search(cfg: TrainConfig, trials: int, *, address: str | None = None, workers: int | None = None,
                 space: Mapping[str, Any] | None = None, grace_period: int | None = None) -> dict[str, Any]:
    """A Ray Tune search of ``trials`` training runs of ``cfg`` over ``space`` (:data:`SEARCH_SPACE`).

    ``space`` maps TrainConfig fields to ``("choice" | "grid" | "uniform" | "loguniform", values)``;
    as in Ray Tune, every sample runs the whole of a ``grid`` (``trials`` x its size runs).

    Each trial is one :func:`train` (one CPU, written to ``<cfg.out>/trials/<trial id>``) that
    reports the mean time in system of each evaluation; ASHA stops the worst trials after
    ``grace_period`` evaluations (default 2). The best trial is the one with the lowest
    evaluation time in system among those that ran to the end (its kept model); it is then
    evaluated against the scenario's
    tuned baselines through :func:`final_evaluation` (the one evaluation path) and copied to
    ``<cfg.out>/best``. Returns the best trial's settings, model directory and table, and the
    table of every trial (also ``<cfg.out>/search.csv``).
    """
    require_sb3()
    try:
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
    except ImportError:
        raise ImportError("training on Ray needs Ray Tune: pip install -e '.[ray]' in the flowgym checkout") from None
    from flowgym.lab.parallel import make_backend
    from flowgym.lab.scenarios import SCENARIOS, get_scenario

    cfg.validate()
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    if cfg.eval_freq <= 0:
        raise ValueError("a search ranks trials by their evaluations: eval_freq must be positive")
    out = os.path.abspath(cfg.out)
    os.makedirs(out, exist_ok=True)
    n_evals = max(1, cfg.total_timesteps // cfg.eval_freq)
    base = {**cfg.hyperparameters(), "out": out}
    base["net_arch"] = tuple(base["net_arch"])
    if isinstance(cfg.scenario, str) and cfg.scenario not in SCENARIOS:  # a file: trials get its data
        base["scenario"] = get_scenario(cfg.scenario, rate=None).to_dict()  # (their working folder differs)
    param_space = {**_tune_space(space or SEARCH_SPACE), "__base__": base}
    backend = make_backend("ray", workers=workers, address=address)  # starts or reaches the cluster
    try:
        # max_t one past the last evaluation: a trial that reaches it finishes and writes its model directory
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=n_evals + 1,
                                  grace_period=min(n_evals, grace_period or 2), reduction_factor=2)
        tuner = tune.Tuner(
            tune.with_resources(_trial, {"cpu": 1}),
            param_space=param_space,
            tune_config=tune.TuneConfig(num_samples=trials, metric="best_time_in_system", mode="min",
                                        scheduler=scheduler),
            run_config=tune.RunConfig(name="search", storage_path=os.path.join(out, "ray_results"), verbose=0),
        )
        grid = tuner.fit()
    finally:
        backend.close()
    rows = []
    for r in grid:
        m = r.metrics or {}
        rows.append({**{k: v for k, v in (r.config or {}).items() if k != "__base__"},
                     "best_time_in_system": m.get("best_time_in_system"), "evaluations": m.get("training_iteration"),
                     "model_dir": m.get("model_dir"), "error": None if r.error is None else str(r.error)})
    for r in rows:  # stopped early (ASHA) or failed: no model directory was written
        r["complete"] = bool(r["model_dir"]) and os.path.exists(os.path.join(r["model_dir"], META_FILE))
    ok = [r for r in rows if r["best_time_in_system"] is not None and r["complete"]]
    if not ok:
        raise RuntimeError(f"no trial of the search ran to its end; errors: {[r['error'] for r in rows]}")
    best = min(ok, key=lambda r: r["best_time_in_system"])
    keys = sorted({k for r in rows for k in r})
    with open(os.path.join(out, "search.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    import shutil

    best_dir = os.path.join(out, "best")
    if os.path.exists(best_dir):
        shutil.rmtree(best_dir)
    shutil.copytree(best["model_dir"], best_dir)
    table = None
    if cfg.final_eval_seeds > 0:
        table = final_evaluation(best_dir, seeds=list(range(cfg.final_eval_seeds)),
                                 tune_seeds=[1000 + i for i in range(cfg.tune_seeds)], progress=cfg.progress,
                                 trust=True)
    return {"best": best, "best_dir": best_dir, "trials": rows, "table": table}
