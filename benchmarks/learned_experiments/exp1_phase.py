"""Per-phase behaviour of examples/ppo_default vs tuned rate-switch vs best fixed on adaptive-mix."""
import sys, json, time
import numpy as np
sys.path.insert(0, '/work/h16/experiments')
from common import *
from flowgym.lab.evaluation import env_for
from flowgym.agents import LearnedBudget

sc = get_scenario('adaptive-mix'); kw = sc.env_kwargs(); H = 4000
t0 = time.time()
best_b, rs, rsv = tune_baselines(sc.tune_env_kwargs(), H)
print('tuned fixed b', best_b, 'rate-switch (high,low,thr)', rs, rsv, f'{time.time()-t0:.0f}s', flush=True)
# also the scenario's own tuning (only low tuned, high=40,thr=10)
agents = {
  'ppo_default': LearnedBudget('/work/main/examples/ppo_default'),
  f'rate-switch{rs}': make_agent('rate-switch', high=rs[0], low=rs[1], threshold=rs[2]),
  'rate-switch(40,4,10)': make_agent('rate-switch', high=40, low=4, threshold=10.0),
  f'fixed b={best_b}': make_agent('flow-control', b=best_b),
}
res = {}
for name, ag in agents.items():
    tis, ph, budgets, rets, waste = [], [], [], [], []
    for s in REPORT_SEEDS:
        env = env_for(ag, kw, H); obs, _ = env.reset(seed=s); ag.reset(env.config, seed=s)
        bs = []; R = 0.0; done = False
        while not done:
            a = ag.act(obs, env.view()); bs.append(a)
            obs, r, te, tr, info = env.step(a); R += r; done = te or tr
        m = env.metrics(); log = env.request_log()
        tis.append(m['mean_time_in_system']); rets.append(R); waste.append(m['wasted_tokens'])
        arr = log['arrival']; fin = log['finish']; done_ = (fin >= 0) & (fin <= H)
        t_in = np.where(done_, fin, H) - arr
        phase = (arr // 1000) % 2
        ph.append([t_in[phase == 0].mean(), t_in[phase == 1].mean(), (t_in[phase==0]).sum()/len(t_in), (t_in[phase==1]).sum()/len(t_in)])
        budgets.append(np.asarray(bs))
    B = np.mean(budgets, axis=0)
    prof = [float(B[i:i+250].mean()) for i in range(0, H, 250)]
    ph = np.asarray(ph)
    res[name] = dict(tis=tis, tis_ci=ci(tis), ret=ci(rets), waste=ci(waste), chat=ci(ph[:,0]), long=ci(ph[:,1]),
                     chat_contrib=ci(ph[:,2]), long_contrib=ci(ph[:,3]), budget_profile_250=prof,
                     median_budget_chat=float(np.median(np.concatenate([b[np.r_[0:1000,2000:3000]] for b in budgets]))),
                     median_budget_long=float(np.median(np.concatenate([b[np.r_[1000:2000,3000:4000]] for b in budgets]))))
    print(name, 'TIS %.2f±%.2f' % res[name]['tis_ci'], 'return %.1f' % res[name]['ret'][0], 'chat-arrivals TIS %.2f±%.2f' % res[name]['chat'],
          'long-arrivals TIS %.2f±%.2f' % res[name]['long'], 'contrib chat/long %.1f/%.1f' % (res[name]['chat_contrib'][0], res[name]['long_contrib'][0]),
          'wasted %.0f' % res[name]['waste'][0], 'median B chat/long', res[name]['median_budget_chat'], res[name]['median_budget_long'], flush=True)
    print('  budget per 250 slots:', ' '.join('%.1f' % x for x in prof), flush=True)
fb = res[f'fixed b={best_b}']['tis']
for name in res:
    print(name, 'ratio to best fixed %.3f±%.3f' % ratio_ci(res[name]['tis'], fb), 'ratio to ppo_default %.3f±%.3f' % ratio_ci(res[name]['tis'], res['ppo_default']['tis']))
json.dump(dict(res=res, best_b=best_b, rs=rs), open('/work/h16/experiments/exp1_phase.json', 'w'), indent=1)
print('total', time.time() - t0)
