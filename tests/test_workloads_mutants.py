"""Rules of ``flowgym/sim/workloads.py`` that its mutation run found unpinned (docs/testing.md).

Each test states the documented rule and checks it with numbers worked out in its comments.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.sim.rates import Steps
from flowgym.sim.workloads import (
    MAX_ARRIVAL,
    MAX_CHUNK_REQUESTS,
    MAX_CLASSES,
    MAX_TOKENS,
    EmpiricalLengths,
    IIDPoisson,
    LogNormalLengths,
    MultiClassPoisson,
    Requests,
    Trace,
    TraceError,
    lmsys_like_lengths,
    make_workload,
    request_work,
)


def test_documented_limits():
    # the limits the module documents (class ids 0..2^16 - 1, arrivals up to 2^53, lengths 2^40)
    assert MAX_CLASSES == 65536 and MAX_ARRIVAL == 9007199254740992 and MAX_TOKENS == 1099511627776
    assert MAX_CHUNK_REQUESTS == 4194304


def test_class_ids_up_to_the_limit_are_accepted_and_beyond_refused():
    tr = Trace([0, 1], [5, 5], [3, 3], cls=[0, MAX_CLASSES - 1])
    assert tr.cls.max() == 65535
    with pytest.raises(TraceError, match=r"index 1: class id 65536 is too large"):
        Trace([0, 1], [5, 5], [3, 3], cls=[0, MAX_CLASSES])


def test_arrivals_and_lengths_up_to_their_limits_are_accepted_and_beyond_refused():
    # 2^53 is a whole double; the next double is 2^53 + 2
    tr = Trace([0, MAX_ARRIVAL], [5, 5], [3, 3])
    assert int(tr.arrival[-1]) == 2**53
    with pytest.raises(TraceError, match=r"'arrival', index 1: .* too large for an arrival"):
        Trace([0, float(MAX_ARRIVAL) + 2.0], [5, 5], [3, 3])
    tr = Trace([0], [MAX_TOKENS], [3])
    assert int(tr.prompt_len[0]) == 2**40
    with pytest.raises(TraceError, match=r"'output_len', index 0: .* too large for a length"):
        Trace([0], [5], [MAX_TOKENS + 1])
    # the class table of MultiClassPoisson uses the same limit, naming the field
    assert MultiClassPoisson([(MAX_TOKENS, 1)], 0.1).classes[0, 0] == 2**40
    with pytest.raises(ValueError, match=r"classes\[0\] prompt_len"):
        MultiClassPoisson([(MAX_TOKENS + 1, 1)], 0.1)


def test_empty_requests_are_empty():
    e = Requests.empty()
    assert [a.size for a in e] == [0, 0, 0, 0] and all(a.dtype == np.int64 for a in e)


def test_chunk_load_limit_is_inclusive():
    # a chunk of 256 slots may hold 2^22 requests on average: 16384 a slot is the largest rate
    assert MultiClassPoisson([(1, 1)], 16384.0).rates[0] == 16384.0
    with pytest.raises(ValueError, match=r"rates: 16384.5 requests per slot"):
        MultiClassPoisson([(1, 1)], 16384.5)
    # timed: 60-second chunks, 2^22 / 60 a second
    IIDPoisson(2**22 / 60, {"kind": "empirical", "pairs": [[1, 1]]}, timed=True)
    with pytest.raises(ValueError, match=r"rate: .* requests per second"):
        IIDPoisson(2**22 / 60 + 1, {"kind": "empirical", "pairs": [[1, 1]]}, timed=True)


def test_mean_work_with_a_total_rate_of_one():
    # rates 0.25 + 0.75 = 1: E[w] = 0.25 w(10, 20) + 0.75 w(10, 40) = 0.25 * 410 + 0.75 * 1220 = 1017.5
    wl = MultiClassPoisson([(10, 20), (10, 40)], [0.25, 0.75])
    assert wl.mean_work() == pytest.approx(1017.5)
    assert MultiClassPoisson([(10, 20)], 0.0).mean_work() is None  # no arrivals: no mean


def test_work_rate_is_rate_times_mean_work():
    # MultiClassPoisson: lambda E[w] = 5 * (4060 / 3) = 6766.67 at every t
    wl = MultiClassPoisson([(10, 20), (10, 40), (10, 60)], 5 / 3)
    np.testing.assert_allclose(wl.work_rate(np.array([0.0, 7.0])), [5 * 4060 / 3] * 2)
    # IIDPoisson with a schedule: rate(t) * E[w]; one pair (10, 20): w = 410
    wl = IIDPoisson({"kind": "steps", "times": [0, 10], "rates": [2, 3]}, {"kind": "empirical", "pairs": [[10, 20]]})
    np.testing.assert_allclose(wl.work_rate(np.array([0.0, 9.5, 10.0])), [820.0, 820.0, 1230.0])


def test_episode_and_peak_load_need_a_positive_horizon():
    wl = MultiClassPoisson([(10, 20)], 1.0)
    assert wl.episode_load(1000, 0) is None and wl.peak_load(1000, 0) is None
    assert wl.episode_load(1000, None) is None and wl.peak_load(1000, None) is None
    # horizon 1: the load itself, 1 * 410 / 1000
    assert wl.episode_load(1000, 1) == pytest.approx(0.41) and wl.peak_load(1000, 1) == pytest.approx(0.41)


def test_episode_load_averages_a_schedule_over_the_whole_horizon():
    # rate 1 on [0, 100000), 3 after; w = 410, M = 1000. Over H = 200000 slots the average rate is 2:
    # episode load 2 * 410 / 1000 = 0.82; peak 3 * 0.41 = 1.23. (H above the 100,000-point grid, so
    # the grid's spacing H / 100000 = 2 matters.)
    wl = IIDPoisson({"kind": "steps", "times": [0, 100_000], "rates": [1, 3]},
                    {"kind": "empirical", "pairs": [[10, 20]]})
    assert wl.episode_load(1000, 200_000) == pytest.approx(0.82)
    assert wl.peak_load(1000, 200_000) == pytest.approx(1.23)
    # a short horizon: H = 4, rate 1 on [0, 2), 3 after: average 2, load 0.82
    wl = IIDPoisson({"kind": "steps", "times": [0, 2], "rates": [1, 3]}, {"kind": "empirical", "pairs": [[10, 20]]})
    assert wl.episode_load(1000, 4) == pytest.approx(0.82)
    assert wl.episode_load(1000, 2) == pytest.approx(0.41)  # the second phase has not started


def test_empirical_lengths_refuse_a_non_sequence_naming_pairs():
    for bad in (5, "ab", b"ab", None):
        with pytest.raises(ValueError, match="pairs must be a non-empty list"):
            EmpiricalLengths(bad)


def test_lognormal_and_lmsys_like_defaults_clip_at_4096():
    ln = LogNormalLengths(10, 10, prompt_sigma=1.0, output_sigma=1.0)
    assert ln.max_prompt == 4096 and ln.max_output() == 4096 and ln.max_tokens() == 8192
    lm = lmsys_like_lengths()
    assert lm.max_prompt == 4096 and lm.max_output() == 4096


def test_a_csv_row_of_empty_fields_is_skipped(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_len,output_len\n0,5,10\n,,\n  , ,\n1,6,11\n")
    tr = make_workload({"kind": "trace", "path": str(p)})
    assert tr.arrival.tolist() == [0, 1] and tr.prompt_len.tolist() == [5, 6] and tr.output_len.tolist() == [10, 11]


def test_request_work_formula():
    # w = l o + (o + o^2) / 2: (10, 20) -> 200 + 210 = 410
    assert request_work(10, 20) == 410.0
    assert isinstance(Steps([0], [1.0]), Steps)


def test_lognormal_lengths_start_at_one_token():
    # sigma 0: every length is round(median) = 1, so l = o = 1 and w = 1 * 1 + (1 + 1) / 2 = 2
    ln = LogNormalLengths(1, 1, prompt_sigma=0.0, output_sigma=0.0)
    assert ln.mean_work() == pytest.approx(2.0)
    # prompt median 1, sigma 1, clipped to [1, 2]: P(l = 1) = P(X < 1.5) = Phi(ln 1.5) = 0.657432;
    # E[l] = 1 + P(l = 2) = 1.342568; with o = 1, w = E[l] + 1 = 2.342568
    ln = LogNormalLengths(1, 1, prompt_sigma=1.0, output_sigma=0.0, max_prompt=2)
    assert ln.mean_work() == pytest.approx(2.342568, abs=1e-6)


def test_a_finite_workload_makes_its_requests_again_in_every_episode():
    # n_requests = 5 at rate 1: each episode (a sample from t0 = 0) yields exactly 5 requests,
    # however many the previous episode made
    wl = IIDPoisson(1.0, {"kind": "empirical", "pairs": [[2, 3]]}, n_requests=5)
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        first = wl.sample(rng, 0, 256)
        later = wl.sample(rng, 256, 512)
        assert first.arrival.size == 5 and later.arrival.size == 0


def _mix():
    from flowgym.sim.workloads import Mixture

    # stream 1: rate 0.25, one pair (10, 20), w = 410; stream 2: rate 0.75, (10, 40), w = 1220
    return Mixture([{"kind": "iid", "rate": 0.25, "lengths": {"kind": "empirical", "pairs": [[10, 20]]}},
                    {"kind": "iid", "rate": 0.75, "lengths": {"kind": "empirical", "pairs": [[10, 40]]}}])


def test_mixture_work_rate_and_mean_work_add_the_streams():
    mix = _mix()
    # work rate: 0.25 * 410 + 0.75 * 1220 = 102.5 + 915 = 1017.5 at every t (a sum, not the larger part)
    np.testing.assert_allclose(mix.work_rate(np.array([0.0, 3.0])), [1017.5, 1017.5])
    # total rate 1: E[w] = 1017.5 / 1
    assert mix.arrival_rate() == 1.0 and mix.mean_work() == pytest.approx(1017.5)


def test_trace_statistics_of_one_request_and_of_none():
    tr = Trace([4], [10], [20])
    assert tr.mean_work() == 410.0 and tr.max_request_tokens() == 30 and tr.max_output_tokens() == 20
    assert tr.arrival_rate() == pytest.approx(1 / 5)  # one request in slots 0..4
    empty = Trace([], [], [])
    assert empty.mean_work() is None and empty.max_request_tokens() == 0 and empty.max_output_tokens() == 0


def test_a_fractional_arrival_error_hints_at_continuous_time():
    with pytest.raises(TraceError, match=r"'arrival', index 0: 0.5 must be a whole number \(arrivals are slot numbers"):
        Trace([0.5], [1], [1])
    # a fractional length gets no such hint
    with pytest.raises(TraceError, match=r"'prompt_len', index 0: 1.5 must be a whole number$"):
        Trace([0], [1.5], [1])


def test_peak_load_samples_whole_and_half_slots_across_a_long_horizon():
    # H = 200,000 slots: 100,000 points at every other whole slot (0, 2, 4, ...) and 100,000 at the
    # odd ones (1, 3, ...; the half-spacing points). A one-slot phase of rate 5 at an even slot
    # (150,000) is seen by the first set only, one at an odd slot (150,001) by the second only:
    # the peak is 5 * 410 / 1000 = 2.05 in both, the base 0.41.
    lengths = {"kind": "empirical", "pairs": [[10, 20]]}
    for at in (150_000, 150_001):
        wl = IIDPoisson({"kind": "steps", "times": [0, at, at + 1], "rates": [1, 5, 1]}, lengths)
        assert wl.peak_load(1000, 200_000) == pytest.approx(2.05)


def test_timed_trace_arrival_rate_is_requests_over_the_span():
    # timed arrivals at 10, 20 and 30 s: 3 requests over 20 s
    assert Trace([10.0, 20.0, 30.0], [1, 1, 1], [1, 1, 1], timed=True).arrival_rate() == pytest.approx(0.15)
    assert Trace([5.0, 5.0], [1, 1], [1, 1], timed=True).arrival_rate() is None  # no span: unknown


def test_named_length_kinds_build_their_own_distributions():
    from flowgym.sim.workloads import _make_lengths, azure_lengths

    assert _make_lengths({"kind": "lmsys-like"}).mean_work() == pytest.approx(lmsys_like_lengths().mean_work())
    assert _make_lengths({"kind": "azure", "trace": "code"}).mean_work() == pytest.approx(
        azure_lengths("code").mean_work())


def test_a_mixture_of_one_stream_is_that_stream():
    from flowgym.sim.workloads import Mixture

    one = {"kind": "iid", "rate": 0.5, "lengths": {"kind": "empirical", "pairs": [[10, 20]]}}
    mix = Mixture([one])
    assert not mix.timed and mix.chunk_span == 256 and mix.arrival_rate() == 0.5
    a = mix.sample(np.random.default_rng(0), 0, 256)
    assert a.arrival.size > 0 and np.all(np.diff(a.arrival) >= 0)


def test_an_empty_trace_with_a_class_column_has_no_classes():
    assert Trace([], [], [], cls=[]).classes.shape == (0, 2)
    # one request of class 2: three classes, the first two with no request (zeros)
    assert Trace([0], [4], [6], cls=[2]).classes.tolist() == [[0, 0], [0, 0], [4, 6]]


def test_empirical_lengths_take_one_pair_and_refuse_none():
    one = EmpiricalLengths([[3, 4]])
    assert one.mean_work() == 3 * 4 + (4 + 16) / 2  # 22
    with pytest.raises(ValueError, match="pairs must be a non-empty list"):
        EmpiricalLengths(np.zeros((0, 2)))


def test_the_chunk_load_error_states_the_limit_and_the_chunk():
    # 2^22 requests per 256-slot chunk: at most 16384 a slot; 20000 a slot would put 5.12e6 in a chunk
    with pytest.raises(ValueError, match=r"at most 16384 per slot: a chunk of 256 slots would hold 5.12e\+06"):
        MultiClassPoisson([(1, 1)], 20000.0)


def test_timed_trace_rate_over_a_span_below_one_second():
    # two requests 0.5 s apart: 2 / 0.5 = 4 a second
    assert Trace([0.0, 0.5], [1, 1], [1, 1], timed=True).arrival_rate() == pytest.approx(4.0)


def test_an_azure_trace_window_round_trips_through_its_spec():
    from flowgym.sim.workloads import azure_trace

    tr = azure_trace("conv", window=[60, 120])
    spec = tr.to_spec()
    assert spec["window"] == [60.0, 120.0]
    again = make_workload(spec)
    np.testing.assert_array_equal(again.arrival, tr.arrival)


def test_slot_shuffle_with_tied_uniforms_is_lexsort():
    # _slot_shuffle packs (slot, u) into one key and argsorts it; argsort's quicksort does not keep
    # the index order of equal keys, so ties anywhere (not only at the smallest key) must fall back
    # to lexsort, whose ties go by index. 200 requests in one slot, the first with the unique
    # smallest u, the rest tied in two groups.
    from flowgym.sim.workloads import _slot_shuffle

    rng = np.random.default_rng(0)
    u = np.concatenate([[0.0], rng.choice([0.5, 0.7], 199)])
    rel = np.zeros(200, dtype=np.int64)
    np.testing.assert_array_equal(_slot_shuffle(rel, u), np.lexsort((u, rel)))


def test_zero_weight_pairs_bound_nothing():
    # a pair with weight 0 is never drawn: it does not count in the largest l + o or o
    e = EmpiricalLengths([[1, 2], [100, 200]], weights=[1.0, 0.0])
    assert e.max_tokens() == 3 and e.max_output() == 2


def test_class_id_errors_state_the_valid_range():
    with pytest.raises(TraceError, match=r"ids are 0\.\.65535; number the classes from 0"):
        Trace([0], [1], [1], cls=[70000])
    with pytest.raises(TraceError, match=r"num_classes=2 but the trace has class id 4"):
        Trace([0, 1], [1, 1], [1, 1], cls=[0, 4], num_classes=2)


def test_peak_load_ignores_phases_after_the_horizon():
    # rate 1 until slot 300,000, then 5: over a 200,000-slot episode the peak is the first phase's
    # (1 * 410 / 1000 = 0.41); the schedule's later (and last) phase is never offered
    wl = IIDPoisson({"kind": "steps", "times": [0, 300_000], "rates": [1, 5]},
                    {"kind": "empirical", "pairs": [[10, 20]]})
    assert wl.peak_load(1000, 200_000) == pytest.approx(0.41)
    assert wl.peak_load(1000, 1000) == pytest.approx(0.41)


def test_timed_trace_last_arrival_is_the_latest_time():
    tr = Trace([2.5, 1.0, 0.25], [1, 1, 1], [1, 1, 1], timed=True)  # sorted on input: 0.25, 1.0, 2.5
    assert tr.last_arrival == 2.5
    assert Trace([], [], [], timed=True).last_arrival == -1
