"""Batch latency models: how long one batch iteration takes, from what is in it.

In continuous-time mode one environment step is one batch iteration and the
clock advances by its duration. A model maps the iteration's composition to
seconds:

* ``P``: prompt tokens prefilled in the iteration (the prompts of the requests
  admitted into it),
* ``D``: decoding requests (active requests that were already running),
* ``K``: KV tokens those decoding requests attend over (``sum l_i + j_i``),
* ``B``: all requests in the batch (``D`` plus the newly admitted).

:class:`LinearLatency` is ``d = c0 + c_prefill * P + c_decode * D + c_kv * K``
(seconds). :class:`CallableLatency` wraps a user function. :data:`PRESETS` holds
named models with their provenance; :func:`make_latency_model` builds one from
a name or a mapping (the JSON form ``gym.make`` stores in its spec).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from flowgym.sim._checks import is_real, non_negative

__all__ = [
    "LatencyModel",
    "LinearLatency",
    "JailletLatency",
    "CallableLatency",
    "PRESETS",
    "make_latency_model",
    "MAX_ITERATION_SECONDS",
]


#: The longest batch iteration a callable model may give (seconds): beyond it the time scale is not a
#: serving system's (and an idle clock would have to cover it chunk by chunk). The built-in models bound
#: each coefficient by it instead (in their own unit), not their sum over a batch: their durations are
#: computed as a step runs, and the compiled loop computes them too.
MAX_ITERATION_SECONDS = 3600.0
#: The shortest batch iteration a model may give (seconds): no serving system iterates faster, and a float64
#: clock at a timed trace's largest arrival (:data:`flowgym.sim.workloads.MAX_ARRIVAL_SECONDS`) still resolves
#: it. The built-in models check their fixed term against it (``c0``, Jaillet's ``c``): every other term adds.
MIN_ITERATION_SECONDS = 1e-6


def _coef(name: str, v: Any, unit: str = "s") -> float:
    """A coefficient in seconds (``unit="s"``, :class:`LinearLatency`) or milliseconds (``"ms"``,
    :class:`JailletLatency`), non-negative and at most :data:`MAX_ITERATION_SECONDS` in that unit's terms."""
    x = non_negative(f"latency coefficient {name}", v)
    limit = MAX_ITERATION_SECONDS * (1000.0 if unit == "ms" else 1.0)
    if x > limit:
        word, other = ("milliseconds", "seconds") if unit == "ms" else ("seconds", "milliseconds")
        raise ValueError(f"latency coefficient {name} = {v!r} {word} is beyond any serving system's time scale "
                         f"(at most {limit:.0f} {word}; this model's coefficients are in {word}, not {other})")
    return x


class LatencyModel:
    """Duration in seconds of one batch iteration."""

    name = "base"

    def duration(self, P: int, D: int, K: int, B: int) -> float:
        """Seconds for an iteration prefilling ``P`` prompt tokens, decoding ``D`` requests
        holding ``K`` KV tokens, ``B`` requests in all."""
        raise NotImplementedError

    def to_spec(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no mapping form")


class LinearLatency(LatencyModel):
    """``d = c0 + c_prefill * P + c_decode * D + c_kv * K`` seconds.

    Args:
        c0: fixed cost per iteration (s).
        c_prefill: per prompt token prefilled (s).
        c_decode: per decoding request (s).
        c_kv: per KV token attended by the decoding requests (s).
    """

    name = "linear"

    def __init__(self, c0: float, c_prefill: float = 0.0, c_decode: float = 0.0, c_kv: float = 0.0) -> None:
        self.c0 = _coef("c0", c0)
        self.c_prefill = _coef("c_prefill", c_prefill)
        self.c_decode = _coef("c_decode", c_decode)
        self.c_kv = _coef("c_kv", c_kv)
        if self.c0 < MIN_ITERATION_SECONDS:
            raise ValueError(f"latency coefficient c0 must be at least {MIN_ITERATION_SECONDS:g} seconds (an "
                             f"iteration takes time; the clock would not resolve less), got {c0!r}")

    def duration(self, P: int, D: int, K: int, B: int) -> float:
        return self.c0 + self.c_prefill * P + self.c_decode * D + self.c_kv * K

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "linear", "c0": self.c0, "c_prefill": self.c_prefill,
                "c_decode": self.c_decode, "c_kv": self.c_kv}

    def __repr__(self) -> str:
        return f"LinearLatency(c0={self.c0}, c_prefill={self.c_prefill}, c_decode={self.c_decode}, c_kv={self.c_kv})"


