"""Training distributions: a new workload (and cache size) for every episode.

A model trained on one scenario learns that scenario's budgets. The generalist is
trained on a *distribution* of scenarios instead, drawn afresh at every reset, and
reads a scale-free observation (``observation="load"`` or ``"load-v2"``) and acts through
multipliers of the arrival rate and of the online safe budget (``action="log-multiplier"``),
so nothing it sees or does carries the units of one workload.

:class:`RandomMix` is the built-in distribution (``flowgym train --distribution random-mix``).
Every field has a documented default; pass a mapping of overrides as
``{"kind": "random-mix", "field": value, ...}`` (in Python, ``ARSConfig(distribution=...)``, or on the
command line, ``flowgym train --distribution '{...}'``; a scenario file does not hold one). Draws are a pure
function of the generator: same seed, same workloads.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgym.sim._checks import MAX_COUNT, is_finite_real, is_real
from flowgym.sim.workloads import MAX_ARRIVAL_SECONDS, EmpiricalLengths, make_workload

__all__ = ["RandomMix", "DISTRIBUTIONS", "DRAW_KEYS", "check_overrides", "make_distribution"]


#: Shortest ``trace_window`` (seconds of the original trace).
MIN_TRACE_WINDOW = 100.0

#: The environment arguments a training draw decides for itself: its cache, its arrivals, its length and its
#: clock (a trace piece runs in continuous time, a slot draw has no ``time_model``). Training with a
#: distribution takes the report scenario's other arguments over every draw, never these.
DRAW_KEYS = ("M", "workload", "horizon", "time_model")

def check_overrides(env_overrides: Mapping[str, Any]) -> None:
    """Refuse environment overrides of what every draw of a distribution sets itself (:data:`DRAW_KEYS`): training
    on a distribution would drop them silently. ``ValueError`` names the first."""
    for bad in DRAW_KEYS:
        if bad in env_overrides:
            raise ValueError(f"env_overrides may not set {bad!r} when training on a distribution: each draw sets its "
                             f"own {', '.join(DRAW_KEYS)} (M and horizon: the distribution's fields; a draw runs in "
                             "slots, a trace piece in its trace_time_model; docs/training.md)")


#: The largest load ``rho`` a range of :class:`RandomMix` may ask for (a stream's, while on): ten times what the
#: cache serves is overload enough; far more asks the simulator for millions of arrivals a slot, refused only when
#: an episode builds its workload.
MAX_RHO = 10.0


@functools.lru_cache(maxsize=1)
def _shortest_trace_span() -> float:
    """Seconds from the first to the last request of the shorter Azure trace (read once)."""
    from flowgym.sim.datasets import AZURE_KINDS, azure_columns

    return min(float(azure_columns(k)[0][-1]) for k in AZURE_KINDS)


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


@dataclass(frozen=True)
class RandomMix:
    """Randomised mixes of request streams, phases and loads (the generalist's training distribution).

    Each draw (one episode):

    * ``M`` log-uniform in ``M_range`` (``azure_M_range`` when a stream uses Azure lengths);
    * with probability ``stationary_p`` one stream at a constant rate, else 2 or 3 streams
      that take turns: stream ``k`` is on for a phase of ``phase_range`` slots (log-uniform, so
      phases of a few hundred slots are as common as phases of a few thousand; uniform with
      ``phase_scale="uniform"``, the distribution before 2026-11-26), then the next,
      repeating (with probability ``background_p`` a stream keeps a background rate of
      ``background_range`` times its own while off);
    * a stream's lengths: with probability ``azure_p`` the Azure ``conv`` or ``code`` trace's
      (l, o) pairs, else three pairs ``(l, o/2), (l, o), (l, 3o/2)`` with ``l`` log-uniform in
      ``prompt_range`` and ``o`` in ``output_range``, fitted to the draw's cache: ``l`` capped at ``M // 4``
      and ``o`` halved (again if need be, to 1 at least) until ``l + 3o/2`` is below ``M`` (so ranges beyond a
      small cache are clipped per draw, not refused);
    * a stream's load while on: ``rho`` uniform in ``rho_range`` (``overload_rho_range`` with
      probability ``overload_p`` for a stationary draw: the paper's overloaded regime; with
      probability ``phase_overload_p``, default 0, for a stream of a draw that takes turns, so
      that an overload phase can end in a light one), its rate ``rho * M / E[w]``; both ranges end at
      :data:`MAX_RHO` or less;
    * with probability ``shared_lengths_p`` (default 0) the streams of a draw that takes turns share the
      first stream's lengths, so its phases differ in load only, not in request mix (the kind of load
      of ``adaptive-switch``, ``adaptive-diurnal``); the coin is tossed only when it is above 0, so the
      draws of 0 are those from before the field;
    * with probability ``trace_p`` the draw is instead a **piece of an Azure trace** (``conv`` or
      ``code``, real timestamps and lengths): from a start time uniform in the first 90% of
      ``trace_window`` (seconds of the original trace, at least 100 s wide and within both traces;
      the default, the first half hour, is the part the
      ``adaptive-azure-conv`` scenario tunes on, so its report half hour stays held out) to the
      window's end, inter-arrival times divided by a ``rate_multiplier`` log-uniform in
      ``trace_rate_range``, ``M`` log-uniform in ``azure_M_range``, in continuous time with the
      batch latency model ``trace_time_model`` (a step is one iteration, time in seconds; the
      ``"slowdown"`` reward, which scales slot-time draws, needs ``trace_p=0``). The
      coin for it is tossed after the rest of the draw, so a draw that is not a piece is the
      same whatever ``trace_p`` is.
    """

    M_range: tuple[float, float] = (6000.0, 40000.0)
    azure_M_range: tuple[float, float] = (32768.0, 131072.0)
    stationary_p: float = 0.3
    overload_p: float = 0.4
    phase_overload_p: float = 0.0
    shared_lengths_p: float = 0.0
    phase_range: tuple[int, int] = (200, 3000)
    phase_scale: str = "log"
    background_p: float = 0.3
    background_range: tuple[float, float] = (0.05, 0.3)
    azure_p: float = 0.1
    prompt_range: tuple[float, float] = (4.0, 200.0)
    output_range: tuple[float, float] = (6.0, 220.0)
    rho_range: tuple[float, float] = (0.3, 1.15)
    overload_rho_range: tuple[float, float] = (1.0, 1.5)
    trace_p: float = 0.15
    trace_window: tuple[float, float] = (0.0, 1800.0)
    trace_rate_range: tuple[float, float] = (0.1, 1.0)
    trace_time_model: str = "llama2-70b-tp2-a100"
    horizon: int = 4000
    #: ``"time"``: the environment's reward (requests in system per slot, over ``reward_scale``
    #: 100), so a draw's return is its time in system times its arrival rate and high-rate draws
    #: weigh most; ``"slowdown"``: ``reward_scale`` is the draw's mean output tokens arriving per
    #: slot (``mean rate * E[o]``), so a draw's return is its mean *slowdown* (time in system over
    #: the mean output length) and every draw weighs alike, whatever its rate and lengths.
    reward: str = "time"

    kind = "random-mix"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("_range"):
                if (not isinstance(v, (tuple, list)) or len(v) != 2
                        or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                   and 0 < x <= 1e15 for x in v) or v[0] > v[1]):  # the range first: no float(10**400)
                    raise ValueError(f"random-mix: {f.name} must be [low, high] with 0 < low <= high <= 1e15, "
                                     f"got {v!r}")
            elif f.name.endswith("_p"):
                if not is_real(v) or not 0 <= v <= 1:
                    raise ValueError(f"random-mix: {f.name} must be a probability in [0, 1], got {v!r}")
        for name in ("rho_range", "overload_rho_range"):  # a stream's load while on, against what the cache serves
            if getattr(self, name)[1] > MAX_RHO:
                raise ValueError(f"random-mix: {name} must end at {MAX_RHO:g} or less (a load {MAX_RHO:g} times what "
                                 f"the cache serves), got {getattr(self, name)!r}")
        if self.background_range[1] > 1:  # a fraction of the stream's own rate: above it, no longer a background
            raise ValueError(f"random-mix: background_range must end at 1 or less (a stream's rate while off, as a "
                             f"fraction of its rate while on), got {self.background_range!r}")
        for name, floor in (("M_range", 4), ("azure_M_range", 4), ("prompt_range", 1), ("output_range", 1)):
            if getattr(self, name)[0] < floor:  # a cache of 3 tokens holds no request of prompt 1 and output 2
                raise ValueError(f"random-mix: {name} must start at {floor} or more, got {getattr(self, name)!r}")
        if not all(isinstance(x, int) or (isinstance(x, float) and x.is_integer()) for x in self.phase_range) \
                or self.phase_range[0] < 1:
            raise ValueError(f"random-mix: phase_range must be [low, high] whole slots with low >= 1, "
                             f"got {self.phase_range!r}")
        w = self.trace_window
        if (not isinstance(w, (tuple, list)) or len(w) != 2
                or not all(isinstance(x, (int, float)) and is_finite_real(x) for x in w)
                or not 0 <= w[0] < w[1]):
            raise ValueError(f"random-mix: trace_window must be [start, end] seconds with 0 <= start < end, got {w!r}")
        if w[1] - w[0] < MIN_TRACE_WINDOW:
            raise ValueError(f"random-mix: trace_window must span at least {MIN_TRACE_WINDOW:g} s (a piece starts in "
                             f"its first 90%), got {w!r}")
        if self.trace_p > 0:
            span = _shortest_trace_span()
            if w[1] > span:
                raise ValueError(f"random-mix: trace_window must end within both Azure traces (by {span:.0f} s), "
                                 f"got {w!r}")
            floor = (w[1] - w[0]) / MAX_ARRIVAL_SECONDS  # a piece divided by the multiplier must fit the clock
            if self.trace_rate_range[0] < floor:
                raise ValueError(f"random-mix: trace_rate_range must start at {floor:.3g} or more (a piece of up to "
                                 f"{w[1] - w[0]:g} s of trace_window, its time divided by the multiplier, must end "
                                 f"within the {MAX_ARRIVAL_SECONDS} s a timed arrival may take), "
                                 f"got {self.trace_rate_range!r}")
        if not isinstance(self.trace_time_model, str) or self.trace_time_model == "slot":
            raise ValueError("random-mix: trace_time_model must be a latency preset name (a trace's arrivals are "
                             f"in seconds), got {self.trace_time_model!r}")
        from flowgym.sim.latency import make_latency_model

        try:
            make_latency_model(self.trace_time_model)
        except ValueError as e:
            raise ValueError(f"random-mix: trace_time_model: {e}") from None
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or not 1 <= self.horizon <= MAX_COUNT:
            raise ValueError(f"random-mix: horizon must be a positive integer up to 2**53, got {self.horizon!r}")
        if self.phase_scale not in ("log", "uniform"):
            raise ValueError(f"random-mix: phase_scale must be 'log' or 'uniform', got {self.phase_scale!r}")
        if self.reward not in ("time", "slowdown"):
            raise ValueError(f"random-mix: reward must be 'time' or 'slowdown', got {self.reward!r}")
        if self.reward == "slowdown" and self.trace_p > 0:
            raise ValueError("random-mix: reward='slowdown' needs trace_p=0 (it scales slot-time draws; a trace "
                             f"piece's reward is in seconds per iteration), got trace_p={self.trace_p!r}")

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> RandomMix:
        """From ``{"kind": "random-mix", field: value, ...}`` (unknown fields are named in the error)."""
        kw = {k: v for k, v in dict(spec).items() if k != "kind"}
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(kw) - names)
        if bad:
            raise ValueError(f"random-mix has no field(s) {bad}; fields: {sorted(names)}")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
        return cls(**kw)

    def to_spec(self) -> dict[str, Any]:
        """The mapping :meth:`from_spec` reads back."""
        d = {f.name: (list(v) if isinstance(v, tuple) else v) for f in dataclasses.fields(self)
             for v in [getattr(self, f.name)]}
        return {"kind": self.kind, **d}

    # ------------------------------------------------------------------ draws

    def _lengths(self, rng: np.random.Generator, M: int) -> dict[str, Any]:
        o = _loguniform(rng, *self.output_range)
        l_max = max(1, int(M // 4))
        while True:
            l = int(_loguniform(rng, *self.prompt_range))
            pairs = [[min(l, l_max), max(1, int(round(o * f)))] for f in (0.5, 1.0, 1.5)]
            if pairs[-1][0] + pairs[-1][1] < M:
                return {"kind": "empirical", "pairs": pairs, "weights": [1.0, 1.0, 1.0]}
            o = max(1.0, o / 2)

    def __call__(self, rng: np.random.Generator) -> dict[str, Any]:
        """One episode's ``FlowControl-v0`` arguments (``M``, ``workload``, ``horizon``, unknown lengths)."""
        stationary = rng.random() < self.stationary_p
        n = 1 if stationary else int(rng.choice([2, 2, 3]))
        azure = [rng.random() < self.azure_p for _ in range(n)]
        M = int(_loguniform(rng, *(self.azure_M_range if any(azure) else self.M_range)))
        lo, hi = (int(x) for x in self.phase_range)  # whole slots (checked), perhaps written as floats
        durations = ([int(rng.integers(lo, hi + 1)) for _ in range(n)] if self.phase_scale == "uniform"
                     else [min(int(hi), max(int(lo), int(round(_loguniform(rng, lo, hi))))) for _ in range(n)])
        period = float(sum(durations))
        # tossed only when asked, so that the draws of 0 are those from before the field
        shared = not stationary and self.shared_lengths_p > 0 and rng.random() < self.shared_lengths_p
        streams: list[dict[str, Any]] = []
        start = 0.0
        out_per_slot = 0.0  # mean output tokens arriving per slot (the slowdown reward's scale)
        for k in range(n):
            if shared and k > 0:
                lengths = copy.deepcopy(streams[0]["lengths"])
            else:
                lengths = ({"kind": "azure", "trace": str(rng.choice(["conv", "code"]))} if azure[k]
                           else self._lengths(rng, M))
            if stationary:
                rho_range = self.overload_rho_range if rng.random() < self.overload_p else self.rho_range
            else:  # the coin is tossed only when phase_overload_p > 0, so the draws of 0 are those from before it
                over = self.phase_overload_p > 0 and rng.random() < self.phase_overload_p
                rho_range = self.overload_rho_range if over else self.rho_range
            rho = float(rng.uniform(*rho_range))
            unit = make_workload({"kind": "iid", "rate": 1.0, "lengths": lengths}).load(M)
            rate = rho / unit
            if n == 1:
                spec: Any = rate
                mean_rate = rate
            else:
                bg = float(rng.uniform(*self.background_range)) * rate if rng.random() < self.background_p else 0.0
                mean_rate = (rate * durations[k] + bg * (period - durations[k])) / period
                t_on, t_off = start, start + durations[k]
                times = sorted({0.0, t_on, t_off} - {period})
                spec = {"kind": "steps", "times": times, "rates": [rate if t_on <= t < t_off else bg for t in times],
                        "period": period}
            streams.append({"kind": "iid", "rate": spec, "lengths": lengths})
            start += durations[k]
            if self.reward == "slowdown":
                out_per_slot += mean_rate * _mean_output(lengths)
        workload = streams[0] if n == 1 else {"kind": "mix", "streams": streams}
        drawn = {"M": M, "workload": workload, "horizon": self.horizon, "output_length_known": False}
        if self.reward == "slowdown":
            drawn["reward_scale"] = max(out_per_slot, 1e-6)
        if self.trace_p > 0 and rng.random() < self.trace_p:
            return self._trace_piece(rng)
        try:  # a draw the simulator refuses is refused here, naming what to change, not when its episode starts
            make_workload(workload)
        except ValueError as e:
            raise ValueError(f"random-mix: a draw (M = {M}) asks more of the simulator than it holds ({e}); narrow "
                             "M_range, rho_range or overload_rho_range, or raise prompt_range or output_range") from None
        return drawn

    def _trace_piece(self, rng: np.random.Generator) -> dict[str, Any]:
        """A piece of an Azure trace in continuous time (see the class docstring)."""
        trace = str(rng.choice(["conv", "code"]))
        M = int(_loguniform(rng, *self.azure_M_range))
        lo, hi = (float(x) for x in self.trace_window)
        start = float(rng.uniform(lo, lo + 0.9 * (hi - lo)))
        rm = _loguniform(rng, *self.trace_rate_range)
        workload = {"kind": "azure", "trace": trace, "rate_multiplier": rm, "window": [start, hi]}
        try:  # refused here, naming the fields, not when the draw's episode starts (the trace is cached: cheap)
            make_workload(workload)
        except ValueError as e:
            raise ValueError(f"random-mix: a trace piece (the {trace} trace from {start:.2f} s to {hi:g} s of "
                             f"trace_window, rate multiplier {rm:.3g} of trace_rate_range) is refused: {e}; change "
                             "trace_window or trace_rate_range") from None
        return {"M": M, "workload": workload, "horizon": self.horizon, "output_length_known": False,
                "time_model": self.trace_time_model}


def _mean_output(lengths: Mapping[str, Any]) -> float:
    """``E[o]`` of a length distribution: exact for empirical pairs, else the mean of 20,000 draws
    from a fixed generator (the episode's own generator is not touched)."""
    dist = make_workload({"kind": "iid", "rate": 1.0, "lengths": dict(lengths)}).lengths  # type: ignore[attr-defined]
    if isinstance(dist, EmpiricalLengths):
        return float((dist.p * dist.pairs[:, 1]).sum())
    _, out = dist.sample(np.random.default_rng(0), 20_000)
    return float(np.mean(out))


#: Built-in training distributions by name.
DISTRIBUTIONS: dict[str, type[RandomMix]] = {"random-mix": RandomMix}


def make_distribution(spec: str | Mapping[str, Any] | Callable[[np.random.Generator], dict[str, Any]]) -> Any:
    """A distribution from its name, its mapping (``{"kind": name, field: value}``) or a callable ``rng -> kwargs``."""
    if callable(spec) and not isinstance(spec, Mapping):
        return spec
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"distribution must be a name, a mapping or a callable, got {spec!r}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in DISTRIBUTIONS:
        raise ValueError(f"unknown training distribution {kind!r}; known: {sorted(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[kind].from_spec(spec)
