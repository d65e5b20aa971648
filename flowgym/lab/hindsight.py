"""The hindsight optimum of a finite trace: integer programs solved with SciPy's HiGHS.

Given every request's arrival ``a_i``, prompt length ``l_i`` and output length
``o_i`` in advance, and the KV budget ``M``, the best offline schedule is an
integer program (Jaillet et al. 2025; Dong & Cao, Section 4.1 and Appendix B)
over start slots. In hindsight nothing is ever evicted, so a schedule is one
start slot ``s_i >= a_i`` per request; the request then holds
``l_i + (t - s_i + 1)`` tokens during slot ``t`` for ``t = s_i .. s_i + o_i - 1``
(the spec's ``U_t`` counts the token generated in slot ``t``) and finishes at
``f_i = s_i + o_i`` with latency ``f_i - a_i``.

The program (time-indexed, one binary per request and start slot)::

    x[i, s] in {0, 1}                   request i starts at slot s, a_i <= s <= S - o_i
    sum_s x[i, s] = 1                   one start per request (<= 1 for the throughput objectives)
    sum_{i, s <= t < s + o_i} (l_i + t - s + 1) x[i, s] <= M     every slot t < S

Objectives (``objective=``):

* ``"total_latency"``: minimise ``sum_i (f_i - a_i)`` (equivalently the average latency).
* ``"max_latency"``: minimise ``max_i (f_i - a_i)`` (the tail; the paper's *hindsight1*).
  Solved by bisection on a deadline ``Z`` (each probe is the feasibility
  program with ``s <= a_i + Z - o_i``); then, with ``refine=True``, the total
  latency is minimised among schedules meeting the optimal ``Z``.
* ``"completed"``: maximise the number of requests finishing by the horizon ``T``.
* ``"tokens"``: maximise the output tokens of the requests finishing by ``T``.

Requests with the same ``(a, l, o)`` are interchangeable, so the program uses
one integer variable per *type* and start slot (the number of that type's
requests started there): the same optimum without the symmetric copies.

Valid inequalities (``cuts=True``): two started requests *conflict* when at
the last slot of the one that finishes first, its peak ``l + o`` plus the
other's tokens exceed ``M``. For a slot ``t`` and a threshold ``theta``, every
pair of (request, start) choices active at ``t`` with ``c >= theta`` tokens held
at ``t`` and ``p + (e - t) > M - theta`` (``p = l + o`` the peak, ``e`` the last
slot) conflicts, so at most one of them is used: a clique cut. They are
separated from the LP relaxation in a few rounds before branching and remove
much of the weakness of the time-indexed LP (which may split a request into
fractions that pack like fluid). Then reduced-cost fixing against the
best heuristic schedule removes start slots that cannot improve on it.

The horizon ``S``: for ``total_latency`` it comes from the best of a few
memory-check heuristic schedules (MC-SF, FCFS, longest first; the incumbent):
``S = makespan + slack`` (``slack`` defaults to ``max o_i``), capped per request
by a proof: any schedule better than one with total waiting ``W`` keeps every
request's wait below ``W``, so request ``i`` finishes by ``a_i + o_i + W``.
When that proof bound fits inside ``S`` for every request,
:attr:`HindsightResult.horizon_exact` is ``True`` and the optimum is the optimum
over *all* schedules; otherwise it is the optimum among schedules finishing by
``S``, and the result says so. ``max_latency`` needs no horizon (the
incumbent's maximum latency bounds every request's finish), and the throughput
objectives are defined by their horizon ``T``.

Honesty about the solver: a solve stopped by the time limit is never called
optimal. :attr:`HindsightResult.status` is ``"optimal"``,
``"time_limit (feasible, gap X%)"``, ``"time_limit (no feasible schedule found)"``
or ``"infeasible"``, with the proven :attr:`~HindsightResult.bound` and the
relative :attr:`~HindsightResult.gap`. The objectives are integers, so a bound is
rounded to the next integer in the right direction.

The schedule replays in the simulator: :func:`replay_schedule` (also
:meth:`HindsightResult.replay`) runs :func:`flowgym.replay` with the queue
order :class:`~flowgym.sim.rules.PlannedOrder` and budgets ``B_t`` = the number of
requests planned at ``t``, and checks that every request finishes at
``s_i + o_i``, that nothing is evicted and that ``U_t <= M``: the program and the
simulator mean the same thing.

Needs SciPy (``pip install -e '.[solve]' in the flowgym checkout``); HiGHS ships with it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowgym.sim._checks import int_array, is_finite_real, is_real

__all__ = [
    "OBJECTIVES",
    "HindsightResult",
    "ReplayMismatch",
    "solve_hindsight",
    "heuristic_schedule",
    "schedule_usage",
    "replay_schedule",
    "run_agent_on_trace",
    "compare_to_hindsight",
    "format_comparison",
]

_I64 = np.int64

#: Objectives of :func:`solve_hindsight`.
OBJECTIVES = ("total_latency", "max_latency", "completed", "tokens")

_MAXIMISE = ("completed", "tokens")
#: The largest ``M`` (tokens), latest possible finish (last arrival + every output + the longest prompt, a slot)
#: and horizon ``T`` (slots) of an instance: the time-indexed program and its replay hold arrays that long.
MAX_SPAN = 10**7


class ReplayMismatch(AssertionError):
    """Replaying a schedule in the simulator did not give the schedule's finish slots (or overflowed)."""


# --------------------------------------------------------------------------- input


