"""flowgym: token-level LLM serving under a KV-cache limit, as a Gymnasium environment."""

from flowgym.engine import Engine, replay
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

import gymnasium as _gym

from flowgym.env import FlowControlConfig, FlowControlEnv

if "FlowControl-v0" not in _gym.registry:
    _gym.register(
        id="FlowControl-v0",
        entry_point="flowgym.env:FlowControlEnv",
        disable_env_checker=False,
    )
