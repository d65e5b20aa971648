"""Scale-free features + structured action ("multiplier on the safe budget M / E[w]") for a learned budget.

Everything the tracker reads is what a real server knows at the decision point of slot t:
arrivals' counts, KV held, queue contents (prompt lengths, arrival times), the lengths l+o of
requests as they complete (the calendar entry of slot t+1 = requests finishing after this slot),
and tokens wasted so far. Output lengths of unfinished requests are never read.
The same Tracker runs in the training wrapper and in the evaluation agent (FeatAgent), slot by slot.
"""
from __future__ import annotations
import copy, json, math, os, pickle, sys, time
import numpy as np
import gymnasium as gym
from flowgym.envs.flow_control import FlowControlEnv, FlowControlConfig
from flowgym.agents.base import Agent

MULTS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
MULTS8 = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64)
CAP = 256
RATE_TAUS = (8.0, 32.0, 128.0, 512.0)


class Tracker:
    """Slot-by-slot estimates: arrival rates at several time constants, E[l+o] and E[w] of completed
    requests (w ~ (l+o)^2/2 token-slots), wasted tokens; gives the safe budget M / E[w]."""

    def __init__(self, M: int, s_tau=64.0, version="v1"):
        self.M = M; self.s_tau = s_tau; self.version = version
        self.reset()

    def reset(self):
        self.rates = np.zeros(len(RATE_TAUS)); self.t = 0
        self.A = self.A2 = self.N = 0.0  # completion-weighted EMAs of l+o and (l+o)^2
        self.Af = self.Nf = 0.0  # faster (tau 16)
        self.waste = 0.0; self._w0 = 0; self.pl = 0.0; self.pn = 0.0
        self.init = False; self.lA = 0.0; self.lN = 0.0; self._held = 0.0; self._nact = 0

    def slot(self, e):
        k = e.last_arrivals
        a = 1.0 / np.asarray(RATE_TAUS)
        if not self.init:
            self.rates[:] = k; self.init = True; self._w0 = e.wasted_tokens
        else:
            self.rates += (k - self.rates) * a
        i = (e.t + 1) & e._cal_mask
        n = int(e._cal_n[i]); s = int(e._cal_tok[i])
        d = 1.0 / self.s_tau
        self.A = (1 - d) * self.A + s; self.N = (1 - d) * self.N + n
        self.A2 = (1 - d) * self.A2 + (s * s / n if n else 0.0)
        df = 1.0 / 16
        self.Af = (1 - df) * self.Af + s; self.Nf = (1 - df) * self.Nf + n
        if k:
            self.lA = (1 - d) * self.lA + float(e.prompt[e.n_arrived - k:e.n_arrived].sum()); self.lN = (1 - d) * self.lN + k
        else:
            self.lA *= (1 - d); self.lN *= (1 - d)
        self._held, self._nact = e.held, e.n_active
        w = e.wasted_tokens; self.waste += (w - self._w0 - self.waste) / 32.0; self._w0 = w
        self.t += 1

    @property
    def s_hat(self):
        return self.A / self.N if self.N > 1e-6 else None

    @property
    def w_hat(self):
        if self.version == "v1":
            return 0.5 * self.A2 / self.N if self.N > 1e-6 else None
        # v2: w = l*o + E[o^2]/2 with l from arriving prompts, o = E[l+o] of completions - l,
        # E[o^2] ~ o^2 + Var(l+o); floored by the active set's (l + j) (a lower bound on l + o),
        # so that a thrashing system where nothing completes still gets a finite estimate.
        l = self.lA / self.lN if self.lN > 1e-6 else 0.0
        w_lb = None
        if self._nact:
            o_lb = max(self._held / self._nact - l, 1.0)
            w_lb = l * o_lb + 0.5 * o_lb * o_lb
        if self.N > 1e-6:
            s = self.A / self.N; var = max(self.A2 / self.N - s * s, 0.0)
            o = max(s - l, 1.0)
            w = l * o + 0.5 * (o * o + var)
            return w if w_lb is None else max(w, w_lb)
        return w_lb

    def b_safe(self):
        w = self.w_hat
        return float(CAP) if w is None else float(np.clip(self.M / max(w, 1.0), 0.5, CAP))

    def features(self, e):
        M = self.M; bs = self.b_safe(); w = self.w_hat or 1.0; s = self.s_hat or 1.0
        sf = (self.Af / self.Nf) if self.Nf > 1e-6 else s
        q = e.n_queued
        if q:
            head = int(e.lanes[0].buf[e.lanes[0].head]) if len(e.lanes) == 1 else int(e.queue_ids()[0])
            age = e.t - int(e.arrival[head])
        else:
            age = 0
        f = [
            e.held / M,
            min((e.held + e.n_active * 0.5 * s) / M, 4.0),  # projected KV demand of the active set
            math.log1p(q / bs),  # backlog in slots of the safe budget
            math.log1p(q * w / M),  # backlog's KV demand (token-slots / M)
            math.log2(bs) / 8.0,
            *[min(r * w / M, 8.0) for r in self.rates],  # rho estimates at 4 time constants
            *[math.log1p(r / bs) for r in self.rates],  # arrivals per slot relative to the safe budget
            math.log(max(sf, 1.0) / max(s, 1.0)),  # length trend (fast vs slow EMA)
            math.log1p(age / max(s, 1.0)),  # queue age in request lifetimes
            min(100.0 * self.waste / M, 10.0),  # eviction pressure
            math.log1p(e.n_active / bs / max(s, 1.0)),
        ]
        return np.asarray(f, dtype=np.float32)


