"""Selection noise of training's evaluations: how much one evaluation episode's time in system varies.

Prints, per policy, the mean, standard deviation and coefficient of variation of the mean time in
system over the evaluation seeds 20000-20029 (4,000 slots), and for pairs of policies the paired
difference (same seeds) with its standard error for 2, 8 and 16 episodes as a share of the mean
(docs/training.md, "Model selection"; the default of ``flowgym train --eval-episodes``).

    python benchmarks/selection_noise.py
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from flowgym.agents import make_agent
from flowgym.lab.evaluation import run_episode
from flowgym.lab.scenarios import get_scenario

SEEDS = list(range(20000, 20030))
POLICIES = {
    "adaptive-mix": [("flow-control", {"b": 32}), ("flow-control", {"b": 40}),
                     ("rate-switch", {"high": 40, "low": 4, "threshold": 10.0})],
    "adaptive-switch": [("flow-control", {"b": 12}), ("flow-control", {"b": 14})],
}


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    for name, policies in POLICIES.items():
        kw = get_scenario(name).env_kwargs()
        vals = {}
        for agent, params in policies:
            a = make_agent(agent, **params)
            vals[a.label()] = np.array([run_episode(a, kw, s, 4000).metrics()["mean_time_in_system"] for s in SEEDS])
        for label, v in vals.items():
            sd = v.std(ddof=1)
            print(f"{name:16s} {label:40s} mean {v.mean():7.2f}  sd {sd:6.2f}  cv {sd / v.mean():.3f}")
        for (la, a), (lb, b) in itertools.combinations(vals.items(), 2):
            d, m = a - b, b.mean()
            se = {n: d.std(ddof=1) / np.sqrt(n) / m for n in (2, 8, 16)}
            print(f"{name:16s} {la} - {lb}: paired difference {d.mean():+.2f} ({d.mean() / m:+.1%}), "
                  f"standard error n=2 {se[2]:.1%}, n=8 {se[8]:.1%}, n=16 {se[16]:.1%}")


if __name__ == "__main__":
    main()
