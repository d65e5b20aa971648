"""Evaluate model dirs (FeatAgent or LearnedBudget) on scenarios, report seeds 900-909; ratios vs tuned baselines."""
import sys, json, time, os; sys.path.insert(0, '/work/h16/experiments')
from common import *
from scen import heldout
from gen import FeatAgent
from flowgym.agents import LearnedBudget
models = sys.argv[1].split(',')
scens = sys.argv[2].split(',')
base = json.load(open('/work/h16/experiments/exp3_baselines.json'))
H = heldout()
outp = '/work/h16/experiments/exp4_results.json'
allres = json.load(open(outp)) if os.path.exists(outp) else {}
for m in models:
    path = m if m.startswith('/') else f'/work/h16/runs/{m}'
    ag = FeatAgent(path) if os.path.exists(os.path.join(path, 'meta.json')) else LearnedBudget(path)
    for s in scens:
        kw = H[s]
        t0 = time.time()
        try:
            v = per_seed_tis(ag, kw, REPORT_SEEDS, 4000)
        except ValueError as e:
            print(m, s, 'refused:', str(e)[:100]); continue
        b = base[s]
        rf = ratio_boot(v, b['fixed']); rr = ratio_boot(v, b['rs'])
        allres[f'{m}|{s}'] = dict(tis=v, r_fixed=rf, r_rs=rr)
        print(f"{m:22s} {s:18s} TIS {np.mean(v):8.2f}  /fixed {rf[0]:.3f} [{rf[1]:.3f},{rf[2]:.3f}]  /rate-switch {rr[0]:.3f} [{rr[1]:.3f},{rr[2]:.3f}]  ({time.time()-t0:.0f}s)", flush=True)
json.dump(allres, open(outp, 'w'), indent=1)
