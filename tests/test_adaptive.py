"""SafeBudget and ScheduledBudget (agents/adaptive.py): what they accept, refuse and ask for, at the
boundaries (docs/testing.md, mutation testing). Their play is pinned in tests/test_generalist.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from flowgym.agents import SafeBudget, ScheduledBudget


def test_safe_budget_asks_for_its_one_multiplier_and_a_cap_of_256_by_default():
    """Default ``cap=256``: the action space it asks for; its only action is multiplier 0 (``k``)."""
    a = SafeBudget()
    assert a.requires == {"action": "multiplier", "multipliers": (2.0,), "max_budget": 256}
    assert a.act(None, None) == 0
    assert SafeBudget(k=0.5, cap=1).requires == {"action": "multiplier", "multipliers": (0.5,), "max_budget": 1}
    assert SafeBudget(k=3, cap=np.int64(5)).label() == "safe-budget k=3"


@pytest.mark.parametrize("k", [0, 0.0, -1.0, math.inf, math.nan, True, "2", None])
def test_safe_budget_refuses_a_multiplier_not_positive_and_finite(k):
    """``k`` must be a positive finite number (0 and below, inf, nan, bools and strings refused)."""
    with pytest.raises(ValueError, match="k must be a positive finite number"):
        SafeBudget(k=k)


@pytest.mark.parametrize("k", [1e-3, 0.5, 1, 2.5])
def test_safe_budget_accepts_small_and_integer_multipliers(k):
    assert SafeBudget(k=k).k == float(k)


@pytest.mark.parametrize("cap", [0, -3, True, 2.0, "4"])
def test_safe_budget_refuses_a_cap_that_is_not_a_positive_integer(cap):
    with pytest.raises(ValueError, match="cap must be a positive integer budget"):
        SafeBudget(cap=cap)


def _view(t):
    return SimpleNamespace(t=t)


def test_schedule_pieces_start_at_their_times_without_period():
    """``B_t = budgets[i]`` for ``times[i] <= t < times[i + 1]``; the last piece lasts."""
    a = ScheduledBudget(times=[0, 3, 5], budgets=[4, 0, 9])
    assert [a.act(None, _view(t)) for t in range(8)] == [4, 4, 4, 0, 0, 9, 9, 9]
    assert a.requires == {"max_budget": 9}
    assert a.label() == "schedule 0:4,3:0,5:9"
    p = ScheduledBudget(times=[0, 2.5], budgets=[1, 2], period=4)
    assert [p.act(None, _view(t)) for t in range(9)] == [1, 1, 1, 2, 1, 1, 1, 2, 1]
    assert p.label() == "schedule 0:1,2.5:2 every 4"


def test_schedule_asks_for_a_max_budget_of_its_largest_budget_and_at_least_1():
    assert ScheduledBudget(times=[0, 1], budgets=[0, 7]).requires == {"max_budget": 7}
    assert ScheduledBudget(times=[0], budgets=[0]).requires == {"max_budget": 1}
    assert ScheduledBudget(times=[0], budgets=[np.int64(3)]).requires == {"max_budget": 3}


@pytest.mark.parametrize("times, budgets", [([], []), ([0, 1], [1]), ([0], [1, 2])])
def test_schedule_refuses_empty_or_mismatched_pieces(times, budgets):
    with pytest.raises(ValueError, match="times and budgets must be non-empty and of the same length"):
        ScheduledBudget(times=times, budgets=budgets)


@pytest.mark.parametrize("times", [[1, 5], [0, 5, 5], [0, 5, 3], [0, math.inf], [0, 2, math.nan], [-1, 0]])
def test_schedule_refuses_times_not_from_0_strictly_increasing_and_finite(times):
    with pytest.raises(ValueError, match="times must start at 0 and increase strictly"):
        ScheduledBudget(times=times, budgets=[1] * len(times))


@pytest.mark.parametrize("budgets", [[1, -1], [True, 1], [1, 2.0]])
def test_schedule_refuses_budgets_that_are_not_non_negative_integers(budgets):
    with pytest.raises(ValueError, match="budgets must be non-negative integers"):
        ScheduledBudget(times=[0, 1], budgets=budgets)


def test_schedule_period_must_lie_beyond_the_last_time():
    """``period > times[-1]`` and finite: the error names the last time."""
    assert ScheduledBudget(times=[0, 2, 5], budgets=[1, 2, 3], period=5.5).period == 5.5
    assert ScheduledBudget(times=[0, 2, 5], budgets=[1, 2, 3], period=None).period is None
    for period in (4, 5, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"period must be a number beyond the last time 5, got"):
            ScheduledBudget(times=[0, 2, 5], budgets=[1, 2, 3], period=period)
