"""Closed-form results (``flowgym.sim.theory``) against the paper's numbers and Monte-Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowgym.sim import theory
from flowgym.sim.theory import load, max_global_budget, peak_usage, reflected_walk_mean, theorem1, work

PAPER = [(10, 20), (10, 40), (10, 60)]
M_PAPER = 16492


def test_work_paper_classes():
    assert [work(10, o) for o in (20, 40, 60)] == [410, 1220, 2430]
    np.testing.assert_allclose(work(np.array([10, 10, 10]), np.array([20, 40, 60])), [410, 1220, 2430])
    assert work(1, 1) == 2
    assert work(0, 3) == 6  # (3 + 9) / 2


def test_load_paper():
    assert load(M_PAPER, 5, PAPER) * M_PAPER == pytest.approx(20300)
    assert load(M_PAPER, [5, 5, 5], PAPER) == pytest.approx(20300 / M_PAPER)
    assert load(M_PAPER, 3.5, PAPER) == pytest.approx(3.5 * 4060 / M_PAPER)
    assert load(M_PAPER, [1, 0, 2], PAPER) == pytest.approx((410 + 2 * 2430) / M_PAPER)
    # Proposition 2 form: total rate times E[w]
    assert load(1000, 2.0, mean_work=150.0) == pytest.approx(0.3)
    assert load(1000, [1.0, 1.0], mean_work=150.0) == pytest.approx(0.3)


def test_peak_usage_paper():
    assert peak_usage((4, 4, 4), PAPER) == 16240
    assert peak_usage((1, 0, 0), PAPER) == 410
    assert peak_usage((0, 2, 1), PAPER) == 2 * 1220 + 2430
    assert peak_usage(4, PAPER) == 16240


def test_theorem1_holds_for_paper_setting():
    chk = theorem1((4, 4, 4), PAPER, 3.5, M_PAPER)
    assert chk.stable and bool(chk)
    assert chk.memory_ok and chk.rates_ok
    assert chk.peak == 16240
    assert chk.M == M_PAPER


@pytest.mark.parametrize(
    "budgets,rates",
    [
        ((4, 4, 4), 4.0),  # b_k == lambda_k is not enough (strict)
        ((4, 4, 4), 5.0),  # the paper's lambda = 5
        ((4, 3, 4), 3.5),  # one class under-served
        ((4, 4, 4), [3.5, 4.0, 3.5]),
    ],
)
def test_theorem1_fails_when_budget_not_above_rate(budgets, rates):
    chk = theorem1(budgets, PAPER, rates, M_PAPER)
    assert not chk.stable and not bool(chk)
    assert not chk.rates_ok
    assert chk.memory_ok


@pytest.mark.parametrize("M", [16240, 16000, 1000])
def test_theorem1_fails_when_peak_reaches_memory(M):
    chk = theorem1((4, 4, 4), PAPER, 3.5, M)
    assert not chk.stable and not chk.memory_ok
    assert chk.rates_ok
    assert chk.peak == 16240


def test_theorem1_memory_boundary_is_strict():
    assert theorem1((4, 4, 4), PAPER, 3.5, 16241).stable
    assert not theorem1((4, 4, 4), PAPER, 3.5, 16240).stable


def test_max_global_budget_examples():
    ew = 4060 / 3  # E[w] of the paper's classes at equal rates
    b = max_global_budget(M_PAPER, ew)
    assert b == 12  # 16492 / 1353.3 = 12.19
    assert b * ew <= M_PAPER < (b + 1) * ew
    # exact boundary: b * E[w] == (1 - eps) M is allowed
    assert max_global_budget(1000, 100) == 10
    assert max_global_budget(999, 100) == 9
    assert max_global_budget(1000, 100, eps=0.1) == 9
    assert max_global_budget(1000, 100, eps=0.5) == 5
    assert max_global_budget(1000, 100, eps=0.51) == 4
    assert max_global_budget(50, 100) == 0


@settings(max_examples=200, deadline=None)
@given(
    M=st.integers(1, 200_000),
    mean_work=st.floats(0.5, 50_000, allow_nan=False, allow_infinity=False),
    eps=st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9]),
)
def test_max_global_budget_is_largest(M, mean_work, eps):
    b = max_global_budget(M, mean_work, eps)
    cap = (1 - eps) * M
    assert isinstance(b, int) and b >= 0
    assert b * mean_work <= cap * (1 + 1e-9)
    assert (b + 1) * mean_work > cap


@settings(max_examples=100, deadline=None)
@given(b=st.integers(1, 500), w=st.integers(1, 5000))
def test_max_global_budget_exact_multiples(b, w):
    # M an exact multiple of E[w]: the boundary b itself is feasible, b + 1 is not
    assert max_global_budget(b * w, w) == b
    assert max_global_budget(b * w + w - 0.5, w) == b
    assert max_global_budget(b * w - 0.5, w) == b - 1


def test_reflected_walk_mean_value():
    m = reflected_walk_mean(3, 4)
    assert m == pytest.approx(0.80, abs=0.01)
    assert reflected_walk_mean(0, 1) == pytest.approx(0.0, abs=1e-12)
    # more slack, shorter queue; less slack, longer queue
    assert reflected_walk_mean(3, 5) < m < reflected_walk_mean(3.5, 4)


def _lindley_mc(rate, budget, n, seed):
    """Q_n = max(Q_{n-1} + A_n - b, 0), Q_0 = 0, by the running-minimum identity."""
    rng = np.random.default_rng(seed)
    x = rng.poisson(rate, size=n).astype(np.int64) - budget
    s = np.concatenate([[0], np.cumsum(x)])
    q = s - np.minimum.accumulate(s)
    return q[1:]


def _lindley_loop(rate, budget, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.poisson(rate, size=n)
    q, out = 0, np.empty(n, dtype=np.int64)
    for i in range(n):
        q = max(q + int(a[i]) - budget, 0)
        out[i] = q
    return out


def test_lindley_identity_matches_direct_loop():
    np.testing.assert_array_equal(_lindley_mc(3, 4, 5000, 1), _lindley_loop(3, 4, 5000, 1))


@pytest.mark.parametrize("rate,budget", [(3.0, 4), (1.5, 2), (6.0, 8)])
def test_reflected_walk_mean_matches_monte_carlo(rate, budget):
    q = _lindley_mc(rate, budget, 2_000_000, seed=12345)
    mc = q[10_000:].mean()
    assert reflected_walk_mean(rate, budget) == pytest.approx(mc, abs=0.03)


@pytest.mark.parametrize("rate,budget", [(4, 4), (5, 4), (1.0, 0)])
def test_reflected_walk_mean_needs_rate_below_budget(rate, budget):
    with pytest.raises(ValueError, match="rate"):
        reflected_walk_mean(rate, budget)


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5, float("nan")])
def test_max_global_budget_bad_eps(eps):
    with pytest.raises(ValueError, match="eps"):
        max_global_budget(1000, 100, eps)


@pytest.mark.parametrize("mean_work", [0, -5.0])
def test_max_global_budget_bad_mean_work(mean_work):
    with pytest.raises(ValueError, match="mean_work"):
        max_global_budget(1000, mean_work)


@pytest.mark.parametrize("M", [0, -5, -16492.0])
def test_load_bad_M(M):
    with pytest.raises(ValueError, match=r"\bM\b"):
        load(M, 5, PAPER)
    with pytest.raises(ValueError, match=r"\bM\b"):
        load(M, 5, mean_work=100.0)


def test_load_nan_M():
    with pytest.raises(ValueError, match=r"\bM\b"):
        load(float("nan"), 5, PAPER)


@pytest.mark.parametrize("M", [0, -5, float("nan")])
def test_max_global_budget_bad_M(M):
    with pytest.raises(ValueError, match=r"\bM\b"):
        max_global_budget(M, 100.0)


def test_load_needs_classes_or_mean_work():
    with pytest.raises(ValueError, match="mean_work"):
        load(1000, 5)


@pytest.mark.parametrize(
    "rates",
    [[1, 2], [1, 2, 3, 4], -1.0, [1, float("nan"), 1], [1, float("inf"), 1]],
)
def test_bad_rates(rates):
    with pytest.raises(ValueError, match="rates"):
        load(M_PAPER, rates, PAPER)
    with pytest.raises(ValueError, match="rates"):
        theorem1((4, 4, 4), PAPER, rates, M_PAPER)


@pytest.mark.parametrize("budgets", [(4, 4), (4, -1, 4), (4, float("nan"), 4)])
def test_bad_budgets(budgets):
    with pytest.raises(ValueError, match="budgets"):
        peak_usage(budgets, PAPER)


@pytest.mark.parametrize("classes", [[], [10, 20], [(10, 20, 30)]])
def test_bad_classes(classes):
    with pytest.raises(ValueError, match="classes"):
        peak_usage((1,), classes)


def test_exports():
    for name in theory.__all__:
        assert hasattr(theory, name)
    assert math.isclose(theory.work(10, 20), 410)


def test_max_global_budget_settles_a_quotient_that_rounds_across_an_integer():
    # M = 935072 * w exactly as a double, but M / w rounds to just below 935072 (floor 935071):
    # 935072 * w <= M, so 935072 is feasible and the answer (the products decide, not the quotient)
    w = 2.83822632013108
    M = 935072 * w
    assert math.floor(M / w) == 935071 and 935072 * w <= M
    assert max_global_budget(M, w) == 935072
    # M one double below 75241 * w: M / w rounds up to 75241, but 75241 * w > M: the answer is 75240
    w = 813.2889121763524
    M = float(np.nextafter(75241 * w, 0))
    assert math.floor(M / w) == 75241 and 75241 * w > M
    assert max_global_budget(M, w) == 75240


def test_max_global_budget_of_a_huge_quotient():
    # 10^15 requests of work 1 fit exactly in M = 10^15 (a quotient this size must not be counted up to)
    assert max_global_budget(1e15, 1.0) == 10**15


def test_reflected_walk_mean_equals_the_closed_form_for_budget_one():
    # b = 1: Q' = Q + A - 1 + I with I = 1{Q + A = 0}, P(I = 1) = 1 - lambda. Squaring, a stationary
    # Q gives 0 = 2 E[Q](lambda - 1) + E[(A - 1)^2] - (1 - lambda), with E[(A - 1)^2] =
    # lambda + lambda^2 - 2 lambda + 1 for Poisson A, so E[Q] = lambda^2 / (2 (1 - lambda)).
    # The iteration stops when an update changes the distribution by < 1e-12 in total (L1); at
    # lambda = 0.95 (slow mixing) that leaves a relative error of about 2e-9.
    for lam in (0.5, 0.9, 0.95):
        assert reflected_walk_mean(lam, 1) == pytest.approx(lam**2 / (2 * (1 - lam)), rel=5e-9)


def test_a_single_class_is_a_valid_class_list_and_an_empty_array_is_not():
    # one class (l, o) = (10, 20): w = 10 * 20 + (20 + 400) / 2 = 410; peak with b = 3: 1230
    assert peak_usage((3,), [(10, 20)]) == 1230.0
    assert load(1000, 2, [(10, 20)]) == pytest.approx(0.82)
    with pytest.raises(ValueError, match="classes"):
        peak_usage((), np.zeros((0, 2)))


def test_reflected_walk_mean_with_a_budget_far_above_the_rate_is_zero():
    # P(A > 100) for A ~ Poisson(1) is about 1e-160: the queue left after admission is 0 to double
    # precision (the budget exceeds every arrival count the solver keeps)
    assert reflected_walk_mean(1, 100) == 0.0
    assert reflected_walk_mean(3, 200) == 0.0


# --------------------------------------------------------------------------- time_in_system_bound


def _lp_relaxation(a, l, o, M, T):
    """The truncated hindsight program's linear relaxation, solved exactly (HiGHS): mean per request."""
    from scipy.optimize import linprog
    from scipy.sparse import lil_matrix

    var, cost = [], []
    for i in range(len(a)):
        for s in range(a[i], T + 1):  # s == T: not started within the horizon
            var.append((i, s))
            cost.append(min(s + o[i], T) - a[i])
    A_eq, A_ub = lil_matrix((len(a), len(var))), lil_matrix((T, len(var)))
    for j, (i, s) in enumerate(var):
        A_eq[i, j] = 1
        for t in range(s, min(s + o[i], T)):
            A_ub[t, j] = l[i] + t - s + 1
    r = linprog(cost, A_ub=A_ub.tocsr(), b_ub=[M] * T, A_eq=A_eq.tocsr(), b_eq=[1] * len(a), bounds=(0, None),
                method="highs")
    assert r.status == 0
    return r.fun / len(a)


