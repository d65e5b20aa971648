"""The engine's pluggable pieces: queue orders, queue lanes and eviction rules.

Each is a small documented class; the slot loop in :mod:`flowgym.sim.engine` only
calls them (``QueueOrder.keys``, ``EvictionRule.select``), so adding a
baseline's rule never adds a special case to the loop.

Queue orders (which queued request is admitted first):

* ``fifo`` (:class:`FIFO`, default): ascending ``(a_i, i)``. Evicted requests
  keep their arrival and go back ahead of later arrivals.
* ``sjf`` (:class:`ShortestOutputFirst`): ascending known output length
  ``o_i``, ties FIFO (MC-SF of Jaillet et al. 2025). Needs known lengths.
* ``estimate`` (:class:`ShortestEstimateFirst`): ascending current output
  estimate ``e_i``, ties FIFO (A_min of Chen et al. 2025).
* :class:`PlannedOrder` (an instance, not a name): by a planned start slot,
  to replay an offline (hindsight) schedule.

Eviction rules (who leaves when ``D_t > M``):

* ``lifo`` (:class:`LIFOEviction`, default): most recently activated first.
* ``all`` (:class:`EvictAll`): every active request.
* ``estimate`` (:class:`EstimateEviction`): ascending current estimate, ties
  most recently activated first (A_min).

Output estimates (only tracked when an order or rule uses them) start at a
floor (default 1, "the shortest possible output") and are lower bounds: an
active request that has generated ``j`` tokens without finishing has
``o_i >= j + 1``, so its current estimate is ``max(e_i, j + 1)``; when it is
evicted, ``e_i`` is raised to that value.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from flowgym.sim import kernels

__all__ = [
    "QueueOrder",
    "FIFO",
    "ShortestOutputFirst",
    "ShortestEstimateFirst",
    "PlannedOrder",
    "QUEUE_ORDERS",
    "make_queue_order",
    "ActiveSet",
    "EvictionRule",
    "LIFOEviction",
    "EvictAll",
    "EstimateEviction",
    "EVICTION_RULES",
    "make_eviction_rule",
]

_I64 = np.int64
_ID_BITS = 32  # keys are (primary << 32) | id: ids below 2**32, primaries below 2**31


# --------------------------------------------------------------------------- queue orders


class RequestColumns(Protocol):
    """The per-request columns a queue order may read (the engine has them, indexed by request id)."""

    #: true output lengths ``o_i`` (read only when they are known)
    output: np.ndarray
    #: current output estimates (A_min)
    estimate: np.ndarray


class QueueOrder:
    """Orders the waiting queue by an int64 key per request (smaller is admitted first)."""

    name = "base"
    #: the order reads output lengths (only allowed when they are known)
    needs_known_lengths = False
    #: the order reads output estimates (the engine then tracks them)
    needs_estimates = False
    #: keys are the request ids themselves (FIFO): lanes may skip storing keys
    keys_are_ids = False

    def keys(self, eng: RequestColumns, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class FIFO(QueueOrder):
    """First come, first served: ascending ``(a_i, i)``, i.e. ascending request id."""

    name = "fifo"
    keys_are_ids = True

    def keys(self, eng: RequestColumns, ids: np.ndarray) -> np.ndarray:
        return ids


class ShortestOutputFirst(QueueOrder):
    """Shortest known output length first, ties by ``(a_i, i)`` (MC-SF's order)."""

    name = "sjf"
    needs_known_lengths = True

    def keys(self, eng: RequestColumns, ids: np.ndarray) -> np.ndarray:
        return (eng.output[ids] << _ID_BITS) | ids


class ShortestEstimateFirst(QueueOrder):
    """Smallest current output estimate first, ties by ``(a_i, i)`` (A_min's order)."""

    name = "estimate"
    needs_estimates = True

    def keys(self, eng: RequestColumns, ids: np.ndarray) -> np.ndarray:
        return (eng.estimate[ids] << _ID_BITS) | ids


class PlannedOrder(QueueOrder):
    """Admit by a planned start slot, ties by ``(a_i, i)``: replays an offline schedule.

    ``plan[i]`` is request ``i``'s planned start slot (ids as in the engine:
    arrival order). With budget ``B_t`` = the number of requests planned at
    ``t``, a feasible plan (every ``plan[i] >= a_i``, usage ``<= M``) is
    replayed exactly: at slot ``t`` the queue head holds the requests planned
    for ``t``. Requests without a plan (``plan[i] < 0``) come last.
    """

    name = "plan"

    def __init__(self, plan: np.ndarray) -> None:
        p = np.asarray(plan, dtype=_I64)
        self.plan = np.where(p < 0, np.iinfo(np.int32).max, p)

    def keys(self, eng: RequestColumns, ids: np.ndarray) -> np.ndarray:
        return (self.plan[ids] << _ID_BITS) | ids


QUEUE_ORDERS: dict[str, type[QueueOrder]] = {
    "fifo": FIFO,
    "sjf": ShortestOutputFirst,
    "estimate": ShortestEstimateFirst,
}


def make_queue_order(order: str | QueueOrder) -> QueueOrder:
    """A :class:`QueueOrder` from its name or as given."""
    if isinstance(order, QueueOrder):
        return order
    try:
        return QUEUE_ORDERS[order]()
    except (KeyError, TypeError):
        raise ValueError(f"queue_order must be one of {sorted(QUEUE_ORDERS)}, got {order!r}") from None


class Lane:
    """One queue: ids in ``buf[head:tail]``, ascending by key.

    With ``keys_are_ids`` (FIFO) the keys are the ids and only one buffer is
    kept. New FIFO arrivals are appended; anything else is merged at its place.
    """

    __slots__ = ("buf", "kbuf", "head", "tail", "keyed", "jit")

    def __init__(self, keyed: bool, capacity: int = 256, jit: bool = False) -> None:
        self.keyed = keyed
        self.jit = jit  # append ranges with the compiled kernel (flowgym.sim.kernels)
        self.buf = np.empty(capacity, dtype=_I64)
        self.kbuf = np.empty(capacity, dtype=_I64) if keyed else self.buf
        self.head = 0
        self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def items(self) -> np.ndarray:
        """The queued ids in order (a view)."""
        return self.buf[self.head : self.tail]

    def _set(self, ids: np.ndarray, keys: np.ndarray | None) -> None:
        n = ids.size
        if n > self.buf.size:
            cap = 2 * n
            self.buf = np.empty(cap, dtype=_I64)
            self.kbuf = np.empty(cap, dtype=_I64) if self.keyed else self.buf
        self.buf[:n] = ids
        if self.keyed:
            self.kbuf[:n] = keys
        self.head, self.tail = 0, n

    def _reserve(self, k: int) -> None:
        """Make room for ``k`` more ids at the tail (compacting or growing)."""
        if self.tail + k <= self.buf.size:
            return
        h, t = self.head, self.tail
        n = t - h
        cap = max(self.buf.size, 2 * (n + k))
        buf = np.empty(cap, dtype=_I64)
        buf[:n] = self.buf[h:t]
        if self.keyed:
            kbuf = np.empty(cap, dtype=_I64)
            kbuf[:n] = self.kbuf[h:t]
        else:
            kbuf = buf
        self.buf, self.kbuf, self.head, self.tail = buf, kbuf, 0, n

    def append_range(self, lo: int, hi: int) -> None:
        """Append ids ``lo..hi-1`` (FIFO lanes only: new arrivals come last)."""
        k = hi - lo
        if self.tail + k > self.buf.size:
            self._reserve(k)
        if self.jit:
            kernels.fill_range(self.buf, self.tail, lo, hi)
        else:
            self.buf[self.tail : self.tail + k] = np.arange(lo, hi, dtype=_I64)
        self.tail += k

    def push(self, ids: np.ndarray, keys: np.ndarray) -> None:
        """Insert ``ids`` (sorted by their ``keys``) at their places."""
        k = ids.size
        if k == 0:
            return
        h, t = self.head, self.tail
        kb = self.kbuf
        if h == t or keys[0] > kb[t - 1]:  # all after the queue: append
            self._reserve(k)
            t = self.tail
            self.buf[t : t + k] = ids
            if self.keyed:
                self.kbuf[t : t + k] = keys
            self.tail = t + k
            return
        if keys[-1] < kb[h] and h >= k:  # all ahead of the queue, room in front
            self.buf[h - k : h] = ids
            if self.keyed:
                self.kbuf[h - k : h] = keys
            self.head = h - k
            return
        cur_k = kb[h:t]
        pos = np.searchsorted(cur_k, keys)
        self._set(np.insert(self.buf[h:t], pos, ids), np.insert(cur_k, pos, keys) if self.keyed else None)

    def pop(self, k: int) -> np.ndarray:
        """Remove and return the first ``k`` ids (``k <= len``)."""
        out = self.buf[self.head : self.head + k].copy()
        self.drop(k)
        return out

    def drop(self, k: int) -> None:
        """Remove the first ``k`` ids (``k <= len``), once they have been read."""
        self.head += k
        if self.head == self.tail:
            self.head = self.tail = 0


# --------------------------------------------------------------------------- eviction rules


class ActiveSet(NamedTuple):
    """The active requests as an eviction rule sees them, in activation order (oldest first)."""

    ids: np.ndarray  #: request ids
    demand: np.ndarray  #: ``l_i + j_i + 1``: tokens each holds after this slot
    generated: np.ndarray  #: ``j_i``
    estimate: np.ndarray | None  #: current output estimates ``max(e_i, j_i + 1)`` (when tracked)


class EvictionRule:
    """Chooses which active requests to evict when the demand exceeds ``M``.

    :meth:`select` returns positions (into the :class:`ActiveSet` arrays) of
    the requests to evict; together they must free at least ``excess`` tokens
    (``excess = D_t - M > 0``).
    """

    name = "base"
    needs_estimates = False

    def select(self, active: ActiveSet, excess: int) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def prefix_covering(order: np.ndarray, demand: np.ndarray, excess: int) -> np.ndarray:
        """The shortest prefix of ``order`` whose demand sums to at least ``excess``."""
        c = np.cumsum(demand[order])
        k = int(np.searchsorted(c, excess, side="left")) + 1
        return order[:k]


class LIFOEviction(EvictionRule):
    """Evict the most recently activated request first, one at a time, until ``D_t <= M``.

    Algorithm 2's rule (and vLLM's recompute preemption): the newest requests
    have generated the least, so the least work is lost. Within a slot the last
    admitted goes first.
    """

    name = "lifo"

    def select(self, active: ActiveSet, excess: int) -> np.ndarray:
        return self.prefix_covering(np.arange(active.ids.size - 1, -1, -1), active.demand, excess)


class EvictAll(EvictionRule):
    """Evict every active request (the alpha-protection greedy's memory reset)."""

    name = "all"

    def select(self, active: ActiveSet, excess: int) -> np.ndarray:
        return np.arange(active.ids.size)


class EstimateEviction(EvictionRule):
    """Evict in ascending order of current output estimate, ties newest first (A_min).

    One at a time until ``D_t <= M``; the engine then raises each evicted
    request's estimate to ``j_i + 1``.
    """

    name = "estimate"
    needs_estimates = True

    def select(self, active: ActiveSet, excess: int) -> np.ndarray:
        assert active.estimate is not None
        n = active.ids.size
        order = np.lexsort((-np.arange(n), active.estimate))
        return self.prefix_covering(order, active.demand, excess)


EVICTION_RULES: dict[str, type[EvictionRule]] = {
    "lifo": LIFOEviction,
    "all": EvictAll,
    "estimate": EstimateEviction,
}


def make_eviction_rule(rule: str | EvictionRule) -> EvictionRule:
    """An :class:`EvictionRule` from its name (``"lifo"``, ``"all"``, ``"estimate"``) or as given."""
    if isinstance(rule, EvictionRule):
        return rule
    try:
        return EVICTION_RULES[rule]()
    except (KeyError, TypeError):
        raise ValueError(f"eviction must be one of {sorted(EVICTION_RULES)}, got {rule!r}") from None

