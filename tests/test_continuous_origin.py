"""Continuous time: where a run starts (``Engine.time_origin``) and zero-rate stretches.

* A timed trace shifted by a constant (Unix timestamps) has the same metrics as the unshifted one: the
  throughputs divide by the seconds from the trace's first arrival, not from time 0 of its time base, and
  the engine runs its clock from that arrival, so the float clock keeps its resolution; the request log and
  ``series()["time"]`` stay in the trace's own time base.
* A generated workload whose rate schedule is 0 for a long stretch (``steps`` from 0 to ``G``) skips
  that stretch in one chunk instead of drawing it 60 seconds at a time, and draws the same requests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowgym import FlowControlEnv, Trace
from flowgym.sim import kernels
from flowgym.sim.admission import AdmissionRule
from flowgym.sim.engine import Engine, trace_time_origin
from flowgym.sim.metrics import METRIC_NAMES, metrics_at
from flowgym.sim.workloads import azure_trace, make_workload

LIN = {"kind": "linear", "c0": 0.05, "c_prefill": 1e-4, "c_decode": 1e-3, "c_kv": 1e-6}
UNIX = 1.7e9  # a Unix timestamp (2023): arrivals on a 2**-10 s grid stay exact when shifted by it
TIME_METRICS = ("avg_latency", "p95_latency", "mean_time_in_system")


def grid_trace(offset: float = 0.0, n: int = 300, seed: int = 0) -> Trace:
    """``n`` requests over about 100 s, arrival times on a 2**-10 s grid (exact after adding ``offset``), with
    a 40-second idle gap, simultaneous arrivals, rejections (``l + o > 2000``) and overload (evictions)."""
    rng = np.random.default_rng(seed)
    arr = np.sort(np.floor(rng.uniform(0, 100, n) * 1024) / 1024)
    arr[n // 2:] += 40.0  # an idle gap the server jumps over
    arr[10:14] = arr[10]  # simultaneous arrivals
    arr = arr + 3.0  # the trace's first request is not at 0 of its own time base
    out = rng.integers(1, 60, n)
    out[[5, 77]] = 2500  # rejected: l + o > M
    return Trace(arr + offset, rng.integers(1, 400, n), out, timed=True)


def run_env(trace: Trace, budget: int = 24, record: str = "full", compiled: bool = False, **kw):
    env = FlowControlEnv(M=2000, workload=trace, horizon=None, time_model=LIN, record=record, **kw)
    env.reset(seed=0)
    rewards = []
    if compiled:
        rule = AdmissionRule("fixed", budget=budget)
        assert env.rule_unsupported(rule) is None
        env.run_rule(rule)
    else:
        done = False
        while not done:
            _, r, te, tr, _ = env.step(budget)
            rewards.append(r)
            done = te or tr
    return env, rewards


def assert_same_metrics(a: dict, b: dict, exact_times: bool) -> None:
    """Counts, usage and throughputs equal; latencies and time in system equal, or to the rounding of the
    shifted time base (its float spacing at 1.7e9 s is 2.4e-7 s) when they come from its log."""
    assert b["elapsed"] == a["elapsed"] and b["T"] == a["T"]
    for k in METRIC_NAMES:
        if a[k] != a[k]:  # nan: no request finished
            assert b[k] != b[k], k
        elif k in TIME_METRICS and not exact_times:
            assert b[k] == pytest.approx(a[k], rel=0, abs=1e-6), k
        else:
            assert b[k] == a[k], k


def test_a_shifted_trace_has_the_same_metrics_stepped():
    base, _ = run_env(grid_trace())
    unix, _ = run_env(grid_trace(UNIX))
    m0, m1 = base.metrics(), unix.metrics()
    assert m0["evictions"] > 0 and m0["rejected"] == 2 and m0["completed"] == 298  # the run is not trivial
    assert np.diff(base.series()["elapsed"]).max() > 30.0  # and the server jumps over the idle gap
    assert_same_metrics(m0, m1, exact_times=False)
    # the throughputs count from the first arrival (just after 3 s in the trace's time base), not from its time 0
    first = float(base.workload.arrival[0])
    assert base.engine.time_origin == first > 3.0
    assert m0["elapsed"] == pytest.approx(base.series()["time"][-1] - first, rel=1e-15)
    assert m1["request_throughput"] == pytest.approx(298 / m1["elapsed"]) and m1["request_throughput"] > 1.5
    # the same run iteration by iteration: every duration, admission and eviction
    s0, s1 = base.series(), unix.series()
    for k in s0:
        if k != "time":
            assert np.array_equal(s0[k], s1[k]), k
    # the log and the series' time stay in the trace's own time base: arrivals exactly as given
    l0, l1 = base.request_log(), unix.request_log()
    assert np.array_equal(l1["arrival_time"], unix.workload.arrival)
    assert np.array_equal(l1["arrival_time"], l0["arrival_time"] + UNIX)
    np.testing.assert_allclose(l1["finish_time"], l0["finish_time"] + UNIX, rtol=0, atol=3e-7)
    np.testing.assert_allclose(s1["time"], s0["time"] + UNIX, rtol=0, atol=3e-7)
    for k in ("arrival", "finish", "evictions", "rejected"):
        assert np.array_equal(l0[k], l1[k]), k
    # metrics at any shorter horizon, as flowgym.lab.evaluation computes them from the log and the series
    for T in (1, 50, s0["usage"].size // 2):
        assert_same_metrics(metrics_at(l0, s0, 2000, T), metrics_at(l1, s1, 2000, T), exact_times=False)


def test_the_clock_keeps_its_resolution_at_unix_timestamps():
    """The clock inside runs from the first arrival: it does not round to the 2.4e-7 s spacing of floats at
    1.7e9 s (before, over 10**5 iterations it drifted 7.5e-3 s from the sum of the durations)."""
    n = 4000
    tr = Trace(UNIX + np.arange(n) * 0.02, [20] * n, [3] * n, timed=True)
    env = FlowControlEnv(M=100_000, workload=tr, horizon=20_000, time_model={"kind": "linear", "c0": 0.0554,
                         "c_prefill": 3.39e-4, "c_decode": 1.66e-4, "c_kv": 1.16e-7})
    env.reset(seed=0)
    durations = []
    done = False
    while not done:
        _, _, te, tr_, info = env.step(4)
        durations.append(info["duration"])
        done = te or tr_
    elapsed = env.series()["elapsed"]
    assert elapsed[-1] == pytest.approx(math.fsum(durations), rel=0, abs=1e-9)
    assert env.engine.time_origin == UNIX


@pytest.mark.skipif(not kernels.ENABLED, reason="the compiled loop needs numba (pip install -e '.[fast]')")
def test_a_shifted_trace_has_the_same_metrics_compiled():
    """The compiled loop runs on the clock inside, from the same arrays: a shifted trace's run is the stepped
    one, and its metrics the unshifted trace's."""
    ref, _ = run_env(grid_trace())
    m_ref = ref.metrics()
    fast0, _ = run_env(grid_trace(), compiled=True)
    fast1, _ = run_env(grid_trace(UNIX), compiled=True)
    assert_same_metrics(m_ref, fast0.metrics(), exact_times=True)
    assert_same_metrics(m_ref, fast1.metrics(), exact_times=False)
    slow1, _ = run_env(grid_trace(UNIX))
    for k, v in slow1.request_log().items():  # the compiled loop leaves what stepping leaves
        assert np.array_equal(v, fast1.request_log()[k], equal_nan=True), k
    for k, v in slow1.series().items():
        assert np.array_equal(v, fast1.series()[k]), k


