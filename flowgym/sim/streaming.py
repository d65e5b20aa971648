"""Bounded-memory records for long runs: the engine's ``record="stream"`` mode.

In the default ``record="full"`` mode :class:`~flowgym.sim.engine.Engine` keeps
one row per request and one record per slot forever (about 70 bytes per
request), so metrics can be recomputed from the full history. In
``record="stream"`` mode the engine drops finished and rejected requests from
its request table (renumbering the ones left) and keeps, instead of the
history:

* exact running sums for every metric of :func:`flowgym.sim.metrics.compute_metrics`
  that is a count or a mean (:class:`StreamTotals`): integers in slots, so the
  means equal the full mode's; in continuous time float sums of the same terms,
  equal up to float rounding (relative ``1e-12`` in the tests);
* a :class:`QuantileSketch` of the latencies for ``p95_latency``;
* the last :data:`STREAM_WINDOW` slots' records (``series()``), and the KV usage
  series decimated into at most ``2 * DECIMATED_POINTS`` block means (for plots).

Memory is then bounded by the requests in the system (queued, active, drawn
but not arrived) plus constants, whatever the length of the run.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["QuantileSketch", "StreamTotals", "STREAM_WINDOW", "DECIMATED_POINTS", "SKETCH_ALPHA",
           "SKETCH_EXACT_BELOW"]

#: Slots of per-slot records ``series()`` keeps in streaming mode (the most recent ones).
STREAM_WINDOW = 4096
#: The decimated KV usage series holds between this many and twice this many block means.
DECIMATED_POINTS = 1024
#: Relative accuracy of the latency sketch's log buckets.
SKETCH_ALPHA = 1e-3
#: Integer latencies (slots) below this are counted exactly by the sketch.
SKETCH_EXACT_BELOW = 1 << 16


class QuantileSketch:
    """Quantiles of a stream of non-negative values in bounded memory.

    Values go to logarithmic buckets ``(gamma**(i-1), gamma**i]`` with
    ``gamma = (1 + alpha) / (1 - alpha)`` (the DDSketch construction), each
    represented by ``2 gamma**i / (gamma + 1)``, which is within relative
    ``alpha`` of every value in the bucket. With ``integers=True`` (latencies
    in slots) the integers below ``exact_below`` are counted exactly, one
    counter each, and only larger values are bucketed. Values below ``1e-12``
    (with ``integers=False``) are counted as 0.

    :meth:`quantile` follows ``numpy.percentile``'s default (linear)
    interpolation between the order statistics ``x_(lo)`` and ``x_(lo+1)``
    around rank ``(n - 1) q``, using each one's representative. Its error
    against the exact value is at most ``alpha * x_(lo+1)`` (so about
    ``alpha`` relative), and zero when both order statistics are exactly
    counted integers.

    Memory: one counter per exact integer seen (at most ``exact_below``) plus one
    per bucket between the smallest and largest bucketed value:
    ``log(max / min) / log(gamma)``, about 1,150 per factor of 10 at ``alpha = 1e-3``.
    """

    _TINY = 1e-12

    def __init__(self, alpha: float = SKETCH_ALPHA, *, integers: bool = False,
                 exact_below: int = SKETCH_EXACT_BELOW) -> None:
        if not (0.0 < alpha < 1.0):
            raise ValueError(f"alpha (relative accuracy) must be in (0, 1), got {alpha!r}")
        self.alpha = float(alpha)
        self.gamma = (1.0 + alpha) / (1.0 - alpha)
        self._log_gamma = math.log(self.gamma)
        self.integers = bool(integers)
        self.exact_below = int(exact_below) if integers else 0
        self.count = 0
        self._zero = 0  # values counted as 0 (float mode)
        self._exact = np.zeros(0, np.int64)  # counts of integers 0..size-1
        self._buckets = np.zeros(0, np.int64)  # counts of buckets _lo.._lo+size-1
        self._lo = 0

    def copy(self) -> QuantileSketch:
        """An independent copy."""
        c = QuantileSketch.__new__(QuantileSketch)
        c.__dict__.update(self.__dict__)
        c._exact = self._exact.copy()
        c._buckets = self._buckets.copy()
        return c

    def add(self, values: np.ndarray) -> None:
        """Count ``values`` (non-negative, finite)."""
        v = np.asarray(values)
        if v.ndim > 1 or v.dtype.kind not in "iuf":  # text, objects, bools, a table: not a stream of numbers
            raise ValueError(f"QuantileSketch.add: values must be a one-dimensional array of numbers, got "
                             f"{v.dtype} of shape {v.shape}")
        if v.size == 0:
            return
        if v.dtype.kind == "f" and not np.isfinite(v).all() or (v < 0).any():
            raise ValueError("QuantileSketch.add: values must be finite and non-negative")
        if self.integers and v.dtype.kind == "f" and (v != np.floor(v)).any():  # the exact counters would truncate
            raise ValueError("QuantileSketch.add: this sketch counts integers (integers=True), got fractional values")
        self.count += int(v.size)
        if self.integers:
            small = v < self.exact_below
            ex = v[small].astype(np.int64)
            if ex.size:
                need = int(ex.max()) + 1
                if need > self._exact.size:
                    grown = np.zeros(max(need, min(2 * self._exact.size, self.exact_below)), np.int64)
                    grown[: self._exact.size] = self._exact
                    self._exact = grown
                self._exact += np.bincount(ex, minlength=self._exact.size)
            big = v[~small].astype(np.float64)
        else:
            f = v.astype(np.float64)
            tiny = f < self._TINY
            self._zero += int(tiny.sum())
            big = f[~tiny]
        if big.size == 0:
            return
        idx = np.ceil(np.log(big) / self._log_gamma).astype(np.int64)
        lo, hi = int(idx.min()), int(idx.max())
        if self._buckets.size == 0:
            self._lo = lo
            self._buckets = np.zeros(hi - lo + 1, np.int64)
        elif lo < self._lo or hi >= self._lo + self._buckets.size:
            new_lo = min(lo, self._lo)
            new_hi = max(hi, self._lo + self._buckets.size - 1)
            grown = np.zeros(new_hi - new_lo + 1, np.int64)
            grown[self._lo - new_lo : self._lo - new_lo + self._buckets.size] = self._buckets
            self._buckets, self._lo = grown, new_lo
        self._buckets += np.bincount(idx - self._lo, minlength=self._buckets.size)

    def _value_at(self, r: int, cz: int, ce: np.ndarray, cb: np.ndarray) -> float:
        """The representative of the ``r``-th smallest value (0-based)."""
        if r < cz:
            return 0.0
        ne = int(ce[-1]) if ce.size else 0
        if r < cz + ne:
            return float(np.searchsorted(ce, r - cz, side="right"))
        i = int(np.searchsorted(cb, r - cz - ne, side="right"))
        return 2.0 * self.gamma ** (self._lo + i) / (self.gamma + 1.0)

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (``0 <= q <= 1``), as ``numpy.percentile(values, 100 q)``; ``nan`` when empty."""
        if not (0.0 <= q <= 1.0):
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        n = self.count
        if n == 0:
            return float("nan")
        ce = np.cumsum(self._exact)
        cb = np.cumsum(self._buckets)
        h = (n - 1) * q
        lo = int(math.floor(h))
        t = h - lo
        a = self._value_at(lo, self._zero, ce, cb)
        if lo + 1 >= n:
            return a
        b = self._value_at(lo + 1, self._zero, ce, cb)
        d = b - a  # numpy's _lerp: exact at both ends
        return b - d * (1.0 - t) if t >= 0.5 else a + d * t

    @property
    def nbytes(self) -> int:
        """Bytes held by the counters."""
        return int(self._exact.nbytes + self._buckets.nbytes)


