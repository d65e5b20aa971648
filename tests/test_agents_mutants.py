"""What the scripted agents promise at their edges: defaults, the boundary values their
checks accept or refuse (with the message), and MC's future-fit rule computed by hand.

Each test here kills mutants that ``tools/mutate.py`` found surviving ``tests/test_agents.py``
(docs/testing.md lists them): a default a user relies on without writing it (``b=12``, the
``max_budget`` of 1024 an agent asks of the environment), a budget of exactly 0 or a cap of
exactly ``b`` (allowed), and the slot of the future at which MC's check binds.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowgym
from flowgym.agents import (
    MCSF,
    AlphaProtectionGreedy,
    AMin,
    FixedBudget,
    FlowControl,
    GreedyLIFO,
    MemoryCheck,
    RandomBudget,
    RateSwitch,
    make_agent,
)
from flowgym.agents.memory_check import future_fit_count


def _rate(x: float) -> dict:
    return {"arrival_rate": np.array([x], np.float32)}


# --------------------------------------------------------------------------- defaults


def test_flow_control_default_is_the_papers_budget_12():
    """``FlowControl()`` is Algorithm 2 with ``b = 12`` (the budget the paper's experiments tune to)."""
    ag = FlowControl()
    assert ag.b == 12 and ag.cap is None and ag.per_class is None
    assert ag.act(None, None) == 12
    assert ag.env_options() == {"eviction": "lifo", "max_budget": 12}
    assert ag.label() == "flow-control b=12"
    assert make_agent("flow-control").act(None, None) == 12


def test_random_budget_defaults_draw_every_budget_from_0_to_32():
    ag = RandomBudget()
    assert (ag.low, ag.high) == (0, 32)
    assert ag.env_options() == {"max_budget": 32}
    assert ag.label() == "random 0..32"
    cfg = flowgym.FlowControlEnv(M=100, horizon=10, max_budget=32).config
    ag.reset(cfg, seed=3)
    draws = {ag.act(None, None) for _ in range(3000)}
    assert draws == set(range(33))  # uniform on {0, ..., 32}: both ends drawn, nothing outside


@pytest.mark.parametrize("cls", [GreedyLIFO, MemoryCheck, MCSF, AMin, AlphaProtectionGreedy])
def test_queue_reading_agents_ask_for_a_max_budget_of_1024(cls):
    """The greedy and memory-check agents ask for an environment with ``max_budget = 1024`` (its action space is
    0..1024, or the scenario's if larger) and, unless given their own ``max_budget``, admit up to its cap."""
    opts = cls().env_options()
    assert opts["max_budget"] == 1024
    env = flowgym.FlowControlEnv(M=1000, horizon=5, **opts)
    assert env.action_space.contains(1024) and not env.action_space.contains(1025)


def test_alpha_greedy_default_protects_a_tenth_of_the_memory():
    ag = AlphaProtectionGreedy()
    assert ag.alpha == 0.1 and ag.label() == "alpha-greedy alpha=0.1"


# --------------------------------------------------------------------------- boundaries of the checks


def test_budget_zero_is_a_valid_budget():
    """0 is a budget (admit nothing); the action space still needs ``max_budget >= 1``."""
    fc = FlowControl(b=0)
    assert fc.act(None, None) == 0 and fc.env_options() == {"eviction": "lifo", "max_budget": 1}
    fixed = FixedBudget(0)
    assert fixed.act(None, None) == 0 and fixed.env_options() == {"max_budget": 1}
    rs = RateSwitch(high=0, low=0)
    assert rs.act(_rate(50.0), None) == 0 and rs.env_options()["max_budget"] == 1
    rs = RateSwitch(high=3, low=0)
    assert rs.act(_rate(0.0), None) == 0 and rs.act(_rate(11.0), None) == 3
    rb = RandomBudget(low=0, high=0)
    rb.reset(flowgym.FlowControlEnv(M=100, horizon=10).config, seed=0)
    assert {rb.act(None, None) for _ in range(20)} == {0} and rb.env_options() == {"max_budget": 1}
    per_class = FlowControl(b=(0, 0))
    assert per_class.act(None, None).tolist() == [0, 0] and per_class.env_options()["max_budget"] == 1
    assert FlowControl(b=(1, 1)).env_options()["max_budget"] == 1  # the largest b_k
    assert FlowControl(b=(1, 3)).env_options()["max_budget"] == 3
    assert FlowControl(b=1).env_options()["max_budget"] == 1 and FixedBudget(1).env_options()["max_budget"] == 1
    zero = FlowControl(b=0.0, cap=1)
    zero.reset(flowgym.FlowControlEnv(M=100, horizon=10).config, seed=0)
    assert {zero.act(None, None) for _ in range(20)} == {0}  # Binomial(1, 0) is always 0


def test_random_budget_low_equal_high_is_a_constant():
    rb = RandomBudget(low=5, high=5)
    rb.reset(flowgym.FlowControlEnv(M=100, horizon=10, max_budget=5).config, seed=0)
    assert {rb.act(None, None) for _ in range(20)} == {5}


def test_rate_switch_threshold_zero_switches_on_any_arrival():
    """``threshold=0`` is allowed: the high budget as soon as the rate is above 0."""
    rs = RateSwitch(high=9, low=1, threshold=0)
    assert rs.threshold == 0.0
    assert rs.act(_rate(0.0), None) == 1 and rs.act(_rate(0.01), None) == 9


def test_random_budget_cap_equal_to_b_is_allowed_and_always_b():
    """``cap == b``: Binomial(b, 1) is always ``b`` (the boundary of ``cap >= b``)."""
    fc = FlowControl(b=3, cap=3)
    fc.reset(flowgym.FlowControlEnv(M=100, horizon=10, max_budget=3).config, seed=0)
    assert fc.env_options() == {"eviction": "lifo", "max_budget": 3}
    assert {fc.act(None, None) for _ in range(50)} == {3}
    one = FlowControl(b=0.5, cap=1)  # the smallest cap
    assert one.env_options()["max_budget"] == 1


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: FlowControl(b=-1), r"budget b must be a non-negative number \(at most 1e9\), got -1"),
        (lambda: FlowControl(b=-0.5, cap=2), "budget b must be a non-negative number"),
        (lambda: FlowControl(b=(1, -1)), "per-class budgets b must be non-negative integers"),
        (lambda: FlowControl(b=3, cap=2), r"cap must be an integer >= b, got cap=2, b=3"),
        (lambda: FlowControl(b=0, cap=0), r"cap must be an integer from 1 to 1e\+09, got 0"),
        (lambda: FlowControl(b=2.5), "a fixed budget b must be an integer"),
        (lambda: FixedBudget(-1), r"b must be an integer from 0 to 1e\+09, got -1"),
        (lambda: RateSwitch(low=-1), r"low must be an integer from 0 to 1e\+09, got -1"),
        (lambda: RateSwitch(high=-1), r"high must be an integer from 0 to 1e\+09, got -1"),
        (lambda: RateSwitch(threshold=-0.5), r"threshold \(arrivals per slot, or per second in continuous time\) must be a non-negative"),
        (lambda: RandomBudget(low=-1, high=3), r"low must be an integer from 0 to 1e\+09, got -1"),
        (lambda: RandomBudget(low=4, high=3), "need 0 <= low <= high, got low=4, high=3"),
        (lambda: AlphaProtectionGreedy(alpha=1.0), r"alpha must be in \[0, 1\), got 1.0"),
        (lambda: AlphaProtectionGreedy(alpha=-0.01), r"alpha must be in \[0, 1\)"),
        # an independent review (2026-11-27): these were accepted, truncated or raised a raw OverflowError
        (lambda: FixedBudget(float("inf")), r"b must be an integer from 0 to 1e\+09, got inf"),
        (lambda: FixedBudget(True), r"b must be an integer from 0 to 1e\+09, got True"),
        (lambda: FlowControl(b=True), r"budget b must be a non-negative number \(at most 1e9\), got True"),
        (lambda: FlowControl(b="12"), r"budget b must be a non-negative number \(at most 1e9\), got '12'"),
        (lambda: FlowControl(b=4, cap=6.9), r"cap must be an integer from 1 to 1e\+09, got 6.9"),
        (lambda: FlowControl(b=[True, False]), "per-class budgets b must be non-negative integers"),
        (lambda: RandomBudget(low=0.5, high=2.9), r"low must be an integer from 0 to 1e\+09, got 0.5"),
        (lambda: RateSwitch(high=None), r"high must be an integer from 0 to 1e\+09, got None"),
        (lambda: AlphaProtectionGreedy(alpha="0.1"), r"alpha must be in \[0, 1\), got '0.1'"),
        (lambda: AlphaProtectionGreedy(max_budget=0), r"max_budget must be an integer from 1 to 1e\+09, got 0"),
        (lambda: AlphaProtectionGreedy(max_budget=2.7), r"max_budget must be an integer from 1 to 1e\+09, got 2.7"),
    ],
)
def test_just_outside_the_boundary_is_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_alpha_zero_is_allowed_and_uses_all_of_M():
    ag = AlphaProtectionGreedy(alpha=0.0)
    assert ag.alpha == 0.0 and ag.env_options() == {"eviction": "all", "max_budget": 1024}


