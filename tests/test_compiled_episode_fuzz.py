"""Adversarial cases for the compiled continuous-time episode loop (``Engine.run_rule`` / ``kernels.run_timed``).

The contract: where ``env.rule_unsupported(rule)`` is None, ``env.run_rule(rule)`` leaves the request
log, series (float clock included), metrics and engine counters that stepping ``env.step(budget)``
with the rule's budget until the episode ends leaves.

The reference here steps in Python with the engine's numpy path (``Engine.jit = False``) and the
agents' own budget functions (``greedy_fit_count``, ``future_fit_count``), so the compiled eviction
and lane merge are checked too, not only the loop around them.

Queue lanes of the compiled engine are put in *guarded* buffers (views of a larger array whose tail
holds a sentinel), so that a write past a lane's end lands in the guard instead of the heap: the
tests can then assert it did not happen, and the process survives it. Without the guard such writes
corrupt the heap (``test_flow_control_on_a_burst_does_not_corrupt_the_heap`` runs that in a child
process).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from flowgym.agents import FlowControl
from flowgym.agents.greedy import greedy_fit_count
from flowgym.agents.memory_check import future_fit_count
from flowgym.envs.flow_control import FlowControlEnv
from flowgym.lab.evaluation import run_episode
from flowgym.sim import kernels, rules
from flowgym.sim.admission import AdmissionRule

pytestmark = pytest.mark.skipif(not kernels.ENABLED, reason="the compiled loop needs numba (flowgym[fast]) "
                                "and FLOWGYM_JIT not 0")

SENTINEL = -123456789
PAD = 4096  # more than any lane can overrun by here (budgets <= 64, traces of a few hundred requests)


# --------------------------------------------------------------------------- helpers


class Guard:
    """Puts the compiled engine's queue lanes (and the buffers they grow into) in guarded arrays."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.arrays: list[tuple[np.ndarray, int]] = []
        self.lanes: list[rules.Lane] = []
        orig = rules.Lane._reserve
        guard = self

        def _reserve(lane: rules.Lane, k: int) -> None:
            orig(lane, k)
            if any(lane is g for g in guard.lanes) and not any(lane.buf.base is a for a, _ in guard.arrays):
                guard._wrap(lane)

        monkeypatch.setattr(rules.Lane, "_reserve", _reserve)

    def _view(self, src: np.ndarray) -> np.ndarray:
        n = src.size
        big = np.full(n + PAD, SENTINEL, np.int64)
        big[:n] = src
        self.arrays.append((big, n))
        return big[:n]

    def _wrap(self, lane: rules.Lane) -> None:
        buf = self._view(lane.buf)
        lane.kbuf = self._view(lane.kbuf) if lane.keyed else buf
        lane.buf = buf

    def watch(self, engine) -> None:
        for lane in engine.lanes:
            self.lanes.append(lane)
            self._wrap(lane)

    def overruns(self) -> list[int]:
        """Elements written past the end of each guarded buffer that was overrun."""
        return [int((a[n:] != SENTINEL).sum()) for a, n in self.arrays if (a[n:] != SENTINEL).any()]


def python_budget(rule: AdmissionRule, env: FlowControlEnv) -> int:
    """The budget the agents' Python functions give for ``rule`` at this decision point."""
    view, e = env.view(), env.engine
    if rule.kind == "fixed":
        return rule.budget
    if rule.kind == "greedy":
        return greedy_fit_count(view, rule.limit, rule.max_count)
    if e.n_queued == 0:
        return 0
    q, a = view.queue(rule.max_count), view.active()
    if rule.lengths == "known":
        ao, co = e.output[a.ids], e.output[q.ids]
    elif rule.lengths == "bound":
        ao, co = np.full(a.ids.size, rule.bound), np.full(q.ids.size, rule.bound)
    else:
        ao, co = a.estimate, q.estimate
    return future_fit_count(e.M, a.prompt_len, a.generated, ao, q.prompt_len, co)


def step_to_end(env: FlowControlEnv, rule: AdmissionRule) -> None:
    e = env.engine
    ended = (e.exhausted and e.in_system == 0) or (env._horizon is not None and e.t >= env._horizon)
    while not ended:
        _, _, te, tr, _ = env.step(python_budget(rule, env))
        ended = te or tr