class StreamTotals:
    """The running sums behind the streaming mode's metrics (see :mod:`flowgym.sim.streaming`).

    Two parts. Requests: the engine folds finished requests into these sums when
    it drops them from its table (:meth:`fold_requests`). Slots: the engine folds
    each block of slot records (:meth:`fold_slots`): KV usage sums (Python ints,
    exact), its maximum, a ring of the last :data:`STREAM_WINDOW` records and the
    decimated usage series.
    """

    def __init__(self, n_fields: int, timed: bool, window: int = STREAM_WINDOW,
                 points: int = DECIMATED_POINTS) -> None:
        self.timed = timed
        # requests dropped from the table
        self.done = 0  #: finished requests folded
        self.rejected = 0  #: rejected requests folded
        self.latency: int | float = 0.0 if timed else 0  #: sum of their latencies (slots or seconds)
        self.output_tokens = 0  #: sum of their output lengths
        self.sketch = QuantileSketch(integers=not timed)
        # slots
        self.slots = 0
        self.usage_sum = 0
        self.usage_sq = 0
        self.usage_max = 0
        self.window = int(window)
        self.ring = np.zeros((self.window, n_fields), np.int64)
        self.ring_time = np.zeros(self.window, np.float64)
        self._points = int(points)
        self.dec = np.zeros(2 * self._points, np.float64)  #: block means of KV usage (tokens)
        self.dec_n = 0
        self.dec_block = 1  #: slots per block mean
        self._carry_sum = 0
        self._carry_n = 0

    def fold_requests(self, latency: np.ndarray, output_len: np.ndarray) -> None:
        """Add finished requests (their latencies and output lengths)."""
        if latency.size == 0:
            return
        self.done += int(latency.size)
        self.latency += float(latency.sum()) if self.timed else int(latency.sum())
        self.output_tokens += int(output_len.sum())
        self.sketch.add(latency)

    def fold_slots(self, records: list, times: np.ndarray | None) -> None:
        """Add consecutive slot records (``SlotStats`` tuples; ``times``: their end times, continuous time)."""
        k = len(records)
        if k == 0:
            return
        usage = [r[1] for r in records]
        self.usage_sum += sum(usage)
        self.usage_sq += sum(u * u for u in usage)
        self.usage_max = max(self.usage_max, max(usage))
        W = self.window
        pos = np.arange(self.slots, self.slots + k) % W
        self.ring[pos] = records
        if times is not None:
            self.ring_time[pos] = times
        self.slots += k
        self._decimate(usage)

    def _decimate(self, usage: list) -> None:
        i, n = 0, len(usage)
        while i < n:
            take = min(self.dec_block - self._carry_n, n - i)
            self._carry_sum += sum(usage[i : i + take])
            self._carry_n += take
            i += take
            if self._carry_n == self.dec_block:
                self.dec[self.dec_n] = self._carry_sum / self.dec_block
                self.dec_n += 1
                self._carry_sum = self._carry_n = 0
                if self.dec_n == self.dec.size:  # halve the resolution
                    P = self._points
                    self.dec[:P] = self.dec.reshape(P, 2).mean(axis=1)
                    self.dec_n = P
                    self.dec_block *= 2

    def window_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The last ``min(slots, window)`` records in slot order, and their end times."""
        n = min(self.slots, self.window)
        pos = np.arange(self.slots - n, self.slots) % self.window
        return self.ring[pos], self.ring_time[pos]

    def usage_moments(self, M: int) -> tuple[float, float, float]:
        """Mean, population standard deviation and maximum of ``U_t / M`` over the slots folded."""
        T = self.slots
        if T == 0:
            nan = float("nan")
            return nan, nan, nan
        mean = float(Fraction(self.usage_sum, T * M))
        var = Fraction(T * self.usage_sq - self.usage_sum * self.usage_sum, T * T * M * M)
        return mean, math.sqrt(float(var)), self.usage_max / M

    def decimated_usage(self, M: int) -> np.ndarray:
        """The decimated KV usage series (block means of ``U_t / M``, ``dec_block`` slots each)."""
        return self.dec[: self.dec_n] / M

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (bounded: independent of the run's length)."""
        return int(self.ring.nbytes + self.ring_time.nbytes + self.dec.nbytes + self.sketch.nbytes)
