"""Workloads: where requests come from.

A workload produces requests ``(arrival slot, prompt length l, output length o,
class)`` for the engine. These kinds ship here:

* :class:`MultiClassPoisson` - the paper's synthetic setting (Section 4.1): ``m``
  classes with fixed ``(l_k, o_k)``, class ``k`` arriving as a Poisson process
  with ``lambda_k`` requests per slot.
* :class:`IIDPoisson` - Poisson arrivals at ``rate`` requests per slot with
  ``(l, o)`` drawn i.i.d. from a :class:`LengthDistribution`
  (:class:`EmpiricalLengths` or :class:`LogNormalLengths`).
* :class:`Mixture` - independent Poisson streams together, each with its own
  rate schedule and lengths: a request mix that shifts over time.
* :class:`Trace` - replay of a finite list of requests, from arrays or a CSV.
* From data (:mod:`flowgym.sim.datasets`): :func:`azure_trace` (the Azure LLM
  inference traces 2023 with their real timestamps), :func:`azure_lengths` (their
  lengths as an :class:`EmpiricalLengths`), :func:`lmsys_like_lengths` (a
  **synthetic** stand-in for the LMSYS-Chat-1M lengths) and :func:`lengths_from_csv`.

Workloads are sampled in fixed chunks of :data:`CHUNK_SLOTS` slots from the
generator the engine passes in, so the same seed always gives the same requests,
whatever the agent does. Every workload can be described by a plain,
JSON-serialisable mapping (see :func:`make_workload`), which is what
``gym.make("FlowControl-v0", workload=...)`` stores in its spec.
"""

from __future__ import annotations

import copy
import csv
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from flowgym.sim import datasets
from flowgym.sim._checks import MAX_COUNT, MAX_OUTPUT_SLOTS, holds_bool, non_negative, positive_int

__all__ = [
    "CHUNK_SLOTS",
    "CHUNK_SECONDS",
    "Requests",
    "CappedRequests",
    "Workload",
    "MultiClassPoisson",
    "IIDPoisson",
    "Mixture",
    "LengthDistribution",
    "EmpiricalLengths",
    "LogNormalLengths",
    "Trace",
    "TraceError",
    "make_workload",
    "request_work",
    "azure_trace",
    "azure_lengths",
    "lmsys_like_lengths",
    "lengths_from_csv",
]

#: Largest prompt or output length a trace may hold (2**40 tokens: ``l + o`` and the KV sums stay
#: far inside int64, and no KV budget is that large).
MAX_TOKENS = 2**40
#: Number of request classes a trace may name (ids 0..MAX_CLASSES-1).
MAX_CLASSES = 2**16
#: Largest arrival a trace may hold in slots: within int64 and exactly a float.
MAX_ARRIVAL = 2**53
#: Largest arrival a timed trace may hold, in seconds (2**32, about 136 years: Unix timestamps fit): there the
#: float64 clock still resolves 1e-6 s, the shortest iteration a time model may take
#: (:data:`flowgym.sim.latency.MIN_ITERATION_SECONDS`); at 2**53 s an iteration would add nothing to it.
MAX_ARRIVAL_SECONDS = 2**32
#: Smallest positive long-run arrival rate of a generated timed workload (requests per second, all its streams
#: together; checked by the engine): an idle server draws 60-second chunks until a request comes, about
#: ``1 / (rate * 60)`` of them (a rate of 1e-12 would take days).
MIN_TIMED_RATE = 1e-6

#: Slots generated per call to :meth:`Workload.sample`. Fixed so that the random
#: stream, and hence the workload, depends on the seed only.
CHUNK_SLOTS = 256
#: Seconds generated per call for timed (continuous-time) workloads.
CHUNK_SECONDS = 60.0


class TraceError(ValueError):
    """A trace (arrays or CSV) holds a value the model cannot take; the message names it."""


class Requests(NamedTuple):
    """A batch of requests sorted by arrival slot (struct of arrays)."""

    arrival: np.ndarray  #: int64 arrival slot
    prompt_len: np.ndarray  #: int64 prompt length ``l`` (tokens, >= 1)
    output_len: np.ndarray  #: int64 output length ``o`` (tokens, >= 1)
    cls: np.ndarray  #: int64 class id (0..m-1), or -1 where the workload has no classes

    @staticmethod
    def empty() -> Requests:
        z = np.zeros(0, dtype=np.int64)
        return Requests(z, z, z, z)


class CappedRequests(Requests):
    """:class:`Requests` that also carry each client's cap on the output, ``max_tokens`` (int64,
    ``>= o``), as a trace with a ``max_tokens`` column gives them. The fields of :class:`Requests`
    are unchanged; the ``vllm-v1`` engine mode reads ``max_tokens`` (a workload that sets none gets
    the default of :func:`flowgym.sim.vllm.default_max_tokens`)."""

    max_tokens: np.ndarray

    @staticmethod
    def of(req: Requests, max_tokens: np.ndarray) -> CappedRequests:
        """``req`` with ``max_tokens``."""
        out = CappedRequests(*req)
        out.max_tokens = max_tokens
        return out


def request_work(prompt_len: Any, output_len: Any) -> Any:
    """KV token-slots a request uses over its life: ``w = l*o + (o + o^2)/2``.

    This is the per-request workload of Proposition 1 of the paper (a request
    holds ``l + j`` tokens while generating its ``j``-th token, ``j = 1..o``).
    Works on scalars and numpy arrays.
    """
    l = np.asarray(prompt_len, dtype=np.float64)
    o = np.asarray(output_len, dtype=np.float64)
    w = l * o + (o + o * o) / 2.0
    return float(w) if w.ndim == 0 else w


_positive_int = positive_int
_rate = non_negative


