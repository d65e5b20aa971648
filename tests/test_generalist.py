"""The pieces of the generalist learned budget: load tracker, load observation, multiplier action,
randomised environment, training distribution, the two reference agents and the training pipeline."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest

import flowgym  # noqa: F401
from flowgym.agents import SafeBudget, ScheduledBudget, make_agent
from flowgym.envs.flow_control import FlowControlEnv
from flowgym.envs.randomized import RandomizedFlowControlEnv
from flowgym.lab.distributions import RandomMix, make_distribution
from flowgym.lab.evaluation import run_episode
from flowgym.sim.estimators import LOAD_FEATURES, LoadTracker
from flowgym.sim.workloads import make_workload

from tests._requires import needs_sb3

PAIRS = [[10, 20], [10, 40], [10, 60]]


def _iid(rate: float, pairs=PAIRS) -> dict:
    return {"kind": "iid", "rate": rate, "lengths": {"kind": "empirical", "pairs": pairs, "weights": [1.0] * len(pairs)}}


def _trace(outputs):
    n = len(outputs)
    return {"kind": "trace", "arrival": list(range(n)), "prompt_len": [5] * n, "output_len": list(outputs)}


# --------------------------------------------------------------------------- tracker


def _one_start_a_slot(workload, horizon, observation):
    """The observations of an episode at M = 4000 with a budget of 1 at every slot."""
    env = FlowControlEnv(M=4000, workload=workload, horizon=horizon, observation=observation, max_budget=8)
    o, _ = env.reset(seed=0)
    seq = [o]
    for _ in range(horizon - 1):
        o, *_ = env.step(1)
        seq.append(o)
    return np.array(seq)


@pytest.mark.parametrize("observation", ["load", "load-v2"])
def test_load_features_never_read_an_unfinished_output_length(observation):
    # the same arrivals and prompts; request 0's output differs (30 vs 90). Until it completes in
    # the shorter run (slot 30: admitted at 0, f = 0 + 30) the observations must be identical.
    a, b = (_one_start_a_slot(_trace([long] + [12] * 79), 60, observation) for long in (30, 90))
    # observation k is seen at the decision point of slot k; request 0 finishes at the end of slot 29
    np.testing.assert_array_equal(a[:30], b[:30])
    assert not np.array_equal(a[30:], b[30:])  # once it has completed, its length is known and used


def test_load_v2_features_never_read_an_unfinished_output_length():
    """The three ``load-v2`` features with a request whose output differs (30 vs 90) *waiting in the
    queue* among requests of different prompts, after a burst (so the head-era rate is not the rate
    now): identical observations until it completes, different after."""
    arrival = [t for t in range(5) for _ in range(6)] + list(range(5, 80))  # 6 a slot, then 1
    prompts = [5 + (7 * i) % 20 for i in range(len(arrival))]
    obs = []
    for long in (30, 90):
        outs = [12] * len(arrival)
        outs[10] = long  # request 10: queued from slot 1 until admitted at slot 10 (one start a slot)
        wl = {"kind": "trace", "arrival": arrival, "prompt_len": prompts, "output_len": outs}
        obs.append(_one_start_a_slot(wl, 70, "load-v2"))
    a, b = obs
    np.testing.assert_array_equal(a[:40], b[:40])  # admitted at slot 10, 30 tokens: done at the end of slot 39
    assert not np.array_equal(a[40:], b[40:])
    # the new features moved in that window: the queue's prompts differ from the arrivals', and the
    # head arrived in the burst while the rate now is one a slot
    assert len(np.unique(a[:40, 19])) > 5
    assert np.any(np.abs(a[:40, 17] - a[:40, 10]) > 0.1)  # head-era rate against rate_32
    assert len(np.unique(a[:40, 18])) > 3  # completions counted


def test_work_estimate_matches_the_workload_on_stationary_load():
    wl = make_workload(_iid(3.0))
    env = FlowControlEnv(M=16492, workload=_iid(3.0), horizon=3000, observation="load", max_budget=256)
    env.reset(seed=1)
    for _ in range(2999):
        env.step(64)
    w_hat = env.tracker.work
    assert w_hat is not None
    assert abs(w_hat / wl.mean_work() - 1.0) < 0.15, (w_hat, wl.mean_work())
    assert env.safe_budget() == pytest.approx(16492 / w_hat)


def test_work_estimate_exists_before_any_completion():
    # long outputs: nothing completes in 20 slots, but the active set bounds l + o from below
    env = FlowControlEnv(M=100_000, workload=_iid(2.0, [[50, 500]]), horizon=30, observation="load", max_budget=8)
    env.reset(seed=0)
    for _ in range(20):
        env.step(4)
    tr = env.tracker
    assert tr.mean_length is None  # no completion yet
    assert tr.work is not None and tr.work >= 50 * 10  # at least l * (tokens generated so far)
    assert env.safe_budget() < 256


def test_tracker_safe_budget_is_the_cap_while_nothing_is_known():
    tr = LoadTracker(1000, cap=77.0)
    assert tr.work is None and tr.safe_budget() == 77.0


# --------------------------------------------------------------------------- spaces


def test_load_observation_space_and_checker():
    from gymnasium.utils.env_checker import check_env

    env = FlowControlEnv(M=8000, workload=_iid(2.0), horizon=200, observation="load", action="multiplier",
                         max_budget=128)
    assert env.observation_space.shape == (len(LOAD_FEATURES),)
    assert env.action_space == gym.spaces.Discrete(11)
    check_env(env, skip_render_check=True)
    o, _ = env.reset(seed=3)
    for i in range(199):
        assert env.observation_space.contains(o)
        o, *_ = env.step(i % 11)


def test_load_v2_observation_is_the_17_features_and_three_more():
    """``observation="load-v2"``: a ``Box(-16, 16, (20,))`` whose first 17 entries are the ``"load"``
    observation of the same run, then the head-era rate, the completion rate and the queue's prompt
    length, each from the tracker's own estimates."""
    from gymnasium.utils.env_checker import check_env

    from flowgym.sim.estimators import LOAD_FEATURES_V2

    kw = dict(M=8000, workload=_iid(9.0), horizon=400, action="log-multiplier", multiplier_of="max-head",
              multipliers=(0.5, 4.0), max_budget=128)
    v1 = FlowControlEnv(observation="load", **kw)
    v2 = FlowControlEnv(observation="load-v2", **kw)
    assert v2.observation_space.shape == (len(LOAD_FEATURES_V2),) == (20,)
    check_env(FlowControlEnv(observation="load-v2", **kw), skip_render_check=True)
    o1, _ = v1.reset(seed=4)
    o2, _ = v2.reset(seed=4)
    queued = 0
    for t in range(399):
        np.testing.assert_array_equal(o1, o2[:17])
        tr, eng = v2.tracker, v2.engine
        bs = tr.safe_budget()
        assert o2[17] == pytest.approx(np.log1p(tr.head_rate() / bs), rel=1e-5)
        if eng.n_queued:
            queued += 1
            want = np.log(max(eng.queued_prompt_tokens / eng.n_queued, 1.0) / max(tr._lA / tr._lN, 1.0))
            assert o2[19] == pytest.approx(want, rel=1e-5, abs=1e-6)
        else:
            assert o2[19] == 0.0
        a = np.array([np.sin(t / 7.0), -0.5], np.float32)
        o1, *_ = v1.step(a)
        o2, *_ = v2.step(a)
    assert queued > 50  # the queue was not empty for most of the run, so its feature was exercised
    with pytest.raises(ValueError, match="'load', 'load-v2', 'load-v3' or 'load-v4', got 'load3'"):
        FlowControlEnv(observation="load3", **kw)


def test_load_v3_observation_is_the_20_features_and_the_backlog_averages():
    """``observation="load-v3"``: a ``Box(-16, 16, (22,))`` whose first 20 entries are the ``"load-v2"``
    observation of the same run, then ``backlog_slots`` (entry 2) averaged over 64 and 1024 slots."""
    from gymnasium.utils.env_checker import check_env

    kw = dict(M=8000, workload=_iid(9.0), horizon=400, action="log-multiplier", multiplier_of="max-head",
              multipliers=(0.5, 4.0), max_budget=128)
    v2 = FlowControlEnv(observation="load-v2", **kw)
    v3 = FlowControlEnv(observation="load-v3", **kw)
    assert v3.observation_space.shape == (22,)
    check_env(FlowControlEnv(observation="load-v3", **kw), skip_render_check=True)
    o2, _ = v2.reset(seed=4)
    o3, _ = v3.reset(seed=4)
    avg = np.array([o2[2], o2[2]], np.float64)
    spread = 0.0
    for t in range(399):
        np.testing.assert_array_equal(o2, o3[:20])
        np.testing.assert_allclose(o3[20:], avg, rtol=1e-4, atol=1e-5)
        spread = max(spread, abs(float(o3[20]) - float(o3[21])))
        a = np.array([np.sin(t / 7.0), -0.5], np.float32)
        o2, *_ = v2.step(a)
        o3, *_ = v3.step(a)
        avg += (float(o2[2]) - avg) / np.array([64.0, 1024.0])
    assert spread > 0.1  # the backlog moved, so the two averages told it apart


def test_load_v4_observation_is_the_22_features_and_the_swings():
    """``observation="load-v4"``: a ``Box(-16, 16, (25,))`` whose first 22 entries are the ``"load-v3"``
    observation of the same run, then the tracker's three swings; a Poisson load at a constant rate swings
    a little (noise), one whose rate jumps swings several times more in ``rate_swing``."""
    from gymnasium.utils.env_checker import check_env

    kw = dict(M=8000, horizon=600, action="log-multiplier", multiplier_of="max-head", multipliers=(0.5, 4.0),
              max_budget=128)
    v3 = FlowControlEnv(observation="load-v3", workload=_iid(9.0), **kw)
    v4 = FlowControlEnv(observation="load-v4", workload=_iid(9.0), **kw)
    assert v4.observation_space.shape == (25,)
    check_env(FlowControlEnv(observation="load-v4", workload=_iid(9.0), **kw), skip_render_check=True)
    o3, _ = v3.reset(seed=4)
    o4, _ = v4.reset(seed=4)
    a = np.array([0.0, -0.5], np.float32)
    for _ in range(599):
        np.testing.assert_array_equal(o3, o4[:22])
        np.testing.assert_allclose(o4[22:], v4.tracker.swings, rtol=1e-6)
        o3, *_ = v3.step(a)
        o4, *_ = v4.step(a)
    steady = float(o4[22])
    jump = {**_iid(1.0), "rate": {"kind": "steps", "times": [0, 300], "rates": [2.0, 18.0]}}
    env = FlowControlEnv(observation="load-v4", workload=jump, **kw)
    o, _ = env.reset(seed=4)
    for _ in range(599):
        o, *_ = env.step(a)
    assert 0 < steady and float(o[22]) > 3 * steady


def test_multiplier_action_is_k_times_the_safe_budget():
    ks = (0.5, 1.0, 3.0)
    env = FlowControlEnv(M=8000, workload=_iid(6.0), horizon=300, observation="load", action="multiplier",
                         multipliers=ks, max_budget=40)
    env.reset(seed=2)
    seen_cap = seen_floor = False
    for t in range(299):
        safe = env.safe_budget()
        for a, k in enumerate(ks):
            want = int(min(max(round(k * safe), 1), 40))
            assert env.check_action(a) == want
            seen_cap |= want == 40
            seen_floor |= want < 40
        _, _, _, _, info = env.step(t % 3)
        assert info["admitted"] <= env.check_action(t % 3) or True  # the budget moves after the step
    assert seen_cap and seen_floor
    with pytest.raises(ValueError, match="action 3 is not in the action space Discrete\\(3\\)"):
        env.check_action(3)
    with pytest.raises(ValueError, match="not in the action space"):
        env.check_action(1.0)


