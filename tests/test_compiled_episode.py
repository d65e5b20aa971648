"""Compiled episodes (``Engine.run_rule``): a scripted agent's rule run in one numba loop gives the
run that stepping the agent in Python gives, request by request and iteration by iteration.

Each agent that states an ``admission_rule`` runs both ways (``run_episode(..., compiled=False)``
steps ``act`` through ``FlowControlEnv.step``) on continuous-time workloads chosen to reach every
branch of the loop: overload (long queues, evictions under each rule, the buffers growing), idle
gaps (the clock jumping to the next arrival), rejections, a finite workload draining, a horizon.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.agents import AMin, AlphaProtectionGreedy, FlowControl, GreedyLIFO, MemoryCheck
from flowgym.envs.flow_control import FlowControlEnv
from flowgym.lab.evaluation import run_episode
from flowgym.sim import kernels
from flowgym.sim.admission import AdmissionRule
from flowgym.sim.engine import Engine

pytestmark = pytest.mark.skipif(not kernels.ENABLED, reason="the compiled loop needs numba (flowgym[fast]) "
                                "and FLOWGYM_JIT not 0")

LMSYS = {"kind": "iid", "rate": 30.0, "timed": True, "lengths": {"kind": "lmsys-like"}}
WORKLOADS = {
    # overloaded: the queue grows to thousands, every agent evicts or holds back
    "overload": {"M": 4000, "time_model": "llama2-70b-tp2-a100", "horizon": 3000,
                 "workload": {**LMSYS, "rate": 60.0}},
    # finite and light: the run drains, with idle gaps the clock jumps over
    "drain": {"M": 6000, "time_model": "llama2-70b-tp2-a100", "horizon": 30000,  # (a cap: b=0 never drains)
              "workload": {**LMSYS, "rate": 2.0, "n_requests": 300}},
    # a small cache: requests longer than M are rejected on arrival
    "rejections": {"M": 700, "time_model": {"kind": "jaillet"}, "horizon": 2500,
                   "workload": {**LMSYS, "rate": 8.0}},
    # a trace with hour-long gaps and simultaneous arrivals, the linear latency model (the horizon
    # stops the alpha-greedy, which thrashes here for ever: two requests fit at admission, not later)
    "trace": {"M": 300, "horizon": 20000, "time_model": {"kind": "linear", "c0": 0.02, "c_prefill": 1e-4, "c_decode": 1e-3,
                                       "c_kv": 1e-6},
              "workload": {"kind": "trace", "timed": True,
                           "arrival": [0.0, 0.0, 0.01, 0.5, 3600.0, 3600.0, 3600.2, 7200.5] * 3,
                           "prompt_len": [40, 90, 10, 120, 60, 60, 20, 200] * 3,
                           "output_len": [30, 80, 5, 50, 100, 100, 10, 99] * 3}},
}
AGENTS = {
    "flow-control": lambda: FlowControl(b=3),
    "flow-control-b0": lambda: FlowControl(b=0),
    "alpha-greedy": lambda: AlphaProtectionGreedy(alpha=0.2),
    "alpha-greedy-0": lambda: AlphaProtectionGreedy(alpha=0.0),
    "greedy-lifo": lambda: GreedyLIFO(),
    "mc": lambda: MemoryCheck(),
    "a-min": lambda: AMin(),
}


def _trace_workload(kwargs: dict) -> dict:
    if kwargs["workload"]["kind"] != "trace":
        return kwargs
    w = dict(kwargs["workload"])
    order = np.argsort(w["arrival"], kind="stable")
    for key in ("arrival", "prompt_len", "output_len"):
        w[key] = [w[key][i] for i in order]
    return {**kwargs, "workload": w}


def _assert_same(a, b) -> None:
    assert a.log.keys() == b.log.keys() and a.series.keys() == b.series.keys()
    for key in a.log:
        assert np.array_equal(a.log[key], b.log[key], equal_nan=a.log[key].dtype.kind == "f"), f"log[{key!r}]"
    for key in a.series:
        assert a.series[key].dtype == b.series[key].dtype
        assert np.array_equal(a.series[key], b.series[key]), f"series[{key!r}]"  # the clock: same floats


def _same_metrics(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key
        else:
            assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), key


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_compiled_episode_is_the_stepped_episode(agent, workload):
    kwargs = _trace_workload(WORKLOADS[workload])
    for seed in (0, 1):
        fast = run_episode(AGENTS[agent](), kwargs, seed, None)
        slow = run_episode(AGENTS[agent](), kwargs, seed, None, compiled=False)
        _assert_same(fast, slow)
        _same_metrics(fast.metrics(), slow.metrics())


@pytest.mark.parametrize("agent", ["flow-control", "alpha-greedy", "mc", "a-min", "greedy-lifo"])
def test_the_compiled_loop_is_what_ran(agent, monkeypatch):
    """``act`` is never called on the compiled path, and the run still evicts and completes."""
    a = AGENTS[agent]()

    def refuse(*args, **kwargs):
        raise AssertionError("act() called on the compiled path")

    monkeypatch.setattr(a, "act", refuse)
    ep = run_episode(a, WORKLOADS["overload"], 0, None)
    m = ep.metrics()
    assert m["completed"] > 0 or agent == "mc"  # MC assumes outputs of M - 1 tokens here: it admits nobody
    assert ep.series["usage"].size == WORKLOADS["overload"]["horizon"]


def test_overload_reaches_every_branch():
    """The equality above means something: evictions under lifo, all and estimate, long queues."""
    for agent, rule in (("flow-control", "lifo"), ("alpha-greedy", "all"), ("a-min", "estimate")):
        ep = run_episode(AGENTS[agent](), WORKLOADS["overload"], 0, None)
        assert ep.config.eviction == rule
        assert int(ep.log["evictions"].sum()) > 10, agent
        assert int(ep.series["queue_len"].max()) > 1000, agent


def test_a_finite_workload_drains_on_the_compiled_path():
    ep = run_episode(FlowControl(b=3), WORKLOADS["drain"], 0, None)
    assert ep.metrics()["completed"] == 300 and ep.series["usage"].size < 30000
    assert ep.series["usage"][-1] > 0  # it ended on the iteration that finished the last request


def test_a_horizon_and_an_iteration_limit_stop_where_steps_would():
    kwargs = WORKLOADS["overload"]
    for horizon in (1, 2, 257, 1000):
        fast = run_episode(FlowControl(b=5), kwargs, 3, horizon)
        slow = run_episode(FlowControl(b=5), kwargs, 3, horizon, compiled=False)
        assert fast.series["usage"].size == horizon
        _assert_same(fast, slow)
    env = FlowControlEnv(**kwargs)
    env.reset(seed=3)
    assert env.engine.run_rule(AdmissionRule("fixed", budget=5), horizon=None, max_iterations=700) == 700
    assert env.engine.t == 700
    ref = FlowControlEnv(**kwargs)
    ref.reset(seed=3)
    for _ in range(700):
        ref.step(5)
    assert np.array_equal(env.engine.series()["usage"], ref.engine.series()["usage"])
    assert env.engine.now == ref.engine.now


def test_compiled_and_stepped_engines_can_alternate():
    """The loop leaves the engine at a decision point Python can step from, and back."""
    kwargs = WORKLOADS["overload"]
    env, ref = FlowControlEnv(**kwargs), FlowControlEnv(**kwargs)
    env.reset(seed=5)
    ref.reset(seed=5)
    for _ in range(4):
        env.engine.run_rule(AdmissionRule("fixed", budget=4), max_iterations=300)
        for _ in range(300):
            ref.step(4)
        for _ in range(50):
            env.step(9)
            ref.step(9)
    for key, value in ref.engine.series().items():
        assert np.array_equal(env.engine.series()[key], value), key
    _same_metrics(env.engine.metrics(), ref.engine.metrics())


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"M": 500, "workload": {"kind": "poisson", "classes": [[10, 20]], "rates": 1.0}}, "discrete slots"),
    ({**WORKLOADS["overload"], "record": "stream"}, "record='stream'"),
    ({**WORKLOADS["overload"], "queue_order": "sjf", "output_length_known": True}, "queue_order 'sjf'"),
    ({**WORKLOADS["overload"], "render_mode": "ansi"}, "render_mode='ansi'"),
    ({**WORKLOADS["overload"], "engine": "vllm-v1"}, "engine VllmEngine"),
    ({**WORKLOADS["overload"], "time_model": lambda P, D, K, B: 0.05}, "time model CallableLatency"),
])
def test_what_the_loop_lacks_is_named_and_evaluation_steps_instead(kwargs, reason):
    env = FlowControlEnv(**kwargs)
    env.reset(seed=0)
    why = env.rule_unsupported(AdmissionRule("fixed", budget=2))
    assert why is not None and reason in why
    with pytest.raises(ValueError, match="run_rule cannot run here"):
        env.run_rule(AdmissionRule("fixed", budget=2))
    kw = {k: v for k, v in kwargs.items() if k != "render_mode"}
    if "render_mode" not in kwargs and "record" not in kwargs:  # run_episode steps instead: a full run all the same
        ep = run_episode(FlowControl(b=2), {**kw, "horizon": 50}, 0, None)
        assert ep.series["usage"].size == 50


def test_estimated_lengths_need_tracked_estimates():
    eng = Engine(4000, WORKLOADS["overload"]["workload"], time_model="llama2-70b-tp2-a100")
    eng.reset(np.random.default_rng(0))
    assert "estimates" in eng.rule_unsupported(AdmissionRule("future-fit", max_count=8, lengths="estimate"))


@pytest.mark.parametrize(("rule", "field"), [
    (AdmissionRule("fifo"), "kind"),
    (AdmissionRule("fixed", budget=-1), "budget"),
    (AdmissionRule("greedy", limit=float("nan"), max_count=4), "limit"),
    (AdmissionRule("future-fit", max_count=2.5), "max_count"),
    (AdmissionRule("future-fit", max_count=4, lengths="guess"), "lengths"),
])
def test_a_malformed_rule_is_named(rule, field):
    env = FlowControlEnv(**WORKLOADS["overload"])
    env.reset(seed=0)
    with pytest.raises(ValueError, match=f"AdmissionRule.{field}"):
        env.run_rule(rule)


def test_a_budget_beyond_the_action_space_is_refused():
    env = FlowControlEnv(**{**WORKLOADS["overload"], "max_budget": 8})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="AdmissionRule.budget=9 exceeds max_budget=8"):
        env.run_rule(AdmissionRule("fixed", budget=9))


def test_run_rule_ends_the_episode():
    env = FlowControlEnv(**{**WORKLOADS["overload"], "horizon": 40})
    with pytest.raises(RuntimeError, match="reset"):
        env.run_rule(AdmissionRule("fixed", budget=2))
    env.reset(seed=0)
    assert env.run_rule(AdmissionRule("fixed", budget=2)) == 40
    with pytest.raises(RuntimeError, match="has ended"):
        env.step(1)


def test_future_fit_kernel_equals_the_agents_function():
    """The compiled memory check gives ``future_fit_count``'s prefix on random states (ties included)."""
    from flowgym.agents.memory_check import future_fit_count

    rng = np.random.default_rng(11)
    for _ in range(3000):
        n, k = int(rng.integers(0, 8)), int(rng.integers(0, 8))
        M = int(rng.integers(50, 400))
        ap, ag = rng.integers(1, 40, n), rng.integers(0, 30, n)
        ao = ag + rng.integers(0, 30, n)  # remaining 0 is clamped to 1, as the agent does
        cp, co = rng.integers(1, 40, k), rng.integers(1, 40, k)
        want = future_fit_count(M, ap, ag, ao, cp, co)
        assert kernels.future_fit(M, ap, ag, ao, cp, co) == want