def test_a_shifted_trace_has_the_same_metrics_streaming():
    """The streaming mode computes latencies from the clock inside: a shifted trace's metrics are the unshifted
    one's exactly, and the full mode's (to float rounding; p95 from its sketch)."""
    ref, _ = run_env(grid_trace())
    m_ref = ref.metrics()
    stream0, _ = run_env(grid_trace(), record="stream")
    stream1, _ = run_env(grid_trace(UNIX), record="stream")
    ms0, ms1 = stream0.metrics(), stream1.metrics()
    assert_same_metrics(ms0, ms1, exact_times=True)
    for k in METRIC_NAMES:  # and the full mode's (p95 from the streaming sketch: within its 0.1%)
        assert ms0[k] == pytest.approx(m_ref[k], rel=1e-3 if k == "p95_latency" else 1e-12), k
    assert np.array_equal(stream1.series()["elapsed"], ref.series()["elapsed"][-stream1.series()["t"].size:])


def test_a_shifted_trace_has_the_same_rewards_and_observations():
    """What the environment derives from the clock (the reward's seconds in the system, the arrival rate)
    is the same to the rounding of the shifted time base."""
    kw = {"observation": "dict", "reward_weights": {"in_system": 1, "wasted_tokens": 0}, "reward_scale": 1}
    base, r0 = run_env(grid_trace(), **kw)
    unix, r1 = run_env(grid_trace(UNIX), **kw)
    assert len(r0) == len(r1)
    np.testing.assert_allclose(r1, r0, rtol=1e-6, atol=1e-5)
    # with the time-in-system reward, minus the return is the total time in system (Little's law)
    for env, r, rel in ((base, r0, 1e-12), (unix, r1, 1e-8)):
        m = env.metrics()
        assert -sum(r) == pytest.approx(m["mean_time_in_system"] * (m["arrived"] - m["rejected"]), rel=rel)
    assert unix.engine.now == pytest.approx(base.engine.now + UNIX, rel=0, abs=3e-7)
    assert unix.view().now == unix.engine.now