NF = 17


def budget_of(action: int, mode: str, bs: float) -> int:
    if mode == "mult":
        return int(np.clip(round(MULTS[action] * bs), 1, CAP))
    if mode == "mult8":
        return int(np.clip(round(MULTS8[action] * bs), 1, CAP))
    return LEVELS[action]


class FeatEnv(gym.Env):
    """FlowControl-v0 under a config sampler, with action repeat, tracker features and a chosen action mode.

    obs: 'ext' (tracker features), 'base' (the env's flat observation), 'both'."""

    def __init__(self, sampler, repeat=8, mode="mult", obs="ext", seed=0, tracker_version="v1"):
        self.tracker_version = tracker_version
        self.sampler, self.repeat, self.mode, self.obs_kind = sampler, repeat, mode, obs
        self.rng = np.random.default_rng(seed)
        self.env = None
        kw = sampler(self.rng)
        self._build(kw)
        n = len(MULTS) if mode == "mult" else len(MULTS8) if mode == "mult8" else len(LEVELS)
        self.action_space = gym.spaces.Discrete(n)
        dim = self._obs().shape[0]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)

    def _build(self, kw):
        kw = dict(kw); kw["observation"] = "flat"; kw["max_budget"] = CAP
        self.env = FlowControlEnv(**kw)
        self.env.reset(seed=int(self.rng.integers(1 << 31)))
        self.tr = Tracker(self.env.config.M, version=self.tracker_version)
        self._flat = None

    def _obs(self):
        e = self.env.engine
        parts = []
        if self.obs_kind in ("ext", "both"):
            parts.append(self.tr.features(e))
        if self.obs_kind in ("base", "both"):
            parts.append(np.asarray(self._flat if self._flat is not None else self.env._observe(), np.float32))
        return np.concatenate(parts)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._build(self.sampler(self.rng))
        self._flat, _ = self.env.reset(seed=int(self.rng.integers(1 << 31)))
        self.tr.slot(self.env.engine)
        return self._obs(), {}

    def step(self, action):
        B = budget_of(int(action), self.mode, self.tr.b_safe())
        R = 0.0
        for r in range(self.repeat):
            if r:
                self.tr.slot(self.env.engine)
            self._flat, rew, te, tr, info = self.env.step(B)
            R += rew
            if te or tr:
                break
        if not (te or tr):
            self.tr.slot(self.env.engine)
        if te or tr:
            m = self.env.metrics()
            info = dict(info); info["tis"] = m["mean_time_in_system"]
        return self._obs(), R, te, tr, info