@pytest.mark.parametrize("order", ["fifo", "estimate"])
@pytest.mark.parametrize("eviction", ["lifo", "all", "estimate"])
@pytest.mark.parametrize("kind", ["fixed", "greedy", "future-fit"])
def test_every_order_eviction_and_rule_combination(order, eviction, kind):
    """Beyond the agents' own pairings: each rule under each queue order and eviction rule."""
    rule = {"fixed": AdmissionRule("fixed", budget=6),
            "greedy": AdmissionRule("greedy", limit=3600.0, max_count=64),
            "future-fit": AdmissionRule("future-fit", max_count=64,
                                        lengths="estimate" if "estimate" in (order, eviction) else "bound",
                                        bound=300)}[kind]
    kwargs = {**WORKLOADS["overload"], "horizon": 1500, "queue_order": order, "eviction": eviction,
              "max_budget": 64}
    env, ref = FlowControlEnv(**kwargs), FlowControlEnv(**kwargs)
    env.reset(seed=2)
    ref.reset(seed=2)
    assert env.run_rule(rule) == 1500
    view = ref.view()
    for _ in range(1500):
        e = ref.engine
        if kind == "fixed":
            b = 6
        elif kind == "greedy":
            from flowgym.agents.greedy import greedy_fit_count

            b = greedy_fit_count(view, 3600.0, 64)
        else:
            from flowgym.agents.memory_check import future_fit_count

            q, a = view.queue(64), view.active()
            if rule.lengths == "estimate":
                ao, co = a.estimate, q.estimate
            else:
                ao, co = np.full(a.ids.size, 300), np.full(q.ids.size, 300)
            b = future_fit_count(e.M, a.prompt_len, a.generated, ao, q.prompt_len, co) if e.n_queued else 0
        ref.step(b)
    for key, value in ref.engine.series().items():
        assert np.array_equal(env.engine.series()[key], value), key
    log, want = env.engine.request_log(), ref.engine.request_log()
    for key in want:
        assert np.array_equal(log[key], want[key], equal_nan=want[key].dtype.kind == "f"), key
    assert env.engine.total_evictions == ref.engine.total_evictions
    if kind == "fixed":
        assert env.engine.total_evictions > 0


