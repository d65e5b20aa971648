"""Checks of ``agents/learned.py`` that its mutation run found unpinned (docs/testing.md): the
budget-level and action-space validation, the policy_kwargs whitelist, and what write_safe stores."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests._requires import needs_sb3

#: PPO's generalist (the shipped default until 2026-11-25; the default is now a numpy policy: tests/test_ars.py)
SHIPPED = Path(__file__).resolve().parent.parent / "examples" / "ppo_generalist"


def test_two_ascending_levels_are_valid_one_is_not():
    from flowgym.agents.learned import valid_levels

    assert valid_levels([0, 4]) and valid_levels((1, 2, 8))
    for bad in ([3], [], [4, 4], [4, 2], [0, 1.5], [True, 2], [-1, 2], "0,4", None):
        assert not valid_levels(bad), bad


def test_action_n_and_action_space_that_disagree_are_named():
    from flowgym.agents.learned import action_space_of

    with pytest.raises(ValueError, match=r"has action_n=1000 but action_space=\{'kind': 'discrete', 'n': 17\}"):
        action_space_of({"action_n": 1000, "action_space": {"kind": "discrete", "n": 17}})
    with pytest.raises(ValueError, match=r"has no action_space \(action_n=0: a model whose action is a box"):
        action_space_of({"action_n": 0})


@pytest.mark.parametrize("meta", [{"action_n": "3"}, {"action_n": True}, {"action_n": 2.0}, {}])
def test_action_n_must_be_a_positive_integer(meta):
    from flowgym.agents.learned import action_space_of

    with pytest.raises(ValueError, match="action_n=.* must be a positive integer"):
        action_space_of(meta)


def test_action_space_descriptions():
    from gymnasium import spaces

    from flowgym.agents.learned import action_space_of, describe_action_space

    assert action_space_of({"action_n": 12}) == spaces.Discrete(12)
    assert action_space_of({"action_n": 12, "action_space": {"kind": "discrete", "n": 12}}) == spaces.Discrete(12)
    box = spaces.Box(-1.0, 1.0, (1,), np.float32)
    assert action_space_of({"action_n": 0, "action_space": describe_action_space(box)}) == box
    assert describe_action_space(spaces.Discrete(5)) == {"kind": "discrete", "n": 5}
    for bad in ("box", ["box"], {"kind": "discrete", "n": 3}):  # a discrete n disagreeing with action_n too
        with pytest.raises(ValueError, match="action_space="):
            action_space_of({"action_n": 12, "action_space": bad})


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(SHIPPED, d)
    return d


@needs_sb3
@pytest.mark.parametrize("kwargs", [{"net_arch": [64, 64], "activation_fn": "torch.nn.ReLU"}, [64, 64], "net_arch"])
def test_policy_kwargs_may_only_hold_net_arch(tmp_path, kwargs):
    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    meta = json.loads((d / "flowgym_agent.json").read_text())
    meta["policy_kwargs"] = kwargs
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="policy_kwargs may only hold net_arch"):
        LearnedBudget(str(d))


@needs_sb3
def test_net_arch_must_be_the_tensors_layers(tmp_path):
    """Sizes in flowgym_agent.json or normalization.npz alone are refused, naming the field, before the policy is
    built (they could ask for gigabytes); the shipped arch, as a list or a dict, loads."""
    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    meta = json.loads((d / "flowgym_agent.json").read_text())
    arch = meta["policy_kwargs"]["net_arch"]
    widths = arch["pi"] if isinstance(arch, dict) else arch
    obs_n = len(np.load(d / "normalization.npz")["obs_low"])

    def refused(kwargs, word, **more):
        m = {**meta, "policy_kwargs": kwargs, **more}
        (d / "flowgym_agent.json").write_text(json.dumps(m))
        with pytest.raises(ValueError, match="do not describe the tensors in policy.pt") as e:
            LearnedBudget(str(d))
        assert word in str(e.value) and len(str(e.value)) < 1000

    for bad, word in (([100000, 100000], "width 100000 that"), ([widths[0], 100000], f"width 100000 after {widths[0]}"),
                      ({"pi": [100000], "vf": widths}, "width 100000 that"),
                      ([widths[0]] + [widths[1]] * 3, f"width {widths[1]} after {widths[1]}"),  # more layers than held
                      ({"pi": widths, "vf": widths + [widths[-1]]}, f"after {widths[-1]}"),  # pi used them up
                      ([widths[0]] * 100000, "after"),  # the message stays short
                      ([1], "width 1 that"),  # (1, w) is the value head: no first layer reads 1 from the observation
                      ([1, widths[0]], "width 1 that"),
                      ([64, "64"], "positive integer"), ([0], "positive integer"), ({"pi": 64}, "positive integer"),
                      ({"pi": widths, "xx": widths}, "keys pi, vf, qf")):
        refused({"net_arch": bad}, word)
    box = {"kind": "box", "low": [-1.0] * 1000, "high": [1.0] * 1000}
    refused({"net_arch": arch}, "action has size 1000", action_space=box)
    for good in (arch, {"pi": widths, "vf": widths}, {"pi": widths, "vf": widths, "qf": [100000]}):  # PPO reads no qf
        (d / "flowgym_agent.json").write_text(json.dumps({**meta, "policy_kwargs": {"net_arch": good}}))
        agent = LearnedBudget(str(d))
        assert [m.out_features for m in agent.model.mlp_extractor.policy_net if hasattr(m, "out_features")] == widths
    # an observation size that only the normalisation file gives
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    np.savez(d / "normalization.npz", obs_low=np.zeros(10**6, np.int8), obs_high=np.ones(10**6, np.int8))
    with pytest.raises(ValueError, match="the observation has 1000000 entries"):
        LearnedBudget(str(d))
    assert obs_n != 10**6


@needs_sb3
@pytest.mark.parametrize("algo,discrete,arch", [
    ("ppo", False, {"pi": [8, 4], "vf": [6]}), ("a2c", True, [8]), ("dqn", True, [8, 4]), ("qrdqn", True, [8]),
    ("sac", False, {"pi": [8], "qf": [16, 4]}), ("td3", False, [8, 4]), ("ddpg", False, []), ("trpo", True, [8]),
    ("maskable-ppo", True, [8]), ("recurrent-ppo", False, [8])])
def test_every_known_algorithm_round_trips_without_pickle(tmp_path, algo, discrete, arch):
    """write_safe's files for each allow-listed algorithm pass the size checks and load to the same tensors."""
    import torch
    from gymnasium import spaces

    from flowgym.agents.learned import _load_safe, algorithm_class, describe_action_space, policy_alias, write_safe

    cls = algorithm_class(algo)
    obs = spaces.Box(-1.0, 1.0, (5,), np.float32)
    act = spaces.Discrete(3) if discrete else spaces.Box(-1.0, 1.0, (2,), np.float32)
    extra = {"lstm_hidden_size": 6} if algo == "recurrent-ppo" else {}
    policy = cls.policy_aliases[policy_alias(cls)](obs, act, lambda _: 1e-3, net_arch=arch, **extra)
    meta = write_safe(str(tmp_path), policy, None, {"algo": algo, "action_n": 3 if discrete else 0,
                                                     "action_space": describe_action_space(act)})
    meta["policy_kwargs"] = {**meta.get("policy_kwargs", {}), **extra}
    loaded, norm = _load_safe(str(tmp_path), meta, False)
    want, have = policy.state_dict(), loaded.state_dict()
    assert norm is None and want.keys() == have.keys()
    assert all(torch.equal(want[k], have[k]) for k in want)


