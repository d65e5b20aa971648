"""References for adaptive budgets: the safe-budget rule, its two-anchor form, and a known time schedule.

* :class:`SafeBudget` needs no tuning and no knowledge of the workload:
  ``B_t = k * M / E_hat[w]``, the environment's online safe budget
  (:class:`flowgym.sim.estimators.LoadTracker`, through ``action="multiplier"``).
* :class:`TwoAnchorBudget`: ``B_t = max(k_rate * arrival rate, k_safe * M / E_hat[w])``, the
  fixed form of the two-anchor action the generalist learns on (``multiplier_of="max"``; with
  ``head=True`` the rate anchor is the queue head's, ``"max-head"``, the shipped generalist's action).
* :class:`ScheduledBudget` follows a fixed (optionally periodic) schedule of budgets.
  Given a scenario's phase boundaries it is the *phase oracle* of the learned-budget
  tables: it switches exactly when the request mix does, which no causal policy can.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgym.agents.base import MAX_INT_PARAM, Agent, int_param
from flowgym.envs.flow_control import MAX_MULTIPLIER
from flowgym.envs.view import SystemView
from flowgym.sim._checks import is_real

__all__ = ["SafeBudget", "TwoAnchorBudget", "ScheduledBudget"]


def _multiplier(label: str, k: Any) -> float:
    """``k`` as a float; raises ``ValueError`` naming ``label`` unless it is a positive finite number, at most
    the environment's largest multiplier (:data:`~flowgym.envs.flow_control.MAX_MULTIPLIER`)."""
    if not is_real(k) or not 0 < k <= MAX_MULTIPLIER:  # the range first: no float(10**400); nan fails it
        raise ValueError(f"{label} must be a positive finite number (at most {MAX_MULTIPLIER:g}), got {k!r}")
    return float(k)


