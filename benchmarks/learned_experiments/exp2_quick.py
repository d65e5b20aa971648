"""Sensitivity of rate-switch's low budget, phase oracle, PPO action rule, on adaptive-mix report seeds 900-909."""
import sys; sys.path.insert(0, '/work/h16/experiments')
from common import *
from flowgym.agents import LearnedBudget
from flowgym.agents.base import Agent

class PhaseOracle(Agent):
    name = 'phase-oracle'
    def __init__(self, hi=40, lo=4, period=2000, half=1000):
        self.hi, self.lo, self.period, self.half = hi, lo, period, half
        self.requires = {'max_budget': max(hi, lo)}
    def act(self, obs, view):
        return self.hi if (view.t % self.period) < self.half else self.lo
    def label(self): return f'phase-oracle {self.hi}/{self.lo}'

sc = get_scenario('adaptive-mix'); kw = sc.env_kwargs(); H = 4000
fb = per_seed_tis(make_agent('flow-control', b=40), kw, REPORT_SEEDS, H)
print('fixed40 %.2f' % np.mean(fb))
rows = []
for lab, ag in [('ppo mean', LearnedBudget('/work/main/examples/ppo_default')),
                ('ppo mode', LearnedBudget('/work/main/examples/ppo_default', action_rule='mode', label='m')),
                *[(f'rs 40/{lo}/10', make_agent('rate-switch', high=40, low=lo, threshold=10.0)) for lo in (2,3,4,5,6,8)],
                *[(f'oracle 40/{lo}', PhaseOracle(40, lo)) for lo in (3,4,6)]]:
    v = per_seed_tis(ag, kw, REPORT_SEEDS, H)
    print(lab, 'TIS %.2f±%.2f' % ci(v), 'ratio/fixed40 %.3f' % (np.mean(v)/np.mean(fb)), flush=True)