def test_time_origin():
    """0 for generated workloads and traces starting at 0 (the Azure traces: nothing moves there); a trace's
    first arrival, rounded down to the float spacing at its last arrival, so shifting is exact."""
    assert trace_time_origin(np.zeros(0)) == 0.0
    assert trace_time_origin(np.array([0.0, 5.0])) == 0.0
    assert trace_time_origin(np.array([3.0, 103.0])) == 3.0
    a = np.array([UNIX + 0.123456789, UNIX + 77.7, 2.0**32])
    o = trace_time_origin(a)
    assert a[0] - math.ulp(a[-1]) < o <= a[0]
    assert np.array_equal((a - o) + o, a)  # the shift is exact both ways
    # small first arrivals with a long span: a - o still exact
    rng = np.random.default_rng(1)
    for _ in range(200):
        a = np.sort(rng.uniform(0, 1, 50) * 10.0 ** rng.uniform(-3, 9))
        o = trace_time_origin(a)
        assert o <= a[0] and np.array_equal((a - o) + o, a)
    for wl in (azure_trace("conv"), {"kind": "iid", "rate": 2.0, "timed": True, "lengths": {"kind": "lmsys-like"}}):
        eng = Engine(4000, wl, time_model=LIN)
        eng.reset(np.random.default_rng(0))
        assert eng.time_origin == 0.0 and eng._arel is eng.arrival_time  # no second column, no shift
    tr = grid_trace(UNIX)
    assert Engine(4000, tr, time_model=LIN).time_origin == tr.arrival[0]  # on the grid: the first arrival itself


def test_the_vllm_mode_counts_from_the_first_arrival_too():
    """The vllm-v1 mode runs its clock from the first arrival too (its token times on the clock inside, the log's
    ``first_token_time`` in the trace's base): the same elapsed seconds and throughputs exactly, and the time to
    first token within the float spacing at 1.7e9 s (the log's two times are in the trace's base)."""
    out = []
    for off in (0.0, UNIX):
        env = FlowControlEnv(M=2000, workload=grid_trace(off), horizon=None, time_model=LIN, engine="vllm-v1")
        env.reset(seed=0)
        done = False
        while not done:
            *_, te, tr, _ = env.step(24)
            done = te or tr
        out.append(env.metrics())
    m0, m1 = out
    assert m1["elapsed"] == m0["elapsed"]  # before: 1.7e9 s more
    assert m1["request_throughput"] == m0["request_throughput"]
    assert m1["token_throughput"] == m0["token_throughput"]
    assert m1["request_throughput"] > 1.5
    assert m1["time_to_first_token_mean"] == pytest.approx(m0["time_to_first_token_mean"], rel=0, abs=1e-6)


# ----------------------------------------------------------------- zero-rate stretches


LOGNORMAL = {"kind": "lognormal", "prompt_median": 50, "output_median": 80, "prompt_sigma": 1.0, "output_sigma": 0.8,
             "max_prompt": 800, "max_output": 900}


def gap_workload(gap: float, **extra) -> dict:
    return {"kind": "iid", "timed": True, "rate": {"kind": "steps", "times": [0, gap], "rates": [0.0, 5.0]},
            "lengths": {"kind": "lmsys-like"}, **extra}


class Counting:
    """Counts the chunks an engine draws from its workload."""

    def __init__(self, eng: Engine) -> None:
        self.n = 0
        self.windows: list[tuple[float, float]] = []
        sample = eng.workload.sample

        def counted(rng, t0, t1):
            self.n += 1
            self.windows.append((t0, t1))
            return sample(rng, t0, t1)

        eng.workload.sample = counted


def run_engine(wl, horizon: int, skip: bool = True, seed: int = 3) -> tuple[Engine, Counting]:
    eng = Engine(4000, wl, time_model="jaillet2025")
    if not skip:  # the engine before zero-rate stretches were skipped: every chunk drawn
        eng._zero_until = lambda t: t
    c = Counting(eng)
    eng.reset(np.random.default_rng(seed))
    eng.arrive()
    for _ in range(horizon):
        eng.serve(8)
        eng.arrive()
    return eng, c


