"""Workloads (``flowgym.sim.workloads``): determinism, statistics, traces, CSV errors, mapping form."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowgym
from flowgym.sim import theory
from flowgym.sim.workloads import (
    CHUNK_SLOTS,
    EmpiricalLengths,
    IIDPoisson,
    LengthDistribution,
    LogNormalLengths,
    MultiClassPoisson,
    Requests,
    Trace,
    TraceError,
    make_workload,
    request_work,
)

PAPER = [(10, 20), (10, 40), (10, 60)]


def _chunks(w, seed, n_chunks=4):
    rng = np.random.default_rng(seed)
    return [w.sample(rng, k * CHUNK_SLOTS, (k + 1) * CHUNK_SLOTS) for k in range(n_chunks)]


def _concat(reqs):
    return Requests(*(np.concatenate([getattr(r, f) for r in reqs]) for f in Requests._fields))


def _assert_same_requests(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        for f in Requests._fields:
            np.testing.assert_array_equal(getattr(ra, f), getattr(rb, f), err_msg=f)


def _differ(a, b):
    ca, cb = _concat(a), _concat(b)
    if ca.arrival.size != cb.arrival.size:
        return True
    return any(not np.array_equal(getattr(ca, f), getattr(cb, f)) for f in Requests._fields)


# --------------------------------------------------------------------------- MultiClassPoisson


def test_poisson_same_seed_identical_over_chunks():
    w = MultiClassPoisson(PAPER, [0.5, 1.0, 2.0])
    a, b = _chunks(w, 123), _chunks(w, 123)
    _assert_same_requests(a, b)
    assert sum(r.arrival.size for r in a) > 0
    # dtypes are int64 as documented
    for f in Requests._fields:
        assert getattr(a[0], f).dtype == np.int64


def test_poisson_different_seeds_differ():
    w = MultiClassPoisson(PAPER, 1.0)
    assert _differ(_chunks(w, 1), _chunks(w, 2))


def test_poisson_arrivals_sorted_and_in_window():
    w = MultiClassPoisson(PAPER, [0.7, 1.3, 3.0])
    rng = np.random.default_rng(7)
    for t0, t1 in [(0, 256), (256, 512), (512, 768)]:
        r = w.sample(rng, t0, t1)
        assert r.arrival.size > 0
        assert np.all(np.diff(r.arrival) >= 0)
        assert r.arrival.min() >= t0 and r.arrival.max() < t1
        assert len({r.arrival.size, r.prompt_len.size, r.output_len.size, r.cls.size}) == 1


def test_poisson_class_lengths_attached():
    classes = [(3, 5), (7, 11), (13, 17)]
    w = MultiClassPoisson(classes, [1.0, 2.0, 0.5])
    r = _concat(_chunks(w, 0))
    c = np.asarray(classes)
    assert set(np.unique(r.cls).tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(r.prompt_len, c[r.cls, 0])
    np.testing.assert_array_equal(r.output_len, c[r.cls, 1])


def test_poisson_per_class_empirical_rates():
    rates = np.array([0.3, 1.5, 4.0])
    w = MultiClassPoisson(PAPER, rates)
    n_chunks = 40
    r = _concat(_chunks(w, 2024, n_chunks))
    n_slots = n_chunks * CHUNK_SLOTS
    for k, lam in enumerate(rates):
        emp = np.sum(r.cls == k) / n_slots
        se = math.sqrt(lam / n_slots)
        assert abs(emp - lam) < 5 * se, (k, emp, lam)
    # per-slot count variance ~ lambda (Poisson), total rate
    counts = np.bincount(r.arrival, minlength=n_slots)
    assert abs(counts.mean() - rates.sum()) < 5 * math.sqrt(rates.sum() / n_slots)
    assert abs(counts.var() / rates.sum() - 1) < 0.1


def test_poisson_zero_rate_class_never_arrives():
    w = MultiClassPoisson(PAPER, [0.0, 2.0, 0.0])
    r = _concat(_chunks(w, 5))
    assert r.arrival.size > 0
    assert set(np.unique(r.cls).tolist()) == {1}


def test_poisson_rates_scalar_or_list():
    ws = MultiClassPoisson(PAPER, 2.5)
    np.testing.assert_array_equal(ws.rates, [2.5, 2.5, 2.5])
    wl = MultiClassPoisson(PAPER, [2.5, 2.5, 2.5])
    np.testing.assert_array_equal(wl.rates, [2.5, 2.5, 2.5])
    _assert_same_requests(_chunks(ws, 9), _chunks(wl, 9))
    wt = MultiClassPoisson(PAPER, (1, 2, 3))
    np.testing.assert_array_equal(wt.rates, [1.0, 2.0, 3.0])
    wa = MultiClassPoisson(PAPER, np.array([1, 2, 3]))
    np.testing.assert_array_equal(wa.rates, [1.0, 2.0, 3.0])
    assert ws.num_classes == 3
    assert ws.arrival_rate() == pytest.approx(7.5)


def test_poisson_load():
    rates = [0.5, 1.25, 2.0]
    w = MultiClassPoisson(PAPER, rates)
    M = 16492
    expected = sum(lam * (l * o + (o + o * o) / 2) for lam, (l, o) in zip(rates, PAPER)) / M
    assert w.load(M) == pytest.approx(expected, rel=1e-12)
    assert w.load(M) == pytest.approx(theory.load(M, rates, PAPER), rel=1e-12)
    # the paper's lambda = 5 per class
    assert MultiClassPoisson(PAPER, 5).load(16492) * 16492 == pytest.approx(20300)
    np.testing.assert_allclose(w.class_work(), [410, 1220, 2430])
    assert w.max_request_tokens() == 70


# --------------------------------------------------------------------------- IIDPoisson + lengths


def test_request_work_formula():
    assert request_work(10, 20) == 410.0
    np.testing.assert_allclose(request_work(np.array([10, 10]), np.array([40, 60])), [1220, 2430])
    assert request_work(1, 1) == 2.0


def test_iid_empirical_lengths_and_frequencies():
    pairs = [(1, 1), (2, 3), (5, 8), (100, 100)]
    weights = [1.0, 2.0, 7.0, 0.0]
    lengths = EmpiricalLengths(pairs, weights)
    w = IIDPoisson(3.0, lengths)
    r = _concat(_chunks(w, 11, 40))
    n = r.arrival.size
    assert n > 20000
    assert np.all(r.cls == -1)
    assert np.all(np.diff(r.arrival) >= 0)
    assert r.prompt_len.min() >= 1 and r.output_len.min() >= 1
    p = np.asarray(weights) / sum(weights)
    for (l, o), pk in zip(pairs, p):
        emp = np.mean((r.prompt_len == l) & (r.output_len == o))
        se = math.sqrt(max(pk * (1 - pk), 1e-12) / n)
        assert abs(emp - pk) < 5 * se + 1e-12, ((l, o), emp, pk)
    # every sampled pair comes from the table
    table = {tuple(x) for x in pairs}
    assert {(int(a), int(b)) for a, b in zip(r.prompt_len, r.output_len)} <= table
    assert lengths.max_tokens() == 13  # the zero-weight (100, 100) can never appear
    # arrival rate
    assert abs(n / (40 * CHUNK_SLOTS) - 3.0) < 5 * math.sqrt(3.0 / (40 * CHUNK_SLOTS))


def test_empirical_mean_work_exact():
    pairs = [(1, 1), (2, 3), (5, 8)]
    lengths = EmpiricalLengths(pairs, [1, 1, 2])
    expected = (2.0 + (6 + 6) + 2 * (40 + 36)) / 4
    assert lengths.mean_work() == pytest.approx(expected)
    assert IIDPoisson(2.0, lengths).load(100) == pytest.approx(2.0 * expected / 100)
    # uniform weights by default
    assert EmpiricalLengths(pairs).mean_work() == pytest.approx((2 + 12 + 76) / 3)


def test_iid_lognormal_lengths_within_bounds():
    lengths = LogNormalLengths(5, 8, prompt_sigma=2.0, output_sigma=2.0, max_prompt=50, max_output=60)
    l, o = lengths.sample(np.random.default_rng(0), 50_000)
    assert l.dtype == np.int64 and o.dtype == np.int64
    assert l.min() == 1 and l.max() == 50  # both clips reached with sigma = 2
    assert o.min() == 1 and o.max() == 60
    assert lengths.max_tokens() == 110
    w = IIDPoisson(2.0, lengths)
    r = _concat(_chunks(w, 3))
    assert r.prompt_len.min() >= 1 and r.prompt_len.max() <= 50
    assert r.output_len.min() >= 1 and r.output_len.max() <= 60
    assert np.all(r.cls == -1)


@pytest.mark.parametrize("median,mean", [(50.0, 60.0), (200.0, 300.0)])
def test_lognormal_fit_reproduces_median_and_mean(median, mean):
    lengths = LogNormalLengths(
        median, median, prompt_mean=mean, output_mean=mean, max_prompt=100_000, max_output=100_000
    )
    assert lengths.prompt_sigma == pytest.approx(math.sqrt(2 * math.log(mean / median)))
    n = 200_000
    l, o = lengths.sample(np.random.default_rng(42), n)
    for x in (l, o):
        assert np.median(x) == pytest.approx(median, abs=1.0)
        se = x.std() / math.sqrt(n)
        assert abs(x.mean() - mean) < max(5 * se, 0.002 * mean), (x.mean(), mean)


def test_lognormal_mean_equal_median_is_degenerate():
    lengths = LogNormalLengths(30, 40, prompt_mean=30, output_mean=40)
    assert lengths.prompt_sigma == 0 and lengths.output_sigma == 0
    l, o = lengths.sample(np.random.default_rng(0), 100)
    assert np.all(l == 30) and np.all(o == 40)
    assert lengths.mean_work() == pytest.approx(request_work(30, 40))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(prompt_median=50, output_median=80, prompt_mean=70, output_mean=120, max_prompt=4096, max_output=4096),
        # heavy clipping: the exact pmf must account for it
        dict(prompt_median=20, output_median=50, prompt_sigma=1.0, output_sigma=1.2, max_prompt=40, max_output=80),
    ],
)
def test_lognormal_mean_work_matches_monte_carlo(kwargs):
    lengths = LogNormalLengths(**kwargs)
    l, o = lengths.sample(np.random.default_rng(2025), 400_000)
    w = request_work(l, o)
    se = w.std() / math.sqrt(w.size)
    assert abs(w.mean() - lengths.mean_work()) < 5 * se, (w.mean(), lengths.mean_work(), se)
    assert IIDPoisson(1.5, lengths).mean_work() == lengths.mean_work()
    assert IIDPoisson(1.5, lengths).load(1000) == pytest.approx(1.5 * lengths.mean_work() / 1000)


def test_lognormal_clipped_mean_work_below_unclipped():
    clipped = LogNormalLengths(20, 50, prompt_sigma=1.0, output_sigma=1.2, max_prompt=40, max_output=80)
    free = LogNormalLengths(20, 50, prompt_sigma=1.0, output_sigma=1.2, max_prompt=100_000, max_output=100_000)
    assert clipped.mean_work() < free.mean_work()
    assert clipped.mean_work() <= request_work(40, 80)


def test_iid_same_seed_identical_and_seeds_differ():
    w = IIDPoisson(2.0, {"kind": "lognormal", "prompt_median": 30, "output_median": 60,
                         "prompt_sigma": 0.5, "output_sigma": 0.7})
    _assert_same_requests(_chunks(w, 8), _chunks(w, 8))
    assert _differ(_chunks(w, 8), _chunks(w, 9))


# --------------------------------------------------------------------------- Trace


def test_trace_from_arrays_stable_sort_and_row():
    arrival = [5, 0, 3, 0, 5, 1]
    prompt = [1, 2, 3, 4, 5, 6]
    output = [10, 20, 30, 40, 50, 60]
    tr = Trace(arrival, prompt, output)
    assert len(tr) == 6
    np.testing.assert_array_equal(tr.arrival, [0, 0, 1, 3, 5, 5])
    # stable: rows 1 before 3 (both slot 0), rows 0 before 4 (both slot 5)
    np.testing.assert_array_equal(tr.row, [1, 3, 5, 2, 0, 4])
    np.testing.assert_array_equal(tr.prompt_len, np.asarray(prompt)[tr.row])
    np.testing.assert_array_equal(tr.output_len, np.asarray(output)[tr.row])
    np.testing.assert_array_equal(np.asarray(arrival)[tr.row], tr.arrival)
    assert np.all(tr.cls == -1)
    assert tr.classes is None and tr.num_classes == 0
    assert tr.finite
    assert tr.last_arrival == 5
    assert tr.max_request_tokens() == 66


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 50), st.integers(1, 50)), min_size=1, max_size=40))
def test_trace_row_maps_back_property(rows):
    a, l, o = (list(x) for x in zip(*rows))
    tr = Trace(a, l, o)
    assert sorted(tr.row.tolist()) == list(range(len(rows)))
    assert np.all(np.diff(tr.arrival) >= 0)
    for i, r in enumerate(tr.row):
        assert (tr.arrival[i], tr.prompt_len[i], tr.output_len[i]) == rows[r]
    # stability: equal arrivals keep input order
    for i in range(len(rows) - 1):
        if tr.arrival[i] == tr.arrival[i + 1]:
            assert tr.row[i] < tr.row[i + 1]


def test_trace_with_classes():
    tr = Trace([2, 0, 1, 0], [10, 20, 10, 30], [5, 6, 7, 8], cls=[0, 1, 0, 1])
    np.testing.assert_array_equal(tr.cls, [1, 1, 0, 0])
    assert tr.num_classes == 2
    assert tr.classes.shape == (2, 2)
    np.testing.assert_array_equal(tr.classes[0], [10, 6])  # int medians of (10, 10), (5, 7)
    tr3 = Trace([0], [1], [1], cls=[0], num_classes=3)
    assert tr3.num_classes == 3
    with pytest.raises(TraceError, match="num_classes"):
        Trace([0, 0], [1, 1], [1, 1], cls=[0, 2], num_classes=2)


def test_trace_sample_windows():
    tr = Trace([0, 3, 3, 7, 10, 255, 256, 600], [1] * 8, [2] * 8)
    rng = np.random.default_rng(0)
    r = tr.sample(rng, 0, 4)
    np.testing.assert_array_equal(r.arrival, [0, 3, 3])
    r = tr.sample(rng, 4, 10)
    np.testing.assert_array_equal(r.arrival, [7])
    r = tr.sample(rng, 10, 11)
    np.testing.assert_array_equal(r.arrival, [10])
    assert tr.sample(rng, 11, 255).arrival.size == 0
    chunks = [tr.sample(rng, k * CHUNK_SLOTS, (k + 1) * CHUNK_SLOTS) for k in range(4)]
    assert [c.arrival.size for c in chunks] == [6, 1, 1, 0]
    np.testing.assert_array_equal(_concat(chunks).arrival, tr.arrival)
    # deterministic whatever the generator
    _assert_same_requests(
        [tr.sample(np.random.default_rng(1), 0, 1000)], [tr.sample(np.random.default_rng(2), 0, 1000)]
    )


def test_trace_load():
    a, l, o = [0, 1, 4, 9], [10, 10, 20, 5], [20, 40, 10, 1]
    tr = Trace(a, l, o)
    lam = 4 / 10
    ew = np.mean([l_ * o_ + (o_ + o_ * o_) / 2 for l_, o_ in zip(l, o)])
    assert tr.arrival_rate() == pytest.approx(lam)
    assert tr.mean_work() == pytest.approx(ew)
    assert tr.load(1000) == pytest.approx(lam * ew / 1000)
    empty = Trace([], [], [])
    assert len(empty) == 0 and empty.load(1000) is None and empty.last_arrival == -1


def _write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_trace_from_csv_default_columns(tmp_path):
    p = _write(tmp_path, "arrival,prompt_len,output_len,extra\n3,10,20,x\n0,11,21,y\n\n0,12,22,z\n")
    tr = Trace.from_csv(p)
    np.testing.assert_array_equal(tr.arrival, [0, 0, 3])
    np.testing.assert_array_equal(tr.prompt_len, [11, 12, 10])
    np.testing.assert_array_equal(tr.output_len, [21, 22, 20])
    np.testing.assert_array_equal(tr.row, [1, 2, 0])  # index among data rows (blank line skipped)
    assert tr.classes is None
    # str path works too
    tr2 = Trace.from_csv(str(p))
    np.testing.assert_array_equal(tr2.arrival, tr.arrival)


def test_trace_from_csv_custom_columns_and_class(tmp_path):
    p = _write(tmp_path, " t , in ,out,k\n1,5,6,1\n0,7,8,0\n2,9,10,1\n")
    tr = Trace.from_csv(p, arrival="t", prompt_len="in", output_len="out", cls_column="k")
    np.testing.assert_array_equal(tr.arrival, [0, 1, 2])
    np.testing.assert_array_equal(tr.prompt_len, [7, 5, 9])
    np.testing.assert_array_equal(tr.output_len, [8, 6, 10])
    np.testing.assert_array_equal(tr.cls, [0, 1, 1])
    assert tr.num_classes == 2
    # without the class column the class is ignored
    tr_nc = Trace.from_csv(p, arrival="t", prompt_len="in", output_len="out")
    assert np.all(tr_nc.cls == -1) and tr_nc.num_classes == 0


def test_trace_from_csv_header_only_is_empty_trace(tmp_path):
    tr = Trace.from_csv(_write(tmp_path, "arrival,prompt_len,output_len\n"))
    assert len(tr) == 0


# --------------------------------------------------------------------------- Trace errors

HDR = "arrival,prompt_len,output_len\n"


@pytest.mark.parametrize(
    "body,column,row",
    [
        ("0,1,1\n-1,2,2\n", "arrival", 3),
        ("-3,1,1\n", "arrival", 2),
        ("0,0,1\n", "prompt_len", 2),
        ("0,1,1\n1,-2,1\n", "prompt_len", 3),
        ("0,1,0\n", "output_len", 2),
        ("0,1,1\n0,1,1\n5,1,-7\n", "output_len", 4),
        ("0,1,1\n1,abc,2\n", "prompt_len", 3),
        ("abc,1,1\n", "arrival", 2),
        ("0,1,1\n1,2,nan\n", "output_len", 3),
        ("0,1,inf\n1,2,2\n", "output_len", 2),
        ("0,1,1\n-inf,1,1\n", "arrival", 3),
        ("0,1.5,1\n", "prompt_len", 2),
        ("0,1,1\n2.25,1,1\n", "arrival", 3),
        ("0,1,1\n1,1,\n", "output_len", 3),
    ],
)
def test_trace_csv_bad_value_names_column_and_row(tmp_path, body, column, row):
    p = _write(tmp_path, HDR + body)
    with pytest.raises(TraceError) as ei:
        Trace.from_csv(p)
    msg = str(ei.value)
    assert f"'{column}'" in msg, msg
    assert f"row {row}" in msg, msg
    assert isinstance(ei.value, ValueError)


def test_trace_csv_blank_lines_still_count_rows(tmp_path):
    p = _write(tmp_path, HDR + "0,1,1\n\n1,1,0\n")
    with pytest.raises(TraceError, match=r"'output_len'.*row 4"):
        Trace.from_csv(p)


def test_lengths_from_csv_asks_a_negative_prompt_for_a_length(tmp_path):
    """The prompt column is also read as the arrivals there (which may be 0): its refusal asks for at least 1, as a
    length's does, not for a non-negative value."""
    from flowgym.sim.workloads import lengths_from_csv

    with pytest.raises(TraceError, match=r"column 'prompt_len', row 2: '-3' must be at least 1"):
        lengths_from_csv(_write(tmp_path, HDR + "0,-3,5\n"))


