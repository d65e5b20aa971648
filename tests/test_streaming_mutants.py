"""Rules of ``flowgym/sim/streaming.py`` its mutation run found unpinned (docs/testing.md)."""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.sim.streaming import (
    DECIMATED_POINTS,
    SKETCH_EXACT_BELOW,
    STREAM_WINDOW,
    QuantileSketch,
    StreamTotals,
)


def _records(usages, t0=0):
    # SlotStats-shaped rows: (t, usage, admitted, evicted, wasted, completed, queue_len, active)
    return [(t0 + i, int(u), 0, 0, 0, 0, 0, 0) for i, u in enumerate(usages)]


def test_documented_sizes():
    assert STREAM_WINDOW == 4096 and DECIMATED_POINTS == 1024 and SKETCH_EXACT_BELOW == 65536
    st = StreamTotals(8, timed=False)
    assert st.window == 4096 and st.dec.size == 2048
    assert QuantileSketch(integers=True).exact_below == 65536


def test_the_window_keeps_the_last_4096_slots():
    st = StreamTotals(8, timed=False)
    st.fold_slots(_records(range(5000)), None)
    rows, _ = st.window_rows()
    assert rows.shape == (4096, 8) and rows[0, 0] == 5000 - 4096 and rows[-1, 0] == 4999


def test_usage_maximum_of_an_idle_run_is_zero():
    st = StreamTotals(8, timed=False)
    st.fold_slots(_records([0, 0, 0]), None)
    assert st.usage_moments(100) == (0.0, 0.0, 0.0)


def test_the_decimated_series_starts_at_one_slot_per_point():
    # fewer slots than 2 x 1024: one point per slot, the usage itself (over M = 10)
    st = StreamTotals(8, timed=False)
    st.fold_slots(_records(range(10)), None)
    np.testing.assert_allclose(st.decimated_usage(10), np.arange(10) / 10)
    # 2048 slots fill the buffer: halved to 1024 means of 2 slots, blocks of 2 from then on
    st = StreamTotals(8, timed=False)
    st.fold_slots(_records(range(2048)), None)
    assert st.dec_block == 2
    np.testing.assert_allclose(st.decimated_usage(1), np.arange(0, 2048, 2) + 0.5)


def test_exact_integer_quantiles_below_2_16():
    # 65535 is counted exactly, 65536 in a log bucket (relative error up to 1e-3)
    s = QuantileSketch(integers=True)
    s.add(np.array([65535]))
    assert s.quantile(0.5) == 65535.0
    s = QuantileSketch(integers=True)
    s.add(np.array([65536]))
    assert s.quantile(0.5) != 65536.0 and s.quantile(0.5) == pytest.approx(65536, rel=1e-3)


def test_quantile_at_the_ends_is_the_extreme_values():
    s = QuantileSketch(integers=True)
    s.add(np.array([3, 1, 2]))
    assert s.quantile(0.0) == 1.0 and s.quantile(1.0) == 3.0 and s.quantile(0.5) == 2.0
    f = QuantileSketch(integers=False)
    f.add(np.array([0.0, 10.0]))
    assert f.quantile(0.0) == 0.0 and f.quantile(1.0) == pytest.approx(10.0, rel=1e-3)


def test_a_value_of_exactly_1e_12_is_not_zero():
    # float mode counts values below 1e-12 as 0; 1e-12 itself is bucketed (within 1e-3 relative)
    s = QuantileSketch()
    s.add(np.array([1e-12]))
    assert s.quantile(0.5) == pytest.approx(1e-12, rel=1e-3, abs=0)


def test_sketch_memory_is_both_counter_arrays():
    # integers 0..1 exactly (2 counters, 16 bytes) and one bucket for 70,000 (8 bytes)
    s = QuantileSketch(integers=True)
    s.add(np.array([1, 70_000]))
    assert s.nbytes == 24


def test_one_finished_request_is_folded():
    st = StreamTotals(8, timed=False)
    st.fold_requests(np.array([5]), np.array([3]))
    assert (st.done, st.latency, st.output_tokens) == (1, 5, 3)
    assert st.sketch.quantile(0.5) == 5.0


def test_sketch_refuses_non_finite_and_negative_values():
    for bad in ([float("nan")], [float("inf")], [-1.0]):
        with pytest.raises(ValueError, match="finite and non-negative"):
            QuantileSketch().add(np.array(bad))
    with pytest.raises(ValueError, match="finite and non-negative"):
        QuantileSketch(integers=True).add(np.array([-1]))


def test_sketch_counts_every_zero_and_interpolates_near_the_top():
    s = QuantileSketch()
    s.add(np.array([0.0, 0.0, 5.0]))  # two zeros of three: the median is 0
    assert s.quantile(0.5) == 0.0
    i = QuantileSketch(integers=True)
    i.add(np.array([1, 2, 3]))
    # rank (3 - 1) * 0.75 = 1.5: halfway between 2 and 3, as numpy.percentile
    assert i.quantile(0.75) == 2.5 == np.percentile([1, 2, 3], 75)


def test_sketch_grows_to_the_next_bucket_above():
    s = QuantileSketch()
    s.add(np.array([1.0]))
    v = 1.0 * s.gamma**0.5  # the next bucket above the only one held (index ceil(0.5) = 1)
    s.add(np.array([v]))
    # each within relative alpha = 1e-3 of its value (1.0 is a bucket edge: exactly 1e-3 below)
    assert s.quantile(1.0) == pytest.approx(v, rel=1.01e-3) and s.quantile(0.0) == pytest.approx(1.0, rel=1.01e-3)
    assert s.quantile(1.0) > s.quantile(0.0)


def test_stream_totals_memory_by_hand():
    # ring 4096 x 8 int64 (262,144 bytes) + ring times 4096 float64 (32,768) + decimated 2048 float64
    # (16,384) + an empty sketch (0)
    assert StreamTotals(8, timed=False).nbytes == 262_144 + 32_768 + 16_384
    st = StreamTotals(8, timed=False)
    st.fold_requests(np.array([3]), np.array([1]))  # the sketch's exact counters for 0..3: 32 bytes
    assert st.sketch.nbytes == 32 and st.nbytes == 262_144 + 32_768 + 16_384 + 32


def test_decimation_carries_a_partial_block_across_folds():
    # after 2048 slots the blocks are 2 slots wide; folding 3 slots (10, 20, 30) completes one block
    # (15) and carries 30; folding 40, 50, 60 completes the next two (35, 55)
    st = StreamTotals(8, timed=False)
    st.fold_slots(_records([0] * 2048), None)
    st.fold_slots(_records([10, 20, 30], 2048), None)
    st.fold_slots(_records([40, 50, 60], 2051), None)
    np.testing.assert_allclose(st.decimated_usage(1)[-3:], [15.0, 35.0, 55.0])
    assert st.dec_n == 1027
