"""Domain randomisation: a FlowControl-v0 whose workload and cache size are drawn afresh at each reset.

:class:`RandomizedFlowControlEnv` takes a *sampler* (``rng -> FlowControl-v0 arguments``,
e.g. :class:`flowgym.lab.distributions.RandomMix`) and fixed arguments applied over every
draw (the observation and action types). Spaces must not depend on the draw: use the
scale-free load observations (``observation="load"``, ``"load-v2"``, ``"load-v3"`` or ``"load-v4"``: the
keys of :data:`flowgym.envs.spaces.LOAD_OBSERVATIONS`; the flat and dict observations carry ``M`` in their
bounds, so they are refused) and a budget or multiplier action with a fixed range.

The draw is a pure function of the reset seed: ``reset(seed=s)`` reseeds the sampler's
generator with ``s`` (so evaluation episodes on fixed seeds meet the same workloads every
time), and ``reset()`` without a seed draws the next workload from the same generator; a first
``reset()`` without any seed seeds it from the environment's ``np_random`` (operating-system
entropy, as Gymnasium's own environments), so two unseeded environments draw different workloads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flowgym.envs.flow_control import FlowControlEnv
from flowgym.envs.spaces import LOAD_OBSERVATIONS, one_of

__all__ = ["RandomizedFlowControlEnv"]


class RandomizedFlowControlEnv(gym.Env[Any, Any]):
    """FlowControl-v0 over a distribution of configurations, one draw per episode.

    Args:
        sampler: ``sampler(rng) -> dict`` of FlowControl-v0 arguments for one episode.
        **fixed: arguments applied over every draw (they win over the sampler's), e.g.
            ``observation="load", action="multiplier", max_budget=256``.

    Spaces, reward, episode end and info are those of the current draw's
    :class:`~flowgym.envs.flow_control.FlowControlEnv` (its docstring); ``reset``'s info adds
    ``config``, the draw's arguments. ``metrics()``, ``request_log()``, ``view()`` and
    ``safe_budget()`` read the current episode's environment.
    """

    metadata = {"render_modes": []}

    def __init__(self, sampler: Callable[[np.random.Generator], Mapping[str, Any]], **fixed: Any) -> None:
        if not callable(sampler):
            raise ValueError(f"sampler must be a callable rng -> FlowControl-v0 arguments, got {sampler!r}")
        if fixed.get("observation", "dict") not in LOAD_OBSERVATIONS:
            raise ValueError(f"RandomizedFlowControlEnv needs observation={one_of(tuple(LOAD_OBSERVATIONS))} (the flat and "
                             "dict observations have M in their bounds, so their spaces change from draw to draw)")
        self.sampler = sampler
        self.fixed = dict(fixed)
        self._rng: np.random.Generator | None = None  # seeded by the first reset
        first = self.sampler(np.random.default_rng(0))
        probe = self._build(first)
        self.config_drawn = dict(first)
        self.observation_space = probe.observation_space
        self.action_space = probe.action_space
        self.env: FlowControlEnv = probe
        self._started = False

    def _build(self, drawn: Mapping[str, Any]) -> FlowControlEnv:
        kw = {**dict(drawn), **self.fixed}
        try:
            env = FlowControlEnv(**kw)
        except ValueError as e:
            raise ValueError(f"the sampler drew arguments FlowControl-v0 refuses: {e}") from None
        if hasattr(self, "observation_space") and (
            env.observation_space != self.observation_space or env.action_space != self.action_space
        ):
            raise ValueError(f"a draw changed the spaces ({env.observation_space}, {env.action_space}); "
                             "the sampler must not set observation or action arguments")
        return env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._started = False  # a reset that fails leaves no episode to step
        if seed is not None:
            rng = np.random.default_rng(seed)
        elif self._rng is None:  # never seeded: from the entropy super().reset() drew for np_random
            rng = np.random.default_rng(int(self.np_random.integers(0, 2**63 - 1)))
        else:  # a copy, kept only if the reset succeeds: a refused draw does not move the chain of resets
            rng = copy.deepcopy(self._rng)
        drawn = self.sampler(rng)
        env = self._build(drawn)
        obs, info = env.reset(seed=int(rng.integers(0, 2**63 - 1)), options=options)
        self._rng, self.env, self.config_drawn, self._started = rng, env, dict(drawn), True
        return obs, {**info, "config": self.config_drawn}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        return self.env.step(action)

    def metrics(self) -> dict[str, Any]:
        """Metrics of the current episode (:meth:`FlowControlEnv.metrics`)."""
        return self.env.metrics()

    def request_log(self) -> dict[str, np.ndarray]:
        """Per-request arrays of the current episode."""
        return self.env.request_log()

    def view(self) -> Any:
        """The current episode's read-only :class:`~flowgym.envs.view.SystemView`."""
        return self.env.view()

    def safe_budget(self) -> float | None:
        """The current episode's online safe budget."""
        return self.env.safe_budget()