def test_trace_csv_custom_column_names_in_errors(tmp_path):
    p = _write(tmp_path, "t,in,out\n0,1,1\n1,0,2\n")
    with pytest.raises(TraceError) as ei:
        Trace.from_csv(p, arrival="t", prompt_len="in", output_len="out")
    msg = str(ei.value)
    assert "'in'" in msg and "row 3" in msg, msg
    p = _write(tmp_path, "a,b,c,k\n0,1,1,0\n1,1,1,-1\n", "k.csv")
    with pytest.raises(TraceError, match=r"'k'.*row 3"):
        Trace.from_csv(p, arrival="a", prompt_len="b", output_len="c", cls_column="k")


def test_trace_csv_error_names_file_column_when_names_overlap_fields(tmp_path):
    # the file's "prompt_len" column holds the arrivals; "x" holds the prompt lengths.
    # A bad arrival must be reported in the file's column 'prompt_len', not 'x'.
    p = _write(tmp_path, "prompt_len,x,arrival\n0,1,1\n-1,2,2\n")
    with pytest.raises(TraceError) as ei:
        Trace.from_csv(p, arrival="prompt_len", prompt_len="x", output_len="arrival")
    msg = str(ei.value)
    assert "row 3" in msg, msg
    assert "column 'prompt_len'" in msg, msg


