"""Two references for adaptive budgets: the safe-budget rule and a known time schedule (phase oracle).

* :class:`SafeBudget` needs no tuning and no knowledge of the workload:
  ``B_t = k * M / E_hat[w]``, the environment's online safe budget
  (:class:`flowgym.sim.estimators.LoadTracker`, through ``action="multiplier"``).
* :class:`ScheduledBudget` follows a fixed (optionally periodic) schedule of budgets.
  Given a scenario's phase boundaries it is the *phase oracle* of the learned-budget
  tables: it switches exactly when the request mix does, which no causal policy can.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgym.agents.base import Agent
from flowgym.envs.view import SystemView

__all__ = ["SafeBudget", "ScheduledBudget"]


class SafeBudget(Agent):
    """``B_t = clip(round(k * M / E_hat[w]), 1, cap)``: a multiple of the online safe budget.

    Proposition 1: the cache sustains ``M / E[w]`` starts per slot; ``k = 1`` admits at
    that rate, larger ``k`` trades evictions for a shorter queue. ``E_hat[w]`` is
    estimated online from arriving prompts and completed requests only (no output
    length is read before a request finishes), so it works with unknown lengths and
    follows a changing mix. It acts through the environment's ``action="multiplier"``
    with the single multiplier ``k`` (so it never reads the engine).

    Args:
        k: the multiplier (positive).
        cap: the largest budget (also the budget before anything is known).
    """

    name = "safe-budget"

    def __init__(self, k: float = 2.0, cap: int = 256) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (math.isfinite(k) and k > 0):
            raise ValueError(f"k must be a positive finite number, got {k!r}")
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
            raise ValueError(f"cap must be a positive integer budget, got {cap!r}")
        self.k, self.cap = float(k), int(cap)
        self.requires = {"action": "multiplier", "multipliers": (self.k,), "max_budget": self.cap}

    def act(self, observation: Any, view: SystemView) -> int:
        return 0  # the only multiplier: k

    def label(self) -> str:
        return f"safe-budget k={self.k:g}"


class ScheduledBudget(Agent):
    """``B_t = budgets[i]`` for ``times[i] <= t' < times[i + 1]``, ``t' = t mod period`` (or ``t``).

    Args:
        times: start slot of each piece (ascending, the first 0).
        budgets: the budget of each piece (non-negative integers, one per time).
        period: repeat the schedule every ``period`` slots (``None``: the last piece lasts).
    """

    name = "schedule"

    def __init__(self, times: Sequence[float], budgets: Sequence[int], period: float | None = None) -> None:
        ts = [float(x) for x in times]
        bs = list(budgets)
        if not ts or len(ts) != len(bs):
            raise ValueError(f"times and budgets must be non-empty and of the same length, got {times!r}, {budgets!r}")
        if ts[0] != 0 or any(b <= a for a, b in zip(ts, ts[1:])) or not all(map(math.isfinite, ts)):
            raise ValueError(f"times must start at 0 and increase strictly, got {times!r}")
        for b in bs:
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0:
                raise ValueError(f"budgets must be non-negative integers, got {budgets!r}")
        if period is not None and not (math.isfinite(period) and period > ts[-1]):
            raise ValueError(f"period must be a number beyond the last time {ts[-1]:g}, got {period!r}")
        self.times, self.budgets, self.period = ts, [int(b) for b in bs], None if period is None else float(period)
        self.requires = {"max_budget": max(1, *self.budgets)}

    def act(self, observation: Any, view: SystemView) -> int:
        t = float(view.t) if self.period is None else float(view.t) % self.period
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.budgets[i]

    def label(self) -> str:
        per = "" if self.period is None else f" every {self.period:g}"
        return "schedule " + ",".join(f"{t:g}:{b}" for t, b in zip(self.times, self.budgets)) + per
