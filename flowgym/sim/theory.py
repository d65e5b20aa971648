"""Closed-form results of Dong & Cao, "Flow-Controlled Scheduling for LLM Inference".

* :func:`work` - ``w = l*o + (o + o^2)/2``, the KV token-slots a request uses in
  its life (Proposition 1).
* :func:`load` - ``rho = sum_k lambda_k w_k / M`` (Proposition 1) or
  ``lambda E[w] / M`` (Proposition 2). No policy is stable when ``rho > 1``.
* :func:`peak_usage` / :func:`theorem1` - Algorithm 1 with per-class budgets
  ``b_k`` never holds more than ``sum_k b_k w_k`` tokens, and is stable when
  that is ``< M`` and every ``b_k > lambda_k`` (Theorem 1).
* :func:`max_global_budget` - the largest integer ``b`` with
  ``b E[w] <= (1 - eps) M`` (Theorem 2's condition for Algorithm 2).
* :func:`reflected_walk_mean` - the stationary mean of the per-class queue
  ``Q' = (Q + A - b)^+`` under Algorithm 1 with ``A ~ Poisson(lambda)``.
* :func:`time_in_system_bound` - a lower bound on the mean time in system that
  *any* schedule of a given request stream can reach (not from the paper): how
  far below a policy's figure no policy can go.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flowgym.sim._checks import int_array, is_count, is_finite_real, is_real
from flowgym.sim.workloads import request_work

__all__ = [
    "work",
    "load",
    "peak_usage",
    "Theorem1Check",
    "theorem1",
    "max_global_budget",
    "reflected_walk_mean",
    "TimeInSystemBound",
    "time_in_system_bound",
]


def work(prompt_len: float | np.ndarray, output_len: float | np.ndarray) -> float | np.ndarray:
    """``w = l*o + (o + o^2)/2`` for scalars or arrays.

    >>> [work(10, o) for o in (20, 40, 60)]
    [410.0, 1220.0, 2430.0]
    """
    return request_work(prompt_len, output_len)


def _vec(name: str, values: float | Sequence[float], m: int) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(values, dtype=np.float64), (m,)) if np.ndim(values) == 0 else np.asarray(
        values, dtype=np.float64
    )
    if arr.shape != (m,):
        raise ValueError(f"{name} must have one entry per class ({m}), got {len(arr)}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative and finite, got {arr.tolist()}")
    return arr


def _classes(classes: Sequence[Sequence[int]]) -> np.ndarray:
    c = np.asarray(classes, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != 2 or c.shape[0] == 0:
        raise ValueError("classes must be a non-empty list of (prompt_len, output_len) pairs")
    return c


def _check_M(M: float) -> None:
    if not is_real(M) or not (math.isfinite(M) and M > 0):
        raise ValueError(f"M must be a positive finite number, got {M!r}")


def load(
    M: float,
    rates: float | Sequence[float],
    classes: Sequence[Sequence[int]] | None = None,
    *,
    mean_work: float | None = None,
) -> float:
    """The load ``rho``: expected KV token-slots arriving per slot over ``M``.

    Either ``classes`` (``(l_k, o_k)`` pairs) with per-class ``rates``
    (Proposition 1: ``sum_k lambda_k w_k / M``), or a total ``rates`` and the
    ``mean_work`` ``E[w]`` (Proposition 2: ``lambda E[w] / M``).

    >>> round(load(16492, 5, [(10, 20), (10, 40), (10, 60)]) * 16492)
    20300
    """
    _check_M(M)
    if classes is not None:
        c = _classes(classes)
        lam = _vec("rates", rates, c.shape[0])
        return float((lam * request_work(c[:, 0], c[:, 1])).sum() / M)
    if mean_work is None:
        raise ValueError("give classes or mean_work")
    if not is_finite_real(mean_work) or mean_work <= 0:
        raise ValueError(f"mean_work (E[w], KV token-slots per request) must be a positive finite number, "
                         f"got {mean_work!r}")
    try:
        lam = np.asarray(rates, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"rates must be a number or a sequence of numbers (arrivals per slot), got {rates!r}") from None
    lam = _vec("rates", lam, lam.size)
    return float(lam.sum() * mean_work / M)


def peak_usage(budgets: Sequence[int], classes: Sequence[Sequence[int]]) -> float:
    """``sum_k b_k w_k``: the most KV tokens Algorithm 1 ever holds (saturated queues)."""
    c = _classes(classes)
    b = _vec("budgets", budgets, c.shape[0])
    return float((b * request_work(c[:, 0], c[:, 1])).sum())


@dataclass(frozen=True)
class Theorem1Check:
    """Outcome of :func:`theorem1`."""

    peak: float  #: ``sum_k b_k w_k``
    M: float
    memory_ok: bool  #: ``peak < M`` (strict, as in the theorem)
    rates_ok: bool  #: every ``b_k > lambda_k``
    stable: bool  #: both: Theorem 1 guarantees stability and no overflow

    def __bool__(self) -> bool:
        return self.stable


def theorem1(
    budgets: Sequence[int], classes: Sequence[Sequence[int]], rates: float | Sequence[float], M: float
) -> Theorem1Check:
    """Check Theorem 1's sufficient condition for Algorithm 1 with budgets ``b_k``."""
    _check_M(M)
    c = _classes(classes)
    b = _vec("budgets", budgets, c.shape[0])
    lam = _vec("rates", rates, c.shape[0])
    peak = peak_usage(b, c)
    memory_ok = peak < M
    rates_ok = bool(np.all(b > lam))
    return Theorem1Check(peak, float(M), memory_ok, rates_ok, memory_ok and rates_ok)