def test_multiplier_step_admits_at_most_the_budget():
    env = FlowControlEnv(M=8000, workload=_iid(20.0), horizon=100, action="multiplier", multipliers=(0.5,),
                         max_budget=256)
    env.reset(seed=0)
    for _ in range(99):
        b = env.check_action(0)
        _, _, _, _, info = env.step(0)
        assert info["admitted"] <= b


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"action": "levels"}, "action must be 'budget', 'multiplier' or 'log-multiplier', got 'levels'"),
        ({"action": "log-multiplier", "multiplier_of": "both"}, "multiplier_of='both' .* no continuous form"),
        ({"action": "log-multiplier", "multipliers": (1.0,)}, "needs two of them, got \\(1.0,\\)"),
        ({"action": "log-multiplier", "per_class_budget": True, "output_length_known": True},
         "action='log-multiplier' sets one global budget"),
        ({"observation": "scale-free"}, "observation must be 'dict', 'flat', 'load', 'load-v2', 'load-v3' or 'load-v4'"),
        ({"multipliers": (2.0, 1.0)}, "multipliers must be a list of positive numbers up to 1e\\+12 in ascending order"),
        ({"multipliers": ()}, "multipliers must be"),
        ({"multipliers": (0.0, 1.0)}, "multipliers must be"),
        ({"multipliers": (1.0, math.inf)}, "multipliers must be"),
        ({"action": "multiplier", "per_class_budget": True, "output_length_known": True}, "per_class_budget"),
    ],
)
def test_bad_load_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FlowControlEnv(**kwargs)


# --------------------------------------------------------------------------- randomised env and distribution


def test_random_mix_is_deterministic_and_valid():
    dist = RandomMix(trace_p=0.0)  # the synthetic draws (trace pieces: the next test)
    a = [dist(np.random.default_rng(s)) for s in range(40)]
    b = [dist(np.random.default_rng(s)) for s in range(40)]
    assert a == b
    Ms = {d["M"] for d in a}
    assert len(Ms) > 30
    kinds = [d["workload"]["kind"] for d in a]
    assert "mix" in kinds and "iid" in kinds
    for d in a:  # every draw builds, and its load is inside the ranges asked for
        env = FlowControlEnv(**d, observation="load", action="multiplier", max_budget=256)
        rho = env.workload.peak_load(d["M"], d["horizon"])
        n = len(d["workload"].get("streams", [d["workload"]]))  # the streams that are off add their background
        top = max(dist.rho_range[1], dist.overload_rho_range[1]) * (1 + (n - 1) * dist.background_range[1])
        assert rho is not None and 0.0 < rho <= top + 1e-9


def test_random_mix_trace_pieces():
    """A draw is a piece of an Azure trace in continuous time with probability ``trace_p``; the
    coin is tossed last, so every other draw is the one ``trace_p=0`` gives."""
    plain, dist = RandomMix(trace_p=0.0), RandomMix()
    pieces = 0
    for s in range(60):
        a, b = plain(np.random.default_rng(s)), dist(np.random.default_rng(s))
        if b["workload"]["kind"] != "azure":
            assert a == b
            continue
        pieces += 1
        wl = b["workload"]
        assert wl["trace"] in ("conv", "code") and b["time_model"] == dist.trace_time_model
        assert dist.trace_window[0] <= wl["window"][0] < wl["window"][1] == dist.trace_window[1]
        assert dist.trace_rate_range[0] <= wl["rate_multiplier"] <= dist.trace_rate_range[1]
        assert dist.azure_M_range[0] <= b["M"] <= dist.azure_M_range[1]
    assert 3 <= pieces <= 20  # trace_p = 0.15 of 60 draws
    only = RandomMix(trace_p=1.0, trace_window=(1000.0, 1100.0), trace_rate_range=(0.5, 0.5))
    d = only(np.random.default_rng(1))
    assert d["workload"]["window"][1] == 1100.0 and d["workload"]["rate_multiplier"] == pytest.approx(0.5)
    starts = [only(np.random.default_rng(s))["workload"]["window"][0] for s in range(60)]
    assert 1000.0 <= min(starts) and max(starts) <= 1090.0 < max(starts) + 10  # a piece starts in the first 90%
    env = FlowControlEnv(**d, observation="load", action="log-multiplier", multiplier_of="max", max_budget=256)
    env.reset(seed=0)
    for _ in range(20):
        _, r, *_ = env.step(np.zeros(2, np.float32))
    _, _, _, _, info = env.step(np.zeros(2, np.float32))
    assert info["time"] > 0 and "duration" in info and r <= 0  # continuous time: seconds
    assert make_distribution(only.to_spec()) == only
    for bad in ((1800.0, 0.0), ("0", 1800.0), (False, 1800.0), (0.0, math.inf), (0.0,)):
        with pytest.raises(ValueError, match="random-mix: trace_window must be \\[start, end\\]"):
            RandomMix(trace_window=bad)
    with pytest.raises(ValueError, match="random-mix: trace_time_model: unknown latency preset 'h100'"):
        RandomMix(trace_time_model="h100")
    with pytest.raises(ValueError, match="random-mix: trace_p must be a probability"):
        RandomMix(trace_p=-0.1)
    with pytest.raises(ValueError, match="random-mix: trace_window must span at least 100 s"):
        RandomMix(trace_window=(1000.0, 1050.0))
    from flowgym.sim.datasets import azure_columns

    span = min(float(azure_columns(k)[0][-1]) for k in ("conv", "code"))
    RandomMix(trace_window=(span - 100.0, span))  # ending at the shorter trace's last arrival is allowed
    with pytest.raises(ValueError, match="random-mix: trace_window must end within both Azure traces \\(by 34"):
        RandomMix(trace_window=(0.0, 3500.0))  # past the code trace (3,436 s), within conv (3,502 s)
    RandomMix(trace_window=(0.0, 7200.0), trace_p=0.0)  # no pieces drawn: no trace to fit
    with pytest.raises(ValueError, match="random-mix: trace_time_model must be a latency preset name .*'slot'"):
        RandomMix(trace_time_model="slot")
    with pytest.raises(ValueError, match="random-mix: reward='slowdown' needs trace_p=0"):
        RandomMix(reward="slowdown")
    # ranges that could only hang or fail when drawing are refused by name: a cache of 3 tokens or fewer holds no
    # request (the length loop never ended), phases of less than one whole slot, prompts or outputs below 1
    for field, bad in (("M_range", (1, 3)), ("azure_M_range", (3, 5)), ("prompt_range", (0.1, 0.5)),
                       ("output_range", (0.5, 2))):
        with pytest.raises(ValueError, match=f"random-mix: {field} must start at"):
            RandomMix(**{field: bad})
    for bad in ((0.2, 0.9), (1.5, 9), (0.5, 5)):
        with pytest.raises(ValueError, match="random-mix: phase_range must be \\[low, high\\] whole slots"):
            RandomMix(phase_range=bad)
    tiny = RandomMix(M_range=(4, 5), trace_p=0, azure_p=0, phase_range=(1.0, 3.0), phase_scale="uniform")
    for seed in range(6):  # the smallest cache allowed draws, and whole phases written as floats are read
        FlowControlEnv(**tiny(np.random.default_rng(seed))).reset(seed=0)


def test_random_mix_phase_lengths_are_log_uniform_unless_asked_for_uniform():
    def phases(dist):
        out = []
        for s in range(300):
            wl = dist(np.random.default_rng(s))["workload"]
            if wl["kind"] == "mix":
                for st in wl["streams"]:  # a stream's phase: from its rise to its fall
                    r = st["rate"]
                    on = [t for t, q in zip(r["times"], r["rates"]) if q == max(r["rates"])][0]
                    off = [t for t in r["times"] + [r["period"]] if t > on][0]
                    out.append(off - on)
        return np.array(out)

    lo, hi = RandomMix().phase_range
    log, uni = phases(RandomMix(trace_p=0.0)), phases(RandomMix(trace_p=0.0, phase_scale="uniform"))
    assert log.min() >= lo and log.max() <= hi and uni.min() >= lo and uni.max() <= hi
    mid = (lo * hi) ** 0.5  # half of a log-uniform draw lies below the geometric midpoint
    assert 0.4 < np.mean(log < mid) < 0.6 and np.mean(uni < mid) < 0.25
    with pytest.raises(ValueError, match="random-mix: phase_scale must be 'log' or 'uniform', got 'linear'"):
        RandomMix(phase_scale="linear")


def _phase_loads(d):
    """The load ``rho`` of each stream of a draw while it is on (its peak rate times its load per unit rate)."""
    wl = d["workload"]
    out = []
    for st in wl.get("streams", [wl]):
        r = st["rate"]
        peak = max(r["rates"]) if isinstance(r, dict) else r
        out.append(peak * make_workload({"kind": "iid", "rate": 1.0, "lengths": st["lengths"]}).load(d["M"]))
    return out


def _assert_default_draws_unchanged() -> None:
    """``RandomMix()``'s draws of seeds 0-59 are those of the code that trained the shipped model (commit
    9c2bd93), fingerprinted then: a field added since with its default tosses no coin."""
    h = hashlib.sha256()
    for s in range(60):
        h.update(json.dumps(RandomMix()(np.random.default_rng(s)), sort_keys=True).encode())
    assert h.hexdigest() == "2039ecf1b28e2a569a66f64888a203a8d3b4736976f011c861227c0a56ffe447"


def test_random_mix_overloaded_phases_only_when_asked_and_the_default_draws_unchanged():
    base, zero = RandomMix(trace_p=0.0), RandomMix(trace_p=0.0, phase_overload_p=0.0)
    every, some = RandomMix(trace_p=0.0, phase_overload_p=1.0), RandomMix(trace_p=0.0, phase_overload_p=0.3)
    lo, hi = base.overload_rho_range
    n_mix = over = total = 0
    for s in range(200):
        d0 = base(np.random.default_rng(s))
        assert zero(np.random.default_rng(s)) == d0
        d1 = every(np.random.default_rng(s))
        if d0["workload"]["kind"] != "mix":
            assert d1 == d0  # a stationary draw tosses no phase coin
            continue
        n_mix += 1
        assert all(lo - 1e-9 <= r <= hi + 1e-9 for r in _phase_loads(d1)), s
        rs = _phase_loads(some(np.random.default_rng(s)))
        over += sum(r > base.rho_range[1] + 1e-9 for r in rs)  # above 1.15: only from the overload range
        total += len(rs)
    assert n_mix > 100
    # P(rho > 1.15) = 0.3 * (1.5 - 1.15) / (1.5 - 1.0) = 0.21 per phase
    assert 0.14 < over / total < 0.28
    _assert_default_draws_unchanged()  # 0 (the default) tosses no coin
    assert RandomMix.from_spec({"kind": "random-mix", "phase_overload_p": 0.3}).phase_overload_p == 0.3
    with pytest.raises(ValueError, match="random-mix: phase_overload_p must be a probability in \\[0, 1\\], got 1.5"):
        RandomMix(phase_overload_p=1.5)


def test_slowdown_reward_scales_each_draw_by_its_output_tokens_per_slot():
    plain, slow = RandomMix(trace_p=0.0), RandomMix(trace_p=0.0, reward="slowdown")
    seen_mix = seen_azure = False
    for s in range(30):
        a, b = plain(np.random.default_rng(s)), slow(np.random.default_rng(s))
        scale = b.pop("reward_scale")
        assert a == b and "reward_scale" not in a  # the same draw, only its reward's scale added
        wl = a["workload"]
        streams = wl["streams"] if wl["kind"] == "mix" else [wl]
        want = 0.0
        for st in streams:
            lengths = st["lengths"]
            if lengths["kind"] == "empirical":
                eo = float(np.mean([p[1] for p in lengths["pairs"]]))  # three equally weighted pairs
            else:
                seen_azure = True
                eo = float(np.mean(make_workload(st | {"rate": 1.0}).lengths.sample(np.random.default_rng(0), 20000)[1]))
            r = st["rate"]
            if isinstance(r, dict):  # steps: the time average over the period
                seen_mix = True
                times, rates, period = r["times"] + [r["period"]], r["rates"], r["period"]
                mean_rate = sum(q * (t1 - t0) for q, t0, t1 in zip(rates, times, times[1:])) / period
            else:
                mean_rate = r
            want += mean_rate * eo
        assert scale == pytest.approx(want, rel=1e-9)
    assert seen_mix and seen_azure
    # the slowdown reward: requests in system per slot over the output tokens arriving per slot
    d = slow(np.random.default_rng(3))
    envs = [FlowControlEnv(**{**d, **scale}, observation="load", action="multiplier", max_budget=256)
            for scale in ({}, {"reward_scale": 100.0})]
    for e in envs:
        e.reset(seed=0)
    for _ in range(50):
        (_, r_slow, *_), (_, r_time, *_) = (e.step(5) for e in envs)
        assert r_slow * d["reward_scale"] == pytest.approx(r_time * 100.0)
    assert r_time < 0
    assert make_distribution(slow.to_spec()) == slow
    with pytest.raises(ValueError, match="random-mix: reward must be 'time' or 'slowdown', got 'latency'"):
        RandomMix(reward="latency")