@pytest.mark.parametrize(
    "header,missing",
    [
        ("arrival,prompt_len\n0,1\n", "output_len"),
        ("prompt_len,output_len\n1,1\n", "arrival"),
        ("arrival,output_len\n0,1\n", "prompt_len"),
    ],
)
def test_trace_csv_missing_column(tmp_path, header, missing):
    p = _write(tmp_path, header)
    with pytest.raises(TraceError, match=f"'{missing}'"):
        Trace.from_csv(p)


def test_trace_csv_missing_custom_and_class_column(tmp_path):
    p = _write(tmp_path, HDR + "0,1,1\n")
    with pytest.raises(TraceError, match="'time'"):
        Trace.from_csv(p, arrival="time")
    with pytest.raises(TraceError, match="'klass'"):
        Trace.from_csv(p, cls_column="klass")


def test_trace_csv_empty_file(tmp_path):
    p = _write(tmp_path, "")
    with pytest.raises(TraceError, match="empty"):
        Trace.from_csv(p)


def test_trace_csv_short_row(tmp_path):
    p = _write(tmp_path, HDR + "0,1,1\n1,2\n")
    with pytest.raises(TraceError) as ei:
        Trace.from_csv(p)
    assert "row 3" in str(ei.value)


def test_trace_csv_missing_file(tmp_path):
    with pytest.raises(TraceError, match="nope.csv"):
        Trace.from_csv(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    "kwargs,column,index",
    [
        (dict(arrival=[0, -1], prompt_len=[1, 1], output_len=[1, 1]), "arrival", 1),
        (dict(arrival=[0, 1], prompt_len=[1, 0], output_len=[1, 1]), "prompt_len", 1),
        (dict(arrival=[0, 1], prompt_len=[1, 1], output_len=[0, 1]), "output_len", 0),
        (dict(arrival=[0, 1], prompt_len=[1, 1], output_len=[1, 1.5]), "output_len", 1),
        (dict(arrival=[0, float("nan")], prompt_len=[1, 1], output_len=[1, 1]), "arrival", 1),
        (dict(arrival=[0, 1], prompt_len=[1, float("inf")], output_len=[1, 1]), "prompt_len", 1),
        (dict(arrival=[0, 1], prompt_len=["1", "abc"], output_len=[1, 1]), "prompt_len", 1),
        (dict(arrival=[0, 1], prompt_len=[1, 1], output_len=[1, 1], cls=[0, -1]), "cls", 1),
    ],
)
def test_trace_arrays_bad_value(kwargs, column, index):
    with pytest.raises(TraceError) as ei:
        Trace(**kwargs)
    msg = str(ei.value)
    assert f"'{column}'" in msg and f"index {index}" in msg, msg