COUNTERS = ("t", "n_arrived", "n_active", "n_queued", "held", "queued_prompt_tokens", "total_arrived",
            "total_rejected", "total_completed", "total_evictions", "overflow_events", "wasted_tokens",
            "generated_tokens", "last_arrivals", "last_rejected", "last_completed_tokens", "now", "last_duration")


def differences(env: FlowControlEnv, ref: FlowControlEnv, queue: bool = True) -> list[str]:
    """What differs between two runs: series, request log, metrics, engine counters (and queue/active ids)."""
    out = []
    a, b = env.engine.series(), ref.engine.series()
    out += [f"series[{k}]" for k in b if a[k].shape != b[k].shape or not np.array_equal(a[k], b[k])]
    la, lb = env.engine.request_log(), ref.engine.request_log()
    out += [f"log[{k}]" for k in lb
            if la[k].shape != lb[k].shape or not np.array_equal(la[k], lb[k], equal_nan=lb[k].dtype.kind == "f")]
    ma, mb = env.engine.metrics(), ref.engine.metrics()
    for k in mb:
        x, y = ma[k], mb[k]
        same = (np.array_equal(x, y, equal_nan=True) if isinstance(y, np.ndarray)
                else (x == y or (x != x and y != y)))
        if not same:
            out.append(f"metrics[{k}]")
    out += [f"{k}: {getattr(env.engine, k)!r} != {getattr(ref.engine, k)!r}" for k in COUNTERS
            if getattr(env.engine, k) != getattr(ref.engine, k)]
    if queue:
        for name in ("queue_ids", "active_ids"):
            x, y = getattr(env.engine, name)(), getattr(ref.engine, name)()
            if not np.array_equal(x, y):
                out.append(f"{name}() ({x.size} ids) != stepped ({y.size} ids)")
    return out


def compiled_and_stepped(kwargs: dict, rule: AdmissionRule, seed: int, guard: Guard | None,
                         max_iterations: int | None = None) -> tuple[FlowControlEnv, FlowControlEnv]:
    """(compiled run, Python reference run). With ``max_iterations`` the compiled engine stops there and
    the rest of the episode is stepped in Python."""
    env = FlowControlEnv(**kwargs)
    env.reset(seed=seed)
    if guard is not None:
        guard.watch(env.engine)
    assert env.rule_unsupported(rule) is None, env.rule_unsupported(rule)
    if max_iterations is None:
        env.run_rule(rule)
    else:
        env.engine.run_rule(rule, horizon=env._horizon, max_iterations=max_iterations)
        step_to_end(env, rule)
    ref = FlowControlEnv(**kwargs)
    ref.engine.jit = False  # the numpy path (eviction rules' select(), Lane.push)
    ref.reset(seed=seed)
    step_to_end(ref, rule)
    return env, ref


def burst(n: int, prompt: int = 10, output: int = 50) -> dict:
    """``n`` identical requests all arriving at time 0 (one chunk: nothing left to arrive after reset)."""
    return {"kind": "trace", "timed": True, "arrival": [0.0] * n, "prompt_len": [prompt] * n,
            "output_len": [output] * n}


# --------------------------------------------------------------------------- bug 1: queue lane overrun


@pytest.mark.parametrize(("eviction", "order", "n", "budget"), [
    ("all", "fifo", 250, 10),
    ("lifo", "fifo", 255, 10),
    ("estimate", "estimate", 250, 10),
    ("all", "estimate", 250, 10),
])
def test_the_compiled_loop_stays_inside_the_queue_buffer(eviction, order, n, budget, monkeypatch):
    """``run_timed`` sizes the queue buffer for ``bound = n_queued + n_active + not yet arrived`` ids,
    but an iteration can evict the ``k`` requests it has just admitted as well as the ``n_active`` that
    were running: when ``_lane_merge`` takes its back path the lane's tail then moves ``n_active + k``
    past the old tail, up to ``k - 1`` slots beyond the room the decision point checked. With the lane
    buffer nearly full (a burst, nothing left to arrive) the kernel writes past the buffer's end."""
    guard = Guard(monkeypatch)
    kwargs = {"M": 200, "horizon": 40, "eviction": eviction, "queue_order": order, "max_budget": 64,
              "time_model": {"kind": "linear", "c0": 0.01}, "workload": burst(n)}
    env, ref = compiled_and_stepped(kwargs, AdmissionRule("fixed", budget=budget), 0, guard)
    assert guard.overruns() == [], f"ids written past the end of the queue buffer: {guard.overruns()}"
    assert differences(env, ref) == []


