"""Training a learned budget (flowgym.lab.train), the LearnedBudget agent, the adaptive scenarios."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

from flowgym.agents import FlowControl, LearnedBudget, make_agent
from flowgym.lab.cli import main
from flowgym.lab.evaluation import env_for, evaluate, run_episode
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS, AZURE_REPORT_WINDOW, AZURE_TRAIN_WINDOW, get_scenario
from flowgym.lab.train import TrainConfig, read_curves, require_sb3, train

from _requires import needs_sb3  # noqa: E402

TINY = dict(total_timesteps=1024, action_repeat=2, n_envs=2, n_steps=256, batch_size=128, n_epochs=2, eval_freq=512,
            eval_episodes=1, checkpoint_freq=512, final_eval_seeds=0, progress=False, plot=False,
            env_overrides={"horizon": 400})


def _actions(agent, env_kwargs, seed, horizon):
    """The actions an agent takes on one seed (through the evaluation path's environment)."""
    env = env_for(agent, env_kwargs, horizon)
    obs, _ = env.reset(seed=seed)
    agent.reset(env.config, seed=seed)
    out, done = [], False
    while not done:
        a = agent.act(obs, env.view())
        out.append(a)
        obs, _, te, tr, _ = env.step(a)
        done = te or tr
    return np.asarray(out)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny") / "model")
    res = train(TrainConfig(scenario="adaptive-switch", out=out, **TINY))
    return out, res


@needs_sb3
def test_training_writes_a_model_directory(tiny_model):
    out, res = tiny_model
    for f in ("model.zip", "vecnormalize.pkl", "flowgym_agent.json", "curves.csv", "last_model.zip"):
        assert os.path.exists(os.path.join(out, f)), f
    ckpts = os.listdir(os.path.join(out, "checkpoints"))
    assert any(c.endswith(".zip") for c in ckpts) and any(c.endswith(".pkl") for c in ckpts)
    meta = json.load(open(os.path.join(out, "flowgym_agent.json")))
    assert meta["scenario"] == "adaptive-switch" and meta["timesteps"] == res.timesteps >= 1024
    assert meta["agent_env_options"]["observation"] == "flat"
    assert meta["action_n"] == get_scenario("adaptive-switch").learned_max_budget + 1 == 17
    assert meta["hyperparameters"]["n_envs"] == 2
    rows = read_curves(os.path.join(out, "curves.csv"))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 2 and all(r["mean_time_in_system"] > 0 for r in evals)
    assert any(r["kind"] == "train" and r["mean_step_reward"] < 0 for r in rows)
    # model.zip is the evaluated policy with the lowest time in system
    assert meta["selected"] == "best"
    assert meta["best_eval_time_in_system"] == pytest.approx(min(r["mean_time_in_system"] for r in evals))


@needs_sb3
def test_reload_acts_identically_and_matches_sb3(tiny_model, tmp_path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    out, _ = tiny_model
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    sc = get_scenario("adaptive-switch")
    a1 = _actions(LearnedBudget(out), sc.env_kwargs(), 3, 600)
    a2 = _actions(LearnedBudget(copy), sc.env_kwargs(), 3, 600)
    assert np.array_equal(a1, a2)
    # the agent's frozen normalisation and argmax equal SB3's own VecNormalize + predict
    agent = LearnedBudget(out)
    import gymnasium as gym

    kw = agent.meta["env_kwargs"]
    vn = VecNormalize.load(os.path.join(out, "vecnormalize.pkl"), DummyVecEnv([lambda: gym.make("FlowControl-v0", **kw)]))
    vn.training = False
    model = PPO.load(os.path.join(out, "model.zip"), device="cpu")
    env = env_for(agent, sc.env_kwargs(), 300)
    obs, _ = env.reset(seed=5)
    agent.reset(env.config, seed=5)
    mode = LearnedBudget(out, action_rule="mode")
    mode.reset(env.config, seed=5)
    repeat = agent.action_repeat
    assert repeat == TINY["action_repeat"] == agent.meta["action_repeat"]
    assert agent.action_rule == agent.meta["action_rule"] == "mean"
    held = None
    for t in range(300):
        mine, argmax = agent.act(obs, env.view()), mode.act(obs, env.view())
        if t % repeat == 0:  # a decision: SB3's own normalisation, then argmax / expected budget
            x = vn.normalize_obs(obs[None])
            theirs, _ = model.predict(x, deterministic=True)
            assert argmax == int(theirs[0])
            probs = model.policy.get_distribution(model.policy.obs_to_tensor(x)[0]).distribution.probs
            p = probs.detach().numpy()[0].astype(np.float64)
            assert mine == int(np.rint(p @ np.arange(p.size)))
            held = mine
        else:  # held for action_repeat slots, as in training
            assert mine == held
        obs, *_ = env.step(mine)


@needs_sb3
def test_same_seed_same_model(tiny_model, tmp_path):
    out, _ = tiny_model
    again = str(tmp_path / "again")
    train(TrainConfig(scenario="adaptive-switch", out=again, **{**TINY, "eval_freq": 0, "checkpoint_freq": 0}))
    sc = get_scenario("adaptive-switch")
    last = str(tmp_path / "last")  # the first run's last policy, in its own directory
    os.makedirs(last)
    shutil.copy(os.path.join(out, "last_model.zip"), os.path.join(last, "model.zip"))
    shutil.copy(os.path.join(out, "last_vecnormalize.pkl"), os.path.join(last, "vecnormalize.pkl"))
    shutil.copy(os.path.join(out, "flowgym_agent.json"), os.path.join(last, "flowgym_agent.json"))
    assert np.array_equal(_actions(LearnedBudget(again), sc.env_kwargs(), 1, 800),
                          _actions(LearnedBudget(last, trust=True), sc.env_kwargs(), 1, 800))  # SB3 files, trusted


@needs_sb3
def test_learned_agent_runs_through_the_evaluation_path(tiny_model):
    out, _ = tiny_model
    agent = make_agent("learned", path=out)
    assert agent.env_options()["observation"] == "flat"
    sc = get_scenario("adaptive-switch")
    table = evaluate([agent, FlowControl(b=12)], sc.env_kwargs(), seeds=[0, 1], horizons=[300, 600])
    rows = [r for r in table.rows if r["agent"] == agent.label()]
    assert len(rows) == 4 and all(np.isfinite(r["mean_time_in_system"]) for r in rows)
    # the same arrivals for both agents
    for T in (300, 600):
        arrived = {r["agent"]: r["arrived"] for r in table.rows if r["horizon"] == T and r["seed"] == 0}
        assert len(set(arrived.values())) == 1
    # deterministic: the same seed, the same episode
    e1, e2 = run_episode(agent, sc.env_kwargs(), 7, 400), run_episode(agent, sc.env_kwargs(), 7, 400)
    assert np.array_equal(e1.series["admitted"], e2.series["admitted"])


@needs_sb3
def test_compare_cli_accepts_the_learned_agent(tiny_model, tmp_path, capsys):
    out, _ = tiny_model
    rc = main(["compare", "--scenario", "adaptive-switch", "--agents", f"learned:path={out};flow-control:b=12",
               "--horizons", "300", "--seeds", "1", "--no-plots", "--quiet", "--out", str(tmp_path)])
    assert rc == 0
    text = open(tmp_path / "adaptive-switch.csv").read()
    assert "learned (model)" in text and "flow-control b=12" in text


@needs_sb3
def test_learned_agent_refuses_mismatched_environments(tiny_model, tmp_path):
    out, _ = tiny_model
    agent = LearnedBudget(out)
    # an option it was trained with, set differently by the scenario
    with pytest.raises(ValueError, match="output_length_known"):
        run_episode(agent, get_scenario("paper-synthetic-known").env_kwargs(), 0, 10)
    # another observation shape: continuous time adds the last iteration's duration
    kw = get_scenario("adaptive-azure-conv").env_kwargs()
    kw["workload"]["window"] = [0.0, 30.0]
    with pytest.raises(ValueError, match="observation of shape"):
        run_episode(agent, kw, 0, None)
    # an environment built by hand with another queue cap
    from flowgym.envs.flow_control import FlowControlEnv

    env = FlowControlEnv(**{**agent.meta["env_kwargs"], "queue_cap": 10})
    with pytest.raises(ValueError, match="queue_cap"):
        agent.reset(env.config)
    with pytest.raises(ValueError, match="not a model directory"):
        LearnedBudget(str(tmp_path / "nope"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="lacks"):
        LearnedBudget(str(tmp_path / "empty"))
    assert make_agent("learned").label() == "learned (generalist)"  # no path: the shipped generalist


@needs_sb3
def test_max_budget_defaults_to_the_scenarios(tmp_path):
    out = str(tmp_path / "mix")
    train(TrainConfig(scenario="adaptive-mix", out=out, **{**TINY, "total_timesteps": 256, "eval_freq": 0,
                                                             "checkpoint_freq": 0}))
    with open(os.path.join(out, "flowgym_agent.json")) as f:
        meta = json.load(f)
    assert meta["env_kwargs"]["max_budget"] == 64  # adaptive-mix's learned_max_budget
    assert meta["budget_levels"] == list(get_scenario("adaptive-mix").learned_budget_levels)  # its levels
    assert meta["action_n"] == len(meta["budget_levels"]) == 14
    assert LearnedBudget(out).env_options()["max_budget"] == 64
    out2 = str(tmp_path / "every")  # max_budget alone: every budget up to it, no levels
    train(TrainConfig(scenario="adaptive-mix", out=out2, max_budget=20,
                      **{**TINY, "total_timesteps": 256, "eval_freq": 0, "checkpoint_freq": 0}))
    meta2 = json.load(open(os.path.join(out2, "flowgym_agent.json")))
    assert meta2["budget_levels"] is None and meta2["action_n"] == 21


@needs_sb3
def test_scenario_file_train_then_evaluate_without_the_file(tmp_path):
    """A model trained on a scenario file stores the scenario as data: the file can go."""
    from flowgym.lab import _toml
    from flowgym.lab.train import final_evaluation

    d = get_scenario("adaptive-switch").to_dict()
    d.update(name="my-switch", agents=[{"name": "flow-control", "params": {"b": 12},
                                        "tune": {"param": "b", "grid": [8, 24]}}, {"name": "mc"}])
    del d["train"]  # no action range given: derived from the line-up (the grid reaches 24), not capped at 16
    d["env"]["horizon"] = 300
    path = tmp_path / "my.toml"
    path.write_text(_toml.dumps(d))
    out = str(tmp_path / "model")
    train(TrainConfig(scenario=str(path), out=out, **{**TINY, "total_timesteps": 256, "eval_freq": 0,
                                                       "checkpoint_freq": 0}))
    meta = json.load(open(os.path.join(out, "flowgym_agent.json")))
    assert meta["scenario"] == "my-switch" and meta["scenario_data"]["name"] == "my-switch"
    assert meta["action_n"] == 25 and "agents" in meta["action_range_from"]
    path.unlink()
    table = final_evaluation(out, seeds=[900], tune_seeds=[1000], write=False)
    assert table.agents[0] == "learned (model)" and any(a.startswith("flow-control b=") for a in table.agents)
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        TrainConfig(scenario={**d, "colour": 1}).validate()


@needs_sb3
def test_train_cli_end_to_end(tmp_path, capsys):
    out = str(tmp_path / "cli")
    rc = main(["train", "--scenario", "adaptive-low", "--total-timesteps", "512", "--n-envs", "2", "--n-steps", "128",
               "--batch-size", "128", "--n-epochs", "1", "--eval-freq", "256", "--eval-episodes", "1",
               "--checkpoint-freq", "0", "--final-eval-seeds", "1", "--action-repeat", "2", "--action-rule", "mode", "--tune-seeds", "1", "--quiet", "--no-plots",
               "--out", out, "--net-arch", "16,16", "--env-overrides", '{"horizon": 300}'])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "learned (cli)" in printed and "flow-control (best fixed b) b=" in printed
    hint = printed.split("held-out seeds:")[1]  # the hint: the scenario's tuned line-up plus the model
    assert f'flowgym compare --scenario adaptive-low --seeds 900-919 --add-agents "learned:path={out}"' in hint
    table = open(os.path.join(out, "eval.txt")).read()
    for label in ("learned (cli)", "greedy-LIFO", "MC", "A_min", "alpha-greedy alpha="):
        assert label in table
    meta = json.load(open(os.path.join(out, "flowgym_agent.json")))
    assert meta["hyperparameters"]["net_arch"] == [16, 16] and meta["env_kwargs"]["horizon"] == 300
    assert meta["action_repeat"] == 2 and meta["env_slots"] == 2 * meta["timesteps"]
    assert meta["action_rule"] == "mode" and LearnedBudget(out).action_rule == "mode"
    assert not os.path.exists(os.path.join(out, "checkpoints"))


@pytest.mark.parametrize("bad, match", [
    ({"scenario": "nope"}, "unknown scenario"),
    ({"n_envs": 0}, "n_envs"),
    ({"gamma": 1.5}, "gamma"),
    ({"vec_env": "ray"}, "vec_env"),
    ({"net_arch": ()}, "net_arch"),
    ({"algo": "sac-ish"}, "algo"),
    ({"env_overrides": {"workload": {}}}, "workload"),
    ({"env_overrides": {"bogus": 1}}, r"env_overrides: unknown FlowControl-v0 argument\(s\) \['bogus'\]"),
    ({"select": "median"}, "select"),
    ({"action_repeat": 0}, "action_repeat"),
    ({"action_rule": "median"}, "action_rule"),
    ({"budget_levels": (4,)}, "budget_levels"),
    ({"budget_levels": (0, 4, 4)}, "budget_levels"),
    ({"budget_levels": (-1, 4)}, "budget_levels"),
    ({"budget_levels": (0, 4, 8), "max_budget": 16}, "largest of budget_levels"),
])
def test_train_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**bad).validate()


@needs_sb3
def test_budget_levels_train_reload_and_act_within_the_levels(tmp_path):
    out = str(tmp_path / "levels")
    levels = [1, 3, 7, 40]  # no index equals its level, so an unmapped index would show
    train(TrainConfig(scenario="adaptive-mix", out=out, budget_levels=tuple(levels),
                      **{**TINY, "checkpoint_freq": 0}))
    meta = json.load(open(os.path.join(out, "flowgym_agent.json")))
    assert meta["budget_levels"] == levels and meta["action_n"] == 4 and meta["env_kwargs"]["max_budget"] == 40
    kw = get_scenario("adaptive-mix").env_kwargs()
    a1 = _actions(LearnedBudget(out, action_rule="mode"), kw, 3, 200)
    a2 = _actions(LearnedBudget(out, action_rule="mode"), kw, 3, 200)
    assert set(a1.tolist()) <= set(levels) and np.array_equal(a1, a2)
    # the index the policy picks maps to its level: compare with the model's own prediction
    ag = LearnedBudget(out, action_rule="mode")
    env = env_for(ag, kw, 50)
    obs, _ = env.reset(seed=1)
    ag.reset(env.config, seed=1)
    idx, _ = ag.model.predict(ag.normalize(obs)[None], deterministic=True)
    assert ag.act(obs, env.view()) == levels[int(idx[0])]
    meta["budget_levels"] = [0, 2]  # one level per action, or refused
    with open(os.path.join(out, "flowgym_agent.json"), "w") as f:
        json.dump(meta, f)
    with pytest.raises(ValueError, match="budget_levels"):
        LearnedBudget(out)


def test_train_cli_bad_input(capsys):
    assert main(["train", "--algo", "ppo", "--n-envs", "0", "--quiet"]) == 2
    assert "n_envs" in capsys.readouterr().err
    assert main(["train", "--iterations", "0", "--quiet"]) == 2  # the default (no scenario) is --algo ars
    assert "iterations must be a positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--env-overrides", "{not json"])
    with pytest.raises(SystemExit):
        main(["train", "--budget-levels", "0,x,4"])