@needs_sb3
def test_write_safe_stores_normalisation_only_when_observations_were_normalised(tmp_path):
    from flowgym.agents.learned import FORMAT_VERSION, LearnedBudget, write_safe

    policy = LearnedBudget(str(SHIPPED)).model
    norm = SimpleNamespace(norm_obs=True, obs_rms=SimpleNamespace(mean=np.arange(17.0), var=np.full(17, 4.0)),
                           epsilon=1e-8, clip_obs=10.0)
    for name, n, want in (("none", None, False), ("off", SimpleNamespace(norm_obs=False), False), ("on", norm, True)):
        d = tmp_path / name
        d.mkdir()
        meta = write_safe(str(d), policy, n, {"algo": "ppo"})
        assert meta["format"] == FORMAT_VERSION == 2 and meta["algo"] == "ppo"
        with np.load(d / "normalization.npz") as z:
            assert ("obs_mean" in z.files) == want
            assert {"obs_low", "obs_high"} <= set(z.files)
            if want:
                np.testing.assert_array_equal(z["obs_mean"], np.arange(17.0))
                assert float(z["clip_obs"]) == 10.0


def test_one_action_is_a_valid_discrete_space():
    from gymnasium import spaces

    from flowgym.agents.learned import action_space_of

    assert action_space_of({"action_n": 1}) == spaces.Discrete(1)


@needs_sb3
@pytest.mark.parametrize("repeat", [0, -8, True, "8", 2.5])
def test_action_repeat_must_be_a_positive_integer(tmp_path, repeat):
    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    meta = json.loads((d / "flowgym_agent.json").read_text())
    meta["action_repeat"] = repeat
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"has action_repeat={repeat!r}; it must be a positive integer"):
        LearnedBudget(str(d))


