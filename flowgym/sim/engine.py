"""The token-level engine: one slot of LLM serving under a KV-cache budget ``M``.

This module implements the project's contract (``shared/spec/model.md``, restated with every reading in
``docs/model.md``) exactly, with no Gymnasium in sight. A slot ``t`` runs five phases in this order:

1. **Arrive.** Requests with ``a_i == t`` join the waiting queue; one with
   ``l_i + o_i > M`` can never complete and is *rejected* (counted, never queued).
2. **Admit.** Up to ``B_t`` requests leave the head of the queue and become
   active. The queue is FIFO by ``(a_i, i)``; an evicted request keeps its
   arrival and so goes back ahead of later arrivals. With per-class budgets
   (Algorithm 1) each class has its own FIFO lane and classes are admitted in
   order ``k = 0..m-1``.
3. **Evict on overflow.** The demand ``D_t = sum_active (l_i + j_i + 1)``; while
   ``D_t > M`` the eviction rule removes requests (they lose their ``j_i``
   generated tokens and rejoin the queue).
4. **Decode.** Every active request generates one token; one reaching
   ``j_i == o_i`` finishes with ``f_i = t + 1`` and frees its memory.
5. **Record.** ``U_t = D_t`` after eviction, queue length and active count.

:class:`Engine` splits a slot at the decision point: :meth:`Engine.arrive` runs
phase 1 and :meth:`Engine.serve` phases 2-5, so a controller sees slot ``t``'s
arrivals before choosing ``B_t``.

State is a struct of numpy arrays: a request table (one entry per request,
appended chunk by chunk from the workload), the queue lanes (sorted id
buffers) and the active set (ids, activation slots and finish slots in
admission order). Per slot the work is a handful of vectorised operations and
scalar bookkeeping (``held`` tokens, counts), never a Python object per request.
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from flowgym.sim import kernels
from flowgym.sim._checks import calendar_span, holds_bool, int_array, is_count
from flowgym.sim.rules import (
    EVICTION_RULES,
    QUEUE_ORDERS,
    ActiveSet,
    EvictionRule,
    Lane,
    QueueOrder,
    make_eviction_rule,
    make_queue_order,
)
from flowgym.sim.latency import JailletLatency, LinearLatency, make_latency_model
from flowgym.sim.metrics import metrics_at
from flowgym.sim.admission import ADMISSION_KINDS, ADMISSION_LENGTHS, AdmissionRule
from flowgym.sim.rates import Bursts, Constant, Steps
from flowgym.sim.rules import FIFO, EstimateEviction, EvictAll, LIFOEviction, ShortestEstimateFirst, ShortestOutputFirst
from flowgym.sim.streaming import StreamTotals
from flowgym.sim.workloads import (
    CHUNK_SECONDS,
    MIN_TIMED_RATE,
    EmpiricalLengths,
    IIDPoisson,
    LengthDistribution,
    LogNormalLengths,
    Mixture,
    NamedLengths,
    Trace,
    Workload,
    make_workload,
)

__all__ = ["Engine", "SlotStats", "check_time_model", "trace_time_origin", "EVICTION_RULES", "QUEUE_ORDERS",
           "RECORD_MODES", "replay"]

_I64 = np.int64
_ID_BITS = 32  # keyed queue orders: key = (primary << 32) | id (flowgym.sim.rules)

#: The engine's record modes: ``"full"`` keeps every request and slot record (the default),
#: ``"stream"`` keeps memory flat on runs of any length (:mod:`flowgym.sim.streaming`).
RECORD_MODES = ("full", "stream")
#: Fewest finished or rejected rows the streaming mode drops at once.
_RECYCLE_MIN = 4096
#: The request table's columns (one entry per request drawn).
_TABLE = ("arrival", "prompt", "output", "cls", "finish", "evictions", "rejected", "estimate", "arrival_time")
#: Schedules whose :meth:`~flowgym.sim.rates.RateSchedule.zero_until` the engine trusts to skip
#: zero-rate stretches (their sampling of a window whose integral is 0 draws nothing).
_QUIET_SCHEDULES = (Constant, Steps, Bursts)
#: Length distributions that draw nothing from the generator for zero requests.
_QUIET_LENGTHS = (EmpiricalLengths, LogNormalLengths)


#: Iterations of one call of the compiled loop before it returns to Python (then goes on).
_RUN_SLICE = 1 << 20
#: Engine attributes packed into the compiled loop's scalar state (index in ``kernels.S_*``, name).
_S_FIELDS = (
    (kernels.S_T, "t"), (kernels.S_ARRIVED, "n_arrived"), (kernels.S_NREQ, "n_req"), (kernels.S_AH, "_h"),
    (kernels.S_ATAIL, "_tail"), (kernels.S_NACT, "n_active"), (kernels.S_HELD, "held"), (kernels.S_NQ, "n_queued"),
    (kernels.S_QPROMPT, "queued_prompt_tokens"), (kernels.S_TARR, "total_arrived"),
    (kernels.S_TREJ, "total_rejected"), (kernels.S_TDONE, "total_completed"), (kernels.S_TEV, "total_evictions"),
    (kernels.S_OVF, "overflow_events"), (kernels.S_WASTE, "wasted_tokens"), (kernels.S_GEN, "generated_tokens"),
    (kernels.S_LARR, "last_arrivals"), (kernels.S_LREJ, "last_rejected"), (kernels.S_LDONE, "last_completed_tokens"),
    (kernels.S_RECN, "_rec_n"), (kernels.S_CLOCKB, "_clock_base"), (kernels.S_NEED, ""),
)
_EVICT_CODES = {LIFOEviction: kernels.EVICT_LIFO, EvictAll: kernels.EVICT_ALL, EstimateEviction: kernels.EVICT_ESTIMATE}


class SlotStats(NamedTuple):
    """What happened in one slot (all plain ints)."""

    t: int  #: the slot
    usage: int  #: ``U_t``: KV tokens held in the slot after eviction (``D_t``)
    admitted: int  #: requests activated
    evicted: int  #: requests evicted
    wasted_tokens: int  #: generated tokens lost to eviction
    completed: int  #: requests that finished (``f_i = t + 1``)
    queue_len: int  #: waiting requests at the end of the slot
    active: int  #: active requests at the end of the slot


# --------------------------------------------------------------------------- engine


def trace_time_origin(arrival: np.ndarray) -> float:
    """The start of a timed trace's run in its own time base: its first arrival, rounded down to a
    multiple of the float spacing at its last arrival (``math.ulp``; a power of two), so that
    ``a - origin`` is exact for every arrival ``a`` (a multiple of that spacing, between 0 and ``a``) and
    ``(a - origin) + origin == a``. For Unix timestamps (about 1.7e9 s) that is at most 2.4e-7 s below
    the first arrival; 0 for a trace that starts at 0 (or is empty).

    ``arrival``: the trace's arrival times in seconds, sorted ascending, all ``>= 0``."""
    if arrival.size == 0:
        return 0.0
    a0 = float(arrival[0])
    if not a0 > 0:
        return 0.0
    u = math.ulp(float(arrival[-1]))
    return math.floor(a0 / u) * u


def _quiet_lengths(lengths: LengthDistribution) -> bool:
    """Whether ``lengths.sample(rng, 0)`` is known to draw nothing from ``rng`` (the built-in kinds)."""
    if type(lengths) is NamedLengths:
        lengths = lengths.dist
    return type(lengths) in _QUIET_LENGTHS


def check_time_model(workload_timed: bool, timed: bool) -> None:
    """``ValueError`` unless a workload's arrivals (timestamps in seconds when ``workload_timed``, else slots) suit
    the clock (``timed``: a latency model, continuous time; else unit slots)."""
    if timed and not workload_timed:
        raise ValueError("continuous time (a time_model) needs a timed workload: arrivals in seconds "
                         "(e.g. {'kind': 'iid', ..., 'timed': True} or Trace(..., timed=True))")
    if workload_timed and not timed:
        raise ValueError("this workload's arrivals are timestamps in seconds: give a time_model "
                         "(e.g. 'llama2-70b-tp2-a100') for continuous time")