# --------------------------------------------------------------------------- MC's future-fit rule by hand


def _ffc(M, active, cands):
    """``future_fit_count`` from ``(l, j, o)`` active rows and ``(l, o)`` candidate rows."""
    a = np.array(active, dtype=np.int64).reshape(-1, 3)
    c = np.array(cands, dtype=np.int64).reshape(-1, 2)
    return future_fit_count(M, a[:, 0], a[:, 1], a[:, 2], c[:, 0], c[:, 1])


def test_future_fit_with_no_candidate_admits_none():
    assert _ffc(10, [(2, 0, 3)], []) == 0
    assert _ffc(10, [], []) == 0


def test_future_fit_active_set_exactly_at_M_later_still_admits_what_finishes_before():
    """The active set may reach exactly ``M`` in the future (``<= M`` is allowed); a candidate
    that is gone by then still fits.

    M = 10; active r = (l 2, j 1, o 8): 7 tokens to go, holds 2 + 1 + h + 1 = 4 + h for h < 7,
    so 10 = M at h = 6 (free 0: allowed, not an overflow).
    - candidate (1, 1): holds 1 + 0 + 1 = 2 at h = 0 only: 4 + 2 = 6 <= 10, gone at h = 6 -> fits.
    - candidate (1, 7): holds 2 + h for h < 7: at h = 6, 10 + 8 > 10 -> does not fit.
    - candidates (1, 1), (1, 6): the second holds 2 + h for h < 6: at h = 5, (4 + 5) + 7 = 16 > 10.
    """
    assert _ffc(10, [(2, 1, 8)], [(1, 1)]) == 1
    assert _ffc(10, [(2, 1, 8)], [(1, 7)]) == 0
    assert _ffc(10, [(2, 1, 8)], [(1, 1), (1, 6)]) == 1
    # one token more for the active request: 11 > 10 at h = 6: nothing is admitted
    assert _ffc(10, [(3, 1, 8)], [(1, 1)]) == 0