def _small_trace(rng):
    n = int(rng.integers(3, 12))
    M = int(rng.integers(20, 60))
    a = np.sort(rng.integers(0, 15, n))
    o = rng.integers(1, 8, n)
    l = np.array([int(rng.integers(1, max(2, M - oi))) for oi in o])
    return a, l, o, M


def test_time_in_system_bound_by_hand():
    # six requests at slot 0, each holding l + 1 = 5 tokens in its one slot, M = 10: two a slot at best,
    # finishing at 1, 1, 2, 2, 3, 3 (mean 2); the service floor alone says 1, the memory floor 2
    b = theory.time_in_system_bound([0] * 6, [4] * 6, [1] * 6, 10, T=10)
    assert (b.service, b.memory, b.slotwise, b.requests) == (1.0, 2.0, 2.0, 6)
    assert b.lagrangian == pytest.approx(2.0, abs=0.02)
    assert b.bound == pytest.approx(2.0, abs=1e-9)
    # the horizon truncates: by T = 2 two requests are done (1 each) and four count 2
    b2 = theory.time_in_system_bound([0] * 6, [4] * 6, [1] * 6, 10, T=2)
    assert b2.memory == pytest.approx((1 + 1 + 2 * 4) / 6)
    # one request, w = 2*3 + 6 = 12 > M = 10: memory floor 2 (finishes in slot 1), service floor 3
    b3 = theory.time_in_system_bound([5], [2], [3], 10)
    assert (b3.service, b3.memory, b3.slotwise, b3.T) == (3.0, 2.0, 3.0, None)
    assert math.isnan(b3.lagrangian)  # no horizon: the floors only
    # a request that can never fit (l + o > M) and one arriving at or after T do not count
    b4 = theory.time_in_system_bound([0, 0, 9], [4, 20, 1], [1, 1, 1], 10, T=9)
    assert b4.requests == 1 and b4.bound == 1.0


