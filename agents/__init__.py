"""Agents for FlowControl-v0 (``flowgym.agents``): the paper's flow control, its baselines, reference budgets.

Every agent has ``reset(config, seed)`` and ``act(observation, view)``, and
declares the environment options it needs (``env_options()``). Build one by
name with :func:`make_agent` (``"flow-control"``, ``"rate-switch"``, ``"alpha-greedy"``, ``"mc"``,
``"mc-sf"``, ``"a-min"``, ``"greedy-lifo"``, ``"fixed"``, ``"random"``, ``"safe-budget"``, ``"two-anchor"``,
``"schedule"``, the production admission controllers ``"sglang-reserve"`` (SGLang's adaptive
``new_token_ratio`` reservation) and ``"trt-no-evict"`` (TensorRT-LLM's GUARANTEED_NO_EVICT), and ``"learned"``,
a policy trained by ``flowgym train`` (no path: the shipped generalist, numpy only; or a
Stable-Baselines3 policy: ``make_agent("learned", path=...)``).

Layer 3 of the package: agents import :mod:`flowgym.envs` (the observation, the
read-only :class:`~flowgym.envs.view.SystemView`, the config) and never the engine.
The repository keeps them in its top-level ``agents/`` folder; they are installed
and imported as ``flowgym.agents`` (``package-dir`` in ``pyproject.toml``).
"""

from __future__ import annotations

from typing import Any

if __name__ != "flowgym.agents":  # the repository's agents/ folder, imported from its top
    raise ImportError(
        "flowgym's agents are imported as 'flowgym.agents' (the repository's agents/ folder is "
        "installed under that name: pip install -e .), not as a top-level 'agents' package"
    )

from flowgym.agents.adaptive import SafeBudget, ScheduledBudget, TwoAnchorBudget
from flowgym.agents.base import Agent
from flowgym.agents.flow_control import FixedBudget, FlowControl, RandomBudget, RateSwitch
from flowgym.agents.greedy import AlphaProtectionGreedy, GreedyLIFO
from flowgym.agents.learned import LearnedBudget
from flowgym.agents.memory_check import MCSF, AMin, MemoryCheck
from flowgym.agents.production import GuaranteedNoEvict, SGLangReservation

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
    "SafeBudget",
    "TwoAnchorBudget",
    "ScheduledBudget",
    "SGLangReservation",
    "GuaranteedNoEvict",
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
    "safe-budget": SafeBudget,
    "two-anchor": TwoAnchorBudget,
    "schedule": ScheduledBudget,
    "sglang-reserve": SGLangReservation,
    "trt-no-evict": GuaranteedNoEvict,
    "learned": LearnedBudget,
}


def make_agent(name: str, **params: Any) -> Agent:
    """An agent by name with its parameters, e.g. ``make_agent("flow-control", b=12)``.

    A bad name or parameter raises ``ValueError`` naming the agent."""
    if not isinstance(name, str) or name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; known: {sorted(AGENTS)}")
    cls = AGENTS[name]
    import inspect

    accepted = [n for n, p in inspect.signature(cls).parameters.items()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"agent {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters: {', '.join(accepted) or 'none'}")
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"agent {name!r}: {e}") from None
    except ValueError as e:  # the constructor names the parameter; the agent is named here unless it did
        if str(e).startswith((f"agent {name!r}", f"{name} agent")):  # e.g. "learned agent: ..."
            raise
        raise ValueError(f"agent {name!r}: {e}") from None
