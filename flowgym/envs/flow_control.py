"""FlowControl-v0: activation-budget control of an LLM server with a KV-cache limit."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from flowgym.sim._checks import MAX_COUNT, is_finite_real
from flowgym.sim.admission import AdmissionRule
from flowgym.sim.engine import EVICTION_RULES, QUEUE_ORDERS, RECORD_MODES, Engine
from flowgym.sim.vllm import ENGINE_MODES, VLLM_MODE, VllmOptions, make_engine
from flowgym.envs import rendering
from flowgym.envs.spaces import (
    DictObservation,
    Features,
    FlatObservation,
    GlobalBudget,
    LOAD_OBSERVATIONS,
    LoadObservation,
    LogMultiplierBudget,
    MULTIPLIER_OF,
    MultiplierBudget,
    PerClassBudget,
    TWO_ANCHORS,
    one_of,
)
from flowgym.sim.estimators import LoadTracker
from flowgym.envs.view import SystemView
from flowgym.sim.workloads import Workload, make_workload

__all__ = ["FlowControlConfig", "FlowControlEnv", "PAPER_CLASSES", "DEFAULT_WORKLOAD", "OBSERVATION_OPTIONS"]

#: Arguments that shape what an agent observes or how its admissions play out: a learned agent declares them at
#: their trained values (``flowgym_agent.json``'s ``agent_env_options``), and a scenario setting one differently
#: is refused by name.
OBSERVATION_OPTIONS = (
    "output_length_known",
    "queue_cap",
    "queue_token_cap",
    "hist_edges",
    "projection_offsets",
    "projection_cap",
    "rate_window",
    "duration_cap",
    "eviction",
    "queue_order",
)

#: The paper's three synthetic classes ``(l_k, o_k)`` (Section 4.1).
PAPER_CLASSES = ((10, 20), (10, 40), (10, 60))

#: Default workload: the paper's classes at ``lambda = 3.5`` per class per slot,
#: a stable load ``rho = 3.5 * 4060 / 16492 = 0.86`` (the paper's ``lambda = 5``
#: gives ``rho = 1.23``, beyond Proposition 1's stability limit).
DEFAULT_WORKLOAD: dict[str, Any] = {"kind": "poisson", "classes": [list(c) for c in PAPER_CLASSES], "rates": 3.5}

DEFAULT_REWARD_WEIGHTS: dict[str, float] = {
    "in_system": 1.0,
    "wasted_tokens": 1.0,
    "evictions": 0.0,
    "completed": 0.0,
}


def _default_workload() -> dict[str, Any]:
    return {k: (list(map(list, v)) if k == "classes" else v) for k, v in DEFAULT_WORKLOAD.items()}


#: The configuration's on/off fields, which must be real booleans.
BOOL_FIELDS = ("output_length_known", "per_class_budget")
# Largest ``M``, ``horizon`` and ``estimate_floor``: ``flowgym.sim._checks.MAX_COUNT`` (2**53, below which every
# integer is also an exact float), imported above.
#: Largest ``max_budget`` (and histogram edge, projection offset): far above any batch, and ``Discrete`` stays small.
MAX_BUDGET_CAP = 10**9
#: Largest cap of an observation entry: the bounds of the ``Box`` are float32.
OBS_BOUND_CAP = 1e30
#: Largest multiplier of ``action="multiplier"`` / ``"log-multiplier"`` (any budget above ``max_budget`` is capped).
MAX_MULTIPLIER = 1e12


#: The largest ``|reward weight| / reward_scale``: a slot's reward sums a few such terms times counts below
#: 1e18, so it stays finite (1e308 weights over a scale of 0.5 gave inf - inf = nan).
MAX_REWARD_WEIGHT = 1e100


@dataclass
class FlowControlConfig:
    """Every argument of :class:`FlowControlEnv`, with its default.

    Pass them as keyword arguments to ``gym.make("FlowControl-v0", ...)``, or
    as one ``config=`` mapping or instance. Plain values (mapping workloads)
    keep ``env.spec.to_json()`` round-tripping.
    """

    #: KV-cache budget in tokens (the paper's ``M``; 16492 is Llama-2-70B on two A100s).
    M: int = 16492
    #: Where requests come from: a :class:`~flowgym.sim.workloads.Workload` or its mapping form.
    workload: Any = field(default_factory=_default_workload)
    #: Slots per episode (``truncated`` after it). ``None`` only for finite traces.
    horizon: int | None = 1000
    #: Largest activation budget the action can ask for (per class with ``per_class_budget``).
    max_budget: int = 64
    #: Action is a ``MultiDiscrete`` of per-class budgets ``b_k`` (Algorithm 1); needs classes and known lengths.
    per_class_budget: bool = False
    #: Whether output lengths (and classes) may be observed; ``False`` is the paper's unknown case.
    output_length_known: bool = False
    #: Eviction rule on overflow: ``"lifo"`` (Algorithm 2), ``"all"`` (memory reset) or
    #: ``"estimate"`` (ascending output estimate, A_min). See :mod:`flowgym.sim.rules`.
    eviction: str = "lifo"
    #: Queue order: ``"fifo"`` (default), ``"sjf"`` (shortest known output first; needs
    #: known lengths) or ``"estimate"`` (smallest output estimate first).
    queue_order: str = "fifo"
    #: Initial output estimate of every request (``estimate`` order and eviction, A_min): ``None`` (default)
    #: takes the workload's shortest possible output (``Workload.min_output_tokens()``, 1 when it states none):
    #: the paper's A_min "treats the decoding length of each request as the shortest possible value".
    estimate_floor: int | None = None
    #: ``"dict"`` (a ``Dict`` of ``Box``es), ``"flat"`` (one ``Box``, for ``MlpPolicy``),
    #: ``"load"`` (one ``Box`` of the 17 scale-free load features of
    #: :mod:`flowgym.sim.estimators`: the same meaning at any ``M``, rate or length scale) or
    #: ``"load-v2"`` (those 17 and 3 more: :data:`~flowgym.sim.estimators.LOAD_FEATURES_V2`) or
    #: ``"load-v3"`` (those 20 and 2 more: :data:`~flowgym.sim.estimators.LOAD_FEATURES_V3`) or
    #: ``"load-v4"`` (those 22 and 3 more: :data:`~flowgym.sim.estimators.LOAD_FEATURES_V4`).
    observation: str = "dict"
    #: ``"budget"`` (the action is ``B_t``) or ``"multiplier"`` (the action is the index ``a`` of
    #: ``multipliers``; ``B_t = clip(round(multipliers[a] * M / E_hat[w]), 1, max_budget)`` with the
    #: online safe budget ``M / E_hat[w]`` of :class:`~flowgym.sim.estimators.LoadTracker`), or
    #: ``"log-multiplier"`` (one float ``a`` in ``[-1, 1]``: the multiplier
    #: ``k = k_min * (k_max / k_min) ** ((a + 1) / 2)`` between the smallest and the largest of
    #: ``multipliers``, of the same anchor; :class:`~flowgym.envs.spaces.LogMultiplierBudget`).
    action: str = "budget"
    #: The multipliers ``k`` of ``action="multiplier"`` (positive, ascending).
    multipliers: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    #: What ``action="multiplier"`` multiplies: ``"safe"`` (the safe budget ``M / E_hat[w]``) or
    #: ``"rate"`` (the tracker's arrival rate, moving average over 32 decision points: ``k``
    #: starts per arrival; admitting a little faster than requests arrive keeps up with them
    #: without releasing a backlog all at once), ``"both"``: ``Discrete(2 * len(multipliers))``,
    #: the first half multiplies the rate, the second the safe budget, or ``"min"``: the smaller
    #: of the rate and the safe budget. With ``action="log-multiplier"`` also ``"max"``: two
    #: floats, a multiplier of each anchor, ``B_t`` the larger product
    #: (:class:`~flowgym.envs.spaces.LogMultiplierBudget`), ``"max-head"``: the same with the
    #: rate anchor the larger of the rate now and when the queue head arrived, and ``"max-drain"``:
    #: three floats, those two and ``k_drain`` of a drain term ``min(queued / 50, k_drain * safe)``.
    multiplier_of: str = "safe"
    #: Cap for observed counts (queue length, per-class queues, arrival rate).
    queue_cap: int = 4096
    #: Cap for observed queued prompt tokens, in units of ``M``.
    queue_token_cap: float = 64.0
    #: Left edges of the bins of the generated-tokens histogram (first must be 0).
    hist_edges: tuple[int, ...] = (0, 8, 16, 32, 64, 128, 256, 512)
    #: Offsets ``h`` (slots) of the projected KV usage (known lengths only).
    projection_offsets: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
    #: Cap of the projected usage, in units of ``M``.
    projection_cap: float = 4.0
    #: Time constant (slots, at least 1; or seconds in continuous time) of the arrival-rate moving average.
    rate_window: float = 32.0
    #: ``"slot"`` (unit slots, the paper's discrete model) or a batch latency model for
    #: continuous time: a preset name (``"llama2-70b-tp2-a100"``, ``"jaillet2025"``), a
    #: mapping (``{"kind": "linear", "c0": ..., ...}``) or a callable. See :mod:`flowgym.sim.latency`.
    time_model: Any = "slot"
    #: Cap of the observed last iteration duration (seconds, continuous time).
    duration_cap: float = 60.0
    #: Reward is divided by this.
    reward_scale: float = 100.0
    #: Reward weights: ``in_system``, ``wasted_tokens``, ``evictions`` (costs) and ``completed`` (a gain).
    reward_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_REWARD_WEIGHTS))
    #: What the environment keeps of the run. ``"full"`` (default): every request and every
    #: slot's record (``request_log()``, ``series()``, metrics at any horizon; about 70 bytes a
    #: request). ``"stream"``: memory stays flat on runs of any length: finished requests are
    #: folded into running sums (the same counts and means; ``p95_latency`` from a bounded
    #: sketch), ``series()`` keeps the last 4,096 slots, ``request_log()`` raises. See
    #: :mod:`flowgym.sim.streaming` and ``docs/model.md``.
    record: str = "full"
    #: The engine mode: ``"paper"`` (default: the paper's token-level model of ``docs/model.md``,
    #: exactly) or ``"vllm-v1"`` (one vLLM V1 scheduler step per environment step: KV in blocks,
    #: admission by free blocks within ``max_num_seqs`` and a per-step token budget with chunked
    #: prefill, recompute preemption; :mod:`flowgym.sim.vllm`, ``docs/serving.md``). The action
    #: stays the activation budget ``B_t``, an upper bound on this step's admissions.
    engine: str = "paper"
    #: Options of ``engine="vllm-v1"`` (:class:`~flowgym.sim.vllm.VllmOptions`: ``block_size``,
    #: ``max_num_seqs``, ``max_num_batched_tokens``, ``long_prefill_token_threshold``,
    #: ``chunked_prefill``, ``admission``, ``reserve_full_isl``, ``reserve_full_prompt``, ``watermark``, ``preemption``,
    #: ``preempt_order``, ``requeue``, ``lookahead_tokens``, ``max_tokens``); empty for ``"paper"``.
    engine_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def check_names(cls, arguments: Mapping[str, Any], where: str = "") -> None:
        """``ValueError`` (prefixed by ``where``) naming every key of ``arguments`` that is no FlowControl-v0
        argument, and listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(map(str, set(arguments) - names))
        if unknown:
            raise ValueError(f"{where}unknown FlowControl-v0 argument(s) {unknown}; valid: {sorted(names)}")

    @classmethod
    def from_any(cls, config: FlowControlConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> FlowControlConfig:
        """Build from an instance, a mapping and/or keyword arguments (keywords win); validate."""
        base: dict[str, Any] = {}
        if isinstance(config, FlowControlConfig):
            # the fields themselves (asdict would deep-copy them: a callable time_model holding a lock
            # would fail, a stateful one be replaced by a copy)
            base = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        elif isinstance(config, Mapping):
            base = dict(config)
        elif config is not None:
            raise ValueError(f"config must be a FlowControlConfig or a mapping, got {type(config).__name__}")
        base.update(kwargs)
        cls.check_names(base)
        for f in dataclasses.fields(cls):  # a list where the default is a tuple (JSON, TOML) becomes the tuple:
            if isinstance(f.default, tuple) and isinstance(base.get(f.name), list):  # equal configs compare equal
                base[f.name] = tuple(base[f.name])
        cfg = cls(**base)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""

        def pos_int(name: str, v: Any) -> None:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")

        def pos_num(name: str, v: Any) -> None:
            if not is_finite_real(v) or not v > 0:  # is_finite_real: 10**400 too, which math.isfinite raises on
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")

        def at_most(name: str, v: Any, cap: float, why: str) -> None:
            if v > cap:
                shown = f"{cap:d}" if isinstance(cap, int) else f"{cap:g}"
                raise ValueError(f"{name} must be at most {shown} ({why}), got {v!r}")

        for name in BOOL_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):  # a string such as "false" would be truthy
                raise ValueError(f"{name} must be True or False, got {v!r}")
        pos_int("M", self.M)
        at_most("M", self.M, MAX_COUNT, "2**53, tokens the simulator counts exactly")
        if self.horizon is not None:
            pos_int("horizon", self.horizon)
            at_most("horizon", self.horizon, MAX_COUNT, "2**53, slots the simulator counts exactly")
        pos_int("max_budget", self.max_budget)
        at_most("max_budget", self.max_budget, MAX_BUDGET_CAP, "the action space's size")
        pos_int("queue_cap", self.queue_cap)
        for name in ("queue_token_cap", "projection_cap", "rate_window", "reward_scale", "duration_cap"):
            pos_num(name, getattr(self, name))
        for name in ("queue_cap", "queue_token_cap", "projection_cap", "duration_cap"):
            at_most(name, getattr(self, name), OBS_BOUND_CAP, "an observation bound, a float32")
        if not math.isfinite(1.0 / float(self.reward_scale)):
            raise ValueError(f"reward_scale must be a positive number whose inverse is finite, got {self.reward_scale!r}")
        if self.time_model == "slot" and self.rate_window < 1:
            raise ValueError(f"rate_window is the arrival rate's time constant in slots: it must be >= 1 (a "
                             f"moving-average weight 1 / rate_window above 1 would overshoot), got {self.rate_window!r}")
        for name, table in (("eviction", EVICTION_RULES), ("queue_order", QUEUE_ORDERS)):
            v = getattr(self, name)
            if not isinstance(v, str) or v not in table:
                raise ValueError(f"{name} must be one of {sorted(table)}, got {v!r}")
        if self.queue_order == "sjf" and not self.output_length_known:
            raise ValueError("queue_order='sjf' reads output lengths: it needs output_length_known=True")
        if self.estimate_floor is not None:
            pos_int("estimate_floor", self.estimate_floor)
            at_most("estimate_floor", self.estimate_floor, MAX_COUNT, "2**53, tokens the simulator counts exactly")
        if self.observation not in ("dict", "flat", *LOAD_OBSERVATIONS):
            raise ValueError(f"observation must be {one_of(('dict', 'flat', *LOAD_OBSERVATIONS))}, "
                             f"got {self.observation!r}")
        if self.action not in ("budget", "multiplier", "log-multiplier"):
            raise ValueError(f"action must be 'budget', 'multiplier' or 'log-multiplier', got {self.action!r}")
        ks = self.multipliers
        if (
            not isinstance(ks, (list, tuple))
            or not ks
            or any(not (is_finite_real(k) and 0 < k <= MAX_MULTIPLIER) for k in ks)  # a bool is no real number
            or any(b <= a for a, b in zip(ks, ks[1:]))
        ):
            raise ValueError(f"multipliers must be a list of positive numbers up to {MAX_MULTIPLIER:g} in ascending "
                             f"order, got {ks!r}")
        if self.multiplier_of not in MULTIPLIER_OF:
            raise ValueError(f"multiplier_of must be {one_of(MULTIPLIER_OF)}, got {self.multiplier_of!r}")
        if self.multiplier_of in TWO_ANCHORS and self.action != "log-multiplier":
            raise ValueError(f"multiplier_of={self.multiplier_of!r} multiplies both anchors"
                             f"{' and a drain term' if self.multiplier_of == 'max-drain' else ''}, one float each: it needs "
                             f"action='log-multiplier', got action={self.action!r}")
        if self.action == "budget" and (tuple(ks) != FlowControlConfig.multipliers
                                        or self.multiplier_of != FlowControlConfig.multiplier_of):
            given = [f"{n}={v!r}" for n, v, d in (("multipliers", ks, FlowControlConfig.multipliers),
                                                  ("multiplier_of", self.multiplier_of, FlowControlConfig.multiplier_of))
                     if (tuple(v) if n == "multipliers" else v) != d]
            raise ValueError(f"{' and '.join(given)} shape action='multiplier' or 'log-multiplier'; with "
                             "action='budget' the agent sets the budget itself and they would be ignored: give "
                             "action='multiplier' or 'log-multiplier', or leave them out")
        if self.action != "budget" and self.per_class_budget:
            raise ValueError(f"action={self.action!r} sets one global budget: it cannot be combined with "
                             "per_class_budget=True")
        if self.action == "log-multiplier":
            if self.multiplier_of == "both":
                raise ValueError("multiplier_of='both' chooses between two anchors by action index: it has no "
                                 "continuous form (action='log-multiplier')")
            if len(ks) < 2:
                raise ValueError(f"action='log-multiplier' ranges between the smallest and the largest of "
                                 f"multipliers: it needs two of them, got {ks!r}")
        def int_list(name: str, v: Any) -> list[int]:
            if isinstance(v, range):
                v = list(v)
            elif isinstance(v, np.ndarray) and v.ndim == 1 and np.issubdtype(v.dtype, np.integer):
                v = v.tolist()
            if (not isinstance(v, (list, tuple)) or not v
                    or any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) for x in v)):
                raise ValueError(f"{name} must be a non-empty list of integers, got {v!r}")
            return [int(x) for x in v]

        edges = int_list("hist_edges", self.hist_edges)
        if edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"hist_edges must start at 0 and increase strictly, got {self.hist_edges!r}")
        offs = int_list("projection_offsets", self.projection_offsets)
        if any(o < 0 for o in offs):
            raise ValueError(f"projection_offsets must be non-negative slots, got {self.projection_offsets!r}")
        if len(set(offs)) < len(offs):  # the same projection twice: an observation entry repeated, not a new one
            raise ValueError(f"projection_offsets must not repeat an offset, got {self.projection_offsets!r}")
        for name, vals in (("hist_edges", edges), ("projection_offsets", offs)):
            at_most(name, max(vals), MAX_BUDGET_CAP, "tokens or slots")
        if not isinstance(self.reward_weights, Mapping):
            raise ValueError(f"reward_weights must be a mapping, got {self.reward_weights!r}")
        bad = sorted(set(self.reward_weights) - set(DEFAULT_REWARD_WEIGHTS))
        if bad:
            raise ValueError(f"reward_weights has unknown key(s) {bad}; valid: {sorted(DEFAULT_REWARD_WEIGHTS)}")
        for k, v in self.reward_weights.items():
            if not is_finite_real(v):
                raise ValueError(f"reward_weights[{k!r}] must be a finite number, got {v!r}")
        # the defaults of the weights not listed count too: they are merged into the reward
        for k, v in {**DEFAULT_REWARD_WEIGHTS, **self.reward_weights}.items():
            if abs(float(v)) / float(self.reward_scale) > MAX_REWARD_WEIGHT:  # a reward of counts times it stays finite
                given = "" if k in self.reward_weights else " (its default; set it to 0 to drop the term)"
                raise ValueError(f"reward_weights[{k!r}] / reward_scale must be at most {MAX_REWARD_WEIGHT:g} in size "
                                 f"(larger ones overflow the reward to inf or nan), got {v!r}{given} / "
                                 f"{self.reward_scale!r}")
        if self.time_model != "slot":
            from flowgym.sim.latency import make_latency_model

            make_latency_model(self.time_model)  # raises naming the bad value
        if self.per_class_budget and not self.output_length_known:
            raise ValueError("per_class_budget=True needs output_length_known=True (classes reveal lengths)")
        if not isinstance(self.record, str) or self.record not in RECORD_MODES:
            raise ValueError(f"record must be one of {list(RECORD_MODES)}, got {self.record!r}")
        if not isinstance(self.engine, str) or self.engine not in ENGINE_MODES:
            raise ValueError(f"engine must be one of {list(ENGINE_MODES)}, got {self.engine!r}")
        if not isinstance(self.engine_options, Mapping):
            raise ValueError(f"engine_options must be a mapping, got {self.engine_options!r}")
        if self.engine == "paper" and self.engine_options:
            raise ValueError(f"engine_options {sorted(self.engine_options)} are options of engine 'vllm-v1'; "
                             "engine 'paper' takes none")
        if self.engine == VLLM_MODE:
            VllmOptions.from_any(self.engine_options)  # raises naming the bad option
            for name, ok in (("eviction", "lifo"), ("queue_order", "fifo"), ("record", "full")):
                if getattr(self, name) != ok:
                    raise ValueError(f"engine='vllm-v1' needs {name}={ok!r} (victims follow engine_options "
                                     f"preempt_order; the waiting queue is FCFS), got {name}={getattr(self, name)!r}")


