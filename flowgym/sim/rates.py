"""Arrival-rate schedules for time-varying Poisson arrivals.

A schedule gives the rate ``lambda(t)`` (per slot in discrete time, per second
in continuous time) and its integral, so that the number of arrivals in a
window is ``Poisson(integral)`` and their times follow the intensity.

* :class:`Constant` ``(rate)``
* :class:`Steps` ``(times, rates)``: ``rates[k]`` from ``times[k]`` on
  (``times[0] == 0``); with ``period`` it repeats.
* :class:`Sinusoid` ``(mean, amplitude, period, phase=0)``: a diurnal cycle,
  ``mean + amplitude * sin(2 pi (t / period + phase))`` (``amplitude <= mean``).
* :class:`Bursts` ``(base, burst, every, duration, start=0)``: ``burst`` for
  ``duration`` at the start of every ``every`` (from ``start``), else ``base``.

:meth:`RateSchedule.zero_until` tells where a stretch of zero rate ends, so that an idle
continuous-time engine skips it instead of drawing it window by window.

Mapping forms: ``{"kind": "steps", "times": [...], "rates": [...]}``, etc.; a
plain number is a constant rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowgym.sim._checks import non_negative, positive

__all__ = ["RateSchedule", "Constant", "Steps", "Sinusoid", "Bursts", "make_rate"]


_nonneg = non_negative
_positive = positive


class RateSchedule:
    """Arrival rate over time."""

    def rate(self, t: np.ndarray) -> np.ndarray:
        """``lambda(t)`` at each time."""
        raise NotImplementedError

    def integral(self, t0: np.ndarray | float, t1: np.ndarray | float) -> np.ndarray:
        """``int_{t0}^{t1} lambda``: expected arrivals in ``[t0, t1)``."""
        raise NotImplementedError

    def peak(self) -> float:
        """An upper bound of ``lambda``."""
        raise NotImplementedError

    def mean(self) -> float:
        """Long-run mean rate."""
        raise NotImplementedError

    def to_spec(self) -> Any:
        raise NotImplementedError

    def zero_until(self, t: float) -> float:
        """The end ``z >= t`` of a stretch ``[t, z]`` where the rate is 0 and :meth:`integral` of every
        window inside it is exactly ``0.0`` (so sampling such a window draws nothing from the
        generator: ``Generator.poisson(0.0)`` consumes no random number); ``inf`` when the rate stays 0
        from ``t`` on. ``t`` itself when no such stretch starts at ``t`` (the default: none is known).
        """
        return float(t)

    def sample_times(self, rng: np.random.Generator, t0: float, t1: float) -> np.ndarray:
        """Sorted arrival times of a Poisson process with this intensity on ``[t0, t1)``."""
        n = int(rng.poisson(float(self.integral(t0, t1))))
        if n == 0:
            return np.zeros(0)
        peak = self.peak()
        out: list[np.ndarray] = []
        got = 0
        while got < n:  # rejection sampling from the normalised intensity
            c = _before(rng.uniform(t0, t1, size=2 * (n - got) + 8), t1)
            c = c[rng.random(c.size) * peak < self.rate(c)]
            out.append(c)
            got += c.size
        return np.sort(np.concatenate(out)[:n])


def _before(times: np.ndarray, t1: float) -> np.ndarray:
    """``times`` drawn by ``Generator.uniform(t0, t1)``, kept below ``t1``: the draw is ``t0 + (t1 - t0) u``
    with ``u < 1``, which rounding can still make ``t1`` (e.g. ``60 + 60 (1 - 2^-53) == 120.0``). A chunk
    holds the arrivals of ``[t0, t1)``; the next chunk starts at ``t1``."""
    return np.minimum(times, np.nextafter(t1, -np.inf))


class Constant(RateSchedule):
    def __init__(self, rate: float) -> None:
        self.r = _nonneg("rate", rate)

    def rate(self, t: np.ndarray) -> np.ndarray:
        return np.full(np.shape(t), self.r)

    def integral(self, t0: Any, t1: Any) -> np.ndarray:
        return self.r * (np.asarray(t1, dtype=np.float64) - np.asarray(t0, dtype=np.float64))

    def peak(self) -> float:
        return self.r

    def mean(self) -> float:
        return self.r

    def zero_until(self, t: float) -> float:
        """``inf`` for a rate of 0 (nothing ever arrives), else ``t``."""
        return math.inf if self.r == 0 else float(t)

    def sample_times(self, rng: np.random.Generator, t0: float, t1: float) -> np.ndarray:
        n = int(rng.poisson(self.r * (t1 - t0)))
        return np.sort(_before(rng.uniform(t0, t1, size=n), t1))

    def to_spec(self) -> float:
        return self.r


class Steps(RateSchedule):
    """Piecewise-constant rate: ``rates[k]`` on ``[times[k], times[k+1])``, the last forever
    (or, with ``period``, the pattern repeats every ``period``)."""

    def __init__(self, times: Sequence[float], rates: Sequence[float], period: float | None = None) -> None:
        ts = [_nonneg(f"times[{i}]", x) for i, x in enumerate(times)]
        rs = [_nonneg(f"rates[{i}]", x) for i, x in enumerate(rates)]
        if not ts or len(ts) != len(rs):
            raise ValueError(f"steps need as many times as rates (>= 1), got {len(ts)} and {len(rs)}")
        if ts[0] != 0 or any(b <= a for a, b in zip(ts, ts[1:])):
            raise ValueError(f"step times must start at 0 and increase, got {list(times)}")
        self.times, self.rates = np.asarray(ts), np.asarray(rs)
        self.period = None if period is None else _positive("period", period)
        if self.period is not None and self.period <= ts[-1]:
            raise ValueError(f"period {period} must exceed the last step time {ts[-1]}")
        # cumulative integral at each step start
        widths = np.diff(np.append(self.times, self.period if self.period else self.times[-1]))
        self._cum = np.concatenate([[0.0], np.cumsum(self.rates * widths)])

    def _F(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        base = np.zeros_like(t)
        if self.period is not None:
            cycles = np.floor(t / self.period)
            t = t - cycles * self.period
            # t / period can round up to the next whole cycle (t = 1854, period 41.2: t ends a hair below 0),
            # or down, which would read the wrong step's rate: bring t back into [0, period)
            under, over = t < 0, t >= self.period
            cycles = cycles - under + over
            t = t + self.period * under - self.period * over
            base = cycles * self._cum[-1]
        k = np.searchsorted(self.times, t, side="right") - 1
        return base + self._cum[k] + self.rates[k] * (t - self.times[k])

    def rate(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        if self.period is not None:
            t = np.mod(t, self.period)
        return self.rates[np.searchsorted(self.times, t, side="right") - 1]

    def integral(self, t0: Any, t1: Any) -> np.ndarray:
        # the difference of two large cumulative sums can round below 0 over a zero-rate step
        # (-3e-11 after a few cycles); a Poisson mean must not be negative
        return np.maximum(self._F(t1) - self._F(t0), 0.0)

    def peak(self) -> float:
        return float(self.rates.max())

    def zero_until(self, t: float) -> float:
        """The end of the run of zero-rate steps that holds ``t`` (``t`` when its step's rate is positive).

        Without a period it is the next positive step's time (``inf`` after the last one): inside
        the run :meth:`integral` subtracts equal cumulative sums (the zero steps add ``0.0``), so
        every window integrates to exactly ``0.0``. With a period the run is cut at the end of
        ``t``'s cycle and kept a rounding margin (``2**-30`` of the cycle's end time, far above the
        float error of reducing a time to its cycle) inside the run's ends: there every time falls
        in the same cycle and zero step, so its cumulative sum is the same float. A run that
        crosses a cycle's end is then found again from the next cycle on."""
        t = float(t)
        if not math.isfinite(t) or t < 0:
            return t
        times, rates = self.times, self.rates
        n = rates.size
        if self.period is None:
            k = int(np.searchsorted(times, t, side="right")) - 1
            if rates[k] > 0:
                return t
            j = k + 1
            while j < n and rates[j] == 0:
                j += 1
            return math.inf if j == n else float(times[j])
        P = self.period
        if not (rates > 0).any():
            return math.inf
        c = math.floor(t / P)
        margin = (abs(c) + 1) * P * 2.0**-30
        tc = t - c * P  # t's place in its cycle (to rounding, which the margin covers)
        if not margin <= tc <= P - margin:
            return t
        k = int(np.searchsorted(times, tc, side="right")) - 1
        if rates[k] > 0 or tc < times[k] + margin:
            return t
        j = k + 1
        while j < n and rates[j] == 0:
            j += 1
        end = (P if j == n else float(times[j])) - margin
        if end <= tc:
            return t
        return max(t, c * P + end)

    def mean(self) -> float:
        if self.period is None:
            return float(self.rates[-1])
        return float(self._cum[-1] / self.period)

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "steps", "times": self.times.tolist(), "rates": self.rates.tolist()}
        if self.period is not None:
            out["period"] = self.period
        return out


