"""Every queue order and eviction rule against the reference model, on both engine paths.

``tests/reference_model.py`` implements the spec's slot (``/work/shared/spec/model.md``) with
every queue order (``fifo``; ``sjf``: shortest known output first; ``estimate``: A_min's
smallest current output estimate first) and eviction rule (``lifo``; ``all``; ``estimate``:
A_min's smallest current estimate first, ties newest first), one Python object per request.
Here:

a. hand traces where requests carry *distinct* estimates (and distinct output lengths), each
   with its arithmetic, run against the reference model and the engine on both paths; each
   one's comment says which wrong rule (the reversed key, LIFO, FIFO) would give another
   result;
b. the hypothesis replay: engine == reference over all 9 order x rule combinations, with the
   numba kernels and on the numpy path (``FLOWGYM_JIT=0``'s code, switched per test);
c. the same through :class:`flowgym.sim.engine.Engine` with other estimate floors, comparing
   the estimates themselves.

The random examples are the same every run (``derandomize``; CI is reproducible); set
``FLOWGYM_FUZZ_EXPLORE=1`` (and ``FLOWGYM_FUZZ_EXAMPLES=500``) to search new ones.
Notation: ``rK = (a, l, o)``; ``j`` = tokens generated before the slot; a request
contributes ``l + j + 1`` to ``D_t``; ``e`` = its estimate ``e_i``, ``cur`` = its current
estimate ``max(e_i, j + 1)``.
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowgym
from flowgym.sim import kernels
from flowgym.sim.engine import Engine

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_model  # noqa: E402

ORDERS = ("fifo", "sjf", "estimate")
RULES = ("lifo", "all", "estimate")
PATHS = ("compiled", "numpy")
COMPARED = ("finish", "evictions", "rejected", "usage", "queue_len", "active", "admitted", "evicted", "completed",
            "wasted_tokens", "overflow_events")

EXAMPLES = int(os.environ.get("FLOWGYM_FUZZ_EXAMPLES", "50"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FLOWGYM_FUZZ_EXPLORE"),
                    suppress_health_check=[HealthCheck.too_slow])


@contextlib.contextmanager
def engine_path(path: str):
    """``flowgym.replay`` builds its own engine: switch the default path (kernels or numpy)."""
    if path == "compiled" and not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install -e '.[fast]' in the flowgym checkout)")
    old = kernels.ENABLED
    kernels.ENABLED = path == "compiled"
    try:
        yield
    finally:
        kernels.ENABLED = old


def _check(got: dict, expected: dict, label: str) -> None:
    for key in COMPARED:
        g, e = np.asarray(got[key]), np.asarray(expected[key])
        assert g.tolist() == e.tolist(), f"{label}: {key}:\n  got      {g.tolist()}\n  expected {e.tolist()}"


def _both(path: str, arrival, prompt, output, **kw) -> dict:
    """The reference model's result, after checking that the engine on ``path`` gives the same."""
    expected = reference_model.simulate(arrival, prompt, output, **kw)
    with engine_path(path):
        got = flowgym.replay(list(arrival), list(prompt), list(output), **kw)
    _check(got, expected, f"engine ({path}) vs reference, {kw}")
    return expected


# --------------------------------------------------------------------------- a. hand traces