class FlowControlEnv(gym.Env[Any, Any]):
    """LLM serving under a KV-cache limit, controlled by an activation budget.

    ## Description

    The token-level model of Dong & Cao, "Flow-Controlled Scheduling for LLM
    Inference with Provable Stability Guarantees", exactly as specified in
    ``docs/model.md``. Requests arrive with a prompt length ``l`` and an output
    length ``o``, wait in a FIFO queue, are activated into the running batch,
    generate one token per slot while holding ``l + j`` tokens of KV cache, and
    finish after ``o`` tokens. When the next slot's demand
    ``D_t = sum_active (l_i + j_i + 1)`` exceeds the budget ``M``, the
    environment evicts (``lifo`` by default): an evicted request loses its
    generated tokens and goes back to the queue, ahead of later arrivals. The
    agent only chooses how many queued requests may start each slot: the
    activation budget ``B_t`` of the paper's Algorithm 2 (or per-class budgets
    ``b_k``, Algorithm 1).

    One step is one slot. The step happens at the decision point: the
    observation shows the system after slot ``t``'s arrivals joined the queue;
    the action is ``B_t``; the step admits, evicts, decodes and records slot
    ``t``, then lets slot ``t + 1``'s requests arrive.

    ## Action Space

    ``Discrete(max_budget + 1)``: ``B_t``, the number of requests that may leave
    the queue head this slot (fewer start if fewer wait). With
    ``per_class_budget=True``: ``MultiDiscrete([max_budget + 1] * m)``, the
    budget of each class, admitted in class order, FIFO within a class. With
    ``action="multiplier"``: ``Discrete(len(multipliers))`` (twice that for
    ``multiplier_of="both"``), ``B_t = clip(round(multipliers[a] * anchor), 1, max_budget)``,
    the anchor being the online safe budget ``M / E_hat[w]`` or the arrival rate
    (``multiplier_of``). With ``action="log-multiplier"``: ``Box(-1, 1, (1,))``, the
    same with ``k = k_min * (k_max / k_min) ** ((a + 1) / 2)`` between the smallest and
    largest multiplier (for Gaussian policies); with ``multiplier_of="max"`` too,
    ``Box(-1, 1, (2,))``: ``k_rate`` and ``k_safe`` on that scale,
    ``B_t = clip(round(max(k_rate * rate, k_safe * M / E_hat[w])), 1, max_budget)``; with
    ``multiplier_of="max-head"`` the same with ``rate`` the larger of the arrival rate now and
    when the request at the queue head arrived; with ``multiplier_of="max-drain"``,
    ``Box(-1, 1, (3,))``: those two and ``k_drain``, ``B_t`` the ``"max-head"`` budget or, if larger,
    ``min(queued / 50, k_drain * M / E_hat[w])`` (a drain term). An action outside the space raises
    ``ValueError`` naming it and the space. Besides the space's own elements, a ``Discrete`` space takes a
    numpy integer or an integer array of shape ``(1,)``, and a one-multiplier ``Box`` a bare number (what
    policies and vectorised wrappers hand one environment); other shapes are refused.

    ## Observation Space

    ``Dict`` of float32 ``Box``es with finite bounds (or, with
    ``observation="flat"``, their concatenation in this order):

    | key | shape | bounds | meaning |
    |---|---|---|---|
    | ``kv_usage`` | (1,) | [0, 1] | KV tokens held by active requests / ``M`` |
    | ``queue_len`` | (1,) | [0, queue_cap] | waiting requests |
    | ``active`` | (1,) | [0, M] | active requests |
    | ``queued_prompt_tokens`` | (1,) | [0, queue_token_cap] | waiting prompt tokens / ``M`` |
    | ``generated_hist`` | (K,) | [0, M] | active requests by tokens generated, bins from ``hist_edges`` |
    | ``arrival_rate`` | (1,) | [0, queue_cap] | moving average of arrivals per slot (``rate_window``; it starts at 0, so it reads low for the first few ``rate_window`` slots) |
    | ``last_duration`` | (1,) | [0, duration_cap] | continuous time only: seconds the last iteration took |
    | ``projected_usage`` | (H,) | [0, projection_cap] | known lengths only: the active set's demand / ``M`` at ``t + h``, ``h`` in ``projection_offsets``, with no admission or eviction |
    | ``class_queue`` | (m,) | [0, queue_cap] | known lengths and classes only: waiting requests per class |

    Counts are clipped to their caps. With ``output_length_known=False`` nothing
    in the observation depends on output lengths (it is never revealed).

    With ``observation="load"`` the observation is instead one float32 ``Box(-16, 16, (17,))``
    of scale-free load estimates (:data:`~flowgym.sim.estimators.LOAD_FEATURES`: KV usage,
    backlog, arrival rates at four time constants against the online safe budget, ...; the
    generalist reads it), and with ``observation="load-v2"`` a ``Box(-16, 16, (20,))``: those and
    :data:`~flowgym.sim.estimators.LOAD_FEATURES_V2`'s three more; with ``observation="load-v3"`` a
    ``Box(-16, 16, (22,))``: those 20 and the backlog's moving averages over 64 and 1024 slots
    (:data:`~flowgym.sim.estimators.LOAD_FEATURES_V3`); with ``observation="load-v4"`` a
    ``Box(-16, 16, (25,))``: those 22 and how much the arrival rate, the arriving prompts and the
    completed lengths swung over about the last 1,000 slots
    (:data:`~flowgym.sim.estimators.LOAD_FEATURES_V4`). Output lengths enter them only
    once a request has completed.

    ## Rewards

    Per slot, ``-(w_in * N_t + w_waste * wasted_t + w_ev * evictions_t - w_done * completed_t) / reward_scale``
    with ``N_t`` the requests in the system during slot ``t`` (queued or active,
    slot ``t``'s arrivals included) and the weights ``reward_weights`` (default
    ``in_system=1, wasted_tokens=1, evictions=0, completed=0``, scale 100; each weight
    over the scale at most ``1e100`` in size, so the reward stays finite). By
    Little's law the sum of ``N_t`` over an episode is the total time requests
    spend in the system, so maximising the default return minimises total (and
    so average) latency, the paper's responsiveness metric; a wasted token (a
    token generated and then lost to eviction) costs as much as one request
    waiting one slot, charging the recomputation that evictions cause.
    In continuous time ``N_t`` is multiplied by the iteration's duration in
    seconds, and the requests that arrive during an iteration (they join at its end)
    add the seconds from their arrival to that end, so the sum is the total latency
    in seconds (``mean_time_in_system`` times the requests counted by it).

    ## Continuous time

    With ``time_model`` a batch latency model (:mod:`flowgym.sim.latency`: a preset
    such as ``"llama2-70b-tp2-a100"``, a linear model, or a callable) and a
    timed workload (arrivals in seconds), a step is one batch iteration: its
    duration comes from the prompt tokens it prefills, the requests it decodes
    and the KV tokens they hold (after eviction); a request joins the queue at
    the first iteration that starts at or after its arrival; an idle server with
    an empty queue jumps to the next arrival. Latencies and throughputs are then
    in seconds, ``arrival_rate`` is per second and ``info`` adds ``duration``
    and ``time`` (the clock at the end of the iteration). A callable
    ``time_model`` is asked for the iteration's duration before the step changes
    anything: if it raises (re-raised as ``RuntimeError`` naming the callable) or
    returns a bad duration (``ValueError``), the environment is as before the
    step, and stepping again retries it.

    ## Starting State

    An empty system at slot 0 with slot 0's arrivals in the queue. The workload
    is drawn from a generator seeded by ``reset(seed=...)``: the same seed gives
    the same requests whatever the actions. ``reset`` takes no ``options`` (any
    given are refused by name).

    ## Episode End

    * ``truncated`` after ``horizon`` slots.
    * ``terminated`` only for a finite trace, once every request has arrived and
      the system is empty.

    ## Info

    A fresh dict each step, about slot ``t``: ``t``, ``arrived`` and
    ``rejected`` (requests that arrived in slot ``t`` and those of them with
    ``l + o > M``), ``admitted``, ``evicted``, ``wasted_tokens``, ``overflow``,
    ``completed``, ``usage`` (``U_t``, tokens),
    ``kv_usage`` (``U_t / M``), ``queue_len`` and ``active`` (end of the slot).
    ``reset`` returns ``t``, ``arrived`` and the load: ``rho``, the long-run load
    ``lambda E[w] / M`` of Propositions 1 and 2 (for a rate schedule its long-run mean:
    a periodic schedule's average, a non-periodic one's last phase); ``rho_episode``, the
    load averaged over this episode's ``horizon`` slots; ``rho_peak``, the largest load
    over the episode (its peak phase's). Each is ``None`` when unknown (continuous time,
    no horizon). For a trace, ``rho`` is its load over its arrival span, ``rho_episode`` the work
    of the requests arriving before ``horizon`` over ``horizon * M``, and ``rho_peak`` ``None`` (a
    trace has no phases).

    ``env.unwrapped.request_log()`` gives per-request arrays and
    ``env.unwrapped.metrics()`` the metrics of ``docs/model.md`` so far (see
    *Record mode* for long runs).
    ``env.unwrapped.view()`` is the read-only :class:`~flowgym.envs.view.SystemView`
    of the queue and the active set that scripted agents read (without output
    lengths unless they are known). ``env.unwrapped.run_rule(rule)`` runs the rest of
    the episode in one compiled loop with the budget an
    :class:`~flowgym.sim.admission.AdmissionRule` gives (a fixed budget, the greedy fit,
    the memory check): the run stepping with that budget would give, for evaluating
    scripted agents fast in continuous time (``rule_unsupported`` says when it cannot).

    ## Rendering

    ``render_mode`` (constructor or ``gym.make``): ``"ansi"`` (one line of text),
    ``"rgb_array"`` (a ``(400, 600, 3)`` uint8 frame drawn with numpy alone: KV usage
    against ``M``, the queue, the active set by tokens generated and, with known
    lengths only, still to generate, and recent KV usage; for ``RecordVideo`` and
    notebooks) or ``"human"`` (that frame in a matplotlib window, ``flowgym[plot]``,
    redrawn at every ``reset`` and ``step``). See :meth:`render`.

    ## Record mode

    ``record="full"`` (default) keeps every request and every slot's record, about
    70 bytes per request: ``request_log()``, ``series()`` and metrics at any
    horizon work after the run. ``record="stream"`` keeps memory flat on runs of
    any length (1,000,000 slots at the default load: ``benchmarks/bench_memory.py``):
    finished and rejected requests are folded into running sums and dropped (the
    requests left are renumbered, so ids in ``view()`` hold within a step only);
    ``metrics()`` has the same keys and the same counts and means (bit-identical in
    slots but for the KV-usage mean and spread, summed exactly there and so within
    float rounding of full mode's; to float rounding in continuous time), ``p95_latency`` from a bounded
    sketch (exact for latencies below 65,536 slots, else within relative 0.1%),
    ``kv_usage`` as block means of ``kv_usage_block`` slots; ``series()`` holds the
    last 4,096 slots; ``request_log()`` raises ``ValueError`` naming the mode. The
    batched vector environment keeps full logs: ``gym.make_vec`` runs streaming
    environments through its sync fallback. Observations, rewards and infos are
    the same in both modes.

    ## Engine mode

    ``engine="paper"`` (default) is the model above, exactly. ``engine="vllm-v1"`` runs one
    vLLM V1 scheduler step per environment step (:mod:`flowgym.sim.vllm`, ``docs/serving.md``):
    the cache holds ``M // block_size`` blocks of ``block_size`` tokens (16); running requests
    are scheduled first, in admission order, within the per-step token budget
    ``max_num_batched_tokens`` (2048); a request that needs a block when none is free
    preempts the most recently admitted running request, which keeps its output tokens and
    goes back to the front of the queue to be prefilled again over ``l + j`` tokens
    (recompute); then, if nobody was preempted, queue heads are admitted while the blocks of
    their whole sequence are free (vLLM's ``scheduler_reserve_full_isl``; only the first prefill
    chunk's are allocated), up to ``max_num_seqs`` (256) running requests, long
    prompts prefilled in chunks. The action ``B_t`` caps the admissions of the step. Options
    in ``engine_options`` (:class:`~flowgym.sim.vllm.VllmOptions`): ``block_size``,
    ``max_num_seqs``, ``max_num_batched_tokens`` (``None``: unlimited),
    ``long_prefill_token_threshold``, ``chunked_prefill``, ``admission`` (``"blocks"`` or
    ``"count"``, the paper's), ``reserve_full_isl``, ``reserve_full_prompt``, ``watermark``, ``preemption``
    (``"recompute"`` or ``"discard"``, the paper's), ``preempt_order`` (``"lifo"``,
    ``"least-progress"``, ``"least-computed"``, ``"random"``), ``requeue`` (``"front"`` or
    ``"back"``), ``lookahead_tokens``, ``max_tokens``. The mode needs ``eviction="lifo"``,
    ``queue_order="fifo"`` and ``record="full"``; ``usage`` and ``kv_usage`` count allocated
    blocks times ``block_size``; ``info`` adds ``refused`` (admissions ``B_t`` allowed that the
    engine refused) and ``prefill_tokens``; ``metrics()`` adds the serving metrics
    (``num_preemptions``, ``time_to_first_token_*``, ``inter_token_latency_*``,
    ``num_requests_running_mean``, ``num_requests_waiting_mean``, ``kv_cache_usage_perc_*``);
    ``request_log()`` adds ``max_tokens`` and ``first_token``. With
    :data:`~flowgym.sim.vllm.BRIDGE_OPTIONS` it reproduces the paper mode's request log.

    ## Queue order and eviction

    ``queue_order`` (``fifo``; ``sjf``, shortest known output first;
    ``estimate``, smallest output estimate first) decides who is admitted
    first; ``eviction`` (``lifo``; ``all``; ``estimate``) who leaves on
    overflow. See :mod:`flowgym.sim.rules`. Every request's output estimate starts at
    ``estimate_floor``, by default the workload's shortest possible output (20 for the paper's
    classes, a trace's shortest output, 1 for a log-normal length law), and an evicted request's
    rises to the tokens it had generated plus one (A_min).

    ## Arguments

    See :class:`FlowControlConfig` for every argument and its default::

        env = gym.make("FlowControl-v0", M=16492, horizon=2000,
                       workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 3.5},
                       output_length_known=True)

    The default is the paper's three classes ``(10,20), (10,40), (10,60)`` at
    ``lambda = 3.5`` per class (``rho = 0.86``), ``M = 16492``, unknown output
    lengths, ``lifo`` eviction, 1000 slots.

    Every argument is checked when the environment is made, and a bad one raises
    ``ValueError`` naming it and its value: on/off arguments must be real booleans
    (``"false"`` is refused, not read as true); integer lists (``hist_edges``,
    ``projection_offsets``) must hold integers (not truncated floats); ``M``,
    ``horizon`` and ``estimate_floor`` are at most 2**53, ``max_budget`` at most 10**9, the
    observation caps at most 1e30 (float32 bounds), multipliers at most 10**12; in slots
    ``rate_window`` is at least 1 (its moving-average weight ``1 / rate_window`` would
    overshoot).

    ## Version History

    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi", "rgb_array", "human"], "render_fps": 4}

    def __init__(
        self,
        config: FlowControlConfig | Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = cfg = FlowControlConfig.from_any(config, **kwargs)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self._window = rendering.HumanWindow(self.metadata["render_fps"]) if render_mode == "human" else None
        #: KV tokens held at the end of recent slots, for the frames' history panel
        self._usage_recent: collections.deque[int] = collections.deque(maxlen=rendering.FRAME_SHAPE[1])
        self._last_evicted = 0
        self.workload: Workload = make_workload(cfg.workload)
        if cfg.horizon is None and not self.workload.finite:
            raise ValueError("horizon=None needs a finite workload (a Trace); this workload never ends")
        m = self.workload.num_classes
        if cfg.per_class_budget and m == 0:
            raise ValueError("per_class_budget=True needs a workload with request classes")
        self.engine: Engine = make_engine(
            cfg.engine,
            cfg.M,
            self.workload,
            engine_options=dict(cfg.engine_options) or None,
            eviction=cfg.eviction,
            queue_order=cfg.queue_order,
            estimate_floor=(cfg.estimate_floor if cfg.estimate_floor is not None
                            else int(min(max(self.workload.min_output_tokens() or 1, 1), MAX_COUNT))),
            time_model=None if cfg.time_model == "slot" else cfg.time_model,
            per_class=cfg.per_class_budget,
            track_class_queue=cfg.output_length_known and m > 0 and not cfg.per_class_budget,
            record=cfg.record,
        )
        self.features = Features(
            cfg.M,
            known=cfg.output_length_known,
            num_classes=m,
            queue_cap=cfg.queue_cap,
            queue_token_cap=cfg.queue_token_cap,
            hist_edges=cfg.hist_edges,
            projection_offsets=cfg.projection_offsets,
            projection_cap=cfg.projection_cap,
            timed=self.engine.timed,
            duration_cap=cfg.duration_cap,
        )
        #: Online load estimates (safe budget, scale-free features); only kept when used.
        self.tracker: LoadTracker | None = None
        if cfg.observation in LOAD_OBSERVATIONS or cfg.action != "budget":
            self.tracker = LoadTracker(cfg.M, cap=float(cfg.max_budget),
                                       swings=LOAD_OBSERVATIONS.get(cfg.observation, 0) >= 4)
        self._obs_type: Any
        if cfg.observation in LOAD_OBSERVATIONS:
            assert self.tracker is not None
            self._obs_type = LoadObservation(self.tracker, LOAD_OBSERVATIONS[cfg.observation])
        elif cfg.observation == "dict":
            self._obs_type = DictObservation(self.features)
        else:
            self._obs_type = FlatObservation(self.features)
        self.observation_space = self._obs_type.space()
        self._act_type: Any
        if cfg.per_class_budget:
            self._act_type = PerClassBudget(cfg.max_budget, m)
        elif cfg.action == "multiplier":
            assert self.tracker is not None
            self._act_type = MultiplierBudget(cfg.multipliers, cfg.max_budget, self.tracker, of=cfg.multiplier_of)
        elif cfg.action == "log-multiplier":
            assert self.tracker is not None
            self._act_type = LogMultiplierBudget(cfg.multipliers, cfg.max_budget, self.tracker, of=cfg.multiplier_of)
        else:
            self._act_type = GlobalBudget(cfg.max_budget)
        self.action_space = self._act_type.space()
        w = {**DEFAULT_REWARD_WEIGHTS, **cfg.reward_weights}
        s = float(cfg.reward_scale)
        self._w_in, self._w_waste, self._w_ev, self._w_done = (
            float(w["in_system"]) / s,  # Python floats: a numpy float32 weight must not make the reward float32
            float(w["wasted_tokens"]) / s,
            float(w["evictions"]) / s,
            float(w["completed"]) / s,
        )
        self._alpha = 1.0 / float(cfg.rate_window)
        self._timed = self.engine.timed
        self._horizon = cfg.horizon
        self._rate = 0.0
        self._started = False
        self._ended = False
        self._view: SystemView | None = None

    # ------------------------------------------------------------------ gym API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if options:  # none is read: an option given would otherwise be dropped unseen
            raise ValueError(f"reset: FlowControl-v0 takes no options, got {sorted(map(str, options))}")
        super().reset(seed=seed)
        wl_seed = int(self.np_random.integers(0, 2**63 - 1))
        self.engine.reset(np.random.default_rng(wl_seed))
        self._rate = 0.0
        arrived = self.engine.arrive()
        self._rate = 0.0 if self._timed else arrived * self._alpha
        if self.tracker is not None:
            self.tracker.reset(self.engine)
        self._started = True
        self._ended = False
        M, H = self.config.M, self.config.horizon
        info = {"t": 0, "arrived": arrived, "rho": None if self._timed else self.workload.load(M),
                "rho_episode": None if self._timed else self.workload.episode_load(M, H),
                "rho_peak": None if self._timed else self.workload.peak_load(M, H)}
        if self._timed:
            info["time"] = self.engine.now
        self._usage_recent.clear()
        self._last_evicted = 0
        if self.render_mode == "human":
            self.render()
        return self._observe(), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if self._ended:
            raise RuntimeError("the episode has ended (terminated or truncated): call reset() before step()")
        budget = self._act_type.budget(action)
        eng = self.engine
        n_sys = eng.n_queued + eng.n_active
        arrived, rejected = eng.last_arrivals, eng.last_rejected
        st = eng.serve(budget)
        if self._timed:  # requests in system x seconds: the episode sum is total latency in seconds
            n_sys *= eng.last_duration
        terminated = eng.exhausted and eng.n_queued + eng.n_active == 0
        truncated = not terminated and self._horizon is not None and eng.t >= self._horizon
        self._ended = terminated or truncated
        info = {
            "t": st.t,
            "arrived": arrived,
            "rejected": rejected,
            "admitted": st.admitted,
            "evicted": st.evicted,
            "wasted_tokens": st.wasted_tokens,
            "overflow": st.evicted > 0,
            "completed": st.completed,
            "usage": st.usage,
            "kv_usage": st.usage / self.config.M,
            "queue_len": st.queue_len,
            "active": st.active,
        }
        if self._timed:
            info["duration"] = eng.last_duration
            info["time"] = eng.now
        if self.config.engine == VLLM_MODE:
            info["refused"] = int(eng._steps[-1][0])  # type: ignore[attr-defined]
            info["prefill_tokens"] = int(eng._steps[-1][1])  # type: ignore[attr-defined]
        if not (terminated or truncated):
            if self._timed:
                before = eng.now
                k = eng.arrive()
                dt = eng.now - before + eng.last_duration  # time since the last arrivals were counted
                a = 1.0 - math.exp(-dt / self.config.rate_window)
                self._rate += a * (k / dt - self._rate) if dt > 0 else 0.0
                if k:  # the requests that arrived during the iteration waited for its end to join: their
                    # seconds in the system before it count too (so the sum is their latency, arrival to finish)
                    hi = eng.n_arrived
                    kept = ~eng.rejected[hi - k:hi]
                    n_sys += float((eng.now - eng.arrival_time[hi - k:hi])[kept].sum())
            else:
                k = eng.arrive()
                self._rate += (k - self._rate) * self._alpha
            if self.tracker is not None:
                self.tracker.update(eng, st.completed)
        reward = -(
            self._w_in * n_sys + self._w_waste * st.wasted_tokens + self._w_ev * st.evicted - self._w_done * st.completed
        )
        if self.render_mode is not None:
            self._usage_recent.append(st.usage)
            self._last_evicted = st.evicted
            if self.render_mode == "human":
                self.render()
        return self._observe(), float(reward), terminated, truncated, info

    def rule_unsupported(self, rule: AdmissionRule) -> str | None:
        """Why :meth:`run_rule` cannot run ``rule`` in this environment (``None`` when it can)."""
        if self.render_mode is not None:
            return f"render_mode={self.render_mode!r} (frames are drawn every step)"
        if self.config.action != "budget":
            return f"action={self.config.action!r} (an agent's actions are not budgets there)"
        return self.engine.rule_unsupported(rule)

    def run_rule(self, rule: AdmissionRule) -> int:
        """Run the rest of the episode with the budget ``rule`` gives each step, compiled; returns the steps.

        The engine ends in the state (request log, series, metrics) that calling :meth:`step`
        with that budget until the episode ends would leave; the skipped steps' observations,
        rewards and ``info`` are not produced, and the episode has ended (call :meth:`reset`).
        For evaluating scripted agents (:func:`flowgym.lab.evaluation.run_episode` uses it for
        every agent that states its :class:`~flowgym.sim.admission.AdmissionRule`). The budget
        must be one the action space allows; ``ValueError`` names what the compiled loop lacks
        (:meth:`rule_unsupported`).
        """
        if not self._started:
            raise RuntimeError("call reset() before run_rule()")
        if self._ended:
            raise RuntimeError("the episode has ended (terminated or truncated): call reset() before run_rule()")
        why = self.rule_unsupported(rule)
        if why is not None:
            raise ValueError(f"run_rule cannot run here: {why}")
        for name in ("budget", "max_count"):  # what a step could not be given either
            if getattr(rule, name) > self.config.max_budget:
                raise ValueError(f"AdmissionRule.{name}={getattr(rule, name)} exceeds max_budget="
                                 f"{self.config.max_budget}")
        n = self.engine.run_rule(rule, horizon=self._horizon)
        self._ended = True
        return n

    def check_action(self, action: Any) -> Any:
        """The budget(s) ``action`` stands for; ``ValueError`` naming it and the space when it is not in it."""
        return self._act_type.budget(action)

    def _observe(self) -> Any:
        if self.tracker is not None and self.config.observation in LOAD_OBSERVATIONS:
            return self._obs_type.observe(self.engine)
        return self._obs_type.observe(self.features.compute(self.engine, self._rate))

    def safe_budget(self) -> float | None:
        """The online safe budget ``M / E_hat[w]`` (``None`` unless a load observation or a multiplier action)."""
        return None if self.tracker is None else self.tracker.safe_budget()

    def render(self) -> str | np.ndarray | None:
        """The system at the decision point, in the ``render_mode`` given at construction.

        * ``"ansi"``: one line of text (slot, KV usage, queue, active, completed, evictions).
        * ``"rgb_array"``: a ``(400, 600, 3)`` uint8 frame drawn with numpy alone
          (:mod:`flowgym.envs.rendering`): KV usage against ``M``, the queue, the active set
          by tokens generated and (known lengths only) still to generate, recent KV usage.
        * ``"human"``: the same frame in a matplotlib window (``flowgym[plot]``), updated
          at every ``reset`` and ``step``; returns ``None``.
        * ``None``: nothing (returns ``None``).
        """
        if self.render_mode is None:
            return None
        self._require_reset("render()")
        e = self.engine
        if self.render_mode == "ansi":
            return (
                f"t={e.t} U={e.held}/{e.M} ({e.held / e.M:.1%}) queue={e.n_queued} active={e.n_active} "
                f"completed={e.total_completed} evictions={e.total_evictions}"
            )
        view = self.view()
        act = view.active()
        frame = rendering.draw_frame(
            t=e.t,
            clock=e.now if self._timed else None,
            M=e.M,
            held=e.held,
            overflowed=self._last_evicted > 0,
            completed=e.total_completed,
            evictions=e.total_evictions,
            n_queued=e.n_queued,
            queued_prompt_tokens=e.queued_prompt_tokens,
            queue_cap=self.config.queue_cap,
            generated=np.asarray(act.generated),
            remaining=None if act.output_len is None else np.asarray(act.output_len) - np.asarray(act.generated),
            max_output_len=view.max_output_len,
            usage_history=np.fromiter(self._usage_recent, np.int64, len(self._usage_recent)),
        )
        if self.render_mode == "human":
            assert self._window is not None
            self._window.show(frame)
            return None
        return frame

    def close(self) -> None:
        """Close the ``human`` window, if any."""
        if self._window is not None:
            self._window.close()
        super().close()

    # ------------------------------------------------------------------ results

    def _require_reset(self, what: str) -> None:
        if not self._started:
            raise RuntimeError(f"call reset() before {what}")

    def view(self) -> SystemView:
        """The read-only :class:`~flowgym.envs.view.SystemView` that scripted agents read.

        A live window on the engine (its properties read the current state), so one
        instance serves the whole life of the environment.
        """
        self._require_reset("view()")
        if self._view is None:
            self._view = SystemView(self.engine, self.config.output_length_known)
        return self._view

    def request_log(self) -> dict[str, np.ndarray]:
        """Per-request numpy arrays of every request that has arrived, by request id.

        ``arrival``, ``prompt_len``, ``output_len``, ``cls`` (-1 without
        classes), ``finish`` (-1 if unfinished), ``evictions``, ``rejected``.
        For evaluation after the episode: it contains output lengths even when
        ``output_length_known=False``. ``ValueError`` with ``record="stream"``, which
        does not keep them.
        """
        self._require_reset("request_log()")
        return self.engine.request_log()

    def metrics(self) -> dict[str, Any]:
        """Metrics of ``docs/model.md`` over the slots run so far, plus the ``kv_usage`` series.

        With ``record="stream"`` from running sums (same counts and means), ``p95_latency``
        from a bounded sketch and ``kv_usage`` decimated (``kv_usage_block`` slots a point).
        """
        self._require_reset("metrics()")
        return self.engine.metrics()

    def series(self) -> dict[str, np.ndarray]:
        """Per-slot arrays: ``usage``, ``admitted``, ``evicted``, ``wasted_tokens``, ``completed``, ...

        With ``record="stream"`` the last 4,096 slots only (their slot numbers in ``t``).
        """
        self._require_reset("series()")
        return self.engine.series()

    @property
    def load(self) -> float | None:
        """``rho`` of the workload at this ``M`` (``None`` when unknown)."""
        return self.workload.load(self.config.M)
