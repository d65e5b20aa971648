"""flowgym.lab.ars (``flowgym train --algo ars``) and the numpy policy it writes (agents.learned.ArrayPolicy)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from flowgym.agents.learned import (
    ARRAYS_FILE,
    DEFAULT_MODEL,
    META_FILE,
    NORM_FILE,
    ArrayPolicy,
    LearnedBudget,
    MemoryArrayPolicy,
)
from flowgym.lab.ars import ITERATES_FILE, ARSConfig, _log_scores, train_ars
from flowgym.lab.cli import main
from flowgym.lab.distributions import RandomMix
from flowgym.envs.flow_control import FlowControlEnv
from flowgym.lab.evaluation import run_episode

TINY = dict(iterations=2, directions=2, draws=2, norm_draws=2, eval_every=1, eval_episodes=2, final_eval_seeds=0,
            progress=False)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ars") / "m")
    res = train_ars(out=out, **TINY)
    return out, res


def test_array_policy_is_tanh_of_its_layers_and_round_trips_through_a_vector():
    rng = np.random.default_rng(1)
    sizes = [3, 4, 1]
    theta = rng.normal(size=ArrayPolicy.n_weights(sizes))
    assert ArrayPolicy.n_weights(sizes) == 3 * 4 + 4 + 4 * 1 + 1
    p = ArrayPolicy.from_vector(theta, sizes, np.full(3, -16.0), np.full(3, 16.0))
    x = rng.normal(size=(5, 3))
    w0, b0 = theta[:12].reshape(4, 3), theta[12:16]
    w1, b1 = theta[16:20].reshape(1, 4), theta[20:21]
    want = np.tanh(np.tanh(x @ w0.T + b0) @ w1.T + b1)
    np.testing.assert_allclose(p(x), want, rtol=1e-12)
    act, state = p.predict(x)
    assert act.shape == (5, 1) and act.dtype == np.float32 and state is None
    assert np.all(np.abs(act) <= 1)
    a = p.arrays()
    assert sorted(a) == ["b0", "b1", "w0", "w1"]
    again = ArrayPolicy([(a["w0"], a["b0"]), (a["w1"], a["b1"])], np.full(3, -16.0), np.full(3, 16.0))
    np.testing.assert_array_equal(again(x), p(x))


def test_array_policy_refuses_bad_weights_by_name():
    lo, hi = np.zeros(3), np.ones(3)
    with pytest.raises(ValueError, match="layer 0 has W"):
        ArrayPolicy([(np.zeros((1, 2)), np.zeros(1))], lo, hi)
    with pytest.raises(ValueError, match="non-finite"):
        ArrayPolicy([(np.full((1, 3), np.nan), np.zeros(1))], lo, hi)
    with pytest.raises(ValueError, match="4 outputs"):
        ArrayPolicy([(np.zeros((4, 3)), np.zeros(4))], lo, hi)
    three = ArrayPolicy([(np.zeros((3, 3)), np.zeros(3))], lo, hi)  # the drain action (multiplier_of="max-drain")
    assert three.action_space.shape == (3,)
    with pytest.raises(ValueError, match="0 outputs"):
        ArrayPolicy([(np.zeros((0, 3)), np.zeros(0))], lo, hi)
    two = ArrayPolicy([(np.zeros((2, 3)), np.array([0.5, -0.5]))], lo, hi)  # the two-anchor action
    assert two.action_space.shape == (2,)
    np.testing.assert_allclose(two(np.zeros((4, 3))), np.tile(np.tanh([0.5, -0.5]), (4, 1)))
    with pytest.raises(ValueError, match="weights for layer sizes"):
        ArrayPolicy.from_vector(np.zeros(5), [3, 1], lo, hi)
    with pytest.raises(ValueError, match="at least one"):
        ArrayPolicy([], lo, hi)


def test_log_scores_are_minus_the_mean_log_over_draws_every_candidate_finished():
    v = [10.0, 100.0, math.nan,
         20.0, 50.0, 7.0]
    s = _log_scores(v, 2, 3)  # the third draw has no value for candidate 0: dropped for both
    np.testing.assert_allclose(s, [-(math.log(10) + math.log(100)) / 2, -(math.log(20) + math.log(50)) / 2])
    assert s[0] == pytest.approx(s[1], rel=1e-15)  # the same geometric mean, 31.6
    np.testing.assert_array_equal(_log_scores([math.nan, math.nan], 2, 1), [0.0, 0.0])


def test_log_scores_with_a_hinge_weigh_the_draws_lost_to_the_reference():
    v = [10.0, 100.0,
         20.0, 50.0]
    ref = [20.0, 50.0]  # candidate 0 loses the second draw by a factor 2, candidate 1 loses none
    s = _log_scores(v, 2, 2, ref, 1.5)
    np.testing.assert_allclose(s, [-(math.log(10) + math.log(100) + 1.5 * math.log(2)) / 2,
                                   -(math.log(20) + math.log(50)) / 2])
    assert s[1] > s[0]  # without the hinge a tie (the same geometric mean); with it, the one that never loses wins
    np.testing.assert_array_equal(_log_scores(v, 2, 2, ref, 0.0), _log_scores(v, 2, 2))
    # a draw the reference did not finish is left out for every candidate
    np.testing.assert_allclose(_log_scores(v, 2, 2, [math.nan, 50.0], 1.5),
                               [-(math.log(100) + 1.5 * math.log(2)), -math.log(50)])


def test_ars_with_a_hinge_runs_the_reference_on_every_draw_and_records_it(tmp_path):
    """``hinge > 0``: one reference episode per training and selection draw (counted), the setting in the
    model's meta, and a different search from the same seeds (the scores differ)."""
    out = str(tmp_path / "hinge")
    res = train_ars(out=out, hinge=2.0, **TINY)
    # 2 reference + 2 evaluation episodes first; each update 2 reference + 8 candidates + 2 evaluation
    assert res.episodes == 4 + 2 * (2 + 8 + 2)
    meta = json.load(open(os.path.join(out, META_FILE)))
    assert meta["hyperparameters"]["hinge"] == 2.0
    res0 = train_ars(out=str(tmp_path / "plain"), **TINY)
    its, its0 = (np.load(os.path.join(d, ITERATES_FILE)) for d in (out, str(tmp_path / "plain")))
    np.testing.assert_array_equal(its[0], its0[0])
    assert not np.array_equal(its[1:], its0[1:]) and res0.episodes == 2 + 2 * (8 + 2)
    LearnedBudget(out)  # loads like any model
    with open(os.path.join(out, "curves.csv")) as fh:
        first = next(csv.DictReader(fh))
    assert int(first["episodes"]) == 4  # the references are counted from row 0


def test_the_hinge_reference_runs_in_the_candidates_environment(monkeypatch):
    """The reference gets back every option the draws lose to the agent (eviction, rate_window, ...), not only
    its action's: it is the same system, served by another rule."""
    from flowgym.lab import ars
    from flowgym.lab import evaluation

    seen = {}
    real = evaluation.run_episode

    def spy(agent, env_kwargs, seed, horizon, *a, **k):
        ep = real(agent, env_kwargs, seed, horizon, *a, **k)
        seen["config"] = ep.config
        return ep

    monkeypatch.setattr(evaluation, "run_episode", spy)
    opts = {"observation": "load-v2", "action": "log-multiplier", "multipliers": [0.5, 4.0],
            "multiplier_of": "max-head", "max_budget": 64, "eviction": "all", "rate_window": 16,
            "output_length_known": True}
    monkeypatch.setattr(ars, "_SPEC", {"env_options": opts})
    kw = {"M": 6000, "workload": RandomMix(horizon=200)(np.random.default_rng(3))["workload"], "horizon": 200}
    t = ars._reference_episode((3, kw))
    cfg = seen["config"]
    assert (cfg.eviction, cfg.rate_window, cfg.output_length_known, cfg.max_budget) == ("all", 16, True, 64)
    assert cfg.multiplier_of == "max-head" and math.isfinite(t)


