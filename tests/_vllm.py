"""Helpers shared by the ``vllm-v1`` mode's by-hand tests (``test_vllm_mutants.py``, ``test_vllm_fidelity.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from flowgym.sim.vllm import VllmEngine
from flowgym.sim.workloads import Trace

#: No token budget and no cap on running requests: only the cache limits a step.
UNLIMITED = {"max_num_batched_tokens": None, "max_num_seqs": None}


def vllm_engine(M: int, trace: Trace, **options: Any) -> VllmEngine:
    """A ``vllm-v1`` engine of ``M`` tokens on ``trace`` with ``options``, reset on seed 0."""
    eng = VllmEngine(M, trace, options=options)
    eng.reset(np.random.default_rng(0))
    return eng


def vllm_step(eng: VllmEngine, budget: Any) -> Any:
    """One scheduler step: arrivals, then serving with ``budget``; the step's ``SlotStats``."""
    eng.arrive()
    return eng.serve(budget)