def test_trace_arrays_length_mismatch():
    with pytest.raises(TraceError, match="length"):
        Trace([0, 1], [1, 1], [1])
    with pytest.raises(TraceError, match="cls"):
        Trace([0, 1], [1, 1], [1, 1], cls=[0])


def test_trace_error_is_value_error():
    assert issubclass(flowgym.TraceError, ValueError)
    assert flowgym.TraceError is TraceError


# --------------------------------------------------------------------------- make_workload


def _workloads(tmp_path):
    p = _write(tmp_path, "t,l,o,c\n4,10,20,1\n0,5,6,0\n300,7,8,1\n", "rt.csv")
    return [
        MultiClassPoisson(PAPER, [0.5, 1.0, 1.5]),
        MultiClassPoisson([(3, 4)], 2.0),
        IIDPoisson(2.0, EmpiricalLengths([(1, 2), (3, 4), (50, 60)], [0.2, 0.3, 0.5])),
        IIDPoisson(1.5, LogNormalLengths(40, 90, prompt_mean=60, output_mean=150, max_prompt=500, max_output=700)),
        IIDPoisson(1.0, {"kind": "lognormal", "prompt_median": 10, "output_median": 20,
                         "prompt_sigma": 0.3, "output_sigma": 0.4}),
        Trace([5, 0, 3, 0], [1, 2, 3, 4], [4, 3, 2, 1]),
        Trace([2, 0, 1], [1, 2, 3], [4, 5, 6], cls=[1, 0, 1]),
        Trace.from_csv(p, arrival="t", prompt_len="l", output_len="o", cls_column="c"),
        Trace.from_csv(_write(tmp_path, HDR + "1,2,3\n0,4,5\n", "rt2.csv")),
    ]