class Workload(ABC):
    """Source of requests for the engine.

    Subclasses implement :meth:`sample`. ``classes`` is the ``(m, 2)`` array of
    class ``(l_k, o_k)`` when the workload has known classes, else ``None``.
    """

    classes: np.ndarray | None = None
    #: True when the workload ends (a trace, or a fixed number of requests).
    finite: bool = False
    #: True when arrivals are timestamps in seconds (continuous-time mode), not slots.
    timed: bool = False
    #: Width of the windows :meth:`sample` is called with (slots, or seconds when timed).
    chunk_span: float = CHUNK_SLOTS

    @property
    def total_requests(self) -> int | None:
        """Number of requests of a finite workload (``None`` when endless)."""
        return None

    @property
    def num_classes(self) -> int:
        """Number of request classes ``m`` (0 when the workload has none)."""
        return 0 if self.classes is None else int(self.classes.shape[0])

    @abstractmethod
    def sample(self, rng: np.random.Generator, t0: int, t1: int) -> Requests:
        """Requests arriving in ``t0 <= a < t1``, sorted by arrival.

        The engine calls this with consecutive windows of :attr:`chunk_span`
        starting at 0, so the draws depend only on ``rng``'s seed.
        """

    def arrival_rate(self) -> float | None:
        """Mean arrivals per slot, when known."""
        return None

    @property
    def stationary(self) -> bool:
        """True when the arrival process is time-homogeneous: Poisson at a constant rate with one length
        distribution (a mixture of such streams is one too). False for rate schedules that change (even steps
        whose rates differ only slightly) and for traces, whose rate and mix drift. What a benchmark's
        goal for stationary load applies to (``benchmarks/bench_learned.py``)."""
        return False

    def for_engine(self) -> Workload:
        """The object an engine samples from: ``self``, or, for a workload that keeps state between
        :meth:`sample` calls (a finite :class:`IIDPoisson` counts what it made), a copy of its own, so that
        engines built on one workload object (a vector of environments) do not share that state."""
        return self

    def next_arrival(self, t: float) -> float | None:
        """For a deterministic workload (one that draws nothing from the generator), the first
        arrival at or after ``t`` (``inf`` when none is left); ``None`` for a random one. The engine
        skips the empty chunks before it, so an idle gap costs the same whatever its length."""
        return None

    def mean_work(self) -> float | None:
        """``E[w]``, the mean of :func:`request_work` per request, when known."""
        return None

    def load(self, M: int) -> float | None:
        """The load ``rho = lambda * E[w] / M`` of Propositions 1 and 2, when known.

        ``rho > 1`` means no policy can keep the queue stable.
        """
        lam, w = self.arrival_rate(), self.mean_work()
        if lam is None or w is None:
            return None
        return lam * w / M

    def work_rate(self, t: np.ndarray) -> np.ndarray | None:
        """Expected work (token-slots, :func:`request_work`) arriving per unit of time at each ``t``, when known."""
        lam, w = self.arrival_rate(), self.mean_work()
        if lam is None or w is None:
            return None
        return np.full(np.shape(t), lam * w, dtype=np.float64)

    def work_integral(self, t0: float, t1: float) -> float | None:
        """Expected work (token-slots) arriving in ``[t0, t1)``: the integral of :meth:`work_rate`, when known."""
        lam, w = self.arrival_rate(), self.mean_work()
        if lam is None or w is None:
            return None
        return float(lam * w * (t1 - t0))

    def episode_load(self, M: int, horizon: int | None) -> float | None:
        """The load averaged over an episode ``[0, horizon)``: ``(1/H) int lambda(t) E[w] dt / M``.

        Equals :meth:`load` for a stationary workload; for a rate schedule it is what the
        episode offers, where :meth:`load` is the long-run rate (for a non-periodic schedule,
        its last phase's). ``None`` when unknown or without a horizon.
        """
        if horizon is None or horizon <= 0:
            return None
        r = self.work_integral(0.0, float(horizon))  # exact: sampling the rate misses phases shorter than its step
        return None if r is None else float(r / horizon / M)

    def peak_load(self, M: int, horizon: int | None) -> float | None:
        """The largest load over ``[0, horizon)`` (the peak phase's ``lambda(t) E[w] / M``), when known.

        Sampled at every whole and half slot (at most 100,000 of each: for longer horizons every
        ``horizon / 100000`` slots), so a phase shorter than the spacing can be missed.
        """
        if horizon is None or horizon <= 0:
            return None
        n = min(int(horizon), 100_000)
        t = np.concatenate([np.arange(n) * (horizon / n), (np.arange(n) + 0.5) * (horizon / n)])
        r = self.work_rate(t)
        return None if r is None else float(r.max() / M)

    def max_request_tokens(self) -> int | None:
        """Largest ``l + o`` the workload can produce, when bounded."""
        return None

    def max_output_tokens(self) -> int | None:
        """Largest output length ``o`` the workload can produce, when bounded."""
        return None

    def min_output_tokens(self) -> int | None:
        """Shortest output length ``o`` the workload can produce, when stated (A_min's initial estimate,
        "the shortest possible value"); ``None``: not stated, read as 1."""
        return None

    def to_spec(self) -> dict[str, Any]:
        """A JSON-serialisable mapping that :func:`make_workload` turns back into this workload."""
        raise NotImplementedError(f"{type(self).__name__} has no mapping form")


# --------------------------------------------------------------------------- Poisson, classes


def _slot_shuffle(rel_slot: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``np.lexsort((u, rel_slot))`` (by slot, then ``u``, then index), four times faster.

    ``u`` comes from ``Generator.random``, so ``u * 2**53`` is an exact integer
    below ``2**53``; with ``rel_slot < 1024`` the pair packs into one int64 key.
    Equal keys (``u`` repeated, probability ~1e-10 per chunk) fall back to
    ``lexsort`` itself, whose tie order is by index: the result is always identical.
    """
    if rel_slot.size == 0 or int(rel_slot[-1]) >= 1024:
        return np.lexsort((u, rel_slot))
    key = (rel_slot << 53) | (u * 9007199254740992.0).astype(np.int64)
    order = np.argsort(key)
    k = key[order]
    if (k[1:] == k[:-1]).any():
        return np.lexsort((u, rel_slot))
    return order


class MultiClassPoisson(Workload):
    """The paper's synthetic workload: ``m`` classes, independent Poisson arrivals.

    Class ``k`` has prompt length ``l_k`` and output length ``o_k`` and brings
    ``Poisson(lambda_k)`` requests each slot. Within a slot, the arrivals of all
    classes are put in a uniformly random order (independent Poisson processes
    interleave at random), so no class is favoured by FIFO.

    Args:
        classes: sequence of ``(l_k, o_k)`` pairs, positive integers.
        rates: ``lambda_k`` per slot, one number for every class or one per class.
    """

    def __init__(self, classes: Sequence[Sequence[int]], rates: float | Sequence[float]) -> None:
        cls = list(classes) if classes is not None else []
        if len(cls) == 0:
            raise ValueError("classes must be a non-empty list of (prompt_len, output_len) pairs")
        pairs = []
        for k, pair in enumerate(cls):
            if not isinstance(pair, (Sequence, np.ndarray)) or len(pair) != 2:
                raise ValueError(f"classes[{k}] must be a (prompt_len, output_len) pair, got {pair!r}")
            pairs.append(
                (
                    _length(f"classes[{k}] prompt_len", pair[0]),
                    _length(f"classes[{k}] output_len", pair[1]),
                )
            )
        self.classes = np.asarray(pairs, dtype=np.int64)
        m = len(pairs)
        if isinstance(rates, (Sequence, np.ndarray)) and not isinstance(rates, str) and np.ndim(rates) > 0:
            rl = list(rates)
            if len(rl) != m:
                raise ValueError(f"rates has {len(rl)} entries but there are {m} classes")
            self.rates = np.asarray([_rate(f"rates[{k}]", r) for k, r in enumerate(rl)])
        else:
            self.rates = np.full(m, _rate("rates", rates))
        _check_chunk_load("rates", self.peak_rate(), CHUNK_SLOTS, "slot")

    @property
    def stationary(self) -> bool:
        """Always: every class arrives at a constant rate."""
        return True

    def sample(self, rng: np.random.Generator, t0: int, t1: int) -> Requests:
        n_slots = t1 - t0
        m = self.num_classes
        counts = rng.poisson(self.rates, size=(n_slots, m))  # (slot, class)
        flat = counts.ravel()
        total = int(flat.sum())
        slot = np.repeat(np.repeat(np.arange(t0, t1, dtype=np.int64), m), flat)
        cls = np.repeat(np.tile(np.arange(m, dtype=np.int64), n_slots), flat)
        order = _slot_shuffle(slot - t0, rng.random(total))
        slot, cls = slot[order], cls[order]
        return Requests(slot, self.classes[cls, 0], self.classes[cls, 1], cls)

    def arrival_rate(self) -> float:
        return float(self.rates.sum())

    def peak_rate(self) -> float:
        """The highest arrival rate (per slot): the mean one, as every class's rate is constant."""
        return self.arrival_rate()

    def class_work(self) -> np.ndarray:
        """``w_k`` of every class."""
        return request_work(self.classes[:, 0], self.classes[:, 1])

    def mean_work(self) -> float | None:
        lam = self.rates.sum()
        if lam == 0:
            return None
        return float((self.rates * self.class_work()).sum() / lam)

    def max_request_tokens(self) -> int:
        return int(self.classes.sum(axis=1).max())

    def max_output_tokens(self) -> int:
        return int(self.classes[:, 1].max())

    def min_output_tokens(self) -> int:
        live = self.rates > 0  # a class of rate 0 never arrives (every class, if none arrives)
        return int(self.classes[live if live.any() else slice(None), 1].min())

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "poisson",
            "classes": self.classes.tolist(),
            "rates": self.rates.tolist(),
        }

    def __repr__(self) -> str:
        return f"MultiClassPoisson(classes={self.classes.tolist()}, rates={self.rates.tolist()})"


