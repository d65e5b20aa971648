"""The engine against the paper's numbers, and its invariants on random configurations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowgym import FlowControlEnv
from flowgym.sim.engine import Engine
from flowgym.sim.theory import reflected_walk_mean

PAPER = [[10, 20], [10, 40], [10, 60]]


def test_algorithm1_saturated_peak_is_exactly_16240_and_never_overflows():
    env = FlowControlEnv(
        M=16492,
        workload={"kind": "poisson", "classes": PAPER, "rates": 50.0},  # queues never empty
        output_length_known=True,
        per_class_budget=True,
        max_budget=4,
        horizon=600,
    )
    env.reset(seed=0)
    usages = []
    for _ in range(600):
        _, _, _, _, info = env.step(np.array([4, 4, 4]))
        usages.append(info["usage"])
        assert info["evicted"] == 0
    assert max(usages) == 16240
    assert usages[59:] == [16240] * (600 - 59)  # steady state once the longest class has filled in
    assert env.metrics()["overflow_events"] == 0


def test_paper_load_at_lambda_5():
    env = FlowControlEnv(workload={"kind": "poisson", "classes": PAPER, "rates": 5.0})
    _, info = env.reset(seed=0)
    assert info["rho"] == pytest.approx(20300 / 16492)


def test_algorithm1_queue_is_the_reflected_random_walk():
    """At lambda = 3, b = 4 per class the per-class queue is Q' = (Q + Poisson(3) - 4)^+, mean 0.80."""
    T = 30000
    env = FlowControlEnv(
        workload={"kind": "poisson", "classes": PAPER, "rates": 3.0},
        output_length_known=True,
        per_class_budget=True,
        max_budget=4,
        horizon=T,
    )
    env.reset(seed=123)
    for _ in range(T):
        env.step(np.array([4, 4, 4]))
    s = env.series()
    assert s["evicted"].sum() == 0
    mean_per_class = s["queue_len"][1000:].mean() / 3
    theory = reflected_walk_mean(3.0, 4)
    assert theory == pytest.approx(0.80, abs=0.005)
    assert mean_per_class == pytest.approx(theory, abs=0.05)


def check_invariants(env: FlowControlEnv, info: dict) -> None:
    eng = env.engine
    log = env.request_log()
    n = log["arrival"].size
    done = log["finish"] >= 0
    q, a = eng.queue_ids(), eng.active_ids()
    # arrived = rejected + queued + active + completed
    assert n == log["rejected"].sum() + q.size + a.size + done.sum()
    assert q.size == eng.n_queued and a.size == eng.n_active
    # no request lost or duplicated
    ids = np.concatenate([q, a, np.flatnonzero(done), np.flatnonzero(log["rejected"])])
    assert np.array_equal(np.sort(ids), np.arange(n))
    assert info["usage"] <= eng.M
    assert np.all(log["finish"][done] >= log["arrival"][done] + log["output_len"][done])
    assert not (done & log["rejected"]).any()
    assert np.all(log["prompt_len"][log["rejected"]] + log["output_len"][log["rejected"]] > eng.M)
    # each lane is in its queue order (keys strictly increasing; FIFO keys are the ids)
    for lane in eng.lanes:
        keys = eng.order.keys(eng, lane.items())
        assert np.all(np.diff(keys) > 0)
    if eng.track_estimates:  # estimates are lower bounds of the output lengths
        assert np.all(eng.estimate[:n] <= log["output_len"])
    # held tokens agree with the active set
    assert eng.held == int((eng.prompt[a] + eng.active_generated()).sum())


@settings(max_examples=60, deadline=None)
@given(
    M=st.integers(20, 400),
    classes=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=4),
    rate=st.floats(0.0, 4.0),
    eviction=st.sampled_from(["lifo", "all", "estimate"]),
    order=st.sampled_from(["fifo", "sjf", "estimate"]),
    per_class=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(1, 120),
)
def test_invariants_random_configs_and_actions(M, classes, rate, eviction, order, per_class, seed, steps):
    known = per_class or order == "sjf"
    env = FlowControlEnv(
        M=M,
        workload={"kind": "poisson", "classes": [list(c) for c in classes], "rates": rate},
        eviction=eviction,
        queue_order=order,
        output_length_known=known,
        per_class_budget=per_class,
        max_budget=6,
        horizon=steps,
    )
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(steps):
        _, r, te, tr, info = env.step(env.action_space.sample())
        check_invariants(env, info)
        assert np.isfinite(r)
    assert tr


