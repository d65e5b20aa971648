"""The batched vector environment (flowgym.envs.vector) and its SB3 adapter (flowgym.envs.sb3).

The reference is Gymnasium's own ``SyncVectorEnv`` over single FlowControl-v0
environments (``gym.make_vec(..., vectorization_mode="sync")``): for the same
seeds and actions the batched environment must return the same observations,
rewards, terminations, truncations and infos (values, dtypes and masks), and
the same per-request logs.
"""

from __future__ import annotations

import copy
import pickle
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowgym  # noqa: F401  (registers FlowControl-v0)
from flowgym.sim._seeding import reseed, seed_words
from flowgym.sim.batched import BatchedEngine
from flowgym.envs.vector import FlowControlSyncVectorEnv, FlowControlVectorEnv, make_vector_env

PAPER = [[10, 20], [10, 40], [10, 60]]
LOGNORMAL = {"kind": "lognormal", "prompt_median": 20, "prompt_sigma": 1.0, "output_median": 30,
             "output_sigma": 1.0, "max_prompt": 200, "max_output": 700}

#: Configurations the batched engine runs, chosen to exercise evictions (small M),
#: autoresets (short horizons, crossing workload chunks of 256 slots), known lengths
#: (projected usage, class queues), both observation kinds and both eviction rules.
BATCHED = {
    "default": {"horizon": 60},
    "evictions-lifo": {"horizon": 37, "M": 600, "workload": {"kind": "poisson", "classes": PAPER, "rates": 2.0}},
    "evictions-all": {"horizon": 37, "M": 1500, "eviction": "all",
                      "workload": {"kind": "poisson", "classes": PAPER, "rates": 0.5}},
    "known": {"horizon": 45, "M": 800, "output_length_known": True,
              "workload": {"kind": "poisson", "classes": PAPER, "rates": 2.0}},
    "known-flat-long": {"horizon": 280, "M": 1500, "output_length_known": True, "observation": "flat",
                        "workload": {"kind": "poisson", "classes": PAPER, "rates": [1.0, 2.0, 0.5]}},
    "lognormal-known": {"horizon": 290, "M": 2000, "output_length_known": True, "observation": "flat",
                        "workload": {"kind": "iid", "rate": 1.0, "lengths": LOGNORMAL}},
    "lognormal-unknown": {"horizon": 70, "M": 1200, "eviction": "all",
                          "workload": {"kind": "iid", "rate": 1.5, "lengths": LOGNORMAL}},
    "sinusoid-rate": {"horizon": 120, "M": 900, "workload": {
        "kind": "iid", "rate": {"kind": "sinusoid", "mean": 1.5, "amplitude": 1.2, "period": 40},
        "lengths": LOGNORMAL | {"max_output": 300}}},
    "empirical": {"horizon": 50, "M": 400, "workload": {"kind": "iid", "rate": 2.0, "lengths": {
        "kind": "empirical", "pairs": [[5, 3], [30, 90], [12, 40]], "weights": [0.5, 0.2, 0.3]}}},
    "weights-and-features": {"horizon": 40, "M": 700, "output_length_known": True,
                             "reward_weights": {"in_system": 0.5, "wasted_tokens": 2.0, "evictions": 1.0,
                                                "completed": 0.25},
                             "reward_scale": 7.0, "hist_edges": [0, 3, 50], "projection_offsets": [0, 5, 100],
                             "rate_window": 4.0, "queue_cap": 20, "queue_token_cap": 0.5,
                             "workload": {"kind": "poisson", "classes": PAPER, "rates": 2.0}},
    # a zero rate (draws nothing) and a rate just below 10 (the compiled sampler's limit)
    "zero-and-high-rates": {"horizon": 280, "M": 2500, "workload": {"kind": "poisson", "classes": PAPER,
                                                                     "rates": [0.0, 9.99, 0.4]}},
    # a rate of 10 or more: numpy's Poisson switches algorithm, the compiled sampler is not used
    "rate-above-10": {"horizon": 40, "M": 4000, "max_budget": 40,
                      "workload": {"kind": "poisson", "classes": PAPER, "rates": [12.0, 0.0, 1.0]}},
}

