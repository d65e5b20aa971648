"""The shared input checks (flowgym/sim/_checks.py): what each accepts, at its boundaries, and the
messages that name the field and the value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowgym.sim._checks import MAX_OUTPUT_SLOTS, calendar_span, is_count, is_real, non_negative, positive, positive_int


def test_non_negative_accepts_zero_and_finite_numbers():
    assert non_negative("rate", 0) == 0.0 and isinstance(non_negative("rate", 0), float)
    assert non_negative("rate", 2.5) == 2.5
    assert non_negative("rate", np.int64(3)) == 3.0
    # text is refused, even text float() reads: a number written as "1.5" in a scenario file is a mistake
    for bad in (-1e-300, -1, math.inf, math.nan, True, False, np.bool_(True), None, "x", "1.5", b"1", [1.0], 10**400):
        with pytest.raises(ValueError, match=r"^rate must be a non-negative finite number, got "):
            non_negative("rate", bad)


def test_positive_refuses_zero_naming_the_field():
    assert positive("scale", 1e-300) == 1e-300
    assert positive("scale", 7) == 7.0
    with pytest.raises(ValueError, match=r"^scale must be positive, got 0$"):
        positive("scale", 0)
    with pytest.raises(ValueError, match=r"^scale must be positive, got 0.0$"):
        positive("scale", 0.0)
    with pytest.raises(ValueError, match=r"^scale must be a non-negative finite number, got -2$"):
        positive("scale", -2)


def test_positive_int_accepts_whole_numbers_from_one():
    assert positive_int("n", 1) == 1 and isinstance(positive_int("n", 1), int)
    assert positive_int("n", 2.0) == 2 and isinstance(positive_int("n", 2.0), int)
    assert positive_int("n", np.int32(5)) == 5
    for bad in (0, 0.0, -1, 1.5, 0.999, True, np.bool_(True), math.inf, math.nan, None, "2", "2.5", [1]):
        with pytest.raises(ValueError, match=r"^n must be a positive integer, got "):
            positive_int("n", bad)


def test_calendar_span_is_the_smaller_of_M_and_the_longest_output():
    assert calendar_span(100, None) == 100
    assert calendar_span(100, 30) == 30
    assert calendar_span(30, 100) == 30
    assert calendar_span(100, 100) == 100
    assert MAX_OUTPUT_SLOTS == 16_777_216  # 2**24 tokens: 128 MiB per int64 table
    assert calendar_span(2**40, MAX_OUTPUT_SLOTS) == MAX_OUTPUT_SLOTS  # the limit itself is schedulable
    assert calendar_span(MAX_OUTPUT_SLOTS, None) == MAX_OUTPUT_SLOTS
    with pytest.raises(ValueError, match=r"^outputs of up to 16777217 tokens \(the workload's longest output "
                       r"16777217, M=1099511627776\) are beyond what the engine schedules: at most 16777216"):
        calendar_span(2**40, MAX_OUTPUT_SLOTS + 1)
    with pytest.raises(ValueError, match=r"longest output unknown, M=16777217\)"):
        calendar_span(MAX_OUTPUT_SLOTS + 1, None)


def test_is_real_takes_python_and_numpy_numbers_and_no_bool_string_or_complex():
    for v in (0, -3, 2.5, math.nan, math.inf, np.int32(4), np.float32(1.5), np.float64(2.0), np.uint8(1)):
        assert is_real(v), v
    for v in (True, False, np.bool_(True), "1.0", 1j, np.complex64(1), None, [1.0], np.array([1.0]),
              np.timedelta64(5, "s")):
        assert not is_real(v), v


def test_a_numpy_float32_setting_is_taken_where_a_float_is():
    """The shared predicate: settings that took a Python float take a numpy float32 too (they did not all)."""
    from flowgym.agents.adaptive import TwoAnchorBudget
    from flowgym.envs.flow_control import FlowControlConfig

    assert TwoAnchorBudget(k_rate=np.float32(1.5)).k_rate == 1.5
    with pytest.raises(ValueError, match="k_rate"):
        TwoAnchorBudget(k_rate=np.bool_(True))
    from flowgym.envs.flow_control import DEFAULT_REWARD_WEIGHTS

    key = sorted(DEFAULT_REWARD_WEIGHTS)[0]
    FlowControlConfig(reward_weights={key: np.float32(0.5)}).validate()  # refused before (not a float subclass)
    # and the reward stays in double precision
    from flowgym.envs.flow_control import FlowControlEnv

    env = FlowControlEnv(reward_weights={"in_system": np.float32(0.1)}, horizon=5)
    env.reset(seed=0)
    _, r, *_ = env.step(4)
    env2 = FlowControlEnv(reward_weights={"in_system": float(np.float32(0.1))}, horizon=5)  # the same number
    env2.reset(seed=0)
    _, r2, *_ = env2.step(4)
    assert r == r2 and type(r) is float


def test_is_count_takes_integers_from_zero_and_nothing_else():
    """A budget or a horizon: a Python or numpy integer >= 0; no bool, no float however whole, no string."""
    for ok in (0, 1, 2**62, np.int64(5), np.uint8(0)):
        assert is_count(ok), ok
    for bad in (-1, np.int64(-1), True, np.bool_(False), 1.0, np.float64(2), "3", None, [1], np.array([1])):
        assert not is_count(bad), bad
