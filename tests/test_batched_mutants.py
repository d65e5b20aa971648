"""Argument checks of ``flowgym/sim/batched.py`` that its mutation run found unpinned (docs/testing.md)."""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.sim.batched import BatchedEngine, BudgetError, unsupported
from flowgym.sim.workloads import IIDPoisson, MultiClassPoisson

PAIRS = {"kind": "empirical", "pairs": [[10, 20]]}


def test_a_timed_workload_is_refused_even_without_a_time_model():
    why = unsupported(100, IIDPoisson(1.0, PAIRS, timed=True))
    assert why is not None and why.startswith("time_model:")
    assert unsupported(100, IIDPoisson(1.0, PAIRS), timed=True).startswith("time_model:")
    assert unsupported(100, IIDPoisson(1.0, PAIRS)) is None


def test_requests_exactly_filling_the_cache_are_supported():
    # l + o = 10 + 20 = 30: fits M = 30 (a request of l + o <= M is never rejected), not M = 29
    assert unsupported(30, MultiClassPoisson([(10, 20)], 1.0)) is None
    assert unsupported(29, MultiClassPoisson([(10, 20)], 1.0)).startswith("M=29: ")


@pytest.mark.parametrize("M", [True, 1.5, 0, -3, "40"])
def test_m_must_be_a_positive_integer(M):
    with pytest.raises(ValueError, match="M \\(the KV-cache budget in tokens\\) must be a positive integer"):
        BatchedEngine(2, M, MultiClassPoisson([(1, 1)], 1.0))


@pytest.mark.parametrize("n", [True, 1.0, 0])
def test_num_envs_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        BatchedEngine(n, 100, MultiClassPoisson([(1, 1)], 1.0))


def test_class_queue_tracking_needs_classes():
    # an iid workload has no classes (m = 0): nothing to track
    assert BatchedEngine(2, 100, IIDPoisson(1.0, PAIRS), track_class_queue=True).track_class_queue is False
    assert BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), track_class_queue=True).track_class_queue is True


@pytest.mark.parametrize("edges", [[], [1, 2], [0, 0], [0, 5, 3], [[0, 1]]])
def test_histogram_edges_must_start_at_0_and_increase(edges):
    with pytest.raises(ValueError, match="hist_edges must start at 0 and increase strictly"):
        BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), hist_edges=edges)
    assert BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), hist_edges=[0]).K == 1
    assert BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), hist_edges=[0, 1, 2]).K == 3  # steps of 1


def _engine(jit, **kw):
    eng = BatchedEngine(2, 600, MultiClassPoisson([(10, 20), (10, 40), (10, 60)], 2.0 / 3), **kw)
    eng.jit = jit
    return eng


@pytest.mark.parametrize("jit", [True, False])
def test_a_reset_clears_every_eviction_count_of_the_longer_episode(jit):
    # env 0 runs 1,500 slots with evictions; env 1 is reset at slot 1,400 (a short episode, far
    # fewer requests drawn). Both are then reset together: the new episodes start with no
    # eviction, so after 600 slots without admissions every request's eviction count is 0.
    eng = _engine(jit)
    eng.reset(np.arange(2), [np.random.default_rng(0), np.random.default_rng(1)])
    for s in range(1500):
        if s == 1400:
            eng.reset(np.array([1]), [np.random.default_rng(2)])
        eng.advance(np.full(2, 8, np.int64))
    assert eng.request_log(0)["evictions"].sum() > 100  # the old episode evicted
    assert eng.n_req[0] > eng.n_req[1] + 1000
    eng.reset(np.arange(2), [np.random.default_rng(3), np.random.default_rng(4)])
    for _ in range(600):
        eng.advance(np.zeros(2, np.int64))
    for i in range(2):
        log = eng.request_log(i)
        assert log["arrival"].size > 1000 and log["evictions"].sum() == 0


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("env", [0, 1])
def test_an_out_of_range_budget_is_refused_in_any_environment(jit, env):
    eng = _engine(jit)
    eng.reset(np.arange(2), [np.random.default_rng(0), np.random.default_rng(1)])
    for bad, mb in ((-1, None), (5, 4), (1, 0)):  # max_budget 0 is a cap too (kernels.py #634, #786)
        b = np.zeros(2, np.int64)
        b[env] = bad
        with pytest.raises(BudgetError, match=f"budget {bad} of environment {env} is not in 0.."):
            eng.advance(b, max_budget=mb)
    assert int(eng.t[0]) == 0  # nothing changed
    eng.advance(np.full(2, 4, np.int64), max_budget=4)  # a budget equal to max_budget is in range
    assert int(eng.t[0]) == 1