@pytest.mark.parametrize("path", PATHS)
def test_a_min_hand_trace_estimate_order_and_estimate_eviction(path):
    """A_min (queue ``estimate``, eviction ``estimate``) with distinct estimates.

    r0 = (0, 2, 4), r1 = (0, 1, 4), r2 = (0, 3, 2); M = 7; budgets 2, 1, 1, 0, 0, 2, 1, 1, ...
    (1 from t6 on). Every e starts at 1 (the floor), so the queue starts in id order.

    - t0: admit r0, r1: r0 2+0+1 = 3, r1 1+0+1 = 2: D = 5.
    - t1: admit r2: r0 4 (j=1), r1 3 (j=1), r2 4: D = 11 > 7. cur r0 2, r1 2, r2 1: r2 goes
      (frees 4, D = 7); it had j = 0: e2 = max(1, 0+1) = 1, nothing wasted.
    - t2: admit r2 again: r0 5, r1 4, r2 4: D = 13 > 7. cur r0 3, r1 3, r2 1: r2 first (D = 9 > 7),
      then r0 and r1 tie at 3: the newer, r1 (activated after r0 in t0), goes (frees 4, D = 5).
      Wasted j1 = 2, e1 = max(1, 2+1) = 3. Queue by (e, a, i): r2 (e 1) before r1 (e 3); FIFO
      (and the reversed key) would put r1 first.
    - t3: budget 0: r0 6 (j=3): D = 6, r0 reaches j = 4 = o0: f0 = 4.  t4: budget 0: D = 0.
    - t5: budget 2 admits r2 then r1 (estimate order): r2 4, r1 2: D = 6.
    - t6: r2 5 (j=1), r1 3 (j=1): D = 8 > 7. cur r2 max(1, 2) = 2, r1 max(3, 2) = 3: r2, the
      *older* one with the smaller estimate, goes (LIFO would evict r1, the newest; the reversed
      key r1, the largest estimate): frees 5, D = 3; wasted 1, e2 = 2.
    - t7: admit r2: r1 4 (j=2), r2 4: D = 8 > 7; cur r1 3, r2 2: r2 again (frees 4), D = 4.
    - t8: admit r2: r1 5 (j=3), r2 4: D = 9 > 7; cur r1 4, r2 2: r2 again, D = 5; r1 reaches
      j = 4 = o1: f1 = 9.
    - t9: admit r2: D = 4.  t10: r2 5 (j=1), reaches j = 2 = o2: f2 = 11.  t11: D = 0.

    Evictions: r1 once (t2), r2 five times (t1, t2, t6, t7, t8), each overflow slot one event:
    5. Wasted 2 + 1 = 3. Final estimates (1, 3, 2). With LIFO eviction instead, f = (4, 11, 7).
    """
    r = _both(path, [0, 0, 0], [2, 1, 3], [4, 4, 2], M=7, budgets=[2, 1, 1, 0, 0, 2] + [1] * 6,
              eviction="estimate", queue_order="estimate", horizon=12)
    assert r["finish"].tolist() == [4, 9, 11]
    assert r["evictions"].tolist() == [0, 1, 5]
    assert r["wasted_tokens"] == 3 and r["overflow_events"] == 5
    assert r["usage"].tolist() == [5, 7, 5, 6, 0, 6, 3, 4, 5, 4, 5, 0]
    assert r["queue_len"].tolist() == [1, 1, 2, 2, 2, 0, 1, 1, 1, 0, 0, 0]
    assert r["estimate"].tolist() == [1, 3, 2]
    lifo = _both(path, [0, 0, 0], [2, 1, 3], [4, 4, 2], M=7, budgets=[2, 1, 1, 0, 0, 2] + [1] * 6,
                 eviction="lifo", queue_order="estimate", horizon=12)
    assert lifo["finish"].tolist() == [4, 11, 7]


@pytest.mark.parametrize("path", PATHS)
def test_estimate_order_readmits_the_smaller_estimate_first(path):
    """Queue ``estimate`` with LIFO eviction: an evicted request waits behind one whose
    estimate is smaller, though it arrived first (same arrival slot, smaller id).

    r0 = (0, 1, 4), r1 = (0, 2, 2), r2 = (0, 1, 2); M = 5; budgets 2, 2, 0, 1, 1, 1, 1, 2.

    - t0: admit r0, r1 (e all 1: id order): r0 2, r1 3: D = 5.
    - t1: admit r2: r0 3, r1 4 (j=1), r2 2: D = 9 > 5. LIFO: r2 (frees 2, D = 7), then r1 (frees
      4, D = 3). Wasted j1 = 1: e1 = 2; e2 = max(1, 0+1) = 1. Queue: r2 (e 1), r1 (e 2); FIFO
      would give r1, r2.
    - t2: budget 0: r0 4: D = 4.
    - t3: admit r2: r0 5 (j=3), r2 2: D = 7 > 5: r2 evicted again (D = 5); r0 reaches j = 4:
      f0 = 4.
    - t4: admit r2: D = 2.  t5: admit r1: r2 3 (j=1), r1 3: D = 6 > 5: r1 (newest) evicted
      (j = 0: no waste, e1 stays 2), D = 3; r2 reaches j = 2: f2 = 6.
    - t6: admit r1: D = 3.  t7: r1 4 (j=1), reaches j = 2: f1 = 8.

    FIFO order instead: f = (4, 6, 8) (r1 readmitted at t3).
    """
    kw = dict(M=5, budgets=[2, 2, 0, 1, 1, 1, 1, 2], eviction="lifo", horizon=9)
    r = _both(path, [0, 0, 0], [1, 2, 1], [4, 2, 2], queue_order="estimate", **kw)
    assert r["finish"].tolist() == [4, 8, 6]
    assert r["evictions"].tolist() == [0, 2, 2]
    assert r["wasted_tokens"] == 1 and r["overflow_events"] == 3
    assert r["usage"].tolist() == [5, 3, 4, 5, 2, 3, 3, 4, 0]
    assert r["estimate"].tolist() == [1, 2, 1]
    fifo = _both(path, [0, 0, 0], [1, 2, 1], [4, 2, 2], queue_order="fifo", **kw)
    assert fifo["finish"].tolist() == [4, 6, 8]


