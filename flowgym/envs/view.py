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


class ActiveSnapshot(NamedTuple):
    """Active requests in activation order (oldest first)."""

    ids: np.ndarray
    prompt_len: np.ndarray
    generated: np.ndarray  #: ``j_i``, tokens generated so far
    output_len: np.ndarray | None  #: ``None`` unless output lengths are known
    estimate: np.ndarray  #: ``max(e_i, j_i + 1)``: what is known of ``o_i``


class SystemView:
    """A read-only window on the engine at the decision point of slot ``t``.

    Attributes:
        t: the slot about to be served.
        M: the KV budget.
        known: whether output lengths are visible.
        max_output_len: an upper bound on any request's output length (the
            workload's bound, capped by ``M - 1``); what an agent that must
            assume the longest possible output uses.
        held_tokens: KV tokens held by the active set (``sum l_i + j_i``).
        demand: this slot's demand with no admission (``held_tokens + active``).
        n_queued, n_active: counts.
        eviction, queue_order: the environment's rule names.
    """

    def __init__(self, engine: Engine, known: bool) -> None:
        self._e = engine
        self.known = known
        bound = engine.workload.max_output_tokens()
        self.max_output_len = engine.M - 1 if bound is None else min(int(bound), engine.M - 1)
        self.M = engine.M
        self.eviction = engine.eviction.name
        self.queue_order = engine.order.name

    @property
    def t(self) -> int:
        return self._e.t

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
        )