@pytest.mark.parametrize("jit", [True, False])
def test_class_queues_stay_empty_unless_tracked(jit):
    eng = _engine(jit)
    eng.reset(np.arange(2), [np.random.default_rng(0), np.random.default_rng(1)])
    for _ in range(50):
        eng.advance(np.ones(2, np.int64))
    assert int(eng.n_queued.sum()) > 0 and int(eng.class_queue.sum()) == 0
    tracked = _engine(jit, track_class_queue=True)
    tracked.reset(np.arange(2), [np.random.default_rng(0), np.random.default_rng(1)])
    for _ in range(50):
        tracked.advance(np.ones(2, np.int64))
    np.testing.assert_array_equal(tracked.class_queue.sum(axis=1), tracked.n_queued)


def test_projection_one_slot_ahead_is_the_same_on_both_paths():
    # offsets (0, 1): the numpy path's projection one slot ahead (not the demand now) equals the
    # compiled one at every slot of a run with completions
    a, b = _engine(True, projection_offsets=[0, 1]), _engine(False, projection_offsets=[0, 1])
    for e in (a, b):
        e.reset(np.arange(2), [np.random.default_rng(5), np.random.default_rng(6)])
    differs = 0
    for _ in range(200):
        pa, pb = a.projected_usage(), b.projected_usage()
        np.testing.assert_array_equal(pa, pb)
        differs += int((pa[:, 0] != pa[:, 1]).sum())
        for e in (a, b):
            e.advance(np.full(2, 3, np.int64))
    assert differs > 50  # the one-slot projection is not the demand now


def test_default_histogram_edges_are_the_environments():
    # the engine's own default is the one FlowControl-v0 observes (callers that pass none get it)
    from flowgym.envs.flow_control import FlowControlConfig

    eng = BatchedEngine(1, 1000, MultiClassPoisson([(10, 20)], 1.0))
    assert eng.edges.tolist() == list(FlowControlConfig().hist_edges) == [0, 8, 16, 32, 64, 128, 256, 512]


def test_a_one_token_cache_is_a_valid_M_that_no_request_fits():
    # M = 1 passes the argument check; it is refused because every request (l, o >= 1) exceeds it
    with pytest.raises(ValueError, match="does not support M=1: the workload can draw requests with l \\+ o = 2"):
        BatchedEngine(1, 1, MultiClassPoisson([(1, 1)], 1.0))


def _run(eng, n, slots, budget, seed0=0):
    eng.reset(np.arange(n), [np.random.default_rng(seed0 + i) for i in range(n)])
    for _ in range(slots):
        eng.advance(np.full(n, budget, np.int64))
    return [eng.request_log(i) for i in range(n)]


@pytest.mark.parametrize("n", [1, 3])  # one environment draws alone; several draw as a group
def test_compiled_sampler_redraws_when_its_margins_run_out(n):
    # the compiled sampler draws a chunk's uniforms ahead (mean + 12 sd) and reserves table room
    # for a chunk (mean + 8 sd): almost never too few. With both margins cut to nothing every
    # chunk takes the rare paths (draw more uniforms and start the chunk again; grow the table
    # and redo the environment alone), and the requests must be the same.
    wl = MultiClassPoisson([(5, 10), (3, 20)], [3.0, 4.0])
    ref = BatchedEngine(n, 2000, wl)
    tight = BatchedEngine(n, 2000, wl)
    from flowgym.sim import kernels

    if not kernels.AVAILABLE:
        pytest.skip("the compiled sampler needs numba")
    ref.jit = tight.jit = True  # the compiled sampler on both paths of the suite (FLOWGYM_JIT=0 too)
    assert ref._fast_ok
    tight._u_want = tight._u_chunk = 4
    tight._req_chunk = 1
    a, b = _run(ref, n, 800, 6), _run(tight, n, 800, 6)
    for la, lb in zip(a, b):
        assert la["arrival"].size > 5000  # three chunks of 256 slots at 7 per slot
        for k in la:
            assert np.array_equal(la[k], lb[k]), k


@pytest.mark.parametrize("jit", [True, False])
def test_a_chunk_larger_than_twice_the_request_table(jit):
    # 40 requests per slot: the first 256-slot chunk holds about 10,240, more than twice the
    # table's first 4,096 rows; the table must grow to the chunk, not to twice its size
    eng = BatchedEngine(2, 4000, IIDPoisson(40.0, PAIRS))
    eng.jit = jit
    logs = _run(eng, 2, 300, 50)
    from flowgym.sim.engine import Engine

    for i, log in enumerate(logs):
        single = Engine(4000, IIDPoisson(40.0, PAIRS))
        single.reset(np.random.default_rng(i))
        for _ in range(300):
            single.arrive()
            single.serve(50)
        want = single.request_log()
        n = min(log["arrival"].size, want["arrival"].size)
        assert n > 10_000
        for k in ("arrival", "prompt_len", "output_len"):  # the requests drawn, from the same generator
            assert np.array_equal(log[k][:n], want[k][:n]), k


