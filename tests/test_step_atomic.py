"""A step with a user latency callable either completes or changes nothing (issue 19, section 1).

The engine asks a callable ``time_model`` for the iteration's duration before admission or
eviction touch anything (``Engine._preview_duration``), so when the callable raises, the
queue, the active set, the clock and every count are as before the step, and a retry admits
once.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.envs.flow_control import FlowControlEnv
from flowgym.sim import kernels
from flowgym.sim.engine import Engine
from flowgym.sim.workloads import Trace

TIMED = {"kind": "iid", "rate": 30.0, "lengths": {"kind": "lmsys-like"}, "timed": True}


def _classed_trace() -> Trace:
    """Two classes ``(30, 40)`` and ``(60, 80)``, 6,000 requests at 30 per second, timed."""
    rng = np.random.default_rng(9)
    cls = rng.integers(0, 2, 6000)
    return Trace(np.sort(rng.uniform(0.0, 200.0, 6000)), np.where(cls == 0, 30, 60), np.where(cls == 0, 40, 80),
                 cls=cls, timed=True)


CLASSED = _classed_trace()
COEF = (0.0554, 0.339e-3, 0.166e-3, 1.16e-7)
JITS = [False, pytest.param(True, marks=pytest.mark.skipif(not kernels.AVAILABLE, reason="needs numba"))]


def good(P, D, K, B):
    return COEF[0] + COEF[1] * P + COEF[2] * D + COEF[3] * K


class Flaky:
    """The good model, raising once on call number ``fail_at`` (counted from 0)."""

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def __call__(self, P, D, K, B):
        n = self.calls
        self.calls += 1
        if n == self.fail_at:
            raise ZeroDivisionError("profiler table has no entry")
        return good(P, D, K, B)


def engine_state(e: Engine) -> dict:
    """Everything a step may change, as plain values."""
    n = e.n_req
    lanes = [(ln.items().copy(), ln.kbuf[ln.head : ln.tail].copy()) for ln in e.lanes]
    return {
        "scalars": (e.t, e.now, e.last_duration, e.held, e.n_active, e.n_queued, e.queued_prompt_tokens,
                    e.total_arrived, e.total_rejected, e.total_completed, e.total_evictions, e.overflow_events,
                    e.wasted_tokens, e.generated_tokens, e.n_arrived, e.n_req),
        "lanes": lanes,
        "active": (e.active_ids().copy(), e.active_starts().copy(), e.active_remaining().copy()),
        "table": tuple(getattr(e, k)[:n].copy() for k in ("finish", "evictions", "estimate", "arrival")),
        "calendar": (np.asarray(e._cal_n).copy(), np.asarray(e._cal_tok).copy()),
        "class_queue": e.class_queue.copy(),
        "series": e.series(),
    }


def assert_same(a, b) -> None:
    assert a["scalars"] == b["scalars"]
    assert len(a["lanes"]) == len(b["lanes"])
    for (i1, k1), (i2, k2) in zip(a["lanes"], b["lanes"]):
        assert np.array_equal(i1, i2) and np.array_equal(k1, k2)
    for key in ("active", "table", "calendar"):
        for x, y in zip(a[key], b[key]):
            assert np.array_equal(x, y), key
    assert np.array_equal(a["class_queue"], b["class_queue"])
    for k in a["series"]:
        assert np.array_equal(a["series"][k], b["series"][k]), k


def _budgets(n, hi, per_class, m, seed=11):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, hi, m) if per_class else int(rng.integers(0, hi)) for _ in range(n)]


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("setup", [
    dict(workload=TIMED, M=16492),
    dict(workload=TIMED, M=16492, queue_order="estimate", eviction="estimate"),
    dict(workload=CLASSED, M=3000, per_class=True),
    dict(workload=CLASSED, M=3000, eviction="all", track_class_queue=True),
])
def test_engine_step_is_atomic_when_the_latency_callable_raises(setup, jit):
    wl, M = setup["workload"], setup["M"]
    kw = {k: v for k, v in setup.items() if k not in ("workload", "M")}
    per_class = kw.get("per_class", False)
    budgets = _budgets(1500, 40 if not per_class else 12, per_class, 2)

    def make(model):
        e = Engine(M, wl, time_model=model, **kw)
        e.jit = jit
        e.reset(np.random.default_rng(5))
        return e

    ref = make(good)
    ref_stats = []
    for b in budgets:
        ref.arrive()
        ref_stats.append(ref.serve(b))
    assert ref.total_evictions > 0  # failures below hit steps that evict, too

    # raise at several steps, one of them with an eviction; each time: nothing changed, retry = reference
    evicting = [i for i, s in enumerate(ref_stats) if s.evicted][:2]
    for fail_at in sorted({0, 3, 700, *evicting}):
        flaky = Flaky(fail_at)
        e = make(flaky)
        stats = []
        for i, b in enumerate(budgets):
            e.arrive()
            if i == fail_at:
                before = engine_state(e)
                with pytest.raises(RuntimeError, match=r"time_model callable 'Flaky'.*ZeroDivisionError"):
                    e.serve(b)
                assert_same(engine_state(e), before)
            stats.append(e.serve(b))
        assert stats == ref_stats, f"retry after a failure at step {fail_at} diverged"
        assert e.now == ref.now and e.total_completed == ref.total_completed


def test_callable_gives_the_linear_models_run_exactly():
    """The preview computes the same composition as the step (else the engine raises): a callable
    and the same linear model give identical runs, evictions included."""
    a = Engine(16492, TIMED, time_model=good)
    b = Engine(16492, TIMED, time_model={"kind": "linear", "c0": COEF[0], "c_prefill": COEF[1],
                                         "c_decode": COEF[2], "c_kv": COEF[3]})
    assert a._preview and not b._preview
    for e in (a, b):
        e.reset(np.random.default_rng(2))
    for b_t in _budgets(3000, 48, False, 0, seed=4):
        a.arrive()
        b.arrive()
        assert a.serve(b_t) == b.serve(b_t)
        assert a.now == b.now
    assert a.total_evictions > 0


def test_env_step_is_atomic_and_retry_matches_a_run_that_never_raised():
    def run(model, fail_at=None):
        env = FlowControlEnv(workload=TIMED, time_model=model, horizon=400, output_length_known=True)
        obs, _ = env.reset(seed=3)
        out = []
        for i, b in enumerate(_budgets(400, 40, False, 0, seed=8)):
            if i == fail_at:
                before = (engine_state(env.engine), env.engine.now, env._rate, env.metrics())
                with pytest.raises(RuntimeError, match="time_model callable"):
                    env.step(b)
                after = (engine_state(env.engine), env.engine.now, env._rate, env.metrics())
                assert_same(after[0], before[0])
                assert after[1:3] == before[1:3]
                m0, m1 = before[3], after[3]
                for k in m0:
                    if k != "kv_usage":
                        assert m0[k] == m1[k] or (m0[k] != m0[k] and m1[k] != m1[k]), k
            obs, r, term, trunc, info = env.step(b)
            out.append((r, info, {k: v.tolist() for k, v in obs.items()}))
        return out, env.metrics()

    ref, mref = run(good)
    got, mgot = run(Flaky(57), fail_at=57)
    assert got == ref
    assert {k: v for k, v in mgot.items() if k != "kv_usage"} == {k: v for k, v in mref.items() if k != "kv_usage"}


def test_a_bad_duration_is_refused_before_the_step_too():
    calls = []

    def sometimes_negative(P, D, K, B):
        calls.append(P)
        return -1.0 if len(calls) == 2 else good(P, D, K, B)

    e = Engine(16492, TIMED, time_model=sometimes_negative)
    e.reset(np.random.default_rng(0))
    e.arrive()
    e.serve(8)
    e.arrive()
    before = engine_state(e)
    with pytest.raises(ValueError, match="time_model callable 'test_a_bad_duration.*sometimes_negative' returned -1.0 .*need a duration of "
                       "1e-06 to 3600 seconds"):
        e.serve(8)
    assert_same(engine_state(e), before)
    e.serve(8)  # the retry runs
    assert e.t == 2