#: Configurations outside the batched engine: make_vec falls back, naming the argument.
FALLBACK = {
    "queue_order": {"output_length_known": True, "queue_order": "sjf"},
    "eviction": {"eviction": "estimate"},
    "per_class_budget": {"output_length_known": True, "per_class_budget": True, "max_budget": 8},
    "time_model": {"time_model": "llama2-70b-tp2-a100",
                   "workload": {"kind": "iid", "rate": 2.0, "timed": True, "lengths": LOGNORMAL}},
    "workload": {"horizon": None,
                 "workload": {"kind": "trace", "arrival": [0, 0, 1, 3], "prompt_len": [5, 6, 7, 8],
                              "output_len": [4, 3, 2, 1]}},
    "M": {"M": 500, "workload": {"kind": "iid", "rate": 1.0, "lengths": LOGNORMAL}},
}


# --------------------------------------------------------------------------- helpers


def assert_same(a, b, where: str = "") -> None:
    """Equal values, shapes and dtypes, recursively through dicts."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
        return
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
        return
    x, y = np.asarray(a), np.asarray(b)
    assert x.shape == y.shape, (where, x.shape, y.shape)
    assert x.dtype == y.dtype, (where, x.dtype, y.dtype)
    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (where, x, y)


def make_pair(num_envs: int, **kwargs):
    batched = gym.make_vec("FlowControl-v0", num_envs=num_envs, **kwargs)
    sync = gym.make_vec("FlowControl-v0", num_envs=num_envs, vectorization_mode="sync", **kwargs)
    return batched, sync


def assert_logs_equal(batched, sync, where: str = "") -> None:
    for i in range(batched.num_envs):
        assert_same(batched.request_log(i), sync.envs[i].unwrapped.request_log(), f"{where} log[{i}]")


def run_equivalence(kwargs: dict, *, num_envs: int = 4, steps: int = 300, seed: int = 3, action_seed: int = 0,
                    stagger: dict[int, np.ndarray] | None = None, max_action: int | None = None) -> dict:
    """Step both vector envs with the same random budgets; assert every output equal. Returns counts."""
    batched, sync = make_pair(num_envs, **kwargs)
    assert batched.backend == "batched", batched.fallback_reason
    assert_same(batched.reset(seed=seed), sync.reset(seed=seed), "reset")
    rng = np.random.default_rng(action_seed)
    hi = (max_action if max_action is not None else batched.single_action_space.n - 1) + 1
    seen = {"evicted": 0, "autoresets": 0, "completed": 0}
    for t in range(steps):
        if stagger and t in stagger:
            mask = stagger[t]
            assert_same(batched.reset(options={"reset_mask": mask.copy()}),
                        sync.reset(options={"reset_mask": mask.copy()}), f"t={t} masked reset")
        a = rng.integers(0, hi, num_envs)
        out_b, out_s = batched.step(a), sync.step(a)
        for name, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), out_b, out_s):
            assert_same(x, y, f"t={t} {name}")
        info = out_b[4]
        seen["evicted"] += int(info.get("evicted", np.zeros(1))[info.get("_evicted", np.zeros(1, bool))].sum())
        seen["completed"] += int(info.get("completed", np.zeros(1))[info.get("_completed", np.zeros(1, bool))].sum())
        seen["autoresets"] += int(info.get("_rho", np.zeros(1, bool)).sum())
        if t % 97 == 0:
            assert_logs_equal(batched, sync, f"t={t}")
    assert_logs_equal(batched, sync, "end")
    return seen


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("name", sorted(BATCHED))
def test_batched_equals_single_envs(name):
    seen = run_equivalence(BATCHED[name])
    assert seen["completed"] > 0
    assert seen["autoresets"] > 0  # every config crosses at least one autoreset


@pytest.mark.parametrize("name", ["evictions-lifo", "evictions-all", "lognormal-unknown", "empirical"])
def test_equivalence_covers_evictions(name):
    assert run_equivalence(BATCHED[name], steps=120)["evicted"] > 0


def test_staggered_resets_equal_single_envs():
    N = 5
    stagger = {10: np.array([True, False, False, True, False]), 33: np.array([False, True, False, False, False]),
               34: np.array([False, False, True, False, False])}
    seen = run_equivalence(BATCHED["evictions-lifo"], num_envs=N, steps=200, stagger=stagger)
    assert seen["autoresets"] > N  # autoresets at different slots in different environments


def test_one_environment_and_large_budgets():
    run_equivalence({"horizon": 25, "M": 900, "max_budget": 500,
                     "workload": {"kind": "poisson", "classes": PAPER, "rates": 3.0}}, num_envs=1, steps=80)


def test_long_episode_crosses_workload_chunks_and_grows_buffers():
    # 600 slots > two workload chunks; a large active set and long queues grow every buffer
    run_equivalence({"horizon": 600, "M": 30000, "workload": {"kind": "poisson", "classes": PAPER, "rates": 5.0}},
                    num_envs=3, steps=650, max_action=64)


def test_evict_all_of_large_active_sets_in_several_environments_at_once():
    # eviction "all" with a few hundred short requests active per environment (every eviction empties
    # sets of different sizes, often more than twice the evicted-request stack's first 64 entries)
    seen = run_equivalence({"horizon": 400, "M": 3000, "eviction": "all", "max_budget": 64,
                            "workload": {"kind": "poisson", "classes": [[1, 20], [2, 30]], "rates": [9.0, 6.0]}},
                           num_envs=4, steps=400, max_action=64)
    assert seen["evicted"] > 1000


def test_active_arrays_grow_for_the_largest_environment():
    # two environments, the second reset at slot 120: the first holds over 512 active requests
    # (long outputs, a large cache) while the second holds few; the active arrays must grow for
    # the first
    stagger = {120: np.array([False, True])}
    run_equivalence({"horizon": 400, "M": 200000, "max_budget": 64,
                     "workload": {"kind": "poisson", "classes": [[1, 300]], "rates": 8.0}},
                    num_envs=2, steps=260, max_action=64, stagger=stagger)


def test_one_environment_crosses_workload_chunks_on_the_compiled_sampler():
    # one environment draws each chunk alone (BatchedEngine._generate_fast), holding over the
    # uniforms a chunk did not use for the next one: three chunks must equal the single engine's
    run_equivalence({"horizon": 700, "M": 20000, "workload": {"kind": "poisson", "classes": PAPER, "rates": 2.0}},
                    num_envs=1, steps=700, max_action=32)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_envs=st.integers(1, 6),
    M=st.integers(100, 3000),
    rate=st.floats(0.2, 4.0),
    horizon=st.integers(1, 80),
    known=st.booleans(),
    evict_all=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    max_action=st.integers(0, 64),
)
def test_equivalence_property(num_envs, M, rate, horizon, known, evict_all, seed, max_action):
    kwargs = {"horizon": horizon, "M": M, "output_length_known": known, "eviction": "all" if evict_all else "lifo",
              "workload": {"kind": "poisson", "classes": [[10, 20], [10, 40], [5, 85]], "rates": rate / 3}}
    run_equivalence(kwargs, num_envs=num_envs, steps=90, seed=seed, action_seed=seed + 1, max_action=max_action)


def test_same_seed_same_result():
    def run():
        env = gym.make_vec("FlowControl-v0", num_envs=3, **BATCHED["evictions-lifo"])
        out = [env.reset(seed=11)]
        for t in range(80):
            out.append(env.step(np.full(3, t % 13)))
        return out

    for a, b in zip(run(), run()):
        for x, y in zip(a, b):
            assert_same(x, y)


# --------------------------------------------------------------------------- fallback


@pytest.mark.parametrize("arg", sorted(FALLBACK))
def test_unsupported_configs_fall_back_naming_the_argument(arg):
    env = gym.make_vec("FlowControl-v0", num_envs=2, **FALLBACK[arg])
    assert isinstance(env, FlowControlSyncVectorEnv) and env.backend == "sync"
    assert arg in env.fallback_reason
    with pytest.raises(ValueError, match=arg):
        FlowControlVectorEnv(2, **FALLBACK[arg])


@pytest.mark.parametrize("arg", ["time_model", "queue_order"])
def test_fallback_equals_single_envs(arg):
    fb, sync = make_pair(2, **FALLBACK[arg])
    assert fb.backend == "sync"
    assert_same(fb.reset(seed=1), sync.reset(seed=1))
    for t in range(60):
        a = np.array([t % 7, 3])
        for x, y in zip(fb.step(a), sync.step(a)):
            assert_same(x, y, f"t={t}")
    for i in range(2):
        assert_same(fb.envs[i].unwrapped.request_log(), sync.envs[i].unwrapped.request_log())


def test_render_mode_and_wrapper_arguments_fall_back():
    assert make_vector_env(2, render_mode="ansi").backend == "sync"
    assert "max_episode_steps" in make_vector_env(2, max_episode_steps=5).fallback_reason


# --------------------------------------------------------------------------- Gymnasium vector API checks


@pytest.mark.parametrize("kwargs", [{}, {"observation": "flat", "output_length_known": True}])
def test_spaces(kwargs):
    env = gym.make_vec("FlowControl-v0", num_envs=4, **kwargs)
    single = gym.make("FlowControl-v0", **kwargs)
    assert isinstance(env, FlowControlVectorEnv)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert env.single_observation_space == single.observation_space
    assert env.single_action_space == single.action_space
    assert env.observation_space == batch_space(single.observation_space, 4)
    assert env.action_space == batch_space(single.action_space, 4)
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    env.action_space.seed(0)
    for _ in range(30):
        obs, r, te, tr, _ = env.step(env.action_space.sample())
        assert obs in env.observation_space
        assert r.dtype == np.float64 and r.shape == (4,)
        assert te.dtype == np.bool_ and tr.dtype == np.bool_


def test_autoreset_next_step():
    env = gym.make_vec("FlowControl-v0", num_envs=3, horizon=3)
    obs0, _ = env.reset(seed=5)
    for _ in range(2):
        _, _, te, tr, _ = env.step(np.full(3, 4))
        assert not (te.any() or tr.any())
    _, r, te, tr, info = env.step(np.full(3, 4))
    assert tr.all() and not te.any() and (r < 0).all()
    assert (info["t"] == 2).all()
    obs, r, te, tr, info = env.step(np.full(3, 64))  # ignored: this step resets
    assert (r == 0).all() and not (te.any() or tr.any())
    assert sorted(info) == ["_arrived", "_rho", "_rho_episode", "_rho_peak", "_t", "arrived", "rho", "rho_episode",
                            "rho_peak", "t"]
    assert (info["t"] == 0).all() and info["_t"].all()
    assert (obs["active"] == 0).all() and (obs["kv_usage"] == 0).all()
    # the episode after an autoreset continues each environment's generator: a fresh seeded reset differs
    assert not all(np.array_equal(obs[k], obs0[k]) for k in obs)


def test_seeding_seed_plus_i():
    N = 4
    env = gym.make_vec("FlowControl-v0", num_envs=N, horizon=50)
    obs, info = env.reset(seed=100)
    for i in range(N):
        single = gym.make("FlowControl-v0", horizon=50)
        s_obs, s_info = single.reset(seed=100 + i)
        assert_same({k: v[i] for k, v in obs.items()}, s_obs)
        assert info["arrived"][i] == s_info["arrived"]
    for _ in range(20):
        obs, *_ = env.step(np.full(N, 5))
    for i in range(N):
        single = gym.make("FlowControl-v0", horizon=50)
        single.reset(seed=100 + i)
        for _ in range(20):
            s_obs, *_ = single.step(5)
        assert_same({k: v[i] for k, v in obs.items()}, s_obs)
        assert_same(env.request_log(i), single.unwrapped.request_log())
    # a list seeds each environment; None continues
    obs_list, _ = env.reset(seed=[100 + i for i in range(N)])
    obs_int, _ = gym.make_vec("FlowControl-v0", num_envs=N, horizon=50).reset(seed=100)
    assert_same(obs_list, obs_int)


def test_bad_inputs_name_the_value():
    env = gym.make_vec("FlowControl-v0", num_envs=3, max_budget=10)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(3, np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="11"):
        env.step(np.array([0, 11, 2]))
    with pytest.raises(ValueError, match=r"-1"):
        env.step(np.array([0, -1, 2]))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        env.step(np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="0.5"):
        env.step(np.array([0.5, 1.0, 2.0]))
    with pytest.raises(ValueError, match="num_envs"):
        gym.make_vec("FlowControl-v0", num_envs=0)
    with pytest.raises(ValueError, match="num_envs"):
        FlowControlVectorEnv(-2)
    with pytest.raises(ValueError, match="2 seeds"):
        env.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": np.zeros(3, bool)})
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": np.ones(2, bool)})
    with pytest.raises(ValueError, match="7"):
        env.request_log(7)
    with pytest.raises(ValueError, match="M"):
        gym.make_vec("FlowControl-v0", num_envs=2, M=-3)
    with pytest.raises(ValueError, match="bogus"):
        gym.make_vec("FlowControl-v0", num_envs=2, bogus=1)
    with pytest.raises(ValueError, match="num_envs"):
        BatchedEngine(0, 100, {"kind": "poisson", "classes": PAPER, "rates": 1.0})
    with pytest.raises(ValueError, match="eviction"):
        BatchedEngine(2, 16492, {"kind": "poisson", "classes": PAPER, "rates": 1.0}, eviction="estimate")


@pytest.mark.parametrize("mode", ["batched", "sync"])
def test_a_refused_seed_list_changes_nothing(mode):
    """Every seed of a list is checked before any environment is seeded: after a refused reset the generators go on
    as if it never was made. Numpy integers seed as ints do (as a numpy scalar does); a bool is refused by name."""
    kw = {"horizon": 20, **({} if mode == "batched" else {"eviction": "estimate"})}
    env, twin = (gym.make_vec("FlowControl-v0", num_envs=2, **kw) for _ in range(2))
    assert env.backend == twin.backend == mode
    for e in (env, twin):
        e.reset(seed=3)
    for bad, word in (([7, -1], "seed -1 of environment 1"), ([7, True], "seed True of environment 1"),
                      ([7, 1.5], "seed 1.5 of environment 1"), ([7, "8"], "seed '8' of environment 1")):
        with pytest.raises(ValueError, match=re.escape(word)):
            env.reset(seed=bad)
    assert_same(env.reset(), twin.reset())  # each generator continued, not re-seeded with 7
    for _ in range(25):
        assert_same(env.step(np.array([3, 5])), twin.step(np.array([3, 5])))
    first = env.reset(seed=[1, 2])
    for seeds in ([np.int64(1), np.int64(2)], np.array([1, 2]), np.array([1, 2], np.uint32), np.int64(1)):
        assert_same(env.reset(seed=seeds), first)


def test_batched_render_answers_as_the_sync_fallback_does():
    """Neither has a render mode: after a reset each environment renders ``None``; before, both refuse."""
    fast = gym.make_vec("FlowControl-v0", num_envs=2, horizon=5)
    slow = gym.make_vec("FlowControl-v0", num_envs=2, horizon=5, eviction="estimate")
    assert (fast.backend, slow.backend) == ("batched", "sync")
    with pytest.raises(RuntimeError, match=r"call reset\(\) before render\(\)"):
        fast.render()
    with pytest.raises(gym.error.ResetNeeded):
        slow.render()
    for env in (fast, slow):
        env.reset(seed=0)
    assert fast.render() == slow.render() == (None, None)


def test_first_masked_reset_is_refused():
    env = gym.make_vec("FlowControl-v0", num_envs=2)
    with pytest.raises(ValueError, match="first reset"):
        env.reset(options={"reset_mask": np.array([True, False])})


# --------------------------------------------------------------------------- Stable-Baselines3 adapter


def test_import_flowgym_does_not_import_sb3():
    code = "import sys, flowgym, flowgym.envs.vector; assert 'stable_baselines3' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sb3_adapter_refuses_reset_options_as_dummy_vec_env_does():
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    ours = FlowControlSB3VecEnv(2, horizon=5)
    ref = DummyVecEnv([lambda: gym.make("FlowControl-v0", horizon=5) for _ in range(2)])
    for venv in (ours, ref):
        venv.set_options({"foo": 1})
        with pytest.raises(ValueError, match=r"takes no options, got \['foo'\]"):
            venv.reset()
    ours.set_options([{}, {}])  # nothing asked: a plain reset
    assert all(len(v) == 2 for v in ours.reset().values())


@pytest.mark.parametrize("observation", ["dict", "flat"])
def test_sb3_adapter_equals_dummy_vec_env(observation):
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    kw = {**BATCHED["evictions-lifo"], "horizon": 30, "observation": observation}
    ours = FlowControlSB3VecEnv(3, **kw)
    ref = DummyVecEnv([lambda: gym.make("FlowControl-v0", **kw) for _ in range(3)])
    ours.seed(5)
    ref.seed(5)
    assert_same(ours.reset(), ref.reset())
    rng = np.random.default_rng(0)
    ends = 0
    for t in range(100):
        a = rng.integers(0, 65, 3)
        (o1, r1, d1, i1), (o2, r2, d2, i2) = ours.step(a), ref.step(a)
        assert_same(o1, o2, f"t={t} obs")
        assert_same(r1, r2, f"t={t} reward")
        assert_same(d1, d2, f"t={t} dones")
        for j in range(3):
            assert ("terminal_observation" in i1[j]) == ("terminal_observation" in i2[j])
            if "terminal_observation" in i2[j]:
                ends += 1
                assert_same(i1[j]["terminal_observation"], i2[j]["terminal_observation"])
                assert i1[j]["TimeLimit.truncated"] == i2[j]["TimeLimit.truncated"] is True
                assert i1[j]["episode"]["l"] == 30
    assert ends == 9
    assert_same(ours.env_method("request_log", indices=[1])[0], ref.env_method("request_log", indices=[1])[0])


def test_sb3_adapter_api_and_errors():
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(2, horizon=10, step_info=True)
    venv.seed(0)
    venv.reset()
    _, _, _, infos = venv.step(np.array([3, 4]))
    assert infos[0]["t"] == 0 and infos[1]["admitted"] <= 4 and "kv_usage" in infos[0]
    assert venv.get_attr("config")[0].horizon == 10
    single = gym.make("FlowControl-v0", horizon=10)  # each environment's spaces and metadata, as DummyVecEnv gives
    for name in ("observation_space", "action_space", "metadata"):
        assert venv.get_attr(name) == [getattr(single.unwrapped, name)] * 2, name
    logs = venv.get_attr("request_log")  # DummyVecEnv's bound methods: each environment's log, no argument
    assert [log()["arrival"].size for log in logs] == [venv.venv.request_log(i)["arrival"].size for i in (0, 1)]
    with pytest.raises(AttributeError, match="no per-environment 'unwrapped'"):
        venv.get_attr("unwrapped")
    assert venv.env_is_wrapped(gym.Wrapper) == [False, False]
    with pytest.raises(AttributeError, match="render"):
        venv.env_method("render")
    with pytest.raises(ValueError, match="5"):
        venv.get_attr("config", indices=[5])
    with pytest.raises(ValueError, match="65"):
        venv.step(np.array([65, 0]))
    with pytest.raises(ValueError, match="queue_order"):
        FlowControlSB3VecEnv(2, output_length_known=True, queue_order="sjf")


def test_sb3_adapter_step_before_reset_is_refused_as_the_vector_env_does():
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(2, horizon=5)
    for step in (venv.step, venv.venv.step):
        with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
            step(np.array([1, 2]))
    with pytest.raises(RuntimeError, match="step_async"):  # the refused step kept no actions
        venv.step_wait()
    venv.reset()
    assert venv.step(np.array([1, 2]))[0].keys() == venv.observation_space.spaces.keys()


@pytest.mark.parametrize("observation,policy", [("flat", "MlpPolicy"), ("dict", "MultiInputPolicy")])
def test_sb3_ppo_trains_on_the_adapter(observation, policy):
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from stable_baselines3 import PPO

    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(4, observation=observation, horizon=50)
    venv.seed(0)
    model = PPO(policy, venv, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=512)
    assert model.num_timesteps >= 512
    obs = venv.reset()
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == (4,)


# --------------------------------------------------------------------------- sampling speed-up


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=300), seed=st.integers(0, 2**32 - 1),
       ties=st.booleans())
def test_slot_shuffle_equals_lexsort(counts, seed, ties):
    from flowgym.sim.workloads import _slot_shuffle

    rel = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    u = np.random.default_rng(seed).random(rel.size)
    if ties:  # repeated values exercise the exact fallback
        u = np.floor(u * 4) / 4
    np.testing.assert_array_equal(_slot_shuffle(rel, u), np.lexsort((u, rel)))


# --------------------------------------------------------------------------- projected usage from the calendar


def _projection_by_scan(eng, offsets: np.ndarray) -> np.ndarray:
    """The definition: sum over active requests still running at t + h of l + j + h + 1."""
    if not eng.n_active:
        return np.zeros(offsets.size, np.int64)
    rem = eng.active_remaining()
    base = eng.prompt[eng.active_ids()] + eng.active_generated() + 1
    return ((base[:, None] + offsets[None, :]) * (rem[:, None] > offsets[None, :])).sum(axis=0)


@settings(max_examples=20, deadline=None)
@given(M=st.integers(200, 3000), eviction=st.sampled_from(["lifo", "all", "estimate"]),
       offsets=st.lists(st.integers(0, 400), min_size=1, max_size=6), seed=st.integers(0, 2**31 - 1))
def test_projected_demand_equals_scan(M, eviction, offsets, seed):
    env = gym.make("FlowControl-v0", M=M, eviction=eviction, output_length_known=True, horizon=150,
                   workload={"kind": "iid", "rate": 1.0, "lengths": LOGNORMAL | {"max_output": 150}})
    env.reset(seed=seed)
    env.action_space.seed(seed)
    eng, h = env.unwrapped.engine, np.asarray(offsets)
    done = False
    while not done:
        np.testing.assert_array_equal(eng.projected_demand(h), _projection_by_scan(eng, h))
        _, _, te, tr, _ = env.step(env.action_space.sample())
        done = te or tr


@settings(max_examples=200, deadline=None)
@given(seeds=st.lists(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63 - 2])),
                      min_size=1, max_size=5))
def test_reseed_gives_default_rng_of_each_seed(seeds):
    # the vector env re-seeds its workload generators in place; they must be numpy's default_rng(seed)
    words = seed_words(seeds)
    kept = reseed([s ^ 1 for s in seeds], [None] * len(seeds))  # generators that drew from other seeds first
    for g in kept:
        g.random(3)
    gens = reseed(seeds, kept)
    for s, w, g, k in zip(seeds, words, gens, kept):
        assert g is k  # re-seeded in place
        np.testing.assert_array_equal(w, np.random.SeedSequence(s).generate_state(4, np.uint64))
        ref = np.random.default_rng(s)
        assert g.bit_generator.state == ref.bit_generator.state
        np.testing.assert_array_equal(g.random(4), ref.random(4))
        assert g.integers(0, 10**6) == ref.integers(0, 10**6)
    with pytest.raises(ValueError, match="one generator"):
        reseed(seeds, kept + [None])


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("name", ["known-flat-long", "evictions-lifo"])
def test_copies_step_as_the_original(name, how):
    # a copy taken mid-episode steps as the original, past its next workload chunk and an autoreset
    kwargs = {**BATCHED[name], "horizon": 400}
    env = gym.make_vec("FlowControl-v0", num_envs=3, **kwargs)
    env.reset(seed=7)
    rng = np.random.default_rng(0)
    hi = env.single_action_space.n
    for _ in range(200):
        env.step(rng.integers(0, hi, 3))
    twin = pickle.loads(pickle.dumps(env)) if how == "pickle" else copy.deepcopy(env)
    for t in range(450):  # slot 256's chunk, the horizon at 400, the next episode
        a = rng.integers(0, hi, 3)
        for key, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), env.step(a), twin.step(a)):
            assert_same(x, y, f"t={t} {key}")
    for i in range(3):
        assert_same(env.request_log(i), twin.request_log(i), f"log[{i}]")


def test_batched_get_attr_and_call_answer_as_the_sync_fallback_does():
    """Code written for ``SyncVectorEnv`` (the fallback ``make_vec`` picks for some configurations) reads each
    environment's spaces, metadata, configuration and request logs from the batched env the same way; what has no
    batched counterpart is refused, naming the sync mode."""
    kw = {"horizon": 20, "M": 2000}
    fast = gym.make_vec("FlowControl-v0", num_envs=2, **kw)
    slow = gym.make_vec("FlowControl-v0", num_envs=2, vectorization_mode="sync", **kw)
    assert type(fast).__name__ == "FlowControlVectorEnv"
    for env in (fast, slow):
        env.reset(seed=3)
        for _ in range(12):
            env.step(np.array([4, 6]))
    for name in ("observation_space", "action_space", "metadata"):
        assert fast.get_attr(name) == slow.get_attr(name), name
    assert [c.horizon for c in fast.get_attr("config")] == [c.horizon for c in slow.get_attr("config")] == [20, 20]
    for a, b in zip(fast.call("request_log"), slow.call("request_log")):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for a, b in zip(fast.get_attr("request_log"), slow.get_attr("request_log")):  # sync calls a method: the logs
        assert all(np.array_equal(a[k], b[k]) for k in a)
    for name in ("render", "unwrapped", "engine", "load", "workload"):  # per environment in sync mode only
        with pytest.raises(AttributeError, match="vectorization_mode='sync'"):
            fast.call(name)
        with pytest.raises(AttributeError, match="vectorization_mode='sync'"):
            fast.get_attr(name)
    with pytest.raises(AttributeError, match="cannot set 'M'"):
        fast.set_attr("M", 5)


def test_a_seed_of_bytes_or_text_is_refused_not_read_as_a_list():
    """``b"ab"`` iterates as the integers 97, 98 and ``"ab"`` as letters: neither is a list of seeds."""
    env = gym.make_vec("FlowControl-v0", num_envs=2, horizon=5)
    for bad in (b"ab", "ab", 1.5, np.array(3)):
        with pytest.raises(ValueError, match="seed must be an int, None or a list of 2 seeds, got"):
            env.reset(seed=bad)
    env.close()
