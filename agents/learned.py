"""A learned activation budget: a Stable-Baselines3 policy trained by ``flowgym train``."""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import numpy as np

from agents.base import Agent
from flowgym.env import FlowControlConfig
from flowgym.view import SystemView

__all__ = ["LearnedBudget"]


class LearnedBudget(Agent):
    """``B_t`` chosen by a trained SB3 policy from the flat observation (deterministically).

    ``LearnedBudget(path)`` loads the model directory written by
    :func:`flowgym.train.train` (``model.zip``, ``vecnormalize.pkl``,
    ``flowgym_agent.json``): the policy, the observation normalisation it was
    trained with, and the environment options it needs, which it declares
    (:meth:`env_options`: ``observation="flat"``, its action range as
    ``max_budget``, the length knowledge, eviction, queue order and every
    observation-shaping argument at its trained value). So it runs through
    :func:`flowgym.evaluation.evaluate` like any scripted agent, and a scenario
    that sets one of those options differently is refused by name. An
    environment whose observation does not have the trained shape (e.g. a
    continuous-time scenario for a model trained in slots) is refused at the
    first step. Each decision is held for the ``action_repeat`` slots it was
    trained with (``flowgym_agent.json``), so the agent keeps a little state,
    reset by :meth:`reset`. A model trained with ``budget_levels`` chooses the
    index of a level, and the agent plays that level's budget.

    By name: ``make_agent("learned", path="examples/ppo_default")``, or
    ``flowgym compare --agents "learned:path=examples/ppo_default"``.

    Args:
        path: the model directory.
        label: table label (default ``learned (<directory name>)``).
        action_rule: ``"mean"`` (the expected budget under the policy's action
            distribution, rounded) or ``"mode"`` (its most likely budget); default: the
            rule the model was evaluated and selected with during training
            (``flowgym_agent.json``; ``"mode"`` for models that do not record one).
    """

    name = "learned"

    def __init__(self, path: str, label: str | None = None, action_rule: str | None = None) -> None:
        from flowgym.train import (
            ACTION_RULES,
            META_FILE,
            MODEL_FILE,
            VECNORM_FILE,
            algorithm_class,
            require_sb3,
            valid_levels,
        )

        if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
            raise ValueError(f"learned agent: path {path!r} is not a model directory (written by flowgym train)")
        self.path = os.fspath(path)
        missing = [f for f in (MODEL_FILE, META_FILE) if not os.path.exists(os.path.join(self.path, f))]
        if missing:
            raise ValueError(f"learned agent: {self.path!r} lacks {missing} (not a flowgym train output?)")
        with open(os.path.join(self.path, META_FILE)) as fh:
            self.meta: dict[str, Any] = json.load(fh)
        for key in ("algo_class", "agent_env_options", "observation_shape", "action_n"):
            if key not in self.meta:
                raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has no {key!r}")
        require_sb3()
        import torch

        torch.set_num_threads(1)
        cls = algorithm_class(self.meta["algo_class"])
        self.model = cls.load(os.path.join(self.path, MODEL_FILE), device="cpu")
        self.obs_shape = tuple(int(x) for x in self.meta["observation_shape"])
        if tuple(self.model.observation_space.shape) != self.obs_shape:
            raise ValueError(f"learned agent: model observation shape {self.model.observation_space.shape} "
                             f"differs from {META_FILE}'s {self.obs_shape}")
        self._norm = None
        vn = os.path.join(self.path, VECNORM_FILE)
        if os.path.exists(vn):
            with open(vn, "rb") as fh:
                norm = pickle.load(fh)
            if norm.norm_obs:
                self._norm = (np.asarray(norm.obs_rms.mean, dtype=np.float64),
                              np.sqrt(np.asarray(norm.obs_rms.var, dtype=np.float64) + norm.epsilon),
                              float(norm.clip_obs))
                if self._norm[0].shape != self.obs_shape:
                    raise ValueError(f"learned agent: {VECNORM_FILE} statistics have shape {self._norm[0].shape}, "
                                     f"the model's observation {self.obs_shape}")
        self.requires = dict(self.meta["agent_env_options"])
        #: Slots each decision is held for, as in training (``flowgym_agent.json``'s ``action_repeat``).
        self.action_repeat = self.meta.get("action_repeat", 1)
        if isinstance(self.action_repeat, bool) or not isinstance(self.action_repeat, int) or self.action_repeat < 1:
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has action_repeat="
                             f"{self.action_repeat!r}; it must be a positive integer")
        #: The budget of each action index (``budget_levels`` of training), or ``None``: the index is the budget.
        levels = self.meta.get("budget_levels")
        if levels is not None and (not valid_levels(levels) or len(levels) != self.meta["action_n"]):
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has budget_levels={levels!r}; it must "
                             f"list {self.meta['action_n']} ascending non-negative integer budgets, one per action")
        self.budget_levels: list[int] | None = levels
        self._held, self._left = 0, 0
        self.action_rule = action_rule if action_rule is not None else self.meta.get("action_rule", "mode")
        if self.action_rule not in ACTION_RULES:
            raise ValueError(f"learned agent: action_rule must be one of {list(ACTION_RULES)}, got {self.action_rule!r}")
        self._label = label or f"learned ({os.path.basename(os.path.normpath(self.path))})"

    def reset(self, config: FlowControlConfig, seed: int | None = None) -> None:
        """Start an episode; refuses a configuration whose observation-shaping options differ."""
        super().reset(config, seed)
        self._held, self._left = 0, 0
        for key, want in self.requires.items():
            have = getattr(config, key)
            if key == "max_budget":
                if have < want:
                    raise ValueError(f"learned agent {self._label!r} needs max_budget >= {want}, the environment has {have}")
                continue
            if isinstance(have, tuple):
                have = list(have)
            if have != want:
                raise ValueError(f"learned agent {self._label!r} was trained with {key}={want!r}; "
                                 f"this environment has {key}={have!r}")

    def normalize(self, observation: Any) -> np.ndarray:
        """The observation as the policy sees it (VecNormalize's statistics, frozen)."""
        obs = np.asarray(observation, dtype=np.float64)
        if obs.shape != self.obs_shape:
            raise ValueError(
                f"learned agent {self._label!r} expects a flat observation of shape {self.obs_shape} "
                f"(trained on {self.meta.get('scenario')!r}); this environment gives shape {obs.shape}. "
                "Was it trained in the other time model (slots vs continuous time) or length knowledge?")
        if self._norm is None:
            return obs.astype(np.float32)
        mean, std, clip = self._norm
        return np.clip((obs - mean) / std, -clip, clip).astype(np.float32)

    def act(self, observation: Any, view: SystemView) -> int:
        """The policy's budget, recomputed every ``action_repeat`` slots (held in between)."""
        if self._left > 0:
            self._left -= 1
            return self._held
        from flowgym.train import policy_action

        index = int(policy_action(self.model, self.normalize(observation)[None], self.action_rule)[0])
        self._held = index if self.budget_levels is None else self.budget_levels[index]
        self._left = self.action_repeat - 1
        return self._held

    def label(self) -> str:
        return self._label
