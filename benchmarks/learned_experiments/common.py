"""Shared helpers for the h16 experiments (evaluation through flowgym.lab.evaluation)."""
import json, math, os, sys, time
import numpy as np
from flowgym.lab.evaluation import run_episode, evaluate, tune, t_quantile_975
from flowgym.lab.scenarios import get_scenario, AgentSpec
from flowgym.agents import make_agent

REPORT_SEEDS = list(range(900, 910))
TUNE_SEEDS = [1000, 1001]

def ci(v):
    v = np.asarray(v, float)
    return float(v.mean()), float(t_quantile_975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else float('nan')

def ratio_ci(a, b):
    """The MEAN OF THE PER-SEED RATIOS a/b and its Student-t half-width (not the ratio of means, which
    ratio_boot gives). NaN half-width with one seed."""
    r = np.asarray(a, float) / np.asarray(b, float)
    return ci(r)

def tune_baselines(env_kwargs, horizon, seeds=TUNE_SEEDS, fixed_grid=(2,3,4,6,8,12,16,24,32,40,48,64),
                   rs_high=(24,32,40,48,64), rs_low=(1,2,3,4,6,8,12), rs_thr=(2,4,6,8,10,14,20)):
    """Best fixed budget and best rate-switch (high, low, threshold) on tuning seeds."""
    best_b, rows = tune(AgentSpec('flow-control', {'b': 12}, tune=('b', list(fixed_grid))), env_kwargs, seeds, horizon)
    # rate-switch: coordinate search over (threshold, high, low)
    def val(h, l, th):
        a = make_agent('rate-switch', high=h, low=l, threshold=th)
        return float(np.mean([run_episode(a, env_kwargs, s, horizon).metrics()['mean_time_in_system'] for s in seeds]))
    cur = [40, 4, 10.0]; cache = {}
    def v(c):
        k = tuple(c)
        if k not in cache: cache[k] = val(*c)
        return cache[k]
    for _ in range(2):
        for i, grid in ((2, rs_thr), (1, rs_low), (0, rs_high)):
            best = min(grid, key=lambda g: v(cur[:i] + [g] + cur[i+1:]))
            cur[i] = best
    return best_b, tuple(cur), v(cur)

def per_seed_tis(agent, env_kwargs, seeds, horizon):
    out = []
    for s in seeds:
        ep = run_episode(agent, env_kwargs, s, horizon)
        out.append(ep.metrics()['mean_time_in_system'])
    return out

def ratio_boot(a, b, n=5000, seed=0):
    """ratio of means (paired over seeds) with a 95% paired-bootstrap CI; NaN bounds with one seed (a bootstrap
    of one pair has no spread to show)"""
    a = np.asarray(a, float); b = np.asarray(b, float)
    if a.size < 2:
        return float(a.mean() / b.mean()), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, (n, a.size))
    r = a[idx].mean(1) / b[idx].mean(1)
    return float(a.mean() / b.mean()), float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))