def max_global_budget(M: float, mean_work: float, eps: float = 0.0) -> int:
    """Largest integer ``b`` with ``b * E[w] <= (1 - eps) * M``: Theorem 2's memory condition.

    The theorem needs ``eps > 0`` (and ``b > lambda``); its overflow bound decays with ``eps^2 M^2``, so
    ``eps = 0`` (the default) gives the edge of the condition, not a budget the theorem covers."""
    _check_M(M)
    if not 0 <= eps < 1:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    if not is_real(mean_work) or not (
            math.isfinite(mean_work) and mean_work > 0):
        raise ValueError(f"mean_work must be a positive finite number, got {mean_work!r}")
    cap = (1 - eps) * M
    if cap / mean_work >= 2.0**52:  # beyond exact float integers: (b + 1) * mean_work would never pass cap
        raise ValueError(f"M / mean_work = {cap / mean_work:g} is beyond what a budget can count exactly (2**52)")
    b = max(int(math.floor(cap / mean_work)), 0)
    # the quotient can round across an integer: settle on the products themselves
    while (b + 1) * mean_work <= cap:
        b += 1
    while b > 0 and b * mean_work > cap:
        b -= 1
    return b


def reflected_walk_mean(rate: float, budget: int, *, tol: float = 1e-12, max_len: int = 100_000) -> float:
    """Stationary mean of ``Q' = max(Q + A - b, 0)``, ``A ~ Poisson(rate)``.

    This is the per-class queue left after admission under Algorithm 1 with
    saturated memory slack (``sum_k b_k w_k <= M``, so no evictions). Solved
    by iterating the distribution of ``Q`` to a fixed point; requires
    ``rate < budget``.
    """
    if not is_finite_real(rate) or rate < 0:
        raise ValueError(f"rate (mean arrivals per slot) must be a non-negative finite number, got {rate!r}")
    if not is_count(budget):
        raise ValueError(f"budget must be a non-negative integer (requests admitted per slot), got {budget!r}")
    if not rate < budget:
        raise ValueError(f"the walk is stable only for rate < budget, got {rate} >= {budget}")
    kmax = int(rate + 20 * math.sqrt(rate + 1) + 20)
    a = np.array([math.exp(-rate + k * math.log(rate) - math.lgamma(k + 1)) if rate > 0 else float(k == 0)
                  for k in range(kmax + 1)])
    n = 64
    p = np.zeros(n)
    p[0] = 1.0
    for _ in range(200_000):
        s = np.convolve(p, a)  # distribution of Q + A
        q = np.zeros(max(n, s.size - budget))
        q[0] = s[: budget + 1].sum()
        q[1 : s.size - budget] = s[budget + 1 :]
        q = q[: max_len]
        # trim negligible tail
        nz = np.flatnonzero(q > 1e-300)
        q = q[: nz[-1] + 1]
        delta = np.abs(np.pad(q, (0, max(0, p.size - q.size))) - np.pad(p, (0, max(0, q.size - p.size)))).sum()
        p = q
        n = p.size
        if delta < tol:
            break
    return float((np.arange(p.size) * p).sum())


