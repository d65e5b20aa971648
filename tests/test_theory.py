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
