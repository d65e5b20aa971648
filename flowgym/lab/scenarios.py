"""Named scenarios shared by the CLI, the examples and the tests.

A :class:`Scenario` is the environment's arguments plus the agents a
comparison runs by default (with the parameter each one tunes, if any). Build
one with :func:`get_scenario`, optionally overriding the per-class arrival
rate: ``get_scenario("paper-synthetic-known", rate=3.5)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AgentSpec",
    "Scenario",
    "SCENARIOS",
    "ADAPTIVE_SCENARIOS",
    "get_scenario",
    "PAPER_CLASSES",
    "PAPER_M",
]

#: The paper's synthetic classes (l_k, o_k), Section 4.1.
PAPER_CLASSES = [[10, 20], [10, 40], [10, 60]]
#: KV budget of Llama-2-70B on two A100s, as in the paper.
PAPER_M = 16492


@dataclass
class AgentSpec:
    """An agent by name and parameters, optionally with one parameter to tune by grid search.

    A spec is data (it names an agent, it does not build one):
    :func:`flowgym.lab.evaluation.build_agent` instantiates it.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    #: ``(parameter, grid)`` tuned on separate seeds before reporting, or ``None``.
    tune: tuple[str, list[Any]] | None = None
    #: Display name (defaults to the agent's own label).
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> AgentSpec:
        """From ``name`` or ``name:key=value,key=value`` (values parsed as JSON, else strings).

        ``flow-control:b=12``, ``flow-control:b=[4,4,4]``, ``alpha-greedy:alpha=0.1``.
        """
        import json

        name, _, rest = text.partition(":")
        params: dict[str, Any] = {}
        if rest:
            for part in _split_params(rest):
                k, eq, v = part.partition("=")
                if not eq:
                    raise ValueError(f"agent {text!r}: parameter {part!r} is not key=value")
                try:
                    params[k.strip()] = json.loads(v)
                except json.JSONDecodeError:
                    params[k.strip()] = v
        return cls(name.strip(), params)