class Engine:
    """The slot-by-slot simulator of the contract (``shared/spec/model.md``; ``docs/model.md``).

    Args:
        M: KV-cache budget in tokens.
        workload: a :class:`~flowgym.sim.workloads.Workload` or its mapping form.
        eviction: eviction rule by name (``"lifo"``, default; ``"all"``;
            ``"estimate"``) or an :class:`~flowgym.sim.rules.EvictionRule`.
        queue_order: queue order by name (``"fifo"``, default; ``"sjf"``;
            ``"estimate"``) or a :class:`~flowgym.sim.rules.QueueOrder`.
        estimate_floor: initial output estimate of every request, when an
            order or rule uses estimates (default 1: the shortest possible output).
        time_model: ``None`` for unit slots (default), or a
            :class:`~flowgym.sim.latency.LatencyModel` (or its name/mapping form):
            continuous time, where a step is one batch iteration lasting what the
            model says and arrivals are timestamps in seconds.
        per_class: admit with per-class budgets (Algorithm 1): one FIFO lane per
            class; :meth:`serve` then takes an array of ``m`` budgets.
        track_class_queue: keep per-class queue counts (for observations).
        record: ``"full"`` (default): keep every request's row and every slot's
            record, for :meth:`request_log`, :meth:`series` and exact metrics at any
            horizon. ``"stream"``: memory stays flat on runs of any length: finished
            and rejected requests are folded into running sums and dropped from the
            request table (the requests left are renumbered, so request ids are only
            valid within a step), :meth:`metrics` gives the same counts and means,
            ``p95_latency`` from a bounded sketch (:class:`~flowgym.sim.streaming.QuantileSketch`),
            :meth:`series` the last :data:`~flowgym.sim.streaming.STREAM_WINDOW`
            slots and :meth:`request_log` raises ``ValueError``.

    Call :meth:`reset` with a numpy ``Generator`` (it draws the workload), then
    alternate :meth:`arrive` and :meth:`serve`.

    Attributes:
        jit: use the compiled kernels of :mod:`flowgym.sim.kernels` (numba) for
            admission, the FIFO append of arrivals, the histogram and the
            projection; defaults to
            ``flowgym.sim.kernels.ENABLED`` (numba installed, ``FLOWGYM_JIT`` not ``0``).
            Read at :meth:`reset`; results are the same either way.
        time_origin: continuous time: where the run starts, in the workload's time base (seconds):
            0 for a generated workload (its rate schedule starts there), a timed
            :class:`~flowgym.sim.workloads.Trace`'s first arrival for a trace (:func:`trace_time_origin`:
            rounded down by at most the float spacing at its last arrival). The throughputs of
            :meth:`metrics` divide by the seconds from it to the end of the last iteration (``elapsed``),
            so a trace shifted by a constant (e.g. Unix timestamps) has the same metrics. The engine
            runs its clock from it (a trace's arrivals shifted by it inside, exactly), so the
            clock keeps its resolution at large timestamps; :attr:`now`, ``series()["time"]`` and the
            request log's ``arrival_time`` and ``finish_time`` stay in the workload's time base.
    """

    #: the clock inside (seconds from :attr:`time_origin` when the clock is rebased, see :meth:`_rebases_clock`)
    _now: float = 0.0
    #: what :attr:`now` adds to the clock inside: :attr:`time_origin`, or 0 when the clock is not rebased
    _shift: float = 0.0
    time_origin: float = 0.0

    def __init__(
        self,
        M: int,
        workload: Workload | dict[str, Any],
        *,
        eviction: str | EvictionRule = "lifo",
        queue_order: str | QueueOrder = "fifo",
        estimate_floor: int = 1,
        time_model: Any = None,
        per_class: bool = False,
        track_class_queue: bool = False,
        record: str = "full",
    ) -> None:
        if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
            raise ValueError(f"M (the KV-cache budget in tokens) must be a positive integer, got {M!r}")
        self.M = int(M)
        made = make_workload(workload)
        # a workload with state between samples gives each engine its own copy (engines may share one object)
        self.workload = made.for_engine() if hasattr(made, "for_engine") else made
        calendar_span(self.M, self.workload.max_output_tokens())  # too long to schedule: named, before reset
        self.eviction = make_eviction_rule(eviction)
        self.order = make_queue_order(queue_order)
        self.track_estimates = self.order.needs_estimates or self.eviction.needs_estimates
        if isinstance(estimate_floor, bool) or not isinstance(estimate_floor, (int, np.integer)) or estimate_floor < 1:
            raise ValueError(f"estimate_floor must be a positive integer, got {estimate_floor!r}")
        self.estimate_floor = int(estimate_floor)
        self.time_model = None if time_model is None else make_latency_model(time_model)
        self.timed = self.time_model is not None
        check_time_model(self.workload.timed, self.timed)
        self.time_origin = 0.0
        if self.timed and isinstance(self.workload, Trace):
            self.time_origin = trace_time_origin(self.workload.arrival)
        self._shift = self.time_origin if self._rebases_clock() else 0.0
        if self.timed and not isinstance(self.workload, Trace):  # an idle server draws chunks until a request comes
            lam = self.workload.arrival_rate()
            if lam is not None and 0 < lam < MIN_TIMED_RATE:
                raise ValueError(f"workload: a long-run arrival rate of {lam:g} requests per second is too low for "
                                 f"continuous time (at least {MIN_TIMED_RATE:g} when positive: an idle server draws "
                                 f"{CHUNK_SECONDS:g}-second chunks until a request comes, about "
                                 f"{1 / (lam * CHUNK_SECONDS):.3g} of them); use 0 for no arrivals")
        self.m = self.workload.num_classes
        if per_class and self.m == 0:
            raise ValueError("per_class budgets need a workload with request classes")
        self.per_class = bool(per_class)
        self.track_class_queue = bool(track_class_queue) and self.m > 0
        if record not in RECORD_MODES:
            raise ValueError(f"record must be one of {list(RECORD_MODES)}, got {record!r}")
        if record == "stream" and type(self.order) not in (FIFO, ShortestOutputFirst, ShortestEstimateFirst):
            raise ValueError(f"record='stream' renumbers requests as finished ones are dropped; queue_order "
                             f"{self.order.name!r} ({type(self.order).__name__}) keys requests by fixed ids: "
                             "use record='full'")
        self.record = record
        # a latency model that runs user code (a callable) gets its duration before the step
        # changes anything, so an exception leaves the engine as it was
        self._preview = self.timed and not isinstance(self.time_model, (LinearLatency, JailletLatency))
        self._rng: np.random.Generator | None = None
        self.jit: bool = kernels.ENABLED
        self._use_jit = False
        self.t = 0

    # ------------------------------------------------------------------ setup

    @property
    def now(self) -> float:
        """Continuous time: the start of the current iteration in seconds, in the workload's time base
        (the clock inside plus :attr:`time_origin` when it runs from there)."""
        return self._now + self._shift

    @now.setter
    def now(self, value: float) -> None:
        self._now = value - self._shift

    def _rebases_clock(self) -> bool:
        """Whether this engine runs its clock from :attr:`time_origin` (a timed trace's arrivals
        shifted by it inside). The paper's engine does, and so does the ``vllm-v1`` mode (its token
        times on the clock inside, ``_shift`` added where it reports them); a subclass that keeps
        times of its own on :attr:`now` keeps the workload's base by returning False."""
        return type(self) is Engine

    def reset(self, rng: np.random.Generator) -> None:
        """Empty the system and start a new run at slot 0, drawing requests from ``rng``."""
        if self.jit:
            if not kernels.AVAILABLE:
                raise RuntimeError("Engine.jit=True needs numba: pip install -e '.[fast]' in the flowgym checkout")
            kernels.load()
        self._use_jit = bool(self.jit)
        # the built-in eviction rules run compiled (a subclass or another rule: its select())
        self._evict_code = (_EVICT_CODES.get(type(self.eviction), -1) if self._use_jit else -1)
        self._ev_buf = np.empty(256, _I64)
        self._rng = rng
        self.t = 0
        cap = 1024
        self.arrival = np.empty(cap, _I64)
        self.prompt = np.empty(cap, _I64)
        self.output = np.empty(cap, _I64)
        self.cls = np.empty(cap, _I64)
        self.finish = np.empty(cap, _I64)
        self.evictions = np.empty(cap, _I64)
        self.rejected = np.empty(cap, bool)
        self.estimate = np.empty(cap, _I64)  # output estimates (lower bounds), when tracked
        self.arrival_time = np.empty(cap, np.float64)  # seconds when timed, else the arrival slot
        # the arrival times on the clock inside (arrival_time - time_origin): arrival_time itself unless rebased
        self._arel = np.empty(cap, np.float64) if self._shift else self.arrival_time
        self.n_req = 0  # requests generated (some not arrived yet)
        self.n_arrived = 0  # ids < n_arrived have arrived
        self._gen_t = 0  # next slot to generate
        self._bounds: list[int] = [0]  # offsets of slots [_chunk_t0, _gen_t]
        self._rej_cum: list[int] = [0]
        self._tok_cum: list[int] = [0]
        self._chunk_t0 = 0
        self._chunk_base = 0
        self._total_requests = self.workload.total_requests
        self._now = 0.0  # continuous time: start of the current iteration (seconds on the clock inside)
        self.last_duration = 0.0
        self._ev_new_n = self._ev_new_prompt = 0  # admitted this slot, then evicted
        self._clock = np.zeros(256, np.float64)  # end time of each iteration (from slot _clock_base on)
        self._clock_base = 0  # streaming mode drops the clock of slots no longer needed
        self._id_base = 0  # requests dropped from the table (streaming mode): global id = _id_base + row
        self._stream = StreamTotals(len(SlotStats._fields), self.timed) if self.record == "stream" else None

        keyed = not self.order.keys_are_ids
        self.lanes = [Lane(keyed, jit=self._use_jit) for _ in range(self.m if self.per_class else 1)]
        self._fast_fifo = self.order.keys_are_ids and not self.per_class and not self.track_class_queue
        self.class_queue = np.zeros(max(self.m, 1), _I64)

        # Active set: entries in activation order in [_h, _tail) of the _a_* arrays.
        # An entry is alive while _a_fin > t (its finish slot is ahead); evicted
        # entries get _a_fin = -1. Dead entries are dropped by _compact().
        acap = 256
        self._a_id = np.empty(acap, _I64)
        self._a_start = np.empty(acap, _I64)
        self._a_fin = np.empty(acap, _I64)
        self._h = 0
        self._tail = 0
        self.n_active = 0
        # Completion calendar: requests (and their l + o tokens) finishing at
        # slot f are counted at index f & _cal_mask (ring longer than any o: an admitted
        # request has o < M, and o is at most the workload's bound when it has one).
        R = 1 << max(6, calendar_span(self.M, self.workload.max_output_tokens()).bit_length())
        self._cal_mask = R - 1
        if self._use_jit:  # the kernels write them
            self._cal_n: Any = np.zeros(R, _I64)
            self._cal_tok: Any = np.zeros(R, _I64)
        else:  # Python lists: per-slot scalar access is what they are for
            self._cal_n = [0] * R
            self._cal_tok = [0] * R
        self.held = 0  # sum over active of l_i + j_i (tokens held at the start of a slot)
        self.n_queued = 0
        self.queued_prompt_tokens = 0

        # running totals
        self.total_arrived = 0
        self.total_rejected = 0
        self.total_completed = 0
        self.total_evictions = 0
        self.overflow_events = 0
        self.wasted_tokens = 0
        self.generated_tokens = 0
        self.last_arrivals = 0  # requests that arrived in the last arrive() call
        self.last_completed_tokens = 0  # sum of l + o over the requests the last serve() completed
        self.last_rejected = 0  # of which rejected
        self._rec = np.zeros((256, len(SlotStats._fields)), _I64)
        self._pending: list[SlotStats] = []  # records of slots [_rec_n, t), written to _rec in blocks
        self._rec_n = 0

    # ------------------------------------------------------------------ request table

    def _grow_table(self, need: int) -> None:
        cap = self.arrival.size
        if need <= cap:
            return
        new_cap = max(2 * cap, need)
        for name in self._table_names():
            old = getattr(self, name)
            new = np.empty(new_cap, old.dtype)
            new[: self.n_req] = old[: self.n_req]
            setattr(self, name, new)
        self._realias()

    def _realias(self) -> None:
        """Without a rebased clock the arrival times inside are ``arrival_time`` itself: point ``_arel`` at it again
        after the table's arrays were replaced."""
        if not self._shift:
            self._arel = self.arrival_time

    def _table_names(self) -> tuple[str, ...]:
        """The request table's columns (with the arrival times inside when the clock is rebased)."""
        return _TABLE + ("_arel",) if self._shift else _TABLE

    def _generate(self) -> None:
        """Draw the next chunk of requests from the workload."""
        assert self._rng is not None, "call reset() first"
        t0 = self._gen_t
        t1 = t0 + self.workload.chunk_span
        req = self._sample(t0, t1)
        k = req.arrival.size
        base = self.n_req
        self._grow_table(base + k)
        s = slice(base, base + k)
        if self.timed:
            self.arrival_time[s] = req.arrival
            if self._shift:
                self._arel[s] = req.arrival - self._shift  # exact (trace_time_origin)
            self.arrival[s] = -1  # the iteration it joins, set on arrival
        else:
            self.arrival[s] = req.arrival
            self.arrival_time[s] = req.arrival
        self.prompt[s] = req.prompt_len
        self.output[s] = req.output_len
        self.cls[s] = req.cls
        self.finish[s] = -1
        self.evictions[s] = 0
        self.estimate[s] = self.estimate_floor
        rej = (req.prompt_len + req.output_len) > self.M
        rej = self._on_sample(req, s, rej)  # hook: engine modes (flowgym.sim.vllm) see each chunk
        self.rejected[s] = rej
        self.n_req = base + k
        self._chunk_t0, self._gen_t, self._chunk_base = t0, t1, base
        if self.timed:
            return
        self._bounds = (base + np.searchsorted(req.arrival, np.arange(t0, t1 + 1), side="left")).tolist()
        self._rej_cum = np.concatenate([[0], np.cumsum(rej)]).tolist()
        self._tok_cum = np.concatenate([[0], np.cumsum(np.where(rej, 0, req.prompt_len))]).tolist()

    def _sample(self, t0: float, t1: float) -> Any:
        """The workload's requests arriving in ``[t0, t1)`` on the clock inside (arrival times in the
        workload's base). A rebased trace is cut at the rows whose ``arrival - time_origin`` (exact)
        crosses ``t0`` and ``t1``, and sampled between those rows' own arrival times."""
        if not self._shift:
            return self.workload.sample(self._rng, t0, t1)
        a = self.workload.arrival  # type: ignore[attr-defined]
        lo, hi = self._trace_row(t0), self._trace_row(t1)
        a0 = float(a[lo]) if lo < a.size else math.inf
        a1 = float(a[hi]) if hi < a.size else math.inf
        return self.workload.sample(self._rng, a0, a1)  # type: ignore[arg-type]

    def _trace_row(self, t: float) -> int:
        """A rebased trace: the first row whose ``arrival - time_origin >= t`` (``t + time_origin``
        rounds; each difference is exact, so the search is corrected by them)."""
        a, o = self.workload.arrival, self._shift  # type: ignore[attr-defined]
        n = a.size
        i = int(np.searchsorted(a, t + o, side="left"))
        # defensive: rounding to nearest is monotone, so this first loop should never run (kept in case t + o and
        # the exact differences disagree on some platform's rounding)
        while i > 0 and a[i - 1] - o >= t:
            i = int(np.searchsorted(a, a[i - 1], side="left"))
        while i < n and a[i] - o < t:
            i = int(np.searchsorted(a, a[i], side="right"))
        return i

    def _next_arrival(self, t: float) -> float | None:
        """:meth:`Workload.next_arrival` on the clock inside (``None`` for a random workload)."""
        if not self._shift:
            return self.workload.next_arrival(t)
        i = self._trace_row(t)
        a = self.workload.arrival  # type: ignore[attr-defined]
        return float(a[i]) - self._shift if i < a.size else math.inf

    def _zero_until(self, t: float) -> float:
        """A generated timed workload: the end of a stretch from ``t`` in which no request can arrive
        and drawing a chunk takes nothing from the generator (every stream's rate schedule is in a
        zero-rate stretch: :meth:`~flowgym.sim.rates.RateSchedule.zero_until`); ``t`` when there is
        none or the workload is not one whose draws are known to be empty there."""
        w = self.workload
        streams = w.streams if type(w) is Mixture else [w]
        z = math.inf
        for s in streams:
            if (type(s) is not IIDPoisson or not s.timed or type(s.schedule) not in _QUIET_SCHEDULES
                    or not _quiet_lengths(s.lengths)):
                return t
            z = min(z, s.schedule.zero_until(t))
            if not z > t:
                return t
        return z

    def _on_sample(self, req: Any, rows: slice, rejected: np.ndarray) -> np.ndarray:
        """Hook for engine modes: a chunk of requests ``req`` fills table ``rows``; returns the
        rejected mask (this engine's: ``l + o > M``)."""
        return rejected

    # ------------------------------------------------------------------ phases

    def arrive(self) -> int:
        """Phase 1 of slot ``t``: queue its arrivals, reject the impossible. Returns the count."""
        if self.timed:
            return self._arrive_timed()
        t = self.t
        while t >= self._gen_t:
            self._generate()
        i = t - self._chunk_t0
        lo, hi = self._bounds[i], self._bounds[i + 1]
        self.n_arrived = hi
        k = hi - lo
        self.last_arrivals = k
        self.last_rejected = 0
        if k == 0:
            return 0
        b = self._chunk_base
        n_rej = self._rej_cum[hi - b] - self._rej_cum[lo - b]
        self.total_arrived += k
        self.queued_prompt_tokens += self._tok_cum[hi - b] - self._tok_cum[lo - b]
        if n_rej:
            self.total_rejected += n_rej
            self.last_rejected = n_rej
            ids = lo + np.flatnonzero(~self.rejected[lo:hi])
            if ids.size == 0:
                return k
        else:
            ids = None
        self.n_queued += k - n_rej
        if self._fast_fifo and ids is None:
            self.lanes[0].append_range(lo, hi)
            return k
        if ids is None:
            ids = np.arange(lo, hi, dtype=_I64)
        self._enqueue(ids)
        return k

    def _skip_empty_chunks(self, until: float) -> None:
        """Move the next chunk's start past chunks that hold no request, up to the one holding
        ``until`` or the next arrival, whichever is first: for a deterministic workload (see
        :meth:`Workload.next_arrival`) up to its next arrival, for a generated one past a zero-rate
        stretch of its schedule (:meth:`_zero_until`: those chunks draw nothing from the generator).
        Chunk windows stay the multiples of the chunk span, so what is generated does not change.
        An idle gap then costs one chunk whatever its length."""
        nxt = self._next_arrival(self._gen_t)
        if nxt is None:
            # a random workload's first chunk is always drawn: it resets the workload's own state
            # there (a finite IIDPoisson's count of the requests made)
            if self._gen_t <= 0:
                return
            nxt = self._zero_until(self._gen_t)
        target = min(nxt, until)
        if not math.isfinite(target):
            return
        span = self.workload.chunk_span
        k = math.floor(target / span)
        if k * span > self._gen_t:
            self._gen_t = k * span

    def _generate_through(self, t: float) -> None:
        """Generate chunks until they cover time ``t``."""
        while self._gen_t <= t:
            self._skip_empty_chunks(t)
            self._generate()

    def _arrive_timed(self) -> int:
        """Continuous time: requests with arrival time <= now join; an idle server jumps ahead."""
        self._generate_through(self._now)
        lo = self.n_arrived
        if self.n_queued == 0 and self.n_active == 0:  # idle: jump to the next arrival
            while lo >= self.n_req and not self._workload_done():
                self._skip_empty_chunks(math.inf)
                self._generate()
            if lo < self.n_req and self._arel[lo] > self._now:
                self._now = float(self._arel[lo])
                self._generate_through(self._now)
        hi = lo + int(np.searchsorted(self._arel[lo : self.n_req], self._now, side="right"))
        k = hi - lo
        self.n_arrived = hi
        self.last_arrivals = k
        self.last_rejected = 0
        if k == 0:
            return 0
        self.arrival[lo:hi] = self.t
        rej = self.rejected[lo:hi]
        n_rej = int(rej.sum())
        self.total_arrived += k
        ids = lo + np.flatnonzero(~rej) if n_rej else np.arange(lo, hi, dtype=_I64)
        self.total_rejected += n_rej
        self.last_rejected = n_rej
        if ids.size:
            self.n_queued += ids.size
            self.queued_prompt_tokens += int(self.prompt[ids].sum())
            self._enqueue(ids)
        return k

    def _workload_done(self) -> bool:
        """No request will ever come after those generated."""
        total = self._total_requests
        if total is not None:
            return self._id_base + self.n_req >= total
        rate = self.workload.arrival_rate()
        return rate is None or rate <= 0

    def _enqueue(self, ids: np.ndarray) -> None:
        """Put requests in their lanes at their places in the queue order."""
        keys = self.order.keys(self, ids)
        if not self.order.keys_are_ids:
            o = np.argsort(keys, kind="stable")
            ids, keys = ids[o], keys[o]
        c = self.cls[ids] if (self.per_class or self.track_class_queue) else None
        if self.per_class:
            assert c is not None
            for kk in range(self.m):
                sel = c == kk
                if sel.any():
                    self.lanes[kk].push(ids[sel], keys[sel])
        else:
            self.lanes[0].push(ids, keys)
        if self.track_class_queue:
            self.class_queue += np.bincount(c, minlength=self.m)

    def _admit(self, budget: Any) -> int:
        """Phase 2: activate up to ``budget`` queue heads; returns how many started."""
        if self._use_jit:
            return self._admit_jit(budget)
        if self.per_class:
            parts = []
            for lane, b in zip(self.lanes, budget):
                k = min(int(b), len(lane))
                if k:
                    parts.append(lane.pop(k))
            if not parts:
                return 0
            ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
        else:
            lane = self.lanes[0]
            k = min(int(budget), len(lane))
            if k == 0:
                return 0
            ids = lane.pop(k)
        k = ids.size
        tail = self._tail
        if tail + k > self._a_id.size:
            self._compact(room=k)
            tail = self._tail
        t = self.t
        self._a_id[tail : tail + k] = ids
        self._a_start[tail : tail + k] = t
        fin = self.output[ids] + t  # finishes at f_i = t + o_i unless evicted
        self._a_fin[tail : tail + k] = fin
        self.finish[ids] = fin  # provisional: reads report -1 until f_i <= t
        cal_n, cal_tok, mask = self._cal_n, self._cal_tok, self._cal_mask
        p = 0
        for f, l in zip(fin.tolist(), self.prompt[ids].tolist()):
            i = f & mask
            cal_n[i] += 1
            cal_tok[i] += l + f - t  # l + o
            p += l
        if self.track_class_queue:
            self.class_queue -= np.bincount(self.cls[ids], minlength=self.m)
        self._admitted(k, p)
        return k

    def _admit_jit(self, budget: Any) -> int:
        """:meth:`_admit` with the compiled kernels: same order, same state."""
        if self.per_class:
            ks = [min(int(b), len(lane)) for lane, b in zip(self.lanes, budget)]
            k = sum(ks)
        else:
            lane = self.lanes[0]
            k = min(int(budget), lane.tail - lane.head)
            ks = [k]
        if k == 0:
            return 0
        if self._tail + k > self._a_id.size:
            self._compact(room=k)
        tail, p = self._tail, 0
        for lane, kk in zip(self.lanes, ks):
            if kk:
                p += kernels.admit_lane(lane.buf, lane.head, kk, self._a_id, self._a_start, self._a_fin, tail, self.t,
                                     self.output, self.prompt, self.finish, self._cal_n, self._cal_tok)
                if self.track_class_queue:
                    kernels.count_classes(lane.buf, lane.head, kk, self.cls, self.class_queue)
                lane.drop(kk)
                tail += kk
        self._admitted(k, p)
        return k

    def _admitted(self, k: int, p: int) -> None:
        """Counts after ``k`` requests holding ``p`` prompt tokens became active (tail not yet moved)."""
        self.held += p
        self.queued_prompt_tokens -= p
        self.n_queued -= k
        self.n_active += k
        self._tail += k
        self._adm_prompt = p

    def _compact(self, room: int = 0) -> None:
        """Drop dead entries from the active arrays (keeping order); make ``room``."""
        h, tail = self._h, self._tail
        alive = self._a_fin[h:tail] > self.t
        n = self.n_active
        cap = self._a_id.size
        if n + room > cap // 2:
            cap = max(2 * cap, 2 * (n + room))
        for name in ("_a_id", "_a_start", "_a_fin"):
            old = getattr(self, name)
            kept = old[h:tail][alive]
            if cap != old.size:
                new = np.empty(cap, _I64)
                new[:n] = kept
                setattr(self, name, new)
            else:
                old[:n] = kept
        self._h, self._tail = 0, n

    def _alive(self) -> np.ndarray:
        """Window positions (relative to ``_h``) of the alive active entries."""
        return np.flatnonzero(self._a_fin[self._h : self._tail] > self.t)

    def _evict(self, excess: int) -> tuple[int, int]:
        if self._evict_code >= 0:
            return self._evict_jit(excess)
        t, h = self.t, self._h
        wpos = self._alive()
        ids = self._a_id[h : self._tail][wpos]
        gen = t - self._a_start[h : self._tail][wpos]  # j_i: tokens generated before this slot
        demand = self.prompt[ids] + gen + 1
        est = np.maximum(self.estimate[ids], gen + 1) if self.track_estimates else None
        pos = np.asarray(self.eviction.select(ActiveSet(ids, demand, gen, est), excess), dtype=_I64)
        if pos.size == 0 or int(demand[pos].sum()) < excess:
            raise RuntimeError(f"eviction rule {self.eviction.name!r} did not free {excess} tokens")
        victims = ids[pos]
        j = gen[pos]
        new = j == 0  # admitted this slot (started at t): their prefill does not run
        if self.timed and new.any():
            self._ev_new_n = int(new.sum())
            self._ev_new_prompt = int(self.prompt[victims[new]].sum())
        freed_held = int((demand[pos] - 1).sum())
        wasted = int(j.sum())
        fin = self._a_fin[h + wpos[pos]]
        self._a_fin[h + wpos[pos]] = -1
        cal_n, cal_tok, mask = self._cal_n, self._cal_tok, self._cal_mask
        for f, w in zip(fin.tolist(), (self.prompt[victims] + self.output[victims]).tolist()):
            cal_n[f & mask] -= 1
            cal_tok[f & mask] -= w
        self.finish[victims] = -1
        self.n_active -= victims.size
        self.held -= freed_held
        self.evictions[victims] += 1
        self.wasted_tokens += wasted
        self.total_evictions += victims.size
        self.overflow_events += 1
        if est is not None:  # o_i > j_i is now known: raise the estimate
            self.estimate[victims] = est[pos]
        # back to the queue at their places (they keep their arrival)
        self.n_queued += victims.size
        self.queued_prompt_tokens += int(self.prompt[victims].sum())
        self._enqueue(np.sort(victims))
        return victims.size, wasted

    def _evict_jit(self, excess: int) -> tuple[int, int]:
        """:meth:`_evict` with the compiled kernel (built-in rules): same victims, same state."""
        buf = self._ev_buf
        if buf.size < self._tail - self._h:
            buf = self._ev_buf = np.empty(self._a_id.size, _I64)
        nv, freed, wasted, new_n, new_p, psum = kernels.evict(
            self._evict_code, self._a_id, self._a_start, self._a_fin, self._h, self._tail, self.t, self.prompt,
            self.output, self.estimate, self.track_estimates, excess, self._cal_n, self._cal_tok, self.finish,
            self.evictions, buf)
        if nv == 0:
            raise RuntimeError(f"eviction rule {self.eviction.name!r} did not free {excess} tokens")
        if self.timed and new_n:
            self._ev_new_n, self._ev_new_prompt = new_n, new_p
        self.n_active -= nv
        self.held -= freed
        self.wasted_tokens += wasted
        self.total_evictions += nv
        self.overflow_events += 1
        self.n_queued += nv
        self.queued_prompt_tokens += psum
        self._enqueue(buf[:nv].copy())
        return nv, wasted

    def _check_budget(self, budget: Any) -> None:
        """``ValueError`` unless ``budget`` is a non-negative integer, or with ``per_class`` one per class (both
        engine modes: a negative count would pop the queue backwards, and the compiled kernels trust it)."""
        if self.per_class:
            if isinstance(budget, (str, bytes)) or np.ndim(budget) != 1:
                raise ValueError(f"per-class budgets: {self.m} classes, got {budget!r}")
            if len(budget) != self.m:
                raise ValueError(f"per-class budgets: {self.m} classes, got {len(budget)} budgets: "
                                 f"{list(np.asarray(budget).tolist())!r}")
            a = budget if isinstance(budget, np.ndarray) else np.asarray(budget)
            if holds_bool(budget):
                ok = False
            elif a.dtype.kind in "iu":  # the env's own int64 arrays: one vectorised comparison
                ok = a.size == 0 or int(a.min()) >= 0
            elif a.dtype.kind == "f":
                ok = bool(np.all(np.isfinite(a) & (a >= 0) & (a == np.floor(a))))
            else:  # strings, objects
                ok = False
            if not ok:
                raise ValueError(f"per-class budgets must be non-negative integers, got "
                                 f"{list(np.asarray(budget).tolist())!r}")
        elif not is_count(budget):
            raise ValueError(f"budget must be a non-negative integer, got {budget!r}")

    def serve(self, budget: int | Sequence[int] | np.ndarray) -> SlotStats:
        """Phases 2-5 of slot ``t`` with activation budget ``budget``; then ``t += 1``.

        ``budget`` is ``B_t`` (an int >= 0), or with ``per_class`` one budget per class
        (``ValueError`` when their number is not the number of classes or one is not an integer >= 0).
        """
        self._check_budget(budget)
        t = self.t
        d = None
        if self.timed:
            if t - self._clock_base >= self._clock.size:
                self._clock = np.concatenate([self._clock, np.zeros_like(self._clock)])
            if self._preview:  # user code: get the duration before anything changes
                d = self._preview_duration(budget)
        n_adm = self._admit(budget)
        demand = self.held + self.n_active
        n_ev = wasted = 0
        if demand > self.M:
            n_ev, wasted = self._evict(demand - self.M)
            demand = self.held + self.n_active
        if self.timed:
            self._advance_clock(n_adm, d)
        # decode: every active request generates one token
        self.held = demand
        self.generated_tokens += self.n_active
        i = (t + 1) & self._cal_mask
        n_done = int(self._cal_n[i])
        self.last_completed_tokens = 0
        if n_done:
            self.last_completed_tokens = int(self._cal_tok[i])
            self.held -= self.last_completed_tokens
            self._cal_n[i] = 0
            self._cal_tok[i] = 0
            self.n_active -= n_done
            self.total_completed += n_done
        st = SlotStats(t, demand, n_adm, n_ev, wasted, n_done, self.n_queued, self.n_active)
        pending = self._pending
        pending.append(st)
        self.t = t + 1
        if self._tail - self._h - self.n_active > max(256, self.n_active):
            self._compact()
        if len(pending) == 256:  # one numpy write per 256 slots instead of one per slot
            self._flush_records()
            if self._stream is not None:
                self._maybe_recycle()
        return st

    # ------------------------------------------------------------------ compiled episodes

    def rule_unsupported(self, rule: AdmissionRule) -> str | None:
        """Why :meth:`run_rule` cannot run ``rule`` on this engine (``None`` when it can)."""
        rule.check()
        if type(self) is not Engine:  # another engine mode (e.g. vllm-v1) serves differently
            return f"engine {type(self).__name__} (the compiled loop is the paper's engine)"
        if not self._use_jit:
            return "the compiled kernels are off (numba missing, FLOWGYM_JIT=0 or Engine.jit=False)"
        if not self.timed:
            return "discrete slots (the compiled loop is for continuous time)"
        if self.record != "full":
            return "record='stream'"
        if self.per_class or self.track_class_queue:
            return "per-class budgets or per-class queue counts"
        if type(self.order) not in (FIFO, ShortestEstimateFirst):
            return f"queue_order {self.order.name!r} (the loop has fifo and estimate)"
        if self._evict_code < 0:
            return f"eviction rule {self.eviction.name!r} is not a built-in one"
        if type(self.time_model) not in (LinearLatency, JailletLatency):
            return f"time model {type(self.time_model).__name__} (the loop has linear and jaillet)"
        if rule.lengths == "estimate" and rule.kind == "future-fit" and not self.track_estimates:
            return "estimated lengths need an order or eviction rule that tracks estimates"
        return None

    def run_rule(self, rule: AdmissionRule, horizon: int | None = None, max_iterations: int | None = None) -> int:
        """Run iterations with the budget ``rule`` gives, compiled, from a decision point (after
        :meth:`arrive`) until the run ends, as a loop of ``serve(rule's budget)`` then ``arrive()``
        would; returns the iterations run.

        The run ends when the workload is exhausted and the system empty, at slot ``horizon``, or
        after ``max_iterations``. Every state, log and record is what that Python loop leaves
        (``tests/test_compiled_episode.py``). ``ValueError`` names what this engine has that the
        compiled loop lacks (:meth:`rule_unsupported`).
        """
        why = self.rule_unsupported(rule)
        if why is not None:
            raise ValueError(f"run_rule cannot run here: {why}")
        assert self.time_model is not None
        self._flush_records()
        pol = np.array([ADMISSION_KINDS[rule.kind], rule.budget, rule.max_count, ADMISSION_LENGTHS[rule.lengths],
                        rule.bound], _I64)
        tm = self.time_model
        if isinstance(tm, LinearLatency):
            lat, coef = 0, (tm.c0, tm.c_prefill, tm.c_decode, tm.c_kv)
        else:
            lat, coef = 1, (tm.a, tm.b, tm.c, tm.p)
        if (horizon is not None and self.t >= horizon) or (self.exhausted and self.in_system == 0):
            return 0  # the run has already ended: serve nothing (as a stepping loop would not step)
        limit = np.iinfo(_I64).max if max_iterations is None else int(max_iterations)
        keyed = not self.order.keys_are_ids
        ran = 0
        S = np.zeros(kernels.S_LIMIT + 1, _I64)
        F = np.zeros(7, np.float64)
        F[3:7] = coef
        while True:
            lane = self.lanes[0]
            for f, name in _S_FIELDS:
                S[f] = getattr(self, name) if name else 0
            S[kernels.S_TOTAL] = -1 if self._total_requests is None else self._total_requests
            S[kernels.S_QHEAD], S[kernels.S_QTAIL] = lane.head, lane.tail
            S[kernels.S_HORIZON] = -1 if horizon is None else int(horizon)
            S[kernels.S_LIMIT] = min(limit - ran, _RUN_SLICE)  # back to Python now and then (Ctrl-C works)
            F[0], F[1] = self._now, self.last_duration
            # every request drawn: no chunk left to draw (a schedule whose rate ends at 0 still
            # has requests in the chunks before that)
            done = self._total_requests is not None and self._id_base + self.n_req >= self._total_requests
            F[2] = math.inf if done else self._gen_t
            t0 = self.t
            status = kernels.run_timed(
                S, F, pol, float(rule.limit), lat, self.arrival, self._arel, self.prompt, self.output,
                self.finish, self.evictions, self.rejected, self.estimate, self.track_estimates, keyed,
                keyed, lane.buf, lane.kbuf, self._a_id, self._a_start, self._a_fin, self._cal_n, self._cal_tok,
                self._rec, self._clock, self._evict_code, self.M, self._ev_buf)
            for f, name in _S_FIELDS:
                if name:
                    setattr(self, name, int(S[f]))
            lane.head, lane.tail = int(S[kernels.S_QHEAD]), int(S[kernels.S_QTAIL])
            self._now, self.last_duration = float(F[0]), float(F[1])
            ran += self.t - t0
            if status == kernels.RUN_DONE or (status == kernels.RUN_LIMIT and ran >= limit):
                return ran
            if status == kernels.RUN_LIMIT:
                continue
            if status == kernels.RUN_ARRIVE:
                self.arrive()
                continue
            # RUN_GROW: make every buffer roomy enough, then go on from the same decision point
            need = int(S[kernels.S_NEED])
            if need < 0:
                raise RuntimeError(f"eviction rule {self.eviction.name!r} did not free enough tokens")
            if self._rec_n >= self._rec.shape[0]:
                grown = np.zeros((2 * self._rec.shape[0], self._rec.shape[1]), _I64)
                grown[: self._rec_n] = self._rec[: self._rec_n]
                self._rec = grown
            if self.t - self._clock_base >= self._clock.size:
                self._clock = np.concatenate([self._clock, np.zeros_like(self._clock)])
            bound = self.n_queued + self.n_active + (self.n_req - self.n_arrived)
            if bound + need + 1 > lane.buf.size:  # need: this iteration's admissions
                lane._reserve(bound + need + 1 - len(lane))
            if self._tail + need > self._a_id.size:
                self._compact(room=need)
            if self._ev_buf.size < self._tail - self._h + need:
                self._ev_buf = np.empty(2 * (self._tail - self._h + need), _I64)

    def _flush_records(self) -> None:
        """Write the pending slot records into ``_rec`` (growing it), or in streaming mode fold them."""
        pending = self._pending
        if not pending:
            return
        if self._stream is not None:
            times = None
            if self.timed:
                lo = self._rec_n - self._clock_base
                times = self._clock[lo : lo + len(pending)]
            self._stream.fold_slots(pending, times)
            self._rec_n += len(pending)
            pending.clear()
            return
        lo = self._rec_n
        hi = lo + len(pending)
        if hi > self._rec.shape[0]:
            grown = np.zeros((max(2 * self._rec.shape[0], hi), self._rec.shape[1]), _I64)
            grown[:lo] = self._rec[:lo]
            self._rec = grown
        self._rec[lo:hi] = pending
        self._rec_n = hi
        pending.clear()

    def _advance_clock(self, n_adm: int, d: float | None = None) -> None:
        """Continuous time: this iteration's duration from its composition (after eviction).

        ``d``: the duration :meth:`_preview_duration` computed before the step (then checked
        to be for the same composition)."""
        assert self.time_model is not None
        new_n = n_adm - self._ev_new_n
        P = (self._adm_prompt if n_adm else 0) - self._ev_new_prompt
        self._ev_new_n = self._ev_new_prompt = 0
        D = self.n_active - new_n
        K = self.held - P
        if d is None:
            d = self.time_model.duration(P, D, K, self.n_active)
        elif self._previewed != (P, D, K, self.n_active):
            raise RuntimeError(f"eviction rule {self.eviction.name!r} chose differently for the same active set "
                               f"(iteration {self._previewed} previewed, {(P, D, K, self.n_active)} run): "
                               "with a callable time_model eviction rules must be deterministic")
        self.last_duration = d
        self._now += d
        self._clock[self.t - self._clock_base] = self._now

    def _preview_duration(self, budget: Any) -> float:
        """This iteration's duration, computed from what admission and eviction will do, changing nothing.

        Used when the latency model runs user code (a callable): if it raises, the step has not
        started (a retry does not admit twice). Admission takes the queue heads; eviction asks the
        rule about the active set after admission, as :meth:`_evict` will (rules are pure).
        """
        assert self.time_model is not None
        if self.per_class:
            heads = [ln.items()[: max(0, min(int(b), len(ln)))] for ln, b in zip(self.lanes, budget)]
            adm = np.concatenate(heads) if heads else np.zeros(0, _I64)
        else:
            ln = self.lanes[0]
            adm = ln.items()[: max(0, min(int(budget), len(ln)))]
        k = int(adm.size)
        P = int(self.prompt[adm].sum())
        n_act, held, new_n = self.n_active + k, self.held + P, k
        if held + n_act > self.M:
            excess = held + n_act - self.M
            ids = np.concatenate([self.active_ids(), adm])
            gen = np.concatenate([self.active_generated(), np.zeros(k, _I64)])
            demand = self.prompt[ids] + gen + 1
            est = np.maximum(self.estimate[ids], gen + 1) if self.track_estimates else None
            pos = np.asarray(self.eviction.select(ActiveSet(ids, demand, gen, est), excess), dtype=_I64)
            if pos.size == 0 or int(demand[pos].sum()) < excess:
                raise RuntimeError(f"eviction rule {self.eviction.name!r} did not free {excess} tokens")
            new = gen[pos] == 0
            new_n -= int(new.sum())
            P -= int(self.prompt[ids[pos][new]].sum())
            n_act -= int(pos.size)
            held -= int((demand[pos] - 1).sum())
        self._previewed = (P, n_act - new_n, held - P, n_act)
        return self.time_model.duration(P, n_act - new_n, held - P, n_act)

    # ------------------------------------------------------------------ streaming mode

    def _maybe_recycle(self) -> None:
        """Streaming mode, every 256 slots: recycle once the dead rows outnumber the live ones
        (amortised O(1) per request), or the clock holds many slots no longer needed."""
        st = self._stream
        assert st is not None
        dead = (self.total_completed - st.done) + (self.total_rejected - st.rejected)
        if dead >= max(_RECYCLE_MIN, self.n_req - dead) or (
                self.timed and self.t - self._clock_base > 4 * st.window + _RECYCLE_MIN):
            self._recycle()

    def _recycle(self) -> None:
        """Streaming mode: fold the finished requests into the running sums, drop the finished and
        rejected rows from the request table and renumber the rows left (order kept, so FIFO
        and the keyed orders' ties are unchanged); trim the clock to the slots still needed."""
        st = self._stream
        assert st is not None
        t, na, n = self.t, self.n_arrived, self.n_req
        fin = self.finish[:na]
        rej = self.rejected[:na]
        done = (fin >= 0) & (fin <= t)
        ids = np.flatnonzero(done)
        if ids.size:
            f = fin[ids]
            if self.timed:
                lat: np.ndarray = self._clock[f - 1 - self._clock_base] - self._arel[ids]
            else:
                lat = f - self.arrival[ids]
            st.fold_requests(lat, self.output[ids])
        st.rejected += int(rej.sum())
        keep = ~(done | rej)
        d = na - int(keep.sum())
        if d:
            self._compact()  # the active window then holds alive entries only (all kept rows)
            newid = np.cumsum(keep) - 1  # new row of each kept arrived row
            rows = np.concatenate([np.flatnonzero(keep), np.arange(na, n, dtype=_I64)])
            m = rows.size
            cap = self.arrival.size
            new_cap = max(1024, 2 * m) if cap > 4 * m else cap
            for name in self._table_names():
                old = getattr(self, name)
                kept = old[rows]
                if new_cap != cap:
                    new = np.empty(new_cap, old.dtype)
                    new[:m] = kept
                    setattr(self, name, new)
                else:
                    old[:m] = kept
            self._realias()
            for lane in self.lanes:  # queued requests: renumber ids (and the id bits of keys)
                h, tl = lane.head, lane.tail
                if tl > h:
                    q = newid[lane.buf[h:tl]]
                    lane.buf[h:tl] = q
                    if lane.keyed:
                        lane.kbuf[h:tl] = ((lane.kbuf[h:tl] >> _ID_BITS) << _ID_BITS) | q
            a = self._a_id[self._h : self._tail]
            a[:] = newid[a]
            self.n_req -= d
            self.n_arrived -= d
            self._id_base += d
            self._chunk_base -= d
            self._bounds = [b - d for b in self._bounds]
        if self.timed:  # active requests finish after t: only the series window needs older slots
            base = max(self._clock_base, t - st.window)
            if base > self._clock_base:
                kept_c = self._clock[base - self._clock_base : t - self._clock_base]
                clock = np.zeros(max(256, 2 * kept_c.size), np.float64)
                clock[: kept_c.size] = kept_c
                self._clock, self._clock_base = clock, base

    def memory_bytes(self) -> int:
        """Bytes held by the engine's arrays (request table, active set, queue, calendar, records)."""
        total = 0
        for name in self._table_names() + ("_a_id", "_a_start", "_a_fin", "_clock", "_rec"):
            total += getattr(self, name).nbytes
        for lane in self.lanes:
            total += lane.buf.nbytes + (lane.kbuf.nbytes if lane.keyed else 0)
        if isinstance(self._cal_n, np.ndarray):
            total += self._cal_n.nbytes + self._cal_tok.nbytes
        if self._stream is not None:
            total += self._stream.nbytes
        return total

    def metrics(self) -> dict[str, Any]:
        """The metrics of ``docs/model.md`` over the slots run so far (:func:`~flowgym.sim.metrics.metrics_at` of
        the ``t`` slots run: mid-episode, the requests that joined at decision point ``t`` are not counted yet).

        In ``record="full"`` mode computed from :meth:`request_log` and :meth:`series`. In
        ``record="stream"`` mode from running sums: every count and sum is the full mode's
        (means equal, exactly in slots, to float rounding in continuous time), ``p95_latency``
        comes from the :class:`~flowgym.sim.streaming.QuantileSketch` (exact for latencies below
        65,536 slots, otherwise within relative 0.1%), and ``kv_usage`` is the usage series in
        block means of ``kv_usage_block`` slots (at most 2,048 points).

        In continuous time the throughputs are per second of ``elapsed``, from :attr:`time_origin` (0
        for a generated workload, a timed trace's first arrival) to the end of the last iteration.
        """
        if self._stream is None:
            return metrics_at(self.request_log(), self.series(), self.M, self.t)
        st = self._stream
        self._flush_records()
        T, na, base = self.t, self.n_arrived, self._clock_base
        fin = self.finish[:na]
        rej = self.rejected[:na]
        done = (fin >= 0) & (fin <= T)
        # requests that joined at decision point T (arrive() ran for the next slot): not in the T slots run
        late = self.arrival[:na] >= T
        n_late, n_late_rej = int(late.sum()), int((late & rej).sum())
        waiting = ~(done | rej | late)  # arrived by T, not rejected, not finished
        ids = np.flatnonzero(done)
        lat_sum: int | float
        if self.timed:  # on the clock inside
            span = float(self._clock[T - 1 - base]) if T else 0.0
            lat: np.ndarray = self._clock[fin[ids] - 1 - base] - self._arel[ids]
            lat_sum = st.latency + float(lat.sum())
            rest: int | float = float((span - self._arel[:na][waiting]).sum())
            elapsed = span - (self.time_origin - self._shift) if T else 0.0  # seconds from time_origin
        else:
            span = elapsed = float(T)
            lat = fin[ids] - self.arrival[ids]
            lat_sum = st.latency + int(lat.sum())
            rest = int((T - self.arrival[:na][waiting]).sum())
        n_done = st.done + int(ids.size)
        sketch = st.sketch.copy()
        sketch.add(lat)
        out_tokens = st.output_tokens + int(self.output[ids].sum())
        arrived, rejected = self.total_arrived - n_late, self.total_rejected - n_late_rej
        n_ok = arrived - rejected
        mean_u, std_u, max_u = st.usage_moments(self.M)
        nan = float("nan")
        return {
            "T": T,
            "elapsed": elapsed,
            "avg_latency": lat_sum / n_done if n_done else nan,
            "p95_latency": sketch.quantile(0.95) if n_done else nan,
            "mean_time_in_system": (lat_sum + rest) / n_ok if n_ok else nan,
            "request_throughput": n_done / elapsed if elapsed else nan,
            "token_throughput": float(out_tokens) / elapsed if elapsed else nan,
            "generated_token_throughput": float(self.generated_tokens) / elapsed if elapsed else nan,
            "completed": n_done,
            "arrived": arrived,
            "rejected": rejected,
            "unfinished": arrived - rejected - n_done,
            "evictions": self.total_evictions,
            "overflow_events": self.overflow_events,
            "wasted_tokens": self.wasted_tokens,
            "mean_kv_usage": mean_u,
            "std_kv_usage": std_u,
            "max_kv_usage": max_u,
            "kv_usage": st.decimated_usage(self.M),
            "kv_usage_block": st.dec_block,
        }

    def _refuse_in_stream(self, what: str) -> None:
        if self._stream is not None:
            raise ValueError(f"{what} needs every request's history, which record='stream' does not keep "
                             "(finished requests are folded into running sums): use record='full', or "
                             "metrics() for the streaming totals")

    # ------------------------------------------------------------------ reading

    @property
    def exhausted(self) -> bool:
        """True when the workload is finite and every request has arrived."""
        return self._total_requests is not None and self._id_base + self.n_arrived >= self._total_requests

    @property
    def in_system(self) -> int:
        """Requests queued or active."""
        return self.n_queued + self.n_active

    def queue_ids(self) -> np.ndarray:
        """Ids of queued requests in admission order (per-class lanes in class order)."""
        if len(self.lanes) == 1:
            return self.lanes[0].items().copy()
        return np.concatenate([ln.items() for ln in self.lanes])

    def active_ids(self) -> np.ndarray:
        """Ids of active requests in activation order (oldest first)."""
        return self._a_id[self._h : self._tail][self._alive()]

    def active_starts(self) -> np.ndarray:
        """Activation slot of each active request (activation order, so ascending)."""
        h, tail = self._h, self._tail
        if tail - h == self.n_active:
            return self._a_start[h:tail].copy()
        return self._a_start[h:tail][self._a_fin[h:tail] > self.t]

    def active_generated(self) -> np.ndarray:
        """Tokens generated so far by each active request (activation order)."""
        return self.t - self.active_starts()

    def active_remaining(self) -> np.ndarray:
        """Tokens each active request still has to generate (uses output lengths)."""
        return self._a_fin[self._h : self._tail][self._alive()] - self.t

    def generated_histogram(self, edges: np.ndarray, out: np.ndarray | None = None, offset: int = 0) -> np.ndarray:
        """Active requests by tokens generated, in bins ``[edges[k], edges[k+1])`` (last open).

        ``edges``: int64, ascending from 0. Returns a new int64 array, or with
        ``out`` writes ``out[offset : offset + edges.size]`` and returns ``out``.
        Uses that activation slots are sorted.
        """
        h, tail = self._h, self._tail
        if self._use_jit:
            if out is None:
                out, offset = np.empty(edges.size, _I64), 0
            kernels.histogram_into(self._a_start, self._a_fin, h, tail, self.t, edges, out, offset)
            return out
        starts = self._a_start[h:tail]  # a view: searchsorted only reads it
        if tail - h != self.n_active:
            starts = starts[self._a_fin[h:tail] > self.t]
        # j = t - s is in [e_k, e_{k+1})  <=>  t - e_{k+1} < s <= t - e_k
        P = starts.searchsorted(self.t - edges, side="right")
        hist = np.empty(edges.size, _I64)
        np.subtract(P[:-1], P[1:], out=hist[:-1])
        hist[-1] = P[-1]
        if out is None:
            return hist
        out[offset : offset + edges.size] = hist
        return out

    def projected_demand(self, offsets: np.ndarray) -> np.ndarray:
        """``D_{t+h}`` of the current active set for each ``h`` in ``offsets``, if nothing were admitted or evicted.

        Uses output lengths. A request finishing at ``f = t + u`` holds ``l + j + h + 1``
        tokens at ``t + h`` while ``u > h``; summed with the completion calendar
        (no pass over the active set): with ``act[u]`` the requests still active at
        ``t + u`` and ``tok[h]`` the ``l + o`` tokens released by ``t + h``,
        ``D_{t+h} = held + sum_{u < h} act[u] - tok[h] + act[h]``. ``h = 0`` is
        this slot's demand before admission.
        """
        act = self.n_active
        out = np.zeros(offsets.size, _I64)
        if act == 0:
            return out
        if self._use_jit:
            kernels.projected_demand(self.held, act, self.t, self._cal_mask, self._cal_n, self._cal_tok,
                                  np.asarray(offsets, _I64), out)
            return out
        held = self.held
        D = [held + act]
        t, mask, cal_n, cal_tok = self.t, self._cal_mask, self._cal_n, self._cal_tok
        sum_act = tok = 0
        for u in range(t + 1, t + 1 + int(offsets.max())):
            sum_act += act
            i = u & mask
            act -= cal_n[i]
            tok += cal_tok[i]
            if act == 0:  # everyone has finished: D is 0 from here on
                break
            D.append(held + sum_act - tok + act)
        n = len(D)
        for j, h in enumerate(offsets.tolist()):
            if h < n:
                out[j] = D[h]
        return out

    def series(self) -> dict[str, np.ndarray]:
        """Per-slot records so far: one array per :class:`SlotStats` field, and in continuous time
        ``time``, the end of each iteration in seconds of the workload's time base (that of the
        request log's ``arrival_time`` and ``finish_time``), and ``elapsed``, the same instants in
        seconds from :attr:`time_origin`, the run's start (the throughputs divide by its last value).

        With ``record="stream"`` only the last :data:`~flowgym.sim.streaming.STREAM_WINDOW`
        slots (their slot numbers in ``t``).
        """
        self._flush_records()
        if self._stream is not None:
            rows, times = self._stream.window_rows()
            win = {name: rows[:, i].copy() for i, name in enumerate(SlotStats._fields)}
            if self.timed:
                win.update(self._clock_series(times))
            return win
        rec = self._rec[: self.t]
        out = {name: rec[:, i].copy() for i, name in enumerate(SlotStats._fields)}
        if self.timed:
            out.update(self._clock_series(self._clock[: self.t]))
        return out

    def _clock_series(self, clock: np.ndarray) -> dict[str, np.ndarray]:
        """``time`` and ``elapsed`` of :meth:`series` from iteration end times on the clock inside (new arrays)."""
        off = self._shift - self.time_origin  # 0 when the clock inside runs from time_origin
        return {"time": clock + self._shift if self._shift else clock.copy(),
                "elapsed": clock + off if off else clock.copy()}

    def request_log(self) -> dict[str, np.ndarray]:
        """Per-request arrays for every request that has arrived (by id).

        Keys: ``arrival``, ``prompt_len``, ``output_len``, ``cls``, ``finish``
        (``-1`` if unfinished), ``evictions``, ``rejected``. In continuous time
        ``arrival`` and ``finish`` count iterations, and ``arrival_time`` and
        ``finish_time`` (``nan`` if unfinished) are in seconds of the workload's time base (a timed
        trace's own timestamps, ``arrival_time`` exactly as given). Refused (``ValueError``) with
        ``record="stream"``.
        """
        self._refuse_in_stream("request_log()")
        n = self.n_arrived
        finish = self.finish[:n].copy()
        finish[finish > self.t] = -1  # scheduled, not finished yet
        return {
            "arrival": self.arrival[:n].copy(),
            "prompt_len": self.prompt[:n].copy(),
            "output_len": self.output[:n].copy(),
            "cls": self.cls[:n].copy(),
            "finish": finish,
            "evictions": self.evictions[:n].copy(),
            "rejected": self.rejected[:n].copy(),
            **self._times(finish),
        }

    def _times(self, finish: np.ndarray) -> dict[str, np.ndarray]:
        if not self.timed:
            return {}
        ft = np.full(finish.size, np.nan)
        done = finish > 0
        ft[done] = self._clock[finish[done] - 1] + self._shift  # in the workload's time base
        return {"arrival_time": self.arrival_time[: finish.size].copy(), "finish_time": ft}


