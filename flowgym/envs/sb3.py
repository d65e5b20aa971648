"""Stable-Baselines3 ``VecEnv`` adapter for the batched FlowControl-v0 environment.

``import flowgym`` does not import this module; importing it needs
``stable-baselines3`` (the ``train`` extra). PPO (or any SB3 algorithm) then
trains on ``N`` batched environments directly, with no ``DummyVecEnv`` loop::

    from stable_baselines3 import PPO
    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(64, observation="flat", horizon=1000)
    venv.seed(0)                      # environment i gets seed 0 + i at the next reset
    PPO("MlpPolicy", venv, n_steps=128).learn(100_000)

SB3 conventions, which differ from Gymnasium's vector API: an environment
that ends a step is reset *in the same step* (the returned observation is
its first observation of the next episode; the last one is in
``infos[i]["terminal_observation"]``, with ``infos[i]["TimeLimit.truncated"]``),
``dones = terminated | truncated``, and infos are a list of ``N`` dicts. The
adapter also puts SB3's ``"episode"`` record (``r`` return, ``l`` length,
``t`` seconds since the adapter was built) in the info of an ending
episode, as ``Monitor`` does, so the PPO logs show ``ep_rew_mean``.

For the same seeds and actions, observations, rewards, dones and terminal
observations equal those of SB3's ``DummyVecEnv`` over ``gym.make("FlowControl-v0")``
environments (tested).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "flowgym.envs.sb3 needs stable-baselines3: pip install -e '.[train]' in the flowgym checkout"
    ) from e

from flowgym.envs.spaces import _holds_bool
from flowgym.envs.vector import FlowControlVectorEnv

__all__ = ["FlowControlSB3VecEnv"]


class FlowControlSB3VecEnv(VecEnv):
    """A :class:`~flowgym.envs.vector.FlowControlVectorEnv` behind Stable-Baselines3's ``VecEnv`` API.

    Args:
        num_envs: number of environments (ignored when ``venv`` is given).
        venv: an existing batched vector environment to wrap (default: build one).
        step_info: put each environment's step info (``t``, ``arrived``,
            ``admitted``, ``evicted``, ... as ``FlowControlEnv.step`` returns it)
            in its info dict. Off by default: building ``N`` dicts per step costs
            more than the step itself at large ``N``.
        **kwargs: the arguments of ``gym.make("FlowControl-v0", ...)`` (without ``venv``).

    Raises:
        ValueError: for configurations the batched engine does not support
            (the message names the argument; use SB3's ``DummyVecEnv`` over
            ``gym.make`` environments for them).
    """

    def __init__(
        self,
        num_envs: int = 1,
        *,
        venv: FlowControlVectorEnv | None = None,
        step_info: bool = False,
        **kwargs: Any,
    ) -> None:
        if venv is None:
            venv = FlowControlVectorEnv(num_envs, **kwargs)
        elif kwargs:
            raise ValueError(f"give either venv or environment arguments, not both (got {sorted(kwargs)})")
        elif not isinstance(venv, FlowControlVectorEnv):
            raise ValueError(f"venv must be a flowgym.envs.vector.FlowControlVectorEnv, got {type(venv).__name__}")
        self.venv = venv
        self.step_info = bool(step_info)
        self.render_mode = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None
        self._ep_return = np.zeros(self.num_envs)
        self._ep_len = np.zeros(self.num_envs, np.int64)
        self._t_start = time.perf_counter()

    # ------------------------------------------------------------------ VecEnv API

    def reset(self) -> Any:
        """Reset every environment with the seeds of :meth:`seed` (then forgotten), as SB3 does. Options given
        with ``set_options`` are refused, as ``DummyVecEnv`` over ``gym.make`` environments refuses them:
        FlowControl-v0 reads none."""
        given = [o for o in self._options if o]
        if given:
            self._reset_options()  # forgotten either way, as SB3 does after a reset
            raise ValueError(f"reset: FlowControl-v0 takes no options, got {sorted(map(str, given[0]))} "
                             "(set_options)")
        seeds: list[int | None] | None = None if all(s is None for s in self._seeds) else list(self._seeds)
        obs, info = self.venv.reset(seed=seeds)
        self._reset_seeds()
        self._reset_options()
        self._ep_return[:] = 0.0
        self._ep_len[:] = 0
        self.reset_infos = [{"t": 0, "arrived": a, **self.venv._loads} for a in info["arrived"].tolist()]
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Remember the actions (budgets, shape ``(num_envs,)``, or ``(num_envs, 1)`` as some SB3 policies give
        them, or one budget with one environment) for :meth:`step_wait`; another shape, or a bool, is refused
        by name; before the first reset ``RuntimeError``, as the vector environment's ``step``."""
        if not self.venv._started:  # the engine has no state to step yet
            raise RuntimeError("call reset() before step()")
        if _holds_bool(actions):  # before asarray, which turns [True, 2, 3] into integers
            raise ValueError(f"actions {actions!r} are not in the action space {self.action_space}: "
                             "it holds a bool, a flag, not a number")
        a = np.asarray(actions)
        if a.shape not in ((self.num_envs,), (self.num_envs, 1)) and not (self.num_envs == 1 and a.shape == ()):
            raise ValueError(f"actions must be an integer array of shape ({self.num_envs},) (or ({self.num_envs}, 1)) "
                             f"in the action space {self.action_space}, got shape {a.shape}: {actions!r}")
        self._actions = self.venv._budgets(a.reshape(self.num_envs))

    def step_wait(self) -> VecEnvStepReturn:
        """One slot for every environment; ending environments are reset at once (SB3 autoreset)."""
        if self._actions is None:
            raise RuntimeError("call step_async() (or step()) before step_wait()")
        venv = self.venv
        reward, terminated, truncated, st = venv._advance(self._actions)
        self._actions = None
        dones = terminated | truncated
        self._ep_return += reward
        self._ep_len += 1
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if self.step_info:
            self._fill_step_info(infos, venv._step_info(st))
        if dones.any():
            final = venv._observe()
            idx = np.flatnonzero(dones)
            elapsed = round(time.perf_counter() - self._t_start, 6)
            for i in idx.tolist():
                info = infos[i]
                info["terminal_observation"] = (
                    {k: v[i] for k, v in final.items()} if isinstance(final, dict) else final[i]
                )
                info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                info["episode"] = {"r": float(self._ep_return[i]), "l": int(self._ep_len[i]), "t": elapsed}
            self._ep_return[idx] = 0.0
            self._ep_len[idx] = 0
            arrived = venv._reset_envs(idx, [None] * idx.size)
            for i, a in zip(idx.tolist(), arrived.tolist()):
                self.reset_infos[i] = {"t": 0, "arrived": a, **venv._loads}
        return venv._observe(), reward.astype(np.float32), dones, infos

    @staticmethod
    def _fill_step_info(infos: list[dict[str, Any]], vinfo: dict[str, Any]) -> None:
        keys = [k for k in vinfo if not k.startswith("_")]
        cols = [vinfo[k].tolist() for k in keys]
        for i, info in enumerate(infos):
            for k, c in zip(keys, cols):
                info[k] = c[i]

    def close(self) -> None:
        """Close the wrapped vector environment."""
        self.venv.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Each environment's attribute ``attr_name``, once per index, as ``DummyVecEnv`` gives it: the single
        environment's ``observation_space``, ``action_space`` and ``metadata`` (not the batched ones), each
        environment's ``request_log`` (a method of no argument); ``unwrapped``, ``engine``, ``np_random`` and
        ``spec`` are refused (there are no single environments); any other attribute the vector environment's
        (all environments share one configuration)."""
        idx = self._get_indices(indices)
        if attr_name == "request_log":  # DummyVecEnv gives each environment's bound method (no argument)
            return [functools.partial(self.venv.request_log, i) for i in idx]
        if attr_name in ("unwrapped", "engine", "np_random", "spec"):
            raise AttributeError(f"FlowControlSB3VecEnv has no per-environment {attr_name!r}: its environments share "
                                 "one batched engine (a DummyVecEnv of gym.make('FlowControl-v0') has single ones)")
        if attr_name in ("observation_space", "action_space", "metadata"):  # the batched env maps them to one env's
            value = self.venv.get_attr(attr_name)[0]
        else:
            value = getattr(self.venv, attr_name)
        return [value for _ in idx]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Not supported: the environments share one configuration."""
        raise AttributeError(f"FlowControlSB3VecEnv cannot set {attr_name!r}: the batched environments share "
                             "one configuration (build a new one instead)")

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Only ``"request_log"``: each environment's per-request arrays."""
        if method_name != "request_log":
            raise AttributeError(f"FlowControlSB3VecEnv.env_method supports 'request_log' only, got {method_name!r}")
        return [self.venv.request_log(i) for i in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        """Always ``False``: there are no per-environment Gymnasium wrappers."""
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """No rendering."""
        return [None for _ in range(self.num_envs)]

    def _get_indices(self, indices: VecEnvIndices) -> Iterable[int]:
        idx = list(super()._get_indices(indices))
        for i in idx:
            if not 0 <= int(i) < self.num_envs:
                raise ValueError(f"environment index {i!r} out of range [0, {self.num_envs})")
        return idx
