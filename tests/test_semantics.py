"""Semantics of one slot (``/work/shared/spec/model.md``), pinned down by

a. hand-computed traces, each run against both the pure-Python reference
   model (``tests/reference_model.py``, ids ``ref-...``) and the package's
   ``flowgym.replay`` (ids ``engine-...``);
b. a hypothesis property test: engine == reference on random small traces;
c. invariants of the reference model itself.

Notation in the comments: request ``rK = (a, l, o)``; ``j`` = tokens generated
before the slot; a request contributes ``l + j + 1`` to ``D_t``; ``U`` =
``D_t`` after eviction; ``q`` / ``act`` = queue length / active count at the
end of the slot.  ``flowgym`` is imported lazily so that ``-k ref`` runs
without the engine; if the engine is missing its tests fail (never skip).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_model  # noqa: E402

PER_REQUEST_KEYS = ("finish", "evictions", "rejected")
PER_SLOT_KEYS = ("usage", "queue_len", "active")
SCALAR_KEYS = ("wasted_tokens", "overflow_events")
ALL_KEYS = PER_REQUEST_KEYS + PER_SLOT_KEYS + SCALAR_KEYS


def _run_reference(*args, **kwargs):
    return reference_model.simulate(*args, **kwargs)


def _run_engine(*args, **kwargs):
    import flowgym  # lazy: the reference half must run without the engine

    return flowgym.replay(*args, **kwargs)


IMPLEMENTATIONS = {"ref": _run_reference, "engine": _run_engine}


def _run(impl, trace):
    kw = dict(trace["kwargs"])
    arrival = kw.pop("arrival")
    prompt_len = kw.pop("prompt_len")
    output_len = kw.pop("output_len")
    return IMPLEMENTATIONS[impl](arrival, prompt_len, output_len, **kw)


def _as_list(x, key):
    arr = np.asarray(x)
    if key == "rejected":
        return [bool(v) for v in arr.tolist()]
    return [int(v) for v in arr.tolist()]


def _assert_result_equals(got, expected, label=""):
    for key in ALL_KEYS:
        if key not in expected:
            continue
        assert key in got, f"{label}: result has no key {key!r}"
        if key in SCALAR_KEYS:
            assert int(got[key]) == int(expected[key]), (
                f"{label}: {key}: got {got[key]!r}, expected {expected[key]!r}")
        else:
            g, e = _as_list(got[key], key), _as_list(expected[key], key)
            assert g == e, f"{label}: {key}:\n  got      {g}\n  expected {e}"


def _complete_expected(trace):
    """Defaults for the keys a hand trace leaves implicit: nothing evicted,
    nothing rejected, no waste, no overflow."""
    n = len(trace["kwargs"]["arrival"])
    exp = dict(trace["expected"])
    exp.setdefault("evictions", [0] * n)
    exp.setdefault("rejected", [False] * n)
    exp.setdefault("wasted_tokens", 0)
    exp.setdefault("overflow_events", 0)
    return exp


# ---------------------------------------------------------------------------
# a. Hand-computed traces.
# ---------------------------------------------------------------------------

HAND_TRACES = []


def _trace(id, kwargs, expected):
    HAND_TRACES.append({"id": id, "kwargs": kwargs, "expected": expected})


# T1  Rejection of l+o > M; l+o == M is fine; horizon=None stops when drained.
# M=10, B=1.  r0=(0,6,5): 11>10 rejected; r1=(0,2,3); r2=(1,2,2); r3=(3,4,6): 10==M ok.
# t0: r0 rejected on arrival (never queued, so it does not hold the FIFO head
#     with B=1); admit r1: D=2+0+1=3.  r1 j=1.            U=3 q0 act1
# t1: admit r2: D=r1 4 + r2 3 = 7.  r1 j=2, r2 j=1.       U=7 q0 act2
# t2: D = r1 5 + r2 4 = 9.  r1 j=3=o -> f=3; r2 j=2=o -> f=3.  U=9 q0 act0
# t3: admit r3: D=4+0+1=5 ... t8: D=4+5+1=10 (=M, no overflow); j=6 -> f=9.
# All arrived and the system is empty at the start of t9 -> 9 slots run.
_trace(
    "reject_too_long",
    dict(arrival=[0, 0, 1, 3], prompt_len=[6, 2, 2, 4], output_len=[5, 3, 2, 6],
         M=10, budgets=1, eviction="lifo", horizon=None),
    dict(finish=[-1, 3, 3, 9], rejected=[True, False, False, False],
         usage=[3, 7, 9, 5, 6, 7, 8, 9, 10], queue_len=[0] * 9,
         active=[1, 2, 0, 1, 1, 1, 1, 1, 0]),
)

# T2  FIFO under a budget of 1, input given out of arrival order; ties in a_i
# are broken by index.  M=100 (no memory pressure), B=1, horizon 5.
# r0=(2,1,1), r1=(0,1,2), r2=(0,1,1), r3=(1,1,1).  Queue order: r1 r2 r3 r0.
# t0: arrive r1,r2; admit r1: D=2.  r1 j=1.               U=2 q1 act1
# t1: arrive r3; admit r2: D=r1 3 + r2 2=5.  r1 j=2 -> f=2; r2 -> f=2.  U=5 q1 act0
# t2: arrive r0; queue r3,r0; admit r3: D=2 -> f=3.        U=2 q1 act0
# t3: admit r0: D=2 -> f=4.                                 U=2 q0 act0
# t4: idle.                                                 U=0 q0 act0
_trace(
    "fifo_budget_one",
    dict(arrival=[2, 0, 0, 1], prompt_len=[1, 1, 1, 1], output_len=[1, 2, 1, 1],
         M=100, budgets=1, eviction="lifo", horizon=5),
    dict(finish=[4, 2, 2, 3], usage=[2, 5, 2, 2, 0], queue_len=[1, 1, 1, 0, 0],
         active=[1, 0, 0, 0, 0]),
)

# T3  Budget limits admissions (int budget).  M=100, B=2, five requests
# (0,1,3) at t=0, horizon=None.
# t0: admit r0,r1: D=2+2=4.  j=1,1.                         U=4  q3 act2
# t1: admit r2,r3: D=3+3+2+2=10.  j=2,2,1,1.                U=10 q1 act4
# t2: admit r4: D=4+4+3+3+2=16.  r0,r1 -> f=3.  j(r2,r3,r4)=2,2,1.  U=16 q0 act3
# t3: D=4+4+3=11.  r2,r3 -> f=4; r4 j=2.                    U=11 q0 act1
# t4: D=4.  r4 -> f=5.                                      U=4  q0 act0
_trace(
    "budget_limits_admissions",
    dict(arrival=[0] * 5, prompt_len=[1] * 5, output_len=[3] * 5,
         M=100, budgets=2, eviction="lifo", horizon=None),
    dict(finish=[3, 3, 4, 4, 5], usage=[4, 10, 16, 11, 4], queue_len=[3, 1, 0, 0, 0],
         active=[2, 4, 3, 1, 0]),
)

# T4  Per-slot budget list [2, 0, 1]; slots past its end use B=0, so r3 never
# starts.  M=100, four requests (0,1,1), horizon 5.
# t0: B=2: admit r0,r1: D=4; both f=1.   U=4 q2 act0
# t1: B=0.                                U=0 q2 act0
# t2: B=1: admit r2: D=2; f=3.            U=2 q1 act0
# t3, t4: B=0 (past the list).            U=0 q1 act0
_trace(
    "budget_per_slot_list",
    dict(arrival=[0] * 4, prompt_len=[1] * 4, output_len=[1] * 4,
         M=100, budgets=[2, 0, 1], eviction="lifo", horizon=5),
    dict(finish=[1, 1, 3, -1], usage=[4, 0, 2, 0, 0], queue_len=[2, 2, 1, 1, 1],
         active=[0, 0, 0, 0, 0]),
)

# T5  LIFO within a slot: the last admitted is evicted first, one at a time
# while D > M (not the largest, not the oldest).  M=10, B=4, all a=0, o=2:
# r0 l=2, r1 l=3, r2 l=4, r3 l=1.
# t0: admit r0..r3: D=3+4+5+2=14>10 -> evict r3 (->12) -> evict r2 (->7).
#     (largest-first would evict only r2.)  r0,r1 j=1.   U=7 q2 act2  [overflow 1]
# t1: admit r2,r3 (in that order): D=r0 4 + r1 5 + r2 5 + r3 2=16 -> evict r3
#     (14) -> evict r2 (9).  r0,r1 -> f=2.                U=9 q2 act0  [overflow 2]
# t2: admit r2,r3: D=5+2=7.  j=1.                         U=7 q0 act2
# t3: D=6+3=9.  r2,r3 -> f=4.                             U=9 q0 act0
# Both evicted requests had j=0 -> no wasted tokens.
_trace(
    "lifo_within_slot",
    dict(arrival=[0, 0, 0, 0], prompt_len=[2, 3, 4, 1], output_len=[2, 2, 2, 2],
         M=10, budgets=4, eviction="lifo", horizon=None),
    dict(finish=[2, 2, 4, 4], evictions=[0, 0, 2, 2], wasted_tokens=0,
         overflow_events=2, usage=[7, 9, 7, 9], queue_len=[2, 2, 0, 0],
         active=[2, 0, 2, 0]),
)

# T6  LIFO across slots: the most recently activated request goes first, then
# the next most recent (activated in an earlier slot), never the oldest.
# M=12, B=1.  r0=(0,1,6), r1=(1,5,3), r2=(3,1,2).
# t0: admit r0: D=2.  j0=1.                               U=2  q0 act1
# t1: admit r1: D=r0 3 + r1 6=9.  j0=2, j1=1.             U=9  q0 act2
# t2: D=4+7=11.  j0=3, j1=2.                              U=11 q0 act2
# t3: admit r2: D=r0 5 + r1 8 + r2 2=15>12 -> evict r2 (13, wasted 0) -> evict
#     r1 (activated t1, j=2: wasted 2) -> 5.  r0 j=4.     U=5  q2 act1 [ovf 1]
#     (largest-first would evict r1 alone and keep r2.)
# t4: queue r1 (a=1), r2 (a=3); admit r1: D=r0 6 + r1 6=12.  j0=5, j1=1.
#                                                         U=12 q1 act2
# t5: admit r2: D=r0 7 + r1 7 + r2 2=16 -> evict r2 (14) -> evict r1 (j=1:
#     wasted 1) -> 7.  r0 j=6 -> f=6.                     U=7  q2 act0 [ovf 2]
# t6: admit r1: D=6.  j1=1.                               U=6  q1 act1
# t7: admit r2: D=r1 7 + r2 2=9.  j1=2, j2=1.             U=9  q0 act2
# t8: D=8+3=11.  r1 -> f=9, r2 -> f=9.                    U=11 q0 act0
_trace(
    "lifo_across_slots",
    dict(arrival=[0, 1, 3], prompt_len=[1, 5, 1], output_len=[6, 3, 2],
         M=12, budgets=1, eviction="lifo", horizon=None),
    dict(finish=[6, 9, 9], evictions=[0, 2, 2], wasted_tokens=3, overflow_events=2,
         usage=[2, 9, 11, 5, 12, 7, 6, 9, 11], queue_len=[0, 0, 0, 2, 1, 2, 1, 0, 0],
         active=[1, 2, 2, 1, 2, 0, 1, 2, 0]),
)

# T7  An evicted request re-enters the queue ahead of later arrivals (keeps its
# a_i), even one that has been waiting longer.  M=10, budgets
# [1,1,0,0,1,1,1,1].  r0=(0,2,4), r1=(1,2,4), r2=(2,1,1).
# t0: admit r0: D=3.  j0=1.                               U=3 q0 act1
# t1: admit r1: D=4+3=7.  j0=2, j1=1.                     U=7 q0 act2
# t2: r2 arrives, B=0: D=5+4=9.  j0=3, j1=2.              U=9 q1 act2
# t3: B=0: D=6+5=11>10 -> evict r1 (j=2: wasted 2) -> 6.  r0 j=4 -> f=4.
#     queue: r1 (a=1) ahead of r2 (a=2).                  U=6 q2 act0 [ovf 1]
# t4: admit r1 (not r2): D=3.  j1=1.                      U=3 q1 act1
# t5: admit r2: D=4+2=6.  j1=2; r2 -> f=6.                U=6 q0 act1
# t6: D=5.  j1=3.                                         U=5 q0 act1
# t7: D=6.  r1 -> f=8.                                    U=6 q0 act0
# (Appending r1 at the queue tail would give r2 f=5 and r1 f=9.)
_trace(
    "evicted_requeued_ahead",
    dict(arrival=[0, 1, 2], prompt_len=[2, 2, 1], output_len=[4, 4, 1],
         M=10, budgets=[1, 1, 0, 0, 1, 1, 1, 1], eviction="lifo", horizon=None),
    dict(finish=[4, 8, 6], evictions=[0, 1, 0], wasted_tokens=2, overflow_events=1,
         usage=[3, 7, 9, 6, 3, 6, 5, 6], queue_len=[0, 0, 1, 2, 1, 0, 0, 0],
         active=[1, 2, 2, 0, 1, 1, 1, 0]),
)

# T8  Memory is freed at completion: r0 finishes at the end of slot 1 (f=2),
# so r1 admitted in slot 2 fits (it would not if r0 still held l+o=6).
# M=10, B=1.  r0=(0,4,2), r1=(1,5,5) (l+o=10=M).
# t0: admit r0: D=5.  j0=1.                               U=5 q0 act1
# t1: admit r1: D=r0 6 + r1 6=12>10 -> evict r1 (j=0) -> 6.  r0 -> f=2.
#     (U_1 includes the completing r0 at l+o.)            U=6 q1 act0 [ovf 1]
# t2: admit r1: D=6 (r0 freed; 7+6=13 otherwise).  j1=1. U=6 q0 act1
# t3..t6: D=7,8,9,10.  r1 -> f=7.
_trace(
    "memory_freed_at_completion",
    dict(arrival=[0, 1], prompt_len=[4, 5], output_len=[2, 5],
         M=10, budgets=1, eviction="lifo", horizon=None),
    dict(finish=[2, 7], evictions=[0, 1], wasted_tokens=0, overflow_events=1,
         usage=[5, 6, 6, 7, 8, 9, 10], queue_len=[0, 1, 0, 0, 0, 0, 0],
         active=[1, 0, 1, 1, 1, 1, 0]),
)

# T9  'all' eviction: on overflow every active request is evicted (memory
# reset), the old one included.  M=10, B=3.  r0=(0,2,4), r1=(2,2,1), r2=(2,2,1).
# t0: admit r0: D=3.  j0=1.                               U=3 q0 act1
# t1: D=4.  j0=2.                                         U=4 q0 act1
# t2: admit r1,r2: D=r0 5 + 3 + 3=11>10 -> evict all: r0 wastes 2.
#                                                         U=0 q3 act0 [ovf 1]
# t3: admit r0,r1,r2: D=3+3+3=9.  r1,r2 -> f=4; j0=1.    U=9 q0 act1
# t4: D=4; t5: D=5; t6: D=6, r0 -> f=7.
_trace(
    "evict_all",
    dict(arrival=[0, 2, 2], prompt_len=[2, 2, 2], output_len=[4, 1, 1],
         M=10, budgets=3, eviction="all", horizon=None),
    dict(finish=[7, 4, 4], evictions=[1, 1, 1], wasted_tokens=2, overflow_events=1,
         usage=[3, 4, 0, 9, 4, 5, 6], queue_len=[0, 0, 3, 0, 0, 0, 0],
         active=[1, 1, 0, 1, 1, 1, 0]),
)

# T10 Same trace with lifo, for contrast.
# t2: D=11 -> evict r2 only (last admitted) -> 8.  j0=3; r1 -> f=3.
#                                                         U=8 q1 act1 [ovf 1]
# t3: admit r2: D=r0 6 + r2 3=9.  r0 -> f=4, r2 -> f=4.  U=9 q0 act0
_trace(
    "evict_lifo_contrast",
    dict(arrival=[0, 2, 2], prompt_len=[2, 2, 2], output_len=[4, 1, 1],
         M=10, budgets=3, eviction="lifo", horizon=None),
    dict(finish=[4, 3, 4], evictions=[0, 0, 1], wasted_tokens=0, overflow_events=1,
         usage=[3, 4, 8, 9], queue_len=[0, 0, 1, 0], active=[1, 1, 1, 0]),
)

# T11 Per-class budgets (Algorithm 1): up to b_k of class k each slot, FIFO
# within a class, independent of global FIFO.  M=100, b=(1,2).
# class 0: r0=(0,1,2), r1=(0,1,2); class 1: r2=(0,1,1), r3,r4,r5=(1,1,1).
# t0: class 0 -> r0 (b0=1, r1 waits); class 1 -> r2.  D=2+2=4.  j0=1; r2 -> f=1.
#                                                         U=4 q1 act1
# t1: class 0 -> r1; class 1 -> r3,r4 (r5 waits).  D=r0 3 + 2+2+2=9.
#     r0 -> f=2; r3,r4 -> f=2; j1=1.                      U=9 q1 act1
# t2: class 1 -> r5.  D=r1 3 + r5 2=5.  r1,r5 -> f=3.     U=5 q0 act0
_trace(
    "class_budgets",
    dict(arrival=[0, 0, 0, 1, 1, 1], prompt_len=[1] * 6, output_len=[2, 2, 1, 1, 1, 1],
         M=100, budgets=[1, 2], eviction="lifo", horizon=None,
         classes=[0, 0, 1, 1, 1, 1]),
    dict(finish=[2, 3, 1, 2, 2, 3], usage=[4, 9, 5], queue_len=[1, 1, 0],
         active=[1, 1, 0]),
)

# T12 Class order is the within-slot admission order, which LIFO uses:
# r0 (class 1) has the smaller (a,i) key but is admitted after r1 (class 0),
# so r0 is the one evicted.  M=10, b=(1,1).  r0=(0,3,3) class 1, r1=(0,3,3) class 0.
# t0: admit r1 then r0: D=4+4=8.  j=1,1.                  U=8  q0 act2
# t1: D=5+5=10.  j=2,2.                                   U=10 q0 act2
# t2: D=6+6=12>10 -> evict r0 (j=2: wasted 2) -> 6.  r1 -> f=3.
#                                                         U=6  q1 act0 [ovf 1]
# t3: admit r0: D=4; t4: 5; t5: 6, r0 -> f=6.
_trace(
    "class_order_drives_lifo",
    dict(arrival=[0, 0], prompt_len=[3, 3], output_len=[3, 3],
         M=10, budgets=[1, 1], eviction="lifo", horizon=None, classes=[1, 0]),
    dict(finish=[6, 3], evictions=[1, 0], wasted_tokens=2, overflow_events=1,
         usage=[8, 10, 6, 4, 5, 6], queue_len=[0, 0, 1, 0, 0, 0],
         active=[2, 2, 0, 1, 1, 0]),
)

# T13 o=1: finish = admission slot + 1 (admission delayed by B=0 at t0), and
# an o=1 request is never counted active at the end of a slot.  M=10,
# budgets [0,1,1], horizon 4.  r0=(0,3,1), r1=(0,9,1) (l+o=10=M).
# t0: B=0.                         U=0  q2 act0
# t1: admit r0: D=4.  r0 -> f=2.   U=4  q1 act0
# t2: admit r1: D=10.  r1 -> f=3.  U=10 q0 act0
# t3: idle.                        U=0  q0 act0
_trace(
    "output_len_one",
    dict(arrival=[0, 0], prompt_len=[3, 9], output_len=[1, 1],
         M=10, budgets=[0, 1, 1], eviction="lifo", horizon=4),
    dict(finish=[2, 3], usage=[0, 4, 10, 0], queue_len=[2, 1, 0, 0],
         active=[0, 0, 0, 0]),
)

# T14 Minimum latency equals o: without contention f_i = a_i + o_i.
# M=50, B=5, horizon 9.  r0=(0,3,4), r1=(2,1,1), r2=(2,5,3), r3=(5,2,2).
# t0: D=r0 4.                       U=4  act1
# t1: D=5.                          U=5  act1
# t2: D=r0 6 + r1 2 + r2 6=14.  r1 -> f=3.            U=14 act2
# t3: D=r0 7 + r2 7=14.  r0 -> f=4.                   U=14 act1
# t4: D=r2 8.  r2 -> f=5.                             U=8  act0
# t5: D=r3 3.  t6: D=4, r3 -> f=7.  t7, t8 idle.
_trace(
    "min_latency_is_o",
    dict(arrival=[0, 2, 2, 5], prompt_len=[3, 1, 5, 2], output_len=[4, 1, 3, 2],
         M=50, budgets=5, eviction="lifo", horizon=9),
    dict(finish=[4, 3, 5, 7], usage=[4, 5, 14, 14, 8, 3, 4, 0, 0],
         queue_len=[0] * 9, active=[1, 1, 2, 1, 0, 1, 0, 0, 0]),
)

# T15 Short horizon: unfinished -> -1; rejection happens on arrival, so a
# too-long request arriving at/after the horizon is not marked rejected.
# M=10, B=1, horizon 3.  r0=(0,2,5), r1=(1,2,1), r2=(2,8,3) (11>M),
# r3=(3,8,3) (11>M, arrives at t=3 = horizon), r4=(2,5,2).
# t0: admit r0: D=3.  j0=1.                          U=3 q0 act1
# t1: admit r1: D=4+3=7.  j0=2; r1 -> f=2.           U=7 q0 act1
# t2: r2 rejected, r4 queued; admit r4: D=r0 5 + r4 6=11>10 -> evict r4
#     (j=0) -> 5.  j0=3.                             U=5 q1 act1 [ovf 1]
_trace(
    "short_horizon",
    dict(arrival=[0, 1, 2, 3, 2], prompt_len=[2, 2, 8, 8, 5], output_len=[5, 1, 3, 3, 2],
         M=10, budgets=1, eviction="lifo", horizon=3),
    dict(finish=[-1, 2, -1, -1, -1], rejected=[False, False, True, False, False],
         evictions=[0, 0, 0, 0, 1], wasted_tokens=0, overflow_events=1,
         usage=[3, 7, 5], queue_len=[0, 0, 1], active=[1, 1, 1]),
)


_HAND_CASES = [
    pytest.param(impl, trace, id=f"{impl}-{trace['id']}")
    for impl in IMPLEMENTATIONS
    for trace in HAND_TRACES
]


@pytest.mark.parametrize("impl, trace", _HAND_CASES)
def test_hand_trace(impl, trace):
    got = _run(impl, trace)
    _assert_result_equals(got, _complete_expected(trace), label=f"{impl}-{trace['id']}")


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_hand_trace_latency_floor(impl):
    """T14 again: every latency equals o exactly when nothing contends."""
    trace = next(t for t in HAND_TRACES if t["id"] == "min_latency_is_o")
    got = _run(impl, trace)
    kw = trace["kwargs"]
    latency = np.asarray(got["finish"]) - np.asarray(kw["arrival"])
    assert latency.tolist() == list(kw["output_len"])


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_paper_class_example_peak(impl):
    """Spec: classes (10,20),(10,40),(10,60), b=(4,4,4): w=(410,1220,2430) and
    the saturated peak is exactly sum b_k w_k = 16240 <= M=16492, with no
    overflow.  320 requests per class wait at t=0, so every class admits 4 per
    slot for the whole horizon of 80 slots (class 2 reaches steady state at
    t=59)."""
    per_class = 320
    lo = [(10, 20), (10, 40), (10, 60)]
    arrival, prompt, output, classes = [], [], [], []
    for k, (l, o) in enumerate(lo):
        arrival += [0] * per_class
        prompt += [l] * per_class
        output += [o] * per_class
        classes += [k] * per_class
    got = IMPLEMENTATIONS[impl](arrival, prompt, output, M=16492, budgets=[4, 4, 4],
                                eviction="lifo", horizon=80, classes=classes)
    usage = np.asarray(got["usage"])
    assert int(usage.max()) == 16240
    assert int(got["overflow_events"]) == 0
    assert int(np.asarray(got["evictions"]).sum()) == 0
    # Steady state: from t=59 on every class holds 4 requests of every age.
    assert set(usage[59:].tolist()) == {16240}


# ---------------------------------------------------------------------------
# b. Property test: engine == reference on random small traces.
# ---------------------------------------------------------------------------

@st.composite
def traces(draw, short_horizon=False):
    n = draw(st.integers(0, 30))
    arrival = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    prompt_len = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    output_len = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
    M = draw(st.integers(8, 60))
    eviction = draw(st.sampled_from(["lifo", "all"]))
    kind = draw(st.sampled_from(["int", "list", "classes"]))
    classes = None
    if kind == "int":
        budgets = draw(st.integers(0, 5))
    elif kind == "list":
        budgets = draw(st.lists(st.integers(0, 5), min_size=0, max_size=60))
    else:
        m = draw(st.integers(1, 3))
        budgets = draw(st.lists(st.integers(0, 3), min_size=m, max_size=m))
        classes = draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n))
    horizon = draw(st.integers(0, 25)) if short_horizon else 200
    kwargs = dict(M=M, budgets=budgets, eviction=eviction, horizon=horizon)
    if classes is not None:
        kwargs["classes"] = classes
    return arrival, prompt_len, output_len, kwargs


def _assert_engine_agrees(arrival, prompt_len, output_len, kwargs):
    expected = reference_model.simulate(arrival, prompt_len, output_len, **kwargs)
    got = _run_engine(list(arrival), list(prompt_len), list(output_len), **kwargs)
    _assert_result_equals(got, expected, label=f"engine vs model, {kwargs}")


@settings(max_examples=200, deadline=None)
@given(traces())
def test_property_engine_agrees_long_horizon(case):
    arrival, prompt_len, output_len, kwargs = case
    _assert_engine_agrees(arrival, prompt_len, output_len, kwargs)


@settings(max_examples=200, deadline=None)
@given(traces(short_horizon=True))
def test_property_engine_agrees_short_horizon(case):
    arrival, prompt_len, output_len, kwargs = case
    _assert_engine_agrees(arrival, prompt_len, output_len, kwargs)


@settings(max_examples=200, deadline=None)
@given(traces())
def test_property_engine_agrees_until_drained(case):
    """horizon=None under lifo with budgets that are positive forever, where
    the run provably drains (the oldest active request is never evicted)."""
    arrival, prompt_len, output_len, kwargs = case
    kwargs = dict(kwargs, eviction="lifo", horizon=None)
    if "classes" in kwargs:
        kwargs["budgets"] = [max(1, b) for b in kwargs["budgets"]]
    else:
        kwargs["budgets"] = max(1, kwargs["budgets"]) if isinstance(kwargs["budgets"], int) else 1
    _assert_engine_agrees(arrival, prompt_len, output_len, kwargs)


# ---------------------------------------------------------------------------
# c. Invariants of the reference model.
# ---------------------------------------------------------------------------

def _check_invariants(arrival, prompt_len, output_len, kwargs, res):
    a = np.asarray(arrival, dtype=np.int64)
    l = np.asarray(prompt_len, dtype=np.int64)
    o = np.asarray(output_len, dtype=np.int64)
    M = kwargs["M"]
    finish, rejected = res["finish"], res["rejected"]
    usage, q, act = res["usage"], res["queue_len"], res["active"]
    T = len(usage)
    if kwargs["horizon"] is not None:
        assert T == kwargs["horizon"]
    assert len(q) == len(act) == T
    assert (usage >= 0).all() and (usage <= M).all()
    done = finish >= 0
    assert (finish[done] >= a[done] + o[done]).all()          # latency >= o
    assert (finish[done] <= T).all()
    assert not (done & rejected).any()
    assert (l[rejected] + o[rejected] > M).all()
    assert (a[rejected] < T).all()
    assert (res["evictions"][rejected] == 0).all()
    assert res["overflow_events"] <= int(res["evictions"].sum())
    assert (res["overflow_events"] == 0) == (int(res["evictions"].sum()) == 0)
    # Conservation at the end of each slot: every request that has arrived is
    # rejected, waiting, active, or finished.
    for t in range(T):
        arrived = int((a <= t).sum())
        rej = int((rejected & (a <= t)).sum())
        fin = int(((finish >= 0) & (finish <= t + 1)).sum())
        assert arrived == rej + fin + int(q[t]) + int(act[t])
    if kwargs["horizon"] is None:
        # drained: everything that is not rejected finished
        assert (done | rejected).all()


@settings(max_examples=200, deadline=None)
@given(traces(), st.booleans())
def test_ref_invariants(case, short):
    arrival, prompt_len, output_len, kwargs = case
    if short:
        kwargs = dict(kwargs, horizon=min(kwargs["horizon"], 12))
    res = reference_model.simulate(arrival, prompt_len, output_len, **kwargs)
    _check_invariants(arrival, prompt_len, output_len, kwargs, res)


@settings(max_examples=100, deadline=None)
@given(traces())
def test_ref_invariants_drained(case):
    arrival, prompt_len, output_len, kwargs = case
    kwargs = dict(kwargs, eviction="lifo", horizon=None,
                  budgets=([max(1, b) for b in kwargs["budgets"]] if "classes" in kwargs
                           else max(1, kwargs["budgets"]) if isinstance(kwargs["budgets"], int)
                           else 1))
    res = reference_model.simulate(arrival, prompt_len, output_len, **kwargs)
    _check_invariants(arrival, prompt_len, output_len, kwargs, res)
    n = len(arrival)
    if n:
        assert len(res["usage"]) >= max(arrival) + 1
        assert len(res["usage"]) == max([max(arrival) + 1] + res["finish"].tolist())
    else:
        assert len(res["usage"]) == 0


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_ref_class_budget_bound(data):
    """Theorem 1 arithmetic: with class lengths (l_k, o_k) and budgets b_k,
    usage never exceeds sum_k b_k w_k, w_k = l_k o_k + (o_k + o_k^2)/2, so if
    M is at least that there is never an overflow."""
    m = data.draw(st.integers(1, 3))
    lo = [(data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8))) for _ in range(m)]
    b = data.draw(st.lists(st.integers(0, 3), min_size=m, max_size=m))
    n = data.draw(st.integers(0, 40))
    cls = data.draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n))
    arrival = data.draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
    bound = sum(bk * (l * o + (o + o * o) // 2) for bk, (l, o) in zip(b, lo))
    M = max(bound, max(l + o for l, o in lo))
    res = reference_model.simulate(
        arrival, [lo[c][0] for c in cls], [lo[c][1] for c in cls],
        M=M, budgets=b, eviction="lifo", horizon=60, classes=cls)
    assert int(res["usage"].max(initial=0)) <= bound
    assert res["overflow_events"] == 0


def test_ref_rejects_bad_arguments():
    sim = reference_model.simulate
    with pytest.raises(ValueError):
        sim([0], [1], [1], M=10, budgets=1, eviction="fifo")
    with pytest.raises(ValueError):
        sim([0], [0], [1], M=10, budgets=1)
    with pytest.raises(ValueError):
        sim([0], [1], [1], M=10, budgets=[1], classes=[1])
    with pytest.raises(RuntimeError):  # B=0 forever never drains
        sim([0], [1], [1], M=10, budgets=0)
    with pytest.raises(RuntimeError):  # 'all' livelock: two that never fit together
        sim([0, 0], [5, 5], [5, 5], M=10, budgets=2, eviction="all")
    empty = sim([], [], [], M=10, budgets=1)
    assert len(empty["usage"]) == 0 and len(empty["finish"]) == 0