def test_random_mix_spec_round_trip_and_errors():
    d = RandomMix(stationary_p=0.5, M_range=(1000.0, 2000.0))
    assert make_distribution(d.to_spec()) == d
    assert make_distribution("random-mix") == RandomMix()
    with pytest.raises(ValueError, match=r"random-mix has no field\(s\) \['colour'\]"):
        make_distribution({"kind": "random-mix", "colour": 1})
    with pytest.raises(ValueError, match="rho_range must be \\[low, high\\]"):
        RandomMix(rho_range=(1.0, 0.5))
    with pytest.raises(ValueError, match="stationary_p must be a probability"):
        RandomMix(stationary_p=1.5)
    assert RandomMix(horizon=1).horizon == 1
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="random-mix: horizon must be a positive integer"):
            RandomMix(horizon=bad)
    with pytest.raises(ValueError, match="unknown training distribution 'nope'"):
        make_distribution("nope")


@pytest.mark.parametrize("observation", ["load", "load-v2"])
def test_randomized_env_same_seed_same_episode(observation):
    def episode(seed):
        env = RandomizedFlowControlEnv(RandomMix(horizon=50), observation=observation, action="multiplier",
                                       max_budget=256)
        assert env.observation_space.shape == ({"load": 17, "load-v2": 20}[observation],)
        o, info = env.reset(seed=seed)
        seq = [o]
        for i in range(49):
            o, r, te, tr, _ = env.step(i % 11)
            seq.append(o)
        return info["config"], np.array(seq), env.metrics()["mean_time_in_system"]

    c1, s1, m1 = episode(5)
    c2, s2, m2 = episode(5)
    c3, _, _ = episode(6)
    assert c1 == c2 and np.array_equal(s1, s2) and m1 == m2
    assert c1 != c3


def test_randomized_env_refuses_m_dependent_observations():
    with pytest.raises(ValueError, match="needs observation='load'"):
        RandomizedFlowControlEnv(RandomMix(), observation="flat")


# --------------------------------------------------------------------------- reference agents


def test_safe_budget_agent_plays_k_times_the_safe_budget():
    kw = {"M": 8000, "workload": _iid(4.0), "horizon": 300}
    agent = SafeBudget(k=1.5, cap=100)
    ep = run_episode(agent, kw, seed=4, horizon=300)
    env = FlowControlEnv(**kw, action="multiplier", multipliers=(1.5,), max_budget=100)
    env.reset(seed=4)
    for _ in range(300):
        env.step(0)
    assert ep.metrics()["mean_time_in_system"] == env.metrics()["mean_time_in_system"]
    with pytest.raises(ValueError, match="k must be a positive finite number"):
        SafeBudget(k=0)


def test_schedule_agent_follows_its_periodic_schedule():
    agent = ScheduledBudget(times=[0, 10], budgets=[7, 2], period=25)
    env = FlowControlEnv(M=8000, workload=_iid(3.0), horizon=60, max_budget=8)
    agent.reset(env.config, 0)
    env.reset(seed=0)
    got = []
    for _ in range(60):
        b = agent.act(None, env.view())
        got.append(b)
        env.step(b)
    want = [7 if (t % 25) < 10 else 2 for t in range(60)]
    assert got == want
    assert make_agent("schedule", times=[0, 5], budgets=[1, 2]).label() == "schedule 0:1,5:2"
    with pytest.raises(ValueError, match="times must start at 0"):
        ScheduledBudget(times=[1, 5], budgets=[1, 2])
    with pytest.raises(ValueError, match="period must be a number beyond the last time"):
        ScheduledBudget(times=[0, 5], budgets=[1, 2], period=5)


# --------------------------------------------------------------------------- training


@needs_sb3
def test_generalist_pipeline_end_to_end(tmp_path):
    from flowgym.agents import LearnedBudget
    from flowgym.lab.train import TrainConfig, read_curves, train

    out = str(tmp_path / "gen")
    cfg = TrainConfig.generalist(total_timesteps=1024, n_envs=2, n_steps=256, batch_size=128, n_epochs=1,
                                 eval_freq=512, eval_episodes=2, final_eval_seeds=1, tune_seeds=1, out=out,
                                 progress=False, plot=False, distribution={"kind": "random-mix", "horizon": 300})
    res = train(cfg)
    evals = [r for r in res.curves if r["kind"] == "eval"]
    assert evals and all(r["geo_time_in_system"] > 0 for r in evals)
    # curves.csv keeps the selection metric of each evaluation, and the selected model has the best of them
    written = [r for r in read_curves(os.path.join(out, "curves.csv")) if r["kind"] == "eval"]
    assert [r["geo_time_in_system"] for r in written] == pytest.approx([r["geo_time_in_system"] for r in evals])
    agent = LearnedBudget(out)
    assert agent.meta["best_eval_time_in_system"] == pytest.approx(min(r["geo_time_in_system"] for r in written))
    assert agent.requires["observation"] == "load" and agent.requires["action"] == "multiplier"
    assert agent.meta["trained_on"]["kind"] == "random-mix"
    # the saved policy acts the same after a reload, on any scenario (scale-free)
    again = LearnedBudget(out)
    kw = {"M": 30000, "workload": _iid(5.0, [[40, 100]]), "horizon": 200}
    e1 = run_episode(agent, kw, seed=9, horizon=200)
    e2 = run_episode(again, kw, seed=9, horizon=200)
    assert np.array_equal(e1.series["admitted"], e2.series["admitted"])
    assert e1.metrics()["mean_time_in_system"] == e2.metrics()["mean_time_in_system"]
    with pytest.raises(ValueError, match="distribution= needs observation='load', 'load-v2', 'load-v3' or 'load-v4'"):
        TrainConfig.generalist(observation="flat").validate()
    TrainConfig.generalist(observation="load-v2").validate()  # the SB3 path takes the 20 features too
    with pytest.raises(ValueError, match="observation must be 'flat', 'load', 'load-v2', 'load-v3' or 'load-v4', got 'load3'"):
        TrainConfig.generalist(observation="load3").validate()
    with pytest.raises(ValueError, match="budget_levels are the actions of action='budget'"):
        TrainConfig.generalist(budget_levels=(0, 1, 2)).validate()


# --------------------------------------------------------------------------- batched training


@needs_sb3
def test_batched_training_vecenv_matches_the_dummy_one():
    from flowgym.lab.scenarios import get_scenario
    from flowgym.lab.train import batched_reason, learned_env_kwargs, make_vec_env

    kw = learned_env_kwargs(get_scenario("adaptive-switch").tune_env_kwargs(), 16)
    kw["horizon"] = 64
    assert batched_reason(kw, 8) is None
    levels = (0, 2, 4, 8, 16)
    a = make_vec_env(kw, 3, 7, kind="batched", action_repeat=8, budget_levels=levels)
    b = make_vec_env(kw, 3, 7, kind="dummy", action_repeat=8, budget_levels=levels)
    assert type(a).__name__ == "VecRepeatLevels" and type(b).__name__ == "DummyVecEnv"
    oa, ob = a.reset(), b.reset()
    np.testing.assert_allclose(oa, ob)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(20):  # 160 slots: two and a half episodes of 64
        act = rng.integers(0, len(levels), size=3)
        oa, ra, da, ia = a.step(act)
        ob, rb, db, ib = b.step(act)
        np.testing.assert_allclose(oa, ob, rtol=1e-6)
        np.testing.assert_allclose(ra, rb, rtol=1e-5)
        assert np.array_equal(da, db)
        ends += int(da.all())
    assert ends == 2
    # why not, by name
    assert "distribution" in batched_reason(kw, 8, distribution="random-mix")
    assert "multiple of action_repeat" in batched_reason({**kw, "horizon": 60}, 8)
    assert "queue_order" in batched_reason({**kw, "queue_order": "estimate"}, 8)
    with pytest.raises(ValueError, match="vec_env='batched' cannot run this configuration: horizon=60"):
        make_vec_env({**kw, "horizon": 60}, 2, 0, kind="batched", action_repeat=8)


def test_rate_anchor_multiplies_the_arrival_rate():
    env = FlowControlEnv(M=8000, workload=_iid(6.0), horizon=200, action="multiplier", multiplier_of="rate",
                         multipliers=(0.5, 1.5), max_budget=64)
    env.reset(seed=1)
    for t in range(199):
        rate = env.tracker.arrival_rate()
        assert env.check_action(1) == int(min(max(round(1.5 * rate), 1), 64))
        assert env.check_action(0) == int(min(max(round(0.5 * rate), 1), 64))
        env.step(t % 2)
    assert 4.0 < env.tracker.arrival_rate() < 8.0  # the moving average settles near the rate, 6 per slot
    with pytest.raises(ValueError, match="multiplier_of must be 'safe', 'rate', 'both', 'min', 'max', 'max-head' or "
                       "'max-drain', got 'queue'"):
        FlowControlEnv(multiplier_of="queue")
    with pytest.raises(ValueError, match="multiplier_of='max-head' multiplies both anchors.*action='multiplier'"):
        FlowControlEnv(multiplier_of="max-head", action="multiplier")


def test_every_multiplier_of_value_comes_from_one_tuple():
    """The env's config check, both action classes and the CLI's choices read spaces.MULTIPLIER_OF."""
    import argparse

    from flowgym.envs.spaces import (DISCRETE_MULTIPLIER_OF, LOG_MULTIPLIER_OF, MULTIPLIER_OF, LogMultiplierBudget,
                                     MultiplierBudget)
    from flowgym.lab.cli import build_parser

    tracker = LoadTracker(M=1000)
    assert set(DISCRETE_MULTIPLIER_OF) | set(LOG_MULTIPLIER_OF) == set(MULTIPLIER_OF)
    for of in MULTIPLIER_OF:
        if of in LOG_MULTIPLIER_OF:
            LogMultiplierBudget((0.5, 4.0), 64, tracker, of=of)
        else:
            with pytest.raises(ValueError, match=f"multiplier_of must be .* with action='log-multiplier', got '{of}'"):
                LogMultiplierBudget((0.5, 4.0), 64, tracker, of=of)
        if of in DISCRETE_MULTIPLIER_OF:
            MultiplierBudget((0.5, 4.0), 64, tracker, of=of)
        else:
            with pytest.raises(ValueError, match=f"multiplier_of must be 'safe', 'rate', 'both' or 'min', got '{of}'"):
                MultiplierBudget((0.5, 4.0), 64, tracker, of=of)
    train = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    assert tuple(next(a for a in train._actions if a.dest == "multiplier_of").choices) == MULTIPLIER_OF


def test_head_rate_anchor_is_the_same_in_streaming_record_mode():
    """Streaming renumbers request rows; the head's arrival slot (what the head rate reads) is kept."""
    kw = {"M": 3000, "workload": _iid(6.0), "horizon": 3000, "observation": "load", "action": "log-multiplier",
          "multiplier_of": "max-head", "multipliers": (0.5, 4.0), "max_budget": 256}
    runs = []
    for rec in ("full", "stream"):
        env = FlowControlEnv(**kw, record=rec)
        env.reset(seed=4)
        budgets, heads = [], []
        for t in range(2999):
            a = np.array([np.sin(t / 50.0), -0.5], np.float32)
            budgets.append(env.check_action(a))
            heads.append((env.tracker.head_rate(), env.tracker.arrival_rate()))
            env.step(a)
        runs.append((budgets, heads))
    assert runs[0] == runs[1]
    assert sum(abs(h - r) > 0.2 for h, r in runs[0][1]) > 100  # a queue forms: its head came at another rate


def test_load_observation_is_the_same_in_streaming_record_mode():
    kw = {"M": 8000, "workload": _iid(5.0), "horizon": 3000, "observation": "load", "action": "multiplier"}
    seqs = []
    for rec in ("full", "stream"):
        env = FlowControlEnv(**kw, record=rec)
        o, _ = env.reset(seed=3)
        seq = [o]
        for t in range(2999):
            o, *_ = env.step(t % 11)
            seq.append(o)
        seqs.append(np.array(seq))
    np.testing.assert_array_equal(seqs[0], seqs[1])


# --------------------------------------------------------------------------- shipped model, CLI, benchmark