@pytest.mark.parametrize("path", PATHS)
def test_sjf_order_shortest_known_output_first_ties_fifo(path):
    """Queue ``sjf``: ascending o, ties by (a, i).

    r0 = (0, 2, 2), r1 = (0, 1, 1), r2 = (0, 3, 2); M = 9; budget 1 every slot.
    Queue at t0 by (o, a, i): r1 (o 1), r0 (o 2, id 0), r2 (o 2, id 2).

    - t0: admit r1: D = 2; r1 reaches j = 1 = o1: f1 = 1.
    - t1: admit r0: D = 3.  t2: admit r2: r0 4, r2 4: D = 8; r0 reaches j = 2: f0 = 3.
    - t3: r2 5: D = 5, f2 = 4.

    FIFO gives f = (2, 2, 4); the reversed key (longest first, r0 then r2 then r1) (2, 3, 3);
    ties broken by the larger id, (4, 1, 3).
    """
    r = _both(path, [0, 0, 0], [2, 1, 3], [2, 1, 2], M=9, budgets=1, eviction="lifo", horizon=6,
              queue_order="sjf")
    assert r["finish"].tolist() == [3, 1, 4]
    assert r["usage"].tolist() == [2, 3, 8, 5, 0, 0]


@pytest.mark.parametrize("path", PATHS)
def test_sjf_order_puts_an_evicted_long_request_behind_a_later_short_one(path):
    """Queue ``sjf``: an evicted request keeps its arrival, but under sjf a later, shorter
    arrival goes first (under FIFO the evicted one would).

    r0 = (0, 1, 6), r1 = (1, 1, 6), r2 = (4, 1, 2); M = 8; budget 1 every slot; LIFO.

    - t0: admit r0: D = 2.  t1: admit r1: r0 3, r1 2: D = 5.  t2: r0 4, r1 3: D = 7.
    - t3: r0 5, r1 4 (j=2): D = 9 > 8: r1 (newest) evicted, frees 4, D = 5; wasted 2.
    - t4: r2 arrives; queue by (o, a, i): r2 (o 2) before r1 (o 6). Admit r2: r0 6, r2 2: D = 8.
    - t5: admit r1: r0 7 (j=5), r2 3, r1 2: D = 12 > 8: LIFO evicts r1 (frees 2, D = 10), then
      r2 (j=1, frees 3, D = 7); wasted 1. r0 reaches j = 6: f0 = 6. Queue: r2 (o 2), r1 (o 6).
    - t6: admit r2: D = 2.  t7: admit r1: r2 3, r1 2: D = 5; r2 reaches j = 2: f2 = 8.
    - t8..t12: r1 alone from t7 with o1 = 6: f1 = 7 + 6 = 13.

    FIFO instead readmits r1 at t4: f = (6, 12, 9).
    """
    kw = dict(M=8, budgets=1, eviction="lifo", horizon=14)
    r = _both(path, [0, 1, 4], [1, 1, 1], [6, 6, 2], queue_order="sjf", **kw)
    assert r["finish"].tolist() == [6, 13, 8]
    assert r["evictions"].tolist() == [0, 2, 1]
    assert r["wasted_tokens"] == 3 and r["overflow_events"] == 2
    assert r["usage"].tolist() == [2, 5, 7, 5, 8, 7, 2, 5, 3, 4, 5, 6, 7, 0]
    fifo = _both(path, [0, 1, 4], [1, 1, 1], [6, 6, 2], queue_order="fifo", **kw)
    assert fifo["finish"].tolist() == [6, 12, 9]


# --------------------------------------------------------------------------- b. the replay over every rule


@st.composite
def traces(draw, classes=True):
    n = draw(st.integers(0, 25))
    arrival = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
    prompt_len = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    output_len = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
    M = draw(st.integers(6, 50))
    kind = draw(st.sampled_from(["int", "list", "classes"] if classes else ["int", "list"]))
    kwargs: dict = {}
    if kind == "int":
        budgets = draw(st.integers(0, 5))
    elif kind == "list":
        budgets = draw(st.lists(st.integers(0, 5), min_size=0, max_size=50))
    else:
        m = draw(st.integers(1, 3))
        budgets = draw(st.lists(st.integers(0, 3), min_size=m, max_size=m))
        kwargs["classes"] = draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n))
    horizon = draw(st.one_of(st.integers(0, 25), st.just(120)))
    return arrival, prompt_len, output_len, dict(kwargs, M=M, budgets=budgets, horizon=horizon)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("eviction", RULES)
