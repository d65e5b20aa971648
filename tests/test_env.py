"""FlowControl-v0 as a Gymnasium environment: API conformance, determinism, copies, spec, vectors."""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import flowgym
from flowgym import FlowControlEnv

from _requires import needs_matplotlib, needs_sb3  # noqa: E402

CONFIGS = {
    "default": {},
    "known": {"output_length_known": True},
    "per_class": {"output_length_known": True, "per_class_budget": True, "max_budget": 8},
    "unknown_flat": {"observation": "flat"},
    "known_flat": {"output_length_known": True, "observation": "flat"},
    "lognormal": {
        "workload": {
            "kind": "iid",
            "rate": 20.0,
            "lengths": {"kind": "lognormal", "prompt_median": 11, "prompt_mean": 40.6,
                        "output_median": 45, "output_mean": 85.3, "max_prompt": 1024, "max_output": 1024},
        },
        "M": 16492,
    },
}


def rollout(env: gym.Env, seed: int, actions: list, steps: int):
    obs, info = env.reset(seed=seed)
    out = [(obs, info)]
    for a in actions[:steps]:
        obs, r, te, tr, info = env.step(a)
        out.append((obs, r, te, tr, info))
        if te or tr:
            break
    return out


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gymnasium_check_env_no_warnings(name):
    env = gym.make("FlowControl-v0", **CONFIGS[name])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped, skip_render_check=False)
    assert [str(w.message) for w in caught] == []


@needs_sb3
@pytest.mark.parametrize("name", ["default", "per_class", "unknown_flat", "known"])
def test_sb3_check_env(name):
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = FlowControlEnv(**CONFIGS[name])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check(env, warn=True)
    assert [str(w.message) for w in caught] == []


def test_registered_and_spaces():
    assert "FlowControl-v0" in gym.registry
    env = gym.make("FlowControl-v0")
    assert env.action_space == gym.spaces.Discrete(65)
    obs, info = env.reset(seed=1)
    assert set(obs) == {"kv_usage", "queue_len", "active", "queued_prompt_tokens", "generated_hist", "arrival_rate"}
    for k, box in env.observation_space.spaces.items():
        assert box.dtype == np.float32 and np.all(np.isfinite(box.high)) and obs[k].dtype == np.float32
    assert info["rho"] == pytest.approx(3.5 * 4060 / 16492)
    known = gym.make("FlowControl-v0", output_length_known=True)
    assert {"projected_usage", "class_queue"} <= set(known.observation_space.spaces)
    pc = gym.make("FlowControl-v0", output_length_known=True, per_class_budget=True, max_budget=8)
    assert pc.action_space == gym.spaces.MultiDiscrete([9, 9, 9])


def test_register_is_idempotent():
    import importlib

    importlib.reload(flowgym)
    assert gym.spec("FlowControl-v0").entry_point == "flowgym.envs.flow_control:FlowControlEnv"


