"""Online load estimates a real server can make: the safe budget ``M / E[w]`` and scale-free features.

Propositions 1 and 2 of the paper say no policy keeps the system stable when ``lambda E[w] > M``,
with ``w_i = l_i o_i + o_i (o_i + 1) / 2`` the KV token-slots a request holds over
its life. So ``M / E[w]`` is the most starts per slot the cache can sustain (a ceiling, not a
guarantee: Theorems 1 and 2 need a margin below it): the *safe budget*. The best fixed budgets of the paper's scenarios sit at 1-2x of
it, and when the request mix changes the safe budget moves with it (37 starts
per slot in ``adaptive-mix``'s chat phase, 2.5 in its long phase). A learned
policy that chooses a *multiplier* ``k`` on the safe budget only has to learn a
nearly constant ``k``; one that chooses the budget itself has to learn the
budget of every mix it meets (see ``docs/training.md``).

:class:`LoadTracker` keeps the estimates slot by slot from what is known at the
decision point of slot ``t`` and nothing else: the requests that arrived (their
count and prompt lengths), the KV tokens held and the active count, the
queue head's arrival, tokens wasted so far, and ``l + o`` of requests *once they
have completed* (an output length is never read before the request finishes).
It is O(1) per slot (no per-request work beyond summing the new arrivals'
prompt lengths).

The estimate of ``E[w]``: with ``l`` the mean arriving prompt (moving average), ``s``
the moving mean of ``l + o`` over completions, ``s2`` that of ``n`` times the square of
each slot's mean ``l + o`` (``n`` the slot's completions: the spread between slots, not
within one), ``o = s - l`` and ``Var = s2 - s^2``, ``w ~ l o + (o^2 + Var) / 2``. This is
biased low against ``E[l o + o (o + 1) / 2]``: it leaves out the ``o / 2`` term, and
``Var`` misses the spread within a slot, more so the more requests complete a slot
(measured on a fixed mix of outputs 20/40/60 after prompts of 10: ``E[w]`` 5% low at 0.3
arrivals a slot, 10% at 3.5; outputs 2/200: 1% low at 0.05, 16% at 0.5), so the safe
budget ``M / E[w]`` reads 5-20% high under load. Kept as it is: the shipped generalist's
multipliers were searched on it (a constant bias is a multiplier's; the load dependence
is not). It is floored by a lower bound that
needs no completion (an active request's ``l + j`` bounds its ``l + o``), so a system
where nothing completes (thrashing) still gets an estimate. Before anything has
been seen it is unknown and the safe budget is the cap.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["LoadTracker", "RATE_TIME_CONSTANTS", "BACKLOG_TIME_CONSTANTS", "LOAD_FEATURES", "LOAD_FEATURES_V2",
           "LOAD_FEATURES_V3", "LOAD_FEATURES_V4", "SWING_TIME_CONSTANT", "FEATURE_VERSIONS", "RATE_MEMORY"]

#: Time constants (decision points) of the arrival-rate moving averages.
RATE_TIME_CONSTANTS = (8.0, 32.0, 128.0, 512.0)

#: Time constants (decision points) of the moving averages of ``backlog_slots`` in ``version=3``.
BACKLOG_TIME_CONSTANTS = (64.0, 1024.0)

#: Decision points of arrival-rate history kept for :meth:`LoadTracker.head_rate` (a ring buffer): a
#: queue head that arrived longer ago reads the oldest rate kept.
RATE_MEMORY = 4096

#: Names of :meth:`LoadTracker.features`, in order (each scale-free: no ``M`` or rate units).
LOAD_FEATURES = (
    "kv_usage",  # tokens held / M
    "projected_usage",  # (held + active * mean remaining-life tokens) / M, capped at 4
    "backlog_slots",  # log(1 + queued / safe budget): slots of starts the queue holds
    "backlog_demand",  # log(1 + queued * E[w] / M): the queue's KV demand in cache-lifetimes
    "log_safe_budget",  # log2(safe budget) / 8
    "rho_8", "rho_32", "rho_128", "rho_512",  # rate * E[w] / M at the 4 time constants, capped at 8
    "rate_8", "rate_32", "rate_128", "rate_512",  # log(1 + rate / safe budget)
    "length_trend",  # log(fast / slow moving mean of completed l + o)
    "head_age",  # log(1 + age of the queue head / mean l + o)
    "eviction_pressure",  # recent wasted tokens per slot * 100 / M, capped at 10
    "active_ratio",  # log(1 + active / (safe budget * mean l + o))
)

#: Names of the features of ``version=2`` (``observation="load-v2"``): :data:`LOAD_FEATURES`, then three
#: that tell a change of mix from overload sooner than ``E_hat[w]`` (whose completions lag by their
#: lifetimes), each scale-free too.
LOAD_FEATURES_V2 = LOAD_FEATURES + (
    "head_rate",  # log(1 + rate when the queue head arrived / safe budget)
    "completion_rate",  # log(1 + completions per decision point (time constant 16) / safe budget)
    "queue_prompt",  # log(mean prompt of the queue / mean arriving prompt); 0 when the queue is empty
)

#: Names of the features of ``version=3`` (``observation="load-v3"``): :data:`LOAD_FEATURES_V2`, then the
#: backlog's recent past, an exponentially weighted frame stack of ``backlog_slots``: a backlog that has
#: stood for a thousand slots (stationary overload) reads differently from one a burst just built.
LOAD_FEATURES_V3 = LOAD_FEATURES_V2 + (
    "backlog_64",  # backlog_slots, moving average with time constant 64
    "backlog_1024",  # backlog_slots, moving average with time constant 1024
)

#: Time constant (decision points) of the moving means of the swings in ``version=4``.
SWING_TIME_CONSTANT = 1024.0

#: Names of the features of ``version=4`` (``observation="load-v4"``): :data:`LOAD_FEATURES_V3`, then how
#: much the load has *swung* over the last thousand or so decision points: moving means (time constant
#: :data:`SWING_TIME_CONSTANT`, bias-corrected, so a mean over what was seen early on) of the absolute gap
#: between a fast and a slow estimate. A stationary load, however heavy, reads near 0 in all three; a mix
#: that changes reads high in ``prompt_swing`` or ``length_swing``; a rate that changes, in ``rate_swing``.
#: No feature before says this: each reads the load now (or a moving mean of it), so a burst and the
#: start of a long overload look alike to them for hundreds of slots.
LOAD_FEATURES_V4 = LOAD_FEATURES_V3 + (
    "rate_swing",  # mean of |rate_32 - rate_512| (each log(1 + rate / safe budget))
    "prompt_swing",  # mean of |log(mean arriving prompt, time constant 32 / the same, 512)|
    "length_swing",  # mean of |length_trend|: |log(fast / slow moving mean of completed l + o)|
)

#: The feature names of each version of :meth:`LoadTracker.features` (the one place that lists the versions).
FEATURE_VERSIONS = {1: LOAD_FEATURES, 2: LOAD_FEATURES_V2, 3: LOAD_FEATURES_V3, 4: LOAD_FEATURES_V4}


class LoadTracker:
    """Slot-by-slot estimates of the load from what a server knows (see the module docstring).

    Args:
        M: KV-cache budget in tokens.
        cap: largest safe budget reported (and the safe budget before anything is known).
        length_window: time constant (decision points) of the moving means of lengths.
        swings: keep the moving means of the swings (:data:`LOAD_FEATURES_V4`'s three; needed for
            ``features(version=4)``). Off by default: they cost work every slot, which only version 4 reads
            (the environment keeps them for ``observation="load-v4"`` only).

    Call :meth:`reset` with the engine after its first arrivals, then
    :meth:`update` at every later decision point (after ``serve`` and ``arrive``).
    """

    def __init__(self, M: int, *, cap: float = 256.0, length_window: float = 64.0, swings: bool = False) -> None:
        self.M = int(M)
        self.keeps_swings = bool(swings)
        self._g = 1.0 - 1.0 / SWING_TIME_CONSTANT
        self.cap = float(cap)
        self._d = 1.0 / float(length_window)
        self._a = 1.0 / np.asarray(RATE_TIME_CONSTANTS)
        self._ab = 1.0 / np.asarray(BACKLOG_TIME_CONSTANTS)
        self.backlogs = np.zeros(len(BACKLOG_TIME_CONSTANTS))
        self.rates = np.zeros(len(RATE_TIME_CONSTANTS))
        self._rh = np.zeros(RATE_MEMORY)  # rate_32 at decision point t, at index t % RATE_MEMORY
        self._rt = np.full(RATE_MEMORY, -1, np.int64)  # the t stored there (-1: none)
        self.reset_state()

    def reset_state(self) -> None:
        """Forget everything (the state of an empty system)."""
        self.rates[:] = 0.0
        self.backlogs[:] = 0.0
        self._swS = [0.0, 0.0, 0.0]  # moving sums of the swings, and of their weights
        self._swN = 0.0
        self._pA = [0.0, 0.0]  # arriving prompt tokens, time constants 32 and 512
        self._pN = [0.0, 0.0]  # arrivals, the same
        self._rt[:] = -1
        self._head_rate = 0.0
        self._started = False
        self._A = self._A2 = self._N = 0.0  # moving sums of l+o, (l+o)^2 / n, completions
        self._Af = self._Nf = 0.0  # the same, faster (time constant 16)
        self._lA = self._lN = 0.0  # arriving prompt lengths
        self._waste = 0.0
        self._w0 = 0
        self._held = 0
        self._nact = 0
        self._queued = 0
        self._work: float | None = None  # the estimates, set once per decision point by _observe
        self._safe = self.cap

    def reset(self, eng: Any) -> None:
        """Start tracking the engine ``eng`` at its first decision point."""
        self.reset_state()
        self._w0 = eng.wasted_tokens
        self._observe(eng, completed=0, completed_tokens=0)

    def update(self, eng: Any, completed: int) -> None:
        """The next decision point: ``completed`` requests finished in the slot just served."""
        self._observe(eng, completed=completed, completed_tokens=eng.last_completed_tokens if completed else 0)

    def _observe(self, eng: Any, completed: int, completed_tokens: int) -> None:
        k = eng.last_arrivals
        first = not self._started
        if first:
            self.rates[:] = k
            self._started = True
        else:
            self.rates += (k - self.rates) * self._a
        d = self._d
        n, s = completed, float(completed_tokens)
        self._A = (1 - d) * self._A + s
        self._N = (1 - d) * self._N + n
        self._A2 = (1 - d) * self._A2 + (s * s / n if n else 0.0)
        self._Af = (15 / 16) * self._Af + s
        self._Nf = (15 / 16) * self._Nf + n
        hi = eng.n_arrived
        tok = float(eng.prompt[hi - k : hi].sum()) if k else 0.0  # the new arrivals' prompt tokens
        self._lA = (1 - d) * self._lA + tok
        self._lN = (1 - d) * self._lN + k
        self._held, self._nact, self._queued = eng.held, eng.n_active, eng.n_queued
        t = int(eng.t)
        i = t % RATE_MEMORY
        self._rh[i], self._rt[i] = self.rates[1], t
        self._head_rate = self._rate_at_head(eng, t)
        w = eng.wasted_tokens
        self._waste += (w - self._w0 - self._waste) / 32.0
        self._w0 = w
        self._work = w_hat = self._work_now()
        self._safe = self.cap if w_hat is None else float(min(max(self.M / max(w_hat, 1.0), 0.5), self.cap))
        b = math.log1p(self._queued / self._safe)  # backlog_slots now
        if first:
            self.backlogs[:] = b
        else:
            self.backlogs += (b - self.backlogs) * self._ab
        if self.keeps_swings:
            self._swing(tok, k)

    def _swing(self, tok: float, k: int) -> None:
        """Add this decision point's swings to their moving sums (``version=4``): ``tok`` prompt tokens
        arrived in ``k`` requests."""
        pa, pn = self._pA, self._pN  # arriving prompt tokens and requests, time constants 32 and 512
        pa[0] = (31 / 32) * pa[0] + tok
        pn[0] = (31 / 32) * pn[0] + k
        pa[1] = (511 / 512) * pa[1] + tok
        pn[1] = (511 / 512) * pn[1] + k
        bs = self._safe
        r = self.rates
        x_rate = abs(math.log1p(r[1] / bs) - math.log1p(r[3] / bs))
        x_prompt = 0.0
        if pn[0] > 1e-6 and pn[1] > 1e-6:
            x_prompt = abs(math.log(max(pa[0] / pn[0], 1.0) / max(pa[1] / pn[1], 1.0)))
        g, S = self._g, self._swS
        S[0] = g * S[0] + x_rate
        S[1] = g * S[1] + x_prompt
        S[2] = g * S[2] + abs(self._length_trend())
        self._swN = g * self._swN + 1.0

    @property
    def swings(self) -> np.ndarray:
        """``rate_swing``, ``prompt_swing``, ``length_swing``: the moving sums over the sum of their weights
        (zeros before the first decision point, or when the tracker does not keep them)."""
        n = self._swN
        return np.array(self._swS) / n if n else np.zeros(3)

    def _length_trend(self) -> float:
        """``log(fast / slow moving mean of completed l + o)`` (0 before the first completion)."""
        s = self.mean_length or 1.0
        sf = self._Af / self._Nf if self._Nf > 1e-6 else s
        return math.log(max(sf, 1.0) / max(s, 1.0))

    # ------------------------------------------------------------------ estimates

    @property
    def mean_length(self) -> float | None:
        """Moving mean of ``l + o`` over completed requests (``None`` before the first completion)."""
        return self._A / self._N if self._N > 1e-6 else None

    @property
    def work(self) -> float | None:
        """The estimate of ``E[w]`` (token-slots per request); ``None`` while nothing is known."""
        return self._work

    def _work_now(self) -> float | None:
        """:attr:`work` from the moving sums (computed once per decision point)."""
        l = self._lA / self._lN if self._lN > 1e-6 else 0.0
        w_lb = None
        if self._nact:
            o_lb = max(self._held / self._nact - l, 1.0)
            w_lb = l * o_lb + 0.5 * o_lb * o_lb
        if self._N > 1e-6:
            s = self._A / self._N
            var = max(self._A2 / self._N - s * s, 0.0)
            o = max(s - l, 1.0)
            w = l * o + 0.5 * (o * o + var)
            return w if w_lb is None else max(w, w_lb)
        return w_lb

    @property
    def queued(self) -> int:
        """Requests waiting at the last decision point (that slot's arrivals included)."""
        return self._queued

    def arrival_rate(self) -> float:
        """Arrivals per decision point, moving average with time constant 32."""
        return float(self.rates[1])

    def _rate_at_head(self, eng: Any, t: int) -> float:
        """``rate_32`` at the decision point the queue head arrived (the oldest kept if earlier; the
        rate now if the queue is empty or the head came before tracking started)."""
        if not eng.n_queued:
            return float(self.rates[1])
        a = max(_head_arrival(eng), t - RATE_MEMORY + 1)
        j = a % RATE_MEMORY
        return float(self._rh[j]) if self._rt[j] == a else float(self.rates[1])

    def head_rate(self) -> float:
        """The arrival rate (time constant 32) when the request now at the queue head arrived.

        The queue is served in order, so its head is what the next budget admits: after the
        arrivals slow down, a backlog of requests that came at a high rate (a short-request phase)
        still waits, and admitting it at the rate it came keeps the cache busy; a budget anchored
        on the rate *now* starves it (``docs/training.md``, "Two anchors"). The arrival rate now
        if the queue is empty.
        """
        return self._head_rate

    def safe_budget(self) -> float:
        """``M / E_hat[w]`` clipped to ``[0.5, cap]`` (the cap while ``E[w]`` is unknown)."""
        return self._safe

    def features(self, eng: Any, out: np.ndarray | None = None, version: int = 1) -> np.ndarray:
        """The scale-free features as float32 (into ``out`` if given): :data:`LOAD_FEATURES` with
        ``version=1``, :data:`LOAD_FEATURES_V2` with ``version=2``, :data:`LOAD_FEATURES_V3` with
        ``version=3``, :data:`LOAD_FEATURES_V4` with ``version=4`` (each version's features start with the
        previous one's)."""
        if version not in FEATURE_VERSIONS:
            raise ValueError(f"load features: version must be one of {sorted(FEATURE_VERSIONS)}, got {version!r}")
        if version >= 4 and not self.keeps_swings:
            raise ValueError("load features: version 4 reads the swings, which this tracker does not keep "
                             "(LoadTracker(..., swings=True))")
        M = self.M
        bs = self.safe_budget()
        w = self.work or 1.0
        s = self.mean_length or 1.0
        q = eng.n_queued
        age = eng.t - _head_arrival(eng) if q else 0
        v = out if out is not None else np.empty(len(FEATURE_VERSIONS[version]), np.float32)
        v[0] = eng.held / M
        v[1] = min((eng.held + eng.n_active * 0.5 * s) / M, 4.0)
        v[2] = math.log1p(q / bs)
        v[3] = math.log1p(q * w / M)
        v[4] = math.log2(bs) / 8.0
        for i, r in enumerate(self.rates.tolist()):
            v[5 + i] = min(r * w / M, 8.0)
            v[9 + i] = math.log1p(r / bs)
        v[13] = self._length_trend()
        v[14] = math.log1p(max(age, 0) / max(s, 1.0))
        v[15] = min(100.0 * self._waste / M, 10.0)
        v[16] = math.log1p(eng.n_active / bs / max(s, 1.0))
        if version >= 2:
            v[17] = math.log1p(self._head_rate / bs)
            v[18] = math.log1p(self._Nf / 16.0 / bs)
            l_in = self._lA / self._lN if self._lN > 1e-6 else 0.0
            v[19] = math.log(max(eng.queued_prompt_tokens / q, 1.0) / max(l_in, 1.0)) if q else 0.0
        if version >= 3:
            v[20], v[21] = self.backlogs.tolist()
        if version >= 4:
            n = self._swN or 1.0
            v[22], v[23], v[24] = (x / n for x in self._swS)
        return v


def _head_arrival(eng: Any) -> int:
    """Arrival slot of the request at the queue head: the oldest of the non-empty lanes' heads
    (the engine must have a queued request)."""
    return min(int(eng.arrival[int(ln.buf[ln.head])]) for ln in eng.lanes if len(ln))
