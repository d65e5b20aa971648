"""The engine's streaming record mode (issue 19, section 2): flat memory, the full mode's metrics.

Every test runs a full-mode and a streaming-mode engine on the same seed and budgets and
checks that they agree: the per-slot records step by step, every count and sum exactly, the
means exactly in slots (to float rounding in continuous time), ``p95_latency`` within the
sketch's documented bound, on the compiled and the numpy paths.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowgym.sim import kernels
from flowgym.sim.engine import Engine
from flowgym.sim.metrics import METRIC_NAMES
from flowgym.sim.rules import PlannedOrder
from flowgym.sim.streaming import SKETCH_ALPHA, STREAM_WINDOW, QuantileSketch
from flowgym.sim.workloads import Trace

PAPER = {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 3.5}
HEAVY = {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 4.0}  # rho 0.98: evictions
TIMED = {"kind": "iid", "rate": 30.0, "lengths": {"kind": "lmsys-like"}, "timed": True}
JITS = [False, pytest.param(True, marks=pytest.mark.skipif(not kernels.AVAILABLE, reason="needs numba"))]
#: metrics that are counts (ints): equal exactly in both modes
COUNTS = ("completed", "arrived", "rejected", "unfinished", "evictions", "overflow_events", "wasted_tokens")


def _engine(record: str, jit: bool, workload, M: int = 16492, **kw) -> Engine:
    e = Engine(M, workload, record=record, **kw)
    e.jit = jit
    e.reset(np.random.default_rng(7))
    return e


def _budget(rng_state: np.random.Generator, per_class: int, hi: int):
    if per_class:
        return rng_state.integers(0, hi, per_class)
    return int(rng_state.integers(0, hi))


def _run_pair(workload, slots, *, jit, checkpoints=(), budget_hi=24, M=16492, policy=None, **kw):
    """Run both modes side by side with the same random budgets (or ``policy(engine, rng)``'s);
    compare every slot's record and, at each checkpoint (at the decision point, after the
    slot's arrivals), the metrics."""
    full, stream = _engine("full", jit, workload, M, **kw), _engine("stream", jit, workload, M, **kw)
    pc = full.m if kw.get("per_class") else 0
    rng = np.random.default_rng(3)
    for s in range(slots):
        full.arrive()
        stream.arrive()
        if s in checkpoints:
            _assert_same_metrics(full.metrics(), stream.metrics(), timed=full.timed, full=full)
        b = _budget(rng, pc, budget_hi) if policy is None else policy(full, rng)
        a, c = full.serve(b), stream.serve(b)
        assert a == c, f"slot {s}: {a} != {c}"
        assert (full.held, full.n_queued, full.n_active, full.now) == (stream.held, stream.n_queued,
                                                                      stream.n_active, stream.now)
        if full.exhausted and full.in_system == 0:
            break
    return full, stream


def _assert_same_metrics(mf, ms, *, timed: bool, full: Engine) -> None:
    assert set(METRIC_NAMES) <= set(ms)
    assert mf["T"] == ms["T"]
    for k in COUNTS:
        assert mf[k] == ms[k], k
        assert type(ms[k]) is int, k
    exact = () if timed else ("avg_latency", "mean_time_in_system", "request_throughput", "token_throughput",
                              "generated_token_throughput", "elapsed", "max_kv_usage")
    for k in ("avg_latency", "mean_time_in_system", "request_throughput", "token_throughput",
              "generated_token_throughput", "elapsed", "mean_kv_usage", "std_kv_usage", "max_kv_usage"):
        if math.isnan(mf[k]):
            assert math.isnan(ms[k]), k
        elif k in exact:
            assert ms[k] == mf[k], (k, mf[k], ms[k])
        else:  # float sums in another order (continuous time), or usage / M summed as floats by numpy
            assert ms[k] == pytest.approx(mf[k], rel=1e-12, abs=1e-15), k
    if mf["completed"] == 0:
        assert math.isnan(ms["p95_latency"])
        return
    log = full.request_log()
    done = (log["finish"] >= 0)
    if timed:
        lat = np.sort(log["finish_time"][done] - log["arrival_time"][done])
    else:
        lat = np.sort((log["finish"][done] - log["arrival"][done]).astype(float))
    assert mf["p95_latency"] == np.percentile(lat, 95)
    h = (lat.size - 1) * 0.95
    upper = lat[min(math.ceil(h), lat.size - 1)]
    if timed:  # the documented bound: alpha times the order statistic above
        assert abs(ms["p95_latency"] - mf["p95_latency"]) <= SKETCH_ALPHA * upper + 1e-12
    else:  # latencies below 65,536 slots are counted exactly
        assert ms["p95_latency"] == mf["p95_latency"]


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("case", ["paper", "heavy-lifo", "sjf-known", "estimate", "per-class"])
def test_stream_equals_full_in_slots(case, jit):
    kw = {
        "paper": dict(workload=PAPER),
        "heavy-lifo": dict(workload=HEAVY),
        "sjf-known": dict(workload=HEAVY, queue_order="sjf", track_class_queue=True),
        "estimate": dict(workload=HEAVY, queue_order="estimate", eviction="estimate"),
        "per-class": dict(workload=HEAVY, per_class=True),
    }[case]
    full, stream = _run_pair(slots=12000, jit=jit, checkpoints=(0, 1, 2999, 7777), budget_hi=8 if case == "per-class"
                             else 24, **kw)
    _assert_same_metrics(full.metrics(), stream.metrics(), timed=False, full=full)
    assert stream._id_base > 0, "finished requests were dropped from the table"
    assert stream._id_base + stream.n_req == full.n_req
    # the table holds the requests in the system (an overloaded queue grows in both modes), the
    # ones drawn but not arrived, and fewer finished ones than that (256 slots of them at most more)
    dead = stream.n_arrived - stream.in_system
    assert dead <= max(4096, stream.n_req - dead) + 256 * 20
    if case == "paper":
        assert stream.arrival.size < full.arrival.size / 4
    if case != "paper":
        assert full.total_evictions > 0  # the eviction path was exercised, with renumbered ids


@pytest.mark.parametrize("jit", JITS)
def test_stream_equals_full_in_continuous_time(jit):
    full, stream = _run_pair(TIMED, 25000, jit=jit, checkpoints=(5, 4099, 16001), budget_hi=16,
                             time_model="llama2-70b-tp2-a100")
    assert full.total_evictions > 0 and stream._id_base > 0 and stream._clock_base > 0
    _assert_same_metrics(full.metrics(), stream.metrics(), timed=True, full=full)
    s, f = stream.series(), full.series()
    assert np.array_equal(s["time"], f["time"][-STREAM_WINDOW:])


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("eviction", ["lifo", "all"])
def test_stream_equals_full_on_a_finite_trace_with_rejections(jit, eviction):
    rng = np.random.default_rng(5)
    arrival = np.concatenate([rng.integers(0, 44000, 9000), np.repeat(np.arange(500, 44000, 997), 60)])  # bursts
    arrival.sort()
    n = arrival.size
    prompt = rng.integers(1, 30, n)
    prompt[::50] = 700  # l + o > M = 600: rejected
    output = rng.integers(1, 30, n)
    trace = Trace(arrival, prompt, output)

    def cautious(e, r):  # evicting everyone: admit only while there is room (else it livelocks)
        return int(r.integers(1, 6)) if e.held + e.n_active + 150 <= e.M else 0

    full, stream = _run_pair(trace, 100000, jit=jit, checkpoints=(100, 5000), M=600, budget_hi=6,
                             eviction=eviction, policy=cautious if eviction == "all" else None)
    assert full.total_evictions > 0 and stream._id_base > 0
    assert full.exhausted and full.in_system == 0 and stream.exhausted and stream.in_system == 0
    mf, ms = full.metrics(), stream.metrics()
    assert mf["rejected"] > 100 and mf["arrived"] == n
    _assert_same_metrics(mf, ms, timed=False, full=full)


def test_stream_keeps_memory_flat_and_full_mode_grows():
    sizes = {}
    for record in ("full", "stream"):
        e = _engine(record, kernels.AVAILABLE, PAPER)
        mem = []
        for t in range(60000):
            e.arrive()
            e.serve(12)
            if t in (19999, 59999):
                mem.append(e.memory_bytes())
        sizes[record] = mem
    full, stream = sizes["full"], sizes["stream"]
    assert full[1] > full[0] + 20_000_000  # 70 bytes a request, 10.5 requests a slot, 40,000 slots
    assert stream[1] <= stream[0] + 64_000  # flat, up to one growth of a small buffer
    assert stream[1] < 3_000_000


def test_stream_refuses_what_needs_the_history_by_name():
    e = _engine("stream", False, PAPER)
    for _ in range(10):
        e.arrive()
        e.serve(12)
    with pytest.raises(ValueError, match=r"request_log\(\).*record='stream'"):
        e.request_log()
    with pytest.raises(ValueError, match="record must be one of"):
        Engine(100, PAPER, record="log")
    with pytest.raises(ValueError, match="record='stream'.*queue_order 'plan'"):
        Engine(100, PAPER, record="stream", queue_order=PlannedOrder(np.zeros(3)))


def test_stream_series_is_the_last_window_and_usage_is_decimated_block_means():
    full, stream = _run_pair(PAPER, 10000, jit=False)
    f, s = full.series(), stream.series()
    assert set(s) == set(f)
    for k in f:
        assert np.array_equal(s[k], f[k][-STREAM_WINDOW:]), k
    assert s["t"][0] == 10000 - STREAM_WINDOW and s["t"][-1] == 9999
    m = stream.metrics()
    b, dec = m["kv_usage_block"], m["kv_usage"]
    assert b > 1 and 1024 <= dec.size <= 2048
    blocks = f["usage"][: dec.size * b].reshape(dec.size, b).mean(axis=1) / full.M
    assert np.allclose(dec, blocks, rtol=1e-12)


def test_sketch_matches_numpy_percentile_within_alpha():
    rng = np.random.default_rng(0)
    x = rng.lognormal(0.0, 2.0, 50000)  # seconds, 8 orders of magnitude
    sk = QuantileSketch()
    for part in np.array_split(x, 7):
        sk.add(part)
    xs = np.sort(x)
    for q in (0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0):
        exact = np.percentile(x, 100 * q)
        upper = xs[min(math.ceil((x.size - 1) * q), x.size - 1)]
        assert abs(sk.quantile(q) - exact) <= SKETCH_ALPHA * upper, q
    assert sk.nbytes < 200_000


def test_sketch_is_exact_on_small_integers_and_bounded_beyond():
    rng = np.random.default_rng(1)
    x = rng.integers(1, 5000, 20001)
    sk = QuantileSketch(integers=True)
    sk.add(x[:7000])
    sk.add(x[7000:])
    for q in (0.0, 0.37, 0.5, 0.95, 0.99, 1.0):
        assert sk.quantile(q) == np.percentile(x, 100 * q), q
    big = np.concatenate([x, rng.integers(70000, 10**9, 3000)])
    sk.add(big[x.size:])
    bs = np.sort(big)
    for q in (0.9, 0.95, 0.99):
        upper = bs[min(math.ceil((big.size - 1) * q), big.size - 1)]
        assert abs(sk.quantile(q) - np.percentile(big, 100 * q)) <= SKETCH_ALPHA * upper
    assert math.isnan(QuantileSketch().quantile(0.5))
    with pytest.raises(ValueError, match="non-negative"):
        sk.add(np.array([-1.0]))


# ----------------------------------------------------------------- the environment


TIMED_ENV = {"kind": "iid", "rate": 8.0, "lengths": {"kind": "lmsys-like"}, "timed": True}  # stable, evicting


def _env_pair(jit: bool, monkeypatch, **kw):
    from flowgym.envs.flow_control import FlowControlEnv

    monkeypatch.setattr(kernels, "ENABLED", jit)  # Engine.jit's default, read at construction
    return FlowControlEnv(record="full", **kw), FlowControlEnv(record="stream", **kw)


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("setup", [
    dict(output_length_known=False),
    dict(output_length_known=True, queue_order="sjf"),
    dict(output_length_known=True, per_class_budget=True, max_budget=6,
         workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 4.0}),
    dict(output_length_known=False, workload=TIMED_ENV, time_model="llama2-70b-tp2-a100"),
    dict(output_length_known=True, workload=TIMED_ENV, time_model="llama2-70b-tp2-a100", eviction="estimate"),
])
def test_env_stream_gives_the_full_modes_steps_and_metrics(setup, jit, monkeypatch):
    full, stream = _env_pair(jit, monkeypatch, horizon=9000, **setup)
    assert full.engine.jit == stream.engine.jit == jit
    of, _ = full.reset(seed=4)
    os_, _ = stream.reset(seed=4)
    rng = np.random.default_rng(0)
    done = False
    while not done:
        a = full.action_space.sample() if setup.get("per_class_budget") else int(rng.integers(0, 30))
        of, rf, tf, uf, inf = full.step(a)
        os_, rs, ts, us, ins = stream.step(a)
        assert rf == rs and (tf, uf) == (ts, us) and inf == ins
        for k in of:
            assert np.array_equal(of[k], os_[k]), k
        done = tf or uf
    assert stream.engine._id_base > 0
    assert full.engine.total_evictions > 0 or setup.get("per_class_budget")  # small b_k: no overflow
    _assert_same_metrics(full.metrics(), stream.metrics(), timed=full.engine.timed, full=full.engine)
    with pytest.raises(ValueError, match="record='stream'"):
        stream.request_log()


def test_env_record_argument_is_checked_and_vectors_fall_back_by_name():
    import gymnasium as gym

    from flowgym.envs.flow_control import FlowControlEnv
    from flowgym.envs.vector import FlowControlVectorEnv

    with pytest.raises(ValueError, match=r"record must be one of \['full', 'stream'\], got 'streaming'"):
        FlowControlEnv(record="streaming")
    envs = gym.make_vec("FlowControl-v0", num_envs=2, record="stream", horizon=50)
    assert envs.backend == "sync" and "record='stream'" in envs.fallback_reason
    envs.reset(seed=0)
    envs.step(np.array([3, 4]))
    with pytest.raises(ValueError, match="does not support record='stream'"):
        FlowControlVectorEnv(2, record="stream")
    assert gym.make_vec("FlowControl-v0", num_envs=2, horizon=50).backend == "batched"  # full: batched