# --------------------------------------------------------------------------- i.i.d. lengths


class LengthDistribution(ABC):
    """A distribution of ``(prompt_len, output_len)`` pairs (positive integers)."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` i.i.d. pairs as two int64 arrays."""

    @abstractmethod
    def mean_work(self) -> float:
        """Exact ``E[l*o + (o + o^2)/2]``."""

    @abstractmethod
    def max_tokens(self) -> int:
        """Largest ``l + o`` the distribution can produce."""

    @abstractmethod
    def max_output(self) -> int:
        """Largest ``o`` the distribution can produce."""

    def min_output(self) -> int:
        """Shortest ``o`` the distribution can produce (1 unless a subclass knows better)."""
        return 1

    @abstractmethod
    def to_spec(self) -> dict[str, Any]:
        """JSON-serialisable mapping form."""


class EmpiricalLengths(LengthDistribution):
    """Pairs drawn from a table of ``(l, o)`` with optional weights.

    Args:
        pairs: sequence of ``(prompt_len, output_len)``.
        weights: non-negative weights (normalised), uniform by default.
    """

    def __init__(self, pairs: Sequence[Sequence[int]], weights: Sequence[float] | None = None) -> None:
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, (Sequence, np.ndarray)):
            raise ValueError(f"pairs must be a non-empty list of (prompt_len, output_len) pairs, got {pairs!r}")
        for k, pair in enumerate(pairs):
            if isinstance(pair, (str, bytes)) or not isinstance(pair, (Sequence, np.ndarray)) or len(pair) != 2:
                raise ValueError(f"pairs[{k}] must be a (prompt_len, output_len) pair, got {pair!r}")
            if holds_bool(pair):  # np.asarray would make True a 1
                raise ValueError(f"pairs[{k}] must be a (prompt_len, output_len) pair, got {pair!r} (a bool is not a length)")
        arr = np.asarray(pairs)
        if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] == 0:
            raise ValueError("pairs must be a non-empty list of (prompt_len, output_len) pairs")
        for k, (l, o) in enumerate(arr.tolist()):
            _length(f"pairs[{k}] prompt_len", l)
            _length(f"pairs[{k}] output_len", o)
        self.pairs = arr.astype(np.int64)
        if weights is None:
            w = np.ones(len(arr))
        else:
            if isinstance(weights, (str, bytes)) or not isinstance(weights, (Sequence, np.ndarray)):
                raise ValueError(f"weights must be a list of non-negative numbers, got {weights!r}")
            w = np.asarray([_rate(f"weights[{k}]", x) for k, x in enumerate(weights)])
            if len(w) != len(arr):
                raise ValueError(f"weights has {len(w)} entries but pairs has {len(arr)}")
            if w.max() <= 0:
                raise ValueError("weights must not all be zero")
            with np.errstate(over="ignore"):
                overflows = not math.isfinite(w.sum())
            if overflows:  # 1e308 each: scaled so the sum is finite (only then: the same p as ever)
                w = w / w.max()
        self.p = w / w.sum()
        self._cdf = np.cumsum(self.p)
        self._cdf[-1] = 1.0

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.searchsorted(self._cdf, rng.random(n), side="right")
        idx = np.minimum(idx, len(self.pairs) - 1)
        return self.pairs[idx, 0], self.pairs[idx, 1]

    def mean_work(self) -> float:
        return float((self.p * request_work(self.pairs[:, 0], self.pairs[:, 1])).sum())

    def max_tokens(self) -> int:
        return int(self.pairs[self.p > 0].sum(axis=1).max())

    def max_output(self) -> int:
        return int(self.pairs[self.p > 0, 1].max())

    def min_output(self) -> int:
        return int(self.pairs[self.p > 0, 1].min())

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "empirical", "pairs": self.pairs.tolist(), "weights": self.p.tolist()}


