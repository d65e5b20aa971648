"""LoadTracker (flowgym/sim/estimators.py) pinned number by number (docs/testing.md, mutation testing).

The tracker reads a handful of engine fields; a small fake engine sets them directly, so every
estimate can be checked against numbers worked out from the module docstring's formulas:
moving sums with factor ``1 - d`` (``d = 1 / length_window``) and ``15/16`` (the fast one), rates
``r += (k - r) / tau`` started at the first count, ``E[w] ~ l o + (o^2 + Var) / 2`` floored by the
active set's bound, the safe budget ``M / E[w]`` clipped to ``[0.5, cap]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowgym.sim.estimators import (
    BACKLOG_TIME_CONSTANTS,
    LOAD_FEATURES,
    LOAD_FEATURES_V2,
    LOAD_FEATURES_V3,
    LOAD_FEATURES_V4,
    RATE_TIME_CONSTANTS,
    SWING_TIME_CONSTANT,
    LoadTracker,
)


class _Lane:
    def __init__(self, ids):
        self.buf = np.asarray(list(ids) + [-7], np.int64)  # a stale entry past the tail
        self.head = 0
        self._n = len(ids)

    def __len__(self):
        return self._n


class _Eng:
    """The fields LoadTracker reads, set by hand."""

    def __init__(self, prompts=(), **kw):
        self.prompt = np.asarray(prompts, np.int64)
        self.n_arrived = len(prompts)
        self.last_arrivals = 0
        self.last_completed_tokens = 0
        self.wasted_tokens = 0
        self.held = 0
        self.n_active = 0
        self.n_queued = 0
        self.lanes = [_Lane([])]
        self.t = 0
        self.arrival = np.zeros(len(prompts), np.int64)
        self.__dict__.update(kw)

    def arrive(self, *prompts):
        self.prompt = np.concatenate([self.prompt, np.asarray(prompts, np.int64)])
        self.n_arrived += len(prompts)
        self.last_arrivals = len(prompts)


def test_rates_start_at_the_first_count_then_move_by_one_over_tau():
    """Rule: the first decision point sets every rate to its count; then ``r += (k - r) / tau``;
    ``arrival_rate`` is the tau = 32 one."""
    eng = _Eng(prompts=[10, 30, 50, 70], last_arrivals=4)
    tr = LoadTracker(1000)
    tr.reset(eng)
    np.testing.assert_array_equal(tr.rates, [4.0] * 4)
    eng.last_arrivals = 0
    tr.update(eng, 0)
    want = [4.0 - 4.0 / tau for tau in RATE_TIME_CONSTANTS]  # 3.5, 3.875, 3.96875, 3.9921875
    np.testing.assert_allclose(tr.rates, want, rtol=0, atol=1e-12)
    assert tr.arrival_rate() == pytest.approx(3.875, abs=1e-12)
    eng.arrive(5, 5)  # k = 2
    tr.update(eng, 0)
    want = [r + (2 - r) / tau for r, tau in zip(want, RATE_TIME_CONSTANTS)]
    np.testing.assert_allclose(tr.rates, want, rtol=0, atol=1e-12)


def _three_slots(length_window=4.0, M=100_000):
    """Slot 0: prompts 10 and 30 arrive. Slot 1: two requests complete (l + o = 100 in all).
    Slot 2: a prompt of 60 arrives and one request completes (l + o = 80). With d = 1/4:

    prompt means: lA = 40, lN = 2; then 30, 1.5; then 22.5 + 60 = 82.5, 1.125 + 1 = 2.125
    completions: A = 100, N = 2, A2 = 100^2 / 2 = 5000; then A = 75 + 80 = 155, N = 2.5,
    A2 = 3750 + 6400 = 10150.
    """
    eng = _Eng(prompts=[10, 30], last_arrivals=2)
    tr = LoadTracker(M, cap=256.0, length_window=length_window)
    tr.reset(eng)
    eng.last_arrivals = 0
    eng.last_completed_tokens = 100
    tr.update(eng, 2)
    eng.arrive(60)
    eng.last_completed_tokens = 80
    tr.update(eng, 1)
    return tr, eng


def test_work_estimate_from_prompt_and_completion_moving_means():
    """Rule: ``l`` = moving mean of arriving prompts, ``s``, ``s2`` = moving means of ``l + o``
    and ``(l + o)^2`` (a slot's completions counted as ``n`` requests of their mean),
    ``o = s - l``, ``Var = s2 - s^2``, ``w = l o + (o^2 + Var) / 2``; safe budget ``M / w``."""
    tr, _ = _three_slots()
    l = 82.5 / 2.125
    s = 155 / 2.5  # 62
    var = 10150 / 2.5 - s * s  # 4060 - 3844 = 216
    o = s - l
    w = l * o + 0.5 * (o * o + var)
    assert tr.mean_length == pytest.approx(62.0, rel=1e-12)
    assert tr.work == pytest.approx(w, rel=1e-12)
    assert tr.safe_budget() == pytest.approx(100_000 / w, rel=1e-12)


def test_work_estimate_after_one_completing_slot():
    """One slot's completions: ``Var = 0`` (the slot counts as requests of its mean), ``o = s - l``."""
    eng = _Eng(prompts=[10, 30], last_arrivals=2)
    tr = LoadTracker(10_000, length_window=4.0)
    tr.reset(eng)
    assert tr.mean_length is None and tr.work is None  # nothing completed, nothing active
    eng.last_arrivals = 0
    eng.last_completed_tokens = 100
    tr.update(eng, 2)
    # l = 30 / 1.5 = 20, s = 50, o = 30: w = 600 + 450
    assert tr.mean_length == 50.0
    assert tr.work == pytest.approx(1050.0, rel=1e-12)


def test_completed_tokens_are_read_only_when_something_completed():
    """Rule: ``last_completed_tokens`` is the last serve's and counts only when that serve completed
    requests (the engine leaves it stale otherwise); the first decision point completes nothing."""
    eng = _Eng(prompts=[10, 30], last_arrivals=2, last_completed_tokens=999)
    tr = LoadTracker(10_000, length_window=4.0)
    tr.reset(eng)
    tr.update(eng, 0)  # a stale 999 again: ignored
    assert tr.mean_length is None
    eng.last_completed_tokens = 100
    tr.update(eng, 2)
    assert tr.mean_length == 50.0  # 100 / 2, not (999 * 0.75^2 + 100) / 2
    assert tr._A == 100.0 and tr._Af == 100.0


def test_work_has_a_floor_from_the_active_set_before_any_completion():
    """Rule: an active request's ``l + j`` bounds its ``l + o``: ``o_lb = max(held / active - l, 1)``,
    ``w_lb = l o_lb + o_lb^2 / 2``; with completions the estimate is ``max(w, w_lb)``."""
    eng = _Eng(prompts=[10, 30], last_arrivals=2, held=200, n_active=2)
    tr = LoadTracker(10_000, length_window=4.0)
    tr.reset(eng)
    # l = 20, held / active = 100: o_lb = 80, w_lb = 1600 + 3200
    assert tr.mean_length is None
    assert tr.work == pytest.approx(4800.0, rel=1e-12)
    eng.last_arrivals = 0
    eng.last_completed_tokens = 100
    tr.update(eng, 2)  # w = 1050 from the completions (as above) < w_lb = 4800
    assert tr.work == pytest.approx(4800.0, rel=1e-12)
    eng.held, eng.n_active = 20, 2  # l + j = 10 < l: o_lb = 1, w_lb = 20.5 < w = 1050
    tr.update(eng, 0)
    # completions decay: A = 75, N = 1.5 (s = 50, Var = 3750/1.5 - 2500 = 0); prompts: 22.5 / 1.125 = 20
    assert tr.work == pytest.approx(1050.0, rel=1e-12)


def test_safe_budget_is_clipped_to_half_and_cap_and_divides_by_at_least_one():
    """Rule: safe budget = ``M / max(E[w], 1)`` clipped to ``[0.5, cap]``."""
    # no prompt seen (l = 0), one active request holding 1 token: o_lb = 1, w = 0.5 -> M / 1
    eng = _Eng(held=1, n_active=1)
    tr = LoadTracker(100, cap=256.0)
    tr.reset(eng)
    assert tr.work == 0.5
    assert tr.safe_budget() == 100.0
    tr = LoadTracker(1000, cap=7.0)
    tr.reset(eng)
    assert tr.safe_budget() == 7.0  # 1000 capped
    eng = _Eng(prompts=[10], last_arrivals=1, held=10_000, n_active=1)  # o_lb = 9990: w ~ 5e7
    tr = LoadTracker(1000, cap=7.0)
    tr.reset(eng)
    assert tr.safe_budget() == 0.5


def test_forgotten_tracker_knows_nothing():
    """``reset_state``: no activity, no lengths: ``work`` unknown, the safe budget is the cap."""
    tr = LoadTracker(1000, cap=77.0)
    tr.reset(_Eng(prompts=[10, 30], last_arrivals=2, held=200, n_active=2, wasted_tokens=5))
    tr.reset_state()
    assert tr.work is None and tr.mean_length is None and tr.safe_budget() == 77.0
    np.testing.assert_array_equal(tr.rates, 0.0)
    # an empty system has wasted nothing: 32 wasted tokens since are a moving mean of 32 / 32 = 1
    eng = _Eng(wasted_tokens=32)
    tr.update(eng, 0)
    assert _features(tr, eng)["eviction_pressure"] == pytest.approx(100 * 1.0 / 1000)


def _features(tr, eng):
    out = np.full(len(LOAD_FEATURES), np.nan, np.float32)
    got = tr.features(eng, out=out)
    assert got is out
    new = tr.features(eng)
    np.testing.assert_array_equal(new, out)
    return dict(zip(LOAD_FEATURES, out.astype(float)))


def test_features_by_hand():
    """Each of LOAD_FEATURES from the three-slot history above (w, s known), a queue of 3 whose
    oldest head (over two lanes) arrived at slot 2, now slot 9; wasted tokens 0 -> 40 -> 100."""
    eng = _Eng(prompts=[10, 30], last_arrivals=2)
    tr = LoadTracker(100_000, cap=256.0, length_window=4.0)
    tr.reset(eng)
    eng.last_arrivals = 0
    eng.last_completed_tokens = 100
    eng.wasted_tokens = 40
    tr.update(eng, 2)
    eng.arrive(60)
    eng.last_completed_tokens = 80
    eng.wasted_tokens = 100
    tr.update(eng, 1)
    # the state the features read: 3 queued (ids 0 and 2 head their lanes), 2 active holding 300
    eng.arrival = np.array([5, 4, 2], np.int64)
    eng.lanes = [_Lane([0, 1]), _Lane([]), _Lane([2])]
    eng.n_queued, eng.held, eng.n_active, eng.t = 3, 300, 2, 9
    f = _features(tr, eng)

    M = 100_000
    l = 82.5 / 2.125
    s, var = 62.0, 216.0
    o = s - l
    w = l * o + 0.5 * (o * o + var)  # no floor: the tracker saw no active request at slot 2
    bs = M / w
    sf = (100 * 15 / 16 + 80) / (2 * 15 / 16 + 1)  # fast mean of l + o
    waste = ((40 - 0) / 32) * 1  # first update: 0 + (40 - 0 - 0) / 32
    waste = waste + (100 - 40 - waste) / 32
    rates = [2.0 * (1 - 1 / tau) ** 1 for tau in RATE_TIME_CONSTANTS]  # slot 1: 0 arrivals
    rates = [r + (1 - r) / tau for r, tau in zip(rates, RATE_TIME_CONSTANTS)]  # slot 2: 1 arrival
    want = {
        "kv_usage": 300 / M,
        "projected_usage": (300 + 2 * 0.5 * s) / M,
        "backlog_slots": math.log1p(3 / bs),
        "backlog_demand": math.log1p(3 * w / M),
        "log_safe_budget": math.log2(bs) / 8,
        "length_trend": math.log(sf / s),
        "head_age": math.log1p((9 - 2) / s),
        "eviction_pressure": 100 * waste / M,
        "active_ratio": math.log1p(2 / bs / s),
    }
    for i, tau in enumerate(RATE_TIME_CONSTANTS):
        want[f"rho_{int(tau)}"] = rates[i] * w / M
        want[f"rate_{int(tau)}"] = math.log1p(rates[i] / bs)
    assert set(want) == set(LOAD_FEATURES)
    for name in LOAD_FEATURES:
        assert f[name] == pytest.approx(want[name], rel=1e-5, abs=1e-7), name

    # version 2: the same 17, then the head-era rate (the head came before the ring buffer holds
    # anything this old, so it is the rate now), the completion rate (the fast count of
    # completions / 16) and the queue's mean prompt against the arriving prompts' (150 / 3 over l)
    eng.queued_prompt_tokens = 150
    v2 = tr.features(eng, version=2)
    assert v2.shape == (len(LOAD_FEATURES_V2),) == (20,) and LOAD_FEATURES_V2[:17] == LOAD_FEATURES
    np.testing.assert_array_equal(v2[:17], tr.features(eng))
    g = dict(zip(LOAD_FEATURES_V2, v2.astype(float)))
    assert g["head_rate"] == pytest.approx(math.log1p(rates[1] / bs), rel=1e-6)
    assert g["completion_rate"] == pytest.approx(math.log1p((2 * 15 / 16 + 1) / 16 / bs), rel=1e-6)
    assert g["queue_prompt"] == pytest.approx(math.log(50 / l), rel=1e-6)
    eng.queued_prompt_tokens = 1  # a mean queued prompt below one token (1/3) counts as one
    assert tr.features(eng, version=2)[19] == pytest.approx(math.log(1 / l), rel=1e-6)
    eng.n_queued = 0  # an empty queue: 0
    assert tr.features(eng, version=2)[19] == 0.0
    with pytest.raises(ValueError, match=r"version must be one of \[1, 2, 3, 4\], got 5"):
        tr.features(eng, version=5)


def test_v3_backlog_averages_start_at_the_backlog_then_move_by_one_over_tau():
    """Version 3: the 20 of version 2, then ``backlog_slots`` (``log(1 + queued / safe budget)``) averaged
    with time constants 64 and 1024, started at the first decision point's backlog."""
    eng = _Eng(prompts=[10] * 6, last_arrivals=6, n_queued=6, lanes=[_Lane(range(6))], queued_prompt_tokens=60)
    tr = LoadTracker(1000, cap=4.0)  # nothing known: the safe budget is the cap, 4
    tr.reset(eng)
    b0 = math.log1p(6 / 4)
    v = tr.features(eng, version=3)
    assert v.shape == (len(LOAD_FEATURES_V3),) == (22,) and LOAD_FEATURES_V3[:20] == LOAD_FEATURES_V2
    assert LOAD_FEATURES_V3[20:] == tuple(f"backlog_{int(t)}" for t in BACKLOG_TIME_CONSTANTS)
    np.testing.assert_array_equal(v[:20], tr.features(eng, version=2))
    assert v[20] == pytest.approx(b0, rel=1e-6) and v[21] == pytest.approx(b0, rel=1e-6) == v[2]
    want = np.array([b0, b0])
    for n in (1, 40, 0):  # the queue shrinks, grows, empties
        eng.t += 1
        eng.last_arrivals, eng.n_queued = 0, n
        tr.update(eng, 0)
        b = math.log1p(n / tr.safe_budget())
        want += (b - want) / np.array([64.0, 1024.0])
        v = tr.features(eng, version=3)
        assert v[2] == pytest.approx(b, rel=1e-6, abs=1e-7)
        np.testing.assert_allclose(v[20:], want, rtol=1e-6)
    tr.reset_state()
    np.testing.assert_array_equal(tr.backlogs, [0.0, 0.0])


def test_v4_swings_are_bias_corrected_means_of_fast_against_slow_gaps():
    """Version 4: the 22 of version 3, then the moving means (time constant 1024, divided by the moving
    sum of weights, so the first point's mean is its own value) of ``|rate_32 - rate_512|`` (each
    ``log(1 + rate / safe budget)``), of ``|log(arriving prompt mean, tau 32 / tau 512)|`` and of
    ``|length_trend|``. A constant load has swings of 0."""
    eng = _Eng(prompts=[10, 30], last_arrivals=2)
    off = LoadTracker(1000, cap=4.0)  # by default the swings are not kept (nothing to pay where unread)
    off.reset(eng)
    with pytest.raises(ValueError, match=r"version 4 reads the swings, which this tracker does not keep"):
        off.features(eng, version=4)
    tr = LoadTracker(1000, cap=4.0, swings=True)  # nothing known: the safe budget is the cap, 4
    tr.reset(eng)
    v = tr.features(eng, version=4)
    assert v.shape == (len(LOAD_FEATURES_V4),) == (25,) and LOAD_FEATURES_V4[:22] == LOAD_FEATURES_V3
    assert LOAD_FEATURES_V4[22:] == ("rate_swing", "prompt_swing", "length_swing")
    np.testing.assert_array_equal(v[:22], tr.features(eng, version=3))
    np.testing.assert_array_equal(v[22:], [0.0, 0.0, 0.0])  # every rate 2, every prompt mean 20
    eng.t = 1
    eng.arrive(70)  # slot 1: one arrival of prompt 70
    tr.update(eng, 0)
    r32, r512 = 2 + (1 - 2) / 32, 2 + (1 - 2) / 512
    x_rate = abs(math.log1p(r32 / 4) - math.log1p(r512 / 4))
    fast = (31 / 32 * 40 + 70) / (31 / 32 * 2 + 1)
    slow = (511 / 512 * 40 + 70) / (511 / 512 * 2 + 1)
    x_prompt = abs(math.log(fast / slow))
    g = 1 - 1 / SWING_TIME_CONSTANT
    v = tr.features(eng, version=4)
    np.testing.assert_allclose(v[22:], [x_rate / (1 + g), x_prompt / (1 + g), 0.0], rtol=1e-6)
    assert x_rate > 1e-4 and x_prompt > 1e-3  # both moved
    eng.last_arrivals = 0
    xs_rate, safes = [0.0, x_rate], []
    for t, lo in ((2, 100), (3, 50)):  # one request completes in each: l + o = 100, then 50
        eng.t, eng.last_completed_tokens = t, lo
        tr.update(eng, 1)
        bs = tr.safe_budget()  # this decision point's: the rate swing reads it, not the last one's
        safes.append(bs)
        xs_rate.append(abs(math.log1p(tr.rates[1] / bs) - math.log1p(tr.rates[3] / bs)))
    assert safes == [0.5, 0.5]  # the first completion made E[w] known: the safe budget fell from 4 to its floor
    weights = [g ** 3, g * g, g, 1.0]  # slots 0..3
    fast = (15 / 16 * 100 + 50) / (15 / 16 + 1)  # the moving means of l + o (tau 16 and 64)
    slow = (63 / 64 * 100 + 50) / (63 / 64 + 1)
    x_len = abs(math.log(fast / slow))  # slot 2's is 0 (one completion: fast = slow)
    assert x_len > 1e-3 and x_len == pytest.approx(abs(tr.features(eng, version=2)[13]), rel=1e-6)
    v = tr.features(eng, version=4)
    # no arrivals at slots 2-3: both prompt means decay alike, so the prompt gap stays slot 1's
    want = [np.dot(weights, xs_rate), x_prompt * (g * g + g + 1), x_len]
    np.testing.assert_allclose(v[22:], np.array(want) / sum(weights), rtol=1e-6)
    tr.reset_state()  # forgets the sums too: a new run's first swings are its own values
    np.testing.assert_array_equal(tr.swings, [0.0, 0.0, 0.0])
    eng2 = _Eng(prompts=[10, 30], last_arrivals=2)
    tr.reset(eng2)
    eng2.t = 1
    eng2.arrive(70)
    tr.update(eng2, 0)
    np.testing.assert_allclose(tr.features(eng2, version=4)[22:], [x_rate / (1 + g), x_prompt / (1 + g), 0.0],
                               rtol=1e-6)
    eng2.t = 2
    eng2.arrive(20)  # slot 2: now the fast and slow prompt sums differ before the update
    tr.update(eng2, 0)
    f, fn = 31 / 32 * (31 / 32 * 40 + 70) + 20, 31 / 32 * (31 / 32 * 2 + 1) + 1
    sl, sn = 511 / 512 * (511 / 512 * 40 + 70) + 20, 511 / 512 * (511 / 512 * 2 + 1) + 1
    x2 = abs(math.log((f / fn) / (sl / sn)))
    assert tr.features(eng2, version=4)[23] == pytest.approx((g * x_prompt + x2) / (1 + g + g * g), rel=1e-6)
    # no arrival for 500 slots: the prompt gap stays x2 (both sums decay alike) until the fast count falls
    # below 1e-6 (after about 470 slots), then it counts as 0: a stale mean is no evidence of a swing
    eng2.last_arrivals = 0
    n_of = lambda k: (1 - g ** k) / (1 - g)  # noqa: E731  (the moving sum of weights after k points)
    gaps = []
    for t in range(3, 503):
        before = float(tr.swings[1]) * n_of(t)
        eng2.t = t
        tr.update(eng2, 0)
        gaps.append(float(tr.swings[1]) * n_of(t + 1) - g * before)
    assert gaps[0] == pytest.approx(x2, rel=1e-6) and abs(gaps[-1]) < 1e-9


def test_a_tracker_without_swings_computes_none_and_the_same_other_features():
    """``swings=False`` (the default, and the environment's unless ``observation="load-v4"``) skips the
    swings' work; every feature of versions 1-3 is the same as with them."""
    on, off = LoadTracker(1000, cap=4.0, swings=True), LoadTracker(1000, cap=4.0)
    eng = _Eng(prompts=[10, 30], last_arrivals=2, n_queued=2, lanes=[_Lane(range(2))], queued_prompt_tokens=40)
    for tr in (on, off):
        tr.reset(eng)
    for t, (arrivals, lo) in enumerate([((70,), 0), ((), 100), ((20, 5), 50)], start=1):
        eng.t, eng.last_completed_tokens = t, lo
        eng.arrive(*arrivals)
        for tr in (on, off):
            tr.update(eng, 1 if lo else 0)
        np.testing.assert_array_equal(on.features(eng, version=3), off.features(eng, version=3))
    np.testing.assert_array_equal(off.swings, [0.0, 0.0, 0.0])
    assert on.swings.min() > 0  # the same run did swing


def test_v2_head_rate_feature_reads_the_rate_when_the_head_arrived():
    """``head_rate`` of version 2 from the ring buffer: the head arrived at slot 1, when ``rate_32``
    was ``4 + (0 - 4) / 32``; by slot 2 it has moved on (another 10 arrived)."""
    eng = _Eng(prompts=[10] * 4, last_arrivals=4)
    tr = LoadTracker(100_000, cap=256.0)
    tr.reset(eng)  # slot 0: 4 arrivals, every rate 4
    eng.t, eng.last_arrivals = 1, 0
    tr.update(eng, 0)  # slot 1: none
    at_head = 4 + (0 - 4) / 32
    eng.arrive(*([10] * 10))
    eng.t = 2
    eng.arrival = np.array([0, 0, 0, 1] + [2] * 10, np.int64)
    eng.lanes = [_Lane([3] + list(range(4, 14)))]  # the head is request 3, arrived at slot 1
    eng.n_queued = 11
    eng.queued_prompt_tokens = 110
    tr.update(eng, 0)  # slot 2: 10 arrivals
    now = at_head + (10 - at_head) / 32
    assert tr.arrival_rate() == pytest.approx(now) and tr.head_rate() == pytest.approx(at_head)
    bs = tr.safe_budget()
    v = tr.features(eng, version=2)
    assert v[17] == pytest.approx(math.log1p(at_head / bs), rel=1e-6)
    assert v[10] == pytest.approx(math.log1p(now / bs), rel=1e-6)  # rate_32: the rate now


def test_features_caps_and_floors():
    """Caps: projected usage 4, rho 8, eviction pressure 10; an empty queue has age 0, a head that
    arrived this slot too; without completions the means are 1 (and the trend log 1 = 0)."""
    eng = _Eng(prompts=[10], last_arrivals=1, held=100, n_active=1)
    tr = LoadTracker(50, cap=256.0, length_window=4.0)  # held > 4 M
    tr.reset(eng)
    eng.wasted_tokens = 10_000  # 100 * (10_000 / 32) / 50 > 10
    tr.update(eng, 0)
    f = _features(tr, eng)
    assert f["kv_usage"] == 2.0
    assert f["projected_usage"] == pytest.approx((100 + 0.5) / 50)  # s = 1 without completions
    assert f["head_age"] == 0.0 and f["backlog_slots"] == 0.0 and f["backlog_demand"] == 0.0
    assert f["length_trend"] == 0.0
    assert f["eviction_pressure"] == 10.0
    assert f["rho_512"] == 8.0  # rate ~1 * w (o_lb = 90: w = 10 * 90 + 4050) / 50 > 8
    eng.held = 1000
    assert _features(tr, eng)["projected_usage"] == 4.0
    # a queue head that arrived in this very slot: age 0 (not the floor 1)
    eng.arrival = np.array([3], np.int64)
    eng.lanes, eng.n_queued, eng.t = [_Lane([0])], 1, 3
    assert _features(tr, eng)["head_age"] == 0.0
    eng.t = 5
    assert _features(tr, eng)["head_age"] == pytest.approx(math.log1p(2.0))  # mean l + o floored at 1


def test_length_trend_uses_the_fast_mean_of_completed_lengths():
    """``length_trend = log(fast / slow mean of l + o)``: 15/16 per slot against ``1 - 1/length_window``."""
    eng = _Eng(prompts=[10], last_arrivals=1)
    tr = LoadTracker(10_000, length_window=4.0)
    tr.reset(eng)
    eng.last_arrivals = 0
    for tokens in (40, 400):
        eng.last_completed_tokens = tokens
        tr.update(eng, 1)
    fast = (40 * 15 / 16 + 400) / (15 / 16 + 1)
    slow = (40 * 0.75 + 400) / 1.75
    assert _features(tr, eng)["length_trend"] == pytest.approx(math.log(fast / slow), rel=1e-5)


def test_expected_output_is_at_least_one_token():
    """Rule: ``o = max(s - l, 1)``. Completed requests whose ``l + o`` (20) is no more than the mean
    arriving prompt (20) give ``o = 1``: ``w = 20 * 1 + (1 + 0) / 2``. (Elsewhere ``w = (s^2 - l^2) / 2
    + Var / 2`` does not depend on the sign of ``l``; here it does.)"""
    eng = _Eng(prompts=[20], last_arrivals=1)
    tr = LoadTracker(10_000, length_window=4.0)
    tr.reset(eng)
    eng.last_arrivals = 0
    eng.last_completed_tokens = 20
    tr.update(eng, 1)
    assert tr.mean_length == 20.0
    assert tr.work == 20.5


def test_head_rate_is_the_rate_when_the_queue_head_arrived():
    """``head_rate``: ``rate_32`` stored at each decision point ``t``; with a queue, the one at the slot
    the oldest lane head arrived; with an empty queue, the rate now."""
    from flowgym.sim.estimators import RATE_MEMORY

    eng = _Eng(prompts=[10] * 8, last_arrivals=8)
    tr = LoadTracker(1000)
    tr.reset(eng)
    assert tr.head_rate() == tr.arrival_rate() == 8.0  # empty queue: the rate now
    history = {0: 8.0}
    for t in range(1, 40):
        eng.t, eng.last_arrivals = t, 0
        tr.update(eng, 0)
        history[t] = tr.arrival_rate()
    assert tr.head_rate() == tr.arrival_rate()
    # three lanes, one empty: heads arrived at slots 5 and 3; the oldest (3) is what the budget admits next
    eng.arrival = np.array([5, 3, 9], np.int64)
    eng.lanes, eng.n_queued = [_Lane([]), _Lane([0, 2]), _Lane([1])], 3  # an empty lane is skipped
    eng.t = 40
    tr.update(eng, 0)
    assert tr.head_rate() == pytest.approx(history[3]) and history[3] > tr.arrival_rate() * 1.2
    # a head older than the memory reads the oldest rate kept; one from before tracking, the rate now
    eng.arrival = np.array([0, 0, 0], np.int64)
    for t in range(41, RATE_MEMORY + 45):
        eng.t = t
        tr.update(eng, 0)
    oldest = eng.t - RATE_MEMORY + 1
    assert tr._rt[oldest % RATE_MEMORY] == oldest and tr.head_rate() == tr._rh[oldest % RATE_MEMORY]
    tr2 = LoadTracker(1000)
    eng2 = _Eng(prompts=[10, 10], last_arrivals=2, t=50, n_queued=1, arrival=np.array([20, 50], np.int64),
                lanes=[_Lane([0])])
    tr2.reset(eng2)
    assert tr2.head_rate() == tr2.arrival_rate() == 2.0
    tr2.reset_state()
    assert tr2.head_rate() == 0.0 and (tr2._rt == -1).all()
