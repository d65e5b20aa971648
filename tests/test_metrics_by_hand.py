"""Every metric of docs/model.md on a trace worked out by hand, in slots and in continuous time.

M = 10, budget B_t = 2 every slot, LIFO eviction, T = 6 slots. Requests (id: a, l, o):
r0 (0, 2, 2), r1 (0, 3, 3), r2 (1, 8, 3), r3 (1, 4, 4), r4 (3, 1, 5).

slot 0: r0, r1 arrive and are admitted; D = (2+0+1) + (3+0+1) = 7; both decode (j = 1). U_0 = 7.
slot 1: r2 arrives with l + o = 11 > M: rejected. r3 arrives, is admitted; D = 4 + 5 + 5 = 14 > 10:
        LIFO evicts r3 (j = 0: nothing wasted; eviction 1), D = 9. r0 reaches j = 2 = o: f_0 = 2. U_1 = 9.
slot 2: r3 admitted again; D = (3+2+1) + (4+0+1) = 11 > 10: r3 evicted again (eviction 2), D = 6.
        r1 reaches j = 3: f_1 = 3. U_2 = 6.
slot 3: r4 arrives; r3, r4 admitted; D = 5 + 2 = 7; both decode. U_3 = 7.
slot 4: D = (4+1+1) + (1+1+1) = 9; both decode (j = 2). U_4 = 9.
slot 5: D = 7 + 4 = 11 > 10: LIFO evicts r4 (admitted after r3 in slot 3), wasting its j = 2 tokens
        (eviction 3), D = 7; r3 decodes (j = 3). U_5 = 7.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import flowgym

A, L, O = [0, 0, 1, 1, 3], [2, 3, 8, 4, 1], [2, 3, 3, 4, 5]


def run(timed: bool, offset: float = 0.0, env_out: list | None = None):
    if timed:  # iterations of 0.5 s, arrivals at half the slot numbers: the same schedule, in seconds
        tr = flowgym.Trace([offset + a / 2 for a in A], L, O, timed=True)
        env = flowgym.FlowControlEnv(workload=tr, M=10, horizon=6, time_model={"kind": "linear", "c0": 0.5})
    else:
        env = flowgym.FlowControlEnv(workload=flowgym.Trace(A, L, O), M=10, horizon=6)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, te, tr_, _ = env.step(2)
        done = te or tr_
    if env_out is not None:
        env_out.append(env)
    return env.metrics()


def test_every_metric_in_slots():
    m = run(timed=False)
    assert m["T"] == 6 and m["elapsed"] == 6
    assert m["arrived"] == 5  # r0..r4 arrive before slot 6
    assert m["rejected"] == 1  # r2: l + o = 11 > M
    assert m["completed"] == 2  # f_0 = 2, f_1 = 3
    assert m["unfinished"] == 2  # arrived - rejected - completed: r3, r4 (a rejected request is not unfinished)
    assert m["avg_latency"] == (2 - 0 + 3 - 0) / 2  # 2.5, over completed requests
    assert m["p95_latency"] == pytest.approx(2 + 0.95 * (3 - 2))  # numpy's linear percentile of [2, 3]
    # min(f_i, T) - a_i over the 4 requests not rejected: r0 2, r1 3, r3 6 - 1 = 5, r4 6 - 3 = 3
    assert m["mean_time_in_system"] == (2 + 3 + 5 + 3) / 4
    assert m["request_throughput"] == 2 / 6
    assert m["token_throughput"] == (2 + 3) / 6  # output tokens of completed requests
    # tokens decoded per slot, the completing slot's and the wasted ones included: 2, 2, 1, 2, 2, 1
    assert m["generated_token_throughput"] == 10 / 6
    assert m["evictions"] == 3 and m["overflow_events"] == 3  # slots 1, 2 and 5
    assert m["wasted_tokens"] == 0 + 0 + 2  # r3 twice with j = 0, r4 with j = 2
    u = np.array([7, 9, 6, 7, 9, 7]) / 10
    np.testing.assert_allclose(m["kv_usage"], u)
    assert m["mean_kv_usage"] == pytest.approx(0.75)
    assert m["std_kv_usage"] == pytest.approx(math.sqrt(0.075 / 6))  # population std: squares .0025/.0225
    assert m["max_kv_usage"] == 0.9


def test_every_metric_in_continuous_time():
    m = run(timed=True)
    assert m["T"] == 6 and m["elapsed"] == pytest.approx(3.0)  # 6 iterations of 0.5 s
    assert (m["arrived"], m["rejected"], m["completed"], m["unfinished"]) == (5, 1, 2, 2)
    assert m["avg_latency"] == pytest.approx((1.0 + 1.5) / 2)  # seconds: f_0 = 1.0 s, f_1 = 1.5 s
    assert m["p95_latency"] == pytest.approx(1.0 + 0.95 * 0.5)
    # up to the end of the run (3.0 s): r0 1.0, r1 1.5, r3 3.0 - 0.5 = 2.5, r4 3.0 - 1.5 = 1.5
    assert m["mean_time_in_system"] == pytest.approx((1.0 + 1.5 + 2.5 + 1.5) / 4)
    assert m["request_throughput"] == pytest.approx(2 / 3.0)  # per second
    assert m["token_throughput"] == pytest.approx(5 / 3.0)
    assert m["generated_token_throughput"] == pytest.approx(10 / 3.0)
    assert (m["evictions"], m["overflow_events"], m["wasted_tokens"]) == (3, 3, 2)
    assert m["mean_kv_usage"] == pytest.approx(0.75) and m["max_kv_usage"] == 0.9  # per iteration


@pytest.mark.parametrize("offset", [7.25, 1_700_000_000.0])
def test_a_trace_in_its_own_time_base_counts_from_its_first_arrival(offset):
    """The same schedule with every arrival ``offset`` seconds later (7.25 s, or Unix time): the run starts at
    the first arrival, so every metric is the one above (elapsed 3.0 s from 7.25 s to 10.25 s, not 10.25 s);
    the request log keeps the trace's times: f_0 = offset + 1.0, f_1 = offset + 1.5."""
    envs: list = []
    m, m0 = run(timed=True, offset=offset, env_out=envs), run(timed=True)
    assert m["elapsed"] == m0["elapsed"] == pytest.approx(3.0) and m["request_throughput"] == m0["request_throughput"]
    for k in ("avg_latency", "p95_latency", "mean_time_in_system", "token_throughput", "generated_token_throughput",
              "completed", "arrived", "rejected", "unfinished", "evictions", "wasted_tokens", "mean_kv_usage"):
        assert m[k] == m0[k], k
    log = envs[0].request_log()
    assert log["arrival_time"].tolist() == [offset + a / 2 for a in A]
    assert log["finish_time"][:2].tolist() == [offset + 1.0, offset + 1.5]
    np.testing.assert_allclose(envs[0].series()["time"], offset + 0.5 * np.arange(1, 7), rtol=0, atol=1e-12)
    assert envs[0].series()["elapsed"].tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    # a series without "elapsed" (one built by hand, or of an older run) counts from 0 of its time base
    from flowgym.sim.metrics import compute_metrics

    old = {k: v for k, v in envs[0].series().items() if k != "elapsed"}
    assert compute_metrics(log, old, 10)["elapsed"] == offset + 3.0
    assert compute_metrics(log, old, 10)["request_throughput"] == 2 / (offset + 3.0)


