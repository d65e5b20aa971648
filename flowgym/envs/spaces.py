"""Observation and action types of FlowControl-v0 (small classes, as in HighwayEnv).

An observation type turns the engine's state at a decision point (after slot
``t``'s arrivals, before ``B_t`` is chosen) into a Gymnasium observation; an
action type turns the agent's action into the engine's budget. The features
are computed once into one float32 vector; :class:`DictObservation` hands out
named views of it and :class:`FlatObservation` the vector itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from flowgym.sim._checks import holds_bool as _holds_bool
from flowgym.sim.engine import Engine
from flowgym.sim.estimators import FEATURE_VERSIONS, LoadTracker

__all__ = [
    "Features",
    "DictObservation",
    "FlatObservation",
    "LoadObservation",
    "GlobalBudget",
    "PerClassBudget",
    "MultiplierBudget",
    "LogMultiplierBudget",
    "log_multiplier_size",
    "TWO_ANCHORS",
    "DRAIN_SLOTS",
    "MULTIPLIER_OF",
    "DISCRETE_MULTIPLIER_OF",
    "LOG_MULTIPLIER_OF",
    "one_of",
]

#: Every ``multiplier_of`` value (``FlowControlConfig.multiplier_of``, ``flowgym train --multiplier-of``).
MULTIPLIER_OF = ("safe", "rate", "both", "min", "max", "max-head", "max-drain")
#: Those of the discrete ``action="multiplier"`` (:class:`MultiplierBudget`).
DISCRETE_MULTIPLIER_OF = ("safe", "rate", "both", "min")
#: Those of the continuous ``action="log-multiplier"`` (:class:`LogMultiplierBudget`; ``"both"`` has no continuous form).
LOG_MULTIPLIER_OF = tuple(of for of in MULTIPLIER_OF if of != "both")


def one_of(values: Sequence[str]) -> str:
    """``"'a', 'b' or 'c'"``: the choices of an error message, quoted, in order."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


class Features:
    """The observation features, their bounds and how to compute them.

    Always present (``name``: shape, bounds):

    * ``kv_usage`` (1,) [0, 1]: KV tokens held by the active set, over ``M``.
    * ``queue_len`` (1,) [0, queue_cap]: waiting requests (slot ``t``'s arrivals included).
    * ``active`` (1,) [0, M]: active requests.
    * ``queued_prompt_tokens`` (1,) [0, queue_token_cap]: prompt tokens waiting, over ``M``.
    * ``generated_hist`` (K,) [0, M]: active requests by tokens generated so far,
      bins ``[e_k, e_{k+1})`` of ``hist_edges`` (last bin open).
    * ``arrival_rate`` (1,) [0, queue_cap]: exponential moving average of arrivals
      per slot with time constant ``rate_window`` slots (continuous time: per
      second, time constant ``rate_window`` seconds).

    Only in continuous time:

    * ``last_duration`` (1,) [0, duration_cap]: seconds the last batch iteration took.

    Only with ``output_length_known=True``:

    * ``projected_usage`` (H,) [0, projection_cap]: demand ``D_{t+h} / M`` of the
      current active set at each offset ``h`` of ``projection_offsets`` if nothing
      were admitted or evicted (``h = 0`` is this slot's demand before admission).
    * ``class_queue`` (m,) [0, queue_cap]: waiting requests per class (workloads with classes).

    Counts above their cap are clipped to it.
    """

    def __init__(
        self,
        M: int,
        *,
        known: bool,
        num_classes: int,
        queue_cap: int,
        queue_token_cap: float,
        hist_edges: Sequence[int],
        projection_offsets: Sequence[int],
        projection_cap: float,
        timed: bool = False,
        duration_cap: float = 60.0,
    ) -> None:
        self.M = M
        self.timed = timed
        self.known = known
        self.queue_cap = float(queue_cap)
        self.queue_token_cap = float(queue_token_cap)
        self.edges = np.asarray(hist_edges, dtype=np.int64)
        self.offsets = np.asarray(projection_offsets, dtype=np.int64)
        self.projection_cap = float(projection_cap)
        self.m = num_classes if known else 0
        layout: list[tuple[str, int, float]] = [
            ("kv_usage", 1, 1.0),
            ("queue_len", 1, self.queue_cap),
            ("active", 1, float(M)),
            ("queued_prompt_tokens", 1, self.queue_token_cap),
            ("generated_hist", self.edges.size, float(M)),
            ("arrival_rate", 1, self.queue_cap),
        ]
        if timed:
            layout.append(("last_duration", 1, float(duration_cap)))
        if known:
            layout.append(("projected_usage", self.offsets.size, self.projection_cap))
            if self.m:
                layout.append(("class_queue", self.m, self.queue_cap))
        self.slices: dict[str, slice] = {}
        hi = []
        i = 0
        for name, size, cap in layout:
            self.slices[name] = slice(i, i + size)
            hi += [cap] * size
            i += size
        self.size = i
        self.high = np.asarray(hi, dtype=np.float32)
        self._s_hist = self.slices["generated_hist"]
        self._s_proj = self.slices.get("projected_usage")
        self._s_cls = self.slices.get("class_queue")
        self._i_dur = self.slices["last_duration"].start if timed else -1
        self.duration_cap = float(duration_cap)

    def compute(self, eng: Engine, rate: float) -> np.ndarray:
        """A fresh float32 feature vector for the engine's current state."""
        v = np.empty(self.size, dtype=np.float32)
        M = self.M
        qc = self.queue_cap
        v[0] = eng.held / M
        v[1] = min(eng.n_queued, qc)
        v[2] = eng.n_active
        v[3] = min(eng.queued_prompt_tokens / M, self.queue_token_cap)
        v[self._s_hist.stop] = min(rate, qc)
        if self.timed:
            v[self._i_dur] = min(eng.last_duration, self.duration_cap)
        if eng.n_active:
            eng.generated_histogram(self.edges, out=v, offset=self._s_hist.start)
        else:
            v[self._s_hist] = 0.0
        if self.known:
            if eng.n_active:
                proj = eng.projected_demand(self.offsets) / M
                v[self._s_proj] = np.minimum(proj, self.projection_cap)
            else:
                v[self._s_proj] = 0.0
            if self.m:
                counts = (
                    [len(ln) for ln in eng.lanes] if eng.per_class else eng.class_queue[: self.m]
                )
                v[self._s_cls] = np.minimum(counts, qc)
        return v