def test_mc_with_known_lengths_compiled_equals_stepped():
    """MC reads the true output lengths when they are known (the rule's ``lengths="known"``)."""
    kwargs = {**WORKLOADS["overload"], "output_length_known": True, "horizon": 1500}
    rule = MemoryCheck()
    env = FlowControlEnv(**kwargs)
    env.reset(seed=0)
    rule.reset(env.config, seed=0)
    assert rule.admission_rule(env.view()).lengths == "known"
    fast = run_episode(MemoryCheck(), kwargs, 4, None)
    slow = run_episode(MemoryCheck(), kwargs, 4, None, compiled=False)
    _assert_same(fast, slow)
    assert fast.metrics()["completed"] > 100  # true lengths: MC admits (unlike with outputs of M - 1)
    bounded = run_episode(MemoryCheck(), {**kwargs, "output_length_known": False}, 4, None)
    assert not np.array_equal(fast.series["admitted"], bounded.series["admitted"])


def test_a_rule_left_at_its_defaults_admits_nobody():
    """``budget`` and ``max_count`` default to 0: a rule that names no budget starts no request."""
    for rule in (AdmissionRule("fixed"), AdmissionRule("greedy", limit=4000.0),
                 AdmissionRule("future-fit", lengths="known")):
        env = FlowControlEnv(**{**WORKLOADS["overload"], "horizon": 200})
        env.reset(seed=0)
        env.run_rule(rule)
        assert env.engine.series()["admitted"].sum() == 0 and env.engine.n_queued > 0
    assert AdmissionRule("future-fit").bound == 0 and AdmissionRule("future-fit").lengths == "known"