@needs_sb3
def test_another_sb3_algorithm_plugs_in(tmp_path):
    out = str(tmp_path / "a2c")
    res = train(TrainConfig(out=out, **{**TINY, "algo": "a2c", "total_timesteps": 256, "n_steps": 16,
                                        "eval_freq": 0, "checkpoint_freq": 0}))
    assert res.selected == "last"
    agent = LearnedBudget(out)
    assert agent.meta["algo_class"] == "stable_baselines3.a2c.a2c:A2C"
    assert "n_epochs" not in agent.meta["algo_kwargs_used"]  # only the arguments A2C accepts
    ep = run_episode(agent, get_scenario("adaptive-low").env_kwargs(), 0, 200)
    assert ep.metrics()["completed"] > 0


@needs_sb3
def test_a_stale_best_model_in_a_reused_out_is_never_selected(tmp_path):
    """An interrupted run can leave best_model.zip behind; a run whose evaluations saved none (here: none ran)
    selects its last policy, not that file."""
    out = tmp_path / "reused"
    out.mkdir()
    (out / "best_model.zip").write_bytes(b"an earlier, interrupted run's")
    (out / "best_vecnormalize.pkl").write_bytes(b"and its statistics")
    res = train(TrainConfig(out=str(out), **{**TINY, "algo": "a2c", "total_timesteps": 256, "n_steps": 16,
                                             "eval_freq": 100_000, "checkpoint_freq": 0, "select": "best"}))
    assert res.selected == "last" and not (out / "best_model.zip").exists()
    assert LearnedBudget(str(out)).meta["selected"] == "last"