class Sinusoid(RateSchedule):
    """``mean + amplitude * sin(2 pi (t / period + phase))`` (a diurnal pattern)."""

    def __init__(self, mean: float, amplitude: float, period: float, phase: float = 0.0) -> None:
        self.m = _nonneg("mean", mean)
        self.a = _nonneg("amplitude", amplitude)
        if self.a > self.m:
            raise ValueError(f"amplitude ({amplitude}) must not exceed mean ({mean}): rates must stay >= 0")
        self.period = _positive("period", period)
        try:
            self.phase = float(phase)
        except (TypeError, ValueError):
            raise ValueError(f"phase must be a finite number (a fraction of the period), got {phase!r}") from None
        if isinstance(phase, bool) or not np.isfinite(self.phase):
            raise ValueError(f"phase must be a finite number (a fraction of the period), got {phase!r}")

    def rate(self, t: np.ndarray) -> np.ndarray:
        return np.maximum(self.m + self.a * np.sin(2 * np.pi * (np.asarray(t, dtype=np.float64) / self.period + self.phase)), 0.0)

    def integral(self, t0: Any, t1: Any) -> np.ndarray:
        w = 2 * np.pi / self.period
        t0, t1 = np.asarray(t0, dtype=np.float64), np.asarray(t1, dtype=np.float64)
        ph = 2 * np.pi * self.phase
        # at a trough with amplitude == mean the exact integral is ~0 and rounding can make it slightly
        # negative (worse as t grows): clamped, as Steps clamps, so no Poisson draw sees a negative mean
        return np.maximum(self.m * (t1 - t0) - self.a / w * (np.cos(w * t1 + ph) - np.cos(w * t0 + ph)), 0.0)

    def peak(self) -> float:
        return self.m + self.a

    def mean(self) -> float:
        return self.m

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "sinusoid", "mean": self.m, "amplitude": self.a, "period": self.period, "phase": self.phase}