def test_evictions_cancel_every_future_histogram_crossing_on_both_paths():
    # LIFO victims are the newest requests, still in bin 0 (fewer than 8 tokens generated): their
    # future crossings into bins 1.. must be cancelled, or the generated-tokens histogram H later
    # moves requests that are gone. The numpy path's H equals the compiled path's at every slot.
    wl = MultiClassPoisson([(10, 20), (10, 40), (10, 60)], 2.0)
    a, b = BatchedEngine(2, 600, wl), BatchedEngine(2, 600, wl)
    from flowgym.sim import kernels

    if not kernels.AVAILABLE:
        pytest.skip("compares with the compiled path (numba)")
    a.jit, b.jit = True, False
    for e in (a, b):
        e.reset(np.arange(2), [np.random.default_rng(5), np.random.default_rng(6)])
    for _ in range(300):
        np.testing.assert_array_equal(a.H, b.H)
        for e in (a, b):
            e.advance(np.full(2, 6, np.int64))
    assert b.Kx == 3 and b.request_log(0)["evictions"].sum() > 500
    assert (b.H[:, 1:] > 0).any()


@pytest.mark.parametrize("jit", [True, False])
def test_projection_at_offset_zero_only_is_the_demand_now(jit):
    # offsets (0,): no calendar row is read; the projection is the tokens held plus one per active
    # request (the next token each generates)
    eng = BatchedEngine(2, 800, MultiClassPoisson([(10, 20), (10, 40)], 1.5), projection_offsets=[0])
    eng.jit = jit
    eng.reset(np.arange(2), [np.random.default_rng(1), np.random.default_rng(2)])
    seen = 0
    for _ in range(120):
        p = eng.projected_usage()
        assert p.shape == (2, 1)
        np.testing.assert_array_equal(p[:, 0], eng.held + eng.n_active)
        seen += int((eng.n_active > 0).sum())
        eng.advance(np.full(2, 4, np.int64))
    assert seen > 100


@pytest.mark.parametrize("rate", [9.99, 10.0, 10.5])
def test_rates_from_10_draw_with_numpys_sampler(rate):
    # numpy's Poisson changes algorithm at lam = 10; the compiled sampler reproduces the one below
    # it only, so a rate of exactly 10 must not run it: the draws equal the single engine's
    from flowgym.sim.engine import Engine

    wl = MultiClassPoisson([(10, 20), (5, 8)], [rate, 1.0])
    eng = BatchedEngine(1, 5000, wl)
    from flowgym.sim import kernels

    if kernels.AVAILABLE:
        eng.jit = True  # the compiled sampler is what is being decided (FLOWGYM_JIT=0 too)
    logs = _run(eng, 1, 300, 40)
    single = Engine(5000, wl)
    single.reset(np.random.default_rng(0))
    for _ in range(300):
        single.arrive()
        single.serve(40)
    want = single.request_log()
    n = min(logs[0]["arrival"].size, want["arrival"].size)
    assert n > 2500
    for k in ("arrival", "prompt_len", "output_len"):
        assert np.array_equal(logs[0][k][:n], want[k][:n]), k


def test_histogram_when_the_longest_output_ends_on_a_bin_edge():
    # o = 9 with edges (0, 8, ...): a request's last token is generated at j = 8, the edge of bin 1,
    # so bin 1 is the last bin any request crosses into (Kx = bin of max_o - 1); the batched
    # environment's observed histogram equals the single environments'
    import gymnasium as gym

    import flowgym  # noqa: F401

    kw = {"M": 400, "horizon": 60, "observation": "flat",
          "workload": {"kind": "poisson", "classes": [[5, 9], [5, 4]], "rates": 1.5}}
    batched = gym.make_vec("FlowControl-v0", num_envs=2, **kw)
    sync = gym.make_vec("FlowControl-v0", num_envs=2, vectorization_mode="sync", **kw)
    assert type(batched).__name__ == "FlowControlVectorEnv"
    ob, _ = batched.reset(seed=3)
    os_, _ = sync.reset(seed=3)
    crossed = 0
    for t in range(59):
        np.testing.assert_array_equal(ob, os_)
        act = np.array([3, 5])
        ob, *_ = batched.step(act)
        os_, *_ = sync.step(act)
        crossed += int(batched.engine.H[:, 1].sum())
    np.testing.assert_array_equal(ob, os_)
    assert batched.engine.Kx == 1 and crossed > 20  # requests were seen in bin 1