def _split_params(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        cur += ch
    if cur:
        out.append(cur)
    return out


@dataclass
class Scenario:
    """Environment arguments and the default line-up of a comparison."""

    name: str
    description: str
    env: dict[str, Any]
    agents: list[AgentSpec]
    default_rate: float | None = None
    #: Runs to the end of its finite workload (the env's ``horizon`` is only a safety cap)
    #: rather than being reported at given horizons.
    finite: bool = False
    #: Overrides of :attr:`env` for tuning runs (``workload`` entries are merged into the
    #: workload mapping). Finite scenarios tune on a smaller workload run to its end, so every
    #: grid value is judged on the same arrivals over the same drain, not on a cut at an
    #: iteration count (which in continuous time covers a different span of seconds per policy).
    tune_env: dict[str, Any] = field(default_factory=dict)
    #: Largest budget a learned policy gets by default on this scenario (``flowgym train``).
    learned_max_budget: int = 16
    #: Budget levels a learned policy chooses among by default (``None``: every budget
    #: ``0..learned_max_budget``); see :attr:`flowgym.lab.train.TrainConfig.budget_levels`.
    learned_budget_levels: tuple[int, ...] | None = None
    #: Wall time of ``flowgym compare --scenario NAME`` with its defaults on 2 cores (measured,
    #: tuning included; ``flowgym compare --help`` lists it), or ``None`` when not measured.
    run_time: str | None = None

    def env_kwargs(self) -> dict[str, Any]:
        return copy.deepcopy(self.env)

    def tune_env_kwargs(self) -> dict[str, Any]:
        """The environment arguments of tuning runs: :meth:`env_kwargs` with :attr:`tune_env` applied."""
        kw = self.env_kwargs()
        for k, v in copy.deepcopy(self.tune_env).items():
            if k == "workload" and isinstance(kw.get("workload"), dict):
                kw["workload"].update(v)
            else:
                kw[k] = v
        return kw


B_GRID = [8, 10, 12, 14, 16, 20, 24, 32]
ALPHA_GRID = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _paper_synthetic(known: bool, rate: float) -> Scenario:
    env = {
        "M": PAPER_M,
        "workload": {"kind": "poisson", "classes": copy.deepcopy(PAPER_CLASSES), "rates": float(rate)},
        "output_length_known": known,
        "max_budget": 1024,
    }
    agents = []
    if known:
        agents.append(AgentSpec("flow-control", {"b": [4, 4, 4]}, label="flow-control (Alg. 1) b=(4,4,4)"))
    agents += [
        AgentSpec("flow-control", {"b": 12}, tune=("b", B_GRID), label="flow-control (Alg. 2)"),
        AgentSpec("alpha-greedy", {"alpha": 0.1}, tune=("alpha", ALPHA_GRID), label="alpha-greedy"),
        AgentSpec("mc", label="MC"),
    ]
    agents.append(AgentSpec("mc-sf", label="MC-SF") if known else AgentSpec("a-min", label="A_min"))
    agents.append(AgentSpec("greedy-lifo", label="greedy-LIFO (vLLM-like)"))
    which = "known" if known else "unknown"
    return Scenario(
        name=f"paper-synthetic-{which}",
        description=(
            f"Dong & Cao Section 4.1 with {which} output lengths: classes (10,20), (10,40), (10,60), "
            f"Poisson lambda={rate:g} per class per slot, M={PAPER_M}."
        ),
        env=env,
        agents=agents,
        default_rate=5.0,
    )


B_GRID_TIMED = [1, 2, 3, 4, 6, 8, 12, 16, 24]


def _unknown_length_agents(b: int, grid: list[Any], fc_label: str) -> list[AgentSpec]:
    """The agents of the unknown-length scenarios: flow control (budget ``b``, tuned over ``grid``),
    alpha-greedy (tuned), MC, A_min and greedy-LIFO."""
    return [
        AgentSpec("flow-control", {"b": b}, tune=("b", grid), label=fc_label),
        AgentSpec("alpha-greedy", {"alpha": 0.1}, tune=("alpha", ALPHA_GRID), label="alpha-greedy"),
        AgentSpec("mc", label="MC"),
        AgentSpec("a-min", label="A_min"),
        AgentSpec("greedy-lifo", label="greedy-LIFO (vLLM-like)"),
    ]


def _timed_agents() -> list[AgentSpec]:
    return _unknown_length_agents(4, B_GRID_TIMED, "flow-control (Alg. 2)")


#: Safety cap on the iterations of a run-to-the-end scenario: a policy that never drains the
#: workload (e.g. a zero budget, or evict-all thrashing) is truncated there, its requests unfinished.
MAX_ITERATIONS = 1_000_000

#: KV budget of the Azure scenarios (tokens); see docs/reproduction.md for the reasoning.
AZURE_M = 131_072


#: Safety cap on the iterations of a tuning run (its workload is about a tenth of the full one).
MAX_TUNE_ITERATIONS = 200_000


def _timed(name: str, description: str, M: int, workload: dict[str, Any], rate: float,
           tune_workload: dict[str, Any]) -> Scenario:
    """A continuous-time scenario run to the end of its finite workload (Llama-2-70B latency).

    Tuning runs use ``tune_workload`` (merged into ``workload``), run to its end.
    """
    env = {"M": M, "workload": workload, "time_model": "llama2-70b-tp2-a100", "max_budget": 1024,
           "horizon": MAX_ITERATIONS}
    tune_env = {"workload": tune_workload, "horizon": MAX_TUNE_ITERATIONS}
    return Scenario(name, description, env, _timed_agents(), default_rate=rate, finite=True, tune_env=tune_env)


def _paper_realdata(rate: float, which: str) -> Scenario:
    return _timed(
        f"paper-realdata-{which}",
        f"Dong & Cao Section 4.2 stand-in: 50,000 requests with SYNTHETIC LMSYS-like lengths "
        f"(log-normals from published medians/means), Poisson {rate:g} req/s, M={PAPER_M}, "
        f"Llama-2-70B TP2 A100 batch latency, unknown output lengths.",
        PAPER_M,
        {"kind": "iid", "rate": float(rate), "lengths": {"kind": "lmsys-like"}, "n_requests": 50_000, "timed": True},
        rate,
        {"n_requests": 5_000},  # tuning: the first 5,000 requests of the tuning seeds, run to the end
    )


def _azure(trace: str, rate: float) -> Scenario:
    return _timed(
        f"azure-{trace}",
        f"Azure LLM inference trace 2023 ({trace}) replayed with its real timestamps "
        f"(rate multiplier {rate:g}), M={AZURE_M}, Llama-2-70B TP2 A100 batch latency, unknown lengths.",
        AZURE_M,
        {"kind": "azure", "trace": trace, "rate_multiplier": float(rate)},
        rate,
        {"window": [0.0, 900.0]},  # tuning: the trace's first 15 minutes (original time), run to the end
    )


# --------------------------------------------------------------------------- adaptivity

#: Per-class arrival rates of the adaptive scenarios: a low load (rho = 0.49) and an overload
#: (rho = 1.11, beyond Proposition 1's limit) of the paper's three classes at M = 16492.
ADAPTIVE_LOW, ADAPTIVE_HIGH = 2.0, 4.5
#: Slots of an adaptive episode (and of its reports): two full cycles of the switching and diurnal loads.
ADAPTIVE_HORIZON = 4000
#: Slots per cycle of the switching and diurnal loads (1000 slots low, 1000 high for the switch).
ADAPTIVE_PERIOD = 2000
#: Flow control's budget grid on the adaptive scenarios (finer around M / E[w] = 12.2).
B_GRID_ADAPTIVE = [4, 6, 8, 10, 11, 12, 13, 14, 16, 20, 24, 32]
#: Original-time windows (seconds) of the Azure conv trace: the first half hour trains and tunes,
#: the second half hour is held out for reports (a trace replay is the same for every seed).
AZURE_TRAIN_WINDOW, AZURE_REPORT_WINDOW = [0.0, 1800.0], [1800.0, 3600.0]


def _adaptive_agents(grid: list[Any]) -> list[AgentSpec]:
    return _unknown_length_agents(12, grid, "flow-control (best fixed b)")


def _adaptive(which: str, scale: float) -> Scenario:
    """The paper's three classes with unknown output lengths under a (time-varying) load.

    Arrivals are Poisson with total rate ``3 * lambda(t)`` and each request's class drawn
    uniformly, which is the same as three independent per-class Poisson processes at
    ``lambda(t)`` each. ``scale`` multiplies every rate.
    """
    s = _positive_scale(scale)
    lo, hi = 3 * ADAPTIVE_LOW * s, 3 * ADAPTIVE_HIGH * s
    if which == "low":
        rate: Any = lo
        what = f"stationary low load, lambda={ADAPTIVE_LOW * s:g} per class per slot"
    elif which == "high":
        rate = hi
        what = f"stationary overload, lambda={ADAPTIVE_HIGH * s:g} per class per slot"
    elif which == "switch":
        half = ADAPTIVE_PERIOD // 2
        rate = {"kind": "steps", "times": [0.0, float(half)], "rates": [lo, hi], "period": float(ADAPTIVE_PERIOD)}
        what = (f"load switching every {half} slots between lambda={ADAPTIVE_LOW * s:g} and "
                f"lambda={ADAPTIVE_HIGH * s:g} per class per slot (low first)")
    elif which == "diurnal":
        rate = {"kind": "sinusoid", "mean": (lo + hi) / 2, "amplitude": (hi - lo) / 2,
                "period": float(ADAPTIVE_PERIOD), "phase": -0.25}
        what = (f"diurnal sinusoid between lambda={ADAPTIVE_LOW * s:g} and {ADAPTIVE_HIGH * s:g} per class per "
                f"slot, period {ADAPTIVE_PERIOD} slots (starts at the trough)")
    else:  # pragma: no cover - internal
        raise ValueError(which)
    env = {
        "M": PAPER_M,
        "workload": {
            "kind": "iid",
            "rate": rate,
            "lengths": {"kind": "empirical", "pairs": copy.deepcopy(PAPER_CLASSES), "weights": [1.0, 1.0, 1.0]},
        },
        "output_length_known": False,
        "max_budget": 64,
        "horizon": ADAPTIVE_HORIZON,
    }
    return Scenario(
        name=f"adaptive-{which}",
        description=(f"Adaptivity: {what}; the paper's classes (10,20), (10,40), (10,60), M={PAPER_M}, "
                     f"unknown output lengths, {ADAPTIVE_HORIZON} slots."),
        env=env,
        agents=_adaptive_agents(B_GRID_ADAPTIVE),
        default_rate=1.0,
    )


#: The two request mixes of ``adaptive-mix``: short chat turns and long generations (uniform
#: over each list of ``(l, o)``), and their rates per slot while active (rho 0.81 and 0.96).
MIX_CHAT, MIX_LONG = [[10, 10], [10, 20], [10, 30]], [[10, 60], [10, 100], [10, 140]]
MIX_CHAT_RATE, MIX_LONG_RATE = 30.0, 2.4
#: Flow control's budget grid on ``adaptive-mix`` (the chat phase needs about 40, the long one 3-6).
B_GRID_MIX = [2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64]
#: The learned budget's levels on ``adaptive-mix``: log-spaced, so that a new policy explores
#: small budgets as much as large ones (with every budget 0..64 a near-uniform policy averages 32).
MIX_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64)