def test_an_evaluation_with_no_draw_the_reference_finished_is_never_kept():
    """``_log_scores`` leaves out the draws the reference did not finish; with none left the score is 0, which
    the search's evaluation must not read as a geometric mean of 1 (it returns inf there: tested through the
    mask, as an evaluation cannot be made to lose its reference cheaply)."""
    np.testing.assert_array_equal(_log_scores([30.0, 40.0], 1, 2, [math.nan, math.nan], 2.0), [0.0])
    from flowgym.lab.ars import _scored_draws

    assert not _scored_draws(np.array([[30.0, 40.0]]), [math.nan, math.nan], 2.0).any()  # evaluate() returns inf
    np.testing.assert_array_equal(_scored_draws(np.array([[30.0, 40.0]]), [math.nan, 20.0], 2.0), [False, True])
    np.testing.assert_array_equal(_scored_draws(np.array([[30.0, 40.0]]), [math.nan, math.nan], 0.0), [True, True])
    with pytest.raises(ValueError, match="one time per draw"):
        _log_scores([30.0, 40.0], 1, 2, [20.0], 2.0)


def test_hinge_search_is_the_same_with_two_workers(tmp_path):
    """The reference runs in the spawned workers too (from the spec they are given): the same search."""
    a = train_ars(out=str(tmp_path / "one"), hinge=1.0, **{**TINY, "iterations": 1})
    b = train_ars(out=str(tmp_path / "two"), hinge=1.0, workers=2, **{**TINY, "iterations": 1})
    np.testing.assert_array_equal(np.load(os.path.join(a.out, ITERATES_FILE)), np.load(os.path.join(b.out, ITERATES_FILE)))
    assert a.best_eval == b.best_eval


def test_input_noise_perturbs_the_inputs_from_the_draws_own_stream():
    """``_episode`` with ``input_noise``: the same draw gives the same time in system (the noise comes from the
    draw's seed, so the candidates of an update share it), another than without noise; the noisy policy adds
    ``sigma`` times standard normal noise to its inputs."""
    from flowgym.lab import ars

    sizes = [20, 2]
    probe = FlowControlEnv(observation="load-v2", action="log-multiplier", multiplier_of="max-head",
                           multipliers=[0.5, 4.0], max_budget=256)
    lo, hi = probe.observation_space.low, probe.observation_space.high
    p = ars._NoisyInputs.from_vector(np.ones(ArrayPolicy.n_weights(sizes)) * 0.1, sizes, lo, hi)
    x = np.zeros((3, 20))
    np.testing.assert_array_equal(p(x), ArrayPolicy.from_vector(np.ones(42) * 0.1, sizes, lo, hi)(x))  # sigma 0
    p.sigma, p.rng = 0.5, np.random.default_rng([7, ars._NOISE_STREAM])
    noise = np.random.default_rng([7, ars._NOISE_STREAM]).normal(0.0, 0.5, x.shape)
    np.testing.assert_allclose(p(x), np.tanh((x + noise) @ np.full((2, 20), 0.1).T + 0.1), rtol=1e-12)
    spec = {"sizes": sizes, "obs_low": lo, "obs_high": hi, "action_repeat": 8,
            "env_options": {"observation": "load-v2", "action": "log-multiplier", "multipliers": [0.5, 4.0],
                            "multiplier_of": "max-head", "max_budget": 256}}
    ars._init_worker(spec)
    theta = np.random.default_rng(0).normal(0.0, 0.3, 42)
    kw = RandomMix(horizon=600)(np.random.default_rng(11))
    kw["horizon"] = 600
    plain = ars._episode((theta, None, 11, kw))
    assert ars._episode((theta, None, 11, kw, 0.0)) == plain
    noisy = ars._episode((theta, None, 11, kw, 1.0))
    assert ars._episode((theta, None, 11, kw, 1.0)) == noisy != plain


def test_ars_with_input_noise_trains_with_it_and_selects_without_it(tmp_path):
    """The first selection evaluation (update 0, before any noisy episode) is the plain search's; the updates
    differ; the setting is in the model's meta, and ``flowgym train --input-noise`` passes it."""
    out, plain = str(tmp_path / "noisy"), str(tmp_path / "plain")
    train_ars(out=out, input_noise=1.0, **TINY)
    train_ars(out=plain, **TINY)
    rows, rows0 = (list(csv.DictReader(open(os.path.join(d, "curves.csv")))) for d in (out, plain))
    assert rows[0]["eval_geo_time_in_system"] == rows0[0]["eval_geo_time_in_system"]
    its, its0 = (np.load(os.path.join(d, ITERATES_FILE)) for d in (out, plain))
    assert not np.array_equal(its[1], its0[1])
    assert json.load(open(os.path.join(out, META_FILE)))["hyperparameters"]["input_noise"] == 1.0
    for bad in (-0.1, True, math.nan, 1e3, "1"):
        with pytest.raises(ValueError, match="input_noise must be a number in"):
            ARSConfig(input_noise=bad).validate()
    cli_out = str(tmp_path / "cli")
    assert main(["train", "--quiet", "--input-noise", "0.5", "--iterations", "1", "--directions", "1", "--draws", "1",
                 "--eval-every", "1", "--eval-episodes", "1", "--norm-draws", "1", "--final-eval-seeds", "0",
                 "--workers", "1", "--no-plots", "--out", cli_out]) == 0
    assert json.load(open(os.path.join(cli_out, META_FILE)))["hyperparameters"]["input_noise"] == 0.5


def test_ars_writes_a_model_the_learned_agent_loads(tiny_model):
    out, res = tiny_model
    for f in (ARRAYS_FILE, NORM_FILE, META_FILE, "curves.csv"):
        assert os.path.exists(os.path.join(out, f)), f
    meta = json.load(open(os.path.join(out, META_FILE)))
    assert meta["algo"] == "ars" and meta["action"] == "log-multiplier" and meta["layer_sizes"] == [20, 2]
    assert meta["agent_env_options"]["multiplier_of"] == "max-head"  # the default: two anchors, two outputs
    assert meta["agent_env_options"]["observation"] == "load-v2"  # the default: 20 load features
    assert meta["best_iteration"] == res.best_iteration and res.episodes == meta["episodes"]
    assert meta["unscored_draws"] == 0  # every training draw finished a request under every candidate
    # 2 evaluation episodes before the updates, 2 updates of 2 x 2 candidates x 2 draws, each followed by 2
    assert res.episodes == 2 + 2 * (8 + 2)
    agent = LearnedBudget(out)
    assert agent.continuous and agent.action_repeat == 8 and agent.requires["action"] == "log-multiplier"
    with np.load(os.path.join(out, NORM_FILE)) as z:
        assert z["obs_mean"].shape == (20,) and np.all(z["obs_var"] >= 0)


def test_ars_records_every_iterate_and_keeps_the_best_evaluated_one(tiny_model):
    """``iterates.npy``: the start (zero weights) and the weights after each update; the saved policy is
    the row of the kept update, bit for bit."""
    out, res = tiny_model
    its = np.load(os.path.join(out, ITERATES_FILE))
    assert its.shape == (res.iterations + 1, ArrayPolicy.n_weights([20, 2]))
    np.testing.assert_array_equal(its[0], 0.0)
    assert np.all(np.linalg.norm(np.diff(its, axis=0), axis=1) > 0)  # every update moved the weights
    with np.load(os.path.join(out, NORM_FILE)) as z:
        kept = ArrayPolicy.from_vector(its[res.best_iteration], [20, 2], z["obs_low"], z["obs_high"]).arrays()
    with np.load(os.path.join(out, ARRAYS_FILE)) as z:
        assert sorted(z.files) == sorted(kept) and all(np.array_equal(z[k], kept[k]) for k in kept)