def test_make_workload_round_trip(tmp_path):
    for w in _workloads(tmp_path):
        spec = w.to_spec()
        text = json.dumps(spec)
        w2 = make_workload(json.loads(text))
        assert type(w2) is type(w)
        assert w2.to_spec() == spec
        _assert_same_requests(_chunks(w, 31, 3), _chunks(w2, 31, 3))
        assert w2.num_classes == w.num_classes
        assert w2.load(16492) == pytest.approx(w.load(16492))


def test_make_workload_passes_workload_through():
    w = MultiClassPoisson(PAPER, 1.0)
    assert make_workload(w) is w


def test_make_workload_round_trip_keeps_declared_num_classes():
    # a trace that declares more classes than its ids use must keep them through its mapping form
    w = Trace([0, 1], [1, 2], [3, 4], cls=[0, 0], num_classes=3)
    w2 = make_workload(json.loads(json.dumps(w.to_spec())))
    assert w2.num_classes == w.num_classes == 3


def test_make_workload_unknown_kind():
    with pytest.raises(ValueError, match="bogus"):
        make_workload({"kind": "bogus"})
    with pytest.raises(ValueError, match="kind"):
        make_workload({"classes": PAPER, "rates": 1.0})
    with pytest.raises(ValueError):
        make_workload([1, 2, 3])
    with pytest.raises(ValueError, match="kind"):
        IIDPoisson(1.0, {"kind": "weibull"})