@settings(max_examples=30, deadline=None)
@given(
    M=st.integers(50, 3000),
    rate=st.floats(0.1, 8.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_invariants_lognormal_lengths(M, rate, seed):
    env = FlowControlEnv(
        M=M,
        workload={"kind": "iid", "rate": rate, "lengths": {"kind": "lognormal", "prompt_median": 11,
                                                            "prompt_mean": 40, "output_median": 45,
                                                            "output_mean": 85, "max_prompt": 800,
                                                            "max_output": 800}},
        horizon=80,
    )
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(80):
        _, _, _, _, info = env.step(env.action_space.sample())
        check_invariants(env, info)


def test_engine_does_not_import_gymnasium():
    import ast
    import inspect

    import flowgym.sim.engine
    import flowgym.sim.metrics
    import flowgym.sim.workloads

    for mod in (flowgym.sim.engine, flowgym.sim.workloads, flowgym.sim.metrics):
        tree = ast.parse(inspect.getsource(mod))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(x.startswith("gymnasium") for x in names), mod.__name__


def test_engine_requires_positive_M():
    with pytest.raises(ValueError, match="M"):
        Engine(0, {"kind": "poisson", "classes": PAPER, "rates": 1.0})


def test_compaction_keeps_long_runs_exact():
    """A long greedy run goes through many compactions; its totals must still balance."""
    env = FlowControlEnv(workload={"kind": "poisson", "classes": PAPER, "rates": 5.0}, horizon=3000)
    env.reset(seed=9)
    for _ in range(3000):
        _, _, _, _, info = env.step(64)
    check_invariants(env, info)
    m = env.metrics()
    assert m["evictions"] > 0 and m["wasted_tokens"] > 0


def test_sjf_order_admits_shortest_known_output_first():
    # four requests at slot 0; B = 1 per slot; M large: admission order is by o, ties by arrival
    r = __import__("flowgym").replay([0, 0, 0, 0], [1, 1, 1, 1], [5, 2, 9, 2], M=100, budgets=1,
                                    queue_order="sjf")
    # admitted at 0: r1 (o=2), 1: r3 (o=2), 2: r0 (o=5), 3: r2 (o=9)
    assert r["finish"].tolist() == [2 + 5, 0 + 2, 3 + 9, 1 + 2]


def test_estimate_eviction_and_requeue_raise_estimates():
    """A_min's pieces: smallest estimate first out, estimates raised to j + 1 on eviction.

    M = 12. Slot 0: r0 (l=2, o=6) and r1 (l=2, o=6) admitted (B=2): demand 6. Slot 1: demand 8,
    slot 2: demand 10, slot 3: demand 12 <= 12, slot 4: demand 14 > 12. Current estimates
    max(1, j + 1) are equal (j = 4 for both), so the tie goes to the newest: r1 (admitted after
    r0 in slot 0) is evicted with j = 4, its estimate becomes 5; r0 finishes at 6.
    """
    from flowgym import replay

    r = replay([0, 0], [2, 2], [6, 6], M=12, budgets=2, eviction="estimate", queue_order="estimate", horizon=30)
    assert r["evictions"].tolist() == [0, 1]
    assert r["wasted_tokens"] == 4
    assert r["finish"][0] == 6
    eng = Engine(12, __import__("flowgym").Trace([0, 0], [2, 2], [6, 6]), eviction="estimate",
                 queue_order="estimate")
    eng.reset(np.random.default_rng(0))
    for _ in range(5):
        eng.arrive()
        eng.serve(2)
    assert eng.estimate[1] == 5 and eng.estimate[0] == 1


# --------------------------------------------------------------------------- A_min's keys with distinct estimates


def test_estimate_order_admits_the_smallest_estimate_first():
    """Distinct estimates (not only the tie-break by id): ascending estimate, then id."""
    from types import SimpleNamespace

    from flowgym.sim.rules import ShortestEstimateFirst

    cols = SimpleNamespace(estimate=np.array([9, 2, 7, 2, 1], np.int64), output=np.zeros(5, np.int64))
    ids = np.arange(5, dtype=np.int64)
    order = ids[np.argsort(ShortestEstimateFirst().keys(cols, ids), kind="stable")]
    assert order.tolist() == [4, 1, 3, 2, 0]


def test_estimate_eviction_takes_the_smallest_estimates_first():
    """Victims in ascending estimate (ties: the newest first), the shortest prefix covering the excess."""
    from flowgym.sim.rules import ActiveSet, EstimateEviction

    # activation order: positions 0..4 (oldest first)
    act = ActiveSet(ids=np.array([10, 11, 12, 13, 14]), demand=np.array([5, 5, 5, 5, 5]),
                    generated=np.array([4, 0, 6, 0, 2]), estimate=np.array([5, 1, 7, 1, 3]))
    rule = EstimateEviction()
    assert rule.select(act, 5).tolist() == [3]  # estimate 1 at positions 1 and 3: the newer (3) first
    assert rule.select(act, 6).tolist() == [3, 1]
    assert rule.select(act, 11).tolist() == [3, 1, 4]  # then estimate 3
    assert rule.select(act, 16).tolist() == [3, 1, 4, 0]  # then 5; the largest estimate (7) last


def test_planned_order_puts_unplanned_requests_last_and_slot_zero_first():
    """A plan of slot 0 is a plan (not 'unplanned'); a negative plan goes after every planned request."""
    from types import SimpleNamespace

    from flowgym.sim.rules import PlannedOrder

    order = PlannedOrder(np.array([3, 0, -1, 0, 2], np.int64))
    cols = SimpleNamespace(estimate=np.zeros(5, np.int64), output=np.zeros(5, np.int64))
    ids = np.arange(5, dtype=np.int64)
    assert ids[np.argsort(order.keys(cols, ids), kind="stable")].tolist() == [1, 3, 4, 0, 2]


@pytest.mark.parametrize("jit", [False, True])
def test_keyed_lane_grows_past_its_capacity(jit):
    """Inserting more ids than the lane holds (the merge path) keeps them all, in key order."""
    from flowgym.sim import kernels
    from flowgym.sim.rules import Lane

    if jit and not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install -e '.[fast]' in the flowgym checkout)")
    lane = Lane(keyed=True, capacity=4, jit=jit)
    rng = np.random.default_rng(0)
    keys = rng.permutation(40).astype(np.int64) * 10
    for chunk in np.array_split(np.arange(40), 5):  # pushes that land inside the queue, not at an end
        k = np.sort(keys[chunk])
        lane.push(chunk[np.argsort(keys[chunk])].astype(np.int64), k)
    want = np.argsort(keys, kind="stable")
    assert lane.items().tolist() == want.tolist() and len(lane) == 40
    assert lane.pop(3).tolist() == want[:3].tolist() and len(lane) == 37