def test_ars_trains_the_drain_action_and_the_agent_plays_it(tmp_path):
    """``multiplier_of="max-drain"``: three outputs, saved and loaded; the agent asks for that action and
    plays what the in-memory candidate played."""
    out = str(tmp_path / "drain")
    train_ars(out=out, multiplier_of="max-drain", **TINY)
    meta = json.load(open(os.path.join(out, META_FILE)))
    assert meta["layer_sizes"] == [20, 3] and meta["agent_env_options"]["multiplier_of"] == "max-drain"
    assert meta["action_space"] == {"kind": "box", "low": [-1.0] * 3, "high": [1.0] * 3}
    agent = LearnedBudget(out)
    assert agent.model.action_space.shape == (3,) and agent.requires["multiplier_of"] == "max-drain"
    kw = {"M": 6000, "workload": RandomMix(horizon=300)(np.random.default_rng(5))["workload"], "horizon": 300}
    e1 = run_episode(agent, kw, seed=5, horizon=300)
    again = LearnedBudget.from_policy(agent.model, agent._norm, agent.requires, agent.action_repeat)
    e2 = run_episode(again, kw, seed=5, horizon=300)
    np.testing.assert_array_equal(e1.series["admitted"], e2.series["admitted"])
    assert e1.series["admitted"].sum() > 0


def _selection_score(agent):
    """The geometric mean time in system of ``agent`` on the selection draws of :data:`TINY`'s search."""
    cfg = ARSConfig(**TINY)
    tis = []
    for j in range(cfg.eval_episodes):
        kw = RandomMix()(np.random.default_rng(cfg.eval_seed + j))
        tis.append(run_episode(agent, kw, cfg.eval_seed + j, kw.get("horizon")).metrics()["mean_time_in_system"])
    return math.exp(np.mean(np.log(tis)))


def test_the_saved_model_acts_as_the_candidate_that_was_evaluated(tiny_model):
    """The kept policy's evaluation during training is reproduced by the saved model through run_episode."""
    out, res = tiny_model
    agent = LearnedBudget(out)
    assert _selection_score(agent) == pytest.approx(res.best_eval, rel=1e-12)


def test_normalization_is_what_normalize_applies_and_what_the_file_holds(tiny_model):
    """``LearnedBudget.normalization``: the saved mean, the spread ``sqrt(var + eps)`` and the clip, which
    ``normalize`` applies."""
    out, _ = tiny_model
    agent = LearnedBudget(out)
    mean, std, clip = agent.normalization
    with np.load(os.path.join(out, NORM_FILE)) as z:
        np.testing.assert_allclose(mean, z["obs_mean"])
        np.testing.assert_allclose(std, np.sqrt(z["obs_var"] + z["epsilon"]))
        assert clip == float(z["clip_obs"])
    obs = mean + std * np.linspace(-3 * clip, 3 * clip, len(mean))
    np.testing.assert_allclose(agent.normalize(obs), np.clip((obs - mean) / std, -clip, clip), rtol=1e-5)


def test_fresh_normalisation_is_the_mean_and_spread_of_the_features_under_zero_weights(tiny_model):
    """The frozen normalisation of a fresh search: the mean and variance of the observations the
    zero-weight policy sees at its decision points on the normalisation draws (seeds below ``seed``)."""
    from flowgym.lab import ars

    out, _ = tiny_model
    meta = json.load(open(os.path.join(out, META_FILE)))
    with np.load(os.path.join(out, NORM_FILE)) as z:
        saved = {k: z[k] for k in z.files}
    ars._init_worker({"sizes": meta["layer_sizes"], "obs_low": saved["obs_low"], "obs_high": saved["obs_high"],
                      "env_options": meta["agent_env_options"], "action_repeat": meta["action_repeat"]})
    lo, hi = meta["seeds"]["normalisation"]
    seen = np.concatenate([ars._observations((s, dict(RandomMix()(np.random.default_rng(s))))) for s in range(lo, hi + 1)])
    assert seen.shape[0] > 10
    np.testing.assert_allclose(saved["obs_mean"], seen.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(saved["obs_var"], seen.var(axis=0), rtol=1e-9, atol=1e-12)


def test_init_starts_the_search_at_the_earlier_model_and_a_new_drain_output_at_k_safe(tiny_model, tmp_path):
    """``init``: the search's first evaluation (before any update) is the earlier model's own score, also with
    the drain action's third output added (a copy of ``k_safe``'s row: the drain term never decides)."""
    out, res = tiny_model
    base = _selection_score(LearnedBudget(out))
    for of, seed in (("max-head", 40_000), ("max-drain", 50_000)):  # 50000: other normalisation draws
        warm = str(tmp_path / of)
        r = train_ars(out=warm, init=out, multiplier_of=of, seed=seed, **TINY)
        assert r.curves[0]["eval_geo_time_in_system"] == pytest.approx(base, rel=1e-12)
        with np.load(os.path.join(out, NORM_FILE)) as a, np.load(os.path.join(warm, NORM_FILE)) as b:
            np.testing.assert_array_equal(a["obs_mean"], b["obs_mean"])  # the normalisation is the earlier model's
        meta = json.load(open(os.path.join(warm, META_FILE)))
        assert meta["hyperparameters"]["init"] == out and meta["seeds"]["normalisation"] == f"from {out}"
    with pytest.raises(ValueError, match="sees observation='load-v2'; this search's is 'load'"):
        train_ars(out=str(tmp_path / "x"), init=out, observation="load", **TINY)
    with pytest.raises(ValueError, match=r"has layer sizes \[20, 2\]; this search's are \[20, 4, 2\]"):
        train_ars(out=str(tmp_path / "y"), init=out, hidden=(4,), **TINY)
    # the same weights under another action, rate window or decision interval would be another policy
    with pytest.raises(ValueError, match="was trained with multiplier_of='max-head'; this search's is "
                                         "multiplier_of='rate'"):
        train_ars(out=str(tmp_path / "z"), init=out, multiplier_of="rate", **TINY)
    with pytest.raises(ValueError, match=r"was trained with multipliers=\[0.5, .*\]; this search's is "
                                         r"multipliers=\[0.25, 8.0\]"):
        train_ars(out=str(tmp_path / "z"), init=out, multipliers=(0.25, 8.0), **TINY)
    with pytest.raises(ValueError, match="was trained with rate_window=32.0; this search's is rate_window=4"):
        train_ars(out=str(tmp_path / "z"), init=out, env_overrides={"rate_window": 4}, **TINY)
    with pytest.raises(ValueError, match=r"decides every 8 slots \(action_repeat\); this search's action_repeat is 2"):
        train_ars(out=str(tmp_path / "z"), init=out, action_repeat=2, **TINY)
    assert not os.path.exists(tmp_path / "z")  # refused before anything is written
    # the same options written otherwise (32 for 32.0) are the same options
    r = train_ars(out=str(tmp_path / "same"), init=out, env_overrides={"rate_window": 32}, **TINY)
    assert r.curves[0]["eval_geo_time_in_system"] == pytest.approx(base, rel=1e-12)
    with pytest.raises(ValueError, match="init must be a model directory"):
        ARSConfig(init=str(tmp_path / "missing")).validate()


def test_init_from_a_shorter_load_observation_reads_the_new_features_with_zero_weights(tiny_model, tmp_path):
    """A ``load-v2`` model starts a ``load-v3`` search: update 0 plays it exactly (zero weights on the two
    new features), its normalisation of the 20 is kept and the two new ones are normalised afresh; a
    ``load-v3`` model cannot start a ``load-v2`` search (it reads features that search lacks)."""
    out, res = tiny_model
    base = _selection_score(LearnedBudget(out))
    warm = str(tmp_path / "v3")
    r = train_ars(out=warm, init=out, observation="load-v3", **TINY)
    assert r.curves[0]["eval_geo_time_in_system"] == pytest.approx(base, rel=1e-12)
    fresh = str(tmp_path / "v3-fresh")  # a fresh load-v3 search: the same normalisation draws
    train_ars(out=fresh, observation="load-v3", **TINY)
    with np.load(os.path.join(out, NORM_FILE)) as a, np.load(os.path.join(warm, NORM_FILE)) as b, \
            np.load(os.path.join(fresh, NORM_FILE)) as c:
        np.testing.assert_array_equal(a["obs_mean"], b["obs_mean"][:20])
        np.testing.assert_array_equal(a["obs_var"], b["obs_var"][:20])
        np.testing.assert_array_equal(c["obs_mean"][20:], b["obs_mean"][20:])
        np.testing.assert_array_equal(c["obs_var"][20:], b["obs_var"][20:])
        assert b["obs_mean"].shape == (22,) and np.all(b["obs_var"][20:] > 0)
    meta = json.load(open(os.path.join(warm, META_FILE)))
    assert meta["layer_sizes"] == [22, 2] and meta["observation"] == "load-v3"
    assert meta["seeds"]["normalisation"].startswith(f"from {out}; its new inputs from [")
    agent = LearnedBudget(warm)
    assert agent.requires["observation"] == "load-v3" and agent.model.observation_space.shape == (22,)
    with pytest.raises(ValueError, match="sees observation='load-v3'; this search's is 'load-v2' \\(a model of the same"):
        train_ars(out=str(tmp_path / "back"), init=warm, observation="load-v2", **TINY)


def test_init_from_a_shorter_observation_widens_only_the_first_layer_of_a_network(tmp_path):
    """With a hidden layer (one unit: fewer than the two outputs, so a widened or lengthened wrong layer
    cannot fit) only the first layer gains the new inputs' zero columns; update 0 plays the model."""
    out = str(tmp_path / "h")
    train_ars(out=out, hidden=(1,), **TINY)
    warm = str(tmp_path / "h3")
    r = train_ars(out=warm, init=out, hidden=(1,), observation="load-v3", **TINY)
    assert r.curves[0]["eval_geo_time_in_system"] == pytest.approx(_selection_score(LearnedBudget(out)), rel=1e-12)
    with np.load(os.path.join(warm, ARRAYS_FILE)) as b:
        assert b["w0"].shape == (1, 22) and b["w1"].shape == (2, 1)


def test_search_new_inputs_moves_only_the_new_features_weights_and_the_biases(tiny_model, tmp_path):
    """``search="new-inputs"``: every iterate keeps the init model's weights on its own 20 inputs (bit for
    bit) and moves only the weights on the 5 inputs ``load-v4`` has beyond ``load-v2`` and the two output
    biases; with a hidden layer only the first layer's new columns and the last layer's biases move. It
    needs ``init`` and a longer observation than the model's."""
    out, _ = tiny_model
    warm = str(tmp_path / "v4")
    train_ars(out=warm, init=out, observation="load-v4", search="new-inputs", **TINY)
    it = np.load(os.path.join(warm, ITERATES_FILE))
    moved = np.any(it != it[0], axis=0).reshape(-1)
    w = moved[:2 * 25].reshape(2, 25)
    assert not w[:, :20].any() and w[:, 20:].all() and moved[50:].all()
    with np.load(os.path.join(out, ARRAYS_FILE)) as a, np.load(os.path.join(warm, ARRAYS_FILE)) as b:
        np.testing.assert_array_equal(a["w0"], b["w0"][:, :20])
    h = str(tmp_path / "h")
    train_ars(out=h, hidden=(1,), **TINY)
    hw = str(tmp_path / "h4")
    train_ars(out=hw, init=h, hidden=(1,), observation="load-v4", search="new-inputs", **TINY)
    it = np.load(os.path.join(hw, ITERATES_FILE))
    moved = np.any(it != it[0], axis=0)
    want = np.zeros(ArrayPolicy.n_weights([25, 1, 2]), bool)
    want[20:25] = True  # the first layer's one row: its new columns
    want[-2:] = True  # the output biases
    np.testing.assert_array_equal(moved, want)
    with pytest.raises(ValueError, match="search='new-inputs' needs init"):
        ARSConfig(search="new-inputs").validate()
    with pytest.raises(ValueError, match="search must be 'all' or 'new-inputs', got 'some'"):
        ARSConfig(search="some").validate()
    with pytest.raises(ValueError, match="there is no new input to search"):
        train_ars(out=str(tmp_path / "same"), init=out, search="new-inputs", **TINY)


def test_same_config_same_model_whatever_the_workers(tiny_model, tmp_path):
    out, _ = tiny_model
    other = str(tmp_path / "w2")
    train_ars(out=other, workers=2, **TINY)
    for f in (ARRAYS_FILE, NORM_FILE):
        with np.load(os.path.join(out, f)) as a, np.load(os.path.join(other, f)) as b:
            assert sorted(a.files) == sorted(b.files)
            for k in a.files:
                np.testing.assert_array_equal(a[k], b[k])


def test_an_ars_model_loads_and_acts_without_torch(tiny_model):
    out, _ = tiny_model
    code = ("import sys; from flowgym.agents import LearnedBudget; a = LearnedBudget(sys.argv[1]); "
            "import numpy as np; o = np.zeros(20); print(float(np.ravel(a.act(o, None))[1])); "
            "assert 'torch' not in sys.modules and 'stable_baselines3' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert -1.0 <= float(r.stdout.strip()) <= 1.0


def test_ars_trains_without_torch_and_records_only_what_it_used(tmp_path):
    """``flowgym train`` (ARS, the default) runs where torch and SB3 are not installed (here: made
    unimportable), and its ``meta.json`` names the versions of what it ran with, not torch's."""
    out = str(tmp_path / "nt")
    code = ("import sys; sys.modules['torch'] = None; sys.modules['stable_baselines3'] = None; "
            "from flowgym.lab.ars import train_ars; "
            f"train_ars(out=sys.argv[1], **{TINY!r})")
    r = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, META_FILE)) as fh:
        versions = json.load(fh)["versions"]
    assert set(versions) == {"gymnasium", "numpy", "flowgym"}