def _adaptive_mix(scale: float) -> Scenario:
    """A request mix that shifts every 1000 slots: chat turns, then long generations.

    Two independent Poisson streams (:class:`~flowgym.sim.workloads.Mixture`), each on for
    half of a 2000-slot cycle. The chat phase brings 30 requests per slot of ``w`` about
    400 token-slots (``rho = 0.81``); the long phase 2.4 per slot of ``w`` about 6,600
    (``rho = 0.96``). A budget small enough for the long phase starves the chat phase, and
    one large enough for the chat phase admits long requests greedily.
    """
    s = _positive_scale(scale)
    half = ADAPTIVE_PERIOD // 2

    def stream(rate: float, pairs: list[list[int]], first: bool) -> dict[str, Any]:
        rates = [rate * s, 0.0] if first else [0.0, rate * s]
        return {"kind": "iid", "rate": {"kind": "steps", "times": [0.0, float(half)], "rates": rates,
                                        "period": float(ADAPTIVE_PERIOD)},
                "lengths": {"kind": "empirical", "pairs": copy.deepcopy(pairs), "weights": [1.0] * len(pairs)}}

    env = {
        "M": PAPER_M,
        "workload": {"kind": "mix", "streams": [stream(MIX_CHAT_RATE, MIX_CHAT, True),
                                                stream(MIX_LONG_RATE, MIX_LONG, False)]},
        "output_length_known": False,
        "max_budget": 64,
        "horizon": ADAPTIVE_HORIZON,
    }
    return Scenario(
        name="adaptive-mix",
        description=(f"Adaptivity: the request mix shifts every {half} slots between chat turns "
                     f"(l,o) in {MIX_CHAT} at {MIX_CHAT_RATE * s:g}/slot and long generations in {MIX_LONG} at "
                     f"{MIX_LONG_RATE * s:g}/slot (chat first); M={PAPER_M}, unknown output lengths, "
                     f"{ADAPTIVE_HORIZON} slots."),
        env=env,
        agents=_unknown_length_agents(40, B_GRID_MIX, "flow-control (best fixed b)") + [
            AgentSpec("rate-switch", {"high": 40, "low": 4, "threshold": 10.0}, tune=("low", [2, 3, 4, 6, 8, 12]),
                      label="rate-switch (scripted, high=40)")],
        default_rate=1.0,
        learned_max_budget=64,
        learned_budget_levels=MIX_LEVELS,
    )


