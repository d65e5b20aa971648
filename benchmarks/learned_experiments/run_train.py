"""Train one configuration: python run_train.py NAME SCEN MODE OBS TIMESTEPS [SEED] [GAMMA] [REPEAT]"""
import sys, json, time; sys.path.insert(0, '/work/h16/experiments')
import numpy as np
from gen import *
from common import *
name, scen, mode, obs, steps = sys.argv[1:6]
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 10000
gamma = float(sys.argv[7]) if len(sys.argv) > 7 else 0.99
repeat = int(sys.argv[8]) if len(sys.argv) > 8 else 8
rw = json.loads(sys.argv[9]) if len(sys.argv) > 9 and sys.argv[9] != '-' else None
tracker = sys.argv[10] if len(sys.argv) > 10 else 'v1'
SEL = (20000, 20001)
FG = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256)
def best_fixed(kw):
    return min(np.mean(per_seed_tis(make_agent('flow-control', b=b), kw, SEL, 4000)) for b in FG)
if scen == 'adaptive-mix':
    kw = get_scenario('adaptive-mix').env_kwargs(); kw['max_budget'] = CAP
    sampler = fixed_sampler(kw); evals = [(kw, 4000, best_fixed(kw))]
else:  # generalist: random mixes; selection on 4 fixed draws of the same distribution
    sampler = random_mix_sampler()
    rng = np.random.default_rng(777)
    evals = []
    for _ in range(6):
        kw = sampler(rng); kw['max_budget'] = CAP
        evals.append((kw, 4000, best_fixed(kw)))
t0 = time.time()
wall = train(f'/work/h16/runs/{name}', sampler, mode=mode, obs=obs, repeat=repeat, timesteps=int(steps), seed=seed,
             gamma=gamma, reward_weights=rw, tracker=tracker, eval_kwargs_list=evals, eval_freq=50_000 if int(steps) <= 400_000 else 100_000)
print('total incl. eval', time.time() - t0)
