"""Batch latency models (``flowgym/sim/latency.py``): their bounds, exactly at the boundary."""

from __future__ import annotations

import pytest

from flowgym.sim.latency import MAX_ITERATION_SECONDS, CallableLatency, LinearLatency


def test_a_coefficient_of_exactly_the_largest_iteration_is_accepted():
    assert MAX_ITERATION_SECONDS == 3600.0
    m = LinearLatency(c0=3600.0, c_prefill=3600.0)
    assert m.duration(0, 0, 0, 0) == 3600.0 and m.c_prefill == 3600.0
    with pytest.raises(ValueError, match=r"latency coefficient c_decode = 3600.5 seconds"):
        LinearLatency(c0=1.0, c_decode=3600.5)


def slow_model(P, D, K, B):
    return 0.001 * (P + D)


def test_a_callable_may_return_any_duration_in_1e_6_to_3600_seconds():
    assert CallableLatency(lambda *a: 0.5).duration(1, 2, 3, 4) == 0.5  # below one second is fine
    assert CallableLatency(lambda *a: 3600.0).duration(1, 2, 3, 4) == 3600.0  # the largest, inclusive
    assert CallableLatency(lambda *a: 1e-6).duration(1, 2, 3, 4) == 1e-6  # the smallest, inclusive
    for bad in (0.0, -1.0, 9.99e-7, 5e-324, 3600.0001, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="need a duration of 1e-06 to 3600 seconds"):
            CallableLatency(lambda *a, d=bad: d).duration(1, 2, 3, 4)


def test_a_callables_label_is_its_name():
    assert CallableLatency(slow_model).label == "'slow_model'"
    assert CallableLatency(slow_model).duration(10, 2, 0, 3) == pytest.approx(0.012)

    class Model:
        def __call__(self, P, D, K, B):
            return 1.0

    # an instance has no __qualname__ of its own: its class's
    assert CallableLatency(Model()).label.endswith("Model'")