def test_memory_check_admits_beside_a_request_that_will_fill_the_cache_exactly():
    """The same case through the agent and the environment (known lengths).

    M = 10. t=0: request 0 (l 2, o 8) alone: it peaks at 2 + 8 = 10 <= 10: admitted.
    t=1: request 1 (l 1, o 1) arrives; request 0 (j 1) will hold 4 + h, 10 at h = 6;
    request 1 holds 2 at h = 0 and is done: MC admits it; the slot's usage 4 + 2 = 6.
    Both finish without eviction: f = 0 + 8, 1 + 1.
    """
    agent = MemoryCheck()
    wl = flowgym.Trace(arrival=[0, 1], prompt_len=[2, 1], output_len=[8, 1])
    env = flowgym.FlowControlEnv(M=10, horizon=None, workload=wl, output_length_known=True, **agent.env_options())
    obs, _ = env.reset(seed=0)
    agent.reset(env.config, seed=0)
    assert agent.act(obs, env.view()) == 1
    obs, _, _, _, info = env.step(1)
    assert agent.act(obs, env.view()) == 1
    obs, _, _, _, info = env.step(1)
    assert info["admitted"] == 1 and info["usage"] == 6 and info["evicted"] == 0
    done = False
    while not done:
        obs, _, te, tr, info = env.step(agent.act(obs, env.view()))
        assert info["evicted"] == 0
        done = te or tr
    assert env.request_log()["finish"].tolist() == [8, 2]


