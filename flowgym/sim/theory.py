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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flowgym.sim.workloads import request_work

__all__ = [
    "work",
    "load",
    "peak_usage",
    "Theorem1Check",
    "theorem1",
    "max_global_budget",
    "reflected_walk_mean",
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
    if isinstance(M, bool) or not isinstance(M, (int, float, np.number)) or not (math.isfinite(M) and M > 0):
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
    return float(np.asarray(rates, dtype=np.float64).sum() * mean_work / M)


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
    """Largest integer ``b`` with ``b * E[w] <= (1 - eps) * M`` (Theorem 2)."""
    _check_M(M)
    if not 0 <= eps < 1:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    if mean_work <= 0:
        raise ValueError(f"mean_work must be positive, got {mean_work}")
    cap = (1 - eps) * M
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