class FeatAgent(Agent):
    """Evaluation agent for a model trained on FeatEnv; runs through flowgym.lab.evaluation.run_episode.
    Reads the engine through the view (view._e) only for the tracker's causal quantities."""
    name = "feat-learned"

    def __init__(self, path, label=None):
        from stable_baselines3 import PPO
        import torch
        torch.set_num_threads(1)
        self.meta = json.load(open(os.path.join(path, "meta.json")))
        self.model = PPO.load(os.path.join(path, "model.zip"), device="cpu")
        with open(os.path.join(path, "vecnormalize.pkl"), "rb") as fh:
            vn = pickle.load(fh)
        self.mu, self.sd, self.clip = vn.obs_rms.mean, np.sqrt(vn.obs_rms.var + vn.epsilon), vn.clip_obs
        self.mode, self.repeat, self.obs_kind = self.meta["mode"], self.meta["repeat"], self.meta["obs"]
        self.requires = {"max_budget": CAP, "observation": "flat"}
        self._label = label or f"feat ({os.path.basename(path)})"
        self.budgets = []

    def reset(self, config, seed=None):
        super().reset(config, seed)
        self.tr = Tracker(config.M, version=self.meta.get("tracker", "v1")); self.left = 0; self.held = 0; self.budgets = []

    def act(self, observation, view):
        e = view._e
        self.tr.slot(e)
        if self.left > 0:
            self.left -= 1
        else:
            parts = []
            if self.obs_kind in ("ext", "both"):
                parts.append(self.tr.features(e))
            if self.obs_kind in ("base", "both"):
                parts.append(np.asarray(observation, np.float32))
            o = np.clip((np.concatenate(parts) - self.mu) / self.sd, -self.clip, self.clip).astype(np.float32)
            from flowgym.agents.learned import policy_action
            a = int(policy_action(self.model, o[None], self.meta.get("rule", "mean"))[0])
            self.held = budget_of(a, self.mode, self.tr.b_safe())
            self.left = self.repeat - 1
        self.budgets.append(self.held)
        return self.held

    def label(self):
        return self._label


class SafeBudget(Agent):
    """Heuristic: B_t = clip(round(k * M / E_hat[w]), 1, CAP), E_hat[w] from completed requests (no learning)."""
    name = "safe-budget"

    def __init__(self, k=1.0, version="v1"):
        self.k = float(k); self.version = version; self.requires = {"max_budget": CAP}

    def reset(self, config, seed=None):
        super().reset(config, seed); self.tr = Tracker(config.M, version=self.version)

    def act(self, observation, view):
        self.tr.slot(view._e)
        return int(np.clip(round(self.k * self.tr.b_safe()), 1, CAP))

    def label(self):
        return f"safe-budget k={self.k:g} {self.version}"


# ----------------------------------------------------------------------------- samplers

def fixed_sampler(env_kwargs):
    def s(rng):
        return copy.deepcopy(env_kwargs)
    return s


def _w(pairs):
    return float(np.mean([l * o + o * (o + 1) / 2 for l, o in pairs]))


def random_mix_sampler(horizon=4000, stationary_p=0.2):
    """Randomised non-stationary mixes: 1-3 streams of (l, o) triples, alternating phases of
    200-3000 slots, per-phase load rho in [0.3, 1.15], M in [6000, 40000] (log-uniform)."""
    def s(rng):
        M = int(np.exp(rng.uniform(np.log(6000), np.log(40000))))
        ns = 1 if rng.random() < stationary_p else int(rng.choice([2, 2, 3]))
        streams, times, durs = [], [], [int(rng.integers(200, 3001)) for _ in range(ns)]
        period = float(sum(durs))
        start = 0.0
        for k in range(ns):
            while True:
                o = float(np.exp(rng.uniform(np.log(6), np.log(220))))
                l = int(np.exp(rng.uniform(np.log(4), np.log(200))))
                pairs = [[l, max(1, int(round(o * f)))] for f in (0.5, 1.0, 1.5)]
                w = _w(pairs)
                if M / w >= 1.0 and l + pairs[-1][1] < M:
                    break
            rho = rng.uniform(0.3, 1.15)
            rate = rho * M / w
            if ns == 1:
                r = rate
            else:
                bg = 1e-6 if rng.random() < 0.7 else rng.uniform(0.05, 0.3) * rate  # 1e-6: Steps.integral can round to -1e-12 on 0-rate pieces
                ts = [0.0] + ([start] if start > 0 else [])
                # on in [start, start + durs[k]), bg elsewhere, within [0, period)
                t_on, t_off = start, start + durs[k]
                pts = sorted({0.0, t_on, t_off} - {period})
                rs = [rate if t_on <= p < t_off else bg for p in pts]
                r = {"kind": "steps", "times": pts, "rates": rs, "period": period}
            streams.append({"kind": "iid", "rate": r, "lengths": {"kind": "empirical", "pairs": pairs, "weights": [1, 1, 1]}})
            start += durs[k]
        return {"M": M, "workload": {"kind": "mix", "streams": streams}, "output_length_known": False, "horizon": horizon}
    return s


