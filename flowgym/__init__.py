"""flowgym: token-level LLM serving under a KV-cache limit, as a Gymnasium environment.

``import flowgym`` registers ``FlowControl-v0`` (:mod:`flowgym.envs`). The package is
four layers, each a folder that imports only the layers below it (checked by
import-linter, see ``pyproject.toml``):

1. :mod:`flowgym.sim` - the simulator, no Gymnasium: workloads, rate schedules, latency
   models, datasets, the engine and its rules, the batched engine and the compiled
   kernels, metrics, theory.
2. :mod:`flowgym.envs` - the Gymnasium faces: ``FlowControlEnv`` and its config, spaces,
   the read-only view agents get, the vector env, the Stable-Baselines3 adapter.
3. :mod:`flowgym.agents` (the repository's ``agents/`` folder) - scripted agents and the
   learned agent; they see the view and observations only.
4. :mod:`flowgym.lab` - what people run: evaluation, scenarios, plots, hindsight,
   training, the command line.
"""

from flowgym.envs import FlowControlConfig, FlowControlEnv
from flowgym.sim.engine import Engine, replay
from flowgym.sim.workloads import (
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