def test_time_in_system_bound_matches_the_environment_where_it_is_tight():
    # the by-hand case played in the environment: a budget of 2 reaches the bound exactly
    from flowgym.lab.hindsight import run_agent_on_trace

    r = run_agent_on_trace("flow-control:b=2", [0] * 6, [4] * 6, [1] * 6, 10)
    assert r["metrics"]["mean_time_in_system"] == pytest.approx(2.0)
    # a budget of 1 serves one a slot: 1, 2, ..., 6 (mean 3.5), above the bound
    r1 = run_agent_on_trace("flow-control:b=1", [0] * 6, [4] * 6, [1] * 6, 10)
    assert r1["metrics"]["mean_time_in_system"] == pytest.approx(3.5)


@pytest.mark.parametrize("seed", range(12))
def test_the_lagrangian_bound_is_below_the_lp_relaxation_and_close_to_it(seed):
    rng = np.random.default_rng(seed)
    a, l, o, M = _small_trace(rng)
    T = int(a.max() + o.sum() + 2) if seed % 2 else int(rng.integers(a.min() + 2, 20))
    b = theory.time_in_system_bound(a, l, o, M, T)
    keep = a < T
    lp = _lp_relaxation(a[keep], l[keep], o[keep], M, T)
    assert b.lagrangian <= lp + 1e-9  # weak duality: a bound, whatever the prices
    assert b.lagrangian >= 0.95 * lp  # and the prices found are nearly the best ones
    assert b.bound == max(b.slotwise, b.lagrangian)