def test_a_load_observation_model_plays_the_same_whether_lengths_are_known():
    """The load features read no output length, so a model on them does not need output_length_known=False
    (a scenario that knows the lengths runs it: the same episode, bit for bit); a model on the flat or dict
    observation, which reads them when known, keeps the need; --init still compares the recorded options."""
    from flowgym.agents import LearnedBudget
    from flowgym.lab.scenarios import get_scenario

    agent = make_agent("learned")
    assert "output_length_known" not in agent.requires
    assert agent.meta["agent_env_options"]["output_length_known"] is False  # what it was trained with
    kw = {**get_scenario("paper-synthetic-known").env_kwargs(), "horizon": 600}
    assert kw["output_length_known"] is True
    known = run_episode(agent, kw, seed=2, horizon=None)
    unknown = run_episode(make_agent("learned"), {**kw, "output_length_known": False}, seed=2, horizon=None)
    assert known.config.output_length_known and not unknown.config.output_length_known
    for part in ("log", "series"):
        a, b = getattr(known, part), getattr(unknown, part)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a), part
    base = agent.model
    flat = LearnedBudget.from_policy(base, None, {**agent.meta["agent_env_options"], "observation": "flat"}, 8)
    assert flat.requires["output_length_known"] is False


def test_shipped_generalist_loads_and_runs_without_training():
    from flowgym.agents.learned import DEFAULT_MODEL

    agent = make_agent("learned")
    assert agent.path == DEFAULT_MODEL and agent.label() == "learned (generalist)"
    assert agent.requires["observation"] == "load-v2" and agent.requires["multiplier_of"] == "max-head"
    assert agent.meta["trained_on"]["kind"] == "random-mix" and agent.meta["algo"] == "ars"
    assert agent.continuous and agent.meta["layer_sizes"] == [20, 2]  # a linear policy, numpy only
    from flowgym.lab.ars import ARSConfig

    # flowgym train's defaults are the shipped model's settings (it reproduces it; docs/training.md)
    hp = agent.meta["hyperparameters"]
    for key, value in dataclasses.asdict(ARSConfig()).items():
        if key == "init" and key not in hp:  # a setting added since (default None: no earlier model)
            assert value is None
            continue
        if key == "search" and key not in hp:  # added since (default "all": every weight searched, as then)
            assert value == "all"
            continue
        if key == "hinge" and key not in hp:  # added since (default 0: no penalty against a reference, as then)
            assert value == 0.0
            continue
        if key == "input_noise" and key not in hp:  # added since (default 0: no noise on the inputs, as then)
            assert value == 0.0
            continue
        if key == "memory" and key not in hp:  # added since (default 0: no memory, as then)
            assert value == 0
            continue
        if key not in ("out", "workers", "progress", "distribution"):
            assert hp[key] == (list(value) if isinstance(value, tuple) else value), key
    # today's default distribution (fields added since, phase_overload_p and shared_lengths_p, are missing there
    # and read as their defaults)
    now = make_distribution("random-mix").to_spec()
    assert {k: now[k] for k in agent.meta["trained_on"]} == agent.meta["trained_on"]
    assert make_distribution(agent.meta["trained_on"]) == make_distribution("random-mix")
    size = sum(os.path.getsize(os.path.join(DEFAULT_MODEL, f)) for f in os.listdir(DEFAULT_MODEL))
    assert size < 5_000_000
    # scale-free: it runs at any M and request scale, and its decisions are reproducible
    kw = {"M": 50000, "workload": _iid(3.0, [[200, 50], [50, 300]]), "horizon": 400}
    e1 = run_episode(agent, kw, seed=1, horizon=400)
    e2 = run_episode(make_agent("learned"), kw, seed=1, horizon=400)
    assert np.array_equal(e1.series["admitted"], e2.series["admitted"])
    assert e1.metrics()["completed"] > 0


def test_train_cli_ppo_generalist_and_scenario_defaults(monkeypatch):
    import flowgym.lab.train as train_mod
    from flowgym.lab.cli import main

    seen = {}

    def fake_train(cfg):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(train_mod, "train", fake_train)
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    with pytest.raises(SystemExit):  # PPO's generalist (the shipped one is --algo ars's: tests/test_ars.py)
        main(["train", "--quiet", "--algo", "ppo"])
    cfg = seen["cfg"]
    assert cfg.distribution == train_mod.PPO_GENERALIST_DISTRIBUTION and cfg.action == "multiplier"
    assert cfg.multiplier_of == "rate"
    # the distribution the PPO generalist was trained on (its meta predates phase_scale and trace pieces)
    meta = json.load(open(os.path.join(os.path.dirname(__file__), "..", "examples", "ppo_generalist",
                                       "flowgym_agent.json")))
    now = make_distribution(cfg.distribution).to_spec()
    assert {k: now[k] for k in meta["trained_on"]} == meta["trained_on"]
    assert now["phase_scale"] == "uniform" and now["trace_p"] == 0.0
    assert cfg.out == "runs/ppo-generalist" and cfg.total_timesteps == 1_000_000 and cfg.seed == 10_000
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--scenario", "adaptive-switch"])
    cfg = seen["cfg"]
    assert cfg.distribution is None and cfg.scenario == "adaptive-switch" and cfg.action == "budget"
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--scenario", "adaptive-switch", "--distribution", '{"kind": "random-mix", "stationary_p": 1}'])
    assert seen["cfg"].distribution == {"kind": "random-mix", "stationary_p": 1}


def _bench_learned_module():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_learned.py"
    spec = importlib.util.spec_from_file_location("bench_learned", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, match", [
    (["--scenarios", ""], "--scenarios: an empty name in ''"),
    (["--scenarios", "H4-short-phases,"], "an empty name"),
    (["--scenarios", "H4-short-phases,nosuch"], "unknown scenario 'nosuch'.*H8-overload-then-light"),
    (["--scenarios", "H4-short-phases", "--seeds", "0"], "--seeds must be at least 1, got 0"),
    (["--scenarios", "H4-short-phases", "--tune-seeds", "0"], "--tune-seeds must be at least 1"),
    (["--scenarios", "H4-short-phases", "--backend", "threads"], "invalid choice: 'threads'"),
    (["--scenarios", "H4-short-phases", "--seeds", "1001"], "report seeds 0..N-1 must stay below the tuning seeds"),
])
def test_benchmark_refuses_bad_options_before_tuning(argv, match, capsys):
    import re

    with pytest.raises(SystemExit) as e:
        _bench_learned_module().main(argv)
    assert e.value.code == 2 and re.search(match, capsys.readouterr().err)


def test_benchmark_classes_a_scenario_file_by_its_workload(tmp_path):
    from flowgym.lab.scenarios import _named_text, get_scenario

    mod = _bench_learned_module()
    for name, want in (("adaptive-high", True), ("adaptive-switch", False)):
        f = tmp_path / "mine.toml"  # renamed: the class comes from the workload, not the name
        f.write_text(_named_text(name).replace(f'name = "{name}"', 'name = "mine"'), encoding="utf-8")
        assert mod.is_stationary(get_scenario(str(f)).env_kwargs()) is want


def test_benchmark_uses_the_compare_path_and_its_held_out_scenarios_build():
    import flowgym.lab.evaluation as ev

    mod = _bench_learned_module()
    assert mod.evaluate is ev.evaluate and mod.tune is ev.tune  # the functions flowgym compare runs
    assert mod.lower_bounds is ev.lower_bounds  # and compare --bound
    ho = mod.held_out()
    assert len([n for n, kw in ho.items() if not mod.is_stationary(kw)]) >= 3
    # stationarity is read from the workload, the named scenarios' and the held-out ones' alike
    assert [n for n, kw in ho.items() if mod.is_stationary(kw)] == ["S1-stationary"]
    assert [n for n in mod.ADAPTIVE_SCENARIOS if mod.is_stationary(mod.scenario_arguments(n)[0])] == [
        "adaptive-low", "adaptive-high"]
    from flowgym.lab.scenarios import SCENARIOS

    assert not set(ho) & set(SCENARIOS)
    for kw in ho.values():
        FlowControlEnv(**kw).reset(seed=0)
    assert mod.phases(ho["H2-three-phase"]) == ([0.0, 700.0, 2000.0], 2600.0)
    assert mod.phases(ho["S1-stationary"]) is None
    r, lo, hi = mod.ratio_ci(np.array([2.0, 4.0, 6.0]), np.array([1.0, 2.0, 3.0]))
    assert r == 2.0 and lo == hi == 2.0
    r, lo, hi = mod.ratio_ci(np.array([1.0, 3.0, 2.0, 5.0]), np.array([2.0, 2.0, 2.0, 2.0]))
    assert lo < r < hi
    # the table has a column per reference, the untuned two-anchor rule among them
    refs = ["best fixed", "rate-switch (tuned)", "safe-budget k=2 (untuned)", "two-anchor (untuned)",
            "sglang-reserve (defaults)", "sglang-reserve (tuned)", "trt-no-evict (defaults)", "lower bound"]
    res = {"scenario": "H9", "held_out": True, "stationary": False, "fixed_b": 8, "sglang_conservativeness": 0.3,
           "mean_time_in_system": {"learned": 50.0}, "goal": "met",
           "ratios": {k: (0.5 + 0.1 * i, math.nan, math.nan) for i, k in enumerate(refs)}}
    header, rule, row = mod.markdown([res]).splitlines()
    cols = [c.strip() for c in header.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cols) == len(cells) == rule.count("|") - 1
    assert cells[cols.index("/ two-anchor 1.4/1")] == "0.800" and cells[cols.index("/ safe-budget k=2")] == "0.700"
    assert cells[cols.index("/ lower bound")] == "1.200"