class DictObservation:
    """A ``Dict`` of float32 ``Box``es, one per feature (see :class:`Features`)."""

    def __init__(self, features: Features) -> None:
        self.features = features
        self._items = list(features.slices.items())

    def space(self) -> spaces.Dict:
        f = self.features
        return spaces.Dict(
            {
                name: spaces.Box(0.0, f.high[s], shape=(s.stop - s.start,), dtype=np.float32)
                for name, s in self._items
            }
        )

    def observe(self, vec: np.ndarray) -> dict[str, np.ndarray]:
        return {name: vec[s] for name, s in self._items}


class FlatObservation:
    """All features in one float32 ``Box`` (for ``MlpPolicy``), in :class:`Features` order."""

    def __init__(self, features: Features) -> None:
        self.features = features

    def space(self) -> spaces.Box:
        f = self.features
        return spaces.Box(np.zeros(f.size, dtype=np.float32), f.high, dtype=np.float32)

    def observe(self, vec: np.ndarray) -> np.ndarray:
        return vec


#: The load observations and the :meth:`~flowgym.sim.estimators.LoadTracker.features` version of each.
LOAD_OBSERVATIONS = {"load": 1, "load-v2": 2, "load-v3": 3, "load-v4": 4}


class LoadObservation:
    """The scale-free load features of :class:`~flowgym.sim.estimators.LoadTracker` in one float32 ``Box``.

    ``version=1`` (``observation="load"``): :data:`~flowgym.sim.estimators.LOAD_FEATURES` in order;
    ``version=2`` (``observation="load-v2"``): :data:`~flowgym.sim.estimators.LOAD_FEATURES_V2`, the
    same 17 and three more (the head-era rate, the completion rate, the queue's prompt length
    against the arrivals'); ``version=3`` (``observation="load-v3"``):
    :data:`~flowgym.sim.estimators.LOAD_FEATURES_V3`, the 20 and two moving averages of the backlog
    (time constants 64 and 1024); ``version=4`` (``observation="load-v4"``):
    :data:`~flowgym.sim.estimators.LOAD_FEATURES_V4`, the 22 and how much the arrival rate, the arriving
    prompts and the completed lengths have swung over about the last 1,000 decision points. Each
    clipped to ``[-16, 16]``. None of them has a unit of tokens, requests or slots, so one policy can
    read systems of any ``M``, request rate and length scale (the generalist model is trained on it).
    """

    BOUND = 16.0

    def __init__(self, tracker: LoadTracker, version: int = 1) -> None:
        if version not in FEATURE_VERSIONS:
            raise ValueError(f"LoadObservation: version must be one of {sorted(FEATURE_VERSIONS)}, got {version!r}")
        self.tracker = tracker
        self.version = version
        self.names = FEATURE_VERSIONS[version]

    def space(self) -> spaces.Box:
        n = len(self.names)
        return spaces.Box(-self.BOUND, self.BOUND, shape=(n,), dtype=np.float32)

    def observe(self, eng: Engine) -> np.ndarray:
        v = self.tracker.features(eng, out=np.empty(len(self.names), np.float32), version=self.version)
        np.clip(v, -self.BOUND, self.BOUND, out=v)
        return v