def _rounded_lognormal_pmf(median: float, sigma: float, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of ``clip(round(X), lo, hi)`` with ``X ~ LogNormal(ln median, sigma)``."""
    support = np.arange(lo, hi + 1, dtype=np.float64)
    if sigma == 0:
        v = min(max(int(round(median)), lo), hi)
        return support, (support == v).astype(np.float64)
    edges = np.concatenate([[0.0], support[:-1] + 0.5])  # round(x) == k  <=>  k-0.5 <= x < k+0.5
    mu = math.log(median)
    z = np.full(edges.shape, -np.inf)
    pos = edges > 0
    with np.errstate(over="ignore"):  # a sigma of 1e-320: z is +-inf, handled below
        z[pos] = (np.log(edges[pos]) - mu) / (sigma * math.sqrt(2.0))
    cdf = 0.5 * (1.0 + np.array([math.erf(v) if np.isfinite(v) else math.copysign(1.0, v) for v in z]))
    cdf = np.concatenate([cdf, [1.0]])
    return support, np.diff(cdf)


class LogNormalLengths(LengthDistribution):
    """Independent log-normal prompt and output lengths, rounded and clipped.

    Each length is ``clip(round(exp(N(ln median, sigma^2))), 1, max)``. Give a
    ``*_mean`` instead of ``*_sigma`` to fit the pair (median, mean):
    ``sigma = sqrt(2 ln(mean/median))`` (the mean must exceed the median).

    Args:
        prompt_median, output_median: medians (tokens).
        prompt_sigma, output_sigma: log-scale standard deviations.
        prompt_mean, output_mean: alternative to the sigmas.
        max_prompt, max_output: upper clip (tokens).
    """

    def __init__(
        self,
        prompt_median: float,
        output_median: float,
        *,
        prompt_sigma: float | None = None,
        output_sigma: float | None = None,
        prompt_mean: float | None = None,
        output_mean: float | None = None,
        max_prompt: int = 4096,
        max_output: int = 4096,
    ) -> None:
        self.prompt_median = self._median("prompt_median", prompt_median)
        self.output_median = self._median("output_median", output_median)
        self.prompt_sigma = self._sigma("prompt", self.prompt_median, prompt_sigma, prompt_mean)
        self.output_sigma = self._sigma("output", self.output_median, output_sigma, output_mean)
        self.max_prompt = self._clip("max_prompt", max_prompt)
        self.max_output_len = self._clip("max_output", max_output)
        sp, pp = _rounded_lognormal_pmf(self.prompt_median, self.prompt_sigma, 1, self.max_prompt)
        so, po = _rounded_lognormal_pmf(self.output_median, self.output_sigma, 1, self.max_output_len)
        self._min_output = int(so[po > 0].min())  # 1 unless sigma is 0 (or so small that 1 has no mass)
        el, eo, eo2 = (sp * pp).sum(), (so * po).sum(), (so * so * po).sum()
        self._mean_work = float(el * eo + (eo + eo2) / 2.0)  # l and o independent

    @staticmethod
    def _clip(name: str, v: Any) -> int:
        """An upper clip: a positive integer of at most :data:`MAX_OUTPUT_SLOTS` (what one request can hold
        in the engine; the distribution's table has an entry per length up to it)."""
        x = _positive_int(name, v)
        if x > MAX_OUTPUT_SLOTS:
            raise ValueError(f"{name} {v!r} is too large (at most {MAX_OUTPUT_SLOTS} tokens)")
        return x

    @staticmethod
    def _median(name: str, v: Any) -> float:
        x = _rate(name, v)
        if x <= 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
        return x

    @staticmethod
    def _sigma(which: str, median: float, sigma: float | None, mean: float | None) -> float:
        if sigma is not None and mean is not None:
            raise ValueError(f"give {which}_sigma or {which}_mean, not both")
        if sigma is not None:
            return _rate(f"{which}_sigma", sigma)
        if mean is None:
            raise ValueError(f"give {which}_sigma or {which}_mean")
        mean = _rate(f"{which}_mean", mean)
        if mean < median:
            raise ValueError(f"{which}_mean ({mean}) must be at least {which}_median ({median})")
        return math.sqrt(2.0 * math.log(mean / median))

    def _draw(self, rng: np.random.Generator, n: int, median: float, sigma: float, hi: int) -> np.ndarray:
        x = np.rint(rng.lognormal(math.log(median), sigma, size=n))
        return np.clip(x, 1, hi).astype(np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        l = self._draw(rng, n, self.prompt_median, self.prompt_sigma, self.max_prompt)
        o = self._draw(rng, n, self.output_median, self.output_sigma, self.max_output_len)
        return l, o

    def mean_work(self) -> float:
        return self._mean_work

    def max_tokens(self) -> int:
        return self.max_prompt + self.max_output_len

    def max_output(self) -> int:
        return self.max_output_len

    def min_output(self) -> int:
        return self._min_output

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "lognormal",
            "prompt_median": self.prompt_median,
            "output_median": self.output_median,
            "prompt_sigma": self.prompt_sigma,
            "output_sigma": self.output_sigma,
            "max_prompt": self.max_prompt,
            "max_output": self.max_output_len,
        }


class NamedLengths(LengthDistribution):
    """A length distribution known by a short mapping (a dataset's name) rather than its table."""

    def __init__(self, dist: LengthDistribution, spec: dict[str, Any]) -> None:
        self.dist, self.spec = dist, dict(spec)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.dist.sample(rng, n)

    def mean_work(self) -> float:
        return self.dist.mean_work()

    def max_tokens(self) -> int:
        return self.dist.max_tokens()

    def max_output(self) -> int:
        return self.dist.max_output()

    def min_output(self) -> int:
        return self.dist.min_output()

    def to_spec(self) -> dict[str, Any]:
        return dict(self.spec)


def _make_lengths(spec: LengthDistribution | Mapping[str, Any]) -> LengthDistribution:
    if isinstance(spec, LengthDistribution):
        return spec
    if not isinstance(spec, Mapping):
        raise ValueError(f"lengths must be a LengthDistribution or a mapping, got {type(spec).__name__}")
    kw = dict(spec)
    kind = kw.pop("kind", None)
    try:
        if kind == "empirical":
            return EmpiricalLengths(**kw)
        if kind == "lognormal":
            return LogNormalLengths(**kw)
        if kind in ("azure", "lmsys-like"):
            dist = azure_lengths(**kw) if kind == "azure" else lmsys_like_lengths(**kw)
            return NamedLengths(dist, {"kind": kind, **kw})
    except TypeError as e:
        raise ValueError(f"lengths {kind!r}: {e}") from None
    raise ValueError(f"lengths kind must be 'empirical', 'lognormal', 'azure' or 'lmsys-like', got {kind!r}")


class IIDPoisson(Workload):
    """Poisson arrivals; ``(l, o)`` i.i.d. from ``lengths``.

    This is the unknown-length model of Section 3.3 of the paper (no classes).
    In discrete time (default) ``rate`` is per slot and arrivals are slot
    numbers; with ``timed=True`` it is per second and arrivals are timestamps
    (continuous-time mode).

    Args:
        rate: mean arrivals per slot (or second): a number or a rate schedule
            (:mod:`flowgym.sim.rates`, e.g. ``{"kind": "sinusoid", ...}``).
        lengths: a :class:`LengthDistribution` or its mapping form
            (``{"kind": "lognormal", ...}`` or ``{"kind": "empirical", ...}``).
        n_requests: stop after this many requests (a finite workload), or ``None``.
        timed: arrivals are timestamps in seconds.
    """

    def __init__(
        self,
        rate: Any,
        lengths: LengthDistribution | Mapping[str, Any],
        n_requests: int | None = None,
        timed: bool = False,
    ) -> None:
        from flowgym.sim.rates import Constant, make_rate

        self.schedule = make_rate(rate)
        self._constant = isinstance(self.schedule, Constant)
        self.rate = self.schedule.mean()
        self.lengths = _make_lengths(lengths)
        self.n_requests = None if n_requests is None else _positive_int("n_requests", n_requests)
        if self.n_requests is not None and self.n_requests > MAX_COUNT:
            raise ValueError(f"n_requests {n_requests!r} is too large (at most {MAX_COUNT})")
        _check_chunk_load("rate", self.peak_rate(), CHUNK_SECONDS if timed else CHUNK_SLOTS,
                          "second" if timed else "slot")
        self.finite = self.n_requests is not None
        self.timed = bool(timed)
        self.chunk_span = CHUNK_SECONDS if self.timed else CHUNK_SLOTS
        self._made = 0

    @property
    def total_requests(self) -> int | None:
        return self.n_requests

    def for_engine(self) -> IIDPoisson:
        """A shallow copy when finite (its count of the requests made is its own), else ``self``."""
        return self if self.n_requests is None else copy.copy(self)

    def sample(self, rng: np.random.Generator, t0: Any, t1: Any) -> Requests:
        if t0 == 0:
            self._made = 0
        if self.timed:
            arr = self.schedule.sample_times(rng, float(t0), float(t1))
        else:
            if self._constant:
                counts = rng.poisson(self.rate, size=t1 - t0)
            else:
                edges = np.arange(t0, t1 + 1, dtype=np.float64)
                counts = rng.poisson(self.schedule.integral(edges[:-1], edges[1:]))
            arr = np.repeat(np.arange(t0, t1, dtype=np.int64), counts)
        if self.n_requests is not None:
            arr = arr[: max(0, self.n_requests - self._made)]
        self._made += arr.size
        l, o = self.lengths.sample(rng, arr.size)
        return Requests(arr, l, o, np.full(arr.size, -1, dtype=np.int64))

    def arrival_rate(self) -> float:
        return self.rate

    def peak_rate(self) -> float:
        """The highest arrival rate of the schedule (per slot, or per second when timed)."""
        return self.schedule.peak()

    @property
    def stationary(self) -> bool:
        """When the rate schedule is constant (a number, or steps that all have the same rate)."""
        from flowgym.sim.rates import Steps

        s = self.schedule
        return self._constant or (isinstance(s, Steps) and bool(np.all(s.rates == s.rates[0])))

    def mean_work(self) -> float:
        return self.lengths.mean_work()

    def work_rate(self, t: np.ndarray) -> np.ndarray:
        return np.asarray(self.schedule.rate(np.asarray(t, dtype=np.float64)), dtype=np.float64) * self.mean_work()

    def work_integral(self, t0: float, t1: float) -> float:
        return float(self.schedule.integral(float(t0), float(t1))) * self.mean_work()

    def max_request_tokens(self) -> int:
        return self.lengths.max_tokens()

    def max_output_tokens(self) -> int:
        return self.lengths.max_output()

    def min_output_tokens(self) -> int:
        return self.lengths.min_output()

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "iid", "rate": self.schedule.to_spec(), "lengths": self.lengths.to_spec()}
        if self.n_requests is not None:
            out["n_requests"] = self.n_requests
        if self.timed:
            out["timed"] = True
        return out


# --------------------------------------------------------------------------- superposition


class Mixture(Workload):
    """Independent Poisson streams arriving together: a request mix that changes over time.

    Each stream is an endless Poisson workload (``poisson`` or ``iid``) with its
    own rate (a number or a schedule of :mod:`flowgym.sim.rates`) and its own
    lengths; the mixture's arrivals are the union of the streams'. Within a slot
    the arrivals of all streams are put in a uniformly random order (as
    :class:`MultiClassPoisson` does for its classes), so no stream is favoured by
    FIFO; in continuous time they are merged by timestamp. With schedules that
    alternate, this is traffic whose mix shifts, e.g. short chat turns by day and
    long generations by night, where no single activation budget fits both.

    The mixture has no request classes (``cls`` is -1); its load is
    ``sum_k lambda_k E[w_k] / M`` over the streams' long-run mean rates.

    Args:
        streams: a non-empty sequence of workloads or their mapping forms
            (``{"kind": "iid", "rate": ..., "lengths": ...}`` or
            ``{"kind": "poisson", ...}``), all endless and all in the same time
            mode (slots, or ``timed`` seconds).
    """

    def __init__(self, streams: Sequence[Workload | Mapping[str, Any]]) -> None:
        if isinstance(streams, (str, Mapping)) or not isinstance(streams, (Sequence, np.ndarray)) or len(streams) == 0:
            raise ValueError("streams must be a non-empty list of workloads (e.g. {'kind': 'iid', ...})")
        made: list[MultiClassPoisson | IIDPoisson] = []
        for k, spec in enumerate(streams):
            try:
                w = make_workload(spec)
            except ValueError as e:
                raise ValueError(f"streams[{k}]: {e}") from None
            if not isinstance(w, (MultiClassPoisson, IIDPoisson)) or w.finite:
                what = f"a finite {type(w).__name__}" if w.finite else f"a {type(w).__name__}"
                raise ValueError(f"streams[{k}] must be an endless Poisson workload ('poisson', or 'iid' without "
                                 f"n_requests), got {what}")
            made.append(w)
        timed = {w.timed for w in made}
        if len(timed) > 1:
            raise ValueError("streams must all be in slots or all timed (arrivals in seconds), not a mix of both")
        self.streams = made
        self.timed = made[0].timed
        peak = sum(w.peak_rate() for w in made)  # each stream is one of the two endless Poisson kinds (checked)
        _check_chunk_load("streams (their rates together)", peak, CHUNK_SECONDS if self.timed else CHUNK_SLOTS,
                          "second" if self.timed else "slot")
        self.chunk_span = made[0].chunk_span

    def sample(self, rng: np.random.Generator, t0: Any, t1: Any) -> Requests:
        parts = [w.sample(rng, t0, t1) for w in self.streams]
        arr = np.concatenate([p.arrival for p in parts])
        prompt = np.concatenate([p.prompt_len for p in parts])
        output = np.concatenate([p.output_len for p in parts])
        if self.timed:
            order = np.argsort(arr, kind="stable")
        else:  # each stream is sorted by slot: order all by slot, then at random within a slot
            by_slot = np.argsort(arr, kind="stable")
            arr, prompt, output = arr[by_slot], prompt[by_slot], output[by_slot]
            order = _slot_shuffle(arr - t0, rng.random(arr.size))
        return Requests(arr[order], prompt[order], output[order], np.full(arr.size, -1, dtype=np.int64))

    def arrival_rate(self) -> float:
        return float(sum(w.arrival_rate() for w in self.streams))

    @property
    def stationary(self) -> bool:
        """When every stream is: the superposition of constant-rate Poisson streams is one, its lengths the
        rate-weighted mixture of theirs."""
        return all(w.stationary for w in self.streams)

    def work_rate(self, t: np.ndarray) -> np.ndarray | None:
        parts = [w.work_rate(t) for w in self.streams]
        return None if any(p is None for p in parts) else np.sum(parts, axis=0)

    def work_integral(self, t0: float, t1: float) -> float | None:
        parts = [w.work_integral(t0, t1) for w in self.streams]
        return None if any(p is None for p in parts) else float(sum(parts))

    def mean_work(self) -> float | None:
        lam = self.arrival_rate()
        if lam == 0:
            return None
        return float(sum(w.arrival_rate() * (w.mean_work() or 0.0) for w in self.streams) / lam)

    def max_request_tokens(self) -> int:
        return max(int(w.max_request_tokens()) for w in self.streams)

    def max_output_tokens(self) -> int:
        return max(int(w.max_output_tokens()) for w in self.streams)

    def min_output_tokens(self) -> int | None:
        live = [w for w in self.streams if (w.peak_rate() or 0) > 0] or self.streams  # a rate-0 stream never arrives
        lows = [w.min_output_tokens() for w in live]
        return None if any(v is None for v in lows) else min(int(v) for v in lows)

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "mix", "streams": [w.to_spec() for w in self.streams]}

    def __repr__(self) -> str:
        return f"Mixture({self.streams!r})"