@needs_sb3
def test_an_algorithm_of_the_callers_module_trains_and_loads_only_when_trusted(tmp_path, monkeypatch):
    # the training run loads what it wrote (before, its own check refused the class it had just trained)
    (tmp_path / "my_algos.py").write_text("from stable_baselines3 import A2C\n\n\nclass MyA2C(A2C):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = str(tmp_path / "mine")
    train(TrainConfig(out=out, **{**TINY, "algo": "my_algos:MyA2C", "total_timesteps": 64, "n_steps": 16,
                                  "eval_freq": 0, "checkpoint_freq": 0, "final_eval_seeds": 1, "tune_seeds": 1}))
    assert os.path.exists(os.path.join(out, "eval.json"))  # the final table ran
    with pytest.raises(ValueError, match="trust=True"):
        LearnedBudget(out)
    agent = LearnedBudget(out, trust=True)
    assert type(agent.model).__module__.startswith("stable_baselines3")  # the policy; the class came from my_algos
    assert agent.meta["algo_class"] == "my_algos:MyA2C"


@needs_sb3
def test_sb3_continuous_algorithms_by_short_or_full_name_load_without_trust(tmp_path):
    from stable_baselines3 import SAC

    from flowgym.agents.learned import _algorithm

    assert _algorithm({"algo": "stable_baselines3:SAC", "algo_class": "stable_baselines3.sac.sac:SAC"}, False) is SAC
    # the class comes from the known entry, not from the module the directory records
    assert _algorithm({"algo": "x", "algo_class": "stable_baselines3.no_such_module:SAC"}, False) is SAC
    for spoof in ("evil_pkg.stable_baselines3:SAC", "stable_baselines3_evil:SAC", "stable_baselines3:Evil"):
        with pytest.raises(ValueError, match="trust=True"):
            _algorithm({"algo": spoof, "algo_class": spoof}, False)
    out = str(tmp_path / "sac")
    train(TrainConfig(out=out, **{**TINY, "algo": "sac", "action": "log-multiplier", "multiplier_of": "max-head",
                                  "total_timesteps": 64, "n_envs": 1, "eval_freq": 0, "checkpoint_freq": 0,
                                  "algo_kwargs": {"learning_starts": 16}}))
    agent = LearnedBudget(out)
    assert type(agent.model.action_space).__name__ == "Box" and agent.model.action_space.shape == (2,)
    ep = run_episode(agent, get_scenario("adaptive-low").env_kwargs(), 0, 200)
    assert ep.metrics()["completed"] > 0


@needs_sb3
def test_off_policy_algorithms_do_not_get_the_rollout_length():
    from stable_baselines3 import DQN, PPO

    from flowgym.lab.train import _algo_kwargs

    cfg = TrainConfig(n_steps=512)
    assert "n_steps" not in _algo_kwargs(cfg, DQN) and _algo_kwargs(cfg, PPO)["n_steps"] == 512
    assert _algo_kwargs(TrainConfig(algo_kwargs={"n_steps": 3}), DQN)["n_steps"] == 3


def test_missing_sb3_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[train\]' in the flowgym checkout"):
        require_sb3()


def test_adaptive_scenarios():
    for name in ADAPTIVE_SCENARIOS:
        sc = get_scenario(name)
        assert sc.agents[0].tune is not None and sc.agents[0].name == "flow-control"
        assert {a.name for a in sc.agents} >= {"greedy-lifo", "a-min", "mc", "alpha-greedy"}
    # the switching load: low for 1000 slots, then high, per its rates
    env = env_for(FlowControl(b=12), get_scenario("adaptive-switch").env_kwargs(), 2000)
    env.reset(seed=0)
    for _ in range(2000):
        env.step(12)
    arr = env.request_log()["arrival"]
    low, high = (arr < 1000).sum() / 1000, (arr >= 1000).sum() / 1000
    assert abs(low - 6.0) < 0.5 and abs(high - 13.5) < 0.5
    sw = get_scenario("adaptive-switch", rate=2.0).env_kwargs()["workload"]["rate"]
    assert sw["rates"] == [12.0, 27.0]
    with pytest.raises(ValueError, match="rate"):
        get_scenario("adaptive-low", rate=-1.0)
    assert get_scenario("adaptive-mix").learned_max_budget == 64
    assert get_scenario("adaptive-mix", rate=0.5).env_kwargs()["workload"]["streams"][0]["rate"]["rates"] == [15.0, 0.0]
    az = get_scenario("adaptive-azure-conv")
    assert az.env_kwargs()["workload"]["window"] == AZURE_REPORT_WINDOW
    assert az.tune_env_kwargs()["workload"]["window"] == AZURE_TRAIN_WINDOW
    assert AZURE_TRAIN_WINDOW[1] <= AZURE_REPORT_WINDOW[0]  # reports on held-out requests


SHIPPED = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "ppo_default")