@dataclass(frozen=True)
class TimeInSystemBound:
    """Outcome of :func:`time_in_system_bound` (means over the counted requests, in slots)."""

    bound: float  #: the lower bound: the largest of the ones below
    service: float  #: the service floor: the mean of ``min(o_i, T - a_i)``
    memory: float  #: the memory floor: SRPT on KV token-slots, ``M`` per slot
    slotwise: float  #: the larger of the two floors slot by slot (``sum_t max(...) / requests``)
    lagrangian: float  #: the Lagrangian (LP) bound of the hindsight program (``nan`` when ``T`` is ``None``)
    requests: int  #: requests counted (arrived before ``T``, ``l_i + o_i <= M``)
    T: int | None  #: the horizon, ``None`` for no truncation


def _srpt_finish(a: np.ndarray, w: np.ndarray, M: int, T: int | None) -> np.ndarray:
    """Finish slots of shortest-remaining-work-first on one machine serving ``M`` a slot (``T`` if not by ``T``)."""
    n = a.size
    done = np.empty(n, dtype=np.int64)
    order = np.argsort(a, kind="stable")
    heap: list[tuple[int, int]] = []
    k, t = 0, 0
    while k < n or heap:
        if not heap and a[order[k]] > t:
            t = int(a[order[k]])
        if T is not None and t >= T:
            break
        while k < n and a[order[k]] <= t:
            i = int(order[k])
            heapq.heappush(heap, (int(w[i]), i))
            k += 1
        room = M
        while heap and room > 0:
            rem, i = heap[0]
            if rem <= room:
                heapq.heappop(heap)
                room -= rem
                done[i] = t + 1
            else:
                heapq.heapreplace(heap, (rem - room, i))
                room = 0
        t += 1
    for _, i in heap:  # unfinished at T
        done[i] = T
    return done