# --------------------------------------------------------------------------- trace replay


#: Requests one workload chunk may hold on average (memory is allocated per chunk).
MAX_CHUNK_REQUESTS = 2**22


def _check_chunk_load(name: str, rate: float, span: float, unit: str) -> None:
    """Refuse, naming the field, a rate whose chunk would not fit in memory (before any allocation)."""
    if rate * span > MAX_CHUNK_REQUESTS:
        raise ValueError(f"{name}: {rate:g} requests per {unit} is beyond what the simulator can hold "
                         f"(at most {MAX_CHUNK_REQUESTS / span:g} per {unit}: a chunk of {span:g} {unit}s "
                         f"would hold {rate * span:.3g} requests)")


def _length(name: str, value: Any) -> int:
    """A prompt or output length: a positive integer of at most :data:`MAX_TOKENS`."""
    v = _positive_int(name, value)
    if v > MAX_TOKENS:
        raise ValueError(f"{name} {value!r} is too large for a length (at most {MAX_TOKENS})")
    return v


def _row_at(rows: np.ndarray | None, i: int) -> str:
    """How an error names a trace's row ``i``: its line in the CSV (``rows``, the reference reader's numbers) or,
    for arrays or a file read without them, its index."""
    return f"row {int(rows[i])}" if rows is not None else f"index {i}"


def _trace_column(
    name: str, values: Any, *, allow_zero: bool, rows: np.ndarray | None = None, whole: bool = True
) -> np.ndarray:
    """Validate one column (integers, or with ``whole=False`` reals); errors name the column and the row."""
    if isinstance(values, (list, tuple)) and holds_bool(values):  # np.asarray would make True a 1
        i = next(k for k, v in enumerate(values) if holds_bool(v))
        raise TraceError(f"column {name!r}, {_row_at(rows, i)}: {values[i]!r} is not a number")
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TraceError(f"column {name!r} must be one-dimensional, got shape {arr.shape}")

    def where(i: int) -> str:
        return _row_at(rows, i)

    def shown(i: int) -> str:  # the value as the user wrote it: 0.5, not np.float64(0.5)
        v = arr[i]
        return repr(v.item() if isinstance(v, np.generic) else v)

    try:
        f = arr.astype(np.float64)
    except (TypeError, ValueError):
        for i, v in enumerate(arr.tolist()):
            try:
                float(v)
            except (TypeError, ValueError):
                raise TraceError(f"column {name!r}, {where(i)}: {v!r} is not a number") from None
        raise
    bad = ~np.isfinite(f)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"column {name!r}, {where(i)}: {shown(i)} is not a finite number")
    bad = f < (0 if allow_zero else 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        need = "non-negative" if allow_zero else "at least 1"
        raise TraceError(f"column {name!r}, {where(i)}: {shown(i)} must be {need}")
    # beyond what int64 arithmetic (l + o, usage sums, slot numbers) or the clock can hold
    if name != "arrival":
        limit, what, why = MAX_TOKENS, "a length", ""
    elif whole:
        limit, what, why = MAX_ARRIVAL, "an arrival", ""
    else:
        limit, what, why = (MAX_ARRIVAL_SECONDS, "an arrival in seconds",
                            ": beyond it the clock no longer resolves an iteration; give times from the trace's start")
    bad = f > float(limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"column {name!r}, {where(i)}: {shown(i)} is too large for {what} (at most {int(limit)}{why})")
    if not whole:
        return f
    for i in np.flatnonzero(f >= 2.0**53):  # where a float no longer holds every integer: 2**53 + 1 reads as 2**53
        v = arr[i].item() if isinstance(arr[i], np.generic) else arr[i]
        try:
            exact = int(v.strip() if isinstance(v, str) else v) == int(f[i])
        except (TypeError, ValueError):  # "9.1e15": a float as written, taken as that float
            exact = True
        if not exact:
            raise TraceError(f"column {name!r}, {where(i)}: {shown(i)} is not exactly a 64-bit float "
                             f"(read as {int(f[i])}); give a smaller number")
    bad = f != np.floor(f)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        hint = (" (arrivals are slot numbers; for timestamps in seconds give timed=True and a time_model, "
                "continuous time)") if name == "arrival" else ""
        raise TraceError(f"column {name!r}, {where(i)}: {shown(i)} must be a whole number{hint}")
    return f.astype(np.int64)


def _csv_columns(fh: Any, path: str, wanted: dict[str, str]) -> tuple[dict[str, list[str]], list[int]]:
    """The wanted columns of a CSV (as strings) and the row number of each record (the header is row 1)."""
    reader = csv.reader(fh)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"trace CSV {path!r} is empty (no header row)")
    header = [h.strip() for h in header]
    idx = {}
    for field, col in wanted.items():
        if col not in header:
            raise TraceError(f"trace CSV {path!r} has no column {col!r} (for {field}); columns are {header}")
        if header.count(col) > 1:  # which one is meant? taking the first would drop the other silently
            raise TraceError(f"trace CSV {path!r} has the column {col!r} (for {field}) {header.count(col)} times; "
                             f"columns are {header}")
        idx[field] = header.index(col)
    cols: dict[str, list[str]] = {f: [] for f in wanted}
    rows = []
    for rown, rec in enumerate(reader, start=2):
        if not rec or all(not x.strip() for x in rec):  # a blank line, or one of empty fields (a spreadsheet's end)
            continue
        if len(rec) < len(header) or any(x.strip() for x in rec[len(header):]):  # a value past the header: no column
            raise TraceError(f"trace CSV {path!r}, row {rown}: {len(rec)} fields, header has {len(header)}")
        for f, j in idx.items():
            cols[f].append(rec[j].strip())
        rows.append(rown)
    return cols, rows