class JailletLatency(LatencyModel):
    """Jaillet et al. (2025)'s batch time for Llama2-70B on two A100s (M = 16492):

    ``d_ms = (0.0027 * mean context + 0.52) * batch size + 44.6 + 0.378 * prompt tokens``,

    with the mean context the mean KV tokens per request in the batch
    (``(K + P) / B``) and the batch size ``B``.
    """

    name = "jaillet"

    def __init__(self, a: float = 0.0027, b: float = 0.52, c: float = 44.6, p: float = 0.378) -> None:
        self.a, self.b, self.c, self.p = (_coef(n, v, "ms") for n, v in (("a", a), ("b", b), ("c", c), ("p", p)))
        if self.c < MIN_ITERATION_SECONDS * 1000:  # as LinearLatency's c0: an idle iteration would take no time
            raise ValueError(f"latency coefficient c (milliseconds per iteration) must be at least "
                             f"{MIN_ITERATION_SECONDS * 1000:g} (an iteration takes time; the clock would not "
                             f"resolve less), got {c!r}")

    def duration(self, P: int, D: int, K: int, B: int) -> float:
        mean_ctx = (K + P) / B if B else 0.0
        return ((self.a * mean_ctx + self.b) * B + self.c + self.p * P) / 1000.0

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "jaillet", "a": self.a, "b": self.b, "c": self.c, "p": self.p}


class CallableLatency(LatencyModel):
    """A user function ``f(P, D, K, B) -> seconds`` (checked each call: a real number, or a one-element numpy
    array, of 1e-6 to 3600 seconds)."""

    name = "callable"

    def __init__(self, fn: Callable[[int, int, int, int], float]) -> None:
        if not callable(fn):
            raise ValueError(f"latency model must be callable, got {fn!r}")
        self.fn = fn

    def duration(self, P: int, D: int, K: int, B: int) -> float:
        """``fn(P, D, K, B)`` checked; an exception from ``fn`` becomes a ``RuntimeError`` naming it.

        The engine calls this before a step changes anything (``Engine._preview_duration``), so
        after either error the environment is as before the step and the step can be retried.
        """
        try:
            got = self.fn(P, D, K, B)
        except Exception as e:  # noqa: BLE001 - user code: named and chained
            raise RuntimeError(f"time_model callable {self.label} raised {type(e).__name__}: {e} (for P={P}, "
                               f"D={D}, K={K}, B={B}; the step was not applied)") from e
        if hasattr(got, "item") and not isinstance(got, (str, bytes)):  # a one-element array or tensor: its number
            numel = getattr(got, "numel", None)  # torch: numel(); numpy: size
            if (numel() if callable(numel) else getattr(got, "size", None)) == 1:
                got = got.item()
        if not is_real(got):  # "0.1" or True would pass float()
            raise ValueError(f"time_model callable {self.label} returned {got!r} for P={P}, D={D}, K={K}, B={B}: "
                             "need a number of seconds (the step was not applied)")
        d = float(got)
        if not math.isfinite(d) or d < MIN_ITERATION_SECONDS or d > MAX_ITERATION_SECONDS:
            raise ValueError(f"time_model callable {self.label} returned {d!r} for P={P}, D={D}, K={K}, B={B}: "
                             f"need a duration of {MIN_ITERATION_SECONDS:g} to {MAX_ITERATION_SECONDS:g} seconds "
                             "(the step was not applied)")
        return d

    @property
    def label(self) -> str:
        """The callable's qualified name, for messages."""
        fn = self.fn
        return repr(getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", repr(fn)))


#: Named presets. Each carries its provenance in the comment above it (from ``shared/data/README.md``, which the
#: repository does not ship; ``docs/model.md`` lists them).
PRESETS: dict[str, dict[str, Any]] = {
    # Fitted to Vidur's public profiles of Llama-2-70B, tensor-parallel 2, on A100
    # (mean error about 3%): ms = 55.4 + 0.339 P + 0.166 D + 1.16e-4 K.
    "llama2-70b-tp2-a100": {"kind": "linear", "c0": 55.4e-3, "c_prefill": 0.339e-3,
                             "c_decode": 0.166e-3, "c_kv": 1.16e-7},
    # Jaillet et al. 2025, Llama2-70B on two A100s.
    "jaillet2025": {"kind": "jaillet"},
}


def make_latency_model(spec: LatencyModel | Mapping[str, Any] | str | Callable[..., float]) -> LatencyModel:
    """A latency model from a preset name, a mapping (``{"kind": "linear", ...}``), a callable, or as given."""
    if isinstance(spec, LatencyModel):
        return spec
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ValueError(f"unknown latency preset {spec!r}; presets: {sorted(PRESETS)}")
        spec = PRESETS[spec]
    if isinstance(spec, Mapping):
        kw = dict(spec)
        kind = kw.pop("kind", None)
        try:
            if kind == "linear":
                return LinearLatency(**kw)
            if kind == "jaillet":
                return JailletLatency(**kw)
        except TypeError as e:
            raise ValueError(f"latency model {kind!r}: {e}") from None
        raise ValueError(f"latency model kind must be 'linear' or 'jaillet', got {kind!r}")
    if callable(spec):
        return CallableLatency(spec)
    raise ValueError(f"time_model must be 'slot', a preset name, a mapping or a callable, got {spec!r}")
