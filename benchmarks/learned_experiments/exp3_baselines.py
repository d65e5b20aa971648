"""Per-scenario tuned baselines (seeds 1000-1001) and their report numbers (seeds 900-909)."""
import sys, json, time; sys.path.insert(0, '/work/h16/experiments')
from common import *
from scen import heldout
from gen import SafeBudget
FG = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128)
TH = (0.5, 1, 2, 3, 4, 6, 8, 10, 15, 20, 30, 50)
res = {}
for name, kw in heldout().items():
    t0 = time.time()
    b, rs, _ = tune_baselines(kw, 4000, fixed_grid=FG, rs_high=FG, rs_low=FG, rs_thr=TH)
    kbest, _ = tune(AgentSpec('safe-budget', {'k': 1.0}, tune=('k', [0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4])), kw, TUNE_SEEDS, 4000) if False else (None, None)
    # safe-budget isn't registered in make_agent: tune by hand
    kv = {k: np.mean(per_seed_tis(SafeBudget(k), kw, TUNE_SEEDS, 4000)) for k in (0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4)}
    kbest = min(kv, key=kv.get)
    r = {'fixed_b': b, 'rate_switch': rs, 'safe_k': kbest}
    r['fixed'] = per_seed_tis(make_agent('flow-control', b=b), kw, REPORT_SEEDS, 4000)
    r['rs'] = per_seed_tis(make_agent('rate-switch', high=rs[0], low=rs[1], threshold=rs[2]), kw, REPORT_SEEDS, 4000)
    r['safe1'] = per_seed_tis(SafeBudget(1.0), kw, REPORT_SEEDS, 4000)
    r['safe2'] = per_seed_tis(SafeBudget(2.0), kw, REPORT_SEEDS, 4000)
    r['safek'] = per_seed_tis(SafeBudget(kbest), kw, REPORT_SEEDS, 4000)
    res[name] = r
    f = np.mean(r['fixed'])
    print(f"{name}: fixed b={b} {f:.2f} | rate-switch{rs} {np.mean(r['rs']):.2f} ({np.mean(r['rs'])/f:.3f}) | safe k=1 {np.mean(r['safe1'])/f:.3f} k=2 {np.mean(r['safe2'])/f:.3f} k*={kbest} {np.mean(r['safek'])/f:.3f}  [{time.time()-t0:.0f}s]", flush=True)
json.dump(res, open('/work/h16/experiments/exp3_baselines.json', 'w'), indent=1)