def _header_repeats(path: str, wanted: dict[str, str]) -> bool:
    """Whether a wanted column's name is in the CSV's header more than once (the csv-module path then names it;
    pyarrow would read the first). ``False`` when the header cannot be read: that path names that too."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            header = [h.strip() for h in next(csv.reader(fh), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return any(header.count(c) > 1 for c in wanted.values())


def _csv_columns_arrow(path: str, wanted: dict[str, str]) -> dict[str, np.ndarray] | None:
    """The wanted columns as float64 arrays, read by pyarrow (``flowgym[fastcsv]``, about 10x the
    csv module); ``None`` when pyarrow is missing or anything is not plainly numeric (an empty
    field, text, ragged rows, not UTF-8, a missing column): the csv-module path then reads the
    file and names the problem by row and column."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pcsv
    except ImportError:
        return None
    cols = list(dict.fromkeys(wanted.values()))
    try:
        tbl = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
            include_columns=cols, column_types={c: pa.float64() for c in cols}, strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowKeyError, OSError, UnicodeDecodeError, KeyError):
        return None
    out = {}
    for field, col in wanted.items():
        column = tbl.column(col)
        if column.null_count:
            return None
        out[field] = column.to_numpy()
        if np.any(out[field] >= 2.0**53):  # as a float 2**53 + 1 reads 2**53: the csv path keeps the text to check
            return None
    return out