def _bad_action(action: Any, space: spaces.Space) -> ValueError:
    if _holds_bool(action):
        # refused although Gymnasium's Discrete.contains(True) holds: a flag is not a budget
        return ValueError(f"action {action!r} is not in the action space {space}: it holds a bool, a flag, not a number")
    return ValueError(f"action {action!r} is not in the action space {space}")


def _int_action(action: Any, space: spaces.Discrete) -> int:
    """A ``Discrete`` action as an int (a Python or numpy integer, or an integer array of shape ``()`` or ``(1,)``,
    what a vectorised policy gives one environment)."""
    if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
        a = int(action)
    elif (isinstance(action, np.ndarray) and action.shape in ((), (1,))
          and np.issubdtype(action.dtype, np.integer)):
        a = int(action.reshape(()))
    else:
        raise _bad_action(action, space)
    if not 0 <= a < space.n:
        raise _bad_action(action, space)
    return a


class GlobalBudget:
    """``Discrete(max_budget + 1)``: the action is ``B_t``, how many queued requests may start."""

    def __init__(self, max_budget: int) -> None:
        self.max_budget = int(max_budget)
        self._space = spaces.Discrete(self.max_budget + 1)

    def space(self) -> spaces.Discrete:
        return self._space

    def budget(self, action: Any) -> int:
        """Validate and convert; raises ``ValueError`` naming the action and the space."""
        return _int_action(action, self._space)


class PerClassBudget:
    """``MultiDiscrete([max_budget + 1] * m)``: per-class budgets ``b_k`` (Algorithm 1)."""

    def __init__(self, max_budget: int, num_classes: int) -> None:
        self.max_budget = int(max_budget)
        self.m = int(num_classes)
        self._space = spaces.MultiDiscrete(np.full(self.m, self.max_budget + 1, dtype=np.int64))

    def space(self) -> spaces.MultiDiscrete:
        return self._space

    def budget(self, action: Any) -> np.ndarray:
        try:
            a = np.asarray(action)
        except Exception:  # pragma: no cover - exotic objects
            raise _bad_action(action, self._space) from None
        if a.shape != (self.m,) or not np.issubdtype(a.dtype, np.integer) or _holds_bool(action):
            raise _bad_action(action, self._space)
        if (a < 0).any() or (a > self.max_budget).any():
            raise _bad_action(action, self._space)
        return a.astype(np.int64)


class MultiplierBudget:
    """``Discrete(len(multipliers))``: action ``a`` asks for ``multipliers[a]`` times an anchor.

    ``B_t = clip(round(multipliers[a] * anchor), 1, max_budget)`` with ``anchor`` the
    tracker's online safe budget ``M / E_hat[w]`` (``of="safe"``,
    :meth:`~flowgym.sim.estimators.LoadTracker.safe_budget`) or its arrival rate per
    decision point (``of="rate"``, :meth:`~flowgym.sim.estimators.LoadTracker.arrival_rate`);
    with ``of="both"`` the space is ``Discrete(2 * len(multipliers))``: actions ``0..n-1``
    multiply the rate, ``n..2n-1`` the safe budget; with ``of="min"`` the anchor is the smaller
    of the two (the arrival rate while the cache sustains it, the safe budget in overload).
    """

    def __init__(self, multipliers: Sequence[float], max_budget: int, tracker: LoadTracker, of: str = "safe") -> None:
        if of not in DISCRETE_MULTIPLIER_OF:
            raise ValueError(f"multiplier_of must be {one_of(DISCRETE_MULTIPLIER_OF)}, got {of!r}")
        self.of = of
        self.multipliers = tuple(float(k) for k in multipliers)
        self.max_budget = int(max_budget)
        self.tracker = tracker
        n = len(self.multipliers)
        self._space = spaces.Discrete(2 * n if of == "both" else n)

    def space(self) -> spaces.Discrete:
        return self._space

    def budget(self, action: Any) -> int:
        """The budget the action stands for now; raises ``ValueError`` naming the action and the space."""
        a = _int_action(action, self._space)
        n = len(self.multipliers)
        of = ("safe" if a >= n else "rate") if self.of == "both" else self.of
        return _scaled_budget(self.multipliers[a % n], self.tracker, of, self.max_budget)