@needs_sb3
def test_shipped_model_loads_and_acts():
    assert os.path.exists(os.path.join(SHIPPED, "model.zip"))
    size = sum(os.path.getsize(os.path.join(SHIPPED, f)) for f in os.listdir(SHIPPED))
    assert size < 400_000  # "a few hundred KB at most"
    agent = make_agent("learned", path=SHIPPED)
    assert agent.meta["scenario"] == TrainConfig().scenario
    sc = get_scenario(agent.meta["scenario"])
    e1, e2 = run_episode(agent, sc.env_kwargs(), 0, 400), run_episode(agent, sc.env_kwargs(), 0, 400)
    assert np.array_equal(e1.series["admitted"], e2.series["admitted"])
    assert e1.metrics()["completed"] > 0


@needs_sb3
def test_recurrent_ppo_trains_and_its_lstm_state_round_trips(tmp_path):
    """sb3-contrib's RecurrentPPO: trains end to end, loads without pickle, and the agent carries the LSTM
    state from decision to decision exactly as the SB3 model does (and resets it per episode)."""
    from sb3_contrib import RecurrentPPO

    from flowgym.agents.learned import recurrent_action
    from flowgym.lab.train import _RuleModel

    out = str(tmp_path / "rppo")
    train(TrainConfig(out=out, **{**TINY, "algo": "recurrent-ppo", "action": "log-multiplier",
                                  "multiplier_of": "max-head", "observation": "load-v2", "net_arch": (8,),
                                  "algo_kwargs": {"policy_kwargs": {"lstm_hidden_size": 6}}}))
    meta = json.load(open(os.path.join(out, "flowgym_agent.json")))
    assert meta["policy_kwargs"] == {"net_arch": [8], "lstm_hidden_size": 6, "n_lstm_layers": 1,
                                     "shared_lstm": False, "enable_critic_lstm": True}
    assert [r for r in read_curves(os.path.join(out, "curves.csv")) if r["kind"] == "eval"]
    agent = LearnedBudget(out)  # no trust needed: a known algorithm, plain tensors
    assert agent.recurrent and agent.model.lstm_actor.hidden_size == 6
    sb3 = RecurrentPPO.load(os.path.join(out, "model.zip"), device="cpu")
    env_kwargs = get_scenario("adaptive-switch").env_kwargs()

    def held(a):  # the float actions the agent decides in one episode
        env = env_for(a, env_kwargs, 300)
        obs, _ = env.reset(seed=3)
        a.reset(env.unwrapped.config, seed=3)
        rows, done = [], False
        while not done:
            decides = a.decides_next
            b = a.act(obs, env.unwrapped.view)
            if decides:
                rows.append((obs.copy(), np.array(a._held)))
            obs, _, term, trunc, _ = env.step(b)
            done = term or trunc
        return rows

    rows = held(agent)
    assert len(rows) > 10
    state = None
    for i, (obs, act) in enumerate(rows):  # the SB3 model, its state carried the same way
        want, state = sb3.predict(agent.normalize(obs)[None], state=state, episode_start=np.array([i == 0]),
                                  deterministic=True)
        np.testing.assert_allclose(act, want[0], rtol=0, atol=1e-6)
    again = held(agent)  # reset() starts the state from zeros again
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(rows, again))
    # the state matters: each decision from a zero state acts differently
    fresh = [recurrent_action(agent.model, agent.normalize(o)[None], None, None)[0][0] for o, _ in rows]
    assert not all(np.allclose(f, a) for f, (_, a) in zip(fresh, rows))
    # carry_state=False (the ablation) plays every decision from a zero state
    for o, a in held(LearnedBudget(out, carry_state=False)):
        np.testing.assert_allclose(a, recurrent_action(agent.model, agent.normalize(o)[None], None, None)[0][0],
                                   rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="carry_state must be true or false"):
        LearnedBudget(out, carry_state="no")
    # flowgym_agent.json's LSTM shape must be the tensors': a size in the JSON alone is refused before any
    # policy is built (a hostile 40000 would ask for gigabytes)
    for bad, word in (({"lstm_hidden_size": 40000}, "lstm_hidden_size=40000"),
                      ({"n_lstm_layers": 1000000}, "n_lstm_layers=1000000"),
                      ({"enable_critic_lstm": False}, "no lstm_critic")):
        d = tmp_path / f"bad{len(word)}"
        shutil.copytree(out, d)
        m = json.loads((d / "flowgym_agent.json").read_text())
        m["policy_kwargs"].update(bad)
        (d / "flowgym_agent.json").write_text(json.dumps(m))
        with pytest.raises(ValueError, match=word):
            LearnedBudget(str(d))
    # the in-training evaluation's wrapper passes the state through as well
    obs = np.stack([agent.normalize(o) for o, _ in rows[:2]])
    a1, s1 = _RuleModel(sb3, "mean").predict(obs, None, np.array([True, True]))
    b1, t1 = recurrent_action(sb3, obs, None, [True, True])
    assert s1 is not None and np.array_equal(a1, b1) and np.array_equal(s1[0], t1[0])