@pytest.mark.parametrize("seed", range(6))
def test_the_bound_is_below_the_hindsight_optimum(seed):
    from flowgym.lab.hindsight import solve_hindsight

    rng = np.random.default_rng(100 + seed)
    a, l, o, M = _small_trace(rng)
    h = solve_hindsight(a, l, o, M, time_limit=30)
    assert h.status == "optimal"
    T = int(h.finish.max()) + 1  # every request of the optimum finishes before T: nothing truncated
    b = theory.time_in_system_bound(a, l, o, M, T)
    assert b.bound * len(a) <= h.total_latency + 1e-6
    assert b.bound >= b.service  # the floors are part of it


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), agent=st.sampled_from(
    ["flow-control:b=1", "flow-control:b=3", "flow-control:b=64", "mc-sf", "alpha-greedy", "a-min"]))
def test_no_policy_in_the_environment_goes_below_the_bound(seed, agent):
    from flowgym.lab.hindsight import run_agent_on_trace

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    M = int(rng.integers(30, 120))
    a = np.sort(rng.integers(0, 30, n))
    o = rng.integers(1, 12, n)
    l = np.array([int(rng.integers(1, M - oi + 1)) for oi in o])
    r = run_agent_on_trace(agent, a, l, o, M)
    T = int(r["metrics"]["T"])
    b = theory.time_in_system_bound(a, l, o, M, T)
    assert b.bound <= r["metrics"]["mean_time_in_system"] + 1e-9
    # run to the end, so the untruncated floors hold too
    assert theory.time_in_system_bound(a, l, o, M).slotwise <= r["metrics"]["mean_time_in_system"] + 1e-9