def test_future_fit_raises_no_numpy_warning():
    """The check runs every slot: it must not emit numpy warnings (e.g. a division by zero)
    into a user's run, where ``-W error`` or a warnings filter would stop it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ffc(10, [(2, 1, 8)], [(1, 1), (1, 6)]) == 1
        assert _ffc(100, [(20, 1, 20)], [(10, 40), (10, 40), (10, 40)]) == 2


@pytest.mark.parametrize("name", ["mc", "mc-sf", "a-min", "greedy-lifo", "alpha-greedy", "sglang-reserve", "trt-no-evict"])
def test_an_agent_s_own_max_budget_caps_it_and_the_default_leaves_the_environment_s(name):
    """``max_budget=2`` below the scenario's caps the agent's admissions at 2 a slot (it used to be replaced by the
    environment's larger value, silently); without one (the default) the environment's cap is the agent's, even
    above the 1024 it asks for."""
    from flowgym.agents import make_agent
    from flowgym.lab.evaluation import env_for

    env = {"M": 400000, "horizon": 3, "max_budget": 4096, "output_length_known": name == "mc-sf",
           "workload": {"kind": "poisson", "classes": [[1, 1], [1, 2]], "rates": 1500.0}}
    for kw, low, high in (({"max_budget": 2}, 2, 2), ({}, 1025, 4096)):
        agent = make_agent(name, **kw)
        e = env_for(agent, env, 3)
        obs, _ = e.reset(seed=0)
        agent.reset(e.config, seed=0)
        assert e.config.max_budget == 4096 and agent.limit == (2 if kw else 4096)
        most = 0
        for _ in range(3):
            obs, _, term, trunc, info = e.step(agent.act(obs, e.view()))
            most = max(most, info["admitted"])
            if term or trunc:
                break
        assert low <= most <= high, (name, kw, most)


def test_numpy_and_sequence_parameters_still_work_and_huge_integers_are_named():
    from flowgym.agents import make_agent

    assert make_agent("alpha-greedy", alpha=np.float32(0.25)).alpha == pytest.approx(0.25)
    assert make_agent("schedule", times=range(2), budgets=[4, 8]).times == [0.0, 1.0]
    assert make_agent("safe-budget", cap=256.0).env_options()["max_budget"] == 256
    assert make_agent("fixed", b=np.int64(7)).b == 7
    for name, kw, match in (("fixed", {"b": 10**400}, r"b must be an integer from 0 to 1e\+09"),
                            ("flow-control", {"b": 10**400}, r"budget b must be a non-negative number \(at most 1e9\)"),
                            ("safe-budget", {"cap": 2 * 10**9}, r"cap must be an integer from 1 to 1e\+09")):
        with pytest.raises(ValueError, match=match):
            make_agent(name, **kw)