@pytest.mark.parametrize("jit", [True, False])
def test_one_tracked_class_is_counted(jit):
    # a workload of a single class, tracked: its queue count is the queue (kernels.py mutants
    # `m_track > 0` -> `> 1`, which left one class untracked: `#650`
    # at admission and `#901` at eviction: budgets of 1, then of 6, which overflow M = 600 and evict)
    eng = BatchedEngine(2, 600, MultiClassPoisson([(10, 20)], 2.0), track_class_queue=True)
    eng.jit = jit
    eng.reset(np.arange(2), [np.random.default_rng(0), np.random.default_rng(1)])
    for s in range(120):
        eng.advance(np.full(2, 1 if s < 60 else 6, np.int64))
        np.testing.assert_array_equal(eng.class_queue[:, 0], eng.n_queued)
    assert eng.class_queue.shape[1] == 1 and int(eng.n_queued.min()) > 20
    assert all(eng.request_log(i)["evictions"].sum() > 0 for i in range(2))


def _single_logs(M, wl, n, slots, budget):
    """Each environment's requests from a single engine (numpy's sampler), seeds 0..n-1."""
    from flowgym.sim.engine import Engine

    out = []
    for i in range(n):
        single = Engine(M, wl)
        single.jit = False
        single.reset(np.random.default_rng(i))
        for _ in range(slots):
            single.arrive()
            single.serve(budget)
        out.append(single.request_log())
    return out


@pytest.mark.parametrize("n", [3, 4, 5])
@pytest.mark.parametrize("margin", ["default", "mean", "counts"])
def test_the_compiled_sampler_draws_a_single_engines_requests_in_any_group(n, margin):
    """The compiled sampler draws environments in pairs (an odd group ends with one alone), from
    uniforms drawn ahead. With only a chunk's mean number of uniforms drawn ahead (``mean``) about
    half the chunks run out while placing their requests, and are redone alone; with only what the
    Poisson counts use on average (``counts``) about half the pairs run out while counting, and are
    counted again stream by stream. Every environment still gets the requests of a
    single engine drawing from the same generator with numpy (kernels.py mutant ``U[r0 + h]`` ->
    ``U[r0 - h]`` in the stream-by-stream count)."""
    from flowgym.sim import kernels

    if not kernels.AVAILABLE:
        pytest.skip("the compiled sampler needs numba")
    wl = MultiClassPoisson([(5, 10), (3, 20), (4, 8)], [3.0, 0.0, 4.0])
    eng = BatchedEngine(n, 2000, wl)
    eng.jit = True  # the compiled sampler on both paths of the suite (FLOWGYM_JIT=0 too)
    assert eng._fast_ok
    if margin == "mean":
        eng._u_want = eng._u_chunk
    if margin == "counts":  # a Poisson(lambda) draw uses lambda + 1 uniforms on average
        eng._u_want = int(np.sum(np.where(wl.rates > 0, wl.rates + 1, 0))) * 256
    redone = []
    alone = eng._generate

    def _generate(i):
        redone.append(i)
        alone(i)

    eng._generate = _generate
    logs = _run(eng, n, 800, 6)
    assert bool(eng._fast.all())
    # reset draws each environment's first chunk alone; later chunks alone only when a group's ran out
    assert (len(redone) > n) == (margin != "default")
    for i, (got, want) in enumerate(zip(logs, _single_logs(2000, wl, n, 800, 6))):
        k = min(got["arrival"].size, want["arrival"].size)
        assert k > 5000
        for key in ("arrival", "prompt_len", "output_len"):
            assert np.array_equal(got[key][:k], want[key][:k]), (i, key)


def test_the_compiled_sampler_with_every_rate_zero_still_moves_the_clock():
    """A chunk with no class drawing uses no uniform (its position stays 0): it is still a chunk
    (slots, bounds and clock written), not a failure (mutants ``q >= 0`` -> ``q > 0`` / ``q >= 1``)."""
    from flowgym.sim import kernels

    if not kernels.AVAILABLE:
        pytest.skip("the compiled sampler needs numba")
    wl = MultiClassPoisson([(5, 10), (3, 20)], [0.0, 0.0])
    eng = BatchedEngine(3, 2000, wl)
    eng.jit = True
    logs = _run(eng, 3, 600, 6)
    assert bool(eng._fast.all())
    assert all(log["arrival"].size == 0 for log in logs)
    assert eng.gen_t.tolist() == [768] * 3 and eng.n_req.tolist() == [0] * 3