def test_a_hostile_policy_file_is_refused_by_name(tiny_model, tmp_path):
    out, _ = tiny_model
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in (NORM_FILE, META_FILE):
        (bad / f).write_bytes(open(os.path.join(out, f), "rb").read())
    np.savez(bad / ARRAYS_FILE, w0=np.array([object()], dtype=object), b0=np.zeros(1))  # needs pickle to load
    with pytest.raises(ValueError, match="policy.npz .* is not a plain array file"):
        LearnedBudget(str(bad))
    np.savez(bad / ARRAYS_FILE, w0=np.zeros((1, 5)), b0=np.zeros(1))  # wrong input width
    with pytest.raises(ValueError, match="policy.npz .*layer 0 has W"):
        LearnedBudget(str(bad))
    np.savez(bad / ARRAYS_FILE, w0=np.full((1, 20), np.inf), b0=np.zeros(1))
    with pytest.raises(ValueError, match="non-finite"):
        LearnedBudget(str(bad))


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="iterations"):
        ARSConfig(iterations=0).validate()
    with pytest.raises(ValueError, match="noise"):
        ARSConfig(noise=-1.0).validate()
    with pytest.raises(ValueError, match="hidden"):
        ARSConfig(hidden=(0,)).validate()
    for bad in (-1.0, True, math.inf, "2"):
        with pytest.raises(ValueError, match="hinge must be a non-negative number"):
            ARSConfig(hinge=bad).validate()
    with pytest.raises(ValueError, match="hinge needs a two-anchor action"):
        ARSConfig(hinge=1.0, multiplier_of="rate").validate()
    with pytest.raises(ValueError, match="env_overrides may not set 'workload'"):
        ARSConfig(env_overrides={"workload": {}}).validate()
    with pytest.raises(ValueError, match=r"env_overrides: unknown FlowControl-v0 argument\(s\) \['bogus'\]"):
        ARSConfig(env_overrides={"bogus": 1}).validate()  # before the run prints its first line or makes --out
    with pytest.raises(ValueError, match="seed must be at least norm_draws"):
        ARSConfig(seed=3).validate()
    with pytest.raises(ValueError, match=r"training seeds 20000\.\.20639 overlap the selection \(eval_seed\) seeds "
                                         r"20000\.\.20011"):
        ARSConfig(seed=20000).validate()
    with pytest.raises(ValueError, match=r"normalisation seeds 39984\.\.39999 overlap the selection"):
        ARSConfig(eval_seed=39980).validate()
    with pytest.raises(ValueError, match=r"training seeds 990\.\.1629 overlap the tuning \(tune_seeds\) seeds "):
        ARSConfig(seed=990).validate()
    with pytest.raises(ValueError, match=r"selection \(eval_seed\) seeds 0\.\.11 overlap the report"):
        ARSConfig(eval_seed=0).validate()
    ARSConfig(seed=50_000, eval_seed=100).validate()  # disjoint: fine


