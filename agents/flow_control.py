"""Flow control (Dong & Cao, Algorithms 1 and 2) and reference budgets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgym.agents.base import MAX_INT_PARAM, Agent, int_param
from flowgym.envs.view import SystemView
from flowgym.sim.admission import AdmissionRule

__all__ = ["FlowControl", "RateSwitch", "FixedBudget", "RandomBudget"]


class FlowControl(Agent):
    """Flow-controlled admission: at most a fixed number of activations per slot.

    * ``FlowControl(b=(b_1, ..., b_m))`` is **Algorithm 1** (known classes): each
      slot up to ``b_k`` requests of class ``k`` start, classes in order, FIFO
      within a class. It never overflows when ``sum_k b_k w_k <= M`` and is
      stable when moreover ``b_k > lambda_k`` (Theorem 1). Needs
      ``per_class_budget=True`` (and so known lengths).
    * ``FlowControl(b=b)`` is **Algorithm 2** (unknown lengths): a global budget
      ``B_t = b`` with LIFO eviction on overflow.
    * ``FlowControl(b=b, cap=A)``: Algorithm 2 with i.i.d. budgets ``B_t ~
      Binomial(A, b / A)`` (mean ``b``, at most ``A``), the setting of Theorem 2.

    Source: Dong & Cao, "Flow-Controlled Scheduling for LLM Inference with
    Provable Stability Guarantees", Section 3.
    """

    name = "flow-control"

    def __init__(self, b: float | Sequence[int] = 12, cap: int | None = None) -> None:
        if isinstance(b, (Sequence, np.ndarray)) and not isinstance(b, str):
            if any(isinstance(x, (bool, np.bool_, str)) for x in np.ravel(np.asarray(b, dtype=object))):
                raise ValueError(f"per-class budgets b must be non-negative integers, got {b!r}")
            try:  # a 400-digit integer does not fit a float: refused below by name, not by numpy's OverflowError
                raw = np.asarray(b, dtype=np.float64)
            except (OverflowError, TypeError, ValueError):
                raw = np.array([np.nan])
            if (raw.ndim != 1 or raw.size == 0 or not np.isfinite(raw).all() or (raw < 0).any()
                    or (raw > MAX_INT_PARAM).any() or (raw != np.floor(raw)).any()):
                raise ValueError(f"per-class budgets b must be non-negative integers (at most {MAX_INT_PARAM:g}), "
                                 f"got {b!r}")
            self.per_class = raw.astype(np.int64)
            if cap is not None:
                raise ValueError("cap (random budgets) applies to a global budget b, not per-class budgets")
            self.b: Any = self.per_class
            self.requires = {"per_class_budget": True, "output_length_known": True,
                             "max_budget": int(max(1, self.per_class.max()))}
        else:
            self.per_class = None
            if (isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, float, np.integer, np.floating))
                    or not 0 <= b <= 10**9 or not math.isfinite(b)):  # the range first: no float(10**400)
                raise ValueError(f"budget b must be a non-negative number (at most 1e9), got {b!r}")
            bf = float(b)
            if cap is None:
                if not bf.is_integer():
                    raise ValueError(f"a fixed budget b must be an integer (give cap= for random budgets), got {b!r}")
                self.b = int_param("b", b)
                self.requires = {"eviction": "lifo", "max_budget": max(1, self.b)}
            else:
                cap = int_param("cap", cap, 1)
                if cap < bf:
                    raise ValueError(f"cap must be an integer >= b, got cap={cap!r}, b={b!r}")
                self.b = bf
                self.requires = {"eviction": "lifo", "max_budget": cap}
        self.cap = None if cap is None else int(cap)

    def admission_rule(self, view: SystemView) -> AdmissionRule | None:
        if self.per_class is not None or self.cap is not None:
            return None
        return AdmissionRule("fixed", budget=self.b)

    def act(self, observation: Any, view: SystemView) -> Any:
        if self.per_class is not None:
            return self.per_class.copy()
        if self.cap is None:
            return self.b
        return int(self.rng.binomial(self.cap, self.b / self.cap))

    def label(self) -> str:
        if self.per_class is not None:
            return f"flow-control b={tuple(int(x) for x in self.per_class)}"
        if self.cap is None:
            return f"flow-control b={self.b}"
        return f"flow-control b={self.b:g} cap={self.cap}"


class RateSwitch(Agent):
    """Flow control whose budget follows the traffic: ``B_t = high`` while the observed
    arrival rate exceeds ``threshold``, else ``low`` (LIFO eviction, as Algorithm 2).

    The paper's discussion asks for a policy that adapts the budget as traffic
    changes; this is the simplest one a person can tune, a reference for learned
    budgets. It reads only the observation's ``arrival_rate`` (the moving average
    of arrivals per slot, time constant ``rate_window``; per second in continuous time, and so
    is ``threshold``), so it needs the ``dict`` observation. On a shifting request mix
    (``adaptive-mix``: many short chat turns, then fewer long generations) a high rate
    means short requests (a large budget keeps up with them) and a low one long requests
    (a small budget keeps their admissions from overflowing the cache).
    """

    name = "rate-switch"

    def __init__(self, high: int = 40, low: int = 4, threshold: float = 10.0) -> None:
        high, low = int_param("high", high), int_param("low", low)
        if (isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, (int, float, np.integer, np.floating))
                or not 0 <= threshold <= 1e12):  # the range before float(): no float(10**400); nan fails it
            raise ValueError(f"threshold (arrivals per slot, or per second in continuous time) must be a non-negative "
                             f"number (at most 1e12), got {threshold!r}")
        thr = float(threshold)
        self.high, self.low, self.threshold = int(high), int(low), thr
        self.requires = {"eviction": "lifo", "observation": "dict", "max_budget": max(1, self.high, self.low)}

    def act(self, observation: Any, view: SystemView) -> int:
        return self.high if float(observation["arrival_rate"][0]) > self.threshold else self.low

    def label(self) -> str:
        return f"rate-switch high={self.high} low={self.low} threshold={self.threshold:g}"


class FixedBudget(Agent):
    """``B_t = b`` every slot, with whatever eviction rule the scenario uses (a reference point)."""

    name = "fixed"

    def __init__(self, b: int) -> None:
        self.b = int_param("b", b)
        self.requires = {"max_budget": max(1, self.b)}

    def act(self, observation: Any, view: SystemView) -> int:
        return self.b

    def label(self) -> str:
        return f"fixed b={self.b}"


class RandomBudget(Agent):
    """``B_t`` uniform on ``{low, ..., high}``, drawn from the agent's own seed (a sanity baseline)."""

    name = "random"

    def __init__(self, low: int = 0, high: int = 32) -> None:
        self.low, self.high = int_param("low", low), int_param("high", high)
        if self.low > self.high:
            raise ValueError(f"need 0 <= low <= high, got low={low!r}, high={high!r}")
        self.requires = {"max_budget": max(1, self.high)}

    def act(self, observation: Any, view: SystemView) -> int:
        return int(self.rng.integers(self.low, self.high + 1))

    def label(self) -> str:
        return f"random {self.low}..{self.high}"
