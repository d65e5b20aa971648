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

__all__ = ["AgentSpec", "Scenario", "SCENARIOS", "get_scenario", "PAPER_CLASSES", "PAPER_M"]

#: The paper's synthetic classes (l_k, o_k), Section 4.1.
PAPER_CLASSES = [[10, 20], [10, 40], [10, 60]]
#: KV budget of Llama-2-70B on two A100s, as in the paper.
PAPER_M = 16492


@dataclass
class AgentSpec:
    """An agent by name and parameters, optionally with one parameter to tune by grid search."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    #: ``(parameter, grid)`` tuned on separate seeds before reporting, or ``None``.
    tune: tuple[str, list[Any]] | None = None
    #: Display name (defaults to the agent's own label).
    label: str | None = None

    def build(self, **override: Any) -> Any:
        """Instantiate the agent (``agents.make_agent``) with ``params`` updated by ``override``."""
        from agents import make_agent

        return make_agent(self.name, **{**self.params, **override})

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

    def env_kwargs(self) -> dict[str, Any]:
        return copy.deepcopy(self.env)


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


SCENARIOS = {
    "paper-synthetic-known": lambda rate=5.0: _paper_synthetic(True, rate),
    "paper-synthetic-unknown": lambda rate=5.0: _paper_synthetic(False, rate),
}


def get_scenario(name: str, *, rate: float | None = None) -> Scenario:
    """A named scenario; ``rate`` overrides its per-class arrival rate where it has one."""
    try:
        make = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}") from None
    return make() if rate is None else make(rate=rate)
