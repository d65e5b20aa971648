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
