"""Greedy admission baselines: alpha-protection greedy and vLLM-like greedy with LIFO preemption."""

from __future__ import annotations

from typing import Any

import numpy as np

from flowgym.agents.base import DEFAULT_REQUEST, Agent, int_param
from flowgym.envs.view import SystemView
from flowgym.sim.admission import AdmissionRule

__all__ = ["AlphaProtectionGreedy", "GreedyLIFO", "greedy_fit_count"]


def greedy_fit_count(view: SystemView, limit: float, max_count: int) -> int:
    """How many queued requests, taken in queue order, fit this slot under ``limit``.

    Admits while ``demand + sum (l_c + 1) <= limit``, where ``demand`` is what
    the active set holds after this slot (``sum l_i + j_i + 1``) and a new
    request holds ``l_c + 1``; stops at the first that does not fit.
    """
    room = limit - view.demand
    if room < 2 or view.n_queued == 0:  # a request needs at least l + 1 >= 2 tokens
        return 0
    k = int(min(view.n_queued, max_count, room // 2))
    need = np.cumsum(view.queue(k).prompt_len + 1)
    return int(np.searchsorted(need, room, side="right"))


class AlphaProtectionGreedy(Agent):
    """Greedy admission with a protected memory fraction ``alpha``, memory reset on overflow.

    Jaillet et al. (2025), as Dong & Cao describe it: queued requests are added
    in order while the memory in use plus the new request's initial ``l + 1``
    stays within ``(1 - alpha) M``; on overflow every active request is evicted
    (environment option ``eviction="all"``). "Memory in use" is this slot's
    demand of the active set, ``sum (l_i + j_i + 1)``.
    """

    name = "alpha-greedy"

    def __init__(self, alpha: float = 0.1, max_budget: int | None = None) -> None:
        if (isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.integer, np.floating))
                or not 0 <= alpha < 1):
            raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
        self.alpha = float(alpha)
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"eviction": "all", "max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget}

    def admission_rule(self, view: SystemView) -> AdmissionRule | None:
        return AdmissionRule("greedy", limit=(1 - self.alpha) * view.M, max_count=self.limit)

    def act(self, observation: Any, view: SystemView) -> int:
        return greedy_fit_count(view, (1 - self.alpha) * view.M, self.limit)

    def label(self) -> str:
        return f"alpha-greedy alpha={self.alpha:g}" + self._max_budget_label()


class GreedyLIFO(Agent):
    """vLLM-like practice: admit FCFS while this slot's demand fits ``M``; LIFO recompute preemption.

    Admission ignores future growth (as vLLM's scheduler admits while free
    blocks hold the prompts); when the batch outgrows the cache the most
    recently admitted request is preempted and recomputed later
    (environment option ``eviction="lifo"``).
    """

    name = "greedy-lifo"

    def __init__(self, max_budget: int | None = None) -> None:
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"eviction": "lifo", "max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget}

    def admission_rule(self, view: SystemView) -> AdmissionRule | None:
        return AdmissionRule("greedy", limit=float(view.M), max_count=self.limit)

    def act(self, observation: Any, view: SystemView) -> int:
        return greedy_fit_count(view, view.M, self.limit)
