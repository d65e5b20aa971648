"""The read-only view of the system that scripted agents may read.

``env.unwrapped.view()`` returns a :class:`SystemView`: the queue (in the
environment's admission order) and the active set (in activation order) as
fresh, read-only numpy arrays. With ``output_length_known=False`` the output
lengths and classes are ``None``: an agent cannot learn ``o_i`` from the view,
only what a real server knows (prompt lengths, tokens generated so far, the
estimates of the ``estimate`` order, and a bound on output lengths).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from flowgym.sim.engine import Engine
from flowgym.sim.vllm import VllmEngine, default_max_tokens

__all__ = ["QueueSnapshot", "ActiveSnapshot", "SystemView"]


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


class QueueSnapshot(NamedTuple):
    """Waiting requests in admission order (the head is admitted first)."""

    ids: np.ndarray
    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray | None  #: ``None`` unless output lengths are known
    cls: np.ndarray | None  #: ``None`` unless lengths (and classes) are known
    estimate: np.ndarray  #: current output estimates (lower bounds; 1 unless tracked)
    evictions: np.ndarray  #: times each was evicted so far
    #: the client's cap on each output (``max_tokens``, ``>= o``; what a real server knows). In the
    #: paper mode every request's is the default of :func:`~flowgym.sim.vllm.default_max_tokens`.
    max_tokens: np.ndarray | None = None
    #: output tokens already generated and kept (``vllm-v1`` recompute preemption; else 0)
    generated: np.ndarray | None = None


class ActiveSnapshot(NamedTuple):
    """Active requests in activation order (oldest first)."""

    ids: np.ndarray
    prompt_len: np.ndarray
    generated: np.ndarray  #: ``j_i``, tokens generated so far
    output_len: np.ndarray | None  #: ``None`` unless output lengths are known
    estimate: np.ndarray  #: ``max(e_i, j_i + 1)``: what is known of ``o_i``
    #: the client's cap on each output (see :class:`QueueSnapshot`)
    max_tokens: np.ndarray | None = None
    #: KV blocks each holds (``vllm-v1``); in the paper mode its tokens ``l + j + 1`` this slot
    blocks: np.ndarray | None = None


class SystemView:
    """A read-only window on the engine at the decision point of slot ``t``.

    Attributes:
        t: the slot (engine iteration) about to be served.
        timed: whether the environment runs in continuous time (a ``time_model``).
        now: the clock at this decision point: the start of the iteration in seconds in continuous time,
            else the slot ``t``.
        M: the KV budget.
        known: whether output lengths are visible.
        max_output_len: an upper bound on any request's output length (the
            workload's bound, capped by ``M - 1``); what an agent that must
            assume the longest possible output uses.
        held_tokens: KV tokens held by the active set (``sum l_i + j_i``).
        demand: this slot's demand with no admission (``held_tokens + active``).
        n_queued, n_active: counts.
        eviction, queue_order: the environment's rule names.
        engine_mode: ``"paper"`` or ``"vllm-v1"``.
        block_size, num_blocks, lookahead: the cache in blocks: ``vllm-v1``'s, and in the paper
            mode ``1``, ``M`` and ``1`` (a request holds ``l + j + 1`` tokens while generating),
            so that :meth:`blocks_for` counts what a request holds in either mode.
    """

    def __init__(self, engine: Engine, known: bool) -> None:
        self._e = engine
        self.known = known
        bound = engine.workload.max_output_tokens()
        self.max_output_len = engine.M - 1 if bound is None else min(int(bound), engine.M - 1)
        self.M = engine.M
        self.eviction = engine.eviction.name
        self.queue_order = engine.order.name
        self._vllm = isinstance(engine, VllmEngine)
        self.engine_mode = engine.mode if isinstance(engine, VllmEngine) else "paper"
        self.block_size = engine.block_size if isinstance(engine, VllmEngine) else 1
        self.num_blocks = engine.num_blocks if isinstance(engine, VllmEngine) else engine.M
        self.lookahead = engine.lookahead if isinstance(engine, VllmEngine) else 1
        self._mt_bound = bound
        self.timed = bool(engine.timed)

    @property
    def free_blocks(self) -> int:
        """Blocks no running request holds (paper mode: ``M - demand``, this slot's free tokens)."""
        e = self._e
        if isinstance(e, VllmEngine):
            return e.free_blocks
        return e.M - (e.held + e.n_active)

    @property
    def total_evictions(self) -> int:
        """Evictions (preemptions) so far."""
        return self._e.total_evictions

    def blocks_for(self, tokens: np.ndarray | int) -> np.ndarray | int:
        """Blocks a request holds with ``tokens`` KV tokens computed: ``ceil((tokens + lookahead) / block_size)``."""
        return -(-(np.asarray(tokens) + self.lookahead) // self.block_size)

    def _max_tokens(self, ids: np.ndarray) -> np.ndarray:
        e = self._e
        if isinstance(e, VllmEngine):
            return e.max_tokens[ids]
        return default_max_tokens(e.prompt[ids], e.output[ids], self._mt_bound, e.M)

    @property
    def t(self) -> int:
        return self._e.t

    @property
    def now(self) -> float:
        """The clock: seconds at the start of this iteration in continuous time, else the slot ``t``."""
        e = self._e
        return float(e.now) if self.timed else float(e.t)

    @property
    def held_tokens(self) -> int:
        return self._e.held

    @property
    def n_queued(self) -> int:
        return self._e.n_queued

    @property
    def n_active(self) -> int:
        return self._e.n_active

    @property
    def demand(self) -> int:
        return self._e.held + self._e.n_active

    def queue(self, k: int | None = None) -> QueueSnapshot:
        """The first ``k`` waiting requests (all when ``k`` is ``None``)."""
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
            raise ValueError(f"queue(k): k must be a non-negative integer or None, got {k!r}")
        e = self._e
        if len(e.lanes) == 1:
            ids = e.lanes[0].items()
            ids = ids if k is None else ids[:k]
        else:
            ids = e.queue_ids()
            ids = ids if k is None else ids[:k]
        return QueueSnapshot(
            _ro(ids),
            _ro(e.arrival[ids]),
            _ro(e.prompt[ids]),
            _ro(e.output[ids]) if self.known else None,
            _ro(e.cls[ids]) if self.known else None,
            _ro(e.estimate[ids]),
            _ro(e.evictions[ids]),
            _ro(self._max_tokens(ids)),
            _ro(e.gen[ids] if isinstance(e, VllmEngine) else np.zeros(ids.size, np.int64)),
        )

    def active(self) -> ActiveSnapshot:
        """All active requests in activation order."""
        e = self._e
        ids = e.active_ids()
        gen = e.active_generated()
        return ActiveSnapshot(
            _ro(ids),
            _ro(e.prompt[ids]),
            _ro(gen),
            _ro(e.output[ids]) if self.known else None,
            _ro(np.maximum(e.estimate[ids], gen + 1)),
            _ro(self._max_tokens(ids)),
            _ro(e.active_blocks() if isinstance(e, VllmEngine) else e.prompt[ids] + gen + 1),
        )
