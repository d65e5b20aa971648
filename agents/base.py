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

__all__ = ["Agent", "int_param", "DEFAULT_REQUEST"]

#: The ``max_budget`` an agent without its own cap asks the environment for (the environment takes the larger of
#: this and the scenario's): room for a large batch, not a limit of the agent's.
DEFAULT_REQUEST = 1024
#: Largest integer parameter an agent takes (a budget or cap): the environment's own limit on ``max_budget``.
MAX_INT_PARAM = 10**9


def int_param(label: str, v: Any, minimum: int = 0) -> int:
    """``v`` as an int; raises ``ValueError`` naming ``label`` unless it is an integer (or a float with an integer
    value) from ``minimum`` to 10**9. Booleans and strings are refused, not read as 1, 0 or a number."""
    ok = (not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))
          and minimum <= v <= MAX_INT_PARAM and float(v).is_integer())  # the range first: no float(10**400)
    if not ok:
        raise ValueError(f"{label} must be an integer from {minimum} to {MAX_INT_PARAM:g}, got {v!r}")
    return int(v)


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

    @property
    def limit(self) -> int:
        """The most requests this agent admits in a slot (after :meth:`reset`): the environment's ``max_budget``,
        or the agent's own when it was given one (``max_budget=N``) and is smaller."""
        own = getattr(self, "max_budget", None)
        return self.config.max_budget if own is None else min(int(own), self.config.max_budget)

    def label(self) -> str:
        """Name with parameters, for tables. Numbers are written to 6 significant digits (``:g``), so two agents
        whose parameters differ beyond that share a label; a comparison refuses two rows of one label (give each
        its own with ``label=``)."""
        return self.name + self._max_budget_label()

    def _max_budget_label(self) -> str:
        """`` max_budget=N`` when the agent was given its own ``max_budget``, else nothing."""
        own = getattr(self, "max_budget", None)
        return "" if own is None else f" max_budget={own}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label()!r})"