@pytest.mark.parametrize("kwargs, match", [
    ({"arrival": [0, 1], "prompt_len": [1], "output_len": [1, 1]}, "differ in length"),
    ({"arrival": [0, -1], "prompt_len": [1, 1], "output_len": [1, 1]}, r"arrival\[1\] = -1"),
    ({"arrival": [0, 1], "prompt_len": [1, 0], "output_len": [1, 1]}, r"prompt_len\[1\] = 0"),
    ({"arrival": [0, 1], "prompt_len": [1, 1], "output_len": [1.5, 1]}, r"output_len\[0\] = 1.5 is not an integer"),
    ({"arrival": [[0, 1]], "prompt_len": [1, 1], "output_len": [1, 1]}, "one-dimensional"),
    ({"M": 0}, "M must be a positive integer"),
    ({"M": 10.0}, "M must be a positive integer"),
    ({"T": 0}, "T must be"),
    ({"iterations": -1}, "iterations"),
])
def test_time_in_system_bound_names_bad_input(kwargs, match):
    args = {"arrival": [0, 1], "prompt_len": [1, 1], "output_len": [1, 1], "M": 10, "T": 5, **kwargs}
    with pytest.raises(ValueError, match=match):
        theory.time_in_system_bound(**args)


def _most_completions(a, w, M, t):
    """The most jobs (size w_i, released a_i) one machine serving M a slot can finish by the end of slot t - 1,
    by brute force over subsets (tiny cases): a set fits, preemptively, iff for every release time r among
    its jobs the work released at or after r fits in the M (t - r) token-slots left."""
    import itertools

    idx = range(len(a))
    for k in range(len(a), 0, -1):
        for sub in itertools.combinations(idx, k):
            # feasible iff for every release time r, the work released at or after r fits in M * (t - r)
            if all(sum(w[i] for i in sub if a[i] >= r) <= M * (t - r) for r in {a[i] for i in sub}):
                return k
    return 0


@pytest.mark.parametrize("seed", range(40))
def test_the_srpt_floor_finishes_the_most_jobs_possible_by_every_slot(seed):
    rng = np.random.default_rng(500 + seed)
    n = int(rng.integers(1, 7))
    a = rng.integers(0, 6, n)
    w = rng.integers(1, 25, n)
    M = int(rng.integers(3, 12))
    done = theory._srpt_finish(a.astype(np.int64), w.astype(np.int64), M, None)
    for t in range(0, int(done.max()) + 2):
        assert int((done <= t).sum()) == _most_completions(a.tolist(), w.tolist(), M, t)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), H=st.integers(1, 40), agent=st.sampled_from(
    ["flow-control:b=1", "flow-control:b=2", "flow-control:b=64", "mc", "greedy-lifo", "two-anchor"]))
def test_truncated_runs_with_rejected_requests_stay_above_the_bound(seed, H, agent):
    from flowgym.lab.evaluation import build_agent, run_episode
    from flowgym.lab.scenarios import AgentSpec

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    M = int(rng.integers(20, 80))
    a = np.sort(rng.integers(0, 30, n))
    o = rng.integers(1, 12, n)
    l = rng.integers(1, M, n)  # some with l + o > M: rejected, and not counted by either side
    trace = {"kind": "trace", "arrival": a.tolist(), "prompt_len": l.tolist(), "output_len": o.tolist()}
    ep = run_episode(build_agent(AgentSpec.parse(agent)), {"M": M, "workload": trace}, 0, H)
    m = ep.metrics()
    T = int(ep.series["usage"].size)
    b = theory.time_in_system_bound(ep.log["arrival"], ep.log["prompt_len"], ep.log["output_len"], M, T)
    assert b.requests == int((~ep.log["rejected"]).sum())
    if b.requests:
        assert b.bound <= m["mean_time_in_system"] + 1e-9


def test_max_global_budget_refuses_what_it_cannot_count_instead_of_looping():
    from flowgym.sim.theory import max_global_budget

    with pytest.raises(ValueError, match=r"M / mean_work = 1e\+26 is beyond what a budget can count exactly"):
        max_global_budget(1e6, 1e-20)
    for bad in (float("nan"), float("inf"), 0.0, -1.0, "3"):
        with pytest.raises(ValueError, match="mean_work must be a positive finite number"):
            max_global_budget(100, bad)
    assert max_global_budget(16492, 4060.0) == 4 and max_global_budget(16492, np.float32(4060.0)) == 4


def test_bound_names_a_value_beyond_int64_instead_of_a_wrapped_one():
    from flowgym.sim.theory import time_in_system_bound

    with pytest.raises(ValueError, match=r"arrival\[0\] = 1e\+20 is too large"):
        time_in_system_bound([1e20], [1], [1], 10)
    with pytest.raises(ValueError, match=r"output_len\[1\] = 18446744073709551615 is too large"):
        time_in_system_bound([0, 0], [1, 1], np.array([1, 2**64 - 1], dtype=np.uint64), 10)
