"""Admission by a memory check of the future: MC, MC-SF and A_min."""

from __future__ import annotations

from typing import Any

import numpy as np

from flowgym.agents.base import DEFAULT_REQUEST, Agent, int_param
from flowgym.envs.view import SystemView
from flowgym.sim.admission import AdmissionRule

__all__ = ["future_fit_count", "MemoryCheck", "MCSF", "AMin"]


def future_fit_count(
    M: int,
    act_prompt: np.ndarray,
    act_generated: np.ndarray,
    act_output: np.ndarray,
    cand_prompt: np.ndarray,
    cand_output: np.ndarray,
) -> int:
    """Longest prefix of the candidates that keeps the usage ``<= M`` at every future slot.

    Lengths are the ones the caller assumes (true, longest possible, or
    estimates). An active request with ``j`` of ``o`` tokens generated holds
    ``l + j + h + 1`` tokens at ``h`` slots from now while ``h < o - j``; a
    candidate admitted now holds ``l + h + 1`` while ``h < o``. The check stops
    at the first candidate that does not fit (first come, first served).

    Between two completions the usage only grows, so it is checked at the last
    slot of each request (``h = remaining - 1``) and nowhere else.
    """
    if cand_prompt.size == 0:
        return 0
    rem = np.maximum(act_output - act_generated, 1)
    b = act_prompt + act_generated + 1
    order = np.argsort(rem)
    rem_s, b_s = rem[order], b[order]
    suffix_b = np.concatenate([np.cumsum(b_s[::-1])[::-1], [0]])

    def free_at(h: np.ndarray) -> np.ndarray:
        """``M - sum_{rem_i > h} (b_i + h)``: room left by the active set at offsets ``h``."""
        i = np.searchsorted(rem_s, h, side="right")  # first active with rem > h
        return M - (suffix_b[i] + h * (rem_s.size - i))

    room0 = free_at(np.zeros(1, dtype=np.int64))[0]
    if rem_s.size:
        worst = free_at(rem_s - 1).min()  # the active set alone must fit
        if worst < 0:
            return 0
    # quick bound: the candidates' first-slot tokens must fit
    k = int(np.searchsorted(np.cumsum(cand_prompt + 1), room0, side="right"))
    if k == 0:
        return 0
    cp, co = cand_prompt[:k], cand_output[:k]
    crit = np.unique(np.concatenate([rem_s - 1, co - 1]))  # offsets where some request is at its last slot
    free = free_at(crit)
    prof = (cp[:, None] + 1 + crit[None, :]) * (crit[None, :] < co[:, None])
    used = np.cumsum(prof, axis=0)  # used[c, x]: tokens of candidates 0..c at offset crit[x]
    ok = (used <= free[None, :]).all(axis=1)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else k


class MemoryCheck(Agent):
    """The paper's "MC benchmark": FCFS admission while the future memory stays within ``M``.

    Admit the next queued request only if the projected KV usage of the active
    set plus the admitted ones stays within ``M`` at every future slot (each
    request grows by one token per slot until it completes); stop at the first
    request that fails. With unknown lengths every output is assumed to be the
    longest possible (``view.max_output_len``), so it never overflows but
    admits conservatively. Never overflows with known lengths.
    """

    name = "mc"

    def __init__(self, max_budget: int | None = None) -> None:
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget}

    def _lengths(self, view: SystemView, q: Any, a: Any) -> tuple[np.ndarray, np.ndarray]:
        if view.known:
            return a.output_len, q.output_len
        o = view.max_output_len
        return np.full(a.ids.size, o, dtype=np.int64), np.full(q.ids.size, o, dtype=np.int64)

    def admission_rule(self, view: SystemView) -> AdmissionRule | None:
        if view.known:
            return AdmissionRule("future-fit", max_count=self.limit, lengths="known")
        return AdmissionRule("future-fit", max_count=self.limit, lengths="bound",
                             bound=int(view.max_output_len))

    def act(self, observation: Any, view: SystemView) -> int:
        if view.n_queued == 0:
            return 0
        q = view.queue(self.limit)
        a = view.active()
        act_o, cand_o = self._lengths(view, q, a)
        return future_fit_count(view.M, a.prompt_len, a.generated, act_o, q.prompt_len, cand_o)


class MCSF(MemoryCheck):
    """MC-SF (Jaillet et al. 2025): the memory check over the queue sorted by known output, shortest first.

    Needs known lengths and the environment's ``queue_order="sjf"``, so the
    budget admits exactly the prefix the check accepted. Never overflows.
    """

    name = "mc-sf"

    def __init__(self, max_budget: int | None = None) -> None:
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget, "queue_order": "sjf", "output_length_known": True}


class AMin(MemoryCheck):
    """A_min (Chen et al. 2025), as Dong & Cao describe it; the exact rule implemented here.

    Every request's output length is estimated by a lower bound, initially the
    shortest possible value (the environment's ``estimate_floor``: by default the
    workload's shortest possible output, e.g. 20 for the paper's classes). Admission: the
    queue is ordered by ascending estimate (``queue_order="estimate"``) and the
    memory check of :class:`MemoryCheck` admits the longest prefix whose
    projected usage, with estimated lengths, stays within ``M`` (an active
    request's estimate is ``max(e_i, j_i + 1)``: it has not finished yet).
    On overflow the environment evicts in ascending order of current estimate,
    newest first among ties (``eviction="estimate"``), and raises each evicted
    request's estimate to ``j_i + 1``, the tokens it had generated plus one.
    """

    name = "a-min"

    def __init__(self, max_budget: int | None = None) -> None:
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget, "queue_order": "estimate", "eviction": "estimate"}

    def _lengths(self, view: SystemView, q: Any, a: Any) -> tuple[np.ndarray, np.ndarray]:
        return a.estimate, q.estimate

    def admission_rule(self, view: SystemView) -> AdmissionRule | None:
        return AdmissionRule("future-fit", max_count=self.limit, lengths="estimate")
