"""The agents package: hand-computed decisions, properties over random workloads, make_agent, privacy.

Agents are driven as the evaluation path drives them: the environment is built
from the scenario plus ``agent.env_options()``, then ``env.reset(seed)``,
``agent.reset(env.config, seed)`` and ``agent.act(obs, env.view())`` each slot.
Hand-made states use small ``flowgym.Trace`` workloads; the arithmetic behind
every expected number is in the comments.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowgym.agents as agents
import flowgym
from flowgym.agents import (
    AGENTS,
    MCSF,
    AlphaProtectionGreedy,
    AMin,
    FixedBudget,
    FlowControl,
    GreedyLIFO,
    MemoryCheck,
    RandomBudget,
    make_agent,
)
from flowgym.sim.theory import peak_usage

PROP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AGENTS_DIR = Path(agents.__file__).resolve().parent


# --------------------------------------------------------------------------- helpers


def trace(rows: list[tuple[int, int, int]], cls: list[int] | None = None) -> flowgym.Trace:
    """A trace from ``(arrival, prompt_len, output_len)`` rows (ids follow the row order here)."""
    a, l, o = (list(c) for c in zip(*rows))
    return flowgym.Trace(arrival=a, prompt_len=l, output_len=o, cls=cls)


def make_env(agent: Any, **scenario: Any) -> flowgym.FlowControlEnv:
    """The scenario plus the agent's options; the agent's ``max_budget`` is a minimum."""
    opts = agent.env_options()
    kw = {**scenario, **opts}
    if "max_budget" in scenario and "max_budget" in opts:
        kw["max_budget"] = max(scenario["max_budget"], opts["max_budget"])
    return flowgym.FlowControlEnv(**kw)


def start(agent: Any, seed: int = 0, **scenario: Any) -> tuple[flowgym.FlowControlEnv, Any]:
    env = make_env(agent, **scenario)
    obs, _ = env.reset(seed=seed)
    agent.reset(env.config, seed=seed)
    return env, obs


def step_agent(env: flowgym.FlowControlEnv, agent: Any, obs: Any) -> tuple[Any, Any, dict, bool]:
    action = agent.act(obs, env.view())
    obs, _, te, tr, info = env.step(action)
    return action, obs, info, te or tr


def run(agent: Any, seed: int = 0, max_steps: int = 10_000, **scenario: Any) -> dict[str, Any]:
    """Run an episode; collect actions, rewards, infos and whether each action was in the space."""
    env, obs = start(agent, seed, **scenario)
    actions, rewards, infos, inside = [], [], [], []
    for _ in range(max_steps):
        action = agent.act(obs, env.view())
        inside.append(bool(env.action_space.contains(action)))
        actions.append(np.asarray(action).tolist())
        obs, r, te, tr, info = env.step(action)
        rewards.append(r)
        infos.append(info)
        if te or tr:
            break
    return {"env": env, "actions": actions, "rewards": rewards, "infos": infos, "inside": inside}


def brute_greedy(view: Any, limit: float, max_count: int) -> int:
    """FCFS prefix of the queue whose ``l + 1`` fit under ``limit`` on top of the active set's demand."""
    a = view.active()
    demand = int(sum(int(l) + int(j) + 1 for l, j in zip(a.prompt_len, a.generated)))
    assert demand == view.demand
    used, n = demand, 0
    for l in view.queue().prompt_len[:max_count]:
        if used + int(l) + 1 > limit:
            break
        used += int(l) + 1
        n += 1
    return n


def future_ok(M: int, active: list[tuple[int, int, int]], cands: list[tuple[int, int]]) -> bool:
    """Usage stays <= M at every future slot h >= 0 (no arrivals, no evictions).

    An active ``(l, j, o)`` holds ``l + j + h + 1`` while ``j + h < o``; a
    candidate ``(l, o)`` admitted now holds ``l + h + 1`` while ``h < o``.
    """
    H = max([o - j for _, j, o in active] + [o for _, o in cands] + [1])
    for h in range(H):
        u = sum(l + j + h + 1 for l, j, o in active if h < max(o - j, 1))
        u += sum(l + h + 1 for l, o in cands if h < o)
        if u > M:
            return False
    return True


def brute_mc(M: int, active: list[tuple[int, int, int]], cands: list[tuple[int, int]]) -> int:
    """Longest FCFS prefix of ``cands`` that keeps the future usage within ``M``."""
    k = 0
    while k < len(cands) and future_ok(M, active, cands[: k + 1]):
        k += 1
    return k