def _cap(cap: Any) -> int:
    """``cap`` as an int; raises ``ValueError`` naming it unless it is a positive integer budget (at most 10**9)."""
    return int_param("cap", cap, 1)


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
        cap: the ``max_budget`` it asks the environment for, the clip of ``B_t`` (and the budget before
            anything is known); a scenario with a larger ``max_budget`` keeps its own.
    """

    name = "safe-budget"

    def __init__(self, k: float = 2.0, cap: int = 256) -> None:
        self.k, self.cap = _multiplier("k", k), _cap(cap)
        self.requires = {"action": "multiplier", "multipliers": (self.k,), "max_budget": self.cap}

    def act(self, observation: Any, view: SystemView) -> int:
        return 0  # the only multiplier: k

    def label(self) -> str:
        return f"safe-budget k={self.k:g}" + ("" if self.cap == 256 else f" cap={self.cap}")


class TwoAnchorBudget(Agent):
    """``B_t = clip(round(max(k_rate * rate, k_safe * M / E_hat[w])), 1, cap)``: the larger of two anchors.

    A multiple of the arrival rate (moving average over 32 slots) reacts at once when the request
    mix changes; a multiple of the online safe budget keeps the cache busy while a backlog waits
    after arrivals slowed down, where a multiple of the rate starves it (``docs/training.md``,
    "Two anchors"). Untuned, ``k_rate=1.4, k_safe=1`` is a strong simple reference on switching
    loads; under stationary overload it admits too much (the rate anchor exceeds what the cache
    sustains). It acts through the environment's ``action="log-multiplier"`` with
    ``multiplier_of="max"``, each multiplier at one end of the range, so it never reads the engine.

    Args:
        k_rate: the multiplier of the arrival rate (positive).
        k_safe: the multiplier of the safe budget (positive).
        cap: the ``max_budget`` it asks the environment for, the clip of ``B_t`` (and the safe budget
            before anything is known); a scenario with a larger ``max_budget`` keeps its own.
        head: the rate anchor is the larger of the arrival rate now and when the request at the queue
            head arrived (``multiplier_of="max-head"``), so a backlog left from a busier phase is
            admitted at the rate it came.
    """

    name = "two-anchor"

    def __init__(self, k_rate: float = 1.4, k_safe: float = 1.0, cap: int = 256, head: bool = False) -> None:
        self.k_rate, self.k_safe, self.cap = _multiplier("k_rate", k_rate), _multiplier("k_safe", k_safe), _cap(cap)
        if not isinstance(head, (bool, np.bool_)):
            raise ValueError(f"head must be True or False, got {head!r}")
        self.head = bool(head)
        lo = min(self.k_rate, self.k_safe)
        hi = max(self.k_rate, self.k_safe)
        if hi == lo:
            hi = 2.0 * lo  # the range needs two ends; both multipliers sit at its low end
        # a = -1 is the range's low end (exactly), a = 1 its high end (to the last bit of k_min * (hi / lo))
        self._action = np.array([-1.0 if self.k_rate == lo else 1.0, -1.0 if self.k_safe == lo else 1.0], np.float32)
        self.requires = {"action": "log-multiplier", "multiplier_of": "max-head" if self.head else "max",
                         "multipliers": (lo, hi), "max_budget": self.cap}

    def act(self, observation: Any, view: SystemView) -> np.ndarray:
        return self._action.copy()

    def label(self) -> str:
        return (f"two-anchor k_rate={self.k_rate:g} k_safe={self.k_safe:g}" + (" head" if self.head else "")
                + ("" if self.cap == 256 else f" cap={self.cap}"))


class ScheduledBudget(Agent):
    """``B_t = budgets[i]`` for ``times[i] <= t' < times[i + 1]``, ``t' = now mod period`` (or ``now``).

    ``now`` is the environment's clock at the decision (:attr:`SystemView.now`): the slot in slot time,
    the seconds at the start of the iteration in continuous time (a ``time_model``), so the times and the
    period are in slots or in seconds accordingly.

    Args:
        times: start of each piece (slots or seconds; ascending, the first 0).
        budgets: the budget of each piece (non-negative integers, one per time).
        period: repeat the schedule every ``period`` slots or seconds (``None``: the last piece lasts).
    """

    name = "schedule"

    def __init__(self, times: Sequence[float], budgets: Sequence[int], period: float | None = None) -> None:
        if (not isinstance(times, (Sequence, np.ndarray)) or isinstance(times, str)
                or (isinstance(times, np.ndarray) and times.ndim != 1) or any(
                isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) for x in times)):
            raise ValueError(f"times must be a list of numbers (slots or seconds), got {times!r}")
        if not all(-1e15 <= x <= 1e15 for x in times):  # before float(): no float(10**400); nan and inf fail it
            raise ValueError(f"times must start at 0 and increase strictly, each finite and at most 1e15, got {times!r}")
        ts = [float(x) for x in times]
        if (isinstance(budgets, str) or not isinstance(budgets, (Sequence, np.ndarray))
                or (isinstance(budgets, np.ndarray) and budgets.ndim != 1)):
            raise ValueError(f"budgets must be a list of non-negative integers, got {budgets!r}")
        bs = list(budgets)
        if not ts or len(ts) != len(bs):
            raise ValueError(f"times and budgets must be non-empty and of the same length, got {times!r}, {budgets!r}")
        if ts[0] != 0 or any(b <= a for a, b in zip(ts, ts[1:])) or not all(map(math.isfinite, ts)):
            raise ValueError(f"times must start at 0 and increase strictly, got {times!r}")
        for b in bs:
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b <= MAX_INT_PARAM:
                raise ValueError(f"budgets must be non-negative integers (at most {MAX_INT_PARAM:g}), got {budgets!r}")
        if period is not None and (not is_real(period) or not ts[-1] < period <= 1e15):  # nan fails the range
            raise ValueError(f"period must be a number beyond the last time {ts[-1]:g}, got {period!r} (at most 1e15)")
        self.times, self.budgets, self.period = ts, [int(b) for b in bs], None if period is None else float(period)
        self.requires = {"max_budget": max(1, *self.budgets)}

    def act(self, observation: Any, view: SystemView) -> int:
        t = view.now if self.period is None else view.now % self.period
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.budgets[i]

    def label(self) -> str:
        per = "" if self.period is None else f" every {self.period:g}"
        return "schedule " + ",".join(f"{t:g}:{b}" for t, b in zip(self.times, self.budgets)) + per