@pytest.mark.parametrize("wl", [
    gap_workload(1000.0),
    gap_workload(3601.5, n_requests=40),
    {"kind": "iid", "timed": True, "rate": {"kind": "steps", "times": [0, 500, 700, 2000], "rates": [0, 3, 0, 2],
                                            "period": 2900}, "lengths": {"kind": "azure", "trace": "code"}},
    {"kind": "iid", "timed": True, "rate": {"kind": "bursts", "base": 0, "burst": 4, "every": 1500, "duration": 90,
                                            "start": 1450}, "lengths": LOGNORMAL},
    {"kind": "mix", "streams": [gap_workload(700.0), {"kind": "iid", "timed": True, "lengths": {"kind": "azure"},
                                                      "rate": {"kind": "steps", "times": [0, 1300], "rates": [0, 1]}}]},
])
def test_skipping_zero_rate_stretches_draws_the_same_requests(wl):
    fast, cf = run_engine(wl, 3000)
    slow, cs = run_engine(wl, 3000, skip=False)
    assert cf.n < cs.n  # something was skipped
    assert fast.n_req == slow.n_req > 30
    for k, v in slow.request_log().items():
        assert np.array_equal(v, fast.request_log()[k], equal_nan=True), k
    for k, v in slow.series().items():
        assert np.array_equal(v, fast.series()[k]), k
    # and both are the requests of the workload sampled chunk after chunk from the same generator
    ref = make_workload(wl)
    rng = np.random.default_rng(3)
    parts = [ref.sample(rng, 60.0 * i, 60.0 * (i + 1)) for i in range(int(cs.windows[-1][1] // 60))]
    arr = np.concatenate([p.arrival for p in parts])[: slow.n_req]
    assert np.array_equal(arr, slow.arrival_time[: slow.n_req])
    assert np.array_equal(np.concatenate([p.output_len for p in parts])[: slow.n_req], slow.output[: slow.n_req])


def test_a_trace_whose_first_arrival_is_below_one_second_counts_from_it():
    """The origin is the first arrival for any positive one, below a second too: a trace starting at 0.5 s has the
    elapsed seconds and throughput of the same trace from 0."""
    out = []
    for off in (0.0, 0.5):
        env = FlowControlEnv(M=2000, workload=Trace(np.array([0.0, 0.25, 3.0]) + off, [10, 10, 10], [5, 5, 5],
                                                    timed=True), horizon=None, time_model=LIN)
        env.reset(seed=0)
        assert env.engine.time_origin == off
        done = False
        while not done:
            *_, te, tr, _ = env.step(4)
            done = te or tr
        out.append(env.metrics())
    assert out[1]["elapsed"] == pytest.approx(out[0]["elapsed"], abs=1e-12)
    assert out[1]["request_throughput"] == pytest.approx(out[0]["request_throughput"], rel=1e-12)


def test_a_request_at_a_chunk_boundary_joins_when_the_idle_server_jumps_there():
    """Arrivals at exactly 60 s and 120 s, chunk boundaries (CHUNK_SECONDS), with the server idle before each: the
    clock jumps to the arrival and the request joins that iteration, so it starts at once (its time in system is
    its own service time, the same as the first request's)."""
    env = FlowControlEnv(M=2000, workload=Trace([0.0, 60.0, 120.0], [10, 10, 10], [5, 5, 5], timed=True),
                         horizon=None, time_model=LIN)
    env.reset(seed=0)
    done = False
    while not done:
        *_, te, tr, _ = env.step(4)
        done = te or tr
    log = env.request_log()
    tis = log["finish_time"] - log["arrival_time"]
    assert (log["finish"] > 0).all()
    assert tis[1] == pytest.approx(tis[0], abs=1e-9) and tis[2] == pytest.approx(tis[0], abs=1e-9)


def test_no_stretch_is_skipped_for_lengths_that_draw_for_zero_requests():
    """The skip rests on a zero-rate chunk drawing nothing from the generator; a length distribution not known to
    draw nothing for zero requests (here one that always draws) turns it off, so the requests are those of drawing
    every chunk (with the skip they would differ: the stream would lose the skipped chunks' draws)."""
    from flowgym.sim.workloads import EmpiricalLengths, IIDPoisson

    class Noisy(EmpiricalLengths):
        def sample(self, rng, n):
            rng.random()  # a draw even for n = 0
            return super().sample(rng, n)

    def workload() -> IIDPoisson:
        return IIDPoisson({"kind": "steps", "times": [0, 3000], "rates": [0.0, 2.0]},
                          Noisy([(20, 20), (40, 40)]), timed=True)

    fast, cf = run_engine(workload(), 200)
    slow, cs = run_engine(workload(), 200, skip=False)
    assert cf.n == cs.n and fast.n_req == slow.n_req > 10  # nothing skipped
    assert np.array_equal(fast.output[: fast.n_req], slow.output[: slow.n_req])
    assert np.array_equal(fast.arrival_time[: fast.n_req], slow.arrival_time[: slow.n_req])


def test_a_long_zero_rate_stretch_costs_one_chunk():
    """steps 0 until 1e9 s, then 5/s: reset jumps to the first arrival after drawing 3 chunks, not 1.7e7."""
    eng = Engine(4000, gap_workload(1e9), time_model="jaillet2025")
    c = Counting(eng)
    eng.reset(np.random.default_rng(0))
    eng._skip_empty_chunks(math.inf)  # never past the first chunk: drawing it resets the workload's own count
    assert eng._gen_t == 0
    eng.arrive()
    assert c.n <= 3 and c.windows[0] == (0.0, 60.0)  # the first chunk is always drawn
    assert 1e9 <= eng.now < 1e9 + 60 and eng.n_queued == eng.last_arrivals == 1
    # a finite workload after a long gap gives all its requests in every episode
    env = FlowControlEnv(M=4000, workload=gap_workload(1e8, n_requests=7), time_model="jaillet2025", horizon=None)
    for seed in (0, 1):
        env.reset(seed=seed)
        done = False
        while not done:
            *_, te, tr, _ = env.step(8)
            done = te or tr
        m = env.metrics()
        assert m["completed"] == 7 and env.engine.now > 1e8


def test_generated_workloads_still_count_from_time_0():
    """A generated workload's time 0 is its schedule's: the zero-rate stretch before its first request is
    part of the run (its elapsed time), unlike a trace's time before its first arrival."""
    env = FlowControlEnv(M=4000, workload=gap_workload(500.0, n_requests=5), time_model="jaillet2025",
                         horizon=None)
    env.reset(seed=0)
    done = False
    while not done:
        *_, te, tr, _ = env.step(8)
        done = te or tr
    m = env.metrics()
    assert env.engine.time_origin == 0.0 and m["elapsed"] == env.series()["time"][-1] > 500.0


def test_a_rebased_trace_is_cut_into_chunks_at_the_exact_times():
    """Chunk windows are on the clock inside; a rebased trace is cut where ``arrival - time_origin`` (exact)
    crosses them, even where ``window + time_origin`` rounds (here the trace crosses 2**31 s, where the float
    spacing doubles and the origin sits on the finer grid)."""
    o = 2.0**31 - 100 + 2.0**-22
    d = np.sort(np.concatenate([np.arange(0, 300, 60.0), np.arange(0, 300, 60.0) + 2.0**-21,
                                np.arange(60, 300, 60.0) - 2.0**-21, np.arange(60, 300, 60.0) - 2.0**-20,
                                [17.25, 99.0, 100.0, 100.0 + 2.0**-21]]))
    tr = Trace(o + d, [5] * d.size, [3] * d.size, timed=True)
    eng = Engine(1000, tr, time_model=LIN)
    a, s = tr.arrival, eng._shift
    assert s == trace_time_origin(a) and np.array_equal((a - s) + s, a)
    for t in np.concatenate([np.arange(0, 360, 60.0), d, np.nextafter(d, -1), np.nextafter(d, 1),
                             [99.9999999, 100.00000001]]):
        assert eng._trace_row(float(t)) == np.count_nonzero(a - s < t), t

    def run(trace: Trace) -> Engine:
        e = Engine(1000, trace, time_model=LIN)
        e.reset(np.random.default_rng(0))
        e.arrive()
        while not (e.exhausted and e.in_system == 0):
            e.serve(4)
            e.arrive()
        return e

    eng = run(tr)
    assert np.array_equal(eng.request_log()["arrival_time"], a) and np.array_equal(eng._arel[: a.size], a - s)
    # an origin on the trace's own grid: the run is the unshifted trace's, iteration by iteration
    o2 = 2.0**31 - 100 + 2.0**-21
    big, small = run(Trace(o2 + d, [5] * d.size, [3] * d.size, timed=True)), run(Trace(d, [5] * d.size, [3] * d.size,
                                                                                       timed=True))
    assert big.time_origin == o2 and big.t == small.t
    for k in ("arrival", "finish", "evictions"):
        assert np.array_equal(big.request_log()[k], small.request_log()[k]), k
    assert np.array_equal(big.series()["elapsed"], small.series()["elapsed"])