@needs_sb3
def test_loading_defaults_labels_and_threads(tmp_path):
    import torch

    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    meta = json.loads((d / "flowgym_agent.json").read_text())
    meta["action_repeat"] = 1
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    one = LearnedBudget(str(d))
    assert one.action_repeat == 1 and one.label() == "learned (model)"
    del meta["action_repeat"]  # older directories: every decision is its own (a repeat of 1)
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    assert LearnedBudget(str(d)).action_repeat == 1
    torch.set_num_threads(2)
    shipped = LearnedBudget(str(SHIPPED))
    assert shipped.label() == "learned (ppo_generalist)" and shipped.action_repeat == 8
    assert torch.get_num_threads() == 1  # small networks run fastest on one thread (set when loading)
    assert LearnedBudget(label="mine").label() == "mine"


@needs_sb3
def test_each_decision_is_held_for_action_repeat_slots_and_a_reset_starts_afresh(monkeypatch):
    import flowgym.agents.learned as learned
    from flowgym.envs.flow_control import FlowControlConfig

    agent = learned.LearnedBudget(str(SHIPPED))
    assert agent.action_repeat == 8
    calls = []

    def fake(model, obs, rule):
        calls.append(len(calls))
        return np.array([len(calls) % 12])  # a new index at every query

    monkeypatch.setattr(learned, "policy_action", fake)
    obs = np.zeros(17)
    got = [agent.act(obs, None) for _ in range(20)]
    assert got == [1] * 8 + [2] * 8 + [3] * 4  # queried at acts 0, 8 and 16, held in between
    agent.reset(FlowControlConfig(**agent.requires))
    assert agent.act(obs, None) == 4 and len(calls) == 4  # the first act of an episode queries the policy


def test_a_degenerate_box_is_refused():
    from flowgym.agents.learned import action_space_of

    with pytest.raises(ValueError, match="a box needs finite low < high lists"):
        action_space_of({"action_n": 0, "action_space": {"kind": "box", "low": [0.0], "high": [0.0]}})


@needs_sb3
def test_a_directory_without_a_format_is_the_pickle_layout(tmp_path):
    # format 1 (no "format" key) stores the policy in SB3's pickle files: it loads only with trust
    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    meta = json.loads((d / "flowgym_agent.json").read_text())
    del meta["format"]
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="stores its policy only in SB3's pickle-based files"):
        LearnedBudget(str(d))


@needs_sb3
def test_trusted_loading_normalises_as_vecnormalize_does(tmp_path):
    import pickle

    from flowgym.agents.learned import LearnedBudget

    src = tmp_path / "ppo"
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "ppo_default", src)
    (src / "policy.pt").unlink()  # SB3's own files only: loaded (trusted) with their VecNormalize
    agent = LearnedBudget(str(src), trust=True)
    assert type(agent.model).__name__ == "PPO"
    with open(src / "vecnormalize.pkl", "rb") as fh:
        vec = pickle.load(fh)
    assert float(np.min(vec.obs_rms.var)) < vec.epsilon  # a feature that never varied in training
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs = rng.uniform(0, 2, size=agent.obs_shape)
        got = agent.normalize(obs)
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, vec.normalize_obs(obs).astype(np.float32))


@pytest.mark.parametrize("low", [[True], ["-1"], [float("nan")], [float("-inf")]])
def test_box_bounds_must_be_finite_numbers(low):
    from flowgym.agents.learned import action_space_of

    with pytest.raises(ValueError, match="a box needs finite low < high lists"):
        action_space_of({"action_n": 0, "action_space": {"kind": "box", "low": low, "high": [1.0]}})


@needs_sb3
def test_mismatched_tensors_are_named_by_torchs_error(tmp_path):
    import torch

    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    state = torch.load(d / "policy.pt", weights_only=True)
    missing = next(iter(state))
    state.pop(missing)  # one tensor missing: torch names it on the line after its first
    torch.save(state, d / "policy.pt")
    with pytest.raises(ValueError, match=r"policy.pt in .* is not this policy's tensors "
                       r"\(RuntimeError: Error\(s\) in loading state_dict for ActorCriticPolicy: Missing key\(s\) "
                       rf'in state_dict: "{re.escape(missing)}"\.\)$'):
        LearnedBudget(str(d))


