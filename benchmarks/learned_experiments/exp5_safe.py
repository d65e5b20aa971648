"""Safe-budget heuristic (tracker v2): k=1, k=2 untuned, and k tuned per scenario on seeds 1000-1001; report seeds 900-909."""
import sys, json; sys.path.insert(0, '/work/h16/experiments')
from common import *; from scen import heldout; from gen import SafeBudget
base = json.load(open('/work/h16/experiments/exp3_baselines.json')); out = {}
for n, kw in heldout().items():
    kv = {k: np.mean(per_seed_tis(SafeBudget(k, 'v2'), kw, TUNE_SEEDS, 4000)) for k in (0.75, 1, 1.5, 2, 3, 4, 6)}
    kb = min(kv, key=kv.get); r = {}
    for lab, k in (('k1', 1.0), ('k2', 2.0), ('ktuned', kb)):
        v = per_seed_tis(SafeBudget(k, 'v2'), kw, REPORT_SEEDS, 4000)
        r[lab] = (k, v, ratio_boot(v, base[n]['fixed']), ratio_boot(v, base[n]['rs']))
    out[n] = r
    print(n, ' '.join(f"{lab}(k={r[lab][0]:g}) /fixed {r[lab][2][0]:.3f} [{r[lab][2][1]:.3f},{r[lab][2][2]:.3f}] /rs {r[lab][3][0]:.3f}" for lab in r), flush=True)
json.dump(out, open('/work/h16/experiments/exp5_safe.json', 'w'), indent=1)