def _not_utf8(path: str) -> str:
    """Where a CSV stops being UTF-8: the row and the byte (the error path only reads the file again)."""
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        data.decode("utf-8-sig")
        return f"trace CSV {path!r} is not UTF-8 text; save it as UTF-8"
    except UnicodeDecodeError as e:
        row = data[: e.start].count(b"\n") + 1
        return (f"trace CSV {path!r}, row {row}: byte {data[e.start:e.start + 1]!r} is not UTF-8 text "
                f"({e.reason}); save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


class Trace(Workload):
    """A finite list of requests replayed as given.

    Requests are kept sorted by arrival (a stable sort, so requests arriving in
    the same slot keep their order); request ``i`` of the engine is row
    ``trace.row[i]`` of the input. The episode ends (``terminated``) once every
    request has arrived and the system is empty.

    Args:
        arrival: arrival slot of each request (integers >= 0), or with
            ``timed=True`` its arrival time in seconds (reals >= 0).
        prompt_len: prompt lengths (integers >= 1).
        output_len: output lengths (integers >= 1).
        cls: optional class ids (integers >= 0).
        num_classes: number of classes ``m`` (default: largest class id + 1).
            A class's ``(l_k, o_k)`` (in :attr:`classes`) is the median of its requests'.
        timed: arrivals are timestamps in seconds (continuous-time mode).
        max_tokens: optional client cap on each request's output (``max_tokens`` of the
            OpenAI API: integers ``>= output_len``, since the output a trace records is what
            the cap allowed). Read by the ``vllm-v1`` engine mode and the reservation
            controllers that reserve against it; without it the mode's default applies
            (:func:`flowgym.sim.vllm.default_max_tokens`).

    Raises:
        TraceError: naming the column and row of the first bad value.
    """

    finite = True

    def __init__(
        self,
        arrival: Any,
        prompt_len: Any,
        output_len: Any,
        cls: Any | None = None,
        *,
        num_classes: int | None = None,
        timed: bool = False,
        max_tokens: Any | None = None,
        _rows: np.ndarray | None = None,
        _names: dict[str, str] | None = None,
        _source: dict[str, Any] | None = None,
    ) -> None:
        name = {"arrival": "arrival", "prompt_len": "prompt_len", "output_len": "output_len", "cls": "cls"}
        name.update(_names or {})
        self.timed = bool(timed)
        self.chunk_span = CHUNK_SECONDS if self.timed else CHUNK_SLOTS
        a = _trace_column(name["arrival"], arrival, allow_zero=True, rows=_rows, whole=not self.timed)
        l = _trace_column(name["prompt_len"], prompt_len, allow_zero=False, rows=_rows)
        o = _trace_column(name["output_len"], output_len, allow_zero=False, rows=_rows)
        n = len(a)
        if len(l) != n or len(o) != n:
            raise TraceError(
                f"columns differ in length: arrival {n}, prompt_len {len(l)}, output_len {len(o)}"
            )
        if cls is not None:
            c = _trace_column(name["cls"], cls, allow_zero=True, rows=_rows)
            if len(c) != n:
                raise TraceError(f"column 'cls' has {len(c)} rows, arrival has {n}")
            big = np.flatnonzero(c >= MAX_CLASSES)
            if big.size:  # per-class tables are sized by the largest id
                i = int(big[0])
                where = _row_at(_rows, i)
                raise TraceError(f"column {name['cls']!r}, {where}: class id {int(c[i])} is too large "
                                 f"(ids are 0..{MAX_CLASSES - 1}; number the classes from 0)")
        else:
            c = np.full(n, -1, dtype=np.int64)
        mt = None
        #: the max_tokens column's name and the input rows' numbers, for :meth:`check_max_tokens`'s message
        self._mt_where = (name.get("max_tokens", "max_tokens"), _rows)
        if max_tokens is not None:
            mt = _trace_column(name.get("max_tokens", "max_tokens"), max_tokens, allow_zero=False, rows=_rows)
            if len(mt) != n:
                raise TraceError(f"column 'max_tokens' has {len(mt)} rows, arrival has {n}")
            short = np.flatnonzero(mt < o)
            if short.size:
                i = int(short[0])
                where = _row_at(_rows, i)
                raise TraceError(f"column {name.get('max_tokens', 'max_tokens')!r}, {where}: max_tokens {int(mt[i])} "
                                 f"is below the output length {int(o[i])} (the cap bounds the output)")
        order = np.argsort(a, kind="stable")
        self.row = order  #: input row of each (sorted) request
        self.arrival, self.prompt_len, self.output_len, self.cls = a[order], l[order], o[order], c[order]
        #: client caps on the outputs (sorted like the requests), or ``None``
        self.max_tokens: np.ndarray | None = None if mt is None else mt[order]
        if num_classes is not None:
            if cls is None:
                raise TraceError(f"num_classes={num_classes!r} needs the requests' classes (cls); without them the "
                                 "trace has no classes")
            if isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
                raise TraceError(f"num_classes must be a positive integer, got {num_classes!r}")
        self._num_classes_given = num_classes
        if cls is not None:
            m = int(c.max()) + 1 if n else 0
            if num_classes is not None:
                if int(num_classes) < m:
                    raise TraceError(f"num_classes={num_classes} but the trace has class id {m - 1}")
                m = int(num_classes)
            self.classes = self._class_lengths(m)
        self._source = _source

    def check_max_tokens(self, limit: int, what: str) -> None:
        """``TraceError`` naming the column, the first row and its values when a row's ``prompt_len + max_tokens``
        exceeds ``limit`` (the ``vllm-v1`` mode's ``max_model_len``, described by ``what``); nothing without a
        ``max_tokens`` column."""
        if self.max_tokens is None:
            return
        over = np.flatnonzero(self.prompt_len + self.max_tokens > int(limit))
        if over.size:
            j = int(over[np.argmin(self.row[over])])  # the first in input order
            i = int(self.row[j])
            col, rows = self._mt_where
            path = self._source.get("path") if self._source else None
            if rows is None and path is not None:  # read by pyarrow: the csv-module path numbers the rows
                try:
                    with open(path, newline="", encoding="utf-8-sig") as fh:
                        rows = np.asarray(_csv_columns(fh, path, {"max_tokens": col})[1], dtype=np.int64)
                except (OSError, UnicodeDecodeError, TraceError):
                    rows = None
                if rows is not None and rows.size != len(self):
                    rows = None
            where = _row_at(rows, i)
            l, mt = int(self.prompt_len[j]), int(self.max_tokens[j])
            raise TraceError(f"{f'trace CSV {path!r}: ' if path is not None else ''}column {col!r}, {where}: prompt_len "
                             f"{l} + max_tokens {mt} = {l + mt} exceeds {what}")

    def _class_lengths(self, m: int) -> np.ndarray:
        out = np.zeros((m, 2), dtype=np.int64)
        # grouped by one sort, each class present once (a scan per class id up to m was m x rows)
        order = np.argsort(self.cls, kind="stable")
        ids, starts = np.unique(self.cls[order], return_index=True)
        ends = np.append(starts[1:], order.size)
        for k, a, b in zip(ids.tolist(), starts.tolist(), ends.tolist()):
            if k < m:
                rows = order[a:b]
                out[k] = (int(np.median(self.prompt_len[rows])), int(np.median(self.output_len[rows])))
        return out

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def total_requests(self) -> int:
        return len(self)

    @classmethod
    def from_csv(
        cls,
        path: str | os.PathLike[str],
        *,
        arrival: str = "arrival",
        prompt_len: str = "prompt_len",
        output_len: str = "output_len",
        cls_column: str | None = None,
        timed: bool = False,
        max_tokens_column: str | None = None,
    ) -> Trace:
        """Read a trace from a CSV file with a header row.

        Args:
            path: the file.
            arrival, prompt_len, output_len: names of the columns holding them.
            cls_column: optional name of a class-id column.
            max_tokens_column: optional name of a column with each client's cap on the output
                (``max_tokens``, at least the output length; see the constructor).
            timed: the arrival column holds seconds (reals), for continuous time.

        Raises:
            TraceError: a missing column, or a bad value (naming its row, counting
                the header as row 1, and its column).
        """
        path = os.fspath(path)
        wanted = {"arrival": arrival, "prompt_len": prompt_len, "output_len": output_len}
        if cls_column is not None:
            wanted["cls"] = cls_column
        if max_tokens_column is not None:
            wanted["max_tokens"] = max_tokens_column
        source = {"kind": "trace", "path": path, "arrival": arrival, "prompt_len": prompt_len,
                  "output_len": output_len, "cls_column": cls_column, **({"timed": True} if timed else {}),
                  **({"max_tokens_column": max_tokens_column} if max_tokens_column is not None else {})}
        fast = None if _header_repeats(path, wanted) else _csv_columns_arrow(path, wanted)
        if fast is not None:  # every value numeric: the same checks on the arrays, rows named on failure
            try:
                return cls(fast["arrival"], fast["prompt_len"], fast["output_len"], fast.get("cls"), timed=timed,
                           max_tokens=fast.get("max_tokens"), _names=wanted, _source=source)
            except TraceError:
                pass  # the reference path below names the row (blank lines shift Arrow's indices)
        try:
            fh = open(path, newline="", encoding="utf-8-sig")  # a UTF-8 byte-order mark is dropped
        except OSError as e:
            raise TraceError(f"cannot read trace CSV {path!r}: {e.strerror}") from None
        try:
            with fh:
                cols, rows = _csv_columns(fh, path, wanted)
        except UnicodeDecodeError:
            raise TraceError(_not_utf8(path)) from None
        rows_a = np.asarray(rows, dtype=np.int64)
        try:
            return cls(
                np.asarray(cols["arrival"], dtype=object),
                np.asarray(cols["prompt_len"], dtype=object),
                np.asarray(cols["output_len"], dtype=object),
                np.asarray(cols["cls"], dtype=object) if "cls" in cols else None,
                timed=timed,
                max_tokens=np.asarray(cols["max_tokens"], dtype=object) if "max_tokens" in cols else None,
                _rows=rows_a,
                _names=wanted,
                _source=source,
            )
        except TraceError as e:
            raise TraceError(f"trace CSV {path!r}: {e}") from None

    def sample(self, rng: np.random.Generator, t0: int, t1: int) -> Requests:
        lo, hi = np.searchsorted(self.arrival, [t0, t1], side="left")
        s = slice(int(lo), int(hi))
        req = Requests(self.arrival[s], self.prompt_len[s], self.output_len[s], self.cls[s])
        return req if self.max_tokens is None else CappedRequests.of(req, self.max_tokens[s])

    def next_arrival(self, t: float) -> float:
        i = int(np.searchsorted(self.arrival, t, side="left"))
        return float(self.arrival[i]) if i < len(self) else math.inf

    @property
    def last_arrival(self) -> Any:
        """Slot (or time) of the last arrival (-1 for an empty trace)."""
        if not len(self):
            return -1
        return float(self.arrival[-1]) if self.timed else int(self.arrival[-1])

    def arrival_rate(self) -> float | None:
        if len(self) == 0:
            return None
        if self.timed:
            span = float(self.arrival[-1] - self.arrival[0])
            return len(self) / span if span > 0 else None
        return len(self) / (self.last_arrival + 1)

    def mean_work(self) -> float | None:
        if len(self) == 0:
            return None
        return float(request_work(self.prompt_len, self.output_len).mean())

    def episode_load(self, M: int, horizon: int | None) -> float | None:
        """The work (:func:`request_work`) of the requests arriving in ``[0, horizon)`` over ``horizon * M``: what
        the episode is offered (not the trace's rate stretched over the horizon)."""
        if horizon is None or horizon <= 0 or len(self) == 0:
            return None
        early = self.arrival < horizon
        return float(request_work(self.prompt_len[early], self.output_len[early]).sum() / (float(horizon) * M))

    def peak_load(self, M: int, horizon: int | None) -> float | None:
        """``None``: a trace has no phases whose load could be called its peak."""
        return None

    def max_request_tokens(self) -> int:
        return int((self.prompt_len + self.output_len).max()) if len(self) else 0

    def max_output_tokens(self) -> int:
        return int(self.output_len.max()) if len(self) else 0

    def min_output_tokens(self) -> int | None:
        return int(self.output_len.min()) if len(self) else None

    def to_spec(self) -> dict[str, Any]:
        if self._source is not None:
            return dict(self._source)
        out: dict[str, Any] = {
            "kind": "trace",
            "arrival": self.arrival.tolist(),
            "prompt_len": self.prompt_len.tolist(),
            "output_len": self.output_len.tolist(),
        }
        if (self.cls >= 0).any():
            out["cls"] = self.cls.tolist()
        if self._num_classes_given is not None:
            out["num_classes"] = int(self._num_classes_given)
        if self.timed:
            out["timed"] = True
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens.tolist()
        return out

    def __repr__(self) -> str:
        return f"Trace({len(self)} requests, last arrival {self.last_arrival})"


# --------------------------------------------------------------------------- mapping form


def make_workload(spec: Workload | Mapping[str, Any]) -> Workload:
    """Build a workload from its mapping form (or return a workload as is).

    Mapping forms (``kind`` selects):

    * ``{"kind": "poisson", "classes": [[l, o], ...], "rates": lam or [lam_k, ...]}``
    * ``{"kind": "iid", "rate": lam, "lengths": {"kind": "lognormal", ...}}``
      or ``"lengths": {"kind": "empirical", "pairs": [[l, o], ...], "weights": [...]}``
    * ``{"kind": "mix", "streams": [{"kind": "iid", ...}, ...]}``: independent Poisson streams
      together, each with its own rate schedule and lengths (:class:`Mixture`)
    * ``{"kind": "trace", "arrival": [...], "prompt_len": [...], "output_len": [...], "cls": [...]}``
    * ``{"kind": "trace", "path": "file.csv", "arrival": "col", "prompt_len": "col",
      "output_len": "col", "cls_column": "col", "max_tokens_column": "col", "timed": false}`` (column
      names optional; ``max_tokens_column`` reads each client's output cap)
    * ``{"kind": "azure", "trace": "conv" or "code", "rate_multiplier": 1.0, "window": [t0, t1]}``
      (continuous time; :func:`azure_trace`)
    * lengths may also be ``{"kind": "azure", "trace": "conv"}`` or ``{"kind": "lmsys-like"}``
      (:mod:`flowgym.sim.datasets`); ``rate`` may be a schedule (:mod:`flowgym.sim.rates`) and
      ``"timed": true`` makes the arrivals Poisson in seconds.
    """
    if isinstance(spec, Workload):
        return spec
    if not isinstance(spec, Mapping):
        raise ValueError(f"workload must be a Workload or a mapping with a 'kind', got {type(spec).__name__}")
    kw = dict(spec)
    kind = kw.pop("kind", None)
    if "timed" in kw and not isinstance(kw["timed"], (bool, np.bool_)):  # "false" would be truthy
        raise ValueError(f"workload {kind!r}: timed must be true or false, got {kw['timed']!r}")
    try:
        if kind == "poisson":
            return MultiClassPoisson(**kw)
        if kind == "iid":
            return IIDPoisson(**kw)
        if kind == "mix":
            return Mixture(**kw)
        if kind == "azure":
            return azure_trace(**kw)
        if kind == "trace":
            if "path" in kw:
                path = kw.pop("path")
                inline = [k for k in ("arrival", "prompt_len", "output_len", "cls") if k in kw
                          and not isinstance(kw[k], str) and kw[k] is not None]
                if inline:
                    raise ValueError(f"workload 'trace': with 'path', {inline[0]!r} names a column of the CSV (a "
                                     f"string), got {type(kw[inline[0]]).__name__}: give the requests in the file "
                                     "or inline, not both")
                tr = Trace.from_csv(path, **{k: v for k, v in kw.items() if v is not None})
            else:
                tr = Trace(**kw)
            if len(tr) == 0:
                raise ValueError("workload 'trace': an empty trace (no requests)" + (f" in {path!r}" if "path" in spec
                                                                                     else ""))
            return tr
    except TypeError as e:  # unexpected or missing keys
        raise ValueError(f"workload {kind!r}: {e}") from None
    raise ValueError(f"workload kind must be 'poisson', 'iid', 'mix', 'trace' or 'azure', got {kind!r}")


# --------------------------------------------------------------------------- workloads from data


def azure_trace(trace: str = "conv", *, rate_multiplier: float = 1.0,
                window: tuple[float, float] | None = None) -> Trace:
    """The Azure LLM inference trace 2023 as a timed :class:`Trace` (real timestamps, seconds).

    ``"conv"`` (19,366 requests) or ``"code"`` (8,819); Patel et al., "Splitwise",
    ISCA 2024; CC-BY 4.0 (``flowgym/data/NOTICE``). ``rate_multiplier`` divides all
    inter-arrival times (2.0 = twice the load); ``window=(start, end)`` keeps the
    requests whose original time is in ``[start, end)``, shifted to start at 0
    (:func:`flowgym.sim.datasets.azure_columns`).
    """
    tt, prompt, output = datasets.azure_columns(trace, rate_multiplier=rate_multiplier, window=window)
    if tt.size and tt[-1] > MAX_ARRIVAL_SECONDS:  # named here, not as an arrival too large for the clock in Trace
        span = float(tt[-1]) * float(rate_multiplier)
        raise ValueError(f"rate_multiplier {rate_multiplier!r} stretches the trace's {span:.0f} s to {tt[-1]:.3g} s, "
                         f"past the {MAX_ARRIVAL_SECONDS} s a timed arrival may take; give at least "
                         f"{span / MAX_ARRIVAL_SECONDS:.3g}")
    tr = Trace(tt, prompt, output, timed=True)
    spec: dict[str, Any] = {"kind": "azure", "trace": trace, "rate_multiplier": float(rate_multiplier)}
    if window is not None:
        spec["window"] = [float(window[0]), float(window[1])]
    tr._source = spec
    return tr


def azure_lengths(trace: str = "conv") -> EmpiricalLengths:
    """The trace's (``"conv"`` or ``"code"``) ``(prompt, output)`` pairs, each weighted by how often it occurs."""
    pairs, counts = datasets.azure_pairs(trace)
    return EmpiricalLengths(pairs.tolist(), counts.tolist())


def lmsys_like_lengths(max_prompt: int = 4096, max_output: int = 4096) -> LogNormalLengths:
    """SYNTHETIC LMSYS-like lengths: log-normals with the published sample's median and mean.

    Prompt median 11 / mean 40.62, output median 45 / mean 85.32 (words used as
    tokens, as the paper did; :data:`flowgym.sim.datasets.LMSYS_SAMPLE`), clipped to
    ``[1, max]``. Not the dataset: a stand-in from its published summary figures.
    Users who hold the dataset load their own lengths with :func:`lengths_from_csv`.
    """
    return LogNormalLengths(max_prompt=max_prompt, max_output=max_output, **datasets.LMSYS_SAMPLE)


def lengths_from_csv(path: str | os.PathLike[str], *, prompt_len: str = "prompt_len",
                     output_len: str = "output_len") -> EmpiricalLengths:
    """An empirical length distribution from your own CSV (e.g. LMSYS-Chat-1M word counts).

    Errors name the column and the row (the header is row 1); a file with no rows is refused, naming it.
    """
    try:  # read as a trace whose arrival column is the prompt column (its order does not matter here)
        tr = Trace.from_csv(path, arrival=prompt_len, prompt_len=prompt_len, output_len=output_len)
    except TraceError as e:  # the prompt column is also read as "arrival": name it by its role here (a length is
        # at least 1, where an arrival may be 0: only the arrival's check says "non-negative")
        raise TraceError(str(e).replace("(for arrival)", "(for prompt_len)")
                         .replace("must be non-negative", "must be at least 1")) from None
    if not len(tr):
        raise TraceError(f"length CSV {os.fspath(path)!r} has no rows after the header")
    pairs, counts = np.unique(np.stack([tr.prompt_len, tr.output_len], axis=1), axis=0, return_counts=True)
    return EmpiricalLengths(pairs.tolist(), counts.tolist())
