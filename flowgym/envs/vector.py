"""FlowControl-v0 as a natively batched Gymnasium vector environment.

``gym.make_vec("FlowControl-v0", num_envs=N, ...)`` calls :func:`make_vector_env`
(the registered ``vector_entry_point``). For the configurations the batched
engine supports (:func:`flowgym.sim.batched.unsupported`; the defaults among them)
it returns a :class:`FlowControlVectorEnv`: ``N`` environments in one set of
numpy arrays (:class:`~flowgym.sim.batched.BatchedEngine`), one pass per slot for
all of them. For any other configuration it returns a
:class:`FlowControlSyncVectorEnv` (Gymnasium's ``SyncVectorEnv`` over single
``FlowControl-v0`` environments) whose ``fallback_reason`` names the argument
that needed it (e.g. ``record="stream"``: the batched engine keeps the full request
log, so streaming-mode environments run as single ones). Either way ``envs.backend`` says which (``"batched"`` or
``"sync"``), and both follow the same semantics: the batched environment's
observations, rewards, terminations, truncations, infos and request logs equal
those of ``gym.make_vec(..., vectorization_mode="sync")`` for the same seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
import operator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space

from flowgym.sim import kernels
from flowgym.sim._checks import is_count
from flowgym.sim._seeding import reseed
from flowgym.sim.batched import BatchedEngine, BudgetError, unsupported
from flowgym.envs.flow_control import DEFAULT_REWARD_WEIGHTS, FlowControlConfig, FlowControlEnv
from flowgym.envs.spaces import LOAD_OBSERVATIONS, _holds_bool

__all__ = ["FlowControlVectorEnv", "FlowControlSyncVectorEnv", "make_vector_env", "batched_unsupported"]

_STEP_INT_KEYS = ("t", "arrived", "rejected", "admitted", "evicted", "wasted_tokens", "completed", "usage",
                  "queue_len", "active")
_OUT_ROW = {name: r for r, name in enumerate(BatchedEngine.OUT_ROWS)}
_INFO_KEYS = (*_STEP_INT_KEYS, "overflow", "kv_usage")
_INFO_KEYS_ALL = [x for k in _INFO_KEYS for x in (k, "_" + k)]  # each key, then its mask (as SyncVectorEnv)
# _step_info's arrays: the OUT_ROWS rows, "rejected", "overflow", "kv_usage", then one mask per key
_INFO_SRC = {**_OUT_ROW, **{k: len(_OUT_ROW) + j for j, k in enumerate(("rejected", "overflow", "kv_usage"))},
             **{"_" + k: len(_OUT_ROW) + 3 + j for j, k in enumerate(_INFO_KEYS)}}
_INFO_PICK = operator.itemgetter(*(_INFO_SRC[k] for k in _INFO_KEYS_ALL))


def batched_unsupported(config: FlowControlConfig, render_mode: str | None = None, **extra: Any) -> str | None:
    """Why ``config`` needs the fallback (naming the argument), or ``None`` when it can be batched."""
    if extra:
        return f"{sorted(extra)} (arguments only single environments take)"
    if render_mode is not None:
        return f"render_mode={render_mode!r} (the batched environment does not render)"
    if config.time_model != "slot":
        return f"time_model={config.time_model!r} (the batched engine runs unit slots only)"
    if config.observation in LOAD_OBSERVATIONS or config.action != "budget":
        return (f"observation={config.observation!r}, action={config.action!r} (the online load tracker runs in "
                "single environments)")
    if getattr(config, "engine", "paper") != "paper":
        return f"engine={config.engine!r} (the batched engine runs the paper's model)"
    record = getattr(config, "record", "full")
    if record != "full":
        return f"record={record!r} (the batched engine keeps the full request log)"
    from flowgym.sim.workloads import make_workload

    try:
        wl = make_workload(config.workload)
    except Exception:  # noqa: BLE001 - let the single environment raise its own error
        return "workload (not buildable here)"
    return unsupported(config.M, wl, eviction=config.eviction, queue_order=config.queue_order,
                       per_class=config.per_class_budget)


class FlowControlVectorEnv(VectorEnv):
    """``num_envs`` FlowControl-v0 environments stepped together in one set of numpy arrays.

    ## Spaces

    ``single_observation_space`` and ``single_action_space`` are those of
    ``gym.make("FlowControl-v0", **kwargs)`` (a ``Dict`` of float32 ``Box``es or,
    with ``observation="flat"``, one ``Box``; ``Discrete(max_budget + 1)``).
    ``observation_space`` and ``action_space`` are their batched forms
    (``gymnasium.vector.utils.batch_space``): observations have a leading axis
    of length ``num_envs`` (with ``"dict"``, each key is a view of one fresh
    float32 ``(num_envs, features)`` array), actions are ``num_envs`` budgets
    (a ``MultiDiscrete``; any integer array of shape ``(num_envs,)`` in range).

    ## Autoreset

    ``metadata["autoreset_mode"] = AutoresetMode.NEXT_STEP``, as Gymnasium's own
    ``CartPoleVectorEnv`` and ``SyncVectorEnv``: the step on which an environment
    is truncated (or terminated) returns its final observation; on the next
    step its action is ignored (but still checked against the action space, unlike
    ``SyncVectorEnv``: every action must be a valid budget), it is reset, and that step returns its first
    observation with reward 0, ``terminated = truncated = False`` and the reset
    info (``t``, ``arrived``, ``rho``). ``reset(options={"reset_mask": mask})``
    resets only the masked environments.

    ## Seeding

    ``reset(seed=s)`` seeds environment ``i`` with ``s + i`` (a list seeds each
    one); ``reset()`` without a seed continues each environment's generator, as
    autoresets do. Environment ``i`` then draws exactly the requests that
    ``gym.make("FlowControl-v0").reset(seed=s + i)`` draws, so for the same seeds
    everything (observations, rewards, infos, :meth:`request_log`) equals
    ``gym.make_vec(..., vectorization_mode="sync")``.

    ## Infos

    A dict of arrays of length ``num_envs`` with a boolean ``"_key"`` mask per
    key, as ``SyncVectorEnv`` builds them from the single environments' infos.

    ## Supported configurations

    Unit slots (``time_model="slot"``), a ``"poisson"`` (multi-class) or endless
    ``"iid"`` workload whose requests all fit in ``M`` (nothing is rejected),
    ``queue_order="fifo"``, ``eviction="lifo"`` or ``"all"``, a global budget
    (``per_class_budget=False``), known or unknown output lengths, dict or flat
    observations, any reward weights, horizon and feature settings, no
    ``render_mode`` (:meth:`render` returns ``None`` for each environment, as the
    sync fallback does without one). Anything else raises ``ValueError`` naming the argument;
    :func:`make_vector_env` (what ``gym.make_vec`` calls) falls back to
    :class:`FlowControlSyncVectorEnv` instead.

    Args:
        num_envs: number of environments.
        config: a :class:`~flowgym.envs.flow_control.FlowControlConfig` or a mapping; keyword
            arguments (those of ``gym.make("FlowControl-v0", ...)``) override it.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}
    #: ``"batched"``: this class; :class:`FlowControlSyncVectorEnv` says ``"sync"``.
    backend = "batched"
    fallback_reason: str | None = None

    def __init__(
        self,
        num_envs: int = 1,
        config: FlowControlConfig | dict[str, Any] | None = None,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        cfg = FlowControlConfig.from_any(config, **kwargs)
        why = batched_unsupported(cfg, render_mode)
        if why is not None:
            raise ValueError(
                f"FlowControlVectorEnv does not support {why}; gym.make_vec('FlowControl-v0', ...) falls back "
                "to single environments for it (flowgym.envs.vector.make_vector_env)"
            )
        proto = FlowControlEnv(cfg)  # the single env: spaces, features, reward weights, load
        self.config = cfg
        self.num_envs = N = int(num_envs)
        self.render_mode = None
        self.single_observation_space = proto.observation_space
        self.single_action_space = proto.action_space
        self.observation_space = batch_space(self.single_observation_space, N)
        self.action_space = batch_space(self.single_action_space, N)
        self.features = f = proto.features
        self._dict_obs = cfg.observation == "dict"
        self._slices = list(f.slices.items())
        self._s_hist = f.slices["generated_hist"]
        self._i_rate = f.slices["arrival_rate"].start
        self._s_proj = f.slices.get("projected_usage")
        self._s_cls = f.slices.get("class_queue")
        self.engine = BatchedEngine(
            N,
            cfg.M,
            proto.workload,
            eviction=cfg.eviction,
            hist_edges=cfg.hist_edges,
            projection_offsets=cfg.projection_offsets if cfg.output_length_known else None,
            track_class_queue=proto.engine.track_class_queue,
        )
        w = {**DEFAULT_REWARD_WEIGHTS, **cfg.reward_weights}
        s = float(cfg.reward_scale)
        self._w_in, self._w_waste, self._w_ev, self._w_done = (
            w["in_system"] / s, w["wasted_tokens"] / s, w["evictions"] / s, w["completed"] / s)
        self._alpha = 1.0 / float(cfg.rate_window)
        self._horizon = int(cfg.horizon)  # type: ignore[arg-type]  # endless workloads have one
        self._max_budget = int(cfg.max_budget)
        # the loads of the reset info, as the single env's (slot model: the batched env has no continuous time)
        self._loads = {"rho": proto.workload.load(cfg.M), "rho_episode": proto.workload.episode_load(cfg.M, cfg.horizon),
                       "rho_peak": proto.workload.peak_load(cfg.M, cfg.horizon)}
        self._np_randoms: list[np.random.Generator | None] = [None] * N
        # each environment's workload generator, re-seeded at every reset (flowgym.sim._seeding.reseed)
        self._wl_rngs: list[np.random.Generator | None] = [None] * N
        self._rate = np.zeros(N)
        self._autoreset = np.zeros(N, dtype=bool)
        self._any_autoreset = False
        self._started = False
        self._weights = np.array([self._w_in, self._w_waste, self._w_ev, self._w_done])
        self._pending_obs: np.ndarray | None = None  # computed with the step's reward (compiled path)
        self._no_out = np.zeros((len(BatchedEngine.OUT_ROWS), 1), np.int64)
        self._no_skip = np.zeros(N, bool)
        self._no_flags = np.zeros((3, 1), bool)
        self._pending_info: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._n_truncated = 0  # truncated environments of the last compiled step

    # ------------------------------------------------------------------ internals shared with the SB3 adapter

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        return _seed_list(seed, self.num_envs)

    def _reset_envs(self, idx: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        """Reset environments ``idx`` (as ``FlowControlEnv.reset(seed=...)``); returns their arrivals."""
        wl_seeds = []
        for i, s in zip(idx.tolist(), seeds):
            if s is not None:
                self._np_randoms[i] = seeding.np_random(s)[0]
            elif self._np_randoms[i] is None:
                self._np_randoms[i] = seeding.np_random()[0]
            gen = self._np_randoms[i]
            assert gen is not None
            wl_seeds.append(int(gen.integers(0, 2**63 - 1)))
        # np.random.default_rng(seed) for each (as FlowControlEnv.reset), the generators re-seeded in place
        rngs = reseed(wl_seeds, [self._wl_rngs[i] for i in idx.tolist()])
        for i, rng in zip(idx.tolist(), rngs):
            self._wl_rngs[i] = rng
        self._pending_obs = None
        self.engine.reset(idx, rngs)
        arrived = self.engine.last_arrivals[idx]
        self._rate[idx] = arrived * self._alpha
        self._started = True
        return arrived

    def _reset_info(self, idx: np.ndarray, arrived: np.ndarray, info: dict[str, Any]) -> dict[str, Any]:
        N = self.num_envs
        for key, vals, dtype in (("t", 0, np.int64), ("arrived", arrived, np.int64)):
            arr = info.get(key)
            if arr is None:
                arr = np.zeros(N, dtype)
                info[key] = arr
                info["_" + key] = np.zeros(N, bool)
            arr[idx] = vals
            info["_" + key][idx] = True
        for key, load in self._loads.items():
            vals = np.full(N, None, dtype=object) if load is None else np.zeros(N)
            vals[idx] = load
            info[key] = vals
            mask = np.zeros(N, bool)
            mask[idx] = True
            info["_" + key] = mask
        return info

    def _budgets(self, actions: Any, check_range: bool = True) -> np.ndarray:
        """``actions`` as int64 budgets; ``check_range=False`` leaves the range check to :meth:`_advance`."""
        N = self.num_envs
        a = np.asarray(actions)
        has_bool = _holds_bool(actions)
        if a.shape != (N,) or a.dtype.kind not in "iu" or has_bool:
            flag = ": it holds a bool, a flag, not a number" if has_bool or a.dtype.kind == "b" else ""
            raise ValueError(
                f"actions must be an integer array of shape ({N},) in the action space {self.action_space}, "
                f"got {actions!r}{flag}"
            )
        if (check_range or a.dtype.kind == "u") and a.size and (  # unsigned: checked before int64 could wrap it
                int(a.min()) < 0 or int(a.max()) > self._max_budget):
            raise self._range_error(actions)
        return a.astype(np.int64)

    def _range_error(self, actions: Any) -> ValueError:
        return ValueError(f"actions {actions!r} are not in the action space {self.action_space} "
                          f"(budgets 0..{self._max_budget})")

    def _advance(self, budget: np.ndarray, skip: np.ndarray | None = None, checked: bool = True) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, np.ndarray
    ]:
        """One slot for every environment: serve, reward, truncation, then next arrivals (not for ``skip``).

        ``checked=False``: the budgets' range is checked here (by the engine, before anything changes).
        Returns the reward, terminated and truncated arrays and the engine's slot figures
        (:meth:`BatchedEngine.advance`, rows ``BatchedEngine.OUT_ROWS``).
        """
        eng = self.engine
        try:  # serve, then the next arrivals where episodes go on
            out = eng.advance(budget, skip, self._horizon, None if checked else self._max_budget)
        except BudgetError as e:
            raise self._range_error(budget) from e
        if eng.jit:  # reward, flags, kv usage, arrival-rate average and observation in one compiled pass
            N = self.num_envs
            reward, kv = np.empty((2, N))
            flags = np.empty((3, N), dtype=bool)  # terminated, truncated, overflow
            self._pending_obs = self._observe_jit(out, reward, skip, kv, flags)
            self._pending_info = (out, flags[2], kv)
            return reward, flags[0], flags[1], out
        terminated = np.zeros(self.num_envs, dtype=bool)  # endless workloads never terminate
        truncated = eng.t >= self._horizon
        st = dict(zip(eng.OUT_ROWS, out))
        reward = -(self._w_in * st["in_system"] + self._w_waste * st["wasted_tokens"] + self._w_ev * st["evicted"]
                   - self._w_done * st["completed"])
        stop = truncated if skip is None else truncated | skip
        if not stop.any():
            self._rate += (eng.last_arrivals - self._rate) * self._alpha
        elif not stop.all():
            idx = np.flatnonzero(~stop)
            self._rate[idx] += (eng.last_arrivals[idx] - self._rate[idx]) * self._alpha
        return reward, terminated, truncated, out

    def _observe_jit(self, out: np.ndarray | None = None, reward: np.ndarray | None = None,
                     skip: np.ndarray | None = None, kv: np.ndarray | None = None,
                     flags: np.ndarray | None = None) -> np.ndarray:
        """Observation rows (compiled); with ``out`` also the step's other outputs (see ``vector_observe``)."""
        eng = self.engine
        f = self.features
        N = self.num_envs
        v = np.empty((N, f.size), dtype=np.float32)
        update = out is not None
        c_cls = self._s_cls.start if self._s_cls is not None else 0
        n_truncated = kernels.vector_observe(
            eng.counters, eng.H, eng.class_queue, f.m if self._s_cls is not None else 0,
            self._no_skip if skip is None else skip, self._horizon, update, self._rate, self._alpha, f.M,
            f.queue_cap, f.queue_token_cap, self._s_hist.start, self._i_rate, c_cls, v,
            out if update else self._no_out, self._weights, reward if update else self._rate,
            kv if update else self._rate, flags if update else self._no_flags)
        if update:  # an observation alone (after resets) leaves the step's count as it was
            self._n_truncated = n_truncated
        return v

    def _step_info(self, out: np.ndarray) -> dict[str, Any]:
        """The step's info dict from :meth:`_advance`'s slot figures (fresh arrays)."""
        N = self.num_envs
        pending, self._pending_info = self._pending_info, None
        if pending is not None and pending[0] is out:  # computed by the compiled pass for this step
            overflow, kv = pending[1], pending[2]
        else:
            overflow, kv = out[_OUT_ROW["evicted"]] > 0, out[_OUT_ROW["usage"]] / self.config.M
        # the rows of the fresh block, "rejected" (nothing is rejected here), then a fresh mask row per key
        masks = np.empty((len(_INFO_KEYS), N), bool)
        masks.fill(True)  # (faster than np.ones)
        arrays = [*out, np.zeros(N, np.int64), overflow, kv, *masks]
        return dict(zip(_INFO_KEYS_ALL, _INFO_PICK(arrays)))

    def _observe(self) -> Any:
        eng = self.engine
        f = self.features
        M = f.M
        qc = f.queue_cap
        v = self._pending_obs
        self._pending_obs = None  # each observation is a fresh array
        if v is None and eng.jit:
            v = self._observe_jit()
        if v is None:
            v = np.empty((self.num_envs, f.size), dtype=np.float32)
            v[:, 0] = eng.held / M
            v[:, 1] = np.minimum(eng.n_queued, qc)
            v[:, 2] = eng.n_active
            v[:, 3] = np.minimum(eng.queued_prompt_tokens / M, f.queue_token_cap)
            v[:, self._s_hist] = eng.H
            v[:, self._i_rate] = np.minimum(self._rate, qc)
            if self._s_cls is not None:
                v[:, self._s_cls] = np.minimum(eng.class_queue[:, : f.m], qc)
        if self._s_proj is not None:
            v[:, self._s_proj] = np.minimum(eng.projected_usage() / M, f.projection_cap)
        if self._dict_obs:
            return {name: v[:, s] for name, s in self._slices}
        return v

    # ------------------------------------------------------------------ VectorEnv API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every environment (or those of ``options["reset_mask"]``); seeds ``seed + i``."""
        other = sorted(map(str, set(options or {}) - {"reset_mask"}))
        if other:
            raise ValueError(f"reset: the only option is 'reset_mask', got {other}")
        seeds = self._seeds(seed)
        N = self.num_envs
        mask = None if options is None else options.get("reset_mask")
        if mask is not None:
            mask = np.asarray(mask)
            if mask.shape != (N,) or mask.dtype != np.bool_ or not mask.any():
                raise ValueError(f"options['reset_mask'] must be a boolean array of shape ({N},) with a True, "
                                 f"got {mask!r}")
            if not self._started and not mask.all():
                raise ValueError("the first reset must reset every environment (no reset_mask)")
            idx = np.flatnonzero(mask)
        else:
            idx = np.arange(N)
        arrived = self._reset_envs(idx, [seeds[i] for i in idx.tolist()])
        self._autoreset[idx] = False
        self._any_autoreset = bool(self._autoreset.any())
        return self._observe(), self._reset_info(idx, arrived, {})

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every environment one slot with budgets ``actions`` (autoreset: next step)."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        auto = self._autoreset
        any_auto = self._any_autoreset
        # every action is checked, also those of resetting environments (ignored, set to 0 below);
        # on the compiled path the engine checks the range of the others
        check_here = any_auto or not self.engine.jit
        budget = self._budgets(actions, check_range=check_here)
        if any_auto:
            budget[auto] = 0
        reward, terminated, truncated, out = self._advance(budget, auto if any_auto else None, checked=check_here)
        info = self._step_info(out)
        if any_auto:
            idx = np.flatnonzero(auto)
            reward[idx] = 0.0
            truncated[idx] = False
            terminated[idx] = False
            if idx.size == self.num_envs:  # every env resets: only reset infos, as SyncVectorEnv
                info = {}
            for key, val in info.items():
                if key.startswith("_"):
                    val[idx] = False
                else:
                    val[idx] = 0
            arrived = self._reset_envs(idx, [None] * idx.size)
            self._reset_info(idx, arrived, info)
        self._autoreset = terminated | truncated
        self._any_autoreset = self._n_truncated > 0 if self.engine.jit else bool(self._autoreset.any())
        return self._observe(), reward, terminated, truncated, info

    def render(self) -> tuple[None, ...]:
        """``None`` for each environment, as the sync fallback's environments (which have no ``render_mode``
        either) render; before the first reset ``RuntimeError``, as they refuse."""
        if not self._started:
            raise RuntimeError("call reset() before render()")
        return (None,) * self.num_envs

    def request_log(self, i: int) -> dict[str, np.ndarray]:
        """Per-request arrays of environment ``i``'s current episode (as ``FlowControlEnv.request_log``)."""
        return self.engine.request_log(_env_index(i, self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each environment's ``name``, as ``SyncVectorEnv.get_attr`` gives it (so code written for the sync
        fallback runs here too), for what the environments have apart from the shared engine: the single
        environment's ``observation_space``, ``action_space`` and ``metadata``, the shared ``config`` and
        ``render_mode``, and ``request_log`` (called, as ``SyncVectorEnv`` calls a method: each log).
        Anything else (``unwrapped``, ``engine``, ``workload``, ...) exists per environment only in single
        environments: ``AttributeError`` names ``vectorization_mode='sync'``."""
        if name == "request_log":
            return self.call(name)
        if name in ("observation_space", "action_space"):
            value = getattr(self, "single_" + name)
        elif name == "metadata":
            value = FlowControlEnv.metadata
        elif name in ("config", "render_mode"):
            value = getattr(self, name)
        else:
            raise AttributeError(_NO_PER_ENV.format(what=f"no per-environment {name!r}"))
        return (value,) * self.num_envs

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``SyncVectorEnv.call`` where it has a meaning here: ``call("request_log")`` is each environment's
        request log, and an attribute :meth:`get_attr` knows gives its values. Anything else is refused, naming
        ``vectorization_mode='sync'``."""
        if name == "request_log":
            if args or kwargs:
                raise AttributeError(_NO_PER_ENV.format(what="request_log takes no arguments per environment"))
            return tuple(self.request_log(i) for i in range(self.num_envs))
        return self.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Not supported: the environments share one configuration in one engine."""
        raise AttributeError(f"the batched FlowControl-v0 vector env cannot set {name!r}: its environments share "
                             "one configuration (build a new one, or use vectorization_mode='sync')")

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release."""


#: What the batched env says of a per-environment attribute or method it does not have.
_NO_PER_ENV = ("the batched FlowControl-v0 vector env has {what} (its environments share one engine); "
               "gym.make_vec(..., vectorization_mode='sync') keeps single environments that have it")


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _seed_list(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    """``reset(seed=...)``'s seed of each of ``n`` environments (``seed + i``, or a list's entries, numpy integers
    as ints), every one checked before any environment is seeded: a refused seed changes nothing."""
    if seed is None:
        return [None] * n
    if _is_int(seed):
        seeds: list[Any] = [int(seed) + i for i in range(n)]
    else:
        if (not hasattr(seed, "__iter__") or isinstance(seed, (str, bytes))
                or (isinstance(seed, np.ndarray) and seed.ndim == 0)):  # a float, a bool, a string, a 0-d array
            raise ValueError(f"seed must be an int, None or a list of {n} seeds, got {seed!r}")
        seeds = list(seed)
        if len(seeds) != n:
            raise ValueError(f"seed must be an int, None or a list of {n} seeds, got {len(seeds)} seeds")
    for i, s in enumerate(seeds):
        if s is not None and not is_count(s):
            raise ValueError(f"seed must be an int, None or a list of {n} seeds, each a non-negative int or None; "
                             f"got {seed!r} (seed {s!r} of environment {i})")
    return [None if s is None else int(s) for s in seeds]


def _env_index(i: Any, n: int) -> int:
    """``i`` as an environment index in ``[0, n)``, else ``ValueError`` (a float or a bool is not an index)."""
    if not _is_int(i) or not 0 <= i < n:
        raise ValueError(f"i must be an environment index in [0, {n}), got {i!r}")
    return int(i)


class FlowControlSyncVectorEnv(SyncVectorEnv):
    """Gymnasium's ``SyncVectorEnv`` over single FlowControl-v0 environments: the fallback.

    :func:`make_vector_env` returns it for configurations the batched engine does
    not support; ``fallback_reason`` names the argument. Same API and semantics
    (autoreset ``NEXT_STEP``, seeds ``seed + i``), a Python loop over environments.
    """

    backend = "sync"

    def __init__(self, num_envs: int, reason: str, **kwargs: Any) -> None:
        self.fallback_reason: str | None = reason

        def make() -> gym.Env:
            return gym.make("FlowControl-v0", **kwargs)

        super().__init__([make for _ in range(int(num_envs))])

    def request_log(self, i: int) -> dict[str, np.ndarray]:
        """Per-request arrays of environment ``i``'s current episode (as ``FlowControlEnv.request_log``)."""
        return self.envs[_env_index(i, self.num_envs)].unwrapped.request_log()

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """As ``SyncVectorEnv.reset``, with the seeds checked before any environment is reset (a bad one changes
        nothing) and numpy integers taken, as the batched environment does."""
        return super().reset(seed=_seed_list(seed, self.num_envs), options=options)

    def step(self, actions: Any) -> Any:
        """Every environment's action is checked before any environment steps (a bad one changes nothing)."""
        from gymnasium.vector.utils import iterate

        try:
            batch = list(iterate(self.action_space, actions))
        except (TypeError, ValueError):
            batch = None
        if batch is None or len(batch) != self.num_envs:  # checked before any environment steps
            raise ValueError(f"actions must be a batch of {self.num_envs} actions (one per environment) in the "
                             f"action space {self.action_space}, got {actions!r}")
        for i, (env, a) in enumerate(zip(self.envs, batch)):
            try:
                env.unwrapped.check_action(a)
            except ValueError as e:
                raise ValueError(f"env {i}: {e}") from None
        return super().step(actions)


def make_vector_env(num_envs: int = 1, **kwargs: Any) -> VectorEnv:
    """The ``vector_entry_point`` of FlowControl-v0: batched when supported, else the sync fallback.

    Takes the keyword arguments of ``gym.make("FlowControl-v0", ...)``. Returns a
    :class:`FlowControlVectorEnv` (``backend == "batched"``) or, naming the reason
    in ``fallback_reason``, a :class:`FlowControlSyncVectorEnv` (``backend == "sync"``).
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    kw = dict(kwargs)
    render_mode = kw.pop("render_mode", None)
    extra = {k: kw.pop(k) for k in ("max_episode_steps", "disable_env_checker") if k in kw}
    cfg = FlowControlConfig.from_any(kw.pop("config", None), **kw)  # raises on bad arguments
    why = batched_unsupported(cfg, render_mode, **extra)
    if why is None:
        return FlowControlVectorEnv(num_envs, cfg)
    return FlowControlSyncVectorEnv(num_envs, why, **kwargs)
