"""Deliberately simple pure-Python reference implementation of the slot model.

This is the test oracle for ``flowgym.replay``.  It follows
``/work/shared/spec/model.md`` ("One slot t, in this order") literally, with
one Python object per request, and favours obviousness over speed.  It must
not import anything from ``flowgym``.

Phases of slot t (t = 0, 1, ..., T-1):

1. Arrive.  Requests with ``a_i == t`` arrive.  ``l_i + o_i > M`` -> rejected
   (counted, never queued).  Otherwise they join the waiting queue.
2. Admit.  The queue is sorted by the queue order's key (``queue_order``):
   - ``fifo`` (the spec's order, default): ascending ``(a_i, i)``;
   - ``sjf`` (MC-SF): ascending ``(o_i, a_i, i)``: the shortest known output
     first, ties FIFO;
   - ``estimate`` (A_min): ascending ``(e_i, a_i, i)``: the smallest current
     output estimate first, ties FIFO (estimates: see below).
   Without classes, the first ``B_t`` queued requests become active.  With
   classes and per-class budgets ``b_k`` (Algorithm 1) classes are visited in
   order k = 0..m-1 and the first ``b_k`` queued requests *of class k* (in the
   same queue order) become active.  Each activation gets an increasing
   sequence number.
3. Evict on overflow.  ``D_t = sum over active of (l_i + j_i + 1)``.  If
   ``D_t > M`` the slot is an overflow event and
   - ``lifo``: while ``D_t > M``, evict the active request with the largest
     activation sequence number (most recently activated; within a slot the
     last admitted);
   - ``all``: evict every active request;
   - ``estimate`` (A_min): while ``D_t > M``, evict the active request with
     the smallest current estimate ``max(e_i, j_i + 1)``; among equal
     estimates the most recently activated (largest sequence number).
   An evicted request: ``wasted_tokens += j_i``, ``j_i = 0``, ``evictions_i
   += 1``, back into the waiting queue with its original ``a_i``; and its
   estimate is raised: ``e_i = max(e_i, j_i + 1)`` (with ``j_i`` before it is
   reset), whatever the rule.
4. Decode.  Every active request: ``j_i += 1``; if ``j_i == o_i`` it
   completes with ``finish_i = t + 1`` and leaves the active set.
5. Record.  ``usage[t] = D_t`` after eviction (tokens held in slot t,
   including the token being generated and including requests that complete
   in this slot), ``queue_len[t]`` and ``active[t]`` after decode/completions.

Output estimates (A_min of Chen et al. 2025; the spec's "other rules a
baseline needs", documented in ``flowgym/sim/rules.py``): every request starts
with ``e_i = estimate_floor`` (default 1, the shortest possible output).  They
are lower bounds of ``o_i``: an active request that has generated ``j_i``
tokens before slot t and is still active has not finished, so ``o_i >= j_i +
1``; its *current* estimate in slot t is ``max(e_i, j_i + 1)``.  ``e_i`` itself
only changes when the request is evicted (to its current estimate then), so a
queued request is ordered by the estimate it left the batch with.  Estimates
never depend on the true ``o_i`` beyond that.

Readings chosen where the spec is silent or ambiguous (an LLM-serving
person's reading):

* ``U_t`` counts ``l_i + j_i + 1`` for every request active after eviction,
  i.e. the memory of the token generated this slot is included, and a request
  finishing in slot t is still counted in ``U_t`` (its memory is freed at the
  end of the slot, so it is *not* counted in ``U_{t+1}``).
* ``l_i + o_i == M`` is admissible (only ``> M`` is rejected).
* ``rejected[i]`` is set at the request's arrival slot.  A request whose
  arrival slot is >= the number of slots run never arrives, so it is neither
  rejected nor finished (``finish = -1``, ``rejected = False``).
* An evicted request is not re-admitted in the slot it was evicted in
  (admission for that slot already happened); from the next slot on it
  competes by its queue key: under ``fifo`` its original ``(a_i, i)``, i.e.
  ahead of later arrivals; under ``estimate`` its raised estimate.
* Several evictions in one slot count as one overflow event but as several
  evictions (one per evicted request, per eviction).
* "Most recently activated" refers to the latest activation: a request that
  was evicted and re-admitted counts as activated at its re-admission.
* With classes, the within-slot admission order (which drives LIFO) is class
  0 first, then class 1, ...; FIFO within a class.  Class budgets apply every
  slot.  An int ``budgets`` is not accepted together with ``classes``.
* A per-slot budget list shorter than the run gives ``B_t = 0`` afterwards.
* ``horizon=None``: slots t = 0, 1, ... are run until, at the start of a
  slot, every request has arrived (all ``a_i < t``) and the queue and active
  set are empty; the number of slots run is that t (0 for an empty trace).
  If that does not happen within a generous cap (e.g. budget 0 forever, or
  the livelock that ``all`` eviction can produce) a RuntimeError is raised.
* ``queue_len`` counts waiting requests that have arrived and are not
  rejected, evicted ones included; ``active`` counts requests still active
  after the decode phase (completed ones excluded).
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["simulate"]

EVICTION_RULES = ("lifo", "all", "estimate")
QUEUE_ORDERS = ("fifo", "sjf", "estimate")


class _Request:
    """Mutable state of one request (clarity over speed)."""

    def __init__(self, idx, arrival, prompt, output, cls):
        self.idx = idx
        self.arrival = arrival
        self.l = prompt
        self.o = output
        self.cls = cls
        self.j = 0  # output tokens generated so far (since last eviction)
        self.activation_seq = -1  # order of the latest activation
        self.evictions = 0
        self.finish = -1
        self.rejected = False
        self.estimate = 1  # e_i: a lower bound of o_i (A_min)

    def current_estimate(self):
        """Active, with j tokens generated and not finished: o_i >= j + 1."""
        return max(self.estimate, self.j + 1)

    def demand(self):
        """Tokens held at the end of this slot if it stays active."""
        return self.l + self.j + 1


def _as_int_list(name, values):
    out = []
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must contain integers, got {v!r}")
        out.append(int(v))
    return out


def _default_cap(arrival, output_len):
    # Under lifo with positive budgets the run ends within
    # max(arrival) + 1 + sum(o_i) + n slots; this is far above that.
    n = len(arrival)
    last = max(arrival) if n else 0
    return last + 2 + 4 * (sum(output_len) + n) + 1000


def simulate(
    arrival,
    prompt_len,
    output_len,
    *,
    M,
    budgets,
    eviction="lifo",
    horizon=None,
    classes=None,
    queue_order="fifo",
    estimate_floor=1,
):
    """Replay a trace through the slot model; see the module docstring.

    Returns a dict with per-request ``finish`` (int, -1 if unfinished),
    ``evictions`` (int), ``rejected`` (bool); per-slot ``usage``,
    ``queue_len``, ``active`` (int arrays of length = slots run); and ints
    ``wasted_tokens``, ``overflow_events``; ``estimate`` (each request's
    ``e_i`` at the end); per slot ``queued_prompt`` (prompt tokens of the
    waiting requests at the end of the slot), ``arrived`` and ``rejected_now``
    (requests arriving in the slot, and of those the rejected),
    ``completed_tokens`` (the ``l_i + o_i`` sum of the requests completing in
    the slot: the memory they free); ``admitted``, ``evicted``, ``completed``
    (requests activated, evicted and completed in each slot).
    """
    arrival = _as_int_list("arrival", arrival)
    prompt_len = _as_int_list("prompt_len", prompt_len)
    output_len = _as_int_list("output_len", output_len)
    n = len(arrival)
    if len(prompt_len) != n or len(output_len) != n:
        raise ValueError("arrival, prompt_len and output_len must have equal length")
    if any(a < 0 for a in arrival):
        raise ValueError("arrival slots must be >= 0")
    if any(x < 1 for x in prompt_len) or any(x < 1 for x in output_len):
        raise ValueError("prompt and output lengths must be >= 1")
    if isinstance(M, bool) or not isinstance(M, numbers.Integral) or M < 1:
        raise ValueError("M must be a positive integer")
    M = int(M)
    if eviction not in EVICTION_RULES:
        raise ValueError(f"eviction must be one of {EVICTION_RULES}, got {eviction!r}")
    if queue_order not in QUEUE_ORDERS:
        raise ValueError(f"queue_order must be one of {QUEUE_ORDERS}, got {queue_order!r}")
    if (isinstance(estimate_floor, bool) or not isinstance(estimate_floor, numbers.Integral)
            or estimate_floor < 1):
        raise ValueError("estimate_floor must be a positive integer")

    def sort_key(r):
        if queue_order == "fifo":
            return (r.arrival, r.idx)
        if queue_order == "sjf":
            return (r.o, r.arrival, r.idx)
        return (r.estimate, r.arrival, r.idx)
    if horizon is not None:
        if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 0:
            raise ValueError("horizon must be a non-negative integer or None")
        horizon = int(horizon)

    # ---- budgets -------------------------------------------------------------
    class_budgets = None
    slot_budgets = None
    const_budget = None
    if classes is not None:
        if isinstance(budgets, numbers.Integral):
            raise TypeError("with classes, budgets must be a sequence of per-class budgets")
        class_budgets = _as_int_list("budgets", budgets)
        classes = _as_int_list("classes", classes)
        if len(classes) != n:
            raise ValueError("classes must have one entry per request")
        m = len(class_budgets)
        if any(c < 0 or c >= m for c in classes):
            raise ValueError("class ids must be in 0..len(budgets)-1")
        if any(b < 0 for b in class_budgets):
            raise ValueError("budgets must be >= 0")
    elif isinstance(budgets, numbers.Integral) and not isinstance(budgets, bool):
        const_budget = int(budgets)
        if const_budget < 0:
            raise ValueError("budgets must be >= 0")
    else:
        slot_budgets = _as_int_list("budgets", budgets)
        if any(b < 0 for b in slot_budgets):
            raise ValueError("budgets must be >= 0")

    def budget_at(t):
        if const_budget is not None:
            return const_budget
        return slot_budgets[t] if t < len(slot_budgets) else 0

    # ---- state -----------------------------------------------------------------
    reqs = [
        _Request(i, arrival[i], prompt_len[i], output_len[i],
                 None if classes is None else classes[i])
        for i in range(n)
    ]
    for r in reqs:
        r.estimate = int(estimate_floor)
    queue = []  # waiting requests, kept sorted by (a_i, i)
    active = []  # active requests
    activation_counter = 0
    usage, queue_len, active_len = [], [], []
    queued_prompt, arrived_at, rejected_at, completed_tokens = [], [], [], []
    admitted_at, evicted_at, completed_at = [], [], []
    wasted_tokens = 0
    overflow_events = 0
    last_arrival = max(arrival) if n else -1
    cap = _default_cap(arrival, output_len)

    def evict(r):
        nonlocal wasted_tokens
        active.remove(r)
        evicted_at[-1] += 1
        wasted_tokens += r.j
        r.estimate = r.current_estimate()  # o_i >= j_i + 1 is now known
        r.j = 0
        r.evictions += 1
        r.activation_seq = -1
        queue.append(r)

    t = 0
    while True:
        if horizon is not None:
            if t >= horizon:
                break
        else:
            if t > last_arrival and not queue and not active:
                break
            if t >= cap:
                raise RuntimeError(
                    f"reference simulation did not drain within {cap} slots "
                    "(budget 0 forever, or an 'all'-eviction livelock?)"
                )

        # 1. Arrive.
        arrived_at.append(sum(1 for r in reqs if r.arrival == t))
        rejected_at.append(0)
        for r in reqs:
            if r.arrival == t:
                if r.l + r.o > M:
                    r.rejected = True
                    rejected_at[-1] += 1
                else:
                    queue.append(r)
        queue.sort(key=sort_key)

        # 2. Admit (queue is in (a_i, i) order).
        if class_budgets is None:
            admitted = queue[: budget_at(t)]
        else:
            admitted = []
            for k, b_k in enumerate(class_budgets):
                of_class_k = [r for r in queue if r.cls == k]
                admitted.extend(of_class_k[:b_k])
        admitted_at.append(len(admitted))
        evicted_at.append(0)
        for r in admitted:
            queue.remove(r)
            activation_counter += 1
            r.activation_seq = activation_counter
            active.append(r)

        # 3. Evict on overflow.
        demand = sum(r.demand() for r in active)
        if demand > M:
            overflow_events += 1
            if eviction == "lifo":
                while demand > M:
                    victim = max(active, key=lambda r: r.activation_seq)
                    evict(victim)
                    demand = sum(r.demand() for r in active)
            elif eviction == "estimate":
                while demand > M:
                    victim = min(active, key=lambda r: (r.current_estimate(), -r.activation_seq))
                    evict(victim)
                    demand = sum(r.demand() for r in active)
            else:  # "all"
                for r in list(active):
                    evict(r)
                demand = 0
            queue.sort(key=sort_key)
        assert demand <= M

        # 4. Decode.
        completed_tokens.append(0)
        completed_at.append(0)
        for r in list(active):
            r.j += 1
            if r.j == r.o:
                r.finish = t + 1
                active.remove(r)
                completed_tokens[-1] += r.l + r.o
                completed_at[-1] += 1

        # 5. Record.
        usage.append(demand)
        queue_len.append(len(queue))
        active_len.append(len(active))
        queued_prompt.append(sum(r.l for r in queue))
        t += 1

    return {
        "finish": np.array([r.finish for r in reqs], dtype=np.int64),
        "evictions": np.array([r.evictions for r in reqs], dtype=np.int64),
        "rejected": np.array([r.rejected for r in reqs], dtype=bool),
        "estimate": np.array([r.estimate for r in reqs], dtype=np.int64),
        "usage": np.array(usage, dtype=np.int64),
        "queue_len": np.array(queue_len, dtype=np.int64),
        "active": np.array(active_len, dtype=np.int64),
        "queued_prompt": np.array(queued_prompt, dtype=np.int64),
        "arrived": np.array(arrived_at, dtype=np.int64),
        "rejected_now": np.array(rejected_at, dtype=np.int64),
        "completed_tokens": np.array(completed_tokens, dtype=np.int64),
        "admitted": np.array(admitted_at, dtype=np.int64),
        "evicted": np.array(evicted_at, dtype=np.int64),
        "completed": np.array(completed_at, dtype=np.int64),
        "wasted_tokens": int(wasted_tokens),
        "overflow_events": int(overflow_events),
    }