def mixture_sampler(samplers, probs):
    def s(rng):
        i = rng.choice(len(samplers), p=probs)
        return samplers[i](rng)
    return s


# ----------------------------------------------------------------------------- training

def train(out, sampler, *, mode="mult", obs="ext", repeat=8, timesteps=300_000, seed=10_000, gamma=0.99,
          ent_coef=0.01, n_envs=8, n_steps=512, eval_kwargs_list=(), eval_freq=50_000, eval_seeds=(20000, 20001),
          rule="mean", net_arch=(64, 64), reward_weights=None, tracker="v1"):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    from stable_baselines3.common.callbacks import BaseCallback
    from flowgym.lab.evaluation import run_episode
    torch.set_num_threads(1)
    os.makedirs(out, exist_ok=True)

    def mk(i):
        def f():
            smp = sampler
            if reward_weights:
                def smp(rng, _s=sampler):
                    kw = _s(rng); kw["reward_weights"] = reward_weights; return kw
            return FeatEnv(smp, repeat, mode, obs, seed=seed + i, tracker_version=tracker)
        return f
    venv = DummyVecEnv([mk(i) for i in range(n_envs)])
    venv.seed(seed)
    venv = VecNormalize(venv, gamma=gamma)
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, n_steps=n_steps, batch_size=256, gamma=gamma,
                ent_coef=ent_coef, policy_kwargs={"net_arch": list(net_arch)})
    meta = {"mode": mode, "obs": obs, "repeat": repeat, "rule": rule, "timesteps": timesteps, "seed": seed,
            "gamma": gamma, "ent_coef": ent_coef, "reward_weights": reward_weights, "tracker": tracker}
    t0 = time.perf_counter()
    best = [math.inf]; curve = []

    class CB(BaseCallback):
        def _on_step(self):
            if self.n_calls % max(1, eval_freq // n_envs) == 0 and eval_kwargs_list:
                self.evaluate()
            return True

        def evaluate(self):
            model.save(os.path.join(out, "model.zip")); venv.save(os.path.join(out, "vecnormalize.pkl"))
            json.dump(meta, open(os.path.join(out, "meta.json"), "w"))
            ag = FeatAgent(out)
            vals = []
            for kw, H, ref in eval_kwargs_list:  # ref: normaliser (best fixed TIS on the eval seeds)
                v = np.mean([run_episode(ag, kw, s, H).metrics()["mean_time_in_system"] for s in eval_seeds])
                vals.append(v / ref)
            score = float(np.exp(np.mean(np.log(vals))))  # geometric mean of ratios to the best fixed budget
            curve.append((self.num_timesteps, time.perf_counter() - t0, score, vals))
            print(f"  eval {self.num_timesteps} {time.perf_counter()-t0:.0f}s score {score:.3f} {np.round(vals,3).tolist()}", flush=True)
            if score < best[0]:
                best[0] = score
                os.replace(os.path.join(out, "model.zip"), os.path.join(out, "best_model.zip"))
                os.replace(os.path.join(out, "vecnormalize.pkl"), os.path.join(out, "best_vecnormalize.pkl"))

    cb = CB()
    model.learn(total_timesteps=timesteps, callback=cb)
    cb.evaluate()
    wall = time.perf_counter() - t0
    for f in ("model.zip", "vecnormalize.pkl"):
        os.replace(os.path.join(out, "best_" + f), os.path.join(out, f))
    meta.update(wall_seconds=wall, best_score=best[0], curve=curve)
    json.dump(meta, open(os.path.join(out, "meta.json"), "w"), indent=1)
    print(f"trained {out} in {wall:.0f}s best selection score {best[0]:.3f}", flush=True)
    return wall