def _positive_scale(scale: Any) -> float:
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"rate (a load multiplier for the adaptive scenarios) must be a number, got {scale!r}") from None
    if not (s > 0 and s < float("inf")):
        raise ValueError(f"rate (a load multiplier for the adaptive scenarios) must be positive, got {scale!r}")
    return s


def _adaptive_azure(rate: float) -> Scenario:
    sc = _timed(
        "adaptive-azure-conv",
        f"Adaptivity: the Azure conv trace 2023, second half hour (held out; the first half hour trains and "
        f"tunes), real timestamps slowed by {rate:g}, M={AZURE_M}, Llama-2-70B TP2 A100 batch latency, "
        f"unknown lengths, run to the end.",
        AZURE_M,
        {"kind": "azure", "trace": "conv", "rate_multiplier": float(rate), "window": list(AZURE_REPORT_WINDOW)},
        rate,
        {"window": list(AZURE_TRAIN_WINDOW)},
    )
    sc.env["max_budget"] = 64
    sc.agents[0] = AgentSpec("flow-control", {"b": 4}, tune=("b", B_GRID_TIMED), label="flow-control (best fixed b)")
    return sc


#: The scenarios of ``flowgym train`` and ``benchmarks/bench_learned.py``.
ADAPTIVE_SCENARIOS = ("adaptive-low", "adaptive-high", "adaptive-switch", "adaptive-diurnal", "adaptive-mix",
                      "adaptive-azure-conv")


SCENARIOS = {
    "paper-synthetic-known": lambda rate=5.0: _paper_synthetic(True, rate),
    "paper-synthetic-unknown": lambda rate=5.0: _paper_synthetic(False, rate),
    "paper-realdata-low": lambda rate=10.0: _paper_realdata(rate, "low"),
    "paper-realdata-high": lambda rate=50.0: _paper_realdata(rate, "high"),
    # The trace's own rates (conv ~5.5 req/s, code ~2.6 req/s) are far beyond what the
    # Llama-2-70B TP2 latency preset can serve (prefill alone caps it near 2 req/s), so the
    # timestamps are slowed down by default to put the load near capacity.
    "azure-conv": lambda rate=0.25: _azure("conv", rate),
    "azure-code": lambda rate=0.4: _azure("code", rate),
    # ``rate`` of the adaptive synthetic scenarios multiplies every arrival rate (default 1).
    "adaptive-low": lambda rate=1.0: _adaptive("low", rate),
    "adaptive-high": lambda rate=1.0: _adaptive("high", rate),
    "adaptive-switch": lambda rate=1.0: _adaptive("switch", rate),
    "adaptive-diurnal": lambda rate=1.0: _adaptive("diurnal", rate),
    "adaptive-mix": lambda rate=1.0: _adaptive_mix(rate),
    "adaptive-azure-conv": lambda rate=0.25: _adaptive_azure(rate),
}


def get_scenario(name: str, *, rate: float | None = None) -> Scenario:
    """A named scenario; ``rate`` overrides its arrival rate (per class per slot for the
    synthetic ones, requests per second for paper-realdata, a speed-up of the Azure timestamps,
    a multiplier of every rate for the ``adaptive-*`` synthetic ones)."""
    try:
        make = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}") from None
    return make() if rate is None else make(rate=rate)