@needs_sb3
def test_policy_file_that_inflates_past_the_cap_is_refused_before_torch_reads_it(tmp_path, monkeypatch):
    """torch reads a policy.pt whose members are deflated: a few KB on disk can inflate to gigabytes. The members'
    sizes are summed from the zip's directory first, against the cap of the .npz files (MAX_ARRAY_ELEMENTS numbers
    of 8 bytes, and 1 MB for the names), smaller here."""
    import zipfile

    import torch

    import flowgym.agents.learned as learned

    d = _copy(tmp_path)
    state = torch.load(d / "policy.pt", weights_only=True)
    torch.save({**state, "junk": torch.zeros(1 << 20)}, tmp_path / "plain.pt")  # 4 MB of zeros
    with zipfile.ZipFile(tmp_path / "plain.pt") as src, zipfile.ZipFile(d / "policy.pt", "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
    assert (d / "policy.pt").stat().st_size < 100_000
    monkeypatch.setattr(learned, "MAX_ARRAY_ELEMENTS", 1 << 16)  # a cap of 512 KB + 1 MB

    def refuse(*a, **k):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(ValueError, match=r"policy.pt in .* holds 4\d{6} bytes uncompressed, more than 1572864 "
                       r"\(65536 numbers of 8 bytes and 1048576 for the names\); nothing in it was read"):
        learned.LearnedBudget(str(d))


@needs_sb3
def test_policy_file_size_is_the_sum_of_its_members_and_the_cap_itself_is_allowed(tmp_path, monkeypatch):
    """Two members each under the cap but over it together are refused (a sum, not the largest); a file exactly at
    the cap loads."""
    import zipfile

    import torch

    import flowgym.agents.learned as learned

    d = _copy(tmp_path)
    size = sum(i.file_size for i in zipfile.ZipFile(d / "policy.pt").infolist())
    numbers = learned.MAX_ARRAY_ELEMENTS * 8  # the cap is this plus POLICY_INDEX_BYTES, set below to land on a size
    monkeypatch.setattr(learned, "POLICY_INDEX_BYTES", size - numbers)
    learned.LearnedBudget(str(d))  # exactly at the cap
    monkeypatch.setattr(learned, "POLICY_INDEX_BYTES", size - 1 - numbers)
    with pytest.raises(ValueError, match=rf"holds {size} bytes uncompressed, more than {size - 1}"):
        learned.LearnedBudget(str(d))
    state = torch.load(d / "policy.pt", weights_only=True)
    torch.save({**state, "a": torch.zeros(1 << 14), "b": torch.zeros(1 << 14)}, d / "policy.pt")  # 64 KB each
    two = sum(i.file_size for i in zipfile.ZipFile(d / "policy.pt").infolist())
    monkeypatch.setattr(learned, "POLICY_INDEX_BYTES", two - (1 << 15) - numbers)  # above each member, below the sum
    with pytest.raises(ValueError, match=rf"holds {two} bytes uncompressed"):
        learned.LearnedBudget(str(d))


@needs_sb3
@pytest.mark.parametrize("kind,what", [("sparse", "a torch.sparse_coo tensor"), ("meta", "a tensor on device 'meta'")])
def test_sparse_and_meta_tensors_are_refused_by_name(tmp_path, kind, what):
    import torch

    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    state = torch.load(d / "policy.pt", weights_only=True)
    key = next(iter(state))
    state[key] = state[key].to_sparse() if kind == "sparse" else torch.empty(state[key].shape, device="meta")
    torch.save(state, d / "policy.pt")
    with pytest.raises(ValueError, match=rf"policy.pt in .*: tensor '{re.escape(key)}' is {what}; expected dense"):
        LearnedBudget(str(d))


@needs_sb3
def test_an_integer_too_long_to_read_is_named_as_not_json(tmp_path):
    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    text = (d / "flowgym_agent.json").read_text().rstrip()
    (d / "flowgym_agent.json").write_text(text[:-1] + ', "x": ' + "1" * 5000 + "}")  # Python reads 4300 digits
    with pytest.raises(ValueError, match=r"flowgym_agent.json in .* is not JSON \(ValueError: Exceeds the limit"):
        LearnedBudget(str(d))


@needs_sb3
@pytest.mark.parametrize("value, says", [
    ("int", "does not hold a mapping of names to tensors"),
    ("int64", "holds torch.int64 values; expected real floating-point weights"),
    ("complex", "holds torch.complex64 values; expected real floating-point weights"),
])
def test_policy_tensors_must_be_real_floats(tmp_path, value, says):
    import torch

    from flowgym.agents.learned import LearnedBudget

    d = _copy(tmp_path)
    state = torch.load(d / "policy.pt", weights_only=True)
    key = next(iter(state))
    state[key] = {"int": 3, "int64": state[key].to(torch.int64),
                  "complex": state[key].to(torch.complex64)}[value]
    torch.save(state, d / "policy.pt")
    with pytest.raises(ValueError, match=re.escape(says)):
        LearnedBudget(str(d))
