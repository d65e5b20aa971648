"""flowgym: token-level LLM serving under a KV-cache limit, as a Gymnasium environment.

``import flowgym`` registers ``FlowControl-v0`` (entry point
``flowgym.env:FlowControlEnv``; ``gym.make_vec`` uses the batched
``flowgym.vector:make_vector_env``, see :mod:`flowgym.vector`; :mod:`flowgym.sb3` adapts it to
Stable-Baselines3). The story of the package, module by module:
workloads (:mod:`flowgym.workloads`, :mod:`flowgym.rates`, :mod:`flowgym.datasets`)
-> engine (:mod:`flowgym.engine`, :mod:`flowgym.rules`, :mod:`flowgym.latency`)
-> environment (:mod:`flowgym.env`, :mod:`flowgym.spaces`, :mod:`flowgym.view`)
-> agents (the ``agents`` package) -> evaluation (:mod:`flowgym.evaluation`,
:mod:`flowgym.scenarios`, :mod:`flowgym.metrics`, :mod:`flowgym.plots`);
:mod:`flowgym.theory` holds the paper's closed forms.
"""

import gymnasium as _gym

from flowgym.engine import Engine, replay
from flowgym.env import FlowControlConfig, FlowControlEnv
from flowgym.workloads import (
    EmpiricalLengths,
    IIDPoisson,
    LogNormalLengths,
    MultiClassPoisson,
    Trace,
    TraceError,
    make_workload,
)

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "replay",
    "FlowControlConfig",
    "FlowControlEnv",
    "EmpiricalLengths",
    "IIDPoisson",
    "LogNormalLengths",
    "MultiClassPoisson",
    "Trace",
    "TraceError",
    "make_workload",
]

if "FlowControl-v0" not in _gym.registry:
    _gym.register(
        id="FlowControl-v0",
        entry_point="flowgym.env:FlowControlEnv",
        vector_entry_point="flowgym.vector:make_vector_env",
    )