#: The ``multiplier_of`` values with more than one multiplier per ``log-multiplier`` action: two anchors
#: (``"max"``, ``"max-head"``), and ``"max-drain"``, the head-era two anchors and a drain term.
TWO_ANCHORS = ("max", "max-head", "max-drain")

#: Slots the drain term of ``multiplier_of="max-drain"`` would take to empty the queue
#: (``min(queued / DRAIN_SLOTS, k_drain * safe budget)``).
DRAIN_SLOTS = 50.0


def _rate_anchor(tracker: LoadTracker, of: str) -> float:
    """The two-anchor rate anchor: the arrival rate, or with ``of="max-head"`` (and ``"max-drain"``) the
    larger of the rate now and when the queue head arrived."""
    r = tracker.arrival_rate()
    return max(r, tracker.head_rate()) if of in ("max-head", "max-drain") else r


def _drain_term(tracker: LoadTracker, k_drain: Any, safe: float) -> float:
    """The drain term of ``of="max-drain"``: ``min(queued / DRAIN_SLOTS, k_drain * safe)``."""
    return min(tracker.queued / DRAIN_SLOTS, float(k_drain) * safe)


def _scaled_budget(k: Any, tracker: LoadTracker, of: str, max_budget: int) -> int:
    """``clip(round(k * anchor), 1, max_budget)``: :func:`_unrounded_budget` rounded, at least 1."""
    return int(max(round(_unrounded_budget(k, tracker, of, max_budget)), 1))


def _unrounded_budget(k: Any, tracker: LoadTracker, of: str, max_budget: int) -> float:
    """``min(k * anchor, max_budget)``, not rounded, the anchor the tracker's safe budget
    (``of="safe"``), arrival rate (``"rate"``) or the smaller of the two (``"min"``); with
    ``of="max"``, ``k = (k_rate, k_safe)`` and the larger of ``k_rate * rate`` and ``k_safe * safe``;
    ``of="max-head"`` the same with ``rate`` the larger of the rate now and when the queue head arrived;
    ``of="max-drain"``, ``k = (k_rate, k_safe, k_drain)``: that of ``"max-head"`` or, if larger,
    ``min(queued / DRAIN_SLOTS, k_drain * safe)``."""
    if of in TWO_ANCHORS:
        safe = tracker.safe_budget()
        b = float(max(k[0] * _rate_anchor(tracker, of), k[1] * safe))
        if of == "max-drain":
            b = max(b, _drain_term(tracker, k[2], safe))
    elif of == "min":
        b = k * min(tracker.safe_budget(), tracker.arrival_rate())
    else:
        b = k * (tracker.safe_budget() if of == "safe" else tracker.arrival_rate())
    return min(b, max_budget)  # capped before rounding: k * anchor may overflow to inf


def log_multiplier_size(of: str) -> int:
    """How many floats the ``log-multiplier`` action of anchor ``of`` has: 2 for ``"max"`` and
    ``"max-head"``, 3 for ``"max-drain"``, else 1."""
    return 3 if of == "max-drain" else 2 if of in TWO_ANCHORS else 1