# --------------------------------------------------------------------------- replay


def replay(
    arrival: Sequence[int] | np.ndarray,
    prompt_len: Sequence[int] | np.ndarray,
    output_len: Sequence[int] | np.ndarray,
    *,
    M: int,
    budgets: int | Sequence[int] | np.ndarray,
    eviction: str | EvictionRule = "lifo",
    horizon: int | None = None,
    classes: Sequence[int] | np.ndarray | None = None,
    queue_order: str | QueueOrder = "fifo",
    estimate_floor: int = 1,
) -> dict[str, Any]:
    """Replay a trace under given activation budgets; the reference entry point of the spec.

    Args:
        arrival, prompt_len, output_len: one entry per request (any order).
        M: KV-cache budget.
        budgets: ``B_t`` for every slot (an int), or a sequence with ``B_t`` per
            slot (0 past its end); with ``classes``, a sequence of ``m``
            per-class budgets ``b_k`` applied every slot (Algorithm 1).
        eviction: ``"lifo"``, ``"all"`` or ``"estimate"``.
        horizon: slots to run; ``None`` runs until every request has arrived and
            the system is empty (raising if that has not happened after
            ``last arrival + 10 * sum of (l + o) + 100`` slots, e.g. a zero budget, or under eviction
            ``"all"`` a budget that overflows the cache in every slot; the message says which).
        classes: class id per request (0..m-1) for per-class budgets.
        queue_order: ``"fifo"`` (the spec's order), ``"sjf"`` or ``"estimate"``.
        estimate_floor: every request's first output estimate, for ``eviction="estimate"`` and
            ``queue_order="estimate"`` (the engine's default 1; the environment's default is the
            workload's shortest output, ``FlowControlConfig.estimate_floor``).

    Returns:
        a dict with per-request arrays in the input's order (``finish``,
        ``evictions``, ``rejected``, ``arrival``, ``prompt_len``,
        ``output_len``), per-slot arrays (``usage``, ``queue_len``, ``active``,
        ``completed``, ``evicted``, ``admitted``) and totals
        (``wasted_tokens``, ``overflow_events``, ``slots``).
    """
    per_class = classes is not None
    if horizon is not None and not is_count(horizon):
        raise ValueError(f"horizon must be a non-negative integer (slots) or None, got {horizon!r}")
    if isinstance(budgets, (str, bytes)):
        raise ValueError(f"budgets must be an integer or a sequence of integers, got {budgets!r}")
    if np.ndim(budgets) == 0:
        if not is_count(budgets):
            raise ValueError(f"budgets must be a non-negative integer or a sequence of them, got {budgets!r}")
    else:
        if holds_bool(budgets):
            raise ValueError(f"budgets must hold integers, got {budgets!r}: it holds a bool")
        int_array("budgets", np.asarray(budgets).ravel(), None, 0)
    b = np.asarray(budgets, dtype=_I64)
    trace = Trace(arrival, prompt_len, output_len, cls=classes, num_classes=b.size if per_class else None)
    eng = Engine(M, trace, eviction=eviction, queue_order=queue_order, per_class=per_class,
                 estimate_floor=estimate_floor)
    if per_class:
        if b.ndim != 1 or b.size != eng.m:
            raise ValueError(f"with classes, budgets must hold one budget per class ({eng.m}), got {budgets!r}")

        def budget_at(t: int) -> Any:
            return b

    elif np.ndim(budgets) == 0:
        b0 = int(budgets)  # type: ignore[arg-type]

        def budget_at(t: int) -> Any:
            return b0

    else:
        bl = [int(x) for x in np.asarray(budgets).ravel()]

        def budget_at(t: int) -> Any:
            return bl[t] if t < len(bl) else 0

    eng.reset(np.random.default_rng(0))
    n = len(trace)
    if horizon is None:
        cap = trace.last_arrival + 10 * int((trace.prompt_len + trace.output_len).sum()) + 100
        while not (eng.exhausted and eng.in_system == 0):
            if eng.t >= cap:
                last = min(100, cap)  # what the run ended doing, not what it did once
                recent = int(np.count_nonzero(eng.series()["evicted"][-last:]))
                why = (f"the cache overflowed in {recent} of the last {last} slots: a budget that admits more than the "
                       f"cache holds can evict the same requests again and again (eviction {eng.eviction.name!r})"
                       if recent else f"the cache did not overflow in the last {last} slots: the budgets leave them "
                       "waiting, and a sequence of budgets is 0 past its end")
                raise RuntimeError(f"replay did not empty the system within {cap} slots ({eng.in_system} requests still "
                                   f"in it; {why})")
            eng.arrive()
            eng.serve(budget_at(eng.t))
    else:
        for _ in range(int(horizon)):
            eng.arrive()
            eng.serve(budget_at(eng.t))
    inv = np.empty(n, _I64)
    inv[trace.row] = np.arange(n)
    log = eng.request_log()
    out: dict[str, Any] = {}
    for key, default in (("finish", -1), ("evictions", 0), ("rejected", False)):
        full = np.full(n, default, dtype=log[key].dtype)
        full[: log[key].size] = log[key]
        out[key] = full[inv]
    out["arrival"] = np.asarray(trace.arrival)[inv]
    out["prompt_len"] = np.asarray(trace.prompt_len)[inv]
    out["output_len"] = np.asarray(trace.output_len)[inv]
    s = eng.series()
    out.update(
        usage=s["usage"],
        queue_len=s["queue_len"],
        active=s["active"],
        completed=s["completed"],
        evicted=s["evicted"],
        admitted=s["admitted"],
        wasted_tokens=eng.wasted_tokens,
        overflow_events=eng.overflow_events,
        slots=eng.t,
    )
    return out
