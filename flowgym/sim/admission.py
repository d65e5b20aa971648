"""Admission rules as data: a scripted agent's budget in a form the engine runs compiled.

An agent whose ``act`` is one of these rules says so (``Agent.admission_rule``); the
evaluation then runs its episodes with :meth:`flowgym.sim.engine.Engine.run_rule`, one
compiled loop instead of a Python call per iteration, with the same results.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["AdmissionRule", "ADMISSION_KINDS", "ADMISSION_LENGTHS"]


class AdmissionRule(NamedTuple):
    """A scripted agent's budget as data, so the engine can run whole episodes compiled
    (:meth:`flowgym.sim.engine.Engine.run_rule`) instead of asking Python every iteration.

    Each kind computes exactly what the agent's ``act`` does from the same state:

    * ``"fixed"``: ``B_t = budget`` (Algorithm 2 with a fixed budget).
    * ``"greedy"``: the longest queue prefix, at most ``max_count`` requests, whose
      ``sum (l_c + 1)`` fits in ``limit - demand`` (``demand = held + active``); none when that
      room is below 2 (``agents.greedy.greedy_fit_count``).
    * ``"future-fit"``: the memory check of ``agents.memory_check.future_fit_count`` over the
      first ``max_count`` queued requests, with output lengths ``lengths``: ``"known"`` (the true
      ones), ``"bound"`` (every output is ``bound`` tokens) or ``"estimate"`` (active
      ``max(e_i, j_i + 1)``, queued ``e_i``; the engine must track estimates).
    """

    kind: str
    budget: int = 0
    limit: float = 0.0
    max_count: int = 0
    lengths: str = "known"
    bound: int = 0

    def check(self) -> None:
        """``ValueError`` naming the field when the rule is malformed."""
        if self.kind not in ADMISSION_KINDS:
            raise ValueError(f"AdmissionRule.kind must be one of {list(ADMISSION_KINDS)}, got {self.kind!r}")
        for name in ("budget", "max_count", "bound"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"AdmissionRule.{name} must be a non-negative integer, got {v!r}")
        if not np.isfinite(self.limit):
            raise ValueError(f"AdmissionRule.limit must be finite, got {self.limit!r}")
        if self.lengths not in ADMISSION_LENGTHS:
            raise ValueError(f"AdmissionRule.lengths must be one of {list(ADMISSION_LENGTHS)}, got {self.lengths!r}")


#: Kinds of :class:`AdmissionRule` and their codes in the compiled loop.
ADMISSION_KINDS = {"fixed": 0, "greedy": 1, "future-fit": 2}
#: Output lengths a ``"future-fit"`` rule assumes, and their codes.
ADMISSION_LENGTHS = {"known": 0, "bound": 1, "estimate": 2}