@pytest.mark.parametrize(
    "spec,name",
    [
        ({"kind": "poisson", "classes": PAPER, "rates": 1.0, "bogus": 1}, "bogus"),
        ({"kind": "poisson", "classes": PAPER}, "rates"),
        ({"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairs": [[1, 1]]}, "extra": 0}, "extra"),
        ({"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairz": [[1, 1]]}}, "pairz"),
        ({"kind": "iid", "rate": 1.0, "lengths": {"kind": "lognormal", "prompt_median": 1,
                                                  "output_median": 2, "prompt_sigma": 1,
                                                  "output_sigma": 1, "max_tokens": 9}}, "max_tokens"),
        ({"kind": "trace", "arrival": [0], "prompt_len": [1], "output_len": [1], "weird": 3}, "weird"),
    ],
)
def test_make_workload_bad_keys(spec, name):
    with pytest.raises(ValueError, match=name):
        make_workload(spec)


def test_make_workload_trace_path_bad_key(tmp_path):
    p = _write(tmp_path, HDR + "0,1,1\n")
    with pytest.raises(ValueError, match="colour"):
        make_workload({"kind": "trace", "path": str(p), "colour": "x"})


# --------------------------------------------------------------------------- invalid parameters


@pytest.mark.parametrize(
    "classes,rates,name",
    [
        ([], 1.0, "classes"),
        ([(0, 5)], 1.0, r"classes\[0\] prompt_len"),
        ([(5, 5), (5, 0)], 1.0, r"classes\[1\] output_len"),
        ([(-3, 5)], 1.0, "prompt_len"),
        ([(3, -5)], 1.0, "output_len"),
        ([(3.5, 5)], 1.0, "prompt_len"),
        ([(3, 5, 7)], 1.0, r"classes\[0\]"),
        ([(3, 5)], -1.0, "rates"),
        ([(3, 5)], float("nan"), "rates"),
        ([(3, 5)], float("inf"), "rates"),
        ([(3, 5), (4, 6)], [1.0, -0.5], r"rates\[1\]"),
        ([(3, 5), (4, 6)], [1.0, float("nan")], r"rates\[1\]"),
        ([(3, 5), (4, 6)], [1.0], "rates"),
        ([(3, 5), (4, 6)], [1.0, 2.0, 3.0], "rates"),
        ([(3, 5)], "fast", "rates"),
    ],
)
def test_poisson_invalid_parameters(classes, rates, name):
    with pytest.raises(ValueError, match=name):
        MultiClassPoisson(classes, rates)


@pytest.mark.parametrize("rate", [-0.1, float("nan"), float("inf"), float("-inf")])
def test_iid_invalid_rate(rate):
    with pytest.raises(ValueError, match="rate"):
        IIDPoisson(rate, EmpiricalLengths([(1, 1)]))


@pytest.mark.parametrize(
    "pairs,weights,name",
    [
        ([], None, "pairs"),
        ([(0, 1)], None, r"pairs\[0\] prompt_len"),
        ([(1, 1), (1, 0)], None, r"pairs\[1\] output_len"),
        ([(1, -1)], None, "output_len"),
        ([(1, 1)], [-1.0], "weights"),
        ([(1, 1)], [float("nan")], "weights"),
        ([(1, 1), (2, 2)], [1.0], "weights"),
        ([(1, 1), (2, 2)], [0.0, 0.0], "weights"),
    ],
)
def test_empirical_invalid_parameters(pairs, weights, name):
    with pytest.raises(ValueError, match=name):
        EmpiricalLengths(pairs, weights)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(prompt_median=100, output_median=100, prompt_mean=50, output_mean=200), "prompt_mean"),
        (dict(prompt_median=100, output_median=100, prompt_mean=150, output_mean=99), "output_mean"),
        (dict(prompt_median=0, output_median=100, prompt_sigma=1, output_sigma=1), "prompt_median"),
        (dict(prompt_median=10, output_median=-1, prompt_sigma=1, output_sigma=1), "output_median"),
        (dict(prompt_median=float("nan"), output_median=1, prompt_sigma=1, output_sigma=1), "prompt_median"),
        (dict(prompt_median=10, output_median=10, prompt_sigma=-1, output_sigma=1), "prompt_sigma"),
        (dict(prompt_median=10, output_median=10, prompt_sigma=1, output_sigma=float("inf")), "output_sigma"),
        (dict(prompt_median=10, output_median=10, prompt_sigma=1, prompt_mean=20, output_sigma=1), "prompt"),
        (dict(prompt_median=10, output_median=10, prompt_sigma=1), "output"),
        (dict(prompt_median=10, output_median=10, prompt_sigma=1, output_sigma=1, max_prompt=0), "max_prompt"),
        (dict(prompt_median=10, output_median=10, prompt_sigma=1, output_sigma=1, max_output=2.5), "max_output"),
    ],
)
def test_lognormal_invalid_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LogNormalLengths(**kwargs)


# --------------------------------------------------------------------------- mixture (shifting request mix)

CHAT = {"kind": "empirical", "pairs": [[10, 10], [10, 20], [10, 30]]}
LONG = {"kind": "empirical", "pairs": [[10, 60], [10, 100], [10, 140]]}


def _mix_spec(chat=3.0, long=1.0, timed=False):
    return {"kind": "mix", "streams": [{"kind": "iid", "rate": chat, "lengths": CHAT, "timed": timed},
                                       {"kind": "iid", "rate": long, "lengths": LONG, "timed": timed}]}