def _experiment(name: str):
    """The module of ``benchmarks/learned_experiments/<name>.py`` (its own ``sys.path`` inserts undone)."""
    import importlib.util
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(name, root / "learned_experiments" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def test_the_sweeps_beyond_the_report_build_their_scenarios_deterministically(monkeypatch, tmp_path, capsys):
    """benchmarks/learned_experiments' stationary and non-stationary sweeps: every scenario builds, the same
    seed draws the same one, the shapes they promise are there, the --refs cache is read only for the same
    scenario and report seeds and is merged on write, the phase oracle is cached in it; anchors.py ranges
    names the features it counts."""
    import json

    mods = {name: _experiment(name) for name in ("stationary_sweep", "nonstationary_sweep", "anchors", "family_mix")}
    st, ns, anchors = mods["stationary_sweep"], mods["nonstationary_sweep"], mods["anchors"]
    # family_mix's training distribution: the sweep's draws (draw_from a seed's stream is draw(seed)) or
    # RandomMix's, the same ones for the same stream
    fm = mods["family_mix"]
    mix = fm.FamilyMix(0.5)
    kinds = []
    for seed in range(40000, 40012):
        a, b = mix(np.random.default_rng(seed)), mix(np.random.default_rng(seed))
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        sweep_kind = (a["M"] in ns.CACHES and "time_model" not in a and a["workload"].get("kind") == "mix"
                      and all(s["lengths"]["pairs"] in ns.FAMILIES.values() for s in a["workload"]["streams"]))
        assert sweep_kind == (np.random.default_rng(seed).random() < 0.5), seed  # the coin decides the kind
        kinds.append(sweep_kind)
    assert set(kinds) == {True, False}  # both kinds of draw
    spec = mix.to_spec()  # what trained_on records: both parts and the share, as JSON
    assert json.loads(json.dumps(spec)) == spec and spec["p"] == 0.5 and spec["random_mix"]["kind"] == "random-mix"
    rng = np.random.default_rng(5)
    rng.random()  # the coin, then the sweep's draw from the rest of the stream
    assert json.dumps(fm.FamilyMix(1.0)(np.random.default_rng(5))) == json.dumps(ns.draw_from(rng)[1])
    with pytest.raises(ValueError, match="p must be"):
        fm.FamilyMix(1.5)
    with pytest.raises(SystemExit):  # a hidden layer of width 0 is refused before any training
        fm.main(["--out", str(tmp_path / "never"), "--hidden", "0"])
    assert "--hidden: every width must be a positive integer, got [0]" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
    sc = st.scenarios()
    assert len(sc) == len(st.MIXES) * len(st.CACHES) * len(st.LOADS) == 32
    for kw in list(sc.values())[::7]:
        FlowControlEnv(**kw).reset(seed=0)
    assert all(isinstance(kw["workload"]["rate"], float) for kw in sc.values())  # stationary: one constant rate
    drawn = [ns.draw(s) for s in range(9000, 9016)]
    assert json.dumps(drawn) == json.dumps([ns.draw(s) for s in range(9000, 9016)])  # same seed, same scenario
    assert {label.split()[0] for label, _ in drawn} == {"turns", "burst", "overload"}
    for label, kw in drawn:
        FlowControlEnv(**kw).reset(seed=0)
        if kw["M"] < 24000:  # the families of tens of thousands of tokens only in a large cache
            assert not any(f in label for f in ns.LARGE_ONLY), label
    # the --refs cache: read back for the same scenario and report seeds, tuned anew otherwise
    kw0, kw1 = drawn[0][1], drawn[1][1]
    entry = {"key": ns.reference_key(kw0), "seeds": [8000, 8001], "b": 7,
             "rate_switch": {"high": 9, "low": 2, "threshold": 1.5}, "tis": {k: [10.0, 12.0] for k in ns.REFERENCES}}
    called = []
    monkeypatch.setattr(ns, "tune_fixed_and_rate_switch",
                        lambda *a: called.append(a) or (3, {"high": 3, "low": 3, "threshold": 1.0}))
    cache = {"9000": dict(entry)}
    b, rs, per = ns.references(9000, kw0, [8000, 8001], "serial", cache)
    assert not called and b == 7 and rs["high"] == 9 and per["best fixed"].tolist() == [10.0, 12.0]
    assert ns.reference_key(kw1) != ns.reference_key(kw0)
    b, rs, per = ns.references(9000, kw1, [8000, 8001], "serial", cache)  # another scenario under the same seed
    assert len(called) == 1 and b == 3 and cache["9000"]["key"] == ns.reference_key(kw1)
    b, rs, per = ns.references(9000, kw1, [8000], "serial", cache)  # other report seeds
    assert len(called) == 2 and cache["9000"]["seeds"] == [8000] and len(per["rate-switch (tuned)"]) == 1
    path = str(tmp_path / "refs.json")
    ns.save_references(path, {"9000": entry})
    ns.save_references(path, {"9001": cache["9000"]})  # a second sweep's entry joins the first's
    with open(path) as fh:
        assert sorted(json.load(fh)) == ["9000", "9001"]
    # --oracle: the phase oracle is tuned once per scenario entry and read back after
    tuned = []
    monkeypatch.setattr(ns, "tune_schedule", lambda times, period, start, *a: tuned.append(start) or
                        {"times": times, "budgets": [start] * len(times), "period": period})
    params, tis = ns.phase_oracle(9000, kw1, 3, [8000], "serial", cache)
    assert tuned == [3] and params["times"] == ns.phases(kw1)[0] and tis.shape == (1,) and tis[0] > 0
    assert cache["9000"]["oracle"]["params"] == params
    again, tis2 = ns.phase_oracle(9000, kw1, 3, [8000], "serial", cache)
    assert tuned == [3] and again == params and tis2.tolist() == tis.tolist()  # read back, not tuned again
    # ranges: one row per load, the features named by the model's observation
    rows = anchors.ranges(["S1-stationary"], 7000, 0)
    from flowgym.sim.estimators import LOAD_FEATURES_V2

    assert len(rows) == 3 and rows[2].startswith("| S1-stationary | ")
    named = rows[2].split("|")[4].strip()
    assert named == "" or named.split(",")[0].split()[0] in LOAD_FEATURES_V2


def test_both_anchors_in_one_action():
    env = FlowControlEnv(M=8000, workload=_iid(6.0), horizon=100, action="multiplier", multiplier_of="both",
                         multipliers=(1.0, 2.0), max_budget=256)
    assert env.action_space == gym.spaces.Discrete(4)
    env.reset(seed=0)
    for _ in range(60):
        env.step(1)
    rate, safe = env.tracker.arrival_rate(), env.safe_budget()
    want = [round(rate), round(2 * rate), round(safe), round(2 * safe)]
    assert [env.check_action(a) for a in range(4)] == [int(min(max(w, 1), 256)) for w in want]


def test_min_anchor_is_the_smaller_of_rate_and_safe_budget():
    seen = set()
    for rate_per_slot, M in ((6.0, 8000), (40.0, 3000)):  # the cache sustains the rate; it does not
        env = FlowControlEnv(M=M, workload=_iid(rate_per_slot), horizon=100, action="multiplier",
                             multiplier_of="min", multipliers=(1.0, 2.0), max_budget=256)
        assert env.action_space == gym.spaces.Discrete(2)
        env.reset(seed=0)
        for _ in range(80):
            env.step(0)
        rate, safe = env.tracker.arrival_rate(), env.safe_budget()
        assert [env.check_action(a) for a in range(2)] == [int(min(max(round(k * min(rate, safe)), 1), 256))
                                                           for k in (1.0, 2.0)]
        seen.add(rate < safe)
    assert seen == {True, False}  # both anchors were the smaller one once


@needs_sb3
def test_generalist_training_same_seed_same_model(tmp_path):
    import torch

    from flowgym.lab.train import TrainConfig, train

    def run(out):
        train(TrainConfig.generalist(total_timesteps=512, n_envs=2, n_steps=128, batch_size=64, n_epochs=1,
                                     eval_freq=256, eval_episodes=2, final_eval_seeds=0, out=str(out),
                                     progress=False, plot=False, distribution={"kind": "random-mix", "horizon": 200}))
        return torch.load(str(out / "policy.pt"), weights_only=True)

    a, b = run(tmp_path / "a"), run(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _warm_log_multiplier_env(M, of, action):
    """A ``log-multiplier`` environment (range 0.5-4, cap 64) after 120 slots of ``action``, 6 arrivals per slot."""
    env = FlowControlEnv(M=M, workload=_iid(6.0), horizon=200, action="log-multiplier", multiplier_of=of,
                         multipliers=(0.5, 1.0, 4.0), max_budget=64)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (len(action),), np.float32)
    env.reset(seed=1)
    for t in range(120):
        env.step(np.array(action, np.float32))
    return env


def test_log_multiplier_action_spans_the_multipliers_on_a_log_scale():
    env = _warm_log_multiplier_env(8000, "rate", [0.0])
    rate = env.tracker.arrival_rate()
    assert rate > 3.0
    # a = -1 is the smallest multiplier, a = 1 the largest, a = 0 their geometric mean (sqrt(0.5 * 4))
    for a, k in ((-1.0, 0.5), (1.0, 4.0), (0.0, math.sqrt(2.0)), (-1 / 3, 1.0)):
        assert env.check_action(np.array([a], np.float32)) == int(min(max(round(k * rate), 1), 64))
    assert env.check_action(0.5) == env.check_action(np.array([0.5]))  # a float or a one-element array
    for bad in (np.array([1.01], np.float32), np.array([np.nan], np.float32), np.array([0.0, 0.0]), True, "0"):
        with pytest.raises(ValueError, match="not in the action space Box"):
            env.check_action(bad)
    # the safe-budget anchor and the cap
    env = FlowControlEnv(M=8000, workload=_iid(6.0), horizon=50, action="log-multiplier", multiplier_of="safe",
                         multipliers=(1.0, 8.0), max_budget=7)
    env.reset(seed=0)
    env.step(np.array([-1.0], np.float32))
    assert env.check_action(np.array([-1.0], np.float32)) == int(min(max(round(env.safe_budget()), 1), 7))
    assert env.check_action(np.array([1.0], np.float32)) == 7


def test_two_anchor_action_takes_the_larger_multiple_of_the_rate_and_the_safe_budget():
    env = _warm_log_multiplier_env(20000, "max", [0.0, -1.0])
    rate, safe = env.tracker.arrival_rate(), env.safe_budget()
    assert rate > 3.0 and 0.5 < safe < 64 and abs(rate - safe) > 1.0  # the two anchors differ
    ks = {-1.0: 0.5, 0.0: math.sqrt(2.0), 1.0: 4.0}
    for ar, kr in ks.items():
        for as_, ksafe in ks.items():
            want = int(min(max(round(max(kr * rate, ksafe * safe)), 1), 64))
            assert env.check_action(np.array([ar, as_], np.float32)) == want, (ar, as_)
    # each anchor decides when the other's multiplier is the smallest
    assert env.check_action(np.array([1.0, -1.0], np.float32)) == round(4 * rate) > round(0.5 * safe)
    assert env.check_action(np.array([-1.0, 0.0], np.float32)) == round(math.sqrt(2) * safe) > round(0.5 * rate)
    for bad in (np.array([0.0], np.float32), np.array([0.0, 1.5], np.float32), np.array([np.nan, 0.0]), 0.0):
        with pytest.raises(ValueError, match="not in the action space Box"):
            env.check_action(bad)
    with pytest.raises(ValueError, match="2 multipliers per action"):
        env._act_type.multiplier(np.zeros(2))
    one = FlowControlEnv(M=8000, workload=_iid(6.0), horizon=50, action="log-multiplier", multiplier_of="rate",
                         multipliers=(0.5, 4.0))
    with pytest.raises(ValueError, match="multiplier_of='rate' has no rate anchor of its own"):
        one._act_type.rate_anchor()
    from gymnasium.utils.env_checker import check_env

    for of in ("max", "max-head"):
        check_env(FlowControlEnv(M=8000, workload=_iid(6.0), horizon=100, action="log-multiplier",
                                 multiplier_of=of), skip_render_check=True)


def test_drain_action_adds_a_capped_drain_term_to_the_head_era_two_anchors():
    """``multiplier_of="max-drain"``: ``B = max(k_rate * max(rate, head rate), k_safe * safe,
    min(queued / DRAIN_SLOTS, k_drain * safe))``; with ``k_drain`` at the bottom of the range it is the
    ``"max-head"`` budget in every state; a long queue makes the drain term decide."""
    from gymnasium.utils.env_checker import check_env

    from flowgym.envs.spaces import DRAIN_SLOTS

    assert DRAIN_SLOTS == 50.0  # the documented drain time (the env's docstring, docs/training.md)

    wl = {"kind": "mix", "streams": [
        {"kind": "iid", "rate": {"kind": "steps", "times": [0, 150], "rates": [40.0, 2.0]},
         "lengths": {"kind": "empirical", "pairs": [[10, 40]], "weights": [1.0]}}]}
    kw = dict(M=20000, workload=wl, horizon=600, action="log-multiplier", multipliers=(0.5, 4.0), max_budget=256)
    drain = FlowControlEnv(multiplier_of="max-drain", **kw)
    head = FlowControlEnv(multiplier_of="max-head", **kw)
    assert drain.action_space.shape == (3,)
    drain.reset(seed=2)
    head.reset(seed=2)
    ks = {-1.0: 0.5, 0.0: math.sqrt(2.0), 1.0: 4.0}
    drain_decides = 0
    for t in range(599):
        tr = drain.tracker
        rate, safe, q = max(tr.arrival_rate(), tr.head_rate()), drain.safe_budget(), drain.engine.n_queued
        assert tr.queued == q
        assert drain._act_type.drain_term(2.0) == min(q / DRAIN_SLOTS, 2.0 * safe)
        for ar, kr in ks.items():
            for ad, kd in ks.items():
                a = np.array([ar, -1.0, ad], np.float32)
                want = int(min(max(round(max(kr * rate, 0.5 * safe, min(q / DRAIN_SLOTS, kd * safe))), 1), 256))
                assert drain.check_action(a) == want, (t, ar, ad)
        # k_drain at its smallest never decides: the max-head budget of the same two multipliers
        a2 = np.array([np.sin(t / 9.0), np.cos(t / 13.0)], np.float32)
        k = 0.5 * 8.0 ** ((a2.astype(np.float64) + 1.0) / 2.0)
        assert drain.check_action(np.append(a2, -1.0)) == int(min(max(round(max(k[0] * rate, k[1] * safe)), 1), 256))
        if t == 0:  # the same state as the max-head environment's, which agrees
            assert drain.check_action(np.append(a2, -1.0)) == head.check_action(a2)
        big = np.array([-1.0, -1.0, 1.0], np.float32)
        if drain.check_action(big) > drain.check_action(np.array([-1.0, -1.0, -1.0], np.float32)) + 1:
            drain_decides += 1
        a3 = np.array([-1.0, -1.0, -1.0], np.float32)  # slow admission: a backlog builds
        _, _, te, tc, _ = drain.step(a3)
        if te or tc:
            break
    assert drain_decides > 20  # the queue built up in the busy phase and the drain term decided
    with pytest.raises(ValueError, match="3 multipliers per action"):
        drain._act_type.multiplier(np.zeros(3))
    with pytest.raises(ValueError, match="multiplier_of='max-head' has no drain term"):
        head._act_type.drain_term(1.0)
    for bad in (np.zeros(2, np.float32), np.array([0.0, 0.0, 1.5], np.float32)):
        with pytest.raises(ValueError, match="not in the action space Box"):
            drain.check_action(bad)
    check_env(FlowControlEnv(multiplier_of="max-drain", **kw), skip_render_check=True)


@pytest.mark.parametrize("of", ["max", "max-head", "max-drain"])
@pytest.mark.parametrize("action", ["budget", "multiplier"])
def test_two_anchor_action_needs_the_continuous_action(action, of):
    with pytest.raises(ValueError, match=f"multiplier_of='{of}' .* needs action='log-multiplier', got action='{action}'"):
        FlowControlEnv(action=action, multiplier_of=of)


def test_log_multiplier_falls_back_from_the_batched_vector_env():
    from flowgym.envs.flow_control import FlowControlConfig
    from flowgym.envs.vector import batched_unsupported

    reason = batched_unsupported(FlowControlConfig(action="log-multiplier", multiplier_of="rate"))
    assert reason is not None and "action='log-multiplier'" in reason
    reason = batched_unsupported(FlowControlConfig(observation="load-v2"))
    assert reason is not None and "observation='load-v2'" in reason
    venv = gym.make_vec("FlowControl-v0", num_envs=2, action="log-multiplier", multiplier_of="rate")
    assert isinstance(venv, gym.vector.SyncVectorEnv) and venv.single_action_space.shape == (1,)
    venv.close()


@needs_sb3
def test_continuous_generalist_trains_saves_and_reloads_with_the_same_actions(tmp_path):
    from flowgym.agents import LearnedBudget
    from flowgym.agents.learned import action_space_of
    from flowgym.lab.train import TrainConfig, train

    out = str(tmp_path / "gen")
    cfg = TrainConfig.generalist(action="log-multiplier", total_timesteps=1024, n_envs=2, n_steps=256, batch_size=128,
                                 n_epochs=1, eval_freq=512, eval_episodes=2, final_eval_seeds=1, tune_seeds=1, out=out,
                                 progress=False, plot=False, distribution={"kind": "random-mix", "horizon": 300},
                                 net_arch=(16,), log_std_init=-1.0)
    train(cfg)
    agent = LearnedBudget(out)
    assert agent.meta["hyperparameters"]["log_std_init"] == -1.0
    assert agent.meta["format"] == 2  # the layout that loads without pickle (policy.pt, normalization.npz)
    assert abs(float(agent.model.log_std.detach()[0]) + 1.0) < 0.1  # started at -1 (SB3's default is 0), one short update
    assert agent.continuous and agent.requires["action"] == "log-multiplier"
    assert agent.meta["action_space"] == {"kind": "box", "low": [-1.0], "high": [1.0]}
    kw = {"M": 30000, "workload": _iid(5.0, [[40, 100]]), "horizon": 200}
    e1 = run_episode(agent, kw, seed=9, horizon=200)
    e2 = run_episode(LearnedBudget(out), kw, seed=9, horizon=200)
    assert np.array_equal(e1.series["admitted"], e2.series["admitted"])
    # the deterministic action is the Gaussian's mean: the same observation gives the same float
    env = FlowControlEnv(**{**kw, **agent.requires})
    o, _ = env.reset(seed=0)
    a1, a2 = LearnedBudget(out).act(o, env.view()), LearnedBudget(out).act(o, env.view())
    assert a1.dtype == np.float32 and a1.shape == (1,) and -1.0 <= a1[0] <= 1.0 and np.array_equal(a1, a2)
    with pytest.raises(ValueError, match="log_std_init sets a Gaussian policy's spread: it needs action='log-multiplier'"):
        TrainConfig.generalist(log_std_init=-1.0).validate()
    with pytest.raises(ValueError, match="log_std_init must be a finite number or None, got nan"):
        TrainConfig.generalist(action="log-multiplier", log_std_init=math.nan).validate()
    for bad in ({"kind": "box", "low": [1.0], "high": [-1.0]}, {"kind": "box", "low": [0.0]}, {"kind": "ring"}):
        with pytest.raises(ValueError, match="action_space="):
            action_space_of({"action_n": 0, "action_space": bad})


def test_random_mix_shared_lengths_only_when_asked_and_the_default_draws_unchanged():
    """``shared_lengths_p``: a switching draw's streams share the first one's lengths (phases differ in load
    only); 0, the default, tosses no coin, so the draws are those from before the field."""
    base, every, some = (RandomMix(trace_p=0.0), RandomMix(trace_p=0.0, shared_lengths_p=1.0),
                         RandomMix(trace_p=0.0, shared_lengths_p=0.3))
    n_mix = n_shared = 0
    for s in range(200):
        d0 = base(np.random.default_rng(s))
        assert RandomMix(trace_p=0.0, shared_lengths_p=0.0)(np.random.default_rng(s)) == d0
        d1 = every(np.random.default_rng(s))
        if d0["workload"]["kind"] != "mix":
            assert d1 == d0  # a stationary draw tosses no coin
            continue
        n_mix += 1
        lengths = [st["lengths"] for st in d1["workload"]["streams"]]
        assert all(x == lengths[0] for x in lengths), s
        streams = some(np.random.default_rng(s))["workload"]["streams"]
        n_shared += all(st["lengths"] == streams[0]["lengths"] for st in streams)
    assert n_mix > 100
    assert 0.2 < n_shared / n_mix < 0.4  # 0.3, and a chance of equal draws that is nil for continuous lengths
    _assert_default_draws_unchanged()
    assert RandomMix.from_spec({"kind": "random-mix", "shared_lengths_p": 0.3}).shared_lengths_p == 0.3
    with pytest.raises(ValueError, match="random-mix: shared_lengths_p must be a probability in \\[0, 1\\], got -0.1"):
        RandomMix(shared_lengths_p=-0.1)


def test_the_bound_script_puts_every_policy_above_the_bound():
    """benchmarks/learned_experiments/bound.py: on a short run of a held-out scenario the best fixed budget and
    the shipped model are at or above the lower bound, and the verdict reads the interval as documented."""
    bound = _experiment("bound")
    from bench_learned import held_out  # imported by bound.py (sys.modules)

    kw = {**held_out()["H6-rag-burst"], "horizon": 600}
    r = bound.scenario_row(kw, 24, None, [0, 1], 600)
    m = r["mean"]
    assert m["service"] <= m["bound"] <= min(m["fixed"], m["learned"])
    assert m["lagrangian"] <= m["bound"] and m["memory"] <= m["bound"]
    assert r["bound_over_fixed"][0] == pytest.approx(m["bound"] / m["fixed"])
    assert bound.verdict((0.95, 0.91, 0.99)) == "out of reach"
    assert bound.verdict((0.95, 0.85, 0.99)).startswith("out of reach on the mean")
    assert bound.verdict((0.80, 0.70, 0.95)) == "not excluded"


def _rollout(pol, xs):
    """A recurrent experiment policy played on the rows of ``xs`` as one episode: its last state and its actions."""
    z, acts = None, []
    for t, x in enumerate(xs):
        act, z = pol.predict(x[None], z, [t == 0])
        acts.append(act[0])
    return z, acts


def test_the_load_classifier_experiment_gates_its_experts_as_it_was_fitted(capsys):
    """benchmarks/learned_experiments/load_classifier.py: the gate reads at run time the averages it was fitted on
    (the policy's carried state equals ``averages`` decision by decision), a gate sure of A (of B) plays expert A
    (B) exactly, the searched weights start at the experts', and the ridge logistic fit separates a separable
    label and weighs every episode alike."""
    import pathlib

    lc = _experiment("load_classifier")
    shipped = str(pathlib.Path(__file__).resolve().parents[1] / "flowgym" / "data" / "models" / "generalist")
    a = lc.expert(shipped).model
    n_obs = a.observation_space.shape[0]
    rng = np.random.default_rng(3)
    # B: the shipped policy with other weights, so that the two experts differ
    ((w, b),) = a.layers
    from flowgym.agents.learned import ArrayPolicy

    b_pol = ArrayPolicy([(w + rng.normal(0, 0.3, w.shape), b - 0.2)], a.observation_space.low, a.observation_space.high)
    xs = rng.normal(size=(40, n_obs))
    gw = rng.normal(0, 0.2, len(lc.LEAKS) * n_obs + n_obs)
    pol = lc.GatedPolicy(a, b_pol, gw, 0.1)
    z, acts = _rollout(pol, xs)
    want = lc.averages(xs)
    np.testing.assert_allclose(z[0], want[-1], rtol=1e-12)
    g = 1 / (1 + np.exp(-(lc.gate_inputs(xs, want) @ gw + 0.1)))
    np.testing.assert_allclose(np.array(acts), g[:, None] * a(xs) + (1 - g[:, None]) * b_pol(xs), rtol=1e-5, atol=1e-6)
    assert 0.05 < g.min() and g.max() < 0.95  # a gate in between: both experts count
    for c, expert_pol in ((60.0, a), (-60.0, b_pol)):
        sure = lc.GatedPolicy(a, b_pol, np.zeros_like(gw), c)
        np.testing.assert_allclose(sure.predict(xs, None, None)[0], expert_pol(xs), atol=1e-6)
        np.testing.assert_allclose(sure(xs), expert_pol(xs), atol=1e-6)  # called, the blend too
    with pytest.raises(ValueError, match="no model-directory format"):
        pol.arrays()
    # a state already carried is reset where an episode starts, and only there
    z2 = np.vstack([z, z + 1.0])
    _, fresh = pol.predict(np.vstack([xs[0], xs[0]]), z2, [True, False])
    np.testing.assert_allclose(fresh[0], np.tile(xs[0], len(lc.LEAKS)))
    assert not np.allclose(fresh[1], fresh[0])
    # the search starts at the experts' weights: the rebuilt policy plays as the gated one
    agent = lc.gated([shipped, shipped], gw, 0.1)
    theta = lc.start_theta([shipped, shipped])
    assert theta.shape == (2 * ArrayPolicy.n_weights([n_obs, 2]),)
    rebuilt = lc.gated_theta([shipped, shipped], gw, 0.1, theta).model
    np.testing.assert_allclose(rebuilt.predict(xs, None, None)[0], agent.model.predict(xs, None, None)[0])
    half = ArrayPolicy.n_weights([n_obs, 2])
    moved_a = theta.copy()
    moved_a[:half] += 0.5  # A's weights come first, B's after
    for c, moves in ((60.0, True), (-60.0, False)):
        moved = lc.gated_theta([shipped, shipped], np.zeros_like(gw), c, moved_a).model
        same = np.allclose(moved.predict(xs, None, None)[0], a(xs), atol=1e-6)
        assert same is not moves, c
    # bad experts are refused by name before the gate is fitted (a refusal inside a pool worker would hang it)
    for bad, says in ((shipped, "--experts takes two directories"), (f"{shipped},{shipped}/nowhere", "--experts: ")):
        with pytest.raises(SystemExit):
            lc.main(["draws", "--experts", bad])
        out, err = capsys.readouterr()
        assert says in err and "gate (logistic" not in out  # refused before the fit, which prints its accuracy
    # the fit: a label that one input decides is learned; a long episode does not outweigh a short one
    n_in = len(gw)
    eps = []
    for i in range(20):
        p = rng.normal(size=(10 if i % 2 else 200, n_in))
        lab = i % 2
        p[:, 0] = np.abs(p[:, 0]) + 0.5 if lab else -np.abs(p[:, 0]) - 0.5
        eps.append((p, lab))
    fw, fc = lc.fit_gate(eps)
    assert lc.accuracy(fw, fc, eps)[:2] == (1.0, 1.0)
    assert abs(fc) < 1.0  # ten short episodes of 1 and ten long of 0 weigh alike: no bias toward the long ones


def test_the_distilled_offsets_experiment_plays_and_fits_what_it_says(tmp_path):
    """benchmarks/learned_experiments/distill_offsets.py: the student plays the shipped action plus its offset
    (clipped), carrying the averages it was fitted on; a constant offset agent plays the grid point; the soft-best
    offset is the grid's minimum when one point is clearly best and the centre of a flat grid; the ridge fit
    recovers a linear map and weighs every draw alike; a file of another grid is refused by name."""
    do = _experiment("distill_offsets")
    from flowgym.agents import LearnedBudget

    base = LearnedBudget(None).model
    n_obs = base.observation_space.shape[0]
    rng = np.random.default_rng(5)
    xs = rng.normal(size=(30, n_obs))
    n_in = n_obs * (1 + len(do.LEAKS))
    V, d = rng.normal(0, 0.1, (n_in, 2)), np.array([0.2, -0.3])
    pol = do.OffsetStudent(base, V, d, 0.5)
    z, acts = _rollout(pol, xs)
    want = do.averages(xs)
    np.testing.assert_allclose(z[0], want[-1], rtol=1e-12)
    off = 0.5 * (do.gate_inputs(xs, want) @ V + d)
    np.testing.assert_allclose(np.array(acts), np.clip(base(xs) + off, -1, 1), rtol=1e-5, atol=1e-6)
    assert np.ptp(off[:, 0]) > 0.05  # the offset moves with the state, not a constant
    big = do.OffsetStudent(base, np.zeros_like(V), np.array([5.0, -5.0]), 1.0)
    np.testing.assert_allclose(big(xs), np.tile([1.0, -1.0], (len(xs), 1)))  # clipped to the action's box
    with pytest.raises(ValueError, match="no model-directory format"):
        pol.arrays()
    from flowgym.lab.evaluation import env_for

    const, plain = do.offset_agent(np.array([0.3, 0.0])), LearnedBudget(None)
    env = env_for(plain, {"M": 16492, "horizon": 64}, None)
    obs, _ = env.reset(seed=0)
    const.reset(env.config, seed=0)
    plain.reset(env.config, seed=0)
    for _ in range(20):  # decisions and the slots they are held for alike
        want = np.clip(plain.act(obs, env.view()) + [0.3, 0.0], -1, 1)
        np.testing.assert_allclose(const.act(obs, env.view()), want, rtol=1e-6)
        obs, *_ = env.step(want)
    # soft-best: one point clearly best, then a flat grid
    loss = np.zeros((2, len(do.GRID), 3))
    loss[0] += 1.0
    loss[0, 7] = 0.0
    best = do.soft_best(loss)
    np.testing.assert_allclose(best[0], do.GRID[7], atol=1e-6)
    np.testing.assert_allclose(best[1], [0.0, 0.0], atol=1e-12)
    assert do.nearest(do.GRID[7] + 0.05) == 7
    # the fit: constant inputs per draw and targets linear in them are recovered
    V0, d0 = rng.normal(size=(4, 2)), np.array([0.1, 0.2])
    cs = rng.normal(size=(40, 4))
    pts = [np.repeat(c[None], 5 + 50 * (i % 2), axis=0) for i, c in enumerate(cs)]
    Vf, df = do.fit_student(pts, cs @ V0 + d0, 1e-9)
    np.testing.assert_allclose(cs @ Vf + df, cs @ V0 + d0, atol=1e-6)
    # two draws of the same inputs, one 10 decisions long and one 1,000: their targets weigh alike
    same = np.ones((1, 4))
    Vf, df = do.fit_student([np.repeat(same, 10, axis=0), np.repeat(same, 1000, axis=0), rng.normal(size=(30, 4))],
                            np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]), 1e-6)
    p = (same @ Vf + df)[0]
    assert abs(p[0] - p[1]) < 0.05, p  # a length-weighted fit would sit near the long draw's (0, 1)
    # a labels file of another grid is refused, naming the file
    bad = tmp_path / "bad.npz"
    np.savez(bad, seeds=np.arange(2), grid=do.GRID[:4], loss=np.zeros((2, 4, 3)), points=np.zeros((4, n_in)),
             lengths=np.array([2, 2]))
    with pytest.raises(ValueError, match="bad.npz is not a labels output"):
        do.load_labels(str(bad))
    # an expert that kept the shipped model's weights moves nothing; an empty experts folder is refused by name
    import shutil

    from flowgym.agents.learned import DEFAULT_MODEL

    shutil.copytree(DEFAULT_MODEL, tmp_path / "experts" / "87000")
    pts, ys, _ = do._expert_points_job((str(tmp_path / "experts" / "87000"), 87000))
    assert pts.shape[1] == n_in and ys.shape == (len(pts), 2) and len(pts) > 10
    assert np.abs(ys).max() == 0.0
    # an expert whose first output sits higher: its offset from the shipped action is positive there, zero on the
    # other output (the target is the expert's action minus the shipped one, not the other way round)
    moved = tmp_path / "experts" / "87001"
    shutil.copytree(DEFAULT_MODEL, moved)
    with np.load(moved / "policy.npz") as z:
        arrs = dict(z)
    arrs["b0"] = arrs["b0"] + np.array([0.1, 0.0])
    np.savez(moved / "policy.npz", **arrs)
    _, ys, _ = do._expert_points_job((str(moved), 87001))
    assert np.all(ys[:, 0] > 0) and np.all(ys[:, 0] <= 0.1 + 1e-9) and np.abs(ys[:, 1]).max() == 0.0
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="none holds no experts"):
        do.expert_targets(str(tmp_path / "none"), 1)
    # per-decision targets: a state-dependent offset linear in the inputs is recovered
    X = [rng.normal(size=(20, 4)) for _ in range(10)]
    Vf, df = do.fit_points(X, [x @ V0 + d0 for x in X], 1e-9)
    np.testing.assert_allclose(Vf, V0, atol=1e-6)