def test_a_request_finishing_at_the_horizon_is_completed():
    """f_i = T counts as completed (f_i <= T), in a T-slot run and in the first T slots of a longer one."""
    from flowgym.sim.metrics import metrics_at

    env = flowgym.FlowControlEnv(workload=flowgym.Trace(A, L, O), M=10, horizon=6)
    env.reset(seed=0)
    for _ in range(6):
        env.step(2)
    prefix = metrics_at(env.request_log(), env.series(), 10, 3)  # r1 finishes at f_1 = 3 = T
    short = flowgym.FlowControlEnv(workload=flowgym.Trace(A, L, O), M=10, horizon=3)
    short.reset(seed=0)
    for _ in range(3):
        short.step(2)
    for m in (prefix, short.metrics()):
        assert m["completed"] == 2 and m["avg_latency"] == 2.5
        assert m["unfinished"] == 1  # r3 (r4 arrives at slot 3, after the first 3 slots)
        assert m["arrived"] == 4 and m["rejected"] == 1


def test_counts_add_up_over_requests_and_slots():
    """Hand-built log and series: two rejections, wasted tokens in two slots (sums, not maxima)."""
    from flowgym.sim.metrics import compute_metrics

    log = {"arrival": np.array([0, 0, 1, 2]), "output_len": np.array([2, 5, 3, 4]),
           "finish": np.array([3, -1, -1, -1]), "evictions": np.array([0, 2, 0, 0]),
           "rejected": np.array([False, False, True, True])}
    series = {"usage": np.array([4, 8, 6, 5]), "evicted": np.array([0, 1, 0, 1]),
              "wasted_tokens": np.array([0, 3, 0, 2]), "active": np.array([2, 1, 0, 1]),
              "completed": np.array([0, 0, 1, 0])}
    m = compute_metrics(log, series, 10)
    assert m["rejected"] == 2 and m["arrived"] == 4 and m["completed"] == 1 and m["unfinished"] == 1
    assert m["wasted_tokens"] == 5 and m["evictions"] == 2 and m["overflow_events"] == 2
    assert m["mean_time_in_system"] == ((3 - 0) + (4 - 0)) / 2  # r0 done at 3; r1 waits to T = 4
    assert m["generated_token_throughput"] == (2 + 1 + 1 + 1) / 4