@pytest.mark.parametrize("order", ORDERS)
@PROPERTY
@given(case=traces())
def test_property_engine_agrees_with_reference(order, eviction, path, case):
    """``flowgym.replay`` == the reference model (finish slots, evictions, rejections, per-slot
    usage, queue and active counts, admissions, evictions and completions, waste, overflow
    events) for this order and rule."""
    arrival, prompt_len, output_len, kwargs = case
    _both(path, arrival, prompt_len, output_len, queue_order=order, eviction=eviction, **kwargs)


# --------------------------------------------------------------------------- c. estimate floors, through Engine


def _engine_run(path, arrival, prompt_len, output_len, *, M, budgets, eviction, queue_order, estimate_floor,
                horizon):
    if path == "compiled" and not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install -e '.[fast]' in the flowgym checkout)")
    trace = flowgym.Trace(arrival, prompt_len, output_len)
    eng = Engine(M, trace, eviction=eviction, queue_order=queue_order, estimate_floor=estimate_floor)
    eng.jit = path == "compiled"
    eng.reset(np.random.default_rng(0))
    arrived, rejected, queued_prompt, completed_tokens = [], [], [], []
    for t in range(horizon):
        n = eng.arrive()  # returns the slot's arrivals, rejected ones included
        assert n == eng.last_arrivals
        arrived.append(n)
        rejected.append(eng.last_rejected)
        eng.serve(budgets[t] if t < len(budgets) else 0)
        queued_prompt.append(eng.queued_prompt_tokens)
        completed_tokens.append(eng.last_completed_tokens)
    n = len(trace)
    inv = np.empty(n, np.int64)
    inv[trace.row] = np.arange(n)
    log = eng.request_log()
    finish = np.full(n, -1, np.int64)
    finish[: log["finish"].size] = log["finish"]
    est = np.full(n, estimate_floor, np.int64)
    est[: eng.n_arrived] = eng.estimate[: eng.n_arrived]
    return {"finish": finish[inv], "estimate": est[inv], "usage": eng.series()["usage"],
            "wasted_tokens": eng.wasted_tokens, "track": eng.track_estimates, "arrived": arrived,
            "rejected_now": rejected, "queued_prompt": queued_prompt, "completed_tokens": completed_tokens}


@pytest.mark.parametrize("path", PATHS)
@PROPERTY
@given(case=traces(classes=False), floor=st.integers(1, 6), order=st.sampled_from(ORDERS), eviction=st.sampled_from(RULES))
def test_property_estimate_floor_and_estimates_agree(path, case, floor, order, eviction):
    """Other initial estimates (``estimate_floor``): the engine's final estimates (when it tracks
    them) and its finish slots and usage equal the reference model's; so do the counters the
    environment observes: arrivals and rejections of each slot, waiting prompt tokens, the
    ``l + o`` tokens freed by each slot's completions."""
    arrival, prompt_len, output_len, kwargs = case
    b = kwargs["budgets"]
    budgets = [b] * kwargs["horizon"] if isinstance(b, int) else list(b)
    kw = dict(M=kwargs["M"], eviction=eviction, queue_order=order, horizon=kwargs["horizon"])
    expected = reference_model.simulate(arrival, prompt_len, output_len, budgets=budgets, estimate_floor=floor, **kw)
    got = _engine_run(path, arrival, prompt_len, output_len, budgets=budgets, estimate_floor=floor, **kw)
    assert got["finish"].tolist() == expected["finish"].tolist()
    assert got["usage"].tolist() == expected["usage"].tolist()
    assert got["wasted_tokens"] == expected["wasted_tokens"]
    for key in ("arrived", "rejected_now", "queued_prompt", "completed_tokens"):
        assert list(got[key]) == expected[key].tolist(), key
    assert got["track"] == (order == "estimate" or eviction == "estimate")
    if got["track"]:
        assert got["estimate"].tolist() == expected["estimate"].tolist()


def test_reference_estimate_bounds_and_arguments():
    """The reference's estimates stay lower bounds of o (raised only to j + 1 < o on eviction);
    its arguments are checked."""
    r = reference_model.simulate([0, 0, 0], [2, 1, 3], [4, 4, 2], M=7, budgets=[2, 1, 1, 0, 0, 2] + [1] * 6,
                                 eviction="estimate", queue_order="estimate", horizon=12)
    assert (r["estimate"] <= np.array([4, 4, 2])).all()
    with pytest.raises(ValueError, match="queue_order"):
        reference_model.simulate([0], [1], [1], M=5, budgets=1, queue_order="lifo")
    with pytest.raises(ValueError, match="estimate_floor"):
        reference_model.simulate([0], [1], [1], M=5, budgets=1, estimate_floor=0)
    assert reference_model.simulate([0], [1], [3], M=5, budgets=1, estimate_floor=7, horizon=3)["estimate"].tolist() == [7]