@pytest.fixture
def seen(monkeypatch):
    """The configuration ``flowgym train`` hands to ``train_ars`` (which then stops the command)."""
    got = {}

    def fake(cfg):
        got["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr("flowgym.lab.ars.train_ars", fake)
    return got


def test_train_cli_defaults_to_ars_without_a_scenario_and_refuses_options_of_the_other_algorithm(seen, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["train", "--quiet"])
    cfg = seen["cfg"]
    assert isinstance(cfg, ARSConfig) and cfg == ARSConfig(workers=2, progress=False)
    assert cfg.out == "runs/ars-generalist" and cfg.distribution == "random-mix"
    assert main(["train", "--learning-rate", "0.1"]) == 2
    assert "--learning-rate configure the SB3 algorithms" in capsys.readouterr().err
    assert main(["train", "--scenario", "adaptive-mix", "--iterations", "3"]) == 2
    assert "--iterations configure --algo ars, not ppo" in capsys.readouterr().err
    assert main(["train", "--scenario", "adaptive-mix", "--init", "runs/x"]) == 2
    assert "--init configure --algo ars, not ppo" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--multiplier-of", "max-drain", "--init", str(tmp_path)])
    assert seen["cfg"].init == str(tmp_path) and seen["cfg"].multiplier_of == "max-drain"


def test_selection_benchmark_compares_models_on_new_draws(tiny_model, capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "select_generalist.py"
    spec = importlib.util.spec_from_file_location("select_generalist", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out, _ = tiny_model
    assert mod.main(["shipped", out, "--draws", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 draws of RandomMix() (seeds 30000-30001)")
    assert lines[1].startswith("shipped: geometric mean") and "/ shipped 1.000 [1.000, 1.000]" in lines[1]
    want = np.exp(np.mean(np.log(mod.time_in_system(out, [30000, 30001]))))
    assert lines[2].startswith(f"{out}: geometric mean {want:.2f};")
    # the distribution before 2026-11-26 (no trace pieces, uniform phases), on which earlier models were selected
    old = '{"trace_p": 0, "phase_scale": "uniform"}'
    assert mod.main(["shipped", "--draws", "2", "--distribution", old]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("2 draws of RandomMix(trace_p=0, phase_scale='uniform') (seeds 30000-30001)")
    with pytest.raises(SystemExit):
        mod.main(["shipped", "--draws", "2", "--distribution", '{"colour": 1}'])
    assert "--distribution: random-mix has no field(s) ['colour']" in capsys.readouterr().err


def _tamper(out, tmp_path, name, **arrays):
    bad = tmp_path / name
    bad.mkdir()
    for f in (NORM_FILE, META_FILE, ARRAYS_FILE):
        (bad / f).write_bytes(open(os.path.join(out, f), "rb").read())
    for f, changes in arrays.items():
        with np.load(bad / f) as z:
            a = {k: z[k] for k in z.files}
        a.update(changes)
        for k in [k for k, v in changes.items() if v is None]:
            del a[k]
        np.savez(bad / f, **a)
    return str(bad)


@pytest.mark.parametrize("changes, match", [
    ({"obs_var": np.ones(3)}, "obs_mean and obs_var must have the observation's shape"),
    ({"obs_mean": np.full(20, np.nan)}, "obs_mean must be finite"),
    ({"obs_var": -np.ones(20)}, "obs_var finite and >= 0"),
    ({"clip_obs": np.float64(-1)}, "clip_obs one finite number > 0"),
    ({"epsilon": np.ones(2)}, "epsilon must be one finite number"),
    ({"obs_low": np.float64(0)}, "obs_low and obs_high must be vectors of one length"),
    ({"obs_low": np.zeros((1, 20)), "obs_high": np.ones((1, 20))}, "obs_low and obs_high must be vectors"),
    ({"clip_obs": np.float64(0)}, "clip_obs one finite number > 0"),
    ({"obs_mean": np.ones(20, complex)}, "holds complex128 values"),
    ({"obs_mean": None}, "has no obs_mean"),
])
def test_a_tampered_normalisation_is_refused_by_name(tiny_model, tmp_path, changes, match):
    out, _ = tiny_model
    with pytest.raises(ValueError, match=match):
        LearnedBudget(_tamper(out, tmp_path, "bad", **{NORM_FILE: changes}))


@pytest.mark.parametrize("changes", [
    {"obs_var": np.r_[0.0, np.ones(19)]},  # a feature constant on the normalisation draws: std sqrt(epsilon)
    {"epsilon": np.float64(0)},            # no epsilon (all variances > 0)
    {"clip_obs": np.float64(0.5)},         # any positive clip
])
def test_a_normalisation_at_the_edges_of_its_ranges_loads(tiny_model, tmp_path, changes):
    out, _ = tiny_model
    with np.load(os.path.join(out, NORM_FILE)) as z:
        base = {k: z[k] for k in z.files}
    if "epsilon" in changes:
        changes = {**changes, "obs_var": np.maximum(base["obs_var"], 1e-3)}
    agent = LearnedBudget(_tamper(out, tmp_path, "edge", **{NORM_FILE: changes}))
    var = changes.get("obs_var", base["obs_var"])
    eps = float(changes.get("epsilon", base["epsilon"]))
    clip = float(changes.get("clip_obs", base["clip_obs"]))
    obs = base["obs_mean"] + 3.0
    want = np.clip(3.0 / np.sqrt(var + eps), -clip, clip).astype(np.float32)
    np.testing.assert_array_equal(agent.normalize(obs), want)


def test_the_policy_acts_with_two_floats_and_decides_every_action_repeat_slots(tiny_model):
    out, _ = tiny_model
    agent = LearnedBudget(out)
    assert agent.model.action_space.shape == (2,) and list(agent.model.action_space.low) == [-1.0, -1.0]
    repeat = agent.meta["action_repeat"]
    assert repeat > 1
    agent.reset(FlowControlEnv(**{**RandomMix()(np.random.default_rng(0)), **agent.requires}).config)
    seen = []
    for _ in range(2 * repeat + 1):
        seen.append(agent.decides_next)
        agent.act(np.zeros(20), None)
    assert seen == ([True] + [False] * (repeat - 1)) * 2 + [True]


def test_a_candidate_has_the_meta_of_the_model_written_from_it(tiny_model):
    """``LearnedBudget.from_policy`` (what ARS evaluates) carries the saved model's own description."""
    out, _ = tiny_model
    saved = LearnedBudget(out)
    cand = LearnedBudget.from_policy(saved.model, saved._norm, saved.meta["agent_env_options"],
                                     saved.meta["action_repeat"])
    for key, value in cand.meta.items():
        assert saved.meta[key] == value, key
    assert cand.meta["action_n"] == 0 and cand.continuous


def test_extra_or_complex_weights_are_refused(tiny_model, tmp_path):
    out, _ = tiny_model
    with pytest.raises(ValueError, match=r"has arrays \['w5'\] that are no layer \(expected w0, b0, and "
                                         r"for a memory mem_u, mem_a, mem_b, mem_leak\)"):
        LearnedBudget(_tamper(out, tmp_path, "extra1", **{ARRAYS_FILE: {"w5": np.zeros((1, 1))}}))
    two = {"w0": np.zeros((3, 20)), "b0": np.zeros(3), "w1": np.zeros((1, 3)), "b1": np.zeros(1), "w5": np.zeros(1)}
    with pytest.raises(ValueError, match=r"has arrays \['w5'\] that are no layer \(expected w0, b0, \.\.\., w1, b1, and "):
        LearnedBudget(_tamper(out, tmp_path, "extra2", **{ARRAYS_FILE: two}))
    with pytest.raises(ValueError, match=r"policy.npz in .* holds arrays \['c'\] that it has no use for"):
        LearnedBudget(_tamper(out, tmp_path, "extra3", **{ARRAYS_FILE: {**two, "c": np.zeros(1)}}))  # no layer's name
    with pytest.raises(ValueError, match="that are no layer"):
        LearnedBudget(_tamper(out, tmp_path, "extra", **{ARRAYS_FILE: {"w5": np.zeros((1, 1))}}))
    with pytest.raises(ValueError, match="holds complex128 values"):
        LearnedBudget(_tamper(out, tmp_path, "cplx", **{ARRAYS_FILE: {"b0": np.zeros(1, complex)}}))


def test_ars_with_a_scenario_searches_on_it(seen):
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--algo", "ars", "--scenario", "adaptive-high"])
    cfg = seen["cfg"]
    assert cfg.distribution is None and cfg.scenario == "adaptive-high" and cfg.out == "runs/ars-adaptive-high"
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--algo", "ars", "--scenario", "adaptive-high", "--distribution", "random-mix"])
    assert seen["cfg"].distribution == "random-mix" and seen["cfg"].out == "runs/ars-generalist"


def test_one_anchor_search_writes_a_one_output_model_that_acts_as_its_candidate(tmp_path):
    """``multiplier_of="rate"`` (the generalist shipped before): the policy has one output (a multiplier of
    the rate), the saved model is refused if its weights give another action size, and it reproduces the
    kept candidate's evaluation. (The default, two anchors, is the tiny_model's.)"""
    out = str(tmp_path / "rate")
    res = train_ars(out=out, multiplier_of="rate", **TINY)
    meta = json.load(open(os.path.join(out, META_FILE)))
    assert meta["layer_sizes"] == [20, 1] and meta["agent_env_options"]["multiplier_of"] == "rate"
    assert meta["action_space"] == {"kind": "box", "low": [-1.0], "high": [1.0]}
    agent = LearnedBudget(out)
    assert agent.model.action_space.shape == (1,)
    assert _selection_score(agent) == pytest.approx(res.best_eval, rel=1e-12)
    two = {ARRAYS_FILE: {"w0": np.zeros((2, 20)), "b0": np.zeros(2)}}
    # refused by the recorded layer sizes first (and by the action space if those were edited to match)
    with pytest.raises(ValueError, match=r"layer_sizes=\[20, 1\], but the weights in policy.npz have layer sizes \[20, 2\]"):
        LearnedBudget(_tamper(out, tmp_path, "two", **two))
    bad = _tamper(out, tmp_path, "two-sized", **two)
    meta["layer_sizes"] = [20, 2]
    with open(os.path.join(bad, META_FILE), "w") as fh:
        json.dump(meta, fh)
    with pytest.raises(ValueError, match=r"the policy's action has shape \(2,\); .*action_space="):
        LearnedBudget(bad)


def test_a_load_search_writes_a_17_feature_model_that_acts_as_its_candidate(tmp_path):
    """``observation="load"`` (every generalist before ars9): the policy reads the 17 features, the model
    records the observation (so the learned agent builds that environment), and it reproduces the kept
    candidate's evaluation. (The default, ``"load-v2"``, is the tiny_model's.)"""
    out = str(tmp_path / "v1")
    res = train_ars(out=out, observation="load", **TINY)
    meta = json.load(open(os.path.join(out, META_FILE)))
    assert meta["layer_sizes"] == [17, 2] and meta["observation"] == "load"
    assert meta["agent_env_options"]["observation"] == "load"
    assert meta["hyperparameters"]["observation"] == "load"
    agent = LearnedBudget(out)
    assert agent.obs_shape == (17,)
    assert _selection_score(agent) == pytest.approx(res.best_eval, rel=1e-12)
    with pytest.raises(ValueError, match="observation must be 'load', 'load-v2', 'load-v3' or 'load-v4', got 'flat'"):
        ARSConfig(observation="flat").validate()


def test_train_cli_passes_the_load_observation_to_ars(seen):
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--observation", "load"])
    assert seen["cfg"] == ARSConfig(workers=2, progress=False, observation="load")
    assert ARSConfig().observation == "load-v2"


def test_a_model_whose_action_size_and_anchors_disagree_is_refused_by_name(tiny_model, tmp_path):
    """A two-float policy recorded with a one-anchor environment (or the reverse) is refused at load,
    naming the file and the field, not at the first step."""
    out, _ = tiny_model
    bad = tmp_path / "anchors"
    bad.mkdir()
    for f in (NORM_FILE, ARRAYS_FILE):
        (bad / f).write_bytes(open(os.path.join(out, f), "rb").read())
    meta = json.load(open(os.path.join(out, META_FILE)))
    meta["agent_env_options"]["multiplier_of"] = "rate"
    with open(bad / META_FILE, "w") as fh:
        json.dump(meta, fh)
    with pytest.raises(ValueError, match=r"flowgym_agent.json in .* records action_space=.* but agent_env_options "
                                         r"multiplier_of='rate', whose action has 1 float"):
        LearnedBudget(str(bad))


def test_init_shipped_tunes_the_shipped_generalist_on_a_scenario_file(tmp_path):
    """``--init shipped`` starts a search on one scenario (a file) at the shipped generalist: update 0's
    evaluation is the shipped model's own time in system on the selection seed, and the search runs from there."""
    from flowgym.agents import make_agent
    from flowgym.lab.scenarios import get_scenario

    data = get_scenario("adaptive-mix").to_dict()
    data["name"] = "my-workload"
    data["env"]["horizon"] = 300
    path = tmp_path / "my-workload.json"
    path.write_text(json.dumps(data))
    out = str(tmp_path / "tuned")
    assert main(["train", "--quiet", "--algo", "ars", "--scenario", str(path), "--init", "shipped",
                 "--iterations", "2", "--directions", "2", "--draws", "1", "--eval-every", "1",
                 "--eval-episodes", "1", "--final-eval-seeds", "0", "--out", out]) == 0
    kw = get_scenario(str(path)).tune_env_kwargs()
    shipped = run_episode(make_agent("learned"), kw, 20_000, 300).metrics()["mean_time_in_system"]
    meta = json.load(open(os.path.join(out, META_FILE)))
    rows = list(csv.DictReader(open(os.path.join(out, "curves.csv"))))
    assert float(rows[0]["eval_geo_time_in_system"]) == pytest.approx(shipped, rel=1e-12)
    iterates = np.load(os.path.join(out, ITERATES_FILE))
    with np.load(os.path.join(DEFAULT_MODEL, NORM_FILE)) as z:  # the search started at the shipped weights
        first = ArrayPolicy.from_vector(iterates[0], [20, 2], z["obs_low"], z["obs_high"]).arrays()
    with np.load(os.path.join(DEFAULT_MODEL, ARRAYS_FILE)) as z:
        assert sorted(z.files) == sorted(first) and all(np.array_equal(z[k], first[k]) for k in first)
    assert not np.array_equal(iterates[-1], iterates[0])  # and moved from them
    assert meta["hyperparameters"]["init"] == "shipped" and meta["trained_on"] == "scenario"
    assert meta["seeds"]["normalisation"] == f"from {DEFAULT_MODEL}"
    with np.load(os.path.join(out, NORM_FILE)) as a, np.load(os.path.join(DEFAULT_MODEL, NORM_FILE)) as b:
        np.testing.assert_array_equal(a["obs_mean"], b["obs_mean"])
    with pytest.raises(ValueError, match="init must be a model directory of flowgym train --algo ars or 'shipped'"):
        ARSConfig(init="shipping").validate()


def test_a_report_scenario_in_continuous_time_leaves_the_slot_draws_in_slots(monkeypatch, tmp_path):
    """With a distribution, the report scenario's arguments apply over every draw but for what a draw decides
    itself (:data:`flowgym.lab.distributions.DRAW_KEYS`): ``--scenario azure-conv`` (continuous time) once put
    every slot draw in continuous time. Its slot draws stay in slots now, and its trace pieces keep their own
    time model; the SB3 path's environments the same (where stable-baselines3 is installed)."""
    import flowgym.lab.ars as ars
    from flowgym.lab.distributions import DRAW_KEYS, RandomMix

    assert "time_model" in DRAW_KEYS
    seen: list[dict] = []

    class Stop(Exception):
        pass

    def record(self, fn, tasks):  # the normalisation episodes' (seed, arguments), then stop
        seen.extend(kw for _, kw in tasks)
        raise Stop

    monkeypatch.setattr(ars._Runner, "map", record)
    dist = RandomMix(trace_p=0.5)
    with pytest.raises(Stop):
        train_ars(out=str(tmp_path / "m"), scenario="azure-conv", distribution=dist, workers=1,
                  **{**TINY, "norm_draws": 8})
    drawn = [dist(np.random.default_rng(40_000 - 1 - j)) for j in range(8)]  # the normalisation draws' seeds
    kinds = [d.get("time_model") for d in drawn]
    assert None in kinds and "llama2-70b-tp2-a100" in kinds  # both slot draws and trace pieces among them
    assert [kw.get("time_model") for kw in seen] == kinds
    try:
        from flowgym.lab.train import make_vec_env

        # the SB3 path (flowgym train --algo ppo with a distribution): its environments too
        venv = make_vec_env({"time_model": "llama2-70b-tp2-a100", "observation": "load-v2", "action": "log-multiplier",
                             "multiplier_of": "max-head", "max_budget": 256}, 1, 0, distribution=RandomMix(trace_p=0))
    except ImportError:  # without stable-baselines3 (the CI's first run) there is no such path to check
        return
    venv.reset()
    assert venv.envs[0].unwrapped.env.config.time_model == "slot"


# --------------------------------------------------------------------------- a memory (MemoryArrayPolicy)


def _memory_policy(seed=3, n_obs=4, m=2, sizes_out=2):
    rng = np.random.default_rng(seed)
    sizes = [n_obs + m, sizes_out]
    leak = MemoryArrayPolicy.leaks(m)
    theta = rng.normal(0, 0.5, MemoryArrayPolicy.n_weights(sizes, m, n_obs))
    return MemoryArrayPolicy.from_vector(theta, sizes, -np.ones(n_obs), np.ones(n_obs), leak), theta, sizes, leak


def test_memory_policy_is_a_leaky_tanh_layer_read_with_the_features():
    """``h' = (1 - leak) h + leak tanh(U x + A h + c)`` and the network reads ``[x, h']``; the weights
    round-trip through the vector, ``predict`` carries the memory and ``episode_start`` resets a row."""
    pol, theta, sizes, leak = _memory_policy()
    np.testing.assert_allclose(MemoryArrayPolicy.leaks(4), [1 / 2, 1 / 8, 1 / 32, 1 / 128])
    assert MemoryArrayPolicy.leaks(1).tolist() == [1 / 16]
    x = np.random.default_rng(0).normal(size=(3, 4))
    h0 = np.random.default_rng(1).uniform(-1, 1, (3, 2))
    want_h = (1 - leak) * h0 + leak * np.tanh(x @ pol.mem_u.T + h0 @ pol.mem_a.T + pol.mem_b)
    (w, b), = pol.layers
    a, h = pol.step(x, h0)
    np.testing.assert_allclose(h, want_h)
    np.testing.assert_allclose(a, np.tanh(np.hstack([x, want_h]) @ w.T + b))
    back = np.concatenate([w.reshape(-1), b, pol.mem_u.reshape(-1), pol.mem_a.reshape(-1), pol.mem_b])
    np.testing.assert_array_equal(back, theta)
    # predict: None is zeros; the state comes back and goes on; a started row forgets it
    a1, s1 = pol.predict(x)
    np.testing.assert_allclose(a1, pol.step(x)[0], rtol=1e-6)
    a2, s2 = pol.predict(x, state=s1, episode_start=[False, True, False])
    np.testing.assert_allclose(s2[1], s1[1])  # row 1 started again from zeros: the same memory as the first step
    assert not np.allclose(s2[0], s1[0])
    np.testing.assert_allclose(a2[1], a1[1])
    assert not np.allclose(a2[0], a1[0])
    assert pol.recurrent and not ArrayPolicy.recurrent
    np.testing.assert_array_equal(pol(x), pol.step(x)[0])  # calling it: the actions of a first decision
    for bad_leak in ([0.5, 0.0], [0.5, 1.5], [0.5, -0.5]):
        with pytest.raises(ValueError, match=r"every mem_leak must be in \(0, 1\]"):
            MemoryArrayPolicy(pol.layers, -np.ones(4), np.ones(4), pol.mem_u, pol.mem_a, pol.mem_b, np.array(bad_leak))
    # the edges: a leak of 1 (no memory of the past beyond one decision) and a memory of one unit
    edge = MemoryArrayPolicy(pol.layers, -np.ones(4), np.ones(4), pol.mem_u, pol.mem_a, pol.mem_b, np.array([0.5, 1.0]))
    np.testing.assert_allclose(edge.step(x, h0)[1][:, 1], np.tanh(x @ pol.mem_u.T + h0 @ pol.mem_a.T + pol.mem_b)[:, 1])
    one, _, _, _ = _memory_policy(m=1)
    assert one.memory == 1 and one.step(x)[1].shape == (3, 1)
    with pytest.raises(ValueError, match=r"mem_a \(3, 3\).*expected \(m, 4\), \(m, m\)"):
        MemoryArrayPolicy(pol.layers, -np.ones(4), np.ones(4), pol.mem_u, np.zeros((3, 3)), pol.mem_b, leak)
    with pytest.raises(ValueError, match="mem_u holds a non-finite weight"):
        MemoryArrayPolicy(pol.layers, -np.ones(4), np.ones(4), pol.mem_u * np.nan, pol.mem_a, pol.mem_b, leak)
    with pytest.raises(ValueError, match=r"27 weights .*which need 28, and sizes\[0\] = 6"):
        MemoryArrayPolicy.from_vector(theta[:-1], sizes, -np.ones(4), np.ones(4), leak)


@pytest.fixture(scope="module")
def memory_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ars") / "mem")
    res = train_ars(out=out, memory=2, **TINY)
    return out, res


def test_a_memory_model_is_saved_loaded_and_carries_its_memory_through_an_episode(memory_model, tmp_path):
    """The saved model with a memory reproduces its selection score (the candidate's memory went from
    decision to decision as the loaded agent's does), records its memory, and without the memory
    (``carry_state=False``: zeros at every decision) acts otherwise."""
    out, res = memory_model
    meta = json.load(open(os.path.join(out, META_FILE)))
    assert meta["memory"] == 2 and meta["layer_sizes"] == [22, 2] and meta["hyperparameters"]["memory"] == 2
    agent = LearnedBudget(out)
    assert isinstance(agent.model, MemoryArrayPolicy) and agent.recurrent
    np.testing.assert_array_equal(agent.model.mem_leak, MemoryArrayPolicy.leaks(2))
    assert _selection_score(agent) == pytest.approx(res.best_eval, rel=1e-12)
    # weights that read the memory (the tiny search may keep update 0, whose readout of it is zero): a
    # candidate of the search and the model written from it play alike; without the memory it plays otherwise
    from flowgym.lab import ars

    rng = np.random.default_rng(5)
    theta = rng.normal(0, 0.3, MemoryArrayPolicy.n_weights(meta["layer_sizes"], 2, 20))
    spec = {"sizes": meta["layer_sizes"], "obs_low": agent.model.observation_space.low,
            "obs_high": agent.model.observation_space.high, "env_options": meta["agent_env_options"],
            "action_repeat": meta["action_repeat"], "leak": MemoryArrayPolicy.leaks(2)}
    written = ars._policy(theta, spec)
    assert np.abs(written.layers[0][0][:, 20:]).sum() > 0
    bad = _tamper(out, tmp_path, "reads-memory", **{ARRAYS_FILE: written.arrays()})
    ars._init_worker(spec)
    kw = RandomMix()(np.random.default_rng(20000))
    candidate = ars._episode((theta, agent._norm, 20000, kw))
    plays = {}
    for carry in (True, False):
        a = LearnedBudget(bad, carry_state=carry)
        plays[carry] = run_episode(a, kw, 20000, kw.get("horizon")).metrics()["mean_time_in_system"]
    assert plays[True] == pytest.approx(candidate, rel=1e-12)
    assert plays[True] != plays[False]


def test_a_memory_search_from_a_memoryless_model_starts_at_its_policy(tiny_model, tmp_path):
    """``init`` from a model without a memory: the memory's readout starts at zero, so the first evaluation
    is that model's own score; a model with a memory starts only a search with as many units."""
    out, _ = tiny_model
    base = train_ars(out=str(tmp_path / "same"), **{**TINY, "iterations": 1}, init=out)
    mem = train_ars(out=str(tmp_path / "mem"), **{**TINY, "iterations": 1}, init=out, memory=3)
    assert mem.curves[0]["eval_geo_time_in_system"] == base.curves[0]["eval_geo_time_in_system"]
    with pytest.raises(ValueError, match=r"has a memory of 3 units .* this search's memory is 2"):
        train_ars(out=str(tmp_path / "x"), **TINY, init=str(tmp_path / "mem"), memory=2)
    with pytest.raises(ValueError, match=r"has a memory of 3 units .* this search's memory is 0"):
        train_ars(out=str(tmp_path / "x"), **TINY, init=str(tmp_path / "mem"))
    again = train_ars(out=str(tmp_path / "again"), **{**TINY, "iterations": 1}, init=str(tmp_path / "mem"), memory=3)
    assert again.curves[0]["eval_geo_time_in_system"] == pytest.approx(mem.best_eval, rel=1e-12)
    with pytest.raises(ValueError, match=r"search='new-inputs': the init model .* has this search's memory and "
                                          "observation; there is no new input"):
        train_ars(out=str(tmp_path / "x"), **TINY, init=str(tmp_path / "mem"), memory=3, search="new-inputs")
    # from a memoryless model the memory is the new input: only its weights, the network's on it and the biases move
    train_ars(out=str(tmp_path / "ni"), **{**TINY, "iterations": 1}, init=out, memory=3, search="new-inputs")
    its = np.load(tmp_path / "ni" / ITERATES_FILE)
    moved = np.flatnonzero(its[1] != its[0])
    n_net = 23 * 2 + 2
    w_memory_columns = [r * 23 + c for r in range(2) for c in range(20, 23)]
    assert set(moved) <= set(w_memory_columns) | {46, 47} | set(range(n_net, len(its[0])))
    assert set(moved) & set(range(n_net, len(its[0]))) and set(moved) & set(w_memory_columns)


def test_memory_config_and_files_are_checked_by_name(memory_model, tmp_path):
    out, _ = memory_model
    with pytest.raises(ValueError, match="memory must be a non-negative integer, got -1"):
        ARSConfig(memory=-1).validate()
    with pytest.raises(ValueError, match="input_noise is not implemented for a policy with a memory"):
        ARSConfig(memory=2, input_noise=0.5).validate()
    with pytest.raises(ValueError, match=r"policy.npz in .* has \['mem_u', 'mem_a', 'mem_b'\] but not \['mem_leak'\]"):
        LearnedBudget(_tamper(out, tmp_path, "partial", **{ARRAYS_FILE: {"mem_leak": None}}))
    with pytest.raises(ValueError, match=r"policy.npz in .*: MemoryArrayPolicy: every mem_leak must be in \(0, 1\]"):
        LearnedBudget(_tamper(out, tmp_path, "leak", **{ARRAYS_FILE: {"mem_leak": np.array([0.5, 2.0])}}))
    with pytest.raises(ValueError, match=r"mem_u \(2, 19\)"):
        LearnedBudget(_tamper(out, tmp_path, "short", **{ARRAYS_FILE: {"mem_u": np.zeros((2, 19))}}))
    with pytest.raises(ValueError, match=r"holds arrays \['mem_x'\] that it has no use for"):
        LearnedBudget(_tamper(out, tmp_path, "other", **{ARRAYS_FILE: {"mem_x": np.zeros(2)}}))
    bad = _tamper(out, tmp_path, "meta", **{})
    meta = json.load(open(os.path.join(bad, META_FILE)))
    for wrong in (3, 2.0, True, "2"):
        meta["memory"] = wrong
        json.dump(meta, open(os.path.join(bad, META_FILE), "w"))
        with pytest.raises(ValueError, match=rf"records memory={wrong!r}, but the weights in policy.npz have a "
                                             "memory of 2 units"):
            LearnedBudget(bad)


def test_train_cli_passes_the_memory_to_ars(seen):
    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--memory", "4"])
    assert seen["cfg"].memory == 4


def test_the_final_table_reports_at_compares_horizons_and_tuning_horizon(tiny_model, tmp_path, monkeypatch):
    """``final_evaluation`` (the table ``flowgym train`` ends with) reports at the horizons ``flowgym compare`` reports
    at and tunes at its default tuning horizon (the scenario's ``tune_horizon``), not at ``env.horizon`` only."""
    import flowgym.lab.evaluation as evaluation
    from flowgym.lab.train import final_evaluation

    seen = []
    real = evaluation.tune
    monkeypatch.setattr(evaluation, "tune", lambda spec, kw, seeds, h, **k: seen.append(h) or real(spec, kw, seeds, h, **k))
    (tmp_path / "s.toml").write_text(
        'name = "s"\ndescription = "x"\nhorizons = [60, 120]\ntune_horizon = 40\n[env]\nM = 3000\nhorizon = 120\n'
        '[env.workload]\nkind = "poisson"\nclasses = [[10, 20]]\nrates = 0.5\n'
        '[[agents]]\nname = "flow-control"\nparams = {b = 4}\ntune = {param = "b", grid = [2, 4]}\n')
    table = final_evaluation(tiny_model[0], scenario=str(tmp_path / "s.toml"), seeds=[900], tune_seeds=[1000],
                             write=False)
    assert table.horizons == [60, 120] and seen == [40]


def test_random_mix_background_is_a_fraction_of_the_streams_own_rate():
    from flowgym.lab.distributions import make_distribution

    with pytest.raises(ValueError, match=r"background_range must end at 1 or less .* got \(50, 60\)"):
        make_distribution({"kind": "random-mix", "background_range": [50, 60]})
    make_distribution({"kind": "random-mix", "background_range": [0.5, 1.0]})


def test_each_update_climbs_the_score(tmp_path, monkeypatch):
    """The update moves the weights toward the better of each antithetic pair: on a made-up episode whose time in
    system is exp(|theta - t|^2) (t = 0.3 everywhere; the same on every draw), each step is
    ``sum_i (delta_i . (t - theta)) delta_i`` up to a positive factor, so it points downhill (a positive product with
    ``t - theta``) whatever the directions drawn; and the run records its wall time and the decisions its episodes
    took."""
    import flowgym.lab.ars as ars

    seen = []

    def episode(task):  # (weights, normalisation, seed, draw[, input noise]) -> a time in system
        if len(task) == 5:  # a training episode (a selection one has no input noise)
            seen.append(task[2])
        return float(math.exp(((np.asarray(task[0]) - 0.3) ** 2).sum()))

    monkeypatch.setattr(ars, "_episode", episode)
    cfg = ARSConfig(out=str(tmp_path / "m"), iterations=6, draws=2, directions=2, norm_draws=1, eval_episodes=1,
                    final_eval_seeds=0, workers=1, progress=False,
                    distribution={"kind": "random-mix", "trace_p": 0, "horizon": 80})
    train_ars(cfg)
    it = np.load(tmp_path / "m" / ITERATES_FILE)
    assert len(it) == 7
    assert all(float((it[k + 1] - it[k]) @ (0.3 - it[k])) > 0 for k in range(6))  # every update a step downhill
    assert sorted(set(seen)) == list(range(40000, 40012))  # update u's draws are seeds 40000 + 2 (u - 1) + j
    meta = json.load(open(tmp_path / "m" / "flowgym_agent.json"))
    assert meta["decisions"] == 6 * 2 * (2 * 2) * 80 // 8  # updates x draws x candidates x horizon / action repeat
    assert 0 <= meta["wall_seconds"] < 3600