def test_mixture_is_the_union_of_its_streams_shuffled_within_each_slot():
    from flowgym.sim.workloads import Mixture

    mix = make_workload(_mix_spec())
    assert isinstance(mix, Mixture) and mix.num_classes == 0
    got = mix.sample(np.random.default_rng(5), 0, 256)
    rng = np.random.default_rng(5)  # the streams draw in order from the same generator
    parts = [w.sample(rng, 0, 256) for w in mix.streams]
    want = sorted(zip(np.concatenate([p.arrival for p in parts]).tolist(),
                      np.concatenate([p.output_len for p in parts]).tolist()))
    assert sorted(zip(got.arrival.tolist(), got.output_len.tolist())) == want
    assert np.all(np.diff(got.arrival) >= 0) and np.all(got.cls == -1)
    # within a slot the streams interleave: a long request is sometimes first, sometimes not
    first_long = [got.output_len[got.arrival == t][0] >= 60 for t in range(256) if (got.arrival == t).sum() >= 2]
    assert 0 < sum(first_long) < len(first_long)
    again = mix.sample(np.random.default_rng(5), 0, 256)
    assert np.array_equal(again.arrival, got.arrival) and np.array_equal(again.output_len, got.output_len)


def test_mixture_load_rate_bounds_and_spec_round_trip():
    mix = make_workload(_mix_spec(3.0, 1.0))
    w_chat = np.mean([10 * o + (o + o * o) / 2 for o in (10, 20, 30)])
    w_long = np.mean([10 * o + (o + o * o) / 2 for o in (60, 100, 140)])
    assert mix.arrival_rate() == pytest.approx(4.0)
    assert mix.load(1000) == pytest.approx((3.0 * w_chat + 1.0 * w_long) / 1000)
    assert mix.max_request_tokens() == 150 and mix.max_output_tokens() == 140
    assert make_workload(mix.to_spec()).to_spec() == mix.to_spec()
    env = gym.make("FlowControl-v0", workload=mix.to_spec(), horizon=50)
    spec2 = gym.envs.registration.EnvSpec.from_json(env.spec.to_json())
    assert spec2.kwargs["workload"] == mix.to_spec()


def test_mixture_timed_streams_merge_by_time():
    mix = make_workload(_mix_spec(2.0, 0.5, timed=True))
    assert mix.timed
    r = mix.sample(np.random.default_rng(0), 0.0, 60.0)
    assert r.arrival.size > 0 and np.all(np.diff(r.arrival) >= 0)
    assert set(r.output_len.tolist()) <= {10, 20, 30, 60, 100, 140}


def test_adaptive_mix_phases_hold_only_their_own_requests():
    from flowgym.lab.scenarios import get_scenario

    env = gym.make("FlowControl-v0", **get_scenario("adaptive-mix").env_kwargs())
    env.reset(seed=0)
    for _ in range(2000):
        env.step(40)
    log = env.unwrapped.request_log()
    chat = log["arrival"] < 1000
    long = (log["arrival"] >= 1000) & (log["arrival"] < 2000)  # slot 2000 (chat again) has arrived too
    assert set(log["output_len"][chat].tolist()) == {10, 20, 30}
    assert set(log["output_len"][long].tolist()) == {60, 100, 140}
    assert abs(chat.sum() / 1000 - 30.0) < 1.0 and abs(long.sum() / 1000 - 2.4) < 0.2


@pytest.mark.parametrize("streams, match", [
    ([], "non-empty"),
    ("iid", "non-empty"),
    ([{"kind": "trace", "arrival": [0], "prompt_len": [1], "output_len": [1]}], r"streams\[0\] must be an endless"),
    ([{"kind": "iid", "rate": 1.0, "lengths": CHAT}, {"kind": "iid", "rate": 1.0, "lengths": CHAT,
                                                       "n_requests": 5}], r"streams\[1\] must be an endless"),
    ([{"kind": "iid", "rate": -1.0, "lengths": CHAT}], r"streams\[0\]: rate"),
    ([{"kind": "iid", "rate": 1.0, "lengths": CHAT}, {"kind": "nope"}], r"streams\[1\]: workload kind"),
    ([{"kind": "iid", "rate": 1.0, "lengths": CHAT}, {"kind": "iid", "rate": 1.0, "lengths": CHAT, "timed": True}],
     "all be in slots or all timed"),
])
def test_mixture_bad_streams_name_the_stream(streams, match):
    with pytest.raises(ValueError, match=match):
        make_workload({"kind": "mix", "streams": streams})


@pytest.mark.parametrize("spec, want", [
    ({"kind": "poisson", "classes": [[10, 20]], "rates": 2.0}, True),
    ({"kind": "iid", "rate": 3.0, "lengths": {"kind": "empirical", "pairs": [[10, 20]]}}, True),
    ({"kind": "iid", "rate": {"kind": "steps", "times": [0, 100], "rates": [3.0, 3.0], "period": 200},
      "lengths": {"kind": "empirical", "pairs": [[10, 20]]}}, True),
    ({"kind": "iid", "rate": {"kind": "steps", "times": [0, 100], "rates": [3.0, 3.1], "period": 200},
      "lengths": {"kind": "empirical", "pairs": [[10, 20]]}}, False),
    ({"kind": "iid", "rate": {"kind": "sinusoid", "mean": 3.0, "amplitude": 1.0, "period": 500},
      "lengths": {"kind": "empirical", "pairs": [[10, 20]]}}, False),
    ({"kind": "mix", "streams": [{"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairs": [[10, 20]]}},
                                 {"kind": "poisson", "classes": [[5, 50]], "rates": 0.5}]}, True),
    ({"kind": "mix", "streams": [{"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairs": [[10, 20]]}},
                                 {"kind": "iid", "rate": {"kind": "steps", "times": [0, 50], "rates": [0.0, 1.0]},
                                  "lengths": {"kind": "empirical", "pairs": [[5, 50]]}}]}, False),
    ({"kind": "trace", "arrival": [0, 1, 5], "prompt_len": [3, 4, 5], "output_len": [2, 2, 2]}, False),
])
def test_stationary_is_a_constant_rate_poisson_process(spec, want):
    assert make_workload(spec).stationary is want