def _check_instance(arrival: Any, prompt_len: Any, output_len: Any, M: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
        raise ValueError(f"M (the KV-cache budget in tokens) must be a positive integer, got {M!r}")
    a = int_array("arrival", arrival, None, 0)
    if a.size == 0:
        raise ValueError("the trace is empty: give at least one request")
    l = int_array("prompt_len", prompt_len, a.size, 1)
    o = int_array("output_len", output_len, a.size, 1)
    too_big = np.flatnonzero(l + o > M)
    if too_big.size:
        i = int(too_big[0])
        more = f" (and {too_big.size - 1} more)" if too_big.size > 1 else ""
        raise ValueError(
            f"request {i} (prompt_len {int(l[i])} + output_len {int(o[i])} = {int(l[i] + o[i])} > M = {int(M)}) "
            f"can never complete: at its last slot it holds more than M tokens{more}. "
            "The simulator rejects such requests on arrival; drop them or raise M."
        )
    span = int(a.max()) + int(o.sum()) + int(l.max())
    if M > MAX_SPAN or span > MAX_SPAN:
        raise ValueError(f"the instance is too large for the time-indexed program: M = {int(M)} tokens and the "
                         f"latest possible finish, slot {span}, must each be at most {MAX_SPAN:g} (hindsight solves "
                         "small instances: tens of requests)")
    return a, l, o, int(M)


def _check_solve_args(objectives: Sequence[str], horizon: Any, time_limit: Any) -> None:
    """``ValueError`` naming the bad argument (before any solve or worker runs)."""
    if isinstance(objectives, str) or not all(isinstance(k, str) and k in OBJECTIVES for k in objectives):
        raise ValueError(f"objectives must be a list of {OBJECTIVES}, got {objectives!r}")
    if not is_real(time_limit) or not 0 < time_limit < math.inf:
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if horizon is not None and (not is_real(horizon) or not 1 <= horizon <= MAX_SPAN or int(horizon) != horizon):
        raise ValueError(f"horizon T must be a positive integer up to {MAX_SPAN:g} slots, got {horizon!r}")


# --------------------------------------------------------------------------- schedules


def schedule_usage(prompt_len: Any, output_len: Any, start: Any, slots: int | None = None) -> np.ndarray:
    """KV tokens held in every slot by a no-eviction schedule (``start[i] < 0``: not started).

    A request started at ``s`` holds ``l + (t - s + 1)`` tokens in slot ``t``,
    ``s <= t < s + o`` (the spec's ``U_t``). ``slots`` defaults to the makespan. ``ValueError`` names an
    array of another length than ``prompt_len``, a negative length or a fractional entry.
    """
    l = int_array("prompt_len", prompt_len, None, 0)
    o = int_array("output_len", output_len, l.size, 1)
    s = int_array("start", start, l.size, -(2**62))
    if slots is not None and (not is_finite_real(slots) or int(slots) != slots or slots < 0):
        raise ValueError(f"slots must be a non-negative whole number, got {slots!r}")
    on = s >= 0
    end = int((s[on] + o[on]).max(initial=0))
    T = end if slots is None else int(slots)
    # piecewise-linear profile by difference arrays: count and start offsets
    cnt = np.zeros(max(T, end) + 2, _I64)
    base = np.zeros(max(T, end) + 2, _I64)
    np.add.at(cnt, s[on], 1)
    np.add.at(cnt, s[on] + o[on], -1)
    # holding l + 1 - s + t: the part independent of t is (l + 1 - s)
    np.add.at(base, s[on], l[on] + 1 - s[on])
    np.add.at(base, s[on] + o[on], -(l[on] + 1 - s[on]))
    t = np.arange(cnt.size)
    u = np.cumsum(base) + t * np.cumsum(cnt)
    return u[:T]


def heuristic_schedule(
    arrival: Any,
    prompt_len: Any,
    output_len: Any,
    M: int,
    *,
    order: str = "sf",
    backfill: bool = False,
    deadline: int | None = None,
) -> np.ndarray:
    """Start slots of a memory-check schedule (never overflows): MC-SF, MC, or longest first.

    Every slot, the waiting requests are scanned in ``order`` (``"sf"``:
    shortest output first, ties by arrival then input order, the order of
    MC-SF; ``"fcfs"``: by arrival, MC; ``"lf"``: longest output first) and one is
    started if the projected usage stays ``<= M`` at every future slot. The scan
    stops at the first request that does not fit (as MC and MC-SF do), or with
    ``backfill=True`` skips it and tries the next. With ``deadline`` a request
    that could not finish by it is never started (``-1`` in the result).

    ``order="sf"`` reproduces the ``mc-sf`` agent of :mod:`agents` and
    ``order="fcfs"`` the ``mc`` agent with known lengths.
    """
    a, l, o, M = _check_instance(arrival, prompt_len, output_len, M)
    n = a.size
    ids = np.arange(n)
    if order == "sf":
        prio = np.lexsort((ids, a, o))
    elif order == "fcfs":
        prio = np.lexsort((ids, a))
    elif order == "lf":
        prio = np.lexsort((ids, a, -o))
    else:
        raise ValueError(f"order must be 'sf', 'fcfs' or 'lf', got {order!r}")
    cap = int(a.max() + o.sum() + 2)
    prof = np.zeros(cap + int(o.max()) + 1, _I64)
    start = np.full(n, -1, _I64)
    rank = np.empty(n, _I64)
    rank[prio] = ids
    by_arrival = np.argsort(a, kind="stable")
    nxt = 0  # next request (by arrival) not yet in the queue
    queue: list[int] = []  # ranks of waiting requests, kept sorted
    t = 0
    left = n
    ramp = np.arange(1, int(o.max()) + 1, dtype=_I64)
    while left:
        if deadline is not None and t >= deadline:
            break
        while nxt < n and a[by_arrival[nxt]] <= t:
            queue.append(int(rank[by_arrival[nxt]]))
            nxt += 1
        if not queue:
            t = int(a[by_arrival[nxt]])
            continue
        queue.sort()
        kept = []
        stopped = False
        for r in queue:
            i = int(prio[r])
            if stopped:
                kept.append(r)
                continue
            oi = int(o[i])
            if deadline is not None and t + oi > deadline:
                kept.append(r)  # can never finish in time: skipped
                continue
            need = l[i] + ramp[:oi]
            if np.all(prof[t : t + oi] + need <= M):
                prof[t : t + oi] += need
                start[i] = t
                left -= 1
            else:
                kept.append(r)
                if not backfill:
                    stopped = True
        queue = kept
        t += 1
    return start


def replay_schedule(
    arrival: Any,
    prompt_len: Any,
    output_len: Any,
    start: Any,
    M: int,
    *,
    horizon: int | None = None,
    check: bool = True,
) -> dict[str, Any]:
    """Replay a no-eviction schedule in the simulator and check it.

    Runs :func:`flowgym.replay` with the queue order
    :class:`~flowgym.sim.rules.PlannedOrder` (admission by planned start slot) and
    budgets ``B_t`` = the number of requests planned at ``t``, so the engine
    activates exactly the planned requests at the planned slots. Requests with
    ``start < 0`` are never admitted (they wait until ``horizon``).

    Args:
        arrival, prompt_len, output_len: the trace (input order, any order of arrivals).
        start: planned start slot per request (input order), ``-1`` for none.
        M: KV budget.
        horizon: slots to simulate (default: the makespan, or the last
            arrival + 1 if later).
        check: raise :class:`ReplayMismatch` unless every scheduled request
            finishes at ``start + o``, every unscheduled one is unfinished, no
            request is evicted and the usage never exceeds ``M``.

    Returns:
        :func:`flowgym.replay`'s dict (per-request arrays in input order, per-slot series).
    """
    from flowgym.sim.engine import replay
    from flowgym.sim.rules import PlannedOrder

    a, l, o, M = _check_instance(arrival, prompt_len, output_len, M)
    s = int_array("start", start, a.size, -(2**62))
    on = s >= 0
    early = np.flatnonzero(on & (s < a))
    if early.size:
        i = int(early[0])
        raise ValueError(f"request {i} is planned at slot {int(s[i])}, before its arrival at {int(a[i])}")
    # engine ids are positions in the stable sort by arrival (Trace's order)
    row = np.argsort(a, kind="stable")
    plan = s[row]
    end = int((s[on] + o[on]).max(initial=0))
    budgets = np.bincount(s[on], minlength=max(end, 1)).tolist() if on.any() else [0]
    if horizon is None:  # a bounded run, so an overflowing schedule cannot requeue forever
        horizon = max(end, int(a.max()) + 1)
    out = replay(a, l, o, M=M, budgets=budgets, queue_order=PlannedOrder(plan), horizon=horizon)
    if check:
        fin = out["finish"]
        T = int(out["slots"])
        want = np.where(on, s + o, -1)
        want = np.where(want > T, -1, want)  # beyond a given horizon: unfinished
        bad = np.flatnonzero(fin != want)
        if bad.size:
            i = int(bad[0])
            raise ReplayMismatch(
                f"replay disagrees with the schedule for {bad.size} request(s); first: request {i} "
                f"(a={int(a[i])}, l={int(l[i])}, o={int(o[i])}, planned start {int(s[i])}) "
                f"finished at {int(fin[i])}, expected {int(want[i])}"
            )
        if int(out["evictions"].sum()) or int(out["overflow_events"]):
            raise ReplayMismatch(f"replay evicted {int(out['evictions'].sum())} request(s): the schedule overflows M = {M}")
        usage = np.asarray(out["usage"])
        if usage.size and int(usage.max()) > M:
            raise ReplayMismatch(f"replay usage {int(usage.max())} exceeds M = {M}")
        ref = schedule_usage(l, o, np.where(on, s, -1), usage.size)
        if not np.array_equal(ref, usage):
            t = int(np.flatnonzero(ref != usage)[0])
            raise ReplayMismatch(f"replay usage at slot {t} is {int(usage[t])}, the schedule's is {int(ref[t])}")
    return out


# --------------------------------------------------------------------------- result


@dataclass
class HindsightResult:
    """A hindsight schedule and what the solver proved about it.

    ``value`` is the objective of the returned schedule (total latency, maximum
    latency, completed requests or completed output tokens); ``bound`` is the
    best proven bound on the optimum (a lower bound when minimising, an upper
    bound when maximising) among schedules finishing by ``horizon``; ``gap`` is
    ``|value - bound| / max(|value|, 1)``. ``optimal`` is ``True`` only when the
    gap is proven zero. When ``horizon_exact`` is ``False`` (``total_latency``
    only) the optimum is the optimum among schedules finishing by ``horizon``.
    """

    objective: str  #: one of :data:`OBJECTIVES`
    status: str  #: ``"optimal"``, ``"time_limit (feasible, gap X%)"``, ``"time_limit (no feasible schedule found)"``, ``"infeasible"``
    optimal: bool  #: proven optimal (never for a time-limited solve with a gap)
    value: float  #: objective of the returned schedule (``nan`` if none)
    bound: float  #: proven bound on the optimum (lower when minimising, upper when maximising)
    gap: float  #: ``|value - bound| / max(|value|, 1)``; 0 when optimal
    start: np.ndarray  #: start slot per request, input order (``-1``: not started)
    finish: np.ndarray  #: ``start + o`` (``-1``: not started)
    horizon: int  #: ``S``: the program's schedules finish by slot ``S`` (``T`` for the throughput objectives)
    horizon_exact: bool  #: ``True`` when restricting to ``horizon`` provably loses nothing
    solve_seconds: float  #: wall time of the whole solve (heuristics, cuts, HiGHS)
    M: int
    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    #: the heuristic whose schedule was the starting incumbent, and its objective value
    heuristic: str = ""
    heuristic_value: float = float("nan")
    #: where the returned schedule comes from: ``"milp"`` or the heuristic's name
    source: str = ""
    #: for ``max_latency`` with ``refine``: status of the second stage (minimum total latency at the optimal maximum)
    refine_status: str | None = None
    #: size of the last integer program solved (after reduced-cost fixing) and cuts added
    n_variables: int = 0
    n_constraints: int = 0
    n_cuts: int = 0
    lp_bound: float = float("nan")  #: bound of the LP relaxation with cuts (before branching)
    solver: str = "HiGHS (scipy.optimize.milp)"
    messages: list[str] = field(default_factory=list)  #: solver messages, in order

    # ---------------------------------------------------------------- derived
    @property
    def scheduled(self) -> np.ndarray:
        """Mask of the requests the schedule starts."""
        return self.start >= 0

    @property
    def latency(self) -> np.ndarray:
        """``f_i - a_i`` per request (``nan`` if not started), input order."""
        lat = (self.finish - self.arrival).astype(np.float64)
        lat[~self.scheduled] = np.nan
        return lat

    @property
    def total_latency(self) -> float:
        """Sum of latencies of the started requests."""
        return float(np.nansum(self.latency)) if self.scheduled.any() else float("nan")

    @property
    def avg_latency(self) -> float:
        return float(np.nanmean(self.latency)) if self.scheduled.any() else float("nan")

    @property
    def max_latency(self) -> float:
        return float(np.nanmax(self.latency)) if self.scheduled.any() else float("nan")

    @property
    def makespan(self) -> int:
        return int(self.finish.max(initial=0))

    def completed(self, T: int | None = None) -> int:
        """Requests finishing by ``T`` (default: every started request)."""
        on = self.scheduled
        return int(on.sum()) if T is None else int((on & (self.finish <= T)).sum())

    def usage(self) -> np.ndarray:
        """KV tokens held per slot (from the schedule itself)."""
        return schedule_usage(self.prompt_len, self.output_len, self.start)

    def replay(self, check: bool = True) -> dict[str, Any]:
        """Replay the schedule in the simulator (see :func:`replay_schedule`)."""
        horizon = None if self.scheduled.all() else max(self.horizon, self.makespan, int(self.arrival.max()) + 1)
        return replay_schedule(self.arrival, self.prompt_len, self.output_len, self.start, self.M, horizon=horizon, check=check)

    def metrics(self, T: int | None = None) -> dict[str, Any]:
        """The simulator's metrics (:func:`flowgym.sim.metrics.compute_metrics`) of the replayed schedule."""
        from flowgym.sim.metrics import metrics_at

        out = self.replay()
        log = {
            "arrival": out["arrival"],
            "output_len": out["output_len"],
            "finish": out["finish"],
            "evictions": out["evictions"],
            "rejected": out["rejected"],
        }
        series = {k: np.asarray(out[k]) for k in ("usage", "queue_len", "active", "completed", "evicted", "admitted")}
        series["wasted_tokens"] = np.zeros_like(series["usage"])
        T = series["usage"].size if T is None else int(T)
        if T > series["usage"].size:
            pad = T - series["usage"].size
            series = {k: np.concatenate([v, np.zeros(pad, v.dtype)]) for k, v in series.items()}
        return metrics_at(log, series, self.M, T)

    def summary(self) -> str:
        """One line: objective, status, value, bound, gap, horizon, time."""
        scope = "all schedules" if self.horizon_exact else f"schedules finishing by slot {self.horizon}"
        return (
            f"{self.objective}: {self.status}; value {self.value:g}, bound {self.bound:g}, gap {100 * self.gap:.2f}% "
            f"(over {scope}); {self.solve_seconds:.1f} s, {self.n_variables} variables, {self.n_cuts} cuts; "
            f"heuristic {self.heuristic} {self.heuristic_value:g}"
        )


# --------------------------------------------------------------------------- the program


@contextlib.contextmanager
def _quiet_fd(enabled: bool) -> Iterator[None]:
    """Silence C-level writes to stdout (HiGHS prints a stray debug line in some builds)."""
    if not enabled:
        yield
        return
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        fd = 1
    try:
        sys.stdout.flush()
        saved = os.dup(fd)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


class _Types:
    """Requests grouped by ``(a, l, o)``: interchangeable copies share one integer variable per start."""

    def __init__(self, a: np.ndarray, l: np.ndarray, o: np.ndarray) -> None:
        keys = np.stack([a, l, o], axis=1)
        uniq, inv, cnt = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
        self.a, self.l, self.o = uniq[:, 0], uniq[:, 1], uniq[:, 2]
        self.n = cnt.astype(_I64)
        self.inv = inv.ravel()
        self.K = uniq.shape[0]
        # members of each type in input order
        order = np.argsort(self.inv, kind="stable")
        self.members = np.split(order, np.cumsum(self.n)[:-1])


@dataclass
class _Program:
    """One program: variables ``(type k, start s)`` with ``lo[k] <= s <= hi[k]``."""

    vk: np.ndarray
    vs: np.ndarray
    A: Any  # all <= rows (usage rows, then cuts), csr
    rhs: np.ndarray
    n_use_rows: int
    # nonzeros of the usage rows, for cut separation
    nz_var: np.ndarray
    nz_t: np.ndarray
    nz_c: np.ndarray
    nz_q: np.ndarray


def _build(types: _Types, lo: np.ndarray, hi: np.ndarray, M: int) -> _Program:
    from scipy import sparse

    width = np.maximum(hi - lo + 1, 0)
    V = int(width.sum())
    vk = np.repeat(np.arange(types.K), width)
    off = np.arange(V) - np.repeat(np.cumsum(width) - width, width)
    vs = lo[vk] + off
    ov = types.o[vk]
    rep = ov
    nz_var = np.repeat(np.arange(V), rep)
    h = np.arange(nz_var.size) - np.repeat(np.cumsum(rep) - rep, rep)
    nz_t = vs[nz_var] + h
    lv = types.l[vk][nz_var]
    nz_c = lv + h + 1  # tokens held at slot t
    # peak + slots left after t: the cut key (see module docstring)
    nz_q = lv + ov[nz_var] + (vs[nz_var] + ov[nz_var] - 1 - nz_t)
    S = int(nz_t.max(initial=-1)) + 1
    A = sparse.csr_matrix((nz_c.astype(np.float64), (nz_t, nz_var)), shape=(S, V))
    # rows that can never bind (even with every variable at its upper bound) are dropped
    ub = types.n[vk].astype(np.float64)
    keep = np.flatnonzero(A @ ub > M)
    A = A[keep]
    return _Program(vk, vs, A, np.full(keep.size, float(M)), keep.size, nz_var, nz_t, nz_c, nz_q)


def _separate(prog: _Program, x: np.ndarray, M: int, max_cuts: int) -> Any:
    """Most violated clique cut per slot (at most ``max_cuts``), as a csr matrix (rhs 1), or None.

    A nonzero (variable, slot ``t``) belongs to the clique ``(t, theta)`` for
    ``max(M - q + 1, 1) <= theta <= c``; the LP weight of each clique is a sum
    of intervals in ``theta``, found per slot by sorting the interval ends.
    """
    from scipy import sparse

    xv = x[prog.nz_var]
    lo = np.maximum(M - prog.nz_q + 1, 1)
    hi = prog.nz_c
    ok = (lo <= hi) & (xv > 1e-7)
    if not ok.any():
        return None
    t, w = prog.nz_t[ok], xv[ok]
    span = M + 2
    key = np.concatenate([t * span + lo[ok], t * span + hi[ok] + 1])
    wt = np.concatenate([w, -w])
    uk, inv = np.unique(key, return_inverse=True)
    dw = np.bincount(inv.ravel(), weights=wt)
    ut = uk // span
    cum = np.cumsum(dw)
    first = np.flatnonzero(np.r_[True, ut[1:] != ut[:-1]])
    base = np.r_[0.0, cum][first]  # cumulative weight before each slot's group
    grp = np.cumsum(np.r_[True, ut[1:] != ut[:-1]]) - 1
    val = cum - base[grp]
    best = np.full(first.size, -np.inf)
    np.maximum.at(best, grp, val)
    arg = np.full(first.size, -1, _I64)
    hit = val >= best[grp] - 1e-12
    arg[grp[hit][::-1]] = np.flatnonzero(hit)[::-1]  # first position reaching the max
    viol = best - 1.0
    sel = np.flatnonzero(viol > 1e-4)
    if sel.size == 0:
        return None
    if sel.size > max_cuts:
        sel = sel[np.argsort(-viol[sel])[:max_cuts]]
    slots = ut[first[sel]]
    theta_of = uk[arg[sel]] % span
    S = int(prog.nz_t.max()) + 1
    theta = np.full(S, -1, _I64)
    theta[slots] = theta_of
    row_id = np.full(S, -1, _I64)
    row_id[slots] = np.arange(sel.size)
    tt = theta[prog.nz_t]
    mem = (tt > 0) & (prog.nz_c >= tt) & (prog.nz_q > M - tt)
    r = row_id[prog.nz_t[mem]]
    cols = prog.nz_var[mem]
    C = sparse.csr_matrix((np.ones(r.size), (r, cols)), shape=(sel.size, prog.vk.size))
    C.sum_duplicates()
    C.data[:] = 1.0
    return C


@dataclass
class _Outcome:
    kind: str  # "optimal", "better" (time limit, found better), "none" (time limit, nothing better), "proved_incumbent", "infeasible"
    y: np.ndarray | None  # counts per variable of the program given
    value: float
    bound: float  # proven (raw) bound for the minimisation, -inf if none
    lp_bound: float
    message: str
    n_var: int
    n_con: int
    n_cuts: int


def _solve_min(
    types: _Types,
    lo: np.ndarray,
    hi: np.ndarray,
    M: int,
    cost: np.ndarray | str,
    count: str,
    incumbent: float | None,
    deadline: float,
    *,
    cuts: bool,
    quiet: bool = True,
    verbose: bool = False,
) -> tuple[_Outcome, _Program]:
    """Minimise ``cost @ y`` over the program; ``count`` is ``"eq"`` (all started) or ``"le"``.

    ``cost`` is ``"latency"``, ``"-count"``, ``"-tokens"`` or ``"zero"``. With an
    ``incumbent`` value only strictly better schedules are searched
    (``objective_bound``; reduced-cost fixing).
    """
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp

    prog = _build(types, lo, hi, M)
    V = prog.vk.size
    if V == 0:
        if count == "le":
            return _Outcome("optimal", np.zeros(0), 0.0, 0.0, 0.0, "empty program", 0, 0, 0), prog
        return _Outcome("infeasible", None, math.nan, math.inf, math.inf, "no start slot fits the horizon", 0, 0, 0), prog
    lat = (prog.vs + types.o[prog.vk] - types.a[prog.vk]).astype(np.float64)
    if isinstance(cost, str):
        c = {
            "latency": lat,
            "-count": -np.ones(V),
            "-tokens": -types.o[prog.vk].astype(np.float64),
            "zero": np.zeros(V),
        }[cost]
        lp_cost = lat if cost == "zero" else c
    else:
        c = lp_cost = cost
    ub = types.n[prog.vk].astype(np.float64)
    A_cnt = sparse.csr_matrix((np.ones(V), (prog.vk, np.arange(V))), shape=(types.K, V))
    need = types.n.astype(np.float64)
    present = np.bincount(prog.vk, minlength=types.K) > 0
    if count == "eq" and not present.all():
        k = int(np.flatnonzero(~present)[0])
        return _Outcome("infeasible", None, math.nan, math.inf, math.inf,
                        f"request type {k} has no start slot in the horizon", V, 0, 0), prog
    cnt_lo = need if count == "eq" else np.zeros(types.K)
    A_ub = prog.A
    b_ub = prog.rhs
    n_cuts = 0
    lp_bound = -math.inf
    red = None
    # ---- cut loop on the LP relaxation (also gives a bound valid for the whole program)
    if cuts or incumbent is not None:
        rounds = 0
        while True:
            if time.perf_counter() > deadline:
                break
            A_lp = sparse.vstack([A_ub] + ([A_cnt] if count == "le" else [])).tocsr()
            b_lp = np.concatenate([b_ub] + ([need] if count == "le" else []))
            r = linprog(
                lp_cost,
                A_ub=A_lp,
                b_ub=b_lp,
                A_eq=A_cnt if count == "eq" else None,
                b_eq=need if count == "eq" else None,
                bounds=np.stack([np.zeros(V), ub], axis=1),
                method="highs",
                options={"time_limit": max(deadline - time.perf_counter(), 0.01)},
            )
            if r.status == 2:
                return _Outcome("infeasible", None, math.nan, math.inf, math.inf,
                                "LP relaxation infeasible" + (" (with cuts)" if n_cuts else ""), V, A_ub.shape[0], n_cuts), prog
            if r.status != 0:
                break
            if cost != "zero":
                lp_bound = max(lp_bound, float(r.fun))
                red = r
            if not cuts or rounds >= 60:
                break
            C = _separate(prog, r.x, M, max_cuts=max(50, prog.n_use_rows))
            if C is None:
                break
            A_ub = sparse.vstack([A_ub, C]).tocsr()
            b_ub = np.concatenate([b_ub, np.ones(C.shape[0])])
            n_cuts += C.shape[0]
            rounds += 1
            if verbose:
                print(f"  cut round {rounds}: LP {r.fun:.2f}, +{C.shape[0]} cuts", file=sys.stderr)
    # ---- reduced-cost fixing against the incumbent (strict improvement needs value <= incumbent - 1)
    cols = np.arange(V)
    if incumbent is not None and red is not None and cost != "zero":
        # an LP solution with y_v >= 1 costs at least LP + reduced cost: fix v to 0 when that
        # cannot reach incumbent - 1 (the objective is integer)
        rc = np.asarray(red.lower.marginals)
        tol = 1e-6 + 1e-7 * max(1.0, abs(incumbent))
        fix = (red.x <= 1e-9) & (float(red.fun) + rc > incumbent - 1 + tol)
        if fix.any():
            cols = np.flatnonzero(~fix)
    if cols.size == 0:
        return _Outcome("proved_incumbent", None, math.nan, incumbent if incumbent is not None else math.inf,
                        lp_bound, "every start slot fixed by reduced costs", 0, 0, n_cuts), prog
    A_fin = A_ub[:, cols]
    cons = [LinearConstraint(A_fin, -np.inf, b_ub)]
    cons.append(LinearConstraint(A_cnt[:, cols], cnt_lo, need))
    opts: dict[str, Any] = {"time_limit": max(deadline - time.perf_counter(), 0.01), "mip_rel_gap": 0.0, "disp": verbose}
    if incumbent is not None:
        opts["objective_bound"] = float(incumbent) - 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "options passed to HiGHS verbatim"
        with _quiet_fd(quiet and not verbose):
            res = milp(c[cols], integrality=np.ones(cols.size), bounds=Bounds(np.zeros(cols.size), ub[cols]),
                       constraints=cons, options=opts)
    n_con = A_fin.shape[0] + types.K
    msg = str(res.message)
    y = None
    if res.x is not None:
        y = np.zeros(V)
        y[cols] = np.round(res.x)
    dual = res.get("mip_dual_bound", None)
    dual = -math.inf if dual is None or not np.isfinite(dual) else float(dual)
    if res.status == 0 and y is not None:
        kind = "optimal"
        bound = float(res.fun)
    elif res.status == 2 or (res.status == 4 and "bound" in msg.lower() and y is None):
        kind = "proved_incumbent" if incumbent is not None else "infeasible"
        bound = float(incumbent) if incumbent is not None else math.inf
    elif y is not None:
        kind = "better"
        bound = max(dual, lp_bound)
    else:
        kind = "none"
        bound = lp_bound
    value = float(c[cols] @ np.round(res.x)) if res.x is not None else math.nan
    return _Outcome(kind, y, value, bound, lp_bound, msg, int(cols.size), n_con, n_cuts), prog


def _starts_from_counts(types: _Types, prog: _Program, y: np.ndarray, n: int) -> np.ndarray:
    """Per-request starts from per-(type, start) counts: copies take the starts in input order."""
    start = np.full(n, -1, _I64)
    used = np.flatnonzero(y > 0.5)
    order = np.lexsort((prog.vs[used], prog.vk[used]))
    used = used[order]
    filled = np.zeros(types.K, _I64)
    for v in used:
        k = int(prog.vk[v])
        m = round(float(y[v]))
        mem = types.members[k]
        start[mem[filled[k] : filled[k] + m]] = prog.vs[v]
        filled[k] += m
    return start


# --------------------------------------------------------------------------- public entry point


def _objective_value(objective: str, a: np.ndarray, o: np.ndarray, start: np.ndarray, T: int | None) -> float:
    on = start >= 0
    if objective == "total_latency":
        return float((start[on] + o[on] - a[on]).sum()) if on.all() else math.nan
    if objective == "max_latency":
        return float((start[on] + o[on] - a[on]).max()) if on.all() else math.nan
    assert T is not None
    done = on & (start + o <= T)
    return float(done.sum()) if objective == "completed" else float(o[done].sum())


def _status(optimal: bool, value: float, gap: float, infeasible: bool = False) -> str:
    if infeasible:
        return "infeasible"
    if optimal:
        return "optimal"
    if not np.isfinite(value):
        return "time_limit (no feasible schedule found)"
    return f"time_limit (feasible, gap {100 * gap:.2f}%)"


def require_scipy() -> None:
    """``ImportError`` naming the extra unless SciPy (the program's solver, HiGHS) is installed: a command checks it
    before any work, rather than fail in a worker cell."""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise ImportError("the hindsight program needs SciPy (its HiGHS solver): pip install -e '.[solve]' in the flowgym checkout") \
            from None


def solve_hindsight(
    arrival: Sequence[int] | np.ndarray,
    prompt_len: Sequence[int] | np.ndarray,
    output_len: Sequence[int] | np.ndarray,
    M: int,
    *,
    objective: str = "total_latency",
    horizon: int | None = None,
    slack: int | None = None,
    time_limit: float = 60.0,
    cuts: bool = True,
    refine: bool = True,
    verbose: bool = False,
) -> HindsightResult:
    """The best offline schedule of a finite trace, by an integer program solved with HiGHS.

    Args:
        arrival, prompt_len, output_len: one entry per request (any order; results
            come back in this order).
        M: KV-cache budget in tokens. A request with ``l + o > M`` is a ``ValueError``.
        objective: ``"total_latency"`` (default), ``"max_latency"``,
            ``"completed"`` or ``"tokens"`` (the last two need ``horizon``).
        horizon: ``total_latency``: the slot ``S`` every schedule must finish by
            (default: best heuristic makespan + ``slack``); ``max_latency``: an
            optional cap; ``completed``/``tokens``: the horizon ``T``.
        slack: slots added to the heuristic makespan (default ``max o_i``).
        time_limit: seconds for the whole solve. A solve stopped by it reports
            its gap and is never called optimal.
        cuts: separate clique cuts on the LP relaxation before branching.
        refine: for ``max_latency``, also minimise the total latency among
            schedules with the optimal maximum latency (in the remaining time).
        verbose: print HiGHS's log and the cut rounds.

    Returns:
        a :class:`HindsightResult`; its :meth:`~HindsightResult.replay` checks the
        schedule in the simulator.
    """
    t0 = time.perf_counter()
    a, l, o, M = _check_instance(arrival, prompt_len, output_len, M)
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if not is_real(time_limit) or not time_limit > 0:
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if horizon is not None and is_real(horizon) and horizon > MAX_SPAN:
        raise ValueError(f"horizon must be a positive integer up to {MAX_SPAN:g} slots, got {horizon!r}")
    if slack is not None and (isinstance(slack, bool) or not isinstance(slack, (int, np.integer)) or slack < 0):
        raise ValueError(f"slack must be a non-negative integer number of slots, got {slack!r}")
    if horizon is not None and (not is_finite_real(horizon) or int(horizon) != horizon
                                or horizon < 1):
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    if objective in _MAXIMISE and horizon is None:
        raise ValueError(f"objective {objective!r} counts what finishes by a horizon T: give horizon=T")
    deadline = t0 + float(time_limit)
    require_scipy()
    n = a.size
    types = _Types(a, l, o)
    T = int(horizon) if horizon is not None else None

    # ---- heuristic incumbents (all feasible: the memory check never overflows)
    cands: list[tuple[str, np.ndarray]] = []
    for order in ("sf", "fcfs", "lf"):
        for bf in (False, True):
            name = {"sf": "MC-SF", "fcfs": "MC (FCFS)", "lf": "MC-LF"}[order] + (" backfill" if bf else "")
            dl = T if objective in _MAXIMISE else None
            cands.append((name, heuristic_schedule(a, l, o, M, order=order, backfill=bf, deadline=dl)))
    sign = -1.0 if objective in _MAXIMISE else 1.0

    def feasible_in(st: np.ndarray) -> bool:
        if objective in _MAXIMISE:
            return True
        return T is None or int((st + o).max()) <= T

    scored = [(sign * _objective_value(objective, a, o, st, T), name, st) for name, st in cands if feasible_in(st)]
    scored = [x for x in scored if np.isfinite(x[0])]
    scored.sort(key=lambda x: x[0])
    if scored:
        inc_val, heur_name, inc_start = scored[0]
    else:
        inc_val, heur_name, inc_start = math.inf, "none fits the horizon", np.full(n, -1, _I64)
    heur_value = sign * inc_val

    common = {"M": M, "arrival": a, "prompt_len": l, "output_len": o, "heuristic": heur_name,
              "heuristic_value": heur_value}
    res: HindsightResult

    if objective == "total_latency":
        res = _solve_total(types, a, l, o, M, T, slack, inc_val, inc_start, deadline, cuts, verbose, common)
    elif objective == "max_latency":
        res = _solve_max(types, a, l, o, M, T, inc_val, inc_start, deadline, cuts, refine, verbose, common)
    else:
        res = _solve_throughput(types, a, l, o, M, T, objective, inc_val, inc_start, deadline, cuts, verbose, common)
    res.solve_seconds = time.perf_counter() - t0
    return res


def _finish(start: np.ndarray, o: np.ndarray) -> np.ndarray:
    return np.where(start >= 0, start + o, -1)


def _solve_total(types, a, l, o, M, T, slack, inc_val, inc_start, deadline, cuts, verbose, common) -> HindsightResult:
    sum_o = float(o.sum())
    if slack is None:
        slack = int(o.max())
    if np.isfinite(inc_val):
        W = int(inc_val - sum_o)  # total waiting of the incumbent: any better schedule waits less, per request too
        makespan = int((inc_start + o).max())
        S = int(T) if T is not None else makespan + int(slack)
        proven_S = int((a + o).max()) + W
        if T is None and proven_S <= S:
            S = proven_S
        lo = types.a
        hi = np.minimum(types.a + W, S - types.o)
    else:
        W = None
        S = int(T)  # type: ignore[arg-type]
        lo, hi = types.a, S - types.o
    out, prog = _solve_min(types, lo, hi, M, "latency", "eq", inc_val if np.isfinite(inc_val) else None, deadline,
                           cuts=cuts, verbose=verbose)
    if out.y is not None and (not np.isfinite(inc_val) or out.value < inc_val):
        start = _starts_from_counts(types, prog, out.y, a.size)
        value, source = out.value, "milp"
    elif np.isfinite(inc_val):
        start, value, source = inc_start, inc_val, common["heuristic"]
    else:
        start, value, source = np.full(a.size, -1, _I64), math.nan, ""
    if out.kind == "infeasible" and not np.isfinite(inc_val):
        return HindsightResult("total_latency", "infeasible", False, math.nan, math.inf, math.nan,
                               np.full(a.size, -1, _I64), np.full(a.size, -1, _I64), S, False, 0.0,
                               source="", n_variables=out.n_var, n_constraints=out.n_con, n_cuts=out.n_cuts,
                               lp_bound=out.lp_bound, messages=[out.message], **common)
    if out.kind in ("optimal", "proved_incumbent"):
        bound = value
    else:
        bound = out.bound
    bound = math.ceil(bound - 1e-6) if np.isfinite(bound) else sum_o
    bound = max(bound, sum_o)
    if np.isfinite(value):
        bound = min(bound, value)
    optimal = bool(np.isfinite(value) and bound >= value)
    gap = 0.0 if optimal else ((value - bound) / max(abs(value), 1.0) if np.isfinite(value) else math.nan)
    # exact horizon: a schedule better than the returned one waits < W* in total,
    # so every request finishes by a_i + o_i + W* - 1 <= S
    Wstar = value - sum_o
    exact = bool(np.isfinite(value) and int((a + o).max() + Wstar - 1) <= S)
    return HindsightResult("total_latency", _status(optimal, value, gap), bool(optimal), float(value), float(bound),
                           float(gap), start, _finish(start, o), int(S), exact, 0.0, source=source,
                           n_variables=out.n_var, n_constraints=out.n_con, n_cuts=out.n_cuts, lp_bound=out.lp_bound,
                           messages=[out.message], **common)


def _solve_max(types, a, l, o, M, T, inc_val, inc_start, deadline, cuts, refine, verbose, common) -> HindsightResult:
    # lower bounds: every request needs o_i slots; and all the KV token-slots
    # (sum of w_i = l o + o (o + 1) / 2) fit between the first arrival and a_max + Z
    work = int((l * o + o * (o + 1) // 2).sum())
    lb = max(int(o.max()), -(-work // M) - int(a.max() - a.min()))
    msgs: list[str] = []
    S_cap = T
    if not np.isfinite(inc_val):  # nothing fits a user cap: search from the trivial bound up to the cap
        hi_z = int(T - a.min()) if T is not None else None
        best_start = None
    else:
        hi_z = int(inc_val)
        best_start = inc_start
    lo_z = lb
    source = common["heuristic"]
    n_var = n_con = n_cuts = 0
    timed_out = False
    infeasible = False
    if hi_z is None:
        raise ValueError("max_latency: no heuristic schedule fits the horizon")  # pragma: no cover
    # bisection: invariant: every Z < lo_z is infeasible; hi_z is feasible (has best_start) unless best_start is None
    probe_hi = hi_z if best_start is not None else hi_z + 1
    first = True
    while lo_z < probe_hi:
        # the heuristic is usually close: try one below it first, then bisect
        z = probe_hi - 1 if first and best_start is not None else (lo_z + probe_hi) // 2
        first = False
        if time.perf_counter() >= deadline:
            timed_out = True
            break
        hi = types.a + z - types.o
        if S_cap is not None:
            hi = np.minimum(hi, S_cap - types.o)
        out, prog = _solve_min(types, types.a, hi, M, "zero", "eq", None, deadline, cuts=cuts, verbose=verbose)
        msgs.append(f"Z={z}: {out.kind}: {out.message}")
        n_var, n_con, n_cuts = out.n_var, out.n_con, out.n_cuts
        if out.kind in ("optimal", "better") and out.y is not None:
            best_start = _starts_from_counts(types, prog, out.y, a.size)
            probe_hi = int((best_start + o - a).max())  # may be below z
            source = "milp"
        elif out.kind == "infeasible":
            lo_z = z + 1
        else:
            timed_out = True
            break
    if best_start is None:
        if not timed_out:
            infeasible = True
        return HindsightResult("max_latency", _status(False, math.nan, math.nan, infeasible), False, math.nan,
                               float(lo_z), math.nan, np.full(a.size, -1, _I64), np.full(a.size, -1, _I64),
                               int(S_cap or 0), True, 0.0, source="", n_variables=n_var, n_constraints=n_con,
                               n_cuts=n_cuts, messages=msgs, **common)
    value = float((best_start + o - a).max())
    bound = float(min(lo_z, value))
    optimal = bound >= value
    gap = 0.0 if optimal else (value - bound) / max(value, 1.0)
    refine_status = None
    if refine and time.perf_counter() < deadline:
        Z = int(value)
        hi = types.a + Z - types.o
        if S_cap is not None:
            hi = np.minimum(hi, S_cap - types.o)
        cur = float((best_start + o - a).sum())
        out, prog = _solve_min(types, types.a, hi, M, "latency", "eq", cur, deadline, cuts=cuts, verbose=verbose)
        msgs.append(f"refine: {out.kind}: {out.message}")
        if out.y is not None and out.value < cur:
            best_start = _starts_from_counts(types, prog, out.y, a.size)
            source = "milp"
        tot = float((best_start + o - a).sum())
        if out.kind in ("optimal", "proved_incumbent"):
            refine_status = f"optimal (total latency {tot:g} at max latency {Z})"
        else:
            rb = max(math.ceil(out.bound - 1e-6), float(o.sum())) if np.isfinite(out.bound) else float(o.sum())
            refine_status = f"time_limit (total latency {tot:g}, bound {rb:g}, at max latency {Z})"
    S = int((best_start + o).max())
    return HindsightResult("max_latency", _status(optimal, value, gap), bool(optimal), value, bound, float(gap),
                           best_start, _finish(best_start, o), S if S_cap is None else int(S_cap), S_cap is None, 0.0,
                           source=source, refine_status=refine_status, n_variables=n_var, n_constraints=n_con,
                           n_cuts=n_cuts, messages=msgs, **common)


def _solve_throughput(types, a, l, o, M, T, objective, inc_val, inc_start, deadline, cuts, verbose, common) -> HindsightResult:
    lo = types.a
    hi = T - types.o
    cost = "-count" if objective == "completed" else "-tokens"
    inc = inc_val if np.isfinite(inc_val) else 0.0
    out, prog = _solve_min(types, lo, hi, M, cost, "le", inc, deadline, cuts=cuts, verbose=verbose)
    if out.y is not None and out.value < inc:
        start = _starts_from_counts(types, prog, out.y, a.size)
        value, source = -out.value, "milp"
    else:
        start, value, source = inc_start, -inc, common["heuristic"]
    start = np.where((start >= 0) & (start + o <= T), start, -1)
    # trivial upper bound: everything that can finish by T
    fits = a + o <= T
    trivial = float(fits.sum()) if objective == "completed" else float(o[fits].sum())
    if out.kind in ("optimal", "proved_incumbent"):
        bound = value
    else:
        bound = -out.bound if np.isfinite(out.bound) else trivial
        bound = max(min(math.floor(bound + 1e-6), trivial), value)
    optimal = bound <= value
    gap = 0.0 if optimal else (bound - value) / max(abs(value), 1.0)
    return HindsightResult(objective, _status(optimal, value, gap), bool(optimal), float(value), float(bound),
                           float(gap), start, _finish(start, o), int(T), True, 0.0, source=source,
                           n_variables=out.n_var, n_constraints=out.n_con, n_cuts=out.n_cuts,
                           lp_bound=-out.lp_bound if np.isfinite(out.lp_bound) else math.nan,
                           messages=[out.message], **common)


# --------------------------------------------------------------------------- agents against the optimum


def _as_agent(agent: Any) -> tuple[Any, str | None]:
    """An agent from an :class:`~flowgym.agents.Agent`, an :class:`~flowgym.lab.scenarios.AgentSpec` or a spec
    string, and the spec's own label (``None`` for an agent object or a spec without one)."""
    from flowgym.lab.evaluation import build_agent
    from flowgym.lab.scenarios import AgentSpec

    if isinstance(agent, str):
        agent = AgentSpec.parse(agent)
    if isinstance(agent, AgentSpec):
        return build_agent(agent), agent.label
    return agent, None


def _trace_env_kwargs(agent: Any, a: np.ndarray, l: np.ndarray, o: np.ndarray, M: int, cls: Any,
                      output_length_known: bool | None) -> dict[str, Any]:
    """The environment arguments of an agent's run on a trace (:func:`run_agent_on_trace`)."""
    wl: dict[str, Any] = {"kind": "trace", "arrival": a.tolist(), "prompt_len": l.tolist(), "output_len": o.tolist()}
    if cls is not None:
        wl["cls"] = np.asarray(cls, dtype=_I64).tolist()
    if output_length_known is None:  # what the agent needs, else known (the hindsight program knows them)
        output_length_known = agent.env_options().get("output_length_known", True)
    return {"M": M, "workload": wl, "output_length_known": bool(output_length_known), "max_budget": 1024}


def run_agent_on_trace(
    agent: Any,
    arrival: Sequence[int] | np.ndarray,
    prompt_len: Sequence[int] | np.ndarray,
    output_len: Sequence[int] | np.ndarray,
    M: int,
    *,
    cls: Sequence[int] | np.ndarray | None = None,
    output_length_known: bool | None = None,
    seed: int = 0,
    label: str | None = None,
) -> dict[str, Any]:
    """Run an agent on a finite trace in FlowControl-v0 until the trace is served.

    ``agent`` is an :class:`flowgym.agents.Agent`, an :class:`~flowgym.lab.scenarios.AgentSpec`
    or a spec string (``"mc-sf"``, ``"flow-control:b=4"``). ``cls`` gives request
    classes (for per-class budgets). ``output_length_known`` (default: what the agent needs, else
    ``True``, as the hindsight program knows every length) says whether the environment tells the
    agent output lengths; an agent that needs the other value is refused, naming both. Returns ``label``, ``finish`` and
    ``latency`` per request in input order (``finish = -1`` if unfinished), the
    totals ``total_latency``, ``avg_latency``, ``p95_latency``, ``max_latency``,
    ``makespan``, ``completed``, ``evictions``, ``wasted_tokens`` and the
    simulator's ``metrics``.
    """
    from flowgym.lab.evaluation import run_episode

    a, l, o, M = _check_instance(arrival, prompt_len, output_len, M)
    agent, spec_label = _as_agent(agent)
    label = label or spec_label or agent.label()
    env_kwargs = _trace_env_kwargs(agent, a, l, o, M, cls, output_length_known)
    cap = int(a.max()) + 10 * int((l + o).sum()) + 100
    ep = run_episode(agent, env_kwargs, seed, cap, label)
    row = np.argsort(a, kind="stable")
    finish = np.full(a.size, -1, _I64)
    finish[row[: ep.log["finish"].size]] = ep.log["finish"]
    done = finish >= 0
    lat = np.where(done, finish - a, -1)
    m = ep.metrics()
    m.pop("kv_usage", None)
    latd = lat[done].astype(np.float64)
    return {
        "label": label,
        "finish": finish,
        "latency": lat,
        "total_latency": float(latd.sum()) if done.all() else math.nan,
        "avg_latency": float(latd.mean()) if done.any() else math.nan,
        "p95_latency": float(np.percentile(latd, 95)) if done.any() else math.nan,
        "max_latency": float(latd.max()) if done.all() else math.nan,
        "makespan": int(finish.max()) if done.all() else -1,
        "completed": int(done.sum()),
        "evictions": int(m["evictions"]),
        "wasted_tokens": int(m["wasted_tokens"]),
        "metrics": m,
    }


#: What each objective's ratio compares: (row key, direction)
_RATIO_KEYS = {"total_latency": "total_latency", "max_latency": "max_latency", "completed": "completed_by_T",
               "tokens": "tokens_by_T"}


@dataclass
class _SolveCell:
    a: np.ndarray
    l: np.ndarray
    o: np.ndarray
    M: int
    objective: str
    horizon: int | None
    time_limit: float

    def describe(self) -> str:
        return f"(hindsight {self.objective}, {self.a.size} requests)"


def _solve_cell(c: _SolveCell) -> HindsightResult:
    return solve_hindsight(c.a, c.l, c.o, c.M, objective=c.objective, horizon=c.horizon, time_limit=c.time_limit)


@dataclass
class _AgentCell:
    agent: Any
    a: np.ndarray
    l: np.ndarray
    o: np.ndarray
    M: int
    cls: Any

    def describe(self) -> str:
        return f"(agent {getattr(self.agent, 'name', self.agent)!r} on the trace)"


def _agent_cell(c: _AgentCell) -> dict[str, Any]:
    return run_agent_on_trace(c.agent, c.a, c.l, c.o, c.M, cls=c.cls)


def _check_agents(agents: Any, a: np.ndarray, l: np.ndarray, o: np.ndarray, M: int, cls: Any) -> None:
    """Refuse, before any solve, agents that cannot run on the trace: an unknown name or parameter, options that
    conflict with the trace's environment, a first action it does not take (per-class budgets for other classes);
    and ``agents`` given as one string, which would be read letter by letter."""
    from flowgym.lab.evaluation import check_hostable
    from flowgym.lab.scenarios import AgentSpec

    if isinstance(agents, (str, AgentSpec)) or not isinstance(agents, (Sequence, np.ndarray)):
        raise ValueError(f"agents must be a list of agents or agent specs (e.g. ['mc-sf', 'flow-control:b=4']), "
                         f"got {agents!r}")
    for ag in agents:
        agent, _ = _as_agent(ag)
        check_hostable(agent, _trace_env_kwargs(agent, a, l, o, M, cls, None))


def compare_to_hindsight(
    arrival: Sequence[int] | np.ndarray,
    prompt_len: Sequence[int] | np.ndarray,
    output_len: Sequence[int] | np.ndarray,
    M: int,
    agents: Sequence[Any],
    *,
    objectives: Sequence[str] = ("total_latency", "max_latency"),
    T: int | None = None,
    time_limit: float = 60.0,
    cls: Sequence[int] | np.ndarray | None = None,
    results: dict[str, HindsightResult] | None = None,
    backend: Any = "serial",
) -> tuple[dict[str, HindsightResult], list[dict[str, Any]]]:
    """The hindsight optima of a trace and every agent's run on it, with ratios.

    ``backend`` (:mod:`flowgym.lab.parallel`) runs the solves and the agents' runs as cells;
    the rows are the same on every backend when every solve ends before its ``time_limit`` (a solve is then
    deterministic). A solve the limit stops returns what it found by then, which depends on the machine's speed
    and load: its status says so, and its ratios are a range (below).

    One row per optimum (``"hindsight: <objective>"``) and per agent, each with
    ``total_latency``, ``avg_latency``, ``p95_latency``, ``max_latency``,
    ``makespan``, ``evictions`` (and with ``T``: ``completed_by_T``,
    ``tokens_by_T``). For every objective ``k`` solved, an agent row has
    ``ratio_<k>``: the agent's value over the optimum's (for the throughput
    objectives, the optimum's over the agent's, so a ratio is ``>= 1`` when the
    agent is worse). When the solve is not proven optimal, ``ratio_<k>`` uses
    the best schedule found (so it understates the true ratio) and
    ``ratio_<k>_max`` uses the solver's bound (so it overstates it): the true
    ratio lies between them. ``time_limit`` applies to each objective.
    """
    a, l, o, M = _check_instance(arrival, prompt_len, output_len, M)
    _check_solve_args(objectives, T, time_limit)
    if any(k in _MAXIMISE for k in objectives) and T is None:
        raise ValueError("the throughput objectives need a horizon T")
    if cls is not None:
        cls = int_array("cls", cls, a.size, 0)
    _check_agents(agents, a, l, o, M, cls)
    from flowgym.lab.parallel import using

    res = dict(results or {})
    todo = [k for k in objectives if k not in res]
    if todo:
        require_scipy()
    solves = [_SolveCell(a, l, o, M, k, T if k in _MAXIMISE else None, time_limit) for k in todo]
    runs = [_AgentCell(ag, a, l, o, M, cls) for ag in agents]
    with using(backend) as be:
        solved = be.map(_solve_cell, solves)
        ran = be.map(_agent_cell, runs)
    res.update(zip(todo, solved))
    rows: list[dict[str, Any]] = []

    def add_T(row: dict[str, Any], finish: np.ndarray) -> None:
        if T is not None:
            done = (finish >= 0) & (finish <= T)
            row["completed_by_T"] = int(done.sum())
            row["tokens_by_T"] = int(o[done].sum())

    for k, r in res.items():
        r.replay()  # the program and the simulator must agree
        lat = r.latency
        full = bool(r.scheduled.all())
        row = {
            "name": f"hindsight: {k}",
            "kind": "hindsight",
            "status": r.status,
            "total_latency": r.total_latency if full else math.nan,
            "avg_latency": r.avg_latency,
            "p95_latency": float(np.percentile(lat[r.scheduled], 95)) if r.scheduled.any() else math.nan,
            "max_latency": r.max_latency if full else math.nan,
            "makespan": r.makespan,
            "evictions": 0,
        }
        add_T(row, r.finish)
        rows.append(row)
    for run in ran:
        row = {k2: run[k2] for k2 in ("total_latency", "avg_latency", "p95_latency", "max_latency", "makespan", "evictions")}
        row = {"name": run["label"], "kind": "agent", "status": "", **row}
        add_T(row, run["finish"])
        for k, r in res.items():
            key = _RATIO_KEYS[k]
            mine = row.get(key, math.nan)
            if k in _MAXIMISE:
                # 0 / 0: the agent matches an optimum that completes nothing by T (not infinitely worse)
                row[f"ratio_{k}"] = r.value / mine if mine else (1.0 if r.value == 0 else math.inf)
                row[f"ratio_{k}_max"] = r.bound / mine if mine else (1.0 if r.bound == 0 else math.inf)
            else:
                row[f"ratio_{k}"] = mine / r.value if r.value else math.nan
                row[f"ratio_{k}_max"] = mine / r.bound if r.bound else math.nan
        rows.append(row)
    return res, rows


def format_comparison(results: dict[str, HindsightResult], rows: list[dict[str, Any]]) -> str:
    """A text table of :func:`compare_to_hindsight`'s rows, with each solve's status."""
    cols = ["total_latency", "avg_latency", "p95_latency", "max_latency", "makespan", "evictions"]
    if rows and "completed_by_T" in rows[0]:
        cols += ["completed_by_T", "tokens_by_T"]
    ratio_cols = [f"ratio_{k}" for k in results]
    short = {"total_latency": "total lat", "avg_latency": "avg lat", "p95_latency": "p95 lat", "max_latency": "max lat",
             "makespan": "makespan", "evictions": "evictions", "completed_by_T": "done by T", "tokens_by_T": "tokens by T"}
    for k in results:
        short[f"ratio_{k}"] = {"total_latency": "/opt total", "max_latency": "/opt max", "completed": "opt/done",
                               "tokens": "opt/tokens"}[k]
    w = max([len(r["name"]) for r in rows] + [5])
    head = f"{'':<{w}} " + " ".join(f"{short[c]:>11}" for c in cols + ratio_cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for c in cols + ratio_cols:
            v = r.get(c, "")
            if v == "" or v is None:
                s = ""
            elif isinstance(v, float) and not np.isfinite(v):
                s = "-"
            elif c.startswith("ratio_"):
                hi = r.get(c + "_max", v)
                s = f"{v:.3f}" if abs(hi - v) < 5e-4 else f"{v:.3f}-{hi:.3f}"
            elif isinstance(v, float):
                s = f"{v:.2f}" if abs(v) < 1000 else f"{v:.0f}"
            else:
                s = str(v)
            cells.append(f"{s:>11}")
        lines.append(f"{r['name']:<{w}} " + " ".join(cells))
    lines.append("")
    for k, r in results.items():
        lines.append(r.summary())
        if r.refine_status:
            lines.append(f"  then minimum total latency at that maximum: {r.refine_status}")
    return "\n".join(lines)