def _lagrangian(a: np.ndarray, l_: np.ndarray, o: np.ndarray, M: int, T: int, iterations: int) -> float:
    """Best Lagrangian bound found on ``sum_i (min(f_i, T) - a_i)``, divided by ``n`` (see
    :func:`time_in_system_bound`)."""
    n = a.size
    pairs, inverse = np.unique(np.stack([l_, o], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    groups = np.split(a[order], np.cumsum(np.bincount(inverse, minlength=len(pairs)))[:-1])
    si = np.arange(T + 1)  # start slots; T = not started within the horizon
    s = si.astype(np.float64)
    tt = np.arange(T, dtype=np.float64)
    # per pair, what does not depend on the prices: each start's end, cost and first start covering a slot
    ends = [np.minimum(si + ok, T) for _, ok in pairs]
    costs = [np.minimum(s + ok, T) for _, ok in pairs]
    firsts = [np.maximum(si[:T] + 1 - ok, 0) for _, ok in pairs]
    pi = np.zeros(T, dtype=np.float64)
    best = float((np.minimum(a + o, T) - a).sum())  # the value at pi = 0: the service floor
    scale, stale = 1.0, 0
    for _ in range(iterations):
        A = np.concatenate([[0.0], np.cumsum(pi)])  # A[x] = sum_{t < x} pi_t, constant beyond T
        B = np.concatenate([[0.0], np.cumsum(np.arange(T) * pi)])
        usage = np.zeros(T, dtype=np.float64)
        total = -M * float(pi.sum())
        for (lk, ok), ai, e, cost, lo_ in zip(pairs, groups, ends, costs, firsts):
            mem = (lk + 1 - s) * (A[e] - A[si]) + (B[e] - B[si])  # sum_{t=s}^{s+o-1} pi_t (l + 1 + t - s)
            g = cost + mem
            low = np.minimum.accumulate(g[::-1])[::-1]  # the best start at or after each slot ...
            arg = np.minimum.accumulate(np.where(g <= low, si, T + 1)[::-1])[::-1]  # ... and the first one
            total += float((low[ai] - ai).sum())
            # tokens of these best starts in each slot t < T: sum over s in (t - o, t] of starts_s (l + 1 + t - s)
            starts = np.bincount(arg[ai], minlength=T + 1)[:T].astype(np.float64)
            c0 = np.concatenate([[0.0], np.cumsum(starts)])
            c1 = np.concatenate([[0.0], np.cumsum(starts * tt)])
            usage += (lk + 1 + tt) * (c0[1:] - c0[lo_]) - (c1[1:] - c1[lo_])
        if total > best:
            best, stale = total, 0
        else:
            stale += 1
            if stale >= 10:  # no progress: shorter steps (Held and Karp)
                scale, stale = scale / 2, 0
                if scale < 1e-3:
                    break
        grad = usage - M
        grad[(pi <= 0) & (grad < 0)] = 0.0
        norm = float(grad @ grad)
        if norm == 0.0:  # the prices' best starts fit the cache: this value is the relaxation's optimum
            break
        target = best + 0.1 * abs(best) + 1.0
        pi = np.maximum(pi + scale * (target - total) / norm * grad, 0.0)
    return best / n


def time_in_system_bound(
    arrival: Sequence[int] | np.ndarray,
    prompt_len: Sequence[int] | np.ndarray,
    output_len: Sequence[int] | np.ndarray,
    M: int,
    T: int | None = None,
    *,
    iterations: int = 300,
) -> TimeInSystemBound:
    """A lower bound on the mean time in system of *every* schedule of these requests (slot model).

    The time in system is the environment's ``mean_time_in_system``: ``min(f_i, T) - a_i`` averaged
    over the requests that arrived before ``T`` and are not rejected (``l_i + o_i <= M``), which equals
    ``sum_{t < T} N_t / n`` with ``N_t`` the requests in the system during slot ``t``
    (``a_i <= t < f_i``). Whatever the admission budget, the queue order, the eviction rule or the batch
    (``docs/model.md``), no schedule goes below any of these:

    * **service floor**: a request finishes no earlier than ``a_i + o_i`` (it decodes one token a slot),
      so ``N_t >= #{i : a_i <= t < a_i + o_i}``;
    * **memory floor**: a request that completes holds ``l_i + j + 1`` tokens in the slot of its ``j``-th
      token, ``w_i = l_i o_i + o_i (o_i + 1) / 2`` token-slots over its last run, and a slot holds at most
      ``M`` tokens. So a schedule is a preemptive schedule of jobs of size ``w_i`` released at ``a_i`` on
      one machine serving ``M`` a slot, in which job ``i`` is done no later than request ``i``.
      Shortest remaining work first completes the most jobs by every time (Smith 1978), hence ``N_t >=``
      the jobs it has left in slot ``t``. ``slotwise`` sums the larger of the two counts slot by slot;
    * **Lagrangian bound** (with ``T``): drop every run of a request but its last, which starts at some
      ``s_i >= a_i`` and holds ``l_i + t - s_i + 1`` tokens in slot ``t < min(s_i + o_i, T)``: the
      hindsight program of :mod:`flowgym.lab.hindsight` with the objective truncated at ``T`` (a request
      not finished by ``T`` counts ``T - a_i``; its start may be ``T``, "not within the horizon"). Pricing
      the cache at ``pi_t >= 0`` per token in slot ``t`` gives, for *any* prices,
      ``sum_i min_s [min(s + o_i, T) - a_i + sum_t pi_t tokens_i(s, t)] - M sum_t pi_t`` below that
      program's optimum, so below every schedule (weak duality). The prices are improved by
      ``iterations`` projected subgradient steps (Polyak's step towards 10% above the best value so far,
      halved after 10 steps without progress) and the best value found is kept. Its maximum over prices
      is the program's linear relaxation, which lets a request split into fractions that pack like
      fluid; on 60 small random traces 300 steps came within 2% of that relaxation solved exactly (HiGHS).

    ``bound`` is the largest of them. It says where a goal is out of reach of any policy; it is not
    claimed to be reachable. It holds for the paper's engine (``engine="paper"``, ``docs/model.md``);
    the ``vllm-v1`` mode holds other token counts (blocks, recompute preemption), for which it is not a
    bound. Cost: ``O(n log n)`` and one pass over the busy slots for the floors, and ``iterations``
    times ``O(T pairs + n)`` for the Lagrangian bound, ``pairs`` the distinct ``(l, o)`` pairs: fast for
    the scenarios' few fixed pairs (1-2 s for 90,000 requests and 4,000 slots), slow with thousands of
    pairs (lengths drawn from a wide distribution; ``iterations=0`` skips it).

    Args:
        arrival: arrival slot ``a_i >= 0`` of each request.
        prompt_len: prompt length ``l_i >= 1``.
        output_len: output length ``o_i >= 1``.
        M: the KV budget in tokens (``>= 1``).
        T: the horizon; ``None`` counts every request to its finish (a workload run to its end; then
            the Lagrangian bound is not computed).
        iterations: subgradient steps of the Lagrangian bound at most (``0``: the floors only).

    Returns:
        a :class:`TimeInSystemBound`; its means are ``nan`` when no request counts.

    Raises:
        ValueError: arrays of different lengths or not 1-D, a value out of range (named with its
            index), or ``M``, ``T`` or ``iterations`` not an integer in range.
    """
    a = int_array("arrival", arrival, None, 0)
    l_ = int_array("prompt_len", prompt_len, None, 1)
    o = int_array("output_len", output_len, None, 1)
    if not (a.size == l_.size == o.size):
        raise ValueError(f"arrival, prompt_len and output_len differ in length: {a.size}, {l_.size}, {o.size}")
    if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
        raise ValueError(f"M must be a positive integer, got {M!r}")
    if T is not None and (isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1):
        raise ValueError(f"T must be a positive integer or None, got {T!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 0:
        raise ValueError(f"iterations must be a non-negative integer, got {iterations!r}")
    M = int(M)
    T = None if T is None else int(T)
    keep = l_ + o <= M
    if T is not None:
        keep &= a < T
    a, l_, o = a[keep], l_[keep], o[keep]
    n = int(a.size)
    if n == 0:
        return TimeInSystemBound(math.nan, math.nan, math.nan, math.nan, math.nan, 0, T)
    w = l_ * o + (o * (o + 1)) // 2
    end_srpt = _srpt_finish(a, w, M, T)
    end_svc = a + o if T is None else np.minimum(a + o, T)
    # requests in the system in slot t: a_i <= t < end_i; both counts are constant between the events,
    # so the slot-wise maximum is summed interval by interval (no array as long as the span of slots)
    events = np.unique(np.concatenate([a, end_svc, end_srpt]))
    a_sorted = np.sort(a)

    def count(end: np.ndarray) -> np.ndarray:  # the count in the slots from each event to the next
        return (np.searchsorted(a_sorted, events, side="right") - np.searchsorted(np.sort(end), events, side="right"))

    slotwise = float((np.maximum(count(end_svc), count(end_srpt))[:-1] * np.diff(events)).sum()) / n
    lag = math.nan if T is None or iterations == 0 else _lagrangian(a, l_, o, M, T, int(iterations))
    return TimeInSystemBound(
        bound=max(slotwise, lag) if not math.isnan(lag) else slotwise,
        service=float((end_svc - a).sum()) / n,
        memory=float((end_srpt - a).sum()) / n,
        slotwise=slotwise,
        lagrangian=lag,
        requests=n,
        T=T,
    )