@needs_sb3
def test_recurrent_model_policy_kwargs_are_checked(tmp_path):
    from flowgym.agents.learned import _load_safe

    base = {"algo": "recurrent-ppo", "algo_class": "sb3_contrib:RecurrentPPO", "action_n": 3}
    np.savez(os.path.join(tmp_path, "normalization.npz"), obs_low=np.zeros(4), obs_high=np.ones(4))
    for bad, word in (({"lstm_hidden_size": "8"}, "lstm_hidden_size='8'"), ({"lstm_hidden_size": 0}, "positive"),
                      ({"shared_lstm": 1}, "true or false"), ({"activation_fn": "x"}, "may only hold")):
        with pytest.raises(ValueError, match=word):
            _load_safe(str(tmp_path), {**base, "policy_kwargs": bad}, False)
    with pytest.raises(ValueError, match="may only hold"):  # an LSTM size for a policy without one
        _load_safe(str(tmp_path), {**base, "algo": "ppo", "policy_kwargs": {"lstm_hidden_size": 8}}, False)
    with pytest.raises(ValueError, match="policy_kwargs may only hold net_arch, log_std_init"):  # before training
        TrainConfig(out="x", algo_kwargs={"policy_kwargs": {"lstm_kwargs": {"bias": False}}}).validate()


