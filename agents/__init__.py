"""Agents for FlowControl-v0: the paper's flow control, its baselines, reference budgets.

Every agent has ``reset(config, seed)`` and ``act(observation, view)``, and
declares the environment options it needs (``env_options()``). Build one by
name with :func:`make_agent` (``"flow-control"``, ``"rate-switch"``, ``"alpha-greedy"``, ``"mc"``,
``"mc-sf"``, ``"a-min"``, ``"greedy-lifo"``, ``"fixed"``, ``"random"``, and ``"learned"``,
a Stable-Baselines3 policy trained by ``flowgym train``: ``make_agent("learned", path=...)``).
"""

from __future__ import annotations

from typing import Any

from agents.base import Agent
from agents.flow_control import FixedBudget, FlowControl, RandomBudget, RateSwitch
from agents.greedy import AlphaProtectionGreedy, GreedyLIFO
from agents.learned import LearnedBudget
from agents.memory_check import MCSF, AMin, MemoryCheck

__all__ = [
    "Agent",
    "FlowControl",
    "RateSwitch",
    "FixedBudget",
    "RandomBudget",
    "AlphaProtectionGreedy",
    "GreedyLIFO",
    "MemoryCheck",
    "MCSF",
    "AMin",
    "LearnedBudget",
    "AGENTS",
    "make_agent",
]

#: Agent classes by name.
AGENTS: dict[str, type[Agent]] = {
    "flow-control": FlowControl,
    "rate-switch": RateSwitch,
    "alpha-greedy": AlphaProtectionGreedy,
    "mc": MemoryCheck,
    "mc-sf": MCSF,
    "a-min": AMin,
    "greedy-lifo": GreedyLIFO,
    "fixed": FixedBudget,
    "random": RandomBudget,
    "learned": LearnedBudget,
}


def make_agent(name: str, **params: Any) -> Agent:
    """An agent by name with its parameters, e.g. ``make_agent("flow-control", b=12)``."""
    try:
        cls = AGENTS[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {sorted(AGENTS)}") from None
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"agent {name!r}: {e}") from None
