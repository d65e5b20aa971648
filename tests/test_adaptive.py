"""SafeBudget, TwoAnchorBudget and ScheduledBudget (agents/adaptive.py): what they accept, refuse and ask for, at the
boundaries (docs/testing.md, mutation testing). Their play is pinned in tests/test_generalist.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from flowgym.agents import SafeBudget, ScheduledBudget, TwoAnchorBudget


def test_safe_budget_asks_for_its_one_multiplier_and_a_cap_of_256_by_default():
    """Default ``cap=256``: the action space it asks for; its only action is multiplier 0 (``k``)."""
    a = SafeBudget()
    assert a.requires == {"action": "multiplier", "multipliers": (2.0,), "max_budget": 256}
    assert a.act(None, None) == 0
    assert SafeBudget(k=0.5, cap=1).requires == {"action": "multiplier", "multipliers": (0.5,), "max_budget": 1}
    assert SafeBudget(k=3, cap=np.int64(5)).label() == "safe-budget k=3 cap=5"  # a cap not the default is shown
    assert SafeBudget(k=3).label() == "safe-budget k=3"


@pytest.mark.parametrize("k", [0, 0.0, -1.0, math.inf, math.nan, True, "2", None])
def test_safe_budget_refuses_a_multiplier_not_positive_and_finite(k):
    """``k`` must be a positive finite number (0 and below, inf, nan, bools and strings refused)."""
    with pytest.raises(ValueError, match="k must be a positive finite number"):
        SafeBudget(k=k)


@pytest.mark.parametrize("k", [1e-3, 0.5, 1, 2.5])
def test_safe_budget_accepts_small_and_integer_multipliers(k):
    assert SafeBudget(k=k).k == float(k)


@pytest.mark.parametrize("cap", [0, -3, True, 2.5, "4", 2 * 10**9])
def test_safe_budget_refuses_a_cap_that_is_not_a_positive_integer(cap):
    with pytest.raises(ValueError, match=r"cap must be an integer from 1 to 1e\+09"):
        SafeBudget(cap=cap)
    assert SafeBudget(cap=2.0).env_options()["max_budget"] == 2  # an integral float is that integer


def _view(t):
    return SimpleNamespace(t=t, now=float(t))


def test_schedule_pieces_start_at_their_times_without_period():
    """``B_t = budgets[i]`` for ``times[i] <= t < times[i + 1]``; the last piece lasts."""
    a = ScheduledBudget(times=[0, 3, 5], budgets=[4, 0, 9])
    assert [a.act(None, _view(t)) for t in range(8)] == [4, 4, 4, 0, 0, 9, 9, 9]
    assert a.requires == {"max_budget": 9}
    assert a.label() == "schedule 0:4,3:0,5:9"
    p = ScheduledBudget(times=[0, 2.5], budgets=[1, 2], period=4)
    assert [p.act(None, _view(t)) for t in range(9)] == [1, 1, 1, 2, 1, 1, 1, 2, 1]
    assert p.label() == "schedule 0:1,2.5:2 every 4"


def test_schedule_in_continuous_time_switches_on_seconds_not_iterations():
    """In continuous time the schedule's times are seconds of the environment's clock (``view.now``)."""
    from flowgym import FlowControlEnv, Trace

    lin = {"kind": "linear", "c0": 1.0, "c_prefill": 0.1, "c_decode": 0.01, "c_kv": 0.001}
    tr = Trace([0.0, 0.5, 1.2, 10.0], [2, 1, 3, 4], [2, 1, 1, 1], timed=True)
    env = FlowControlEnv(M=100, workload=tr, horizon=None, time_model=lin)
    a = ScheduledBudget(times=[0, 1.1, 5], budgets=[1, 2, 3])  # in iterations: 1, 2, 2; in seconds 0, 1.2, 10: 1, 2, 3
    env.reset(seed=0)
    played, clock, done = [], [], False
    while not done:
        view = env.view()
        clock.append(view.now)
        played.append(a.act(None, view))
        done = any(env.step(played[-1])[2:4])
    assert env.view().timed and clock[:3] == [0.0, 1.2, 10.0]
    assert played[:3] == [1, 2, 3]


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


def test_two_anchor_budget_defaults_and_what_it_asks_for():
    a = TwoAnchorBudget()
    assert (a.k_rate, a.k_safe, a.cap) == (1.4, 1.0, 256) and a.label() == "two-anchor k_rate=1.4 k_safe=1"
    assert a.requires == {"action": "log-multiplier", "multiplier_of": "max", "multipliers": (1.0, 1.4),
                          "max_budget": 256}
    np.testing.assert_array_equal(a.act(None, None), [1.0, -1.0])  # k_rate the range's top, k_safe its bottom
    b = TwoAnchorBudget(k_rate=0.5, k_safe=2, cap=9)
    assert b.requires["multipliers"] == (0.5, 2.0) and b.requires["max_budget"] == 9
    np.testing.assert_array_equal(b.act(None, None), [-1.0, 1.0])
    c = TwoAnchorBudget(k_rate=3, k_safe=3)  # equal: both at the bottom of a range (3, 6)
    assert c.requires["multipliers"] == (3.0, 6.0)
    np.testing.assert_array_equal(c.act(None, None), [-1.0, -1.0])


@pytest.mark.parametrize("k_rate, k_safe", [(1.4, 1.0), (0.7, 2.0), (1.0, 1.0), (3, 3)])
def test_two_anchor_budget_is_the_larger_multiple_of_the_rate_and_the_safe_budget(k_rate, k_safe):
    """Each multiplier sits at one end of the environment's range; the budget is the larger product,
    and each anchor decides somewhere: the rate under overload (small cache), the safe budget at light load."""
    from flowgym.lab.evaluation import env_for

    agent = TwoAnchorBudget(k_rate=k_rate, k_safe=k_safe, cap=64)
    decided = {"rate": 0, "safe": 0}
    for M in (2000, 60000):  # safe budget ~1 (below the rate of 3 per slot), then ~30 (above it)
        kw = {"M": M, "horizon": 150, "workload": {"kind": "poisson", "classes": [[20, 30], [20, 60]], "rates": 3.0}}
        env = env_for(agent, kw, None)
        obs, _ = env.reset(seed=3)
        agent.reset(env.config, seed=3)
        for _ in range(150):
            rate, safe = env.tracker.arrival_rate(), env.safe_budget()
            a = agent.act(obs, env.view())
            want = int(min(max(round(max(k_rate * rate, k_safe * safe)), 1), 64))
            assert env.check_action(a) == want
            if abs(k_rate * rate - k_safe * safe) > 1:
                decided["rate" if k_rate * rate > k_safe * safe else "safe"] += 1
            obs, _, te, tr, _ = env.step(a)
            if te or tr:
                break
    assert decided["rate"] > 20 and decided["safe"] > 20, decided


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1"])
def test_two_anchor_budget_refuses_a_multiplier_not_positive_and_finite(bad):
    with pytest.raises(ValueError, match="k_rate must be a positive finite number"):
        TwoAnchorBudget(k_rate=bad)
    with pytest.raises(ValueError, match="k_safe must be a positive finite number"):
        TwoAnchorBudget(k_safe=bad)
    with pytest.raises(ValueError, match=r"cap must be an integer from 1 to 1e\+09"):
        TwoAnchorBudget(cap=0)


def test_two_anchor_head_asks_for_the_head_rate_anchor_and_refuses_a_non_bool():
    a = TwoAnchorBudget(head=True)
    assert a.requires["multiplier_of"] == "max-head" and a.label() == "two-anchor k_rate=1.4 k_safe=1 head"
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="head must be True or False"):
            TwoAnchorBudget(head=bad)


def test_two_anchor_head_budget_uses_the_larger_of_the_rate_now_and_at_the_head():
    """``multiplier_of="max-head"``: ``B = max(k_rate * max(rate, head_rate), k_safe * safe)``; after a busy
    phase ends with a backlog, the head's rate decides (larger than the rate now)."""
    from flowgym.lab.evaluation import env_for

    agent = TwoAnchorBudget(k_rate=1.4, k_safe=1.0, cap=256, head=True)
    wl = {"kind": "mix", "streams": [
        {"kind": "iid", "rate": {"kind": "steps", "times": [0, 200], "rates": [30.0, 1.0]},
         "lengths": {"kind": "empirical", "pairs": [[10, 20]], "weights": [1.0]}}]}
    env = env_for(agent, {"M": 8000, "horizon": 400, "workload": wl}, None)
    obs, _ = env.reset(seed=1)
    agent.reset(env.config, seed=1)
    head_decides = 0
    for _ in range(400):
        tr = env.tracker
        rate, head, safe = tr.arrival_rate(), tr.head_rate(), env.safe_budget()
        assert env._act_type.rate_anchor() == max(rate, head)
        a = agent.act(obs, env.view())
        assert env.check_action(a) == int(min(max(round(max(1.4 * max(rate, head), safe)), 1), 256))
        if 1.4 * head > max(1.4 * rate, safe) + 1:
            head_decides += 1
        obs, _, te, trunc, _ = env.step(a)
        if te or trunc:
            break
    assert head_decides > 20