@needs_sb3
def test_recurrent_mean_rule_of_a_discrete_budget_is_the_expected_index_with_the_state_carried():
    import torch
    from gymnasium import spaces
    from sb3_contrib import RecurrentPPO

    from flowgym.agents.learned import recurrent_action

    torch.manual_seed(0)
    obs_space = spaces.Box(-5, 5, (3,), np.float32)
    policy = RecurrentPPO.policy_aliases["MlpLstmPolicy"](obs_space, spaces.Discrete(9), lambda _: 0.0,
                                                          lstm_hidden_size=5, n_lstm_layers=2)
    obs = np.random.default_rng(1).normal(size=(6, 2, 3)).astype(np.float32)  # 6 decisions of 2 episodes
    state, h = None, (torch.zeros(2, 2, 5), torch.zeros(2, 2, 5))
    for i, o in enumerate(obs):
        got, state = recurrent_action(policy, o, state, None)
        starts = torch.full((2,), float(i == 0))
        with torch.no_grad():
            dist, h = policy.get_distribution(torch.as_tensor(o), h, starts)
        want = np.rint(dist.distribution.probs.numpy() @ np.arange(9))
        assert np.array_equal(got, want) and got.dtype == np.int64
        assert np.allclose(state[0], h[0].numpy()) and np.allclose(state[1], h[1].numpy())
        mode, _ = recurrent_action(policy, o, None if i == 0 else prev, None, "mode")
        assert np.array_equal(mode, dist.distribution.probs.numpy().argmax(1))
        prev = state