class LogMultiplierBudget:
    """``Box(-1, 1, (1,))``: a continuous multiplier of the anchor, on a log scale.

    Action ``a`` (one float in ``[-1, 1]``) asks for
    ``k = k_min * (k_max / k_min) ** ((a + 1) / 2)`` times the anchor, so ``a = -1`` is
    ``k_min``, ``a = 1`` is ``k_max`` and ``a = 0`` their geometric mean;
    ``B_t = clip(round(k * anchor), 1, max_budget)``. ``k_min`` and ``k_max`` are the smallest
    and the largest of ``multipliers``; the anchor is the one of :class:`MultiplierBudget`
    (``of="safe"``, ``"rate"`` or ``"min"``; ``"both"`` has no continuous form). The
    Gaussian policy of a continuous action puts its deterministic action at the mean it
    learned, where the expected index of a spread ``Discrete`` policy sits at the middle of
    the levels whatever the state (``docs/training.md``, gen7).

    With ``of="max"`` the space is ``Box(-1, 1, (2,))``: two multipliers on the same scale,
    ``k_rate`` of the arrival rate (``a[0]``) and ``k_safe`` of the safe budget (``a[1]``), and
    ``B_t = clip(round(max(k_rate * rate, k_safe * safe budget)), 1, max_budget)``. The rate
    anchor reacts at once to a change of mix; the safe budget keeps the cache busy while a
    backlog waits after the arrivals slowed down (where a multiple of the rate starves it);
    the policy chooses how much of each (``docs/training.md``, "Two anchors"). With
    ``of="max-head"`` the rate anchor is the larger of the arrival rate now and when the request
    at the queue head arrived (:meth:`~flowgym.sim.estimators.LoadTracker.head_rate`): a backlog
    left from a busier phase is admitted at the rate it came ("Head-era rate" there).

    With ``of="max-drain"`` the space is ``Box(-1, 1, (3,))``: the two multipliers of ``"max-head"``
    and ``k_drain`` (``a[2]``, same scale) of a drain term, ``B_t`` the larger of the ``"max-head"``
    budget and ``min(queued / DRAIN_SLOTS, k_drain * safe budget)``: a backlog is admitted over about
    :data:`DRAIN_SLOTS` slots, at most ``k_drain`` safe budgets per slot. With ``k_drain <= k_safe``
    the term never decides, so the action holds the whole ``"max-head"`` family; the policy has to
    learn when a queue is a backlog worth draining and when it is overload ("A learned drain term" in
    ``docs/training.md``).
    """

    def __init__(self, multipliers: Sequence[float], max_budget: int, tracker: LoadTracker, of: str = "rate") -> None:
        if of not in LOG_MULTIPLIER_OF:
            raise ValueError(f"multiplier_of must be {one_of(LOG_MULTIPLIER_OF)} with action='log-multiplier', "
                             f"got {of!r}")
        ks = [float(k) for k in multipliers]
        self.of = of
        self.k_min, self.k_max = min(ks), max(ks)
        if not self.k_max > self.k_min:
            raise ValueError(f"action='log-multiplier' needs two different multipliers (its range), got {list(multipliers)!r}")
        self.max_budget = int(max_budget)
        self.tracker = tracker
        self.dim = log_multiplier_size(of)
        self._space = spaces.Box(-1.0, 1.0, shape=(self.dim,), dtype=np.float32)

    def space(self) -> spaces.Box:
        return self._space

    def multipliers(self, action: Any) -> np.ndarray:
        """The multipliers of an action (one per anchor); raises ``ValueError`` naming an action outside the box."""
        x = action
        if isinstance(x, (list, tuple)):  # what Box.contains accepts too: a sequence of numbers
            x = (np.asarray(x) if all(isinstance(e, (int, float, np.integer, np.floating))
                                      and not isinstance(e, (bool, np.bool_)) for e in x) else None)
        numeric = (isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
                   or isinstance(x, np.ndarray) and (np.issubdtype(x.dtype, np.integer)
                                                     or np.issubdtype(x.dtype, np.floating)))
        a = np.asarray(x, dtype=np.float64) if numeric else None
        if a is not None and a.ndim == 0 and self.dim == 1:  # a bare number: the one multiplier
            a = a.reshape(1)
        if (a is None or a.shape != (self.dim,) or not np.isfinite(a).all()
                or (np.abs(a) > 1.0).any()):
            raise _bad_action(action, self._space)
        return self.k_min * (self.k_max / self.k_min) ** ((a + 1.0) / 2.0)

    def rate_anchor(self) -> float:
        """The rate anchor now of a two-anchor action (``of="max"``, ``"max-head"`` or ``"max-drain"``), what
        ``k_rate`` multiplies."""
        if self.dim == 1:
            raise ValueError(f"multiplier_of={self.of!r} has no rate anchor of its own: rate_anchor() is for 'max', "
                             "'max-head' and 'max-drain'")
        return _rate_anchor(self.tracker, self.of)

    def drain_term(self, k_drain: float) -> float:
        """The drain term now of ``of="max-drain"`` for multiplier ``k_drain``,
        ``min(queued / DRAIN_SLOTS, k_drain * safe budget)``: what the budget is at least."""
        if self.of != "max-drain":
            raise ValueError(f"multiplier_of={self.of!r} has no drain term: drain_term() is for 'max-drain'")
        return _drain_term(self.tracker, k_drain, self.tracker.safe_budget())

    def multiplier(self, action: Any) -> float:
        """The multiplier ``k`` of a one-float action; raises ``ValueError`` naming an action outside ``[-1, 1]``."""
        if self.dim != 1:
            raise ValueError(f"multiplier_of={self.of!r} has {self.dim} multipliers per action: use multipliers(action)")
        return float(self.multipliers(action)[0])

    def budget(self, action: Any) -> int:
        """The budget the action stands for now."""
        k = self.multipliers(action)
        return _scaled_budget(k if self.dim > 1 else float(k[0]), self.tracker, self.of, self.max_budget)