def test_the_fractional_budget_experiment_rounds_by_error_diffusion():
    """benchmarks/learned_experiments/fractional.py: the budgets' running sum stays within one request of the
    fractional budgets' (so their mean is the fraction, below 1 too), the fractional rate-switch plays ``low`` on
    average below its threshold and ``high`` above, and the environment's own rounding is back after a job."""
    fr = _experiment("fractional")
    import flowgym.envs.spaces as spaces

    d, bs = fr.Diffusion(), np.random.default_rng(0).uniform(0, 3, 500)
    got = np.array([d.take(b) for b in bs])
    assert np.all(np.abs(np.cumsum(got) - np.cumsum(bs)) < 1) and set(np.unique(got)) <= {0, 1, 2, 3}
    rs = fr.FractionalRateSwitch(16, 0.7, 3.0)
    slow = [rs.act({"arrival_rate": np.array([1.0])}, None) for _ in range(100)]
    assert 69 <= sum(slow) <= 70 and set(slow) == {0, 1}  # 70 but for the float sum of 0.7s
    assert [rs.act({"arrival_rate": np.array([9.0])}, None) for _ in range(3)] == [16, 16, 16]
    with pytest.raises(ValueError, match="'max-drain'"):
        fr.fractional_budget((1.0, 1.0, 1.0), None, "max-drain", 64)
    name, rule, v = fr._job(("H4-short-phases", "ars9 fractional", 0, {}))
    assert spaces._scaled_budget is fr._ROUNDED and math.isfinite(v) and v > 0
    b = fr.budgets("H7-burst-on-base")  # the environment's own budgets: whole numbers, at least 1, one per slot
    assert b.size == 4000 and b.min() >= 1 and b.dtype.kind == "i"