class Bursts(Steps):
    """``burst`` during ``duration`` at the start of every ``every`` (from ``start``), ``base`` otherwise."""

    def __init__(self, base: float, burst: float, every: float, duration: float, start: float = 0.0) -> None:
        self.spec = {"kind": "bursts", "base": base, "burst": burst, "every": every, "duration": duration,
                     "start": start}
        every, duration = _positive("every", every), _positive("duration", duration)
        if duration >= every:
            raise ValueError(f"burst duration ({duration}) must be shorter than every ({every})")
        start = _nonneg("start", start) % every
        if start == 0:
            super().__init__([0.0, duration], [burst, base], period=every)
        elif start + duration < every:
            super().__init__([0.0, start, start + duration], [base, burst, base], period=every)
        elif start + duration == every:  # the burst ends with the period
            super().__init__([0.0, start], [base, burst], period=every)
        else:
            over = start + duration - every
            super().__init__([0.0, over, start], [burst, base, burst], period=every)

    def to_spec(self) -> dict[str, Any]:
        return dict(self.spec)


def make_rate(spec: RateSchedule | Mapping[str, Any] | float) -> RateSchedule:
    """A schedule from a number (constant), a mapping with ``kind``, or as given."""
    if isinstance(spec, RateSchedule):
        return spec
    if isinstance(spec, Mapping):
        kw = dict(spec)
        kind = kw.pop("kind", None)
        cls = {"constant": Constant, "steps": Steps, "sinusoid": Sinusoid, "bursts": Bursts}.get(kind)  # type: ignore[arg-type]
        if cls is None:
            raise ValueError(f"rate kind must be constant, steps, sinusoid or bursts, got {kind!r}")
        try:
            return cls(**kw)
        except TypeError as e:
            raise ValueError(f"rate {kind!r}: {e}") from None
    return Constant(spec)  # type: ignore[arg-type]