def test_flow_control_on_a_burst_does_not_corrupt_the_heap():
    """The same overrun unguarded, through the public evaluation path: Algorithm 2 (``FlowControl(b=64)``,
    LIFO, FIFO) on 255 requests arriving together. The stepped run is fine; the compiled one writes
    past the lane buffer and glibc aborts the process (``munmap_chunk(): invalid pointer`` and kin)."""
    code = textwrap.dedent("""
        from flowgym.agents import FlowControl
        from flowgym.lab.evaluation import run_episode
        kw = dict(M=200, horizon=400, time_model={"kind": "linear", "c0": 0.01},
                  workload={"kind": "trace", "timed": True, "arrival": [0.0] * 255,
                            "prompt_len": [10] * 255, "output_len": [50] * 255})
        for _ in range(5):
            run_episode(FlowControl(b=64), kw, 0, None, compiled=False)
        for _ in range(5):
            run_episode(FlowControl(b=64), kw, 0, None)
        print("survived")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "survived" in p.stdout, (p.returncode, p.stderr[-500:])


# --------------------------------------------------------------------------- bug 2: chunks never drawn


def test_arrivals_after_the_first_chunk_when_the_rate_schedule_ends_at_zero():
    """``Engine.run_rule`` passes ``F[2] = inf`` ("everything is generated") when ``_workload_done()``,
    which for an endless workload means ``arrival_rate() <= 0``. A ``steps`` rate schedule (no period)
    reports its *last* rate as its mean, so traffic that stops at t=100 s counts as done from the start:
    the kernel never returns ``RUN_ARRIVE`` for the next 60 s chunk, and the requests of [60 s, 100 s)
    only join when the system next goes idle (here ~500 iterations late) instead of at the first
    iteration starting after their arrival."""
    kwargs = {"M": 3000, "time_model": "llama2-70b-tp2-a100", "horizon": 1500,
              "workload": {"kind": "iid", "timed": True, "lengths": {"kind": "lmsys-like"},
                           "rate": {"kind": "steps", "times": [0, 100], "rates": [4.0, 0.0]}}}
    fast = run_episode(FlowControl(b=4), kwargs, 0, None)
    slow = run_episode(FlowControl(b=4), kwargs, 0, None, compiled=False)
    assert fast.log["arrival"].size == slow.log["arrival"].size, "requests arrived by the end"
    late = np.flatnonzero(fast.log["arrival"] != slow.log["arrival"])
    assert late.size == 0, (f"first late request: arrives at {fast.log['arrival_time'][late[0]]:.2f} s, joins "
                            f"iteration {fast.log['arrival'][late[0]]} compiled vs {slow.log['arrival'][late[0]]}")
    for key in slow.series:
        assert np.array_equal(fast.series[key], slow.series[key]), key


# --------------------------------------------------------------------------- bug 3: the action space


def test_the_compiled_rule_is_what_a_step_with_the_agents_action_does_under_multiplier_actions():
    """``FlowControlEnv.rule_unsupported`` does not look at ``config.action``. With
    ``action="multiplier"`` a step reads the agent's ``act`` (``3``) as the index of a multiplier of
    the safe budget, while ``run_rule`` admits ``AdmissionRule.budget = 3`` every iteration: the
    evaluation's compiled and stepped runs of the same agent differ (and for an agent whose ``act``
    is not a valid index, e.g. ``GreedyLIFO``, stepping raises while the compiled run goes through).
    Fixed twice over: the environment refuses to run a rule there (its actions are not budgets), and since
    2026-11-29 the evaluation refuses an agent that sends budgets in such an environment at all, compiled or
    stepped (its ``3`` would have been read as a multiplier's index either way)."""
    kwargs = {"M": 4000, "time_model": "llama2-70b-tp2-a100", "horizon": 300, "action": "multiplier",
              "workload": {"kind": "iid", "rate": 30.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    for compiled in (True, False):
        with pytest.raises(ValueError, match=r"agent 'flow-control b=3' sends budgets .* action='multiplier'"):
            run_episode(FlowControl(b=3), kwargs, 0, None, compiled=compiled)
    env = FlowControlEnv(**kwargs)
    env.reset(seed=0)
    assert "action='multiplier'" in env.rule_unsupported(FlowControl(b=3).admission_rule(env.view()))


# --------------------------------------------------------------------------- bug 4: engine-level horizon


def test_engine_run_rule_called_at_its_horizon_runs_no_iteration():
    """``Engine.run_rule`` checks the end of the run only after serving an iteration, so called at
    (or past) ``horizon`` it still serves one (``t`` goes past the horizon; a Python loop
    ``while t < horizon: serve; arrive`` serves none). Not reachable through ``FlowControlEnv.run_rule``
    (which refuses an ended episode); the same holds for a finite workload already drained."""
    kwargs = {"M": 4000, "time_model": "llama2-70b-tp2-a100", "horizon": 50,
              "workload": {"kind": "iid", "rate": 30.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    env = FlowControlEnv(**kwargs)
    env.reset(seed=0)
    for _ in range(10):
        env.step(3)
    assert env.engine.run_rule(AdmissionRule("fixed", budget=3), horizon=10) == 0
    assert env.engine.t == 10


# --------------------------------------------------------------------------- regression: seeded fuzz


def _random_case(rng: np.random.Generator) -> tuple[dict, AdmissionRule, int | None]:
    M = int(rng.integers(40, 800))
    if rng.random() < 0.5:  # a trace: bursts at 0, arrivals on 60 s chunk boundaries, hour-long gaps
        n = int(rng.integers(1, 400))
        mode = int(rng.integers(0, 4))
        if mode == 0:
            arr = np.sort(rng.exponential(0.3, n).cumsum())
        elif mode == 1:
            arr = np.sort(rng.choice([0.0, 0.05, 59.999, 60.0, 120.0, 180.0, 3600.0], n))
        elif mode == 2:
            arr = np.zeros(n)
        else:
            arr = np.sort(rng.uniform(0, 400, n).round(1))
        wl = {"kind": "trace", "timed": True, "arrival": arr.tolist(),
              "prompt_len": rng.integers(1, 40, n).tolist(), "output_len": rng.integers(1, 80, n).tolist()}
    else:  # endless (or n_requests) Poisson arrivals with a horizon
        pairs = [[int(rng.integers(1, 50)), int(rng.integers(1, 90))] for _ in range(4)]
        wl = {"kind": "iid", "timed": True, "rate": float(rng.choice([0.05, 1.0, 5.0, 20.0])),
              "lengths": {"kind": "empirical", "pairs": pairs}}
        if rng.random() < 0.3:
            wl["n_requests"] = int(rng.integers(1, 300))
    tm = ({"kind": "linear", "c0": float(rng.uniform(0.005, 0.1)), "c_prefill": float(rng.uniform(0, 1e-3)),
           "c_decode": float(rng.uniform(0, 1e-2)), "c_kv": float(rng.uniform(0, 1e-5))}
          if rng.random() < 0.5 else {"kind": "jaillet"})
    order = str(rng.choice(["fifo", "estimate"]))
    eviction = str(rng.choice(["lifo", "all", "estimate"]))
    kwargs = {"M": M, "horizon": int(rng.integers(1, 1500)), "time_model": tm, "queue_order": order,
              "eviction": eviction, "estimate_floor": int(rng.integers(1, 6)), "max_budget": 64,
              "output_length_known": bool(rng.random() < 0.5), "workload": wl}
    kind = int(rng.integers(0, 3))
    if kind == 0:
        rule = AdmissionRule("fixed", budget=int(rng.integers(0, 40)))
    elif kind == 1:  # non-integer limits, above and below M
        rule = AdmissionRule("greedy", limit=float(rng.uniform(0, 1.3) * M), max_count=int(rng.integers(0, 64)))
    else:
        tracked = order == "estimate" or eviction == "estimate"
        lengths = str(rng.choice(["known", "bound", "estimate"] if tracked else ["known", "bound"]))
        rule = AdmissionRule("future-fit", max_count=int(rng.integers(0, 64)), lengths=lengths,
                             bound=int(rng.integers(0, 100)))
    max_iterations = None if rng.random() < 0.6 else int(rng.integers(0, 300))
    return kwargs, rule, max_iterations


@pytest.mark.parametrize("block", range(4))
def test_seeded_random_runs_compiled_equal_stepped(block, monkeypatch):
    """Random traces and Poisson workloads, both latency models, every order / eviction / rule kind,
    estimate floors, known and unknown lengths, zero budgets and max_count, horizons from 1, and runs
    the compiled loop stops at ``max_iterations`` that Python then steps to the end. Lanes are guarded
    (memory safety: bug 1 is tested above), and the compared state is the contract's (series, log,
    metrics, counters), which the guard leaves intact."""
    guard = Guard(monkeypatch)
    for seed in range(block * 60, block * 60 + 60):
        kwargs, rule, mi = _random_case(np.random.default_rng(seed))
        guard.lanes.clear()
        env, ref = compiled_and_stepped(kwargs, rule, seed, guard, max_iterations=mi)
        d = differences(env, ref, queue=False)
        assert d == [], (seed, rule, kwargs["eviction"], kwargs["queue_order"], mi, d)


# --------------------------------------------------------------------------- regression: targeted


@pytest.mark.parametrize("eviction", ["lifo", "all", "estimate"])
def test_thousands_active_grow_the_active_arrays_and_the_eviction_buffer(eviction, monkeypatch):
    """Huge budgets: the active set grows far past its initial 256 entries (RUN_GROW for ``_a_id``
    and ``_ev_buf``), with evictions of thousands of requests per overflow."""
    rng = np.random.default_rng(1)
    n = 6000
    kwargs = {"M": 60000, "horizon": 300, "eviction": eviction, "max_budget": 3000,
              "queue_order": "estimate" if eviction == "estimate" else "fifo", "time_model": {"kind": "jaillet"},
              "workload": {"kind": "trace", "timed": True, "arrival": np.sort(rng.uniform(0, 2, n)).tolist(),
                           "prompt_len": rng.integers(1, 10, n).tolist(),
                           "output_len": rng.integers(1, 60, n).tolist()}}
    guard = Guard(monkeypatch)
    env, ref = compiled_and_stepped(kwargs, AdmissionRule("fixed", budget=3000), 0, guard)
    assert env.engine._a_id.size > 4096 and env.engine.total_evictions > 10000
    assert differences(env, ref, queue=False) == []


def test_the_future_fit_kernel_on_degenerate_lengths():
    """``kernels.future_fit`` equals ``future_fit_count`` also with outputs of 0 (an ``AdmissionRule``
    with ``bound=0``) and active requests past their assumed output (remaining clamped to 1)."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        n, k = int(rng.integers(0, 10)), int(rng.integers(0, 10))
        M = int(rng.integers(1, 300))
        ap, ag, ao = rng.integers(1, 40, n), rng.integers(0, 30, n), rng.integers(0, 60, n)
        cp, co = rng.integers(1, 40, k), rng.integers(0, 40, k)
        assert kernels.future_fit(M, ap, ag, ao, cp, co) == future_fit_count(M, ap, ag, ao, cp, co)


# --------------------------------------------------------------------------- the loop's room margins

# The worst case for every buffer ``run_timed`` writes (``_worst_case_state``): at the decision point
# of iteration 1, admitting k = 3 overflows the cache, the ``all`` rule evicts every active request
# and every admitted one (n_active + k), they go back before the one request left queued, and both
# requests drawn but not yet arrived join at the iteration's end.
WORST = {"M": 1000, "horizon": 200, "eviction": "all", "queue_order": "fifo",
         "time_model": {"kind": "linear", "c0": 1.0, "c_prefill": 0.0, "c_decode": 0.0, "c_kv": 0.0},
         "workload": {"kind": "trace", "timed": True,
                      # ids 0-2 run from iteration 0; 3-6 queue (3-5 admitted at iteration 1); 7-8 arrive at 2.0
                      "arrival": [0.0] * 7 + [2.0, 2.0],
                      "prompt_len": [100] * 3 + [250] * 4 + [10, 10],
                      "output_len": [500] * 3 + [10] * 4 + [10, 10]}}
WORST_RULE = AdmissionRule("fixed", budget=3)


def _worst_case_state(order: str = "fifo") -> tuple[FlowControlEnv, int, int]:
    """The environment at iteration 1's decision point, with its k and ``bound`` (queued + active +
    drawn but not arrived: what run_timed sizes the queue buffer by). ``order="estimate"``: a keyed
    lane (ids and keys in two buffers; the evicted, whose estimates grew, go behind the queue)."""
    env = FlowControlEnv(**{**WORST, "queue_order": order})
    env.reset(seed=0)
    env.step(3)
    e = env.engine
    k = min(3, e.n_queued)
    return env, k, e.n_queued + e.n_active + (e.n_req - e.n_arrived)


def _place_queue(lane: rules.Lane, size: int, head: int) -> None:
    """Move the lane's queue into a buffer of ``size`` entries, starting at ``head``."""
    ids = lane.items().copy()
    keys = lane.kbuf[lane.head : lane.tail].copy()
    buf = np.full(size, SENTINEL, np.int64)
    buf[head : head + ids.size] = ids
    if lane.keyed:
        lane.kbuf = np.full(size, SENTINEL, np.int64)
        lane.kbuf[head : head + ids.size] = keys
    else:
        lane.kbuf = buf
    lane.buf, lane.head, lane.tail = buf, head, head + ids.size


def test_the_worst_case_iteration_is_what_the_margin_tests_run():
    """``_worst_case_state`` is the worst case: every active and admitted request evicted, the rest of
    the queue behind them, every drawn request arriving in the same iteration."""
    env, k, bound = _worst_case_state()
    e = env.engine
    assert (e.n_queued, e.n_active, k, bound) == (4, 3, 3, 9)
    env.step(3)
    assert e.last_arrivals == 2 and e.n_arrived == e.n_req == 9
    assert e.total_evictions == 6 and e.n_active == 0 and e.n_queued == 9
    assert e.queue_ids().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("order", ["fifo", "estimate"])
@pytest.mark.parametrize("extra", [-2, -1, 0, 1])
@pytest.mark.parametrize("head", [0, 1, 2, 3])
def test_the_compiled_loop_fits_the_worst_case_in_any_queue_buffer(head, extra, order):
    """The queue buffer holds ``bound + k + 1`` positions at the decision point or ``run_timed`` asks
    for room (RUN_GROW), and a queue whose head leaves too little room behind its tail is re-centred
    first. With the buffer ``extra`` positions longer than ``head + bound + k - 1`` (the last position
    the worst case writes is ``head + bound + k - 1``), the run equals the stepped one and the queue
    stays inside its buffer (``0 <= head <= tail <= size``)."""
    env, k, bound = _worst_case_state(order)
    ref, _, _ = _worst_case_state(order)
    lane = env.engine.lanes[0]
    assert lane.keyed == (order == "estimate")
    _place_queue(lane, max(head + bound + k - 1 + extra, len(lane) + head), head)
    assert env.engine.run_rule(WORST_RULE, horizon=env._horizon, max_iterations=1) == 1
    assert 0 <= lane.head <= lane.tail <= lane.buf.size
    assert env.engine.total_evictions == 6
    step_to_end(env, WORST_RULE)
    step_to_end(ref, WORST_RULE)
    assert differences(env, ref) == []


@pytest.mark.parametrize("extra", [-1, 0, 1])
@pytest.mark.parametrize("dead", [0, 3])
def test_the_compiled_loop_fits_the_worst_case_in_any_active_array(dead, extra):
    """The active arrays hold the active entries (and dead ones, before them) plus the k admitted, or
    ``run_timed`` compacts them and asks for room; the eviction buffer holds every entry of the active
    window plus k (the ``all`` rule evicts them all), counted after that compaction. Each sized
    ``extra`` from that need (``both``: the active arrays short, so the iteration compacts them,
    and the eviction buffer ``extra`` from what the compacted window needs)."""
    for which in ("active", "evict", "both"):
        env, k, _ = _worst_case_state()
        ref, _, _ = _worst_case_state()
        e = env.engine
        n = e.n_active
        ids, start, fin = (a[e._h : e._tail].copy() for a in (e._a_id, e._a_start, e._a_fin))
        if which in ("active", "both"):
            size = dead + n + k + (extra if which == "active" else -1)
            e._a_id, e._a_start, e._a_fin = (np.full(max(size, dead + n), -1, np.int64) for _ in range(3))
            e._a_id[dead : dead + n], e._a_start[dead : dead + n], e._a_fin[dead : dead + n] = ids, start, fin
            e._a_fin[:dead] = -1  # evicted entries: dead (finish -1 <= t)
            e._h, e._tail = 0, dead + n
        if which == "both":
            e._ev_buf = np.empty(n + k + extra, np.int64)
        if which == "evict":
            e._ev_buf = np.empty(max(e._tail - e._h + k + extra, 0), np.int64)
        assert e.run_rule(WORST_RULE, horizon=env._horizon, max_iterations=1) == 1, which
        assert e.total_evictions == 6, which
        step_to_end(env, WORST_RULE)
        step_to_end(ref, WORST_RULE)
        assert differences(env, ref) == [], which


def test_an_arrival_exactly_at_a_chunk_boundary_joins_when_the_clock_reaches_it():
    """Workloads are drawn in chunks of ``CHUNK_SECONDS``; when the clock reaches a chunk's end exactly,
    the next chunk is drawn before this iteration's arrivals are taken (``now >= gen_t``), so a request
    arriving exactly at the boundary joins then, not one iteration later. Iterations of exactly 1.0 s
    put the clock on the boundary (60.0) with requests still running."""
    from flowgym.sim.workloads import CHUNK_SECONDS

    at = float(CHUNK_SECONDS)
    kwargs = {**WORST, "eviction": "lifo",
              "workload": {"kind": "trace", "timed": True, "arrival": [0.0, 0.0, at, at + 0.5],
                           "prompt_len": [10, 10, 10, 10], "output_len": [200, 200, 5, 5]}}
    fast = run_episode(FlowControl(b=4), kwargs, 0, None)
    slow = run_episode(FlowControl(b=4), kwargs, 0, None, compiled=False)
    assert fast.log["arrival"].tolist() == slow.log["arrival"].tolist() == [0, 0, 60, 61]
    assert fast.log["finish"].tolist() == slow.log["finish"].tolist()


def test_the_record_and_the_clock_fill_together():
    """``run_timed`` asks for room when the record or the clock is full (``rec_n >= rows or t - base >=
    clock.size``). In full record mode (the only one it runs) both hold one row per iteration from 0
    and grow by doubling, so at every call they are full together: either test alone would do (why the
    mutants of that line are recorded as equivalent in docs/testing.md)."""
    for n in (0, 1, 255, 256, 257, 511, 700):
        env = FlowControlEnv(**{**WORST, "horizon": 5000,
                                "workload": {"kind": "iid", "rate": 3.0, "timed": True,
                                             "lengths": {"kind": "lmsys-like"}}})
        env.reset(seed=n)
        e = env.engine
        for _ in range(n):
            env.step(2)
        e._flush_records()  # as run_rule does first
        assert e._rec_n == e.t - e._clock_base == n and e._rec.shape[0] == e._clock.size
        e.run_rule(AdmissionRule("fixed", budget=2), horizon=None, max_iterations=300 + n)
        assert e._rec_n == e.t and e._rec.shape[0] == e._clock.size


def test_iterations_longer_than_a_chunk_draw_every_chunk_they_pass():
    """An iteration may end past the end of the next workload chunk (here a slow model: Jaillet's
    ``a = 100`` s per token of mean context, iterations of several seconds to minutes, chunks of
    60 s): the compiled loop then hands the draw to Python (``now >= gen_t``) before taking that
    iteration's arrivals, whatever the latency model's coefficients."""
    kwargs = {"M": 4000, "horizon": 300, "time_model": {"kind": "jaillet", "a": 100.0, "b": 0.0, "c": 1.0, "p": 0.0},
              "workload": {"kind": "iid", "rate": 1.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    for seed in (0, 1):
        fast = run_episode(FlowControl(b=2), kwargs, seed, None)
        slow = run_episode(FlowControl(b=2), kwargs, seed, None, compiled=False)
        assert fast.log["arrival"].tolist() == slow.log["arrival"].tolist()
        assert fast.log["finish"].tolist() == slow.log["finish"].tolist()
        assert np.array_equal(fast.series["time"], slow.series["time"])
        assert float(np.diff(fast.series["time"]).max()) > 60.0  # an iteration longer than a chunk