def test_the_smoothing_experiment_averages_the_unrounded_budget():
    """benchmarks/learned_experiments/smoothing.py: the budget is an exponential average of the environment's
    unrounded budget over ``tau`` slots, rounded as the environment rounds; ``tau = 1`` is the environment's own
    mapping; a bad ``tau`` is refused by name; the environment's own rounding is back after a job."""
    sm = _experiment("smoothing")
    import types

    import flowgym.envs.spaces as spaces

    seq = iter([10.0, 20.0, 20.0, 0.2])
    saved = spaces._unrounded_budget
    spaces._unrounded_budget = lambda k, tracker, of, mb: next(seq)
    try:
        f, tracker = sm.smoothed_budget(2), types.SimpleNamespace()
        # s = 10, then 15, 17.5, 8.85: rounded, at least 1
        assert [f(None, tracker, "max-head", 64) for _ in range(4)] == [10, 15, 18, 9]
        seq = iter([3.4, 0.2])
        g, fresh = sm.smoothed_budget(1), types.SimpleNamespace()
        assert [g(None, fresh, "max-head", 64) for _ in range(2)] == [3, 1]  # tau 1: round(b), at least 1
    finally:
        spaces._unrounded_budget = saved
    for bad in (0.5, float("nan"), float("inf"), "8"):
        with pytest.raises(ValueError, match="tau"):
            sm.smoothed_budget(bad)
    name, rule, v = sm._job(("H4-short-phases", "tau=4", 0, {}))
    assert spaces._scaled_budget is sm._ROUNDED and math.isfinite(v) and v > 0
    _, _, v1 = sm._job(("H4-short-phases", "tau=1", 0, {}))
    _, _, v0 = sm._job(("H4-short-phases", "ars9", 0, {}))
    assert v1 == v0 != v  # tau 1 plays the environment's budgets exactly; tau 4 other ones


def test_the_completion_cap_experiment_caps_the_rate_anchor_only():
    """benchmarks/learned_experiments/completion_cap.py: the budget is ``max(k_safe x safe, min(k_rate x
    head-era rate, c x completion rate))``, the completion rate the tracker's completions over 16; only
    ``max-head`` is capped; a bad ``c`` is refused by name; the environment's own mapping is back after a job."""
    cc = _experiment("completion_cap")
    import types

    import flowgym.envs.spaces as spaces

    tr = types.SimpleNamespace(_Nf=80.0, arrival_rate=lambda: 10.0, head_rate=lambda: 6.0, safe_budget=lambda: 3.0)
    assert cc.completion_rate(tr) == 5.0
    assert cc.capped_budget(2.0)((2.0, 1.0), tr, "max-head", 64) == 10.0  # min(2 x 10, 2 x 5)
    assert cc.capped_budget(8.0)((2.0, 1.0), tr, "max-head", 64) == 20.0  # the cap does not bind: ars9's
    assert cc.capped_budget(0.1)((2.0, 1.0), tr, "max-head", 64) == 3.0  # the safe anchor is not capped
    assert cc.capped_budget(0.1)((2.0, 4.0), tr, "max-head", 10) == 10  # nor the budget's own cap
    with pytest.raises(ValueError, match="max-head"):
        cc.capped_budget(2.0)((2.0, 1.0), tr, "max", 64)
    for bad in (0.0, -1.0, 2, "2"):
        with pytest.raises(ValueError, match="cap c"):
            cc.capped_budget(bad)
    _, _, v = cc._job(("H4-short-phases", "c=1", 0, {}))
    assert spaces._unrounded_budget is cc._UNROUNDED and math.isfinite(v) and v > 0
    _, _, v0 = cc._job(("H4-short-phases", "ars9", 0, {}))
    assert v0 != v
    # the headroom cap: free = 1000 - (400 + 10 x (50 - 10) / 2) = 400 tokens, s = 50: c x 8, at least 1
    saved = spaces._unrounded_budget
    spaces._unrounded_budget = lambda k, t, of, mb: 20.0
    try:
        cc._UNROUNDED, real = spaces._unrounded_budget, cc._UNROUNDED
        room = types.SimpleNamespace(M=1000, mean_length=50.0, _lA=100.0, _lN=10.0, _held=400, _nact=10)
        assert cc.headroom_budget(1.0)(None, room, "max-head", 64) == 8.0
        assert cc.headroom_budget(4.0)(None, room, "max-head", 64) == 20.0  # ars9's budget is below the cap
        room._held = 2000
        assert cc.headroom_budget(4.0)(None, room, "max-head", 64) == 1.0  # no room: one admission
    finally:
        spaces._unrounded_budget, cc._UNROUNDED = saved, real
    with pytest.raises(ValueError, match="headroom c"):
        cc.headroom_budget(0.0)
    _, _, vh = cc._job(("H4-short-phases", "h=1", 0, {}))
    assert spaces._unrounded_budget is cc._UNROUNDED and vh not in (v0, v)