@pytest.mark.parametrize("bad", [-1, 65, 3.0, "4", None, np.array([1, 2])])
def test_action_outside_space_raises_with_value_and_space(bad):
    env = gym.make("FlowControl-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError) as e:
        env.step(bad)
    assert "Discrete(65)" in str(e.value) and repr(bad) in str(e.value)


def test_per_class_action_outside_space():
    env = gym.make("FlowControl-v0", output_length_known=True, per_class_budget=True, max_budget=8)
    env.reset(seed=0)
    for bad in ([1, 2], [1, 2, 9], [-1, 0, 0], 3):
        with pytest.raises(ValueError, match="MultiDiscrete"):
            env.step(bad)
    env.step(np.array([4, 4, 4]))


def test_numpy_integer_actions_accepted():
    """numpy scalars and one-element arrays mean the same budget as the plain int."""
    traces = []
    for action in (3, np.int64(3), np.int32(3), np.array(3), np.array([3])):
        env = gym.make("FlowControl-v0", output_length_known=True)
        env.reset(seed=0)
        traces.append([env.step(action)[4] for _ in range(40)])
    assert all(info["admitted"] <= 3 for info in traces[0]) and sum(i["admitted"] for i in traces[0]) == 3 * 40
    for other in traces[1:]:
        assert other == traces[0]


@pytest.mark.parametrize("name", ["default", "per_class", "lognormal"])
def test_determinism_same_seed_same_rollout(name):
    env1 = gym.make("FlowControl-v0", **CONFIGS[name])
    env2 = gym.make("FlowControl-v0", **CONFIGS[name])
    rng = np.random.default_rng(5)
    actions = [env1.action_space.sample() for _ in range(300)]
    a = rollout(env1, 42, actions, 300)
    b = rollout(env2, 42, actions, 300)
    assert_same(a, b)
    c = rollout(env2, 43, actions, 300)
    assert not all(np.array_equal(x[0]["queue_len"], y[0]["queue_len"]) for x, y in zip(a, c) if isinstance(x[0], dict))
    del rng


def test_same_seed_same_arrivals_whatever_the_actions():
    env = gym.make("FlowControl-v0", horizon=300)
    env.reset(seed=7)
    arr1 = [env.step(2)[4]["arrived"] for _ in range(299)]
    env.reset(seed=7)
    arr2 = [env.step(40)[4]["arrived"] for _ in range(299)]
    assert arr1 == arr2


def test_reset_without_seed_continues_the_stream():
    env = gym.make("FlowControl-v0", horizon=50)
    env.reset(seed=3)
    first = [env.step(5)[4]["arrived"] for _ in range(20)]
    env.reset()
    second = [env.step(5)[4]["arrived"] for _ in range(20)]
    assert first != second


def test_info_is_fresh_each_step():
    env = gym.make("FlowControl-v0")
    env.reset(seed=0)
    i1 = env.step(5)[4]
    i2 = env.step(5)[4]
    assert i1 is not i2
    snapshot = dict(i1)
    env.step(5)
    assert i1 == snapshot
    for key in ("completed", "evicted", "usage", "kv_usage", "queue_len", "active", "admitted", "wasted_tokens"):
        assert key in i1


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copy_mid_episode_continues_identically(how):
    env = gym.make("FlowControl-v0", output_length_known=True)
    env.reset(seed=11)
    for _ in range(150):
        env.step(20)  # greedy enough to evict sometimes
    clone = pickle.loads(pickle.dumps(env)) if how == "pickle" else copy.deepcopy(env)
    a = [env.step(int(b)) for b in range(0, 60, 3)]
    b = [clone.step(int(b)) for b in range(0, 60, 3)]
    assert_same(a, b)
    assert_same(env.unwrapped.request_log(), clone.unwrapped.request_log())


def test_spec_json_round_trip():
    kwargs = dict(CONFIGS["lognormal"], horizon=123, reward_weights={"in_system": 1.0, "wasted_tokens": 0.5})
    env = gym.make("FlowControl-v0", **kwargs)
    js = env.spec.to_json()
    spec2 = gym.envs.registration.EnvSpec.from_json(js)
    assert spec2 == env.spec
    env2 = gym.make(spec2)
    assert_same(rollout(env, 3, [4] * 50, 50), rollout(env2, 3, [4] * 50, 50))
    json.loads(js)


def test_trace_from_csv_spec_round_trip(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("t,l,o\n0,5,3\n0,4,2\n2,3,3\n")
    wl = {"kind": "trace", "path": str(p), "arrival": "t", "prompt_len": "l", "output_len": "o"}
    env = gym.make("FlowControl-v0", M=20, workload=wl, horizon=None)
    spec2 = gym.envs.registration.EnvSpec.from_json(env.spec.to_json())
    assert_same(rollout(env, 0, [1] * 30, 30), rollout(gym.make(spec2), 0, [1] * 30, 30))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec(mode):
    envs = gym.make_vec("FlowControl-v0", num_envs=8, vectorization_mode=mode, horizon=40)
    obs, info = envs.reset(seed=0)
    assert obs["kv_usage"].shape == (8, 1)
    for _ in range(45):  # crosses the horizon: autoreset
        obs, r, te, tr, info = envs.step(np.full(8, 6))
    assert r.shape == (8,) and np.all(np.isfinite(r))
    envs.close()


def _make_in_child(q):
    import gymnasium as gym

    env = gym.make("flowgym:FlowControl-v0")
    obs, _ = env.reset(seed=0)
    q.put(float(obs["queue_len"][0]))


def test_make_in_spawned_subprocess():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_make_in_child, args=(q,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    env = gym.make("FlowControl-v0")
    obs, _ = env.reset(seed=0)
    assert q.get(timeout=5) == float(obs["queue_len"][0])


def test_truncated_at_horizon_and_reward_is_littles_law():
    env = gym.make("FlowControl-v0", horizon=500, reward_weights={"in_system": 1.0, "wasted_tokens": 0.0},
                   reward_scale=1.0, workload={"kind": "poisson", "classes": [[5, 10]], "rates": 2.0}, M=2000)
    env.reset(seed=0)
    total = 0.0
    for t in range(500):
        obs, r, te, tr, info = env.step(10)
        total += r
        assert not te
        assert tr == (t == 499)
    log = env.unwrapped.request_log()
    T = 500
    fin = np.where(log["finish"] >= 0, log["finish"], T)  # unfinished requests were in the system until T
    time_in_system = (np.minimum(fin, T) - log["arrival"])[~log["rejected"]].sum()
    assert -total == pytest.approx(time_in_system)


def test_terminated_when_trace_exhausted_and_empty():
    tr = flowgym.Trace(arrival=[0, 0, 3], prompt_len=[2, 2, 2], output_len=[3, 1, 2])
    env = FlowControlEnv(M=100, workload=tr, horizon=None)
    env.reset(seed=0)
    steps = 0
    while True:
        _, _, te, trunc, _ = env.step(5)
        steps += 1
        assert not trunc
        if te:
            break
    assert steps == 5  # last request arrives at 3, runs 2 slots: finishes at 5
    assert env.request_log()["finish"].tolist() == [3, 1, 5]


def test_request_log_and_metrics():
    wl = {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 5.0}  # rho = 1.23
    env = gym.make("FlowControl-v0", horizon=400, workload=wl)
    env.reset(seed=2)
    for _ in range(400):
        env.step(40)
    log = env.unwrapped.request_log()
    assert set(log) >= {"arrival", "prompt_len", "output_len", "finish", "evictions", "rejected"}
    n = log["arrival"].size
    assert all(v.shape == (n,) for v in log.values())
    m = env.unwrapped.metrics()
    done = log["finish"] >= 0
    assert m["completed"] == done.sum()
    assert m["avg_latency"] == pytest.approx((log["finish"] - log["arrival"])[done].mean())
    assert m["p95_latency"] == pytest.approx(np.percentile((log["finish"] - log["arrival"])[done], 95))
    assert m["unfinished"] == n - done.sum() - log["rejected"].sum()
    assert m["evictions"] == log["evictions"].sum()
    assert m["token_throughput"] == pytest.approx(log["output_len"][done].sum() / 400)
    assert m["kv_usage"].shape == (400,) and m["max_kv_usage"] <= 1.0
    assert m["evictions"] > 0  # B = 40 at rho = 1.23 overflows: the check above is not vacuous


def test_unknown_lengths_hide_output_lengths():
    """With output_length_known=False the observation cannot depend on o_i."""
    base = dict(arrival=[0, 0, 1, 2, 2], prompt_len=[3, 4, 5, 2, 2])
    env_a = FlowControlEnv(M=200, workload=flowgym.Trace(output_len=[5, 6, 7, 8, 9], **base), horizon=4)
    env_b = FlowControlEnv(M=200, workload=flowgym.Trace(output_len=[50, 60, 70, 80, 90], **base), horizon=4)
    ra, rb = rollout(env_a, 0, [2] * 4, 4), rollout(env_b, 0, [2] * 4, 4)
    for x, y in zip(ra, rb):  # nothing completes within 4 slots in either, so everything matches
        assert_same(x[0], y[0])
    env_k = FlowControlEnv(M=200, workload=flowgym.Trace(output_len=[5, 6, 7, 8, 9], **base), horizon=4,
                           output_length_known=True)
    assert "projected_usage" in env_k.observation_space.spaces
    assert "projected_usage" not in env_a.observation_space.spaces


def test_projected_usage_matches_future_without_admission():
    env = FlowControlEnv(output_length_known=True, horizon=400, projection_offsets=(0, 1, 5, 20))
    obs, _ = env.reset(seed=4)
    for _ in range(100):
        obs, *_ = env.step(12)
    proj = obs["projected_usage"].astype(np.float64) * env.config.M
    usages = []
    for _ in range(21):
        _, _, _, _, info = env.step(0)
        usages.append(info["usage"])
    # without admissions (and no overflow possible as usage only falls), U_{t+h} is what was projected
    for k, h in enumerate((0, 1, 5, 20)):
        assert proj[k] == pytest.approx(usages[h], rel=1e-6)


def test_generated_hist_counts_active():
    env = FlowControlEnv(horizon=300, hist_edges=(0, 1, 10, 30))
    env.reset(seed=0)
    for _ in range(200):
        obs, *_ = env.step(9)
    hist = obs["generated_hist"]
    assert hist.sum() == obs["active"][0]
    gen = env.engine.active_generated()
    assert hist.tolist() == [
        (gen < 1).sum(), ((gen >= 1) & (gen < 10)).sum(), ((gen >= 10) & (gen < 30)).sum(), (gen >= 30).sum()
    ]


def test_render_ansi():
    env = gym.make("FlowControl-v0", render_mode="ansi")
    env.reset(seed=0)
    env.step(3)
    assert "queue=" in env.render()


def _frames(seed, steps, **kw):
    env = gym.make("FlowControl-v0", render_mode="rgb_array", **kw)
    env.reset(seed=seed)
    out = [env.render()]
    for _ in range(steps):
        env.step(12)
        out.append(env.render())
    return env, out


def test_render_rgb_array_frames():
    from flowgym.envs.rendering import FRAME_SHAPE

    env, frames = _frames(0, 60)
    assert all(f.shape == FRAME_SHAPE and f.dtype == np.uint8 for f in frames)
    assert not np.array_equal(frames[1], frames[-1])  # the picture follows the state
    _, again = _frames(0, 60)
    assert all(np.array_equal(a, b) for a, b in zip(frames, again))  # same seed, same frames
    # the KV bar (rows 57..78, x 17..583) is filled in proportion to U/M, to the pixel
    e = env.unwrapped.engine
    bar = frames[-1][60, 17:583]
    filled = int((bar != 255).any(axis=1).sum())
    assert abs(filled - round(e.held / e.M * 568)) <= 2 and 0 < filled < 566
    plain = gym.make("FlowControl-v0")
    plain.reset(seed=0)
    assert plain.render() is None  # no render mode: nothing


def test_render_hides_unknown_output_lengths():
    """With unknown lengths the frame does not depend on output lengths (it is never revealed)."""
    rows = [(0, 5, 30), (0, 8, 50), (1, 3, 40), (2, 6, 45)]
    frames = []
    for extra in (0, 7):  # the same requests, longer outputs; none finishes in 20 slots
        tr = flowgym.Trace([r[0] for r in rows], [r[1] for r in rows], [r[2] + extra for r in rows])
        _, f = _frames(0, 20, M=400, workload=tr, horizon=100)
        frames.append(f)
    assert all(np.array_equal(a, b) for a, b in zip(*frames))
    known = []
    for extra in (0, 7):
        tr = flowgym.Trace([r[0] for r in rows], [r[1] for r in rows], [r[2] + extra for r in rows])
        _, f = _frames(0, 20, M=400, workload=tr, horizon=100, output_length_known=True)
        known.append(f[-1])
    assert not np.array_equal(*known)  # with known lengths the panel shows tokens to go


@needs_matplotlib
def test_render_human_draws_a_window(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "pause", lambda s: None)
    env = gym.make("FlowControl-v0", render_mode="human")
    env.reset(seed=0)
    env.step(12)
    assert env.render() is None
    fig = plt.figure("FlowControl-v0")
    shown = fig.axes[0].images[0].get_array()
    _, frames = _frames(0, 1)
    np.testing.assert_array_equal(np.asarray(shown), frames[-1])
    env.close()
    assert not plt.fignum_exists("FlowControl-v0")


def test_render_human_without_matplotlib_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[plot\]' in the flowgym checkout"):
        gym.make("FlowControl-v0", render_mode="human")


@needs_sb3
def test_sb3_make_vec_env_out_of_the_box():
    """SB3's make_vec_env asks for render_mode='rgb_array' by default."""
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env("FlowControl-v0", n_envs=2, seed=0)
    obs = venv.reset()
    assert obs["kv_usage"].shape == (2, 1)
    venv.step(np.array([3, 3]))
    frames = venv.get_images()
    assert len(frames) == 2 and frames[0].shape == (400, 600, 3)


def test_reset_info_names_long_run_episode_and_peak_loads():
    """A non-periodic schedule: 12 requests/slot for 1000 slots, then 6 (the paper's classes, E[w] = 1353.33)."""
    wl = {"kind": "iid", "rate": {"kind": "steps", "times": [0, 1000], "rates": [12.0, 6.0]},
          "lengths": {"kind": "empirical", "pairs": [[10, 20], [10, 40], [10, 60]], "weights": [1, 1, 1]}}
    env = gym.make("FlowControl-v0", horizon=3000, workload=wl)
    _, info = env.reset(seed=0)
    ew = (410 + 1220 + 2430) / 3  # E[w], w = l o + o (o + 1) / 2
    M = 16492
    assert info["rho"] == pytest.approx(6.0 * ew / M)  # long run: the last phase
    assert info["rho_episode"] == pytest.approx((1000 * 12 + 2000 * 6) / 3000 * ew / M)
    assert info["rho_peak"] == pytest.approx(12.0 * ew / M)
    steady = gym.make("FlowControl-v0")
    _, info = steady.reset(seed=0)
    assert info["rho"] == pytest.approx(info["rho_episode"]) == pytest.approx(info["rho_peak"])


def test_view_queue_refuses_a_negative_count():
    env = FlowControlEnv(horizon=20)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        env.view().queue(-1)
    assert len(env.view().queue(0).ids) == 0


def test_reset_refuses_options_it_would_not_read():
    """The env reads no reset option and the batched vector env only ``reset_mask``: any other is refused by name
    instead of dropped."""
    import gymnasium as gym

    env = gym.make("FlowControl-v0", horizon=50)
    env.reset(seed=0, options={})  # empty: nothing dropped
    with pytest.raises(ValueError, match=r"takes no options, got \['bogus'\]"):
        env.reset(seed=0, options={"bogus": 1})
    from flowgym.envs.vector import FlowControlVectorEnv

    vec = FlowControlVectorEnv(2, horizon=50)
    with pytest.raises(ValueError, match=r"the only option is 'reset_mask', got \['bogus'\]"):
        vec.reset(seed=0, options={"bogus": 1})
    vec.reset(seed=0)


def test_actions_of_another_shape_are_refused():
    """A Discrete action is an integer, or an integer array of shape () or (1,); a Box action of the log-multiplier
    has the box's shape (a bare number for one multiplier). A (1, 1) or (1, 1, 1) array is refused, naming it."""
    from flowgym.envs.flow_control import FlowControlEnv

    env = FlowControlEnv()
    env.reset(seed=0)
    for a in (3, np.int64(3), np.array(3), np.array([3])):
        assert env.step(a)[4]["admitted"] <= 3
    for a in (np.array([[3]]), np.array([[[3]]]), np.array([3, 4])):
        with pytest.raises(ValueError, match="is not in the action space Discrete"):
            env.step(a)
    env = FlowControlEnv(action="log-multiplier", observation="load")
    env.reset(seed=0)
    for a in (0.5, 1, np.float32(0.2), np.array(0.5), np.array([0.5]), [0.5]):
        env.step(a)
    with pytest.raises(ValueError, match=r"is not in the action space Box"):
        env.step(np.array([[0.5]]))
    env = FlowControlEnv(action="log-multiplier", observation="load", multiplier_of="max")
    env.reset(seed=0)
    env.step(np.array([0.5, 0.1]))
    for a in (0.5, np.array([[0.5, 0.1]])):
        with pytest.raises(ValueError, match=r"is not in the action space Box"):
            env.step(a)


def test_a_config_after_a_json_round_trip_equals_the_original():
    """Tuple fields (multipliers, hist_edges, projection_offsets) come back from JSON as lists: the config keeps
    them as tuples, so the round-tripped config compares equal."""
    from gymnasium.envs.registration import EnvSpec

    env = gym.make("FlowControl-v0", hist_edges=(0, 4, 64), projection_offsets=(0, 3), action="multiplier",
                   multipliers=(0.5, 2.0))
    again = gym.make(EnvSpec.from_json(env.spec.to_json()))
    assert again.unwrapped.config == env.unwrapped.config
    assert again.unwrapped.config.hist_edges == (0, 4, 64)


def test_a_refused_randomized_reset_leaves_no_episode_and_keeps_the_chain():
    """A reset whose draw FlowControl-v0 refuses raises, naming it; stepping afterwards is refused (the old episode
    is gone), and the next unseeded reset draws what it would have drawn had the failed reset not happened."""
    from flowgym.envs.randomized import RandomizedFlowControlEnv

    calls = {"n": 0, "bad": None}

    def sampler(rng):
        calls["n"] += 1
        m = int(rng.integers(1000, 5000))
        return {"M": -5 if calls["n"] == calls["bad"] else m, "horizon": 20}

    def run(bad):
        calls.update(n=0, bad=bad)
        env = RandomizedFlowControlEnv(sampler, observation="load")
        env.reset(seed=1)
        env.step(2)
        if bad:
            with pytest.raises(ValueError, match="the sampler drew arguments FlowControl-v0 refuses: M"):
                env.reset()
            with pytest.raises(RuntimeError, match="call reset"):
                env.step(2)
        _, info = env.reset()
        return info["config"]["M"]

    assert run(bad=3) == run(bad=None)


def test_a_randomized_env_reset_first_without_a_seed_draws_from_fresh_entropy():
    """The first reset with no seed seeds the chain from the entropy Gymnasium's reset draws: it works, and two
    environments draw different episodes (with probability 1 - 2**-63 or so)."""
    from flowgym.envs.randomized import RandomizedFlowControlEnv

    def sampler(rng):
        return {"M": int(rng.integers(1000, 10**9)), "horizon": 20}

    a, b = (RandomizedFlowControlEnv(sampler, observation="load") for _ in range(2))
    ma, mb = a.reset()[1]["config"]["M"], b.reset()[1]["config"]["M"]
    assert ma != mb
    a.step(2)
