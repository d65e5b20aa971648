"""Engine behaviour that the mutation run of ``flowgym/sim/engine.py`` found unpinned
(docs/testing.md lists the mutants): an eviction rule that frees too little is refused, and in
continuous time the clock neither jumps while a batch runs nor misses an arrival that falls
exactly on the start of an iteration, nor hangs when no request will ever come.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowgym
from flowgym import FlowControlEnv, Trace
from flowgym.sim.engine import Engine
from flowgym.sim.rules import EvictionRule

LIN = {"kind": "linear", "c0": 1.0, "c_prefill": 0.1, "c_decode": 0.01, "c_kv": 0.001}


class OldestOnly(EvictionRule):
    """A broken rule: evicts only the oldest active request, whatever the excess."""

    name = "oldest-only"

    def select(self, active, excess):
        return np.array([0])


class Nobody(EvictionRule):
    name = "nobody"

    def select(self, active, excess):
        return np.array([], dtype=np.int64)


@pytest.mark.parametrize("rule", [OldestOnly(), Nobody()])
def test_an_eviction_rule_that_frees_too_little_is_refused(rule):
    """r0 = (0, 1, 2), r1 = r2 = (0, 8, 2), B = 3, M = 10: t0 demand 2 + 9 + 9 = 20, excess 10;
    evicting r0 alone frees 2 (and nobody frees 0): the engine names the rule instead of going on
    with 18 > M tokens."""
    with pytest.raises(RuntimeError, match=f"eviction rule '{rule.name}' did not free 10 tokens"):
        flowgym.replay([0, 0, 0], [1, 8, 8], [2, 2, 2], M=10, budgets=3, eviction=rule, horizon=3)


def _timed_run(trace, time_model, budget=5, M=1000):
    env = FlowControlEnv(M=M, workload=trace, horizon=None, time_model=time_model)
    env.reset(seed=0)
    infos, done = [], False
    while not done:
        _, _, te, tr, info = env.step(budget)
        infos.append(info)
        done = te or tr
    return env, infos


def test_clock_does_not_jump_while_a_batch_runs_with_an_empty_queue():
    """d = 1 + 0.1 P + 0.01 D + 0.001 K s. r0 (0.0 s, l 2, o 3), r1 (5.0 s, l 1, o 1); B = 5.

    - iteration 0 at 0.0: r0 joins and starts: P = 2, D = 0, K = 0 -> d = 1.2, ends 1.2.
    - iteration 1 at 1.2: the queue is empty but r0 decodes (j = 1): no jump to r1's 5.0;
      P = 0, D = 1, K = 2 + 1 = 3 -> d = 1.013, ends 2.213.
    - iteration 2 at 2.213: D = 1, K = 4 -> d = 1.014, ends 3.227; r0 finishes (j = 3).
    - iteration 3: idle, jumps to 5.0: r1 joins, P = 1 -> d = 1.1, ends 6.1.
    """
    env, infos = _timed_run(Trace([0.0, 5.0], [2, 1], [3, 1], timed=True), LIN)
    assert [round(i["time"], 9) for i in infos] == [1.2, 2.213, 3.227, 6.1]
    assert [i["arrived"] for i in infos] == [1, 0, 0, 1]
    log = env.request_log()
    assert log["arrival"].tolist() == [0, 3]
    np.testing.assert_allclose(log["finish_time"], [3.227, 6.1])


def test_an_arrival_exactly_at_an_iteration_start_on_a_chunk_boundary_joins_it():
    """Arrivals are generated in 60-second chunks. With d = 1 s per iteration, iteration 60
    starts at exactly 60.0 s, the first instant of the second chunk, while r0 (o = 100) still
    runs; r1 arriving at 60.0 joins iteration 60 ("the first iteration that starts at or after
    its arrival time", the spec) and finishes at its end, 61.0 s."""
    env, infos = _timed_run(Trace([0.0, 60.0], [1, 1], [100, 1], timed=True), lambda P, D, K, B: 1.0)
    log = env.request_log()
    assert log["arrival"].tolist() == [0, 60]
    assert log["finish_time"].tolist() == [100.0, 61.0]


def test_a_workload_that_never_sends_a_request_does_not_hang_in_continuous_time():
    """An infinite timed workload with rate 0 (and one whose rate is unknown, ``None``, that sends
    nothing): the idle server finds no next arrival and the iteration ends with nothing to do."""
    from flowgym.sim.workloads import Workload, Requests

    class Silent(Workload):
        timed = True
        chunk_span = 60.0

        def sample(self, rng, t0, t1):
            return Requests.empty()

    for wl in ({"kind": "iid", "rate": 0.0, "lengths": {"kind": "lmsys-like"}, "timed": True}, Silent()):
        eng = Engine(100, wl, time_model=LIN)
        eng.reset(np.random.default_rng(0))
        for _ in range(3):
            assert eng.arrive() == 0
            eng.serve(1)
        assert eng.total_arrived == 0 and eng.t == 3


def test_gaps_of_years_between_arrivals_cost_one_chunk_each():
    """Chunks of 60 s hold no request between r0 (0 s), r1 (1e8 s, about 3 years) and r2 (4e9 s,
    about 127 years, near the 2**32 s a timed trace may reach): the idle server jumps to each without
    generating the 67 million empty chunks one by one, and each is served at its arrival time:
    d = 1 + 0.1 * 1 = 1.1 s."""
    env, infos = _timed_run(Trace([0.0, 1e8, 4e9], [1, 1, 1], [1, 1, 1], timed=True), LIN)
    assert len(infos) == 3
    assert env.request_log()["finish_time"].tolist() == pytest.approx([1.1, 1e8 + 1.1, 4e9 + 1.1], rel=1e-12)


def test_rejections_in_continuous_time_are_counted_per_iteration():
    """M = 10: r0 (0.0 s, l 2, o 2) fits; r1 and r2 (both 0.5 s, l 6, o 6: 12 > 10) are rejected
    on arrival, in the same iteration (the one starting at 1.2 s); r3 (0.7 s, l 1, o 1) and r4
    (0.8 s, l 3, o 1) join it. Iteration 0: arrived 1, rejected 0, waiting prompt tokens 2 before
    admission; iteration 1: arrived 4, rejected 2, waiting prompt tokens 1 + 3 = 4; iteration 2:
    nothing arrives (and nothing is rejected), nothing waits."""
    eng = Engine(10, Trace([0.0, 0.5, 0.5, 0.7, 0.8], [2, 6, 6, 1, 3], [2, 6, 6, 1, 1], timed=True),
                 time_model=LIN)
    eng.reset(np.random.default_rng(0))
    seen = []
    for _ in range(3):
        n = eng.arrive()
        seen.append((n, eng.last_arrivals, eng.last_rejected, eng.queued_prompt_tokens))
        eng.serve(5)
    assert seen == [(1, 1, 0, 2), (4, 4, 2, 4), (0, 0, 0, 0)]  # iteration 2: nothing arrives
    assert eng.total_rejected == 2 and eng.total_arrived == 5
    assert eng.request_log()["rejected"].tolist() == [False, True, True, False, False]


def test_a_finished_timed_trace_keeps_serving_idle_iterations():
    """Driven past its last request (the engine, unlike the environment, does not stop), the
    iterations are idle: nothing arrives, nothing runs, the run does not hang."""
    eng = Engine(100, Trace([0.0], [1], [1], timed=True), time_model=LIN)
    eng.reset(np.random.default_rng(0))
    arrived = []
    for _ in range(6):
        arrived.append(eng.arrive())
        eng.serve(1)
    assert arrived == [1, 0, 0, 0, 0, 0]
    assert eng.total_completed == 1 and eng.in_system == 0 and eng.t == 6
    assert eng.request_log()["finish_time"].tolist() == pytest.approx([1.1])


@pytest.mark.parametrize("path", ["compiled", "numpy"])
def test_a_batch_larger_than_the_active_arrays_is_admitted_at_once(path):
    """600 requests (l 1, o 2) at t = 0, B = 600, M = 10**5: the active arrays (256 entries at
    first) grow to take them in one admission; all finish at t = 2, usage 600 * 2 then 600 * 3."""
    from test_reference_rules import _both

    r = _both(path, [0] * 600 + [1] * 300, [1] * 900, [2] * 900, M=10**5, budgets=[600, 600, 600], horizon=5)
    assert r["finish"].tolist() == [2] * 600 + [3] * 300
    assert r["usage"].tolist() == [1200, 1800 + 600, 900, 0, 0]


def test_two_requests_evicted_in_their_admission_iteration_are_not_charged():
    """d = 1 + 0.1 P + 0.01 D + 0.001 K s; M = 6; r0 (l 3, o 3), r1 (l 2, o 3), r2 (l 1, o 2), all
    at 0.0 s; LIFO.
    - iteration 0, B = 1: r0 starts: P = 3 -> d = 1.3.
    - iteration 1, B = 2: r1, r2 start: demand 5 + 3 + 2 = 10 > 6, excess 4: r2 (frees 2), then
      r1 (frees 3) are evicted, both in the iteration that admitted them: neither is prefilled
      (P = 3 - 3 = 0) nor decodes (D = 1, r0 alone), K = 3 + 1 = 4 -> d = 1.014."""
    env = FlowControlEnv(M=6, workload=Trace([0.0, 0.0, 0.0], [3, 2, 1], [3, 3, 2], timed=True), horizon=None,
                         time_model=LIN, max_budget=2)
    env.reset(seed=0)
    i0 = env.step(1)[4]
    i1 = env.step(2)[4]
    assert i0["duration"] == pytest.approx(1.3)
    assert i1["evicted"] == 2
    assert i1["duration"] == pytest.approx(1.014)


def test_an_idle_server_jumps_to_the_next_arrival_at_a_low_rate():
    """Poisson arrivals at 0.05 per second (a few per 60-second chunk, so the server often waits
    past the end of what has been generated): whenever the system is empty, the next iteration
    starts at the next arrival's time, or at once if one came during the last iteration (it does
    not idle for ``c0`` seconds at a time): every iteration that starts empty receives a request."""
    eng = Engine(10_000, {"kind": "iid", "rate": 0.05, "timed": True,
                                 "lengths": {"kind": "lognormal", "prompt_median": 2, "prompt_mean": 3,
                                             "output_median": 2, "output_mean": 3, "max_prompt": 10,
                                             "max_output": 10}},
                 time_model=LIN)
    eng.reset(np.random.default_rng(3))
    jumps = 0
    for _ in range(300):
        empty, first, before = eng.in_system == 0, eng.n_arrived, eng.now
        n = eng.arrive()
        if empty:
            assert n >= 1
            assert eng.now == max(before, eng.arrival_time[first])
            jumps += eng.now > before
        eng.serve(8)
    assert jumps > 10


def test_replay_until_drained_gives_up_after_its_documented_cap():
    """``horizon=None`` raises once ``last arrival + 10 * sum(l + o) + 100`` slots have run without
    draining: one request (0, 1, 1) gives a cap of 0 + 10 * 2 + 100 = 120 slots. Admitted at slot
    119 it finishes at 120, when the run stops (drained, before the cap's check); admitted at
    slot 120 it is too late."""
    r = flowgym.replay([0], [1], [1], M=10, budgets=[0] * 119 + [1])
    assert r["finish"].tolist() == [120] and r["slots"] == 120
    with pytest.raises(RuntimeError, match="within 120 slots"):
        flowgym.replay([0], [1], [1], M=10, budgets=[0] * 120 + [1])
    with pytest.raises(RuntimeError, match=r"within 120 slots \(1 requests still in it; the cache did not overflow "
                       r"in the last 100 slots: the budgets leave them waiting"):
        flowgym.replay([0], [1], [1], M=10, budgets=0)
    # overflows at the start, then the sequence ran out: what the run ended doing decides the message
    with pytest.raises(RuntimeError, match=r"did not overflow in the last 100 slots: .* 0 past its end"):
        flowgym.replay([0, 0, 0], [4, 4, 4], [6, 6, 6], M=12, budgets=[3, 3, 3])


def test_replay_that_evicts_forever_says_so_not_that_the_budget_is_too_small():
    """Under eviction 'all' a budget that admits more than the cache holds evicts every admission in every slot
    (a livelock of the model, not of the engine): the message names the overflows and the rule."""
    with pytest.raises(RuntimeError, match=r"within 452 slots \(3 requests still in it; the cache overflowed in 100 "
                       r"of the last 100 slots: a budget that admits more .* \(eviction 'all'\)\)"):
        flowgym.replay([0, 0, 2], [12, 9, 7], [3, 3, 1], M=16, budgets=3, eviction="all", queue_order="estimate")


def test_replay_with_classes_wants_one_budget_per_class():
    r = flowgym.replay([0, 0, 0], [1, 1, 1], [2, 2, 2], M=100, budgets=[1, 2], classes=[0, 1, 1], horizon=5)
    assert r["finish"].tolist() == [2, 2, 2]  # class 0 admits one, class 1 two: all at slot 0
    with pytest.raises(ValueError, match="one budget per class"):
        flowgym.replay([0, 0], [1, 1], [1, 1], M=10, budgets=[[1, 2]], classes=[0, 1], horizon=3)


# --------------------------------------------------------------------------- construction, reset, reading
# (the second engine run: the lines outside the slot phases and replay; docs/testing.md)


@pytest.mark.parametrize("floor", [0, -1, True, 1.5, "2"])
def test_estimate_floor_must_be_a_positive_integer(floor):
    """``estimate_floor``: "initial output estimate of every request" (>= 1, an integer)."""
    with pytest.raises(ValueError, match="estimate_floor must be a positive integer"):
        Engine(100, Trace([0], [1], [1]), queue_order="estimate", estimate_floor=floor)
    assert Engine(100, Trace([0], [1], [1]), estimate_floor=np.int64(3)).estimate_floor == 3


def test_per_class_queue_counts_are_kept_when_asked_and_only_with_classes():
    """``track_class_queue`` keeps per-class queue counts, for workloads with classes only; not
    asked, nothing is counted."""
    classed = Trace([0, 0, 0], [1, 1, 1], [1, 1, 1], cls=[0, 1, 1])
    eng = Engine(100, classed, track_class_queue=True)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    assert eng.track_class_queue and eng.class_queue.tolist() == [1, 2]
    eng = Engine(100, classed, track_class_queue=False)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    assert not eng.track_class_queue and eng.class_queue.tolist() == [0, 0]
    assert not Engine(100, Trace([0], [1], [1]), track_class_queue=True).track_class_queue
    one_class = Engine(100, Trace([0, 0], [1, 1], [1, 1], cls=[0, 0]), track_class_queue=True)
    one_class.reset(np.random.default_rng(0))
    one_class.arrive()
    assert one_class.track_class_queue and one_class.class_queue.tolist() == [2]


def test_a_new_engine_is_at_slot_0():
    assert Engine(100, Trace([0], [1], [1])).t == 0


def _lin(P, D, K, B):
    """LIN as user code: a callable time model, whose duration the engine previews before the step."""
    return 1.0 + 0.1 * P + 0.01 * D + 0.001 * K


def _timed_clock(time_model, per_class, budgets, eviction):
    rng = np.random.default_rng(11)
    n = 120
    arrival = np.sort(rng.uniform(0.0, 60.0, n))
    cls = rng.integers(0, 2, n)
    prompt = np.where(cls == 0, rng.integers(1, 6, n), rng.integers(8, 20, n))
    output = rng.integers(1, 12, n)
    eng = Engine(60, Trace(arrival, prompt, output, cls=cls, timed=True), time_model=time_model,
                 per_class=per_class, eviction=eviction)
    eng.reset(np.random.default_rng(0))
    for t in range(160):
        eng.arrive()
        eng.serve(budgets(t))
    return eng.series(), eng.request_log(), eng.total_evictions


@pytest.mark.parametrize("eviction", ["lifo", "all", "estimate"])
@pytest.mark.parametrize("per_class", [False, True])
def test_a_callable_time_model_previews_the_same_iterations_as_the_built_in_one(per_class, eviction):
    """Rule: with a callable ``time_model`` the engine computes each iteration's duration before the
    step (admission of the queue heads, then eviction, changing nothing) and checks it against
    what the step does; the durations are those of the same formula as a built-in linear model.
    M = 60 with budgets up to 7 (0 some iterations, more than the queue others) evicts often;
    per-class budgets admit from both lanes; A_min's estimate rule reads the estimates
    ``max(floor, j + 1)`` in the preview too."""
    if per_class:
        def budgets(t):
            return np.array([t % 4, (t // 2) % 3])
    else:
        def budgets(t):
            return (3 * t) % 8
    s_lin, log_lin, ev = _timed_clock(LIN, per_class, budgets, eviction)
    s_fn, log_fn, ev_fn = _timed_clock(_lin, per_class, budgets, eviction)
    assert ev > 20 and ev_fn == ev
    np.testing.assert_allclose(s_fn["time"], s_lin["time"], rtol=1e-12)
    for key in ("admitted", "evicted", "usage", "completed"):
        assert s_fn[key].tolist() == s_lin[key].tolist(), key
    assert log_fn["finish"].tolist() == log_lin["finish"].tolist()


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("kw", [{}, {"queue_order": "sjf"}, {"record": "stream"}])
def test_memory_bytes_is_the_sum_of_the_engines_buffers(kw, jit):
    """``memory_bytes``: the bytes of the request table, active set, clock, slot records, every
    queue lane (ids, and keys when the order is keyed), the compiled path's completion calendar
    (numpy arrays; the numpy path's are Python lists) and the streaming totals."""
    from flowgym.sim import kernels

    if jit and not kernels.AVAILABLE:
        pytest.skip("numba not installed")
    eng = Engine(1000, Trace([0, 0, 1, 2], [3, 5, 2, 4], [4, 2, 6, 1], cls=[0, 1, 0, 1]), **kw)
    eng.jit = jit
    eng.reset(np.random.default_rng(0))
    for _ in range(3):
        eng.arrive()
        eng.serve(1)
    want = sum(getattr(eng, name).nbytes for name in (
        "arrival", "prompt", "output", "cls", "finish", "evictions", "rejected", "estimate", "arrival_time",
        "_a_id", "_a_start", "_a_fin", "_clock", "_rec"))
    for lane in eng.lanes:
        want += lane.buf.nbytes
        if lane.keyed:
            want += lane.kbuf.nbytes
    assert all(ln.keyed for ln in eng.lanes) == (kw.get("queue_order") == "sjf")
    if jit:
        want += eng._cal_n.nbytes + eng._cal_tok.nbytes
    if kw.get("record") == "stream":
        want += eng._stream.nbytes
    assert eng.memory_bytes() == want


def test_reset_empties_the_last_steps_counters_too():
    """``reset`` empties the system: before the first ``arrive`` nothing has arrived, been rejected or
    completed, in the last step as in total (a reset after a run must not leave its counters)."""
    eng = Engine(10, Trace([0, 0, 1], [3, 20, 2], [2, 1, 1]))
    for _ in range(2):
        eng.reset(np.random.default_rng(0))
        assert (eng.last_arrivals, eng.last_rejected, eng.last_completed_tokens) == (0, 0, 0)
        assert (eng.total_arrived, eng.total_rejected, eng.total_completed, eng.n_arrived) == (0, 0, 0, 0)
        assert eng.t == 0 and eng.in_system == 0 and eng.held == 0
        for _ in range(2):  # r1 (l + o = 21 > M) is rejected; r0 (f = 2) and r2 (f = 2) complete
            eng.arrive()
            eng.serve(2)
        assert (eng.total_arrived, eng.total_rejected, eng.total_completed) == (3, 1, 2)
        assert eng.last_completed_tokens == 5 + 3 and eng.last_arrivals == 1


def test_a_callable_time_model_with_demand_exactly_m_evicts_nobody():
    """Overflow is ``D_t > M``: a request of l 4, o 2 under M = 6 holds l + j + 1 = 6 tokens in its
    second iteration; the preview of a callable model must not go into eviction (excess 0) either.
    d = 1 + 0.1 P + 0.01 D + 0.001 K: 1.4 (P = 4), then 1 + 0.01 + 0.005 (D = 1, K = 5)."""
    for tm in (LIN, _lin):
        eng = Engine(6, Trace([0.0], [4], [2], timed=True), time_model=tm)
        eng.reset(np.random.default_rng(0))
        eng.arrive()
        eng.serve(1)
        eng.arrive()
        st = eng.serve(1)
        assert (st.usage, st.evicted, st.completed) == (6, 0, 1)
        assert eng.now == pytest.approx(1.4 + 1.015)


def test_streaming_drops_rejected_rows_too():
    """``record="stream"`` keeps memory flat: finished *and rejected* requests are dropped from the
    request table. Here half the requests are rejected (l + o = 4500 > M): rejections count as dead
    rows as much as completions (10 a slot in all, 100 active)."""
    wl = {"kind": "iid", "rate": 10.0,
          "lengths": {"kind": "empirical", "pairs": [[10, 20], [2000, 2500]], "weights": [1.0, 1.0]}}
    eng = Engine(4000, wl, record="stream")
    eng.reset(np.random.default_rng(1))
    for _ in range(3000):
        eng.arrive()
        eng.serve(12)
    assert eng.total_rejected > 12_000 and eng.total_completed > 12_000
    assert eng._id_base > 20_000  # dropped
    assert eng.n_req < 12_000  # what is left: the live rows and fewer dead ones than 4096 + live


def test_active_remaining_is_output_left_to_generate():
    """``active_remaining``: ``o - j`` of each active request in activation order (uses output lengths)."""
    eng = Engine(100, Trace([0, 0, 1], [2, 2, 2], [5, 3, 4]))
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    eng.serve(2)  # r0, r1 start at 0: j = 1 after slot 0
    eng.arrive()
    assert eng.active_remaining().tolist() == [4, 2]
    eng.serve(1)  # r2 starts at 1
    eng.arrive()
    assert eng.active_remaining().tolist() == [3, 1, 3]
    assert eng.active_generated().tolist() == [2, 2, 1]


@pytest.mark.parametrize("jit", [False, True])
def test_generated_histogram_into_out_writes_at_offset_0_by_default(jit):
    """``generated_histogram(edges, out)`` writes ``out[0 : edges.size]`` (``offset`` defaults to 0)."""
    from flowgym.sim import kernels

    if jit and not kernels.AVAILABLE:
        pytest.skip("numba not installed")
    eng = Engine(100, Trace([0, 0, 1], [2, 2, 2], [5, 3, 4]))
    eng.jit = jit
    eng.reset(np.random.default_rng(0))
    for b in (2, 1):
        eng.arrive()
        eng.serve(b)
    edges = np.array([0, 2, 4], np.int64)  # j = 2, 2, 1: bins [0, 2) 1, [2, 4) 2, [4, inf) 0
    out = np.full(5, -9, np.int64)
    assert eng.generated_histogram(edges, out) is out
    assert out.tolist() == [1, 2, 0, -9, -9]
    assert eng.generated_histogram(edges, out, 2).tolist() == [1, 2, 1, 2, 0]
    assert eng.generated_histogram(edges).tolist() == [1, 2, 0]


@pytest.mark.parametrize("M", [0, -5, True, 2.0, "8"])
def test_m_must_be_a_positive_integer(M):
    """``M`` is a positive integer; ``M = 1`` is one (every request, ``l + o >= 2``, is rejected)."""
    with pytest.raises(ValueError, match="M \\(the KV-cache budget in tokens\\) must be a positive integer"):
        Engine(M, Trace([0], [1], [1]))
    eng = Engine(1, Trace([0, 1], [1, 1], [1, 1]))
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    assert eng.serve(1).admitted == 0 and eng.total_rejected == 1


def test_a_callable_time_model_that_raises_leaves_the_step_undone():
    """Rule (the preview): a callable ``time_model`` gets the iteration's composition before the step
    changes anything, so when it raises, nothing was admitted and a retry admits once."""
    calls = []

    def flaky(P, D, K, B):
        calls.append((P, D, K, B))
        if len(calls) == 1:
            raise ZeroDivisionError("flaky")
        return 1.0

    eng = Engine(100, Trace([0.0, 0.0, 0.0], [2, 3, 4], [2, 2, 2], timed=True), time_model=flaky)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    with pytest.raises(RuntimeError, match="raised ZeroDivisionError: flaky .*the step was not applied"):
        eng.serve(2)
    assert (eng.n_queued, eng.n_active, eng.t) == (3, 0, 0)
    st = eng.serve(2)
    assert (st.admitted, st.queue_len, st.active) == (2, 1, 2)
    assert calls == [(5, 0, 0, 2), (5, 0, 0, 2)]


def test_queue_ids_with_per_class_lanes_are_every_lane_in_class_order():
    """``queue_ids``: queued ids in admission order, per-class lanes in class order (all of them)."""
    tr = Trace([0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], cls=[1, 0, 1, 2, 0])
    eng = Engine(100, tr, per_class=True)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    assert eng.queue_ids().tolist() == [1, 4, 0, 2, 3]
    eng.serve(np.array([1, 0, 0]))
    assert eng.queue_ids().tolist() == [4, 0, 2, 3]
    one = Engine(100, tr)
    one.reset(np.random.default_rng(0))
    one.arrive()
    q = one.queue_ids()
    assert q.tolist() == [0, 1, 2, 3, 4]
    q[0] = 99  # a copy
    assert one.queue_ids()[0] == 0


@pytest.mark.parametrize("jit", [False, True])
def test_active_readers_skip_a_finished_entry_in_the_middle(jit):
    """r0 (o 5), r1 (o 1), r2 (o 4) start at slot 0; r1 finishes at 1 but stays in the active arrays
    (dropped later, in blocks): the readers list r0 and r2 only (a finish slot ``f <= t`` is dead)."""
    from flowgym.sim import kernels

    if jit and not kernels.AVAILABLE:
        pytest.skip("numba not installed")
    eng = Engine(100, Trace([0, 0, 0], [2, 2, 2], [5, 1, 4]))
    eng.jit = jit
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    eng.serve(3)
    eng.arrive()
    assert eng._tail - eng._h == 3 and eng.n_active == 2  # the dead entry is still there
    assert eng.active_ids().tolist() == [0, 2]
    assert eng.active_starts().tolist() == [0, 0]
    assert eng.active_generated().tolist() == [1, 1]
    assert eng.active_remaining().tolist() == [4, 3]
    assert eng.generated_histogram(np.array([0, 1, 2], np.int64)).tolist() == [0, 2, 0]


@pytest.mark.parametrize("jit", [False, True])
def test_projected_demand_of_a_single_active_request(jit):
    """``projected_demand``: a request finishing at ``f = t + u`` holds ``l + j + h + 1`` tokens at
    ``t + h`` while ``u > h``. r0 (l 3, o 4) starts at 0, so at t = 1: j = 1, u = 3: 5, 6, 7, then 0.
    With r1 (l 2, o 2) started at 1 too, at t = 2: r0 6, 7 then 0; r1 (j 1, u 1) 4 then 0."""
    from flowgym.sim import kernels

    if jit and not kernels.AVAILABLE:
        pytest.skip("numba not installed")
    eng = Engine(100, Trace([0, 1], [3, 2], [4, 2]))
    eng.jit = jit
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    eng.serve(1)
    h = np.array([0, 1, 2, 3, 5], np.int64)
    assert eng.n_active == 1
    assert eng.projected_demand(h).tolist() == [5, 6, 7, 0, 0]
    eng.arrive()
    eng.serve(1)
    assert eng.projected_demand(h).tolist() == [6 + 4, 7, 0, 0, 0]


@pytest.mark.parametrize("rule", [OldestOnly(), Nobody()])
def test_with_a_callable_time_model_a_rule_that_frees_too_little_is_refused_before_the_step(rule):
    """The preview asks the eviction rule first: its refusal (as in
    ``test_an_eviction_rule_that_frees_too_little_is_refused``) comes before anything is admitted."""
    eng = Engine(10, Trace([0.0, 0.0, 0.0], [1, 8, 8], [2, 2, 2], timed=True), eviction=rule, time_model=_lin)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    with pytest.raises(RuntimeError, match=f"eviction rule '{rule.name}' did not free 10 tokens"):
        eng.serve(3)
    assert (eng.n_queued, eng.n_active, eng.t, eng.now) == (3, 0, 0, 0.0)


def test_streaming_in_continuous_time_survives_many_clock_trims(monkeypatch):
    """The streaming mode trims the clock to the slots still needed and folds finished requests
    with their clock entries. With a series window of 32 iterations and recycling from 16 dead
    rows (instead of 4096 and 4096) a 1500-iteration run trims the clock at each of its recycles
    (every 256 iterations), each trim reading it past the previous trim's base, and folds
    latencies after trims: the metrics and
    the last window's times are still the full mode's."""
    import flowgym.sim.engine as engine_mod
    from flowgym.sim.engine import SlotStats
    from flowgym.sim.streaming import StreamTotals
    from test_streaming import TIMED, _assert_same_metrics

    monkeypatch.setattr(engine_mod, "_RECYCLE_MIN", 16)
    engines = []
    for record in ("full", "stream"):
        e = Engine(16492, TIMED, record=record, time_model="llama2-70b-tp2-a100")
        e.reset(np.random.default_rng(7))
        if record == "stream":
            e._stream = StreamTotals(len(SlotStats._fields), True, window=32)
        engines.append(e)
    full, stream = engines
    rng = np.random.default_rng(3)
    trims = 0
    for s in range(1500):
        full.arrive()
        stream.arrive()
        b = int(rng.integers(0, 16))
        base = stream._clock_base
        assert full.serve(b) == stream.serve(b)
        trims += stream._clock_base != base
        if s in (700, 1499) or stream._clock_base != base:  # right after a trim too (the elapsed
            # time is the kept clock's last entry)
            _assert_same_metrics(full.metrics(), stream.metrics(), timed=True, full=full)
    assert trims >= 4 and stream._id_base > 0  # recycling is considered every 256 iterations
    assert np.array_equal(stream.series()["time"], full.series()["time"][-32:])


@pytest.mark.parametrize("engine_cls", ["paper", "vllm-v1"])
@pytest.mark.parametrize("budget", [[], [2], [2, 2, 2, 2]])
def test_per_class_budgets_of_the_wrong_length_are_refused(engine_cls, budget):
    """Found by the mutation run: zip() paired lanes and budgets, silently dropping the missing classes."""
    from flowgym.sim.engine import Engine
    from flowgym.sim.vllm import VllmEngine

    wl = {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 1.0}
    eng = Engine(2000, wl, per_class=True) if engine_cls == "paper" else VllmEngine(2000, wl, per_class=True)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    with pytest.raises(ValueError, match=f"per-class budgets: 3 classes, got {len(budget)} budgets"):
        eng.serve(np.asarray(budget, np.int64))
    assert eng.t == 0  # nothing served
    eng.serve(np.array([1, 1, 1]))
    assert eng.t == 1


def test_replay_takes_the_first_output_estimate_as_the_environment_does():
    """``estimate_floor`` reaches the engine: on this trace A_min's order (eviction and queue by the estimate)
    finishes requests 2 and 3 in another order with a first estimate of 6 than of 1, each as the environment does
    with the same floor and a budget of 1; the default is the engine's 1; a bad floor is refused by name."""
    import gymnasium as gym

    from flowgym.sim.workloads import Trace

    a, l, o = [0, 2, 3, 3], [1, 5, 5, 2], [3, 7, 4, 3]
    kw = dict(M=17, budgets=1, eviction="estimate", queue_order="estimate", horizon=60)
    want = {1: [3, 9, 14, 12], 6: [3, 9, 13, 13]}
    for floor, finish in want.items():
        assert flowgym.replay(a, l, o, **kw, estimate_floor=floor)["finish"].tolist() == finish
        env = gym.make("FlowControl-v0", workload=Trace(a, l, o), M=17, eviction="estimate", queue_order="estimate",
                       estimate_floor=floor, horizon=60, max_budget=4)
        env.reset(seed=0)
        for _ in range(60):
            if any(env.step(1)[2:4]):
                break
        assert env.unwrapped.request_log()["finish"].tolist() == finish
    assert flowgym.replay(a, l, o, **kw)["finish"].tolist() == want[1]
    with pytest.raises(ValueError, match="estimate_floor must be a positive integer, got 0"):
        flowgym.replay(a, l, o, **kw, estimate_floor=0)
