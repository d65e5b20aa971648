"""Configuration of FlowControl-v0: bad arguments name their field; the three ways to configure agree."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

import flowgym
from flowgym import FlowControlConfig, FlowControlEnv

PAPER = [[10, 20], [10, 40], [10, 60]]


def _poisson(**kw):
    spec = {"kind": "poisson", "classes": [list(c) for c in PAPER], "rates": 1.0}
    spec.update(kw)
    return spec


BAD = [
    # (kwargs, regex the message must match: the field's name)
    (dict(M=0), r"\bM\b"),
    (dict(M=-5), r"\bM\b"),
    (dict(M=1.5), r"\bM\b"),
    (dict(M=True), r"\bM\b"),
    (dict(M="16492"), r"\bM\b"),
    (dict(horizon=0), "horizon"),
    (dict(horizon=-10), "horizon"),
    (dict(horizon=2.5), "horizon"),
    (dict(max_budget=0), "max_budget"),
    (dict(max_budget=-1), "max_budget"),
    (dict(queue_cap=0), "queue_cap"),
    (dict(reward_scale=0.0), "reward_scale"),
    (dict(rate_window=float("nan")), "rate_window"),
    (dict(workload=_poisson(rates=-1.0)), "rates"),
    (dict(workload=_poisson(rates=[1.0, -0.5, 1.0])), "rates"),
    (dict(workload=_poisson(rates=float("nan"))), "rates"),
    (dict(workload=_poisson(rates=[1.0, float("nan"), 1.0])), "rates"),
    (dict(workload=_poisson(rates=float("inf"))), "rates"),
    (dict(workload=_poisson(rates=[1.0, 2.0])), "rates"),
    (dict(workload=_poisson(classes=[[0, 20], [10, 40]])), "prompt_len"),
    (dict(workload=_poisson(classes=[[10, 20], [10, 0]])), "output_len"),
    (dict(workload=_poisson(classes=[[10, -20]])), "output_len"),
    (dict(workload=_poisson(classes=[])), "classes"),
    (dict(workload={"kind": "iid", "rate": -2.0, "lengths": {"kind": "empirical", "pairs": [[1, 1]]}}), "rate"),
    (dict(workload={"kind": "nonsense"}), "nonsense"),
    (dict(workload=_poisson(speed=3)), "speed"),
    (dict(eviction="fifo"), "eviction"),
    (dict(eviction="random"), "eviction"),
    (dict(observation="image"), "observation"),
    (dict(hist_edges=(1, 8, 16)), "hist_edges"),
    (dict(hist_edges=(0, 8, 8)), "hist_edges"),
    (dict(hist_edges=(0, 16, 8)), "hist_edges"),
    (dict(hist_edges=()), "hist_edges"),
    (dict(projection_offsets=(0, -1)), "projection_offsets"),
    (dict(reward_weights={"latency": 1.0}), "latency"),
    (dict(reward_weights={"in_system": 1.0, "bogus_weight": 2.0}), "bogus_weight"),
    (dict(reward_weights={"in_system": float("nan")}), "in_system"),
    (dict(flux_capacitor=1), "flux_capacitor"),
    (dict(max_budgett=8), "max_budgett"),
    (dict(per_class_budget=True, output_length_known=False), "per_class_budget"),
    # found by an independent review (2026-11-27): each was accepted, truncated or crashed without the name
    (dict(rate_window=0.5), "rate_window"),
    (dict(output_length_known="false"), "output_length_known"),
    (dict(output_length_known=True, per_class_budget="no"), "per_class_budget"),
    (dict(hist_edges=(0, 1.5, 3)), "hist_edges"),
    (dict(hist_edges=5), "hist_edges"),
    (dict(hist_edges=[0, "a"]), "hist_edges"),
    (dict(output_length_known=True, projection_offsets=(0.5, 2.7)), "projection_offsets"),
    (dict(projection_offsets=["a"]), "projection_offsets"),
    (dict(eviction=["lifo"]), "eviction"),
    (dict(queue_order=["fifo"]), "queue_order"),
    (dict(max_budget=2**63 - 1), "max_budget"),
    (dict(reward_scale=1e-320), "reward_scale"),
    (dict(queue_cap=10**40), "queue_cap"),
    (dict(projection_cap=1e39), "projection_cap"),
    (dict(action="multiplier", multipliers=(1.0, 1e308)), "multipliers"),
    # an integer too large for a float (a JSON file can hold one): OverflowError inside math.isfinite before
    (dict(rate_window=10**400), "rate_window"),
    (dict(queue_token_cap=10**400), "queue_token_cap"),
    (dict(action="multiplier", multipliers=(1.0, 10**400)), "multipliers"),
    (dict(reward_weights={"in_system": 10**400}), "in_system"),
    (dict(time_model={"kind": "linear", "c0": 10**400}), "c0"),
    (dict(reward_weights={"in_system": True}), "in_system"),
    (dict(horizon=None), "horizon"),
    (dict(horizon=None, workload=_poisson()), "horizon"),
    (
        dict(horizon=None, workload={"kind": "iid", "rate": 1.0,
                                     "lengths": {"kind": "empirical", "pairs": [[1, 1]]}}),
        "horizon",
    ),
]


def _ids():
    return [f"{i}-" + "-".join(sorted(kw)) for i, (kw, _) in enumerate(BAD)]


@pytest.mark.parametrize("bad,name", BAD, ids=_ids())
def test_bad_config_gym_make(bad, name):
    with pytest.raises(ValueError, match=name):
        gym.make("FlowControl-v0", **bad)


@pytest.mark.parametrize("bad,name", BAD, ids=_ids())
def test_bad_config_direct(bad, name):
    with pytest.raises(ValueError, match=name):
        FlowControlEnv(**bad)


@pytest.mark.parametrize("bad,name", BAD, ids=_ids())
def test_bad_config_as_mapping(bad, name):
    with pytest.raises(ValueError, match=name):
        FlowControlEnv(config=dict(bad))


def test_per_class_budget_message_names_both_fields():
    with pytest.raises(ValueError) as ei:
        FlowControlEnv(per_class_budget=True, output_length_known=False)
    assert "per_class_budget" in str(ei.value) and "output_length_known" in str(ei.value)


def test_per_class_budget_needs_classes():
    wl = {"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairs": [[1, 1]]}}
    with pytest.raises(ValueError, match="class"):
        FlowControlEnv(per_class_budget=True, output_length_known=True, workload=wl)


def test_bad_config_type():
    with pytest.raises(ValueError, match="config"):
        FlowControlEnv(config=[("M", 100)])


def test_bad_render_mode():
    with pytest.raises(ValueError, match="render_mode"):
        FlowControlEnv(render_mode="rgb")


@pytest.mark.parametrize("M", [0, -5, 1.5, True, np.float64(100.0)])
def test_engine_rejects_bad_M(M):
    with pytest.raises(ValueError, match=r"\bM\b"):
        flowgym.Engine(M, _poisson())


def test_engine_rejects_bad_eviction_and_per_class_without_classes():
    with pytest.raises(ValueError, match="eviction"):
        flowgym.Engine(100, _poisson(), eviction="mru")
    wl = {"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairs": [[1, 1]]}}
    with pytest.raises(ValueError, match="class"):
        flowgym.Engine(100, wl, per_class=True)


def test_valid_edge_values_accepted():
    env = FlowControlEnv(M=np.int64(500), horizon=1, max_budget=1, eviction="all", observation="flat",
                         hist_edges=(0,), reward_weights={}, workload=_poisson(rates=0.0))
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert env.action_space.n == 2
    horizon_none = FlowControlEnv(horizon=None, workload={"kind": "trace", "arrival": [0, 1],
                                                          "prompt_len": [1, 1], "output_len": [1, 1]})
    assert horizon_none.config.horizon is None


# --------------------------------------------------------------------------- equivalent forms

VALID = dict(
    M=8000,
    horizon=50,
    max_budget=16,
    output_length_known=True,
    per_class_budget=True,
    eviction="lifo",
    observation="dict",
    hist_edges=(0, 4, 16, 64),
    workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": [1.0, 1.5, 0.5]},
    reward_weights={"in_system": 1.0, "wasted_tokens": 0.5, "evictions": 2.0, "completed": 1.0},
)


def _equal_obs(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    else:
        np.testing.assert_array_equal(a, b)


def _rollout(env, seed, n=15):
    obs, info = env.reset(seed=seed)
    out = [(obs, None)]
    rng = np.random.default_rng(0)
    for _ in range(n):
        action = rng.integers(0, 5, size=3)
        obs, r, term, trunc, info = env.step(action)
        out.append((obs, r))
    return out


@pytest.mark.parametrize("maker", ["direct", "gym"])
def test_mapping_instance_and_kwargs_build_same_env(maker):
    def make(**kw):
        return FlowControlEnv(**kw) if maker == "direct" else gym.make("FlowControl-v0", **kw)

    import copy

    envs = [
        make(config=copy.deepcopy(VALID)),
        make(config=FlowControlConfig(**copy.deepcopy(VALID))),
        make(**copy.deepcopy(VALID)),
    ]
    base = envs[0]
    for e in envs:
        cfg = e.unwrapped.config
        assert cfg.M == 8000 and cfg.horizon == 50 and cfg.max_budget == 16
        assert cfg.per_class_budget and cfg.output_length_known
        assert e.observation_space == base.observation_space
        assert e.action_space == base.action_space
    assert isinstance(base.action_space, gym.spaces.MultiDiscrete)
    np.testing.assert_array_equal(base.action_space.nvec, [17, 17, 17])
    runs = [_rollout(e, seed=123) for e in envs]
    for run in runs[1:]:
        for (o1, r1), (o2, r2) in zip(runs[0], run):
            _equal_obs(o1, o2)
            assert r1 == r2
    # the first observation differs for another seed somewhere along the rollout (sanity of the check)
    other = _rollout(make(**copy.deepcopy(VALID)), seed=124)
    assert any(
        not np.array_equal(np.concatenate([np.ravel(v) for v in a[0].values()]),
                           np.concatenate([np.ravel(v) for v in b[0].values()]))
        for a, b in zip(runs[0], other)
    )


def test_keywords_override_config():
    env = FlowControlEnv(config=dict(VALID), M=9000, horizon=7)
    assert env.config.M == 9000 and env.config.horizon == 7
    assert env.config.max_budget == 16


def test_config_from_any_and_validate():
    cfg = FlowControlConfig.from_any(dict(VALID))
    assert isinstance(cfg, FlowControlConfig)
    again = FlowControlConfig.from_any(cfg)
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)
    bad = FlowControlConfig(M=0)
    with pytest.raises(ValueError, match=r"\bM\b"):
        bad.validate()
    FlowControlConfig().validate()  # defaults are valid


def test_default_env_builds():
    env = gym.make("FlowControl-v0")
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["rho"] == pytest.approx(3.5 * 4060 / 16492)


def test_log_multiplier_actions_the_space_contains_are_taken_as_sequences():
    for of, action in (("rate", [0.5]), ("max", (0.1, 0.2)), ("max", [0.1, -0.3])):
        env = gym.make("FlowControl-v0", action="log-multiplier", multiplier_of=of, horizon=5)
        env.reset(seed=0)
        assert env.action_space.contains(np.asarray(action, dtype=np.float32))
        info = env.step(action)[4]
        ref = gym.make("FlowControl-v0", action="log-multiplier", multiplier_of=of, horizon=5)
        ref.reset(seed=0)
        assert info == ref.step(np.asarray(action, dtype=np.float32))[4] and info["admitted"] > 0
    env = gym.make("FlowControl-v0", action="log-multiplier", horizon=5)
    env.reset(seed=0)
    for bad in ([True], ["0.5"], [0.5, 0.5], [2.0]):
        with pytest.raises(ValueError, match="is not in the action space"):
            env.step(bad)


def test_huge_multiplier_budget_is_capped_not_overflowed():
    env = gym.make("FlowControl-v0", action="multiplier", multipliers=(1.0, 1e6), max_budget=64, horizon=5)
    env.reset(seed=0)
    info = env.step(1)[4]  # 1e6 x the safe budget: capped at max_budget, not an OverflowError
    assert 0 < info["admitted"] <= 64


def test_trace_reset_loads_are_the_episode_s_own():
    tr = {"kind": "trace", "arrival": [0, 0, 1, 3], "prompt_len": [5] * 4, "output_len": [3, 4, 5, 6]}
    info = gym.make("FlowControl-v0", M=30, horizon=50, workload=tr).reset(seed=0)[1]
    work = sum(5 * o + o * (o + 1) / 2 for o in (3, 4, 5, 6))  # request_work: l * o + o (o + 1) / 2
    assert info["rho_episode"] == pytest.approx(work / (50 * 30))
    assert info["rho_peak"] is None
    info = gym.make("FlowControl-v0", M=30, horizon=2, workload=tr).reset(seed=0)[1]
    assert info["rho_episode"] == pytest.approx(sum(5 * o + o * (o + 1) / 2 for o in (3, 4, 5)) / (2 * 30))


def test_integer_lists_as_ranges_and_integer_arrays_are_still_taken():
    e = FlowControlEnv(hist_edges=np.array([0, 8, 16]), output_length_known=True, projection_offsets=np.arange(4))
    assert list(e.features.edges) == [0, 8, 16] and list(e.features.offsets) == [0, 1, 2, 3]
    assert list(FlowControlEnv(hist_edges=range(0, 40, 8)).features.edges) == [0, 8, 16, 24, 32]
    with pytest.raises(ValueError, match="hist_edges must be a non-empty list of integers"):
        FlowControlEnv(hist_edges=np.array([0.0, 8.5]))
    with pytest.raises(ValueError, match=r"M must be at most 9007199254740992 \(2\*\*53"):
        FlowControlEnv(M=2**53 + 1)
