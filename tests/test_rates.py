"""Rate schedules (``flowgym/sim/rates.py``): integrals, means and bounds by hand, and the law of the
arrival counts they sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowgym.sim.rates import Bursts, Constant, Sinusoid, Steps


def test_constant_integral():
    # 2 arrivals per unit over [1, 4): 6
    assert float(Constant(2.0).integral(1.0, 4.0)) == 6.0
    np.testing.assert_allclose(Constant(0.5).integral(np.array([0.0, 2.0]), np.array([4.0, 3.0])), [2.0, 0.5])


def test_steps_arguments():
    with pytest.raises(ValueError, match="as many times as rates"):
        Steps([], [])
    with pytest.raises(ValueError, match="as many times as rates"):
        Steps([0, 1], [1.0])
    # the period must exceed the last step time (a period equal to it would leave the last step no room)
    with pytest.raises(ValueError, match="period 5 must exceed the last step time 5"):
        Steps([0, 5], [1.0, 2.0], period=5)
    assert Steps([0, 5], [1.0, 2.0], period=5.5).period == 5.5
    # three steps: the period is checked against the last time (5), not the second
    with pytest.raises(ValueError, match="period 3 must exceed the last step time 5"):
        Steps([0, 1, 5], [1.0, 1.0, 1.0], period=3)
    # times must strictly increase, every consecutive pair
    for times in ([0, 0], [0, 2, 1], [0, 2, 2]):
        with pytest.raises(ValueError, match="start at 0 and increase"):
            Steps(times, [1.0] * len(times))


def test_periodic_steps_mean_and_integral():
    # rate 1 on [0, 2), 3 on [2, 4), repeating every 4: mean (2 * 1 + 2 * 3) / 4 = 2
    s = Steps([0, 2], [1.0, 3.0], period=4)
    assert s.mean() == 2.0
    # [1, 7): 1 (rate 1 on [1,2)) + 6 ([2,4)) + 2 ([4,6)) + 3 ([6,7)) = 12
    assert float(s.integral(1.0, 7.0)) == pytest.approx(12.0)
    # not periodic: the long-run mean is the last rate
    assert Steps([0, 2], [1.0, 3.0]).mean() == 3.0
    assert Steps([0, 1, 2], [1.0, 2.0, 4.0]).mean() == 4.0


def test_sinusoid_rate_by_hand():
    # 3 + 2 sin(2 pi t / 8) at t = 0, 2, 4, 6: 3, 5, 3, 1; with phase 0.25 (a quarter period later): 5, 3, 1, 3
    np.testing.assert_allclose(Sinusoid(3.0, 2.0, 8.0).rate(np.array([0.0, 2.0, 4.0, 6.0])), [3, 5, 3, 1], atol=1e-12)
    np.testing.assert_allclose(Sinusoid(3.0, 2.0, 8.0, phase=0.25).rate(np.array([0.0, 2.0, 4.0, 6.0])), [5, 3, 1, 3],
                               atol=1e-12)


def test_sinusoid_amplitude_may_equal_the_mean():
    assert Sinusoid(2.0, 2.0, 10.0).peak() == 4.0  # rate 2 + 2 sin(...) >= 0 still
    with pytest.raises(ValueError, match="amplitude"):
        Sinusoid(2.0, 2.5, 10.0)


def test_sinusoid_integral_by_hand():
    # mean m = 3, amplitude a = 2, period P = 8.
    # phase 0: int_0^{P/4} a sin(2 pi t / P) dt = a P / (2 pi) (1 - cos(pi / 2)) = a P / (2 pi)
    # phase 0.5: sin(x + pi) = -sin(x): minus that
    m, a, P = 3.0, 2.0, 8.0
    assert float(Sinusoid(m, a, P).integral(0.0, P / 4)) == pytest.approx(m * P / 4 + a * P / (2 * math.pi))
    assert float(Sinusoid(m, a, P, phase=0.5).integral(0.0, P / 4)) == pytest.approx(m * P / 4 - a * P / (2 * math.pi))
    # phase 0.25: sin(x + pi / 2) = cos(x): int_0^{P/4} a cos(2 pi t / P) dt = a P / (2 pi)
    assert float(Sinusoid(m, a, P, phase=0.25).integral(0.0, P / 4)) == pytest.approx(m * P / 4 + a * P / (2 * math.pi))
    # a whole period: m P
    assert float(Sinusoid(m, a, P, phase=0.3).integral(5.0, 5.0 + P)) == pytest.approx(m * P)


def test_bursts_duration_must_be_shorter_than_the_period():
    with pytest.raises(ValueError, match="must be shorter than every"):
        Bursts(1.0, 5.0, every=10.0, duration=10.0)
    assert Bursts(1.0, 5.0, every=10.0, duration=9.5).peak() == 5.0


def test_a_schedule_with_no_arrivals_samples_none():
    rng = np.random.default_rng(0)
    assert Steps([0], [0.0]).sample_times(rng, 0.0, 100.0).size == 0
    assert Sinusoid(0.0, 0.0, 10.0).sample_times(rng, 0.0, 100.0).size == 0


@pytest.mark.parametrize("schedule", [Steps([0, 1], [0.2, 0.8], period=2), Sinusoid(0.5, 0.5, 2.0), Constant(0.5)])
def test_sampled_counts_follow_the_poisson_law(schedule):
    # arrivals in [1, 3) are Poisson with mean int_1^3 lambda = 1 for each schedule: P(N = k) =
    # e^-1 / k!  (0.368, 0.368, 0.184, 0.061, ...). 20,000 windows: each frequency within 0.012
    # (more than 4 standard deviations); the times lie in the window, sorted.
    rng = np.random.default_rng(7)
    counts = np.empty(20_000, dtype=np.int64)
    for i in range(counts.size):
        t = schedule.sample_times(rng, 1.0, 3.0)
        assert np.all((t >= 1.0) & (t < 3.0)) and np.all(np.diff(t) >= 0)
        counts[i] = t.size
    freq = np.bincount(counts, minlength=5)[:5] / counts.size
    law = np.array([math.exp(-1) / math.factorial(k) for k in range(5)])
    np.testing.assert_allclose(freq, law, atol=0.012)


def test_sampled_times_follow_the_intensity():
    # Steps: rate 0.2 on [0, 1), 0.8 on [1, 2): a fifth of the arrivals fall in the first unit
    rng = np.random.default_rng(3)
    t = np.concatenate([Steps([0, 1], [0.2, 0.8], period=2).sample_times(rng, 0.0, 2.0) for _ in range(20_000)])
    assert abs(np.mean(t < 1.0) - 0.2) < 0.015


class _RoundingUp:
    """A generator whose uniform draws on ``[t0, t1)`` all round up to ``t1`` (as ``t0 + (t1 - t0) u``
    can in floating point, e.g. ``60 + 60 (1 - 2^-53) == 120.0``)."""

    def poisson(self, lam):
        return 3

    def uniform(self, t0, t1, size):
        return np.full(size, float(t1))

    def random(self, size):
        return np.zeros(size)


@pytest.mark.parametrize("schedule", [Constant(2.0), Steps([0, 1], [0.2, 0.8], period=2)])
def test_arrival_times_stay_below_the_end_of_their_window(schedule):
    # a chunk holds the arrivals of [t0, t1): one at t1 belongs to the next chunk (the engines draw
    # the next chunk when the clock reaches t1, and the compiled loop relies on it)
    t = schedule.sample_times(_RoundingUp(), 60.0, 120.0)
    assert t.size == 3 and np.all(t < 120.0) and np.all(t == np.nextafter(120.0, 0.0))


# ----------------------------------------------------------------- zero-rate stretches


def test_zero_until_by_hand():
    s = Steps([0, 100, 250, 400], [0.0, 0.0, 2.0, 0.0])
    assert s.zero_until(0.0) == 250.0 and s.zero_until(120.0) == 250.0  # two zero steps in a row: one stretch
    assert s.zero_until(250.0) == 250.0 and s.zero_until(300.0) == 300.0  # rate 2: no stretch starts there
    assert s.zero_until(400.0) == math.inf and s.zero_until(1e12) == math.inf  # 0 from 400 on, forever
    assert Steps([0, 1e9], [0.0, 5.0]).zero_until(60.0) == 1e9
    assert Constant(0.0).zero_until(3.0) == math.inf and Constant(0.5).zero_until(3.0) == 3.0
    assert Sinusoid(1.0, 1.0, 10.0).zero_until(7.5) == 7.5  # zero at isolated instants only: none known
    assert Steps([0, 5], [0.0, 0.0], period=10).zero_until(3.0) == math.inf
    # periodic: rate 0 on [20, 90) of every 100; the stretch ends a rounding margin before 90 of the same cycle
    p = Steps([0, 20, 90], [1.0, 0.0, 3.0], period=100)
    z = p.zero_until(1030.0)
    assert 1090.0 - 1e-5 < z < 1090.0
    assert p.zero_until(1010.0) == 1010.0 and p.zero_until(1095.0) == 1095.0
    # a stretch across the end of a cycle (bursts at 80..90 of every 100, base 0) is cut there, then found again
    b = Bursts(0.0, 4.0, every=100.0, duration=10.0, start=80.0)
    assert 1080.0 - 1e-5 < b.zero_until(1000.5) < 1080.0
    assert 1100.0 - 1e-5 < b.zero_until(1095.0) < 1100.0
    assert 1180.0 - 1e-5 < b.zero_until(1100.5) < 1180.0


@pytest.mark.parametrize("seed", range(6))
def test_every_window_of_a_zero_stretch_integrates_to_exactly_zero(seed):
    """What the engine relies on to skip a stretch: each window inside ``[t, zero_until(t)]`` integrates to
    ``0.0`` exactly (not a rounding residue, which ``Generator.poisson`` would draw for), so sampling it draws
    nothing from the generator; and the rate there is 0. Random schedules, with and without periods, at
    times up to 1e12 (where reducing to a cycle rounds)."""
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(60):
        n = int(rng.integers(1, 6))
        times = np.concatenate([[0.0], np.sort(rng.choice(np.arange(1, 10_000), n - 1, replace=False)) * 0.37])
        rates = np.where(rng.random(n) < 0.5, 0.0, rng.uniform(0.1, 5.0, n))
        period = float(times[-1] + rng.uniform(0.5, 500.0)) if rng.random() < 0.6 else None
        s = Steps(times.tolist(), rates.tolist(), period=period)
        for t in rng.uniform(0, 1, 20) * 10.0 ** rng.uniform(0, 12, 20):
            t = float(t)
            z = s.zero_until(t)
            assert z >= t
            if z == t:
                continue
            hi = min(z, t + 1e6)
            pts = np.sort(np.concatenate([[t, hi], t + (hi - t) * rng.random(40)]))
            assert np.all(s.integral(pts[:-1], pts[1:]) == 0.0)
            assert float(s.integral(t, hi)) == 0.0
            assert np.all(s.rate(pts[:-1]) == 0.0)
            g = np.random.default_rng(0)
            before = g.bit_generator.state
            assert s.sample_times(g, t, hi).size == 0 and g.bit_generator.state == before  # nothing drawn
            checked += 1
    assert checked > 50