def test_the_fill_floor_experiment_floors_the_budget_by_the_free_room():
    """benchmarks/learned_experiments/fill_floor.py: the budget is ``max(the model's, c x free / s)``, capped at
    the largest budget; a full cache leaves the model's budget; a bad ``c`` is refused by name; the
    environment's own mapping is back after a job, and a model directory is played as given."""
    ff = _experiment("fill_floor")
    import types

    import flowgym.envs.spaces as spaces

    # free = 1000 - (400 + 10 x (50 - 10) / 2) = 400 tokens, s = 50: a floor of c x 8
    room = types.SimpleNamespace(M=1000, mean_length=50.0, _lA=100.0, _lN=10.0, _held=400, _nact=10)
    assert ff.free_room(room) == 400.0
    saved = spaces._unrounded_budget
    try:
        ff._UNROUNDED, real = (lambda k, t, of, mb: 5.0), ff._UNROUNDED
        assert ff.floored_budget(1.0)(None, room, "max-head", 64) == 8.0
        assert ff.floored_budget(0.5)(None, room, "max-head", 64) == 5.0  # the model's budget is above the floor
        assert ff.floored_budget(16.0)(None, room, "max-head", 64) == 64.0  # the largest budget still caps
        room._held = 2000
        assert ff.floored_budget(4.0)(None, room, "max-head", 64) == 5.0  # a full cache: the model's budget
        room._held, room.mean_length = 0, None
        assert ff.floored_budget(4.0)(None, room, "max-head", 64) == 5.0  # nothing completed yet: no floor
    finally:
        ff._UNROUNDED = real
        spaces._unrounded_budget = saved
    for bad in (0.0, -1.0, 2, "2"):
        with pytest.raises(ValueError, match="floor c"):
            ff.floored_budget(bad)
    _, _, v0 = ff._job(("H3-bursty-smallM", "shipped", 0, {}))
    _, _, v = ff._job(("H3-bursty-smallM", "shipped f=2", 0, {}))
    assert spaces._unrounded_budget is ff._UNROUNDED and math.isfinite(v) and v > 0 and v != v0
    from flowgym.agents.learned import DEFAULT_MODEL

    _, _, vp = ff._job(("H3-bursty-smallM", DEFAULT_MODEL, 0, {}))
    assert vp == v0  # the shipped model by its directory: the same episode


def test_the_steady_cap_experiment_caps_only_a_steady_overload():
    """benchmarks/learned_experiments/steady_cap.py: the rate anchor is capped at ``c x mu`` only while
    ``|log(rate_32 / rate_512)| < eps`` (and ``rate_512 > theta x safe``); elsewhere the environment's own
    budget; a bad rule is refused by name; the environment's mapping is back after a job."""
    sc = _experiment("steady_cap")
    import types

    import flowgym.envs.spaces as spaces

    assert sc.parse_rule("1,0.1") == (1.0, 0.1, None) and sc.parse_rule("1.5,0.2,0.9") == (1.5, 0.2, 0.9)
    for bad in ("1", "1,0.1,1,2", "a,0.1", "0,0.1", "1,-0.1", "1,nan"):
        with pytest.raises(ValueError, match="rule"):
            sc.parse_rule(bad)
    tr = types.SimpleNamespace(_Nf=80.0, rates=[0.0, 10.0, 0.0, 10.5], arrival_rate=lambda: 10.0,
                               head_rate=lambda: 6.0, safe_budget=lambda: 3.0)
    saved = spaces._unrounded_budget
    try:
        sc._UNROUNDED, real = (lambda k, t, of, mb: 99.0), sc._UNROUNDED
        assert sc.steady_budget(1.0, 0.1, None)((2.0, 1.0), tr, "max-head", 64) == 5.0  # min(2 x 6, 1 x 5)
        assert sc.steady_budget(1.0, 0.01, None)((2.0, 1.0), tr, "max-head", 64) == 99.0  # not steady enough
        assert sc.steady_budget(1.0, 0.1, 4.0)((2.0, 1.0), tr, "max-head", 64) == 99.0  # 10.5 < 4 x 3: not overloaded
        assert sc.steady_budget(1.0, 0.1, 3.0)((2.0, 1.0), tr, "max-head", 64) == 5.0
        tr.rates = [0.0, 6.3, 0.0, 6.0]  # rate_512 below 2 x 3 while rate_32 is above it: not overloaded
        assert sc.steady_budget(1.0, 0.1, 2.0)((2.0, 1.0), tr, "max-head", 64) == 99.0
        tr.rates = [0.0, 10.0, 0.0, 10.5]
        assert sc.steady_budget(0.1, 0.1, None)((2.0, 1.0), tr, "max-head", 64) == 3.0  # the safe anchor stands
        tr.rates = [0.0, 0.0, 0.0, 10.5]  # no arrivals lately: not steady
        assert sc.steady_budget(1.0, 0.1, None)((2.0, 1.0), tr, "max-head", 64) == 99.0
        with pytest.raises(ValueError, match="max-head"):
            sc.steady_budget(1.0, 0.1, None)((2.0, 1.0), tr, "max", 64)
    finally:
        sc._UNROUNDED = real
        spaces._unrounded_budget = saved
    _, _, v0 = sc._job(("H8-overload-then-light", "ars9", 7000, {}))
    _, _, v = sc._job(("H8-overload-then-light", "1,0.1", 7000, {}))
    assert spaces._unrounded_budget is sc._UNROUNDED and math.isfinite(v) and v > 0 and v != v0
    _, _, v5 = sc._job(("H8-overload-then-light", ".5,0.1", 7000, {}))  # a rule however written is a cap
    assert v5 != v0  # (a rule starting with "." was once played as ars9)
    kw, H = sc._load(sc.STATIONARY[0])
    assert H == 4000 and kw["M"] == 8192 and kw["workload"]["kind"] == "iid"
    kw, H = sc._load("ns9024")
    assert H == 4000 and kw["M"] == 32768


def test_the_stationary_sweep_probe_reports_what_each_agent_admits(monkeypatch, capsys):
    """stationary_sweep.py --probe: one row per agent (the model, then each budget in order); the row's
    figures are the episodes' own; a fixed budget ``b`` admits at most ``b`` a slot; a wrong name, a budget
    without --probe or a budget of 0 is refused by name."""
    st = _experiment("stationary_sweep")
    monkeypatch.setattr(st, "HORIZON", 300)
    kw = dict(st.scenarios()["mid M=8192 rho=1.3"], horizon=300)
    lines = st.probe(kw, [2, 3], [8000])
    rows = [line.strip("|").split("|") for line in lines[2:]]
    assert [r[0].strip() for r in rows] == ["learned (generalist)", "flow-control b=2", "flow-control b=3"]
    ep = run_episode(make_agent("flow-control", b=3), kw, 8000, 300)
    assert float(rows[2][1]) == pytest.approx(ep.metrics(300)["mean_time_in_system"], abs=0.05)
    assert float(rows[2][2]) == ep.series["evicted"].sum()
    assert float(rows[2][3]) == pytest.approx(ep.series["admitted"].mean(), abs=0.005)
    assert 2.0 < float(rows[2][3]) <= 3.0 and float(rows[1][3]) <= 2.0  # never above the budget
    with pytest.raises(SystemExit):
        st.main(["--probe", "chat M=1 rho=9", "--budgets", "4"])
    assert "--probe: no load named 'chat M=1 rho=9' in --set sweep" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        st.main(["--budgets", "4"])
    assert "--probe and --budgets go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        st.main(["--probe", "chat M=8192 rho=0.6", "--budgets", "0"])
    assert "--budgets" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a model directory that is none, named before any tuning
        st.main(["--model", "no/such/dir"])
    assert "argument --model" in capsys.readouterr().err
    # the second grid: 32 other loads, none of the first grid's, each builds; an unknown set is named
    blind = st.scenarios("blind")
    assert len(blind) == 32 and not set(blind) & set(st.scenarios())
    for kw in list(blind.values())[::5]:
        FlowControlEnv(**kw).reset(seed=0)
    with pytest.raises(ValueError, match="no set 'nope'"):
        st.scenarios("nope")


def test_the_estimator_experiment_computes_each_estimate_of_the_work():
    """benchmarks/learned_experiments/estimator.py: on one length pair ``(l, o)`` the corrected and the direct
    estimates of ``E[w]`` are ``l o + o (o + 1) / 2`` exactly and the package's is ``l o + o^2 / 2`` (its known
    bias); on a mix, the direct one is the decayed mean of the completed requests' own ``w``; the package's
    estimator is back after a job."""
    import gymnasium as gym

    from flowgym.sim.estimators import LoadTracker

    ex = _experiment("estimator")
    one = {"kind": "poisson", "classes": [[10, 20]], "rates": 0.5}
    mix = {"kind": "poisson", "classes": [[10, 20], [30, 90]], "rates": [0.3, 0.1]}
    try:
        LoadTracker._observe = ex._observe
        got = {}
        for kind in ex.ESTIMATES:
            LoadTracker._work_now = ex._work(kind)
            for name, wl in (("one", one), ("mix", mix)):
                env = gym.make("FlowControl-v0", workload=wl, horizon=600, observation="load-v2", max_budget=64)
                env.reset(seed=3)
                tracker, eng = env.unwrapped.tracker, env.unwrapped.engine
                for _ in range(600):
                    env.step(8)
                got[kind, name] = tracker.work
        # the direct estimate by hand on the mix: every completion's w, decayed per decision point
        log, d = env.unwrapped.request_log(), tracker._d
        done = log["finish"] >= 0
        w = log["prompt_len"] * log["output_len"] + log["output_len"] * (log["output_len"] + 1) / 2
        age = eng.t - log["finish"][done]
        by_hand = float(np.sum(w[done] * (1 - d) ** age) / np.sum((1 - d) ** age))
    finally:
        LoadTracker._observe, LoadTracker._work_now = ex._OBSERVE, ex._WORK_NOW
    assert got["corrected", "one"] == pytest.approx(10 * 20 + 20 * 21 / 2)
    assert got["direct", "one"] == pytest.approx(10 * 20 + 20 * 21 / 2)
    assert got["moments", "one"] == pytest.approx(10 * 20 + 20 * 20 / 2)
    assert got["direct", "mix"] == pytest.approx(by_hand, rel=1e-9)
    assert got["moments", "mix"] < got["corrected", "mix"]
    assert LoadTracker._work_now is ex._WORK_NOW and LoadTracker._observe is ex._OBSERVE
    _, rule, v = ex._job(("H4-short-phases", "direct", "safe k=1", 7000, {}))
    assert rule == "safe k=1 [direct]" and math.isfinite(v) and v > 0
    assert LoadTracker._work_now is ex._WORK_NOW and LoadTracker._observe is ex._OBSERVE
    from flowgym.agents.learned import DEFAULT_MODEL

    _, rule, w = ex._job(("H4-short-phases", "moments", f"model {DEFAULT_MODEL}", 7000, {}))
    _, _, w9 = ex._job(("H4-short-phases", "moments", "ars9", 7000, {}))
    assert rule == f"model {DEFAULT_MODEL} [moments]" and w == w9  # a model directory plays as the shipped one
    m, kind, seed, t = ex._draw_job(("shipped", "direct", 30000))  # a draw of the training distribution
    assert (m, kind, seed) == ("shipped", "direct", 30000) and math.isfinite(t) and t > 0
    assert LoadTracker._work_now is ex._WORK_NOW and LoadTracker._observe is ex._OBSERVE
    with pytest.raises(ValueError, match="estimate must be one of"):
        ex.patch("exact")


def test_the_experiment_helpers_say_which_ratio_they_give():
    """benchmarks/learned_experiments/common.py: ratio_boot is the ratio of means (one seed: no interval), ratio_ci
    the mean of the per-seed ratios, as their docstrings say."""
    c = _experiment("common")
    assert c.ratio_boot([1.0, 10.0], [2.0, 5.0])[0] == pytest.approx(11 / 7)
    assert c.ratio_ci([1.0, 10.0], [2.0, 5.0])[0] == pytest.approx(1.25)
    r, lo, hi = c.ratio_boot([2.0], [1.0])
    assert r == 2.0 and math.isnan(lo) and math.isnan(hi)


def test_the_benchmark_tunes_its_references_over_every_budget_to_16():
    """The grid the best fixed budget and the rate-switch's high are tuned over has every budget to 16 (adaptive-high's
    best is 13, which the coarse grid of the tables before 2026-11-29 missed); fine_grid.py reruns over that grid."""
    mod = _bench_learned_module()
    assert set(range(1, 17)) <= set(mod.FIXED_GRID) and 13 not in mod.COARSE_GRID
    assert mod.FIXED_GRID == sorted(mod.FIXED_GRID) and max(mod.FIXED_GRID) == max(mod.COARSE_GRID) == 256
    assert _experiment("fine_grid").FINE_GRID == _experiment("fine_grid").bl.FIXED_GRID


def test_the_benchmarks_goal_rule_at_its_lines():
    """One rule for bench_learned.py and fine_grid.py: within 2% of the best fixed budget on a stationary load, else
    at most 0.90x it and 1.00x the tuned rate-switch (the lines themselves count as met)."""
    g = _bench_learned_module().goal_met
    assert g(True, 1.02, 9.0) and not g(True, 1.0201, 0.5)
    assert g(False, 0.90, 1.00) and not g(False, 0.9001, 0.5) and not g(False, 0.5, 1.0001)