def assumed_lengths(agent: Any, view: Any) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The active set and queue with the output lengths each memory-check agent assumes."""
    a, q = view.active(), view.queue()
    if isinstance(agent, AMin):
        ao, qo = a.estimate, q.estimate
    elif view.known:
        ao, qo = a.output_len, q.output_len
    else:
        ao = [view.max_output_len] * len(a.ids)
        qo = [view.max_output_len] * len(q.ids)
    act = [(int(l), int(j), int(o)) for l, j, o in zip(a.prompt_len, a.generated, ao)]
    cand = [(int(l), int(o)) for l, o in zip(q.prompt_len, qo)]
    return act, cand


def victims_by_slot(env: flowgym.FlowControlEnv, agent: Any, obs: Any, slots: int) -> list[list[int]]:
    """Step ``slots`` times; the ids evicted in each slot (from the request log's eviction counts)."""
    out = []
    for _ in range(slots):
        before = env.request_log()["evictions"]
        _, obs, info, done = step_agent(env, agent, obs)
        after = env.request_log()["evictions"]
        before = np.concatenate([before, np.zeros(after.size - before.size, dtype=before.dtype)])
        ids = np.flatnonzero(after > before).tolist()
        assert len(ids) == info["evicted"]
        out.append(ids)
        if done:
            break
    return out


# --------------------------------------------------------------------------- 1. hand-made decisions


def test_flow_control_fixed_budget_returns_b():
    # 5 requests wait at t=0, M is ample: B_t = 3 every slot, and 3 of them start.
    agent = FlowControl(b=3)
    assert agent.env_options() == {"eviction": "lifo", "max_budget": 3}
    env, obs = start(agent, M=1000, horizon=None, workload=trace([(0, 5, 4)] * 5))
    action, obs, info, _ = step_agent(env, agent, obs)
    assert action == 3 and isinstance(action, int)
    assert env.action_space.contains(action)
    assert info["admitted"] == 3
    # next slot: the remaining 2 start (the budget is an upper bound)
    action, obs, info, _ = step_agent(env, agent, obs)
    assert action == 3 and info["admitted"] == 2


def test_flow_control_per_class_is_algorithm_1():
    agent = FlowControl(b=(1, 2))
    opts = agent.env_options()
    assert opts["per_class_budget"] is True and opts["output_length_known"] is True
    assert opts["max_budget"] >= 2
    # ids 0..5 at t=0 with classes 1,0,1,0,1,0: lane 0 = [1, 3, 5], lane 1 = [0, 2, 4].
    wl = trace([(0, 5, 6)] * 6, cls=[1, 0, 1, 0, 1, 0])
    env, obs = start(agent, M=1000, horizon=None, workload=wl)
    action = agent.act(obs, env.view())
    assert isinstance(action, np.ndarray)
    np.testing.assert_array_equal(action, [1, 2])
    assert env.action_space.contains(action)
    obs, _, _, _, info = env.step(action)
    # b_0 = 1 from lane 0 -> id 1; b_1 = 2 from lane 1 -> ids 0, 2; class order 0 then 1.
    assert info["admitted"] == 3
    np.testing.assert_array_equal(env.view().active().ids, [1, 0, 2])
    # the returned array is a copy: mutating it does not change the agent
    action[:] = 0
    np.testing.assert_array_equal(agent.act(obs, env.view()), [1, 2])
    # without per-class budgets the environment refuses the array action
    plain = flowgym.FlowControlEnv(M=1000, horizon=None, workload=wl, max_budget=2)
    plain.reset(seed=0)
    with pytest.raises(ValueError):
        plain.step(np.array([1, 2]))


@pytest.mark.parametrize("b, cap", [(2.5, 5), (1.5, 6)])
def test_random_budget_follows_the_binomial_law(b, cap):
    """The law itself, not only its mean: a chi-square test of 6000 draws against Binomial(cap, b / cap)
    (another law of the same mean, e.g. uniform, Poisson or b +/- 1, is far outside it)."""
    from math import comb

    agent = FlowControl(b=b, cap=cap)
    env, obs = start(agent, seed=11, M=1000, horizon=None, workload=trace([(0, 5, 4)]))
    view = env.view()
    draws = np.array([agent.act(obs, view) for _ in range(6000)])
    p = b / cap
    expected = 6000 * np.array([comb(cap, k) * p**k * (1 - p) ** (cap - k) for k in range(cap + 1)])
    counts = np.bincount(draws, minlength=cap + 1)
    assert counts.size == cap + 1  # nothing above cap
    keep = expected >= 5  # pool the thin tail into its neighbour
    obs_c = np.append(counts[keep], counts[~keep].sum()) if (~keep).any() else counts
    exp_c = np.append(expected[keep], expected[~keep].sum()) if (~keep).any() else expected
    chi2 = float((((obs_c - exp_c) ** 2) / exp_c).sum())
    q999 = {4: 18.47, 5: 20.52, 6: 22.46}[obs_c.size - 1]  # chi-square 0.999 quantiles by degrees of freedom
    assert chi2 < q999


def test_flow_control_random_budget_binomial():
    agent = FlowControl(b=2.5, cap=5)
    assert agent.env_options()["max_budget"] == 5
    env, obs = start(agent, seed=7, M=1000, horizon=None, workload=trace([(0, 5, 4)]))
    view = env.view()
    draws = np.array([agent.act(obs, view) for _ in range(4000)])
    assert all(isinstance(int(d), int) for d in draws)
    assert draws.min() >= 0 and draws.max() <= 5
    # Binomial(5, 0.5): mean 2.5, sd sqrt(5 * .25) = 1.118; sd of a 4000-draw mean = 0.018.
    assert abs(draws.mean() - 2.5) < 0.1
    assert len(set(draws.tolist())) >= 5  # really random, not a constant
    assert all(env.action_space.contains(int(d)) for d in draws[:50])
    # the same agent seed gives the same draws; another seed different ones
    other = FlowControl(b=2.5, cap=5)
    other.reset(env.config, seed=7)
    agent.reset(env.config, seed=7)
    a = [agent.act(obs, view) for _ in range(200)]
    b = [other.act(obs, view) for _ in range(200)]
    assert a == b
    other.reset(env.config, seed=8)
    assert [other.act(obs, view) for _ in range(200)] != a


# Greedy state, M = 100:
#   t=0: request 0 (l=30, o=50) arrives alone;
#   t=1: requests 1..4 with l = 20, 25, 20, 5 and o = 40.
# Both greedy agents admit request 0 at t=0 (31 <= 90 <= 100). At t=1 request 0
# has j=1, so the active set's demand is 30 + 1 + 1 = 32.
GREEDY_TRACE = [(0, 30, 50), (1, 20, 40), (1, 25, 40), (1, 20, 40), (1, 5, 40)]


def test_greedy_lifo_admits_what_fits_under_M():
    agent = GreedyLIFO()
    assert agent.env_options()["eviction"] == "lifo"
    env, obs = start(agent, M=100, horizon=None, workload=trace(GREEDY_TRACE))
    action, obs, info, _ = step_agent(env, agent, obs)
    assert action == 1 and info["admitted"] == 1
    view = env.view()
    assert view.demand == 32
    # room = 100 - 32 = 68; cumulative l+1 = 21, 47, 68, 74: three fit (68 <= 68, boundary), the 4th not.
    assert agent.act(obs, view) == 3 == brute_greedy(view, 100, 10**6)
    _, obs, info, _ = step_agent(env, agent, obs)
    assert info["admitted"] == 3 and info["evicted"] == 0
    assert info["usage"] == 100  # the slot's demand: 32 + 68


@pytest.mark.parametrize(
    "alpha, expected",
    [
        # limit (1 - alpha) * 100; room = limit - 32; cumulative l+1 = 21, 47, 68, 74
        (0.0, 3),  # room 68: 21, 47, 68 fit
        (0.2, 2),  # room 48: 21, 47 fit, 68 does not
        (0.4, 1),  # room 28: 21 fits, 47 does not
        (0.5, 0),  # room 18: 21 does not fit
    ],
)
def test_alpha_greedy_admits_what_fits_under_protected_limit(alpha, expected):
    agent = AlphaProtectionGreedy(alpha)
    assert agent.env_options()["eviction"] == "all"
    env, obs = start(agent, M=100, horizon=None, workload=trace(GREEDY_TRACE))
    action, obs, info, _ = step_agent(env, agent, obs)  # t=0: 31 <= (1 - alpha) 100 for alpha <= 0.5
    assert action == 1 and info["admitted"] == 1
    view = env.view()
    assert view.demand == 32
    assert agent.act(obs, view) == expected == brute_greedy(view, (1 - alpha) * 100, 10**6)
    _, _, info, _ = step_agent(env, agent, obs)
    assert info["admitted"] == expected and info["evicted"] == 0


def test_greedy_respects_config_max_budget():
    # 10 tiny requests, room for all of them, but the environment's max_budget is 4.
    agent = GreedyLIFO(max_budget=4)
    env, obs = start(agent, M=1000, horizon=None, workload=trace([(0, 1, 3)] * 10))
    action = agent.act(obs, env.view())
    assert action == 4 and env.action_space.contains(action)


def test_memory_check_known_checks_every_future_slot():
    # M = 100. t=0: request 0 (l=20, o=20); t=1: requests 1..3 (l=10, o=40).
    # t=0: request 0 alone peaks at 20 + 20 = 40 <= 100: admitted.
    # t=1: request 0 has j=1, 19 tokens to go: holds 22 + h for h < 19 (40 at h=18);
    #      a candidate holds 11 + h for h < 40.
    #   k=1: h<=18: 33 + 2h <= 69; later 11 + h <= 50                     -> fits
    #   k=2: h<=18: 44 + 3h <= 98; h in 19..39: 2(11 + h) <= 100          -> fits
    #   k=3: h=0: 22 + 33 = 55 fits (the first-slot check passes), but
    #        h=18: 40 + 3 * 29 = 127 > 100                                -> fails
    # so MC admits 2 where the first-slot greedy check would admit 3.
    agent = MemoryCheck()
    wl = trace([(0, 20, 20), (1, 10, 40), (1, 10, 40), (1, 10, 40)])
    env, obs = start(agent, M=100, horizon=None, workload=wl, output_length_known=True)
    action, obs, info, _ = step_agent(env, agent, obs)
    assert action == 1
    view = env.view()
    assert agent.act(obs, view) == 2 == brute_mc(100, *assumed_lengths(agent, view))
    greedy = GreedyLIFO()
    greedy.reset(env.config, seed=0)
    assert greedy.act(obs, view) == 3  # room 100 - 22 = 78 >= 33
    # Run to the end: never an eviction. Request 3 can only start once 1 and 2
    # finish: at t in 20..40, requests 1,2 hold 2 * 50 = 100 at their last slot
    # h = 40 - t, where request 3 would hold 11 + h > 0 more. It starts at 41.
    # finish = start + o: 0 + 20, 1 + 40, 1 + 40, 41 + 40.
    done = False
    while not done:
        _, obs, info, done = step_agent(env, agent, obs)
        assert info["evicted"] == 0
    np.testing.assert_array_equal(env.request_log()["finish"], [20, 41, 41, 81])
    assert env.metrics()["max_kv_usage"] <= 1.0


def test_memory_check_unknown_lengths_assumes_longest_output():
    # M = 100. t=0: three requests (l=10, o=10), then one (l=10, o=40).
    # Known lengths: at h < 10 the four hold 4 (11 + h) <= 80; later only the
    #   long one, 11 + h <= 50: all 4 admitted.
    # Unknown: every output is assumed to be max_output_len = 40, so each peaks at
    #   10 + 40 = 50 and only 2 fit (2 * 50 = 100, 3 * 50 = 150).
    wl = [(0, 10, 10), (0, 10, 10), (0, 10, 10), (0, 10, 40)]
    known = MemoryCheck()
    env_k, obs_k = start(known, M=100, horizon=None, workload=trace(wl), output_length_known=True)
    assert known.act(obs_k, env_k.view()) == 4
    unknown = MemoryCheck()
    env_u, obs_u = start(unknown, M=100, horizon=None, workload=trace(wl))
    view = env_u.view()
    assert not view.known and view.queue().output_len is None and view.active().output_len is None
    assert view.max_output_len == 40
    assert unknown.act(obs_u, view) == 2 == brute_mc(100, *assumed_lengths(unknown, view))
    done = False
    while not done:
        _, obs_u, info, done = step_agent(env_u, unknown, obs_u)
        assert info["evicted"] == 0
    assert (env_u.request_log()["finish"] > 0).all()


def test_mcsf_admits_shortest_output_first():
    # M = 70. t=0: ids 0..3 with l=10 and o = 40, 10, 30, 10.
    # sjf queue: ids 1, 3 (o=10), 2 (o=30), 0 (o=40).
    #   1,3:    h<10: 2 (11 + h) <= 40                         -> fit
    #   +2:     h=9: 3 * 20 = 60 <= 70; h in 10..29: 11+h <= 40 -> fits
    #   +0:     h=9: 4 * 20 = 80 > 70                          -> fails
    # MC-SF admits 3 (ids 1, 3, 2). FCFS MC on [0, 1, 2, 3] admits 2:
    #   0 peaks at 50; +1: 40 at h=9, 50 later; +2: h=29: 40 + 40 = 80 > 70.
    wl = [(0, 10, 40), (0, 10, 10), (0, 10, 30), (0, 10, 10)]
    agent = MCSF()
    opts = agent.env_options()
    assert opts["queue_order"] == "sjf" and opts["output_length_known"] is True
    env, obs = start(agent, M=70, horizon=None, workload=trace(wl))
    view = env.view()
    assert view.queue_order == "sjf"
    np.testing.assert_array_equal(view.queue().ids, [1, 3, 2, 0])
    assert agent.act(obs, view) == 3 == brute_mc(70, *assumed_lengths(agent, view))
    _, obs, info, _ = step_agent(env, agent, obs)
    np.testing.assert_array_equal(env.view().active().ids, [1, 3, 2])
    mc = MemoryCheck()
    env_mc, obs_mc = start(mc, M=70, horizon=None, workload=trace(wl), output_length_known=True)
    assert mc.act(obs_mc, env_mc.view()) == 2
    # Run to the end without eviction. Request 0 starts at t=10: at t=9 requests
    # 1,3 still hold 2 * 20 = 40, request 2 holds 20, and 0 needs 11: 71 > 70;
    # at t=10 request 2 (j=10) holds 21 + h for h < 20 and 0 holds 11 + h:
    # at h=19, 40 + 30 = 70 <= 70. finish = 10 + 40, 10, 30, 10.
    done = False
    while not done:
        _, obs, info, done = step_agent(env, agent, obs)
        assert info["evicted"] == 0
    np.testing.assert_array_equal(env.request_log()["finish"], [50, 10, 30, 10])


def test_amin_admits_on_estimates_and_raises_them_on_eviction():
    # M = 100. t=0: four requests (l=10, o=40); estimate_floor=1 (not the trace's shortest output, 40).
    # A_min: every estimate is 1, a candidate holds 11 tokens for 1 slot:
    #   11, 22, 33, 44 <= 100 -> admits all 4.
    # MC with known lengths: each peaks at 10 + 40 = 50 -> admits 2 (2 * 50 = 100).
    wl = trace([(0, 10, 40)] * 4)
    agent = AMin()
    opts = agent.env_options()
    assert opts["queue_order"] == "estimate" and opts["eviction"] == "estimate"
    env, obs = start(agent, M=100, horizon=None, workload=wl, estimate_floor=1)
    view = env.view()
    np.testing.assert_array_equal(view.queue().estimate, [1, 1, 1, 1])
    assert agent.act(obs, view) == 4 == brute_mc(100, *assumed_lengths(agent, view))
    mc = MemoryCheck()
    env_mc, obs_mc = start(mc, M=100, horizon=None, workload=wl, output_length_known=True)
    assert mc.act(obs_mc, env_mc.view()) == 2
    # The four hold 4 (10 + t + 1) = 44 + 4t: <= 100 up to t = 14, 104 at t = 15.
    for t in range(15):
        _, obs, info, _ = step_agent(env, agent, obs)
        assert info["evicted"] == 0, t
        if t >= 1:
            assert info["admitted"] == 0
    # t = 15: all four have estimate max(1, j + 1) = 16; ties: newest first -> id 3
    # (demand 10 + 15 + 1 = 26 >= excess 4). It loses j = 15 tokens; estimate -> 16.
    np.testing.assert_array_equal(env.view().active().estimate, [16, 16, 16, 16])
    _, obs, info, _ = step_agent(env, agent, obs)
    assert info["evicted"] == 1 and info["wasted_tokens"] == 15
    q = env.view().queue()
    np.testing.assert_array_equal(q.ids, [3])
    np.testing.assert_array_equal(q.estimate, [16])  # j + 1
    np.testing.assert_array_equal(q.evictions, [1])
    np.testing.assert_array_equal(env.request_log()["evictions"], [0, 0, 0, 1])
    # the survivors (j = 16 now) are known to need at least 17 tokens
    np.testing.assert_array_equal(env.view().active().estimate, [17, 17, 17])
    # t = 16: A_min re-admits id 3: survivors hold 3 * 27 = 81 now and (estimate
    # j + 1 = 17 -> 1 slot left) nothing later; id 3 holds 11 + h for h < 16: 92 <= 100.
    view = env.view()
    assert agent.act(obs, view) == 1 == brute_mc(100, *assumed_lengths(agent, view))


# --------------------------------------------------------------------------- 2. properties


@st.composite
def poisson_scenarios(draw, max_classes: int = 3, max_l: int = 20, max_o: int = 30) -> dict[str, Any]:
    m = draw(st.integers(1, max_classes))
    classes = [[draw(st.integers(1, max_l)), draw(st.integers(1, max_o))] for _ in range(m)]
    rates = [draw(st.sampled_from([0.2, 0.5, 1.0, 2.0, 3.0])) for _ in range(m)]
    longest = max(l + o for l, o in classes)
    M = draw(st.integers(max(2, longest // 2), 40 * longest))  # some M reject requests (l + o > M)
    return {"M": M, "workload": {"kind": "poisson", "classes": classes, "rates": rates}, "horizon": 120}


@PROP
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_algorithm1_never_evicts_within_peak(data, seed):
    m = data.draw(st.integers(1, 3))
    classes = [[data.draw(st.integers(1, 20)), data.draw(st.integers(1, 25))] for _ in range(m)]
    b = [data.draw(st.integers(0, 3)) for _ in range(m)]
    if not any(b):
        b[data.draw(st.integers(0, m - 1))] = 1
    rates = [data.draw(st.sampled_from([0.3, 1.0, 2.5, 4.0])) for _ in range(m)]
    w = [l * o + o * (o + 1) // 2 for l, o in classes]  # w = l o + (o + o^2) / 2, by hand
    peak = int(peak_usage(b, classes))
    assert peak == sum(bk * wk for bk, wk in zip(b, w))
    M = max(peak, 2) + data.draw(st.integers(0, 50))  # sum_k b_k w_k <= M
    agent = FlowControl(b=b)
    res = run(agent, seed, M=M, horizon=150, workload={"kind": "poisson", "classes": classes, "rates": rates})
    env = res["env"]
    assert all(res["inside"])
    assert all(np.array_equal(a, b) for a in res["actions"])
    assert sum(i["evicted"] for i in res["infos"]) == 0
    assert env.metrics()["evictions"] == 0
    assert env.series()["usage"].max() <= peak
    assert (env.request_log()["evictions"] == 0).all()


@PROP
@given(scn=poisson_scenarios(), seed=st.integers(0, 2**31 - 1), which=st.sampled_from(["mc", "mc-unknown", "mc-sf"]))
def test_memory_checks_never_evict_and_admit_the_brute_force_prefix(scn, seed, which):
    agent = MCSF() if which == "mc-sf" else MemoryCheck()
    if which == "mc":
        scn = {**scn, "output_length_known": True}
    env, obs = start(agent, seed, **scn)
    done = False
    while not done:
        view = env.view()
        action = agent.act(obs, view)
        assert env.action_space.contains(action)
        assert action == brute_mc(view.M, *assumed_lengths(agent, view))
        obs, _, te, tr, info = env.step(action)
        assert info["evicted"] == 0
        assert info["usage"] <= view.M
        done = te or tr
    assert env.metrics()["evictions"] == 0


@PROP
@given(scn=poisson_scenarios(), seed=st.integers(0, 2**31 - 1))
def test_amin_admits_the_brute_force_prefix_on_estimates(scn, seed):
    agent = AMin()
    env, obs = start(agent, seed, **scn)
    done = False
    while not done:
        view = env.view()
        action = agent.act(obs, view)
        assert env.action_space.contains(action)
        assert action == brute_mc(view.M, *assumed_lengths(agent, view))
        q = view.queue()
        # estimates are lower bounds: evicted requests know o > j; fresh ones start at the shortest possible
        # output, the smallest class output here (the environment's default estimate_floor)
        floor = min(o for _, o in scn["workload"]["classes"])
        assert (q.estimate[q.evictions == 0] == floor).all()
        assert (q.estimate >= floor).all()
        obs, _, te, tr, info = env.step(action)
        done = te or tr
    log = env.request_log()
    # an evicted request's estimate never exceeds its true output length (a lower bound)
    q = env.view().queue()
    assert (q.estimate <= log["output_len"][q.ids]).all()


@PROP
@given(scn=poisson_scenarios(), seed=st.integers(0, 2**31 - 1), alpha=st.sampled_from([None, 0.0, 0.1, 0.3]))
def test_greedy_agents_admit_the_brute_force_prefix(scn, seed, alpha):
    agent = GreedyLIFO() if alpha is None else AlphaProtectionGreedy(alpha)
    limit_frac = 1.0 if alpha is None else 1 - alpha
    env, obs = start(agent, seed, **scn)
    done = False
    while not done:
        view = env.view()
        action = agent.act(obs, view)
        assert env.action_space.contains(action)
        assert action == brute_greedy(view, limit_frac * view.M, env.config.max_budget)
        obs, _, te, tr, info = env.step(action)
        if alpha is not None and info["evicted"]:
            assert info["active"] == 0  # memory reset
        done = te or tr


def all_agents(m: int) -> list[Any]:
    return [
        FlowControl(b=3),
        FlowControl(b=[1] * m),
        FlowControl(b=2.5, cap=5),
        FixedBudget(4),
        RandomBudget(0, 6),
        AlphaProtectionGreedy(0.1),
        GreedyLIFO(),
        MemoryCheck(),
        MCSF(),
        AMin(),
    ]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scn=poisson_scenarios(), seed=st.integers(0, 2**31 - 1), known=st.booleans())
def test_actions_inside_space_and_runs_reproducible(scn, seed, known):
    scn = {**scn, "horizon": 60, "output_length_known": known}
    m = len(scn["workload"]["classes"])
    for agent, twin in zip(all_agents(m), all_agents(m)):
        opts = agent.env_options()
        s = {k: v for k, v in scn.items() if k not in opts}
        first = run(agent, seed, **s)
        assert all(first["inside"]), agent
        # same seeds: identical actions, rewards, infos, requests; also for a re-used agent
        for again in (run(twin, seed, **s), run(agent, seed, **s)):
            assert again["actions"] == first["actions"], agent
            assert again["rewards"] == first["rewards"], agent
            assert again["infos"] == first["infos"], agent
            la, lb = first["env"].request_log(), again["env"].request_log()
            for k in la:
                np.testing.assert_array_equal(la[k], lb[k])


# --------------------------------------------------------------------------- 3. alpha-greedy evicts all


def test_alpha_greedy_overflow_evicts_every_active_request():
    # M = 100, alpha = 0.1: limit 90.
    # t=0: ids 0..2 (l=20, o=40): 21, 42, 63 <= 90 -> all 3 start.
    # t=5: id 3 (l=5, o=40): demand 3 (20 + 5 + 1) = 78, room 12 >= 6 -> starts.
    # demand at t >= 5: 3 (21 + t) + (5 + (t - 5) + 1) = 64 + 4t > 100 first at t = 10 (104),
    # an excess of 4 that evicting id 3 alone (demand 11) would cover, but the
    # memory reset evicts all four: wasted 3 * 10 + 5 = 35.
    agent = AlphaProtectionGreedy(0.1)
    wl = trace([(0, 20, 40)] * 3 + [(5, 5, 40)])
    env, obs = start(agent, M=100, horizon=None, workload=wl)
    admitted = []
    for t in range(10):
        _, obs, info, _ = step_agent(env, agent, obs)
        assert info["evicted"] == 0, t
        admitted.append(info["admitted"])
    assert admitted == [3, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    before = env.view().active().ids.tolist()
    assert before == [0, 1, 2, 3]
    _, obs, info, _ = step_agent(env, agent, obs)
    assert info["t"] == 10 and info["overflow"]
    assert info["evicted"] == 4 and info["active"] == 0
    assert info["wasted_tokens"] == 35
    assert info["usage"] == 0
    log = env.request_log()
    np.testing.assert_array_equal(log["evictions"], [1, 1, 1, 1])
    view = env.view()
    assert view.n_active == 0 and view.n_queued == 4
    np.testing.assert_array_equal(np.sort(view.queue().ids), before)
    # contrast: LIFO would have evicted only id 3
    fc = FixedBudget(3)
    lifo, o2 = start(fc, M=100, horizon=None, workload=wl, eviction="lifo")
    victims = victims_by_slot(lifo, fc, o2, 11)
    assert [v for v in victims if v] == [[3]]


# --------------------------------------------------------------------------- 4. greedy-lifo victims


def test_greedy_lifo_evicts_most_recently_admitted_first():
    # M = 100.
    # t=0: ids 0..3 (l=20, o=60): 21 * 4 = 84 <= 100 -> all start.
    # t=1: ids 4..7 (l=1, o=60) arrive; demand 4 * 22 = 88, room 12: 2, 4, 6, 8 -> all 4 start (96).
    # t=2: demand 4 * 23 + 4 * 3 = 104, excess 4: newest id 7 frees 3 < 4, then id 6: evict 7, 6.
    # t=3: 4 * 24 + 2 * 4 = 104, excess 4: id 5 (demand 1 + 2 + 1 = 4) alone.
    # t=4: 4 * 25 + 5 = 105, excess 5: id 4 (demand 1 + 3 + 1 = 5) alone.
    # t=5: 4 * 26 = 104: id 3, the last admitted of slot 0.
    # The waiting queue's head then blocks greedy: at t=6, room 100 - 3 * 27 = 19 < 21.
    agent = GreedyLIFO()
    wl = trace([(0, 20, 60)] * 4 + [(1, 1, 60)] * 4)
    env, obs = start(agent, M=100, horizon=None, workload=wl)
    victims = victims_by_slot(env, agent, obs, 7)
    assert victims == [[], [], [6, 7], [5], [4], [3], []]
    log = env.request_log()
    np.testing.assert_array_equal(log["evictions"], [0, 0, 0, 1, 1, 1, 1, 1])
    assert env.metrics()["wasted_tokens"] == 2 * 1 + 2 + 3 + 5


# --------------------------------------------------------------------------- 5. make_agent


SMALL = {"M": 600, "horizon": 40, "workload": {"kind": "poisson", "classes": [[5, 10], [5, 20]], "rates": 1.0}}


#: Agents that need a file to be built (tested in tests/test_train.py).
NEEDS_PATH = {"learned"}


@pytest.mark.parametrize("name", sorted(set(AGENTS) - NEEDS_PATH))
def test_make_agent_by_name(name):
    params = {"fixed": {"b": 3}, "schedule": {"times": [0, 20], "budgets": [4, 1]}}.get(name, {})
    agent = make_agent(name, **params)
    assert isinstance(agent, AGENTS[name])
    assert isinstance(agent, flowgym.agents.Agent)
    assert agent.name == name
    assert isinstance(agent.label(), str) and agent.label() in repr(agent)
    res = run(agent, 3, **SMALL)
    assert all(res["inside"])
    assert len(res["actions"]) == SMALL["horizon"]


def test_make_agent_learned_needs_a_model_directory(tmp_path):
    # (no path at all is the shipped generalist: tests/test_generalist.py)
    with pytest.raises(ValueError, match="not a model directory"):
        make_agent("learned", path=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="lacks"):
        make_agent("learned", path=str(tmp_path))


def test_make_agent_fixed_needs_b():
    with pytest.raises(ValueError, match="fixed"):
        make_agent("fixed")


def test_make_agent_unknown_name():
    with pytest.raises(ValueError, match="no-such-agent"):
        make_agent("no-such-agent")


@pytest.mark.parametrize(
    "name, params",
    [
        ("alpha-greedy", {"alpha": 1.5}),
        ("alpha-greedy", {"alpha": 1.0}),
        ("alpha-greedy", {"alpha": -0.1}),
        ("alpha-greedy", {"alpha": float("nan")}),
        ("flow-control", {"b": -1}),
        ("flow-control", {"b": 2.5}),  # a fractional budget needs cap=
        ("flow-control", {"b": float("inf")}),
        ("flow-control", {"b": 3, "cap": 2}),  # cap < b
        ("flow-control", {"b": (1, -1)}),
        ("flow-control", {"b": ()}),
        ("flow-control", {"b": (1.5, 2)}),  # per-class budgets are integers
        ("flow-control", {"b": (1, 2), "cap": 4}),
        ("fixed", {"b": -1}),
        ("fixed", {"b": 2.5}),
        ("random", {"low": 3, "high": 1}),
        ("random", {"low": -1}),
        ("mc", {"nonsense": 1}),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x!r}" for k, x in v.items()),
)
def test_make_agent_bad_parameters(name, params):
    with pytest.raises(ValueError):
        make_agent(name, **params)


# --------------------------------------------------------------------------- 6. no private engine state


def private_accesses(source: str) -> list[str]:
    """Attribute reads an agent must not make: the engine, ``_e*``, or another object's private names."""
    bad = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            a = node.attr
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if a == "engine" or a.startswith("_e"):
                bad.append(f"line {node.lineno}: .{a}")
            elif a == "__dict__" or (
                a.startswith("_") and not (a.startswith("__") and a.endswith("__")) and owner not in ("self", "cls")
            ):
                bad.append(f"line {node.lineno}: {owner or '<expr>'}.{a}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "vars"):
            for arg in node.args[1:]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
                    arg.value == "engine" or arg.value.startswith("_")
                ):
                    bad.append(f"line {node.lineno}: getattr(..., {arg.value!r})")
            if node.func.id == "vars":
                bad.append(f"line {node.lineno}: vars(...)")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flowgym.sim.engine"):
            bad.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(n.name.startswith("flowgym.sim.engine") for n in node.names):
            bad.append(f"line {node.lineno}: import flowgym.sim.engine")
    return bad


def test_private_access_checker_catches_violations():
    assert private_accesses("def act(self, obs, view):\n    return view._e.held\n")
    assert private_accesses("def act(self, obs, view):\n    return env.engine.t\n")
    assert private_accesses("def act(self, obs, view):\n    return view._private\n")
    assert private_accesses("def act(self, obs, view):\n    return getattr(view, '_e').t\n")
    assert private_accesses("from flowgym.sim.engine import Engine\n")
    assert private_accesses("def act(self, obs, view):\n    return view.__dict__['_e']\n")
    assert not private_accesses("def act(self, obs, view):\n    return self._lengths(view.queue(), view.M)\n")


AGENT_MODULES = sorted(p.name for p in AGENTS_DIR.glob("*.py"))


def test_agent_modules_found():
    assert {"base.py", "flow_control.py", "greedy.py", "memory_check.py", "__init__.py"} <= set(AGENT_MODULES)


@pytest.mark.parametrize("module", AGENT_MODULES)
def test_agents_never_read_private_engine_state(module):
    source = (AGENTS_DIR / module).read_text()
    assert private_accesses(source) == []


# --------------------------------------------------------------------------- rate switch


def test_rate_switch_rule_and_options():
    from flowgym.agents import RateSwitch

    ag = RateSwitch(high=40, low=4, threshold=10.0)
    assert ag.act({"arrival_rate": np.array([10.5], np.float32)}, None) == 40
    assert ag.act({"arrival_rate": np.array([10.0], np.float32)}, None) == 4  # strictly above the threshold
    assert ag.env_options() == {"eviction": "lifo", "observation": "dict", "max_budget": 40}
    assert make_agent("rate-switch", low=2).label() == "rate-switch high=40 low=2 threshold=10"


@pytest.mark.parametrize("kwargs, match", [({"high": -1}, "high"), ({"low": 1.5}, "low"),
                                           ({"threshold": float("nan")}, "threshold"), ({"high": True}, "high")])
def test_rate_switch_bad_parameters_name_them(kwargs, match):
    from flowgym.agents import RateSwitch

    with pytest.raises(ValueError, match=match):
        RateSwitch(**kwargs)


def test_rate_switch_follows_the_phases_of_adaptive_mix():
    from flowgym.agents import RateSwitch
    from flowgym.lab.evaluation import env_for
    from flowgym.lab.scenarios import get_scenario

    ag = RateSwitch()
    env = env_for(ag, get_scenario("adaptive-mix").env_kwargs(), 2000)
    obs, _ = env.reset(seed=0)
    ag.reset(env.config, seed=0)
    acts = []
    for _ in range(2000):
        a = ag.act(obs, env.view())
        acts.append(a)
        obs, *_ = env.step(a)
    acts = np.asarray(acts)
    # the moving average (time constant 32 slots) crosses the threshold within ~100 slots of a switch
    assert (acts[100:1000] == 40).all() and (acts[1100:2000] == 4).all()


def test_amin_starts_from_the_shortest_possible_output():
    """Dong & Cao's A_min "treats the decoding length of each request as the shortest possible value": by default
    the estimates start at the workload's shortest output (the mirror of MC's longest), so on the trace above
    (every o = 40) A_min admits what fits with 40 tokens each: the peak 10 + 40 = 50 twice in M = 100."""
    wl = trace([(0, 10, 40)] * 4)
    agent = AMin()
    env, obs = start(agent, M=100, horizon=None, workload=wl)
    view = env.view()
    np.testing.assert_array_equal(view.queue().estimate, [40, 40, 40, 40])
    assert agent.act(obs, view) == 2 == brute_mc(100, *assumed_lengths(agent, view))
    paper = {"M": 16492, "workload": {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 5.0}}
    env, _ = start(agent, **paper)
    env.step(0)
    assert env.engine.estimate_floor == 20 and set(env.view().queue().estimate.tolist()) == {20}
    env, _ = start(agent, **paper, estimate_floor=3)  # an explicit floor wins
    assert env.engine.estimate_floor == 3
    # log-normal lengths reach down to 1 token: the floor is 1 there
    env, _ = start(agent, M=16492, workload={"kind": "iid", "rate": 2.0, "lengths": {"kind": "lmsys-like"}})
    assert env.engine.estimate_floor == 1

    from flowgym.sim.workloads import Requests, Workload

    class Quiet(Workload):  # a user's workload that states no shortest output (None): read as 1
        chunk_span = 1000

        def sample(self, rng, t0, t1):
            return Requests.empty()

    assert Quiet().min_output_tokens() is None
    env, _ = start(agent, M=100, workload=Quiet())
    assert env.engine.estimate_floor == 1
