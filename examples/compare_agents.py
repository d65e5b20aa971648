"""Compare agents on a stable load through the one evaluation path.

    python examples/compare_agents.py
"""

from __future__ import annotations

from flowgym.agents import AlphaProtectionGreedy, FlowControl, GreedyLIFO, MemoryCheck
from flowgym.lab.evaluation import evaluate
from flowgym.lab.scenarios import get_scenario

if __name__ == "__main__":
    sc = get_scenario("paper-synthetic-unknown", rate=3.5)  # rho = 0.86: a stable load
    agents = [FlowControl(b=12), FlowControl(b=12, cap=24), AlphaProtectionGreedy(alpha=0.8),
              MemoryCheck(), GreedyLIFO()]
    table = evaluate(agents, sc.env_kwargs(), seeds=[0, 1, 2], horizons=[1000, 2000], progress=True)
    print(sc.description)
    print(table.format())