@needs_sb3
def test_recurrent_ppo_with_a_discrete_budget_and_the_mean_rule(tmp_path):
    """The default action (budget levels) and rule ("mean") through training, the pickle-free check, the agent
    and the in-training evaluation's wrapper: rows of a batch are separate episodes, a row's episode start
    resets that row's state only, and the state passed back continues it."""
    from sb3_contrib import RecurrentPPO

    from flowgym.agents.learned import recurrent_action
    from flowgym.lab.train import _RuleModel

    out = str(tmp_path / "rppo-d")
    train(TrainConfig(out=out, **{**TINY, "algo": "recurrent-ppo", "net_arch": (8,), "eval_freq": 0,
                                  "checkpoint_freq": 0, "algo_kwargs": {"policy_kwargs": {"lstm_hidden_size": 4}}}))
    agent = LearnedBudget(out)
    assert agent.recurrent and not agent.continuous and agent.action_rule == "mean"
    ep = run_episode(agent, get_scenario("adaptive-switch").env_kwargs(), 0, 200)
    assert ep.metrics()["completed"] > 0
    sb3 = RecurrentPPO.load(os.path.join(out, "model.zip"), device="cpu")
    obs = np.random.default_rng(2).normal(size=(3, 2, *sb3.observation_space.shape)).astype(np.float32)
    wrapped = _RuleModel(sb3, "mean")
    state, rows = None, [[None, None], [None, None]]
    starts = ([True, True], [False, False], [False, True])
    for t in range(3):
        got, state = wrapped.predict(obs[t], state, np.array(starts[t]))
        for r in range(2):  # each row alone, its own state (reset where its episode starts)
            one, rows[r] = recurrent_action(sb3, obs[t, r:r + 1], None if starts[t][r] else rows[r], [starts[t][r]])
            assert got[r] == one[0]
            assert np.allclose(state[0][:, r], rows[r][0][:, 0]) and np.allclose(state[1][:, r], rows[r][1][:, 0])
