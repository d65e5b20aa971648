"""Train a learned activation budget with PPO (Stable-Baselines3) and compare it with the baselines.

The Python form of ``flowgym train`` (see docs/training.md)::

    python examples/train_ppo.py                              # adaptive-mix, ~7 min on 2 cores
    python examples/train_ppo.py --scenario adaptive-diurnal --total-timesteps 300000 --out runs/diurnal
    python examples/train_ppo.py --evaluate examples/ppo_default  # no training: the shipped model

Every :class:`flowgym.lab.train.TrainConfig` field can be set from Python; another
SB3 algorithm is ``TrainConfig(algo="a2c")`` or ``algo="sb3_contrib:QRDQN"``
(any class with SB3's ``learn``/``save``/``load``/``predict``).
"""

from __future__ import annotations

import argparse

from flowgym.agents import GreedyLIFO, LearnedBudget
from flowgym.lab.evaluation import build_agent, evaluate
from flowgym.lab.scenarios import get_scenario
from flowgym.lab.train import TrainConfig, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=TrainConfig.scenario)
    ap.add_argument("--total-timesteps", type=int, default=TrainConfig.total_timesteps)
    ap.add_argument("--out", default="runs/example-ppo")
    ap.add_argument("--evaluate", default=None, metavar="MODEL_DIR", help="skip training; evaluate this model")
    args = ap.parse_args()

    if args.evaluate is None:
        cfg = TrainConfig(scenario=args.scenario, total_timesteps=args.total_timesteps, out=args.out,
                          final_eval_seeds=3)  # the final table tunes the fixed budget by grid search
        res = train(cfg)
        print(f"{res.timesteps} steps in {res.wall_seconds:.0f} s ({res.steps_per_second:.0f} steps/s)")
        print(res.table.format())
        model_dir = args.out
    else:
        model_dir = args.evaluate

    # The learned agent is an ordinary agent: the same evaluation path as the scripted ones.
    # The scenario's own flow-control budget (12 on adaptive-switch, 40 on adaptive-mix) is the fixed reference.
    agent = LearnedBudget(model_dir)
    # the scenario it was trained on, stored in the model directory (older models: by name)
    sc = get_scenario(agent.meta.get("scenario_data") or agent.meta["scenario"], rate=agent.meta.get("rate"))
    table = evaluate([agent, build_agent(sc.agents[0]), GreedyLIFO()], sc.env_kwargs(), seeds=[0, 1, 2],
                     horizons=[sc.env["horizon"]])
    print(sc.description)
    print(table.format())


if __name__ == "__main__":
    main()