def test_min_output_tokens_is_the_shortest_possible_output():
    """``min_output_tokens()`` (A_min's initial estimate): the smallest output each workload kind can produce."""
    from flowgym.sim.workloads import make_workload

    assert make_workload({"kind": "poisson", "classes": [[10, 40], [10, 20], [5, 60]], "rates": 1.0}
                         ).min_output_tokens() == 20
    emp = {"kind": "empirical", "pairs": [[3, 7], [4, 2], [9, 9]], "weights": [0.5, 0.0, 0.5]}
    assert make_workload({"kind": "iid", "rate": 1.0, "lengths": emp}).min_output_tokens() == 7  # weight 0: not
    ln = {"kind": "lognormal", "prompt_median": 50, "output_median": 80, "prompt_sigma": 0.5, "output_sigma": 0.8}
    assert make_workload({"kind": "iid", "rate": 1.0, "lengths": ln}).min_output_tokens() == 1
    assert make_workload({"kind": "iid", "rate": 1.0, "lengths": {**ln, "output_sigma": 0.0}}
                         ).min_output_tokens() == 80
    assert make_workload({"kind": "iid", "rate": 1.0, "lengths": {"kind": "lmsys-like"}}).min_output_tokens() == 1
    mix = {"kind": "mix", "streams": [{"kind": "iid", "rate": 1.0, "lengths": emp},
                                       {"kind": "iid", "rate": 1.0, "lengths": {**ln, "output_sigma": 0.0}}]}
    assert make_workload(mix).min_output_tokens() == 7
    # what never arrives does not count: a class or a stream of rate 0
    assert make_workload({"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": [0.0, 3.0, 3.0]}
                         ).min_output_tokens() == 40
    assert make_workload({"kind": "poisson", "classes": [[10, 20], [10, 40]], "rates": [0.0, 0.0]}
                         ).min_output_tokens() == 20  # nothing arrives: every class
    off = {"kind": "mix", "streams": [{"kind": "iid", "rate": 0.0, "lengths": emp}, mix["streams"][1]]}
    assert make_workload(off).min_output_tokens() == 80
    assert Trace([0, 1, 2], [5, 5, 5], [9, 4, 30]).min_output_tokens() == 4
    assert Trace([], [], []).min_output_tokens() is None
    conv = make_workload({"kind": "azure", "trace": "conv"})
    assert conv.min_output_tokens() == int(conv.output_len.min()) >= 1

    class Twenties(LengthDistribution):  # a user's distribution that says nothing of its shortest output: 1
        def sample(self, rng, n):
            return np.full(n, 5), np.full(n, 20)

        def mean_work(self):
            return 5 * 20 + (20 + 400) / 2

        def max_tokens(self):
            return 25

        def max_output(self):
            return 20

        def to_spec(self):
            return {}

    assert Twenties().min_output() == 1
    assert IIDPoisson(1.0, Twenties()).min_output_tokens() == 1


def test_episode_load_integrates_a_schedule_whose_phases_are_shorter_than_a_sample_step():
    """A rate of 1 then 3 in every 2 slots (mean 2) offers the same load over any whole number of periods; sampling
    the rate at 100,000 midpoints of a 200,000-slot episode saw only the 3s (the load read 1.5x too high)."""
    from flowgym.sim.workloads import make_workload

    w = make_workload({"kind": "iid", "rate": {"kind": "steps", "times": [0, 1], "rates": [1, 3], "period": 2},
                       "lengths": {"kind": "empirical", "pairs": [[5, 5]]}})
    want = 2 * w.mean_work() / 100
    for H in (2, 1000, 200_000, 2_000_000):
        assert w.episode_load(100, H) == pytest.approx(want, rel=1e-12)
    assert w.episode_load(100, 3) == pytest.approx((1 + 3 + 1) * w.mean_work() / 3 / 100)
    half = make_workload({"kind": "iid", "rate": {"kind": "steps", "times": [0, 0.5], "rates": [1, 3], "period": 1},
                          "lengths": {"kind": "empirical", "pairs": [[5, 5]]}})
    assert half.episode_load(100, 200_000) == pytest.approx(2 * half.mean_work() / 100)
    mix = make_workload({"kind": "mix", "streams": [w.to_spec(), half.to_spec()]})
    assert mix.episode_load(100, 200_000) == pytest.approx(4 * w.mean_work() / 100)


def test_an_azure_rate_multiplier_that_stretches_past_the_clock_is_named():
    from flowgym.sim.workloads import make_workload

    with pytest.raises(ValueError, match=r"rate_multiplier 1e-300 stretches the trace's .* give at least"):
        make_workload({"kind": "azure", "rate_multiplier": 1e-300})
    assert len(make_workload({"kind": "azure", "rate_multiplier": 1e-6})) > 0
