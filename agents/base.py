"""The agent interface shared by scripted and learned policies.

An agent is a small object with :meth:`Agent.reset` and :meth:`Agent.act`. It
declares the environment options it needs (:meth:`Agent.env_options`: length
knowledge, queue order, eviction rule, per-class budgets) and the evaluation
path (:func:`flowgym.lab.evaluation.run_episode`) builds each agent's environment
from the scenario plus those options; so every agent of a comparison sees the
same arrivals for the same seed. An agent reads only the observation and the
read-only :class:`flowgym.envs.view.SystemView`, never the engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowgym.envs.flow_control import FlowControlConfig
from flowgym.envs.view import SystemView
from flowgym.sim.admission import AdmissionRule

__all__ = ["Agent"]


class Agent:
    """Base class: a policy choosing the activation budget each slot.

    Subclasses set :attr:`name` and override :meth:`act` (and :meth:`reset`
    when they keep state or draw random numbers).
    """

    #: Short name used in tables and plots.
    name: str = "agent"
    #: Environment options the agent needs (merged into the scenario's; a conflict is an error).
    requires: dict[str, Any] = {}

    def env_options(self) -> dict[str, Any]:
        """Environment options this agent needs (a fresh dict)."""
        return dict(self.requires)

    def reset(self, config: FlowControlConfig, seed: int | None = None) -> None:
        """Start an episode in an environment built with ``config``.

        ``seed`` seeds the agent's own randomness (independent of the workload's).
        """
        self.config = config
        self.rng = np.random.default_rng(seed)

    def act(self, observation: Any, view: SystemView) -> Any:
        """The action for the current slot: ``B_t`` (or per-class budgets)."""
        raise NotImplementedError

    def admission_rule(self, view: SystemView) -> AdmissionRule | None:
        """The rule :meth:`act` follows as data, when it is one the engine runs compiled
        (:class:`~flowgym.sim.admission.AdmissionRule`), else ``None`` (the default).

        Called after :meth:`reset`. Evaluation then runs the episode in one compiled loop
        (:meth:`flowgym.envs.flow_control.FlowControlEnv.run_rule`) with the same results as
        calling :meth:`act` every step; ``tests/test_compiled_episode.py`` checks each agent that
        states one.
        """
        return None

    def label(self) -> str:
        """Name with parameters, for tables."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label()!r})"
