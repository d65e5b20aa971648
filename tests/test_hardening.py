"""Hostile inputs get named errors (issue: hardening); each case failed before its fix."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib

import gymnasium as gym
import numpy as np
import pytest

import flowgym
from flowgym.sim.rates import make_rate
from flowgym.sim.workloads import MAX_ARRIVAL, MAX_TOKENS, EmpiricalLengths, Trace, TraceError, make_workload


@pytest.mark.parametrize("args, match", [
    (([0], [5e18], [5e18]), r"column 'prompt_len', index 0: .* too large for a length \(at most 1099511627776\)"),
    (([1e19], [5], [5]), r"column 'arrival', index 0: .* too large for an arrival"),
    (([0], [2**70], [5]), r"column 'prompt_len', index 0: .* too large for a length"),
    (([0], [5], [MAX_TOKENS + 1]), r"column 'output_len'.*too large"),
])
def test_values_beyond_int64_arithmetic_are_refused(args, match):
    with pytest.raises(TraceError, match=match):
        Trace(*args)


def test_largest_allowed_values_still_load():
    tr = Trace([MAX_ARRIVAL], [MAX_TOKENS], [MAX_TOKENS])
    assert int(tr.prompt_len[0]) + int(tr.output_len[0]) == 2**41  # no overflow


def test_class_and_pair_lengths_bounded():
    with pytest.raises(ValueError, match=r"classes\[1\] output_len .* too large for a length"):
        make_workload({"kind": "poisson", "classes": [[1, 2], [3, 2**50]], "rates": 1.0})
    with pytest.raises(ValueError, match=r"pairs\[0\] prompt_len .* too large"):
        EmpiricalLengths([[2**41, 1]])


def test_ragged_pairs_named():
    with pytest.raises(ValueError, match=r"pairs\[1\] must be a \(prompt_len, output_len\) pair, got \[3\]"):
        EmpiricalLengths([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"pairs\[0\] must be a \(prompt_len, output_len\) pair"):
        make_workload({"kind": "iid", "rate": 1.0, "lengths": {"kind": "empirical", "pairs": ["ab"]}})


@pytest.mark.parametrize("phase", [float("nan"), float("inf"), "x", None, True])
def test_sinusoid_phase_named(phase):
    with pytest.raises(ValueError, match="phase must be a finite number"):
        make_rate({"kind": "sinusoid", "mean": 2.0, "amplitude": 1.0, "period": 10.0, "phase": phase})


def test_csv_encodings(tmp_path):
    latin = tmp_path / "latin1.csv"
    latin.write_bytes(b"arrival,prompt_len,output_len\n0,3,4\n1,2,5\n2,\xe9,4\n")
    with pytest.raises(TraceError, match=r"latin1.csv', row 4: byte b'\\xe9' is not UTF-8 text"):
        Trace.from_csv(latin)
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffarrival,prompt_len,output_len\n0,3,4\n".encode())
    assert len(Trace.from_csv(bom)) == 1  # the byte-order mark is not part of the first column's name


def test_step_after_the_end_raises_until_reset():
    env = gym.make("FlowControl-v0", horizon=3)
    env.reset(seed=0)
    for _ in range(3):
        _, _, te, tr, _ = env.step(1)
    assert tr and not te
    T = env.unwrapped.metrics()["T"]
    with pytest.raises(RuntimeError, match=r"episode has ended .* call reset\(\)"):
        env.step(1)
    assert env.unwrapped.metrics()["T"] == T  # nothing moved
    env.reset(seed=1)
    env.step(1)  # a new episode steps again
    finite = flowgym.FlowControlEnv(workload=Trace([0], [2], [2]), horizon=None, M=100)
    finite.reset(seed=0)
    done = False
    while not done:
        _, _, te, tr, _ = finite.step(1)
        done = te or tr
    assert te
    with pytest.raises(RuntimeError, match="episode has ended"):
        finite.step(1)


def test_vector_env_keeps_autoresetting():
    envs = gym.make_vec("FlowControl-v0", num_envs=2, horizon=3)
    envs.reset(seed=0)
    for _ in range(8):  # past the end of the episode: autoreset, no error
        envs.step(np.ones(2, np.int64))


def test_idle_gaps_cost_one_chunk_whatever_their_length():
    """Unix-epoch timestamps and a 1e8 s gap: reset and the run return at once (chunk by chunk took minutes)."""
    import time

    tr = Trace([1.7e9, 1.7e9 + 1.0, 1.7e9 + 1e8], [5, 6, 7], [3, 4, 5], timed=True)
    env = flowgym.FlowControlEnv(workload=tr, horizon=None, M=1000, time_model="llama2-70b-tp2-a100")
    t0 = time.perf_counter()
    env.reset(seed=0)
    done = False
    while not done:
        _, _, te, tr_, _ = env.step(4)
        done = te or tr_
    assert time.perf_counter() - t0 < 5.0
    log = env.request_log()
    assert (log["finish"] >= 0).all() and log["finish_time"][2] > 1.7e9 + 1e8  # served when they came
    # the same trace shifted to start at 0 gives the same latencies
    shifted = Trace([0.0, 1.0, 1e8], [5, 6, 7], [3, 4, 5], timed=True)
    ref = flowgym.FlowControlEnv(workload=shifted, horizon=None, M=1000, time_model="llama2-70b-tp2-a100")
    ref.reset(seed=0)
    done = False
    while not done:
        _, _, te, tr_, _ = ref.step(4)
        done = te or tr_
    a, b = env.request_log(), ref.request_log()
    np.testing.assert_allclose(a["finish_time"] - a["arrival_time"], b["finish_time"] - b["arrival_time"], atol=1e-5)


@pytest.mark.parametrize("coef", ["c0", "c_prefill", "c_decode", "c_kv"])
def test_absurd_time_scales_named(coef):
    spec = {"kind": "linear", "c0": 0.03, coef: 1e300}
    with pytest.raises(ValueError, match=rf"latency coefficient {coef} = 1e\+300 seconds is beyond"):
        flowgym.FlowControlEnv(time_model=spec, workload={"kind": "iid", "rate": 1.0, "timed": True,
                                                           "lengths": {"kind": "lmsys-like"}})
    with pytest.raises(ValueError, match="beyond any serving system"):
        flowgym.FlowControlEnv(time_model={"kind": "linear", "c0": 1e6},
                               workload={"kind": "iid", "rate": 1.0, "timed": True, "lengths": {"kind": "lmsys-like"}})


def test_sync_fallback_vector_env_checks_every_action_first():
    from flowgym.envs.vector import FlowControlSyncVectorEnv

    envs = gym.make_vec("FlowControl-v0", num_envs=2, queue_order="estimate", eviction="estimate")
    assert isinstance(envs, FlowControlSyncVectorEnv)
    envs.reset(seed=0)
    t_before = [e.unwrapped.engine.t for e in envs.envs]
    with pytest.raises(ValueError, match=r"env 1: action np.int64\(-3\) is not in the action space"):
        envs.step(np.array([2, -3]))
    assert [e.unwrapped.engine.t for e in envs.envs] == t_before  # env 0 did not step
    envs.step(np.array([2, 3]))
    assert [e.unwrapped.engine.t for e in envs.envs] == [t + 1 for t in t_before]


def test_sizes_that_cannot_fit_are_named_before_allocating():
    import resource

    with pytest.raises(ValueError, match=r"rates: 3e\+07 requests per slot is beyond what the simulator can hold"):
        make_workload({"kind": "poisson", "classes": [[1, 1], [1, 2], [1, 3]], "rates": 1e7})
    with pytest.raises(ValueError, match=r"rate: 1e\+06 requests per second is beyond"):
        make_workload({"kind": "iid", "rate": 1e6, "timed": True, "lengths": {"kind": "lmsys-like"}})
    with pytest.raises(TraceError, match=r"column 'cls', index 1: class id 1000000000000 is too large"):
        Trace([0, 1], [3, 3], [4, 4], cls=[0, 10**12])
    # a huge KV budget with a bounded workload: the completion calendar follows the longest output
    env = gym.make("FlowControl-v0", M=2**40, horizon=10)
    env.reset(seed=0)
    env.step(3)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # KiB: well under 4 GiB


# --------------------------------------------------------------------------- model directories that cannot run code

from _requires import needs_sb3  # noqa: E402


class _Payload:
    """Unpickling this creates a marker file: proof that loading ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _model_copy(tmp_path, source="examples/ppo_default", name="model"):
    """A copy of the model directory ``source`` (relative to the repository, or absolute) at ``tmp_path / name``."""
    import shutil

    dst = tmp_path / name
    shutil.copytree(pathlib.Path(__file__).resolve().parent.parent / source, dst)
    return dst


@needs_sb3
def test_shipped_model_loads_without_pickle(tmp_path, monkeypatch):
    import pickle

    from flowgym.agents.learned import LearnedBudget

    def refuse(*a, **k):
        raise AssertionError("pickle.load was called")

    monkeypatch.setattr(pickle, "load", refuse)
    agent = LearnedBudget(str(_model_copy(tmp_path)))
    assert agent.meta["format"] == 2 and agent.budget_levels is not None


@needs_sb3
def test_crafted_policy_file_is_refused_without_running_it(tmp_path):
    import torch

    from flowgym.agents.learned import LearnedBudget

    d = _model_copy(tmp_path)
    marker = tmp_path / "ran"
    torch.save({"weights": _Payload(str(marker))}, d / "policy.pt")
    with pytest.raises(ValueError, match="policy.pt in .* is not a file of plain tensors; nothing in it was run") as e:
        LearnedBudget(str(d))
    assert not marker.exists() and "\x1b" not in str(e.value)


def _pickle_only_copy(tmp_path):
    """A model directory with SB3's pickle files only, whose ``vecnormalize.pkl`` creates ``marker`` if unpickled."""
    import pickle

    d = _model_copy(tmp_path)
    (d / "policy.pt").unlink()
    marker = tmp_path / "ran"
    with open(d / "vecnormalize.pkl", "wb") as fh:
        pickle.dump(_Payload(str(marker)), fh)
    return d, marker


@needs_sb3
def test_pickle_only_directory_needs_trust(tmp_path):
    from flowgym.agents.learned import LearnedBudget

    d, marker = _pickle_only_copy(tmp_path)
    with pytest.raises(ValueError, match=r"pickle-based files .* trust=True"):
        LearnedBudget(str(d))
    assert not marker.exists()


@needs_sb3
def test_foreign_algorithm_module_is_not_imported(tmp_path):
    import json
    import sys

    from flowgym.agents.learned import LearnedBudget

    d = _model_copy(tmp_path)
    (tmp_path / "evil_algo.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\nclass Algo: pass\n")
    meta = json.loads((d / "flowgym_agent.json").read_text())
    meta.update(algo="evil", algo_class="evil_algo:Algo")
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ValueError, match=r"algorithm 'evil' .* not one of .*trust=True"):
            LearnedBudget(str(d))
    finally:
        sys.path.remove(str(tmp_path))
    assert not (tmp_path / "ran").exists()


@needs_sb3
def test_normalisation_with_objects_is_refused(tmp_path):
    from flowgym.agents.learned import LearnedBudget

    d = _model_copy(tmp_path)
    np.savez(d / "normalization.npz", obs_low=np.zeros(3), obs_high=np.array([_Payload("x")], dtype=object))
    with pytest.raises(ValueError, match="normalization.npz in .* is not a plain array file"):
        LearnedBudget(str(d))


def test_a_crafted_or_broken_ars_model_is_refused_by_file_and_array(tmp_path):
    """The ARS model files (plain ``.npz``): a file that is no zip archive, a lone ``.npy``, a truncated
    archive, a member that is no array, a 2-D epsilon, a normalisation array the loader has no use for, a
    small file whose header asks for a huge array (refused before it is allocated), a missing file, and a
    ``flowgym_agent.json`` whose observation or anchor does not fit: each a ``ValueError`` naming the file."""
    import contextlib
    import io
    import json
    import zipfile

    from flowgym.agents.learned import MAX_ARRAY_ELEMENTS, LearnedBudget

    src = pathlib.Path(__file__).resolve().parents[1] / "flowgym" / "data" / "models" / "generalist"

    def copy(name):
        return _model_copy(tmp_path, "flowgym/data/models/generalist", name)

    def refused(d, match):
        with pytest.raises(ValueError, match=match):
            LearnedBudget(str(d))

    d = copy("garbage")
    (d / "policy.npz").write_bytes(b"PK\x03\x04garbage" * 10)
    refused(d, r"policy.npz in .* is not a plain array file \(BadZipFile")
    d = copy("truncated")
    (d / "policy.npz").write_bytes((src / "policy.npz").read_bytes()[:300])
    refused(d, r"policy.npz in .* is not a plain array file")
    d = copy("lone")
    with open(d / "policy.npz", "wb") as fh:
        np.save(fh, np.zeros(3))
    refused(d, r"policy.npz in .* is not a plain array file \(not an .npz archive")
    d = copy("member")
    with zipfile.ZipFile(d / "policy.npz", "a") as z:
        z.writestr("evil.txt", "hello")
    refused(d, r"policy.npz in .*: 'evil.txt' is no array")
    with np.load(src / "normalization.npz") as z:
        norm = dict(z)
    d = copy("eps")
    np.savez(d / "normalization.npz", **{**norm, "epsilon": np.array([[1e-8]])})
    refused(d, r"normalization.npz in .*: epsilon must be one finite number >= 0 .*\(0-d arrays\)")
    d = copy("extra")
    np.savez(d / "normalization.npz", **norm, zz=np.zeros(4))
    refused(d, r"normalization.npz in .* holds arrays \['zz'\] that it has no use for")
    d = copy("huge")
    with np.load(src / "policy.npz") as z:
        np.savez_compressed(d / "policy.npz", **dict(z), w9=np.zeros(MAX_ARRAY_ELEMENTS + 1, np.uint8))
    assert (d / "policy.npz").stat().st_size < 100_000  # a small file asking for 16.8M numbers
    refused(d, rf"policy.npz in .*: 'w9' has shape \({MAX_ARRAY_ELEMENTS + 1},\), more than {MAX_ARRAY_ELEMENTS}")
    d = copy("many")  # arrays each under the cap, with names a layer may have: refused by their total, unread
    half = np.zeros(MAX_ARRAY_ELEMENTS // 2 + 1, np.uint8)
    with np.load(src / "policy.npz") as z:
        np.savez_compressed(d / "policy.npz", **dict(z), w5=half, b5=half, w6=half)
    refused(d, rf"policy.npz in .*: its arrays hold more than {MAX_ARRAY_ELEMENTS} numbers together \(up to 'b5'\)")
    d = copy("names")  # a name no layer or memory has is refused before anything is read
    with np.load(src / "policy.npz") as z:
        np.savez_compressed(d / "policy.npz", **dict(z), junk0=half)
    refused(d, r"policy.npz in .* holds arrays \['junk0'\] that it has no use for")
    d = copy("missing")
    (d / "policy.npz").unlink()
    refused(d, r"policy.npz in .* is missing")
    for name, key, value, match in (("obs", "observation", "load", r"observation='load' has 17 features, but "
                                     r"observation_shape=\[20\]"),
                                    ("anchor", "multiplier_of", "zzz", r"multiplier_of='zzz'; expected one of"),
                                    ("obslist", "observation", ["load-v2"],
                                     r"observation=\['load-v2'\]; expected a name")):
        d = copy(name)
        meta = json.loads((d / "flowgym_agent.json").read_text())
        meta["agent_env_options"][key] = value
        (d / "flowgym_agent.json").write_text(json.dumps(meta))
        refused(d, rf"flowgym_agent.json in .*: agent_env_options {match}")
    # what is checked is what is read: a member under the bare name beside a small "w9.npy" (np.load would read
    # the bare one), a sub-array type or an 8-byte-plus type (a count of 1 hiding 25M numbers or 200 MB), a lone
    # .npy with an empty zip after it (np.load goes by the first bytes); none is read before its refusal
    def npy(descr, shape, body=b""):
        head = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
        head += b" " * (63 - (10 + len(head)) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head + body

    for case, members, match in (
            ("bare", {"w9.npy": npy("|u1", (1,), b"\0"), "w9": npy("|u1", (1 << 26,))}, r": 'w9' is no array"),
            ("again", {"w0.npy": npy("<f8", (1,), bytes(8))}, r" holds the arrays \['w0'\] more than once"),
            ("subarray", {"w9.npy": npy(("<f8", (5000, 5000)), (1,))}, r": 'w9' holds \('<f8', \(5000, 5000\)\) values"),
            ("wide", {"w9.npy": npy("<U50000000", (1,))}, r": 'w9' holds <U50000000 values")):
        d = copy(case)
        with zipfile.ZipFile(d / "policy.npz", "a") as z, (  # a second w0.npy: zipfile warns, and writes it
                pytest.warns(UserWarning, match="Duplicate name") if case == "again" else contextlib.nullcontext()):
            for member, data in members.items():
                z.writestr(member, data)
        refused(d, rf"policy.npz in .*{match}")
    d = copy("npyzip")
    lone, empty = io.BytesIO(), io.BytesIO()
    np.save(lone, np.zeros(3))
    zipfile.ZipFile(empty, "w").close()
    (d / "policy.npz").write_bytes(lone.getvalue() + empty.getvalue())
    refused(d, r"policy.npz in .* is not a plain array file \(not an .npz archive")
    LearnedBudget(str(copy("intact")))  # the copies' source loads


@needs_sb3
def test_trust_must_be_a_real_bool_so_a_string_never_unpickles(tmp_path):
    from flowgym.lab.evaluation import build_agent
    from flowgym.lab.scenarios import AgentSpec

    d, marker = _pickle_only_copy(tmp_path)
    for text in ("False", "no", "0"):  # what a command line or a scenario file could give as a string
        spec = AgentSpec.parse(f"learned:path={d},trust={text}")
        with pytest.raises(ValueError, match="trust must be true or false"):
            build_agent(spec)
    assert not marker.exists()


@needs_sb3
def test_policy_tensors_must_be_finite_real_and_sized_by_the_file(tmp_path):
    import json

    import torch

    from flowgym.agents.learned import LearnedBudget

    d = _model_copy(tmp_path)
    good = torch.load(d / "policy.pt", weights_only=True)
    name = next(k for k, v in good.items() if v.ndim == 2)
    for bad, match in ((float("nan"), "non-finite"), (float("inf"), "non-finite")):
        state = dict(good)
        state[name] = good[name].clone().fill_(bad)
        torch.save(state, d / "policy.pt")
        with pytest.raises(ValueError, match=f"tensor {name!r} holds a {match} value"):
            LearnedBudget(str(d))
    state = dict(good)
    state[name] = good[name].to(torch.complex64)
    torch.save(state, d / "policy.pt")
    with pytest.raises(ValueError, match=f"tensor {name!r} holds torch.complex64 values"):
        LearnedBudget(str(d))
    # an empty matrix divides every action size: it must not let the JSON's action_n choose the allocation
    torch.save({**good, "zero": torch.zeros(0, 64)}, d / "policy.pt")
    meta = json.loads((d / "flowgym_agent.json").read_text())
    meta.update(action_n=1_000_000, budget_levels=None)
    (d / "flowgym_agent.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="the action has size 1000000 .* which no weight matrix outputs"):
        LearnedBudget(str(d))


def _ars_copy(tmp_path):
    from flowgym.agents.learned import DEFAULT_MODEL

    return _model_copy(tmp_path, DEFAULT_MODEL, "ars")  # an absolute source: the shipped generalist as installed


def _edit_meta(d, **changes):
    import json

    meta = json.loads((d / "flowgym_agent.json").read_text())
    for k, v in changes.items():
        if k == "agent_env_options" and isinstance(v, dict) and v.pop("_merge", False):
            v = {**meta[k], **v}
        meta[k] = v
    (d / "flowgym_agent.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("changes, match", [
    ({"agent_env_options": {"_merge": True, "engine": "vllm-v1"}},
     r"agent_env_options holds \['engine'\], which a learned agent may not set"),
    ({"agent_env_options": {"_merge": True, "time_model": "llama2-70b-tp2-a100"}}, r"holds \['time_model'\]"),
    ({"agent_env_options": [1, 2]}, r"agent_env_options=\[1, 2\]; expected an object"),
    ({"agent_env_options": {"_merge": True, "max_budget": "256"}}, r"max_budget='256'; expected a positive integer"),
    # every value as the environment checks it, at load (not first when an environment is built from it)
    ({"agent_env_options": {"_merge": True, "rate_window": 0}},
     r"flowgym_agent.json in .*: agent_env_options rate_window must be a positive finite number, got 0"),
    ({"agent_env_options": {"_merge": True, "multipliers": [0.5, -1]}},
     r"flowgym_agent.json in .*: agent_env_options multipliers must be a list of positive numbers"),
    ({"agent_env_options": {"_merge": True, "rate_window": 10**400}},
     r"flowgym_agent.json in .*: agent_env_options rate_window must be a positive finite number"),
    # bad in either clock beside a rate_window valid only in seconds: the bad field is named, not rate_window
    ({"agent_env_options": {"_merge": True, "rate_window": 0.5, "eviction": "nope"}},
     r"flowgym_agent.json in .*: agent_env_options eviction must be one of"),
    ({"agent_env_options": {"_merge": True, "eviction": "nope"}},
     r"flowgym_agent.json in .*: agent_env_options eviction must be one of \['all', 'estimate', 'lifo'\], got 'nope'"),
    ({"observation_shape": 20}, r"observation_shape=20; expected a list of positive integers"),
    ({"observation_shape": [20.9]}, r"observation_shape=\[20.9\]"),
    ({"format": 99}, r"format=99; this flowgym reads formats 1 to 2"),
    ({"format": "2"}, r"format='2'"),
    ({"layer_sizes": [20, 8, 2]}, r"layer_sizes=\[20, 8, 2\], but the weights in policy.npz have layer sizes \[20, 2\]"),
    ({"action_space": {"kind": "box", "low": [-5, -5], "high": [5, 5]}}, r"a log-multiplier action is the box \[-1, 1\]"),
])
def test_model_json_fields_are_checked_by_name(tmp_path, changes, match):
    from flowgym.agents.learned import LearnedBudget

    d = _ars_copy(tmp_path)
    _edit_meta(d, **changes)
    with pytest.raises(ValueError, match=match):
        LearnedBudget(str(d))


def test_a_model_whose_options_hold_in_continuous_time_only_loads(tmp_path):
    """A model declares no clock: a rate window of half a second (below the slot model's 1) is a valid option of a
    model trained in continuous time, so it loads; the environment it meets is compared at reset."""
    from flowgym.agents.learned import LearnedBudget
    from flowgym.envs.flow_control import FlowControlConfig

    d = _ars_copy(tmp_path)
    _edit_meta(d, agent_env_options={"_merge": True, "rate_window": 0.5})
    agent = LearnedBudget(str(d))
    assert agent.requires["rate_window"] == 0.5
    with pytest.raises(ValueError, match=r"was trained with rate_window=0.5; this environment has rate_window=32"):
        agent.reset(FlowControlConfig(**{**agent.requires, "rate_window": 32.0}))


def test_an_upper_case_array_algorithm_name_still_loads_with_numpy(tmp_path):
    from flowgym.agents.learned import LearnedBudget

    d = _ars_copy(tmp_path)
    _edit_meta(d, algo="ARS")
    assert LearnedBudget(str(d)).continuous


def test_degenerate_normalisation_and_huge_weights_are_named(tmp_path):
    from flowgym.agents.learned import LearnedBudget
    from flowgym.lab.evaluation import run_episode

    d = _ars_copy(tmp_path)
    norm = dict(np.load(d / "normalization.npz"))
    np.savez(d / "normalization.npz", **{**norm, "obs_var": np.zeros_like(norm["obs_var"]), "epsilon": np.float64(0)})
    with pytest.raises(ValueError, match=r"obs_var\[0\] \+ epsilon is 0"):
        LearnedBudget(str(d))
    np.savez(d / "normalization.npz", **{**norm, "obs_low": np.full_like(norm["obs_low"], np.nan)})
    with pytest.raises(ValueError, match="obs_low and obs_high must be numbers with obs_low <= obs_high"):
        LearnedBudget(str(d))
    np.savez(d / "normalization.npz", **norm)
    w = dict(np.load(d / "policy.npz"))
    np.savez(d / "policy.npz", **{**w, "w0": np.full_like(w["w0"], 1e308)})  # finite, but overflows on any input
    agent = LearnedBudget(str(d))
    env = {"M": 4000, "workload": {"kind": "poisson", "classes": [[10, 20]], "rates": 1.0}, "horizon": 20,
           "output_length_known": False}
    with pytest.raises(ValueError, match="gave the non-finite action"):
        run_episode(agent, env, 0, 20)


# --------------------------------------------------------------------------- large traces


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="needs pyarrow: pip install -e '.[fastcsv]' in the flowgym checkout")
def test_fast_csv_reader_gives_the_reference_trace(tmp_path, monkeypatch):
    import flowgym.sim.workloads as wl

    rng = np.random.default_rng(5)
    n = 5000
    a = np.sort(rng.integers(0, 10_000, n))
    lines = ["\ufeffarrival,prompt_len,output_len,cls"]
    for i in range(n):
        lines.append(f"{a[i]},{rng.integers(1, 500)},{rng.integers(1, 900)},{rng.integers(0, 4)}")
        if i % 997 == 0:
            lines.append("")  # blank lines are skipped by both readers
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast = Trace.from_csv(path, cls_column="cls")
    assert wl._csv_columns_arrow(str(path), {"arrival": "arrival"}) is not None  # the fast path ran
    monkeypatch.setattr(wl, "_csv_columns_arrow", lambda *a: None)
    ref = Trace.from_csv(path, cls_column="cls")
    for k in ("arrival", "prompt_len", "output_len", "cls", "row"):
        np.testing.assert_array_equal(getattr(fast, k), getattr(ref, k))
    assert fast.to_spec() == ref.to_spec()
    # a bad value: the same message, naming the row (counted as the csv module counts it)
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival,prompt_len,output_len\n0,3,4\n\n1,-2,5\n")
    monkeypatch.undo()
    with pytest.raises(TraceError, match=r"column 'prompt_len', row 4: '-2' must be at least 1"):
        Trace.from_csv(bad)


def test_zero_rate_steps_never_give_a_negative_poisson_mean():
    """Found by the learned-budget experiments: a periodic schedule with a zero-rate step rounded a
    window's expected arrivals to -3e-11 after some cycles, and numpy's Poisson sampler raised."""
    from flowgym.sim.rates import make_rate

    s = make_rate({"kind": "steps", "times": [0.0, 1247.0, 2962.0], "rates": [0.0, 20.691136563360363, 0.0],
                   "period": 4505.0})
    edges = np.arange(0, 50_001, dtype=np.float64)
    assert (s.integral(edges[:-1], edges[1:]) >= 0).all()
    wl = make_workload({"kind": "iid", "rate": s.to_spec(), "lengths": {"kind": "empirical", "pairs": [[2, 3]]}})
    rng = np.random.default_rng(0)
    for t0 in range(0, 50_000, 256):
        wl.sample(rng, t0, t0 + 256)


def test_outputs_too_long_to_schedule_are_named():
    """Found by tests/test_fuzz.py: an output of 2**31 tokens with M = 2**31 sized a 32 GiB calendar."""
    tr = Trace([0], [1], [2**31])
    with pytest.raises(ValueError, match=r"outputs of up to 2147483648 tokens .* at most 16777216 tokens"):
        flowgym.FlowControlEnv(workload=tr, M=2**31, horizon=None)
    with pytest.raises(ValueError, match="outputs of up to"):
        gym.make_vec("FlowControl-v0", num_envs=2, M=2**31,
                     workload={"kind": "poisson", "classes": [[1, 2**30]], "rates": 0.1})


# --------------------------------------------------------------------------- the environment layer (a review, 2026-11-28)


def test_sync_vector_env_refuses_a_batch_of_the_wrong_size_before_any_env_steps():
    """The fallback vector env checked actions with a plain zip: a short batch stepped some environments, then
    Gymnasium raised a raw zip error, leaving the environments out of step."""
    v = gym.make_vec("FlowControl-v0", num_envs=3, horizon=20, record="stream")  # not batchable: the fallback
    assert v.backend == "sync"
    v.reset(seed=0)
    for bad in (np.array([1, 2]), np.array([1, 2, 3, 4]), 3, None):
        with pytest.raises(ValueError, match=r"a batch of 3 actions"):
            v.step(bad)
    assert [e.unwrapped.engine.t for e in v.envs] == [0, 0, 0]  # nothing stepped
    v.step(np.array([1, 2, 3]))
    assert [e.unwrapped.engine.t for e in v.envs] == [1, 1, 1]


def test_config_instance_passes_its_objects_not_copies():
    """config=FlowControlConfig(...) deep-copied every field: a callable time_model holding a lock failed with a
    raw pickling error, and a stateful one was silently replaced by a copy."""
    import threading

    from flowgym.envs.flow_control import FlowControlConfig, FlowControlEnv

    class Lat:
        def __init__(self) -> None:
            self.lock, self.calls = threading.Lock(), 0

        def __call__(self, P, D, K, B):
            self.calls += 1
            return 0.02

    lat = Lat()
    wl = {"kind": "iid", "rate": 2.0, "lengths": {"kind": "empirical", "pairs": [[10, 10]], "weights": [1.0]},
          "timed": True}
    env = FlowControlEnv(config=FlowControlConfig(workload=wl, time_model=lat, horizon=10))
    env.reset(seed=0)
    env.step(3)
    assert env.config.time_model is lat and lat.calls == 1


def test_randomized_env_unseeded_reset_draws_from_entropy():
    """RandomizedFlowControlEnv's sampler generator started at seed 0: every unseeded instance drew the same
    workloads (vectorised copies would train on N identical episodes)."""
    from flowgym.envs.randomized import RandomizedFlowControlEnv
    from flowgym.lab.distributions import RandomMix

    envs = [RandomizedFlowControlEnv(RandomMix(horizon=50), observation="load", action="multiplier") for _ in range(3)]
    drawn = [e.reset()[1]["config"] for e in envs]
    assert not drawn[0] == drawn[1] == drawn[2]  # three entropy draws agreeing: a one in billions chance
    assert envs[0].reset(seed=3)[1]["config"] == envs[1].reset(seed=3)[1]["config"]  # a seed still decides


@pytest.mark.parametrize("method", ["view", "metrics", "request_log", "series", "render"])
def test_results_before_reset_are_refused_by_name(method):
    from flowgym.envs.flow_control import FlowControlEnv

    env = FlowControlEnv(render_mode="ansi")
    with pytest.raises(RuntimeError, match=rf"call reset\(\) before {method}\(\)"):
        getattr(env, method)()


def test_reward_weights_that_would_overflow_the_reward_are_refused():
    from flowgym.envs.flow_control import FlowControlEnv

    with pytest.raises(ValueError, match=r"reward_weights\['in_system'\] / reward_scale must be at most"):
        FlowControlEnv(reward_weights={"in_system": 1e300}, reward_scale=1e-10)
    # a partial dict: the defaults of the weights not listed (in_system = 1) count against the scale too
    with pytest.raises(ValueError, match=r"reward_weights\['in_system'\] / reward_scale .* \(its default"):
        FlowControlEnv(reward_weights={"completed": 1e-207}, reward_scale=1e-306)
    FlowControlEnv(reward_weights={"completed": 1e-207, "in_system": 0, "wasted_tokens": 0, "evictions": 0},
                   reward_scale=1e-306)  # every term listed and small: accepted
    env = FlowControlEnv(reward_weights={"completed": 1e99, "in_system": 1e99}, reward_scale=1.0, horizon=50)
    env.reset(seed=0)
    assert all(np.isfinite(env.step(4)[1]) for _ in range(50))


def test_sb3_vec_env_refuses_a_batch_of_the_wrong_shape():
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(3)
    venv.reset()
    for bad in (np.array([1, 2]), np.array([[1, 2, 3]]), np.array([1, 2, 3, 4])):
        with pytest.raises(ValueError, match=r"shape \(3,\) \(or \(3, 1\)\)"):
            venv.step(bad)
    venv.step(np.array([[1], [2], [3]]))  # SB3's (n_envs, 1) is accepted


def test_bool_budgets_are_refused_everywhere_by_name():
    from flowgym.envs.flow_control import FlowControlEnv

    env = FlowControlEnv()
    env.reset(seed=0)
    for bad in (True, np.bool_(False)):
        with pytest.raises(ValueError, match="not in the action space Discrete.*it holds a bool"):
            env.step(bad)
    pc = FlowControlEnv(workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 0.5},
                        per_class_budget=True, output_length_known=True)
    pc.reset(seed=0)
    for bad in ([True, 2, 3], np.array([True, False, True])):
        with pytest.raises(ValueError, match="not in the action space MultiDiscrete.*it holds a bool"):
            pc.step(bad)
    v = gym.make_vec("FlowControl-v0", num_envs=3, horizon=20)
    assert v.backend == "batched"
    v.reset(seed=0)
    with pytest.raises(ValueError, match="actions must be an integer array"):
        v.step([True, 2, 3])
    with pytest.raises(ValueError, match="actions must be an integer array.*it holds a bool"):
        v.step([np.array(True), 2, 3])  # a 0-d bool array in a list: asarray would make it 1


def test_bool_budgets_are_refused_by_the_sb3_adapter_and_the_log_multiplier_action():
    from flowgym.envs.flow_control import FlowControlEnv

    env = FlowControlEnv(observation="load-v2", action="log-multiplier", multipliers=[0.5, 4.0], multiplier_of="max")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action \[True, 0.5\] is not in the action space Box.*it holds a bool"):
        env.step([True, 0.5])  # the message shows the action given, not None
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(3)
    venv.reset()
    for bad in ([True, 2, 3], np.array([True, False, True])):
        with pytest.raises(ValueError, match="it holds a bool"):
            venv.step(bad)
    one = FlowControlSB3VecEnv(1)
    one.reset()
    one.step(np.int64(3))  # one environment: a single budget is taken, as reshape(1) took it
    one.step(np.array([3]))


def test_agent_variants_get_distinct_labels_and_a_label_key():
    """Two variants of one agent differ in label (a comparison refuses two rows of one label); any agent string
    takes ``label=`` as written; a learned agent's label must be a string."""
    from flowgym.agents import make_agent
    from flowgym.agents.learned import LearnedBudget
    from flowgym.lab.evaluation import evaluate
    from flowgym.lab.scenarios import AgentSpec

    pairs = [("sglang-reserve", {}, {"min_new_token_ratio_factor": 0.5}), ("sglang-reserve", {}, {"clip_max_new_tokens": 64}),
             ("mc", {}, {"max_budget": 8}), ("mc-sf", {}, {"max_budget": 8}), ("a-min", {}, {"max_budget": 8}),
             ("greedy-lifo", {}, {"max_budget": 8}), ("alpha-greedy", {}, {"max_budget": 8}),
             ("trt-no-evict", {}, {"max_budget": 8}), ("safe-budget", {}, {"cap": 64}), ("two-anchor", {}, {"cap": 64})]
    for name, p, q in pairs:
        assert make_agent(name, **p).label() != make_agent(name, **q).label(), (name, q)
    assert make_agent("mc", max_budget=8).label() == "mc max_budget=8"
    assert LearnedBudget(action_rule="mean").label() != LearnedBudget().label()
    spec = AgentSpec.parse("mc:max_budget=8,label=mc capped")
    assert spec.label == "mc capped" and spec.params == {"max_budget": 8}
    assert AgentSpec.parse("learned:label=5").params == {"label": "5"}  # as written: a string, never the number 5
    quoted = AgentSpec.parse('mc:label="mc, capped",max_budget=8')  # a comma inside quotes does not split
    assert quoted.label == "mc, capped" and quoted.params == {"max_budget": 8}
    with pytest.raises(ValueError, match="parameter 'label' is given twice"):
        AgentSpec.parse("mc:label=a,label=b")
    with pytest.raises(ValueError, match="learned agent: label must be a string, got 5"):
        LearnedBudget(label=5)
    for blank in ("", "  "):  # would fall back to the default label unseen
        with pytest.raises(ValueError, match="learned agent: label is empty"):
            LearnedBudget(label=blank)
    kw = {"M": 2000, "workload": {"kind": "poisson", "classes": [[10, 20]], "rates": 0.3}, "output_length_known": True}
    table = evaluate([AgentSpec("mc"), AgentSpec.parse("mc:max_budget=1")], kw, [0], [50])
    assert table.agents == ["mc", "mc max_budget=1"]


@pytest.mark.parametrize("name, params, match", [
    ("flow-control", {"b": [1e30, 2, 3]}, r"per-class budgets b must be non-negative integers \(at most 1e\+09\)"),
    ("flow-control", {"b": [10**400, 2, 3]}, r"per-class budgets b must be non-negative integers"),
    ("schedule", {"times": [0, 5], "budgets": [1, 10**30]}, r"budgets must be non-negative integers \(at most 1e\+09\)"),
    ("schedule", {"times": [0, 10**400], "budgets": [1, 2]}, r"times must start at 0 and increase strictly, each finite"),
    ("schedule", {"times": [0, 5], "budgets": [1, 2], "period": 10**400}, r"period must be a number beyond the last"),
    ("safe-budget", {"k": 10**400}, r"k must be a positive finite number \(at most 1e\+12\)"),
    ("safe-budget", {"k": 1e308}, r"k must be a positive finite number \(at most 1e\+12\)"),
    ("two-anchor", {"k_rate": 1e308}, r"k_rate must be a positive finite number"),
    ("rate-switch", {"threshold": 10**400}, r"threshold \(arrivals per slot, or per second in continuous time\) must be a non-negative"),
    ("sglang-reserve", {"min_new_token_ratio_factor": 1.5}, r"min_new_token_ratio_factor must be a positive number \(at most 1\)"),
    ("rate-switch", {"high": -1}, r"^agent 'rate-switch': high must be an integer"),
])
def test_agent_parameters_out_of_range_are_named(name, params, match):
    from flowgym.agents import make_agent

    with pytest.raises(ValueError, match=match):
        make_agent(name, **params)


def test_make_agent_names_a_name_that_is_not_a_string():
    from flowgym.agents import make_agent

    with pytest.raises(ValueError, match=r"unknown agent \['mc'\]"):
        make_agent(["mc"])


def test_check_hostable_names_the_agent_when_its_environment_cannot_be_built():
    from flowgym.agents import make_agent
    from flowgym.lab.evaluation import check_hostable

    kw = {"M": 2000, "workload": {"kind": "poisson", "classes": [[10, 20], [10, 40]], "rates": 0.3},
          "per_class_budget": True, "output_length_known": True}
    with pytest.raises(ValueError, match=r"^agent 'safe-budget k=2' cannot run on this scenario: action='multiplier'"):
        check_hostable(make_agent("safe-budget"), kw)



def test_an_agents_option_given_as_a_list_by_the_scenario_is_the_same_option(tmp_path):
    """A scenario file writes ``multipliers`` as a list, the agent asks for a tuple (and a learned model for a
    list): the same values are no conflict; other values still are, named."""
    from flowgym.agents import make_agent
    from flowgym.lab.evaluation import env_for

    kw = {"M": 2000, "workload": {"kind": "poisson", "classes": [[10, 20]], "rates": 0.3}, "action": "multiplier",
          "multipliers": [2.0]}
    assert tuple(env_for(make_agent("safe-budget", k=2.0), kw, 10).config.multipliers) == (2.0,)
    with pytest.raises(ValueError, match=r"needs multipliers=\(1.5,\) but the scenario sets multipliers=\[2.0\]"):
        env_for(make_agent("safe-budget", k=1.5), kw, 10)
    learned = make_agent("learned")
    mult = tuple(learned.env_options()["multipliers"])
    two = {**kw, "action": "log-multiplier", "multipliers": mult, "multiplier_of": "max-head", "observation": "load-v2"}
    assert tuple(env_for(learned, two, 10).config.multipliers) == mult
    path = tmp_path / "ms.toml"
    path.write_text(_TINY.format(desc="x").replace('name = "mc"', 'name = "safe-budget"\nparams = {k = 2.0}')
                    .replace("horizon = 60", 'horizon = 60\naction = "multiplier"\nmultipliers = [2.0]'))
    from flowgym.lab.cli import main

    assert main(["compare", "--scenario", str(path), "--seeds", "1", "--horizons", "30", "--no-plots", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0


def test_evaluate_refuses_an_agent_whose_first_action_the_scenario_cannot_take_before_any_run():
    """Per-class budgets for two classes on a three-class workload: refused naming the agent before the first
    episode (as ``flowgym compare`` does), not inside an episode after the other agents ran."""
    from flowgym.agents import FlowControl, MemoryCheck
    from flowgym.lab.evaluation import evaluate

    kw = {"M": 1500, "workload": {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 0.3},
          "output_length_known": True}
    ran = []

    class Counting(MemoryCheck):
        def reset(self, config, seed=None):
            ran.append(seed)
            super().reset(config, seed=seed)

    with pytest.raises(ValueError, match=r"^agent 'flow-control b=\(4, 4\)' cannot run on this scenario"):
        evaluate([Counting(), FlowControl(b=[4, 4])], kw, seeds=[0, 1], horizons=[300])
    assert ran == [0]  # the check's one step, no episode


def test_agent_constructors_name_a_zero_dimensional_or_huge_parameter():
    from flowgym.agents import ScheduledBudget
    from flowgym.agents.production import GuaranteedNoEvict

    with pytest.raises(ValueError, match="^times must be a list"):
        ScheduledBudget(times=np.array(0), budgets=[1])
    with pytest.raises(ValueError, match="^budgets must be a list"):
        ScheduledBudget(times=[0], budgets=np.array(3))
    assert ScheduledBudget(times=np.array([0, 5]), budgets=np.array([3, 4])).label() == "schedule 0:3,5:4"
    with pytest.raises(ValueError, match="^max_num_requests must be an integer from 1 to 1e"):
        GuaranteedNoEvict(max_num_requests=10**100)
    with pytest.raises(ValueError, match="^max_num_requests must be an integer"):
        GuaranteedNoEvict(max_num_requests=0)
    assert GuaranteedNoEvict(max_num_requests=np.int64(4)).label() == "trt-no-evict n=4"


# --------------------------------------------------------------------------- the lab layer (CLI, files, outputs)

_TINY = """name = "tiny"
description = "{desc}"
[env]
M = 2000
horizon = 60
[env.workload]
kind = "poisson"
classes = [[10, 20]]
rates = 0.3
[[agents]]
name = "mc"
"""


@pytest.mark.parametrize("argv, match", [
    (["--no-tune", "--tune-seeds", "5"], "--tune-seeds has no effect: --no-tune"),
    (["--no-tune", "--tune-horizon", "7"], "--tune-horizon has no effect: --no-tune"),
    (["--agents", "mc", "--tune-seeds", "5"], "--tune-seeds has no effect: no agent of this line-up has a tuning"),
    (["--agents", "mc;mc"], r"agents with the same label \(or that may have it after tuning\): \['mc'\]"),
    (["--workers", "2"], "workers configures the process or ray backend"),
    (["--horizons", "1152921504606846976"], "must be a positive integer up to 2\\*\\*53"),
    (["--tune-horizon", "1" + "0" * 400], "--tune-horizon must be an integer <="),
])
def test_compare_refuses_flags_it_would_drop_or_cannot_run_and_leaves_no_folder(tmp_path, capsys, argv, match):
    from flowgym.lab.cli import main

    sc = tmp_path / "tiny.toml"
    sc.write_text(_TINY.format(desc="tiny"))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) if "--horizons" in argv or "--tune-horizon" in argv and "--no-tune" not in argv \
            else _nullcontext():
        assert main(["compare", "--scenario", str(sc), "--seeds", "1", "--no-plots", "--quiet", "--out", str(out),
                     *argv]) == 2
    assert match and __import__("re").search(match, capsys.readouterr().err)
    assert not out.exists()  # refused before the output folder is made


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


def test_compare_without_tuning_may_report_on_the_default_tuning_seeds(tmp_path, capsys):
    """Nothing tuned: the default tuning seeds 1000.. are not in use, so reporting on them is fine; the JSON
    records no tuning and every agent's parameters."""
    import json

    from flowgym.lab.cli import main

    sc = tmp_path / "tiny.toml"
    sc.write_text(_TINY.format(desc="tiny"))
    out = tmp_path / "out"
    assert main(["compare", "--scenario", str(sc), "--seeds", "1000-1001", "--no-plots", "--quiet", "--out", str(out),
                 "--agents", "mc;mc:max_budget=1,label=capped"]) == 0
    data = json.loads((out / "tiny.json").read_text())
    assert data["tune_seeds"] == [] and data["tune_horizon"] is None
    assert data["agent_specs"]["capped"] == {"name": "mc", "params": {"max_budget": 1}}
    header = (out / "tiny.csv").read_text().splitlines()[0].split(",")
    assert header[-3:] == ["T", "elapsed", "n"]  # the slots run and the clock at each horizon are kept


def test_scenario_description_with_an_index_or_attribute_in_braces_is_named(tmp_path):
    from flowgym.lab.scenarios import load_scenario

    for desc in ("x {rate[0]}", "x {rate.real.x}"):
        sc = tmp_path / "d.toml"
        sc.write_text(_TINY.format(desc=desc))
        with pytest.raises(ValueError, match=r"description: only \{rate\}"):
            load_scenario(sc)


def test_huge_numbers_in_scenario_files_and_seeds_are_named(tmp_path):
    from flowgym.lab.scenarios import load_scenario, parse_seeds

    big = "1" + "0" * 400
    sc = tmp_path / "h.toml"
    sc.write_text(_TINY.format(desc="x").replace("[env]\n", f"horizons = [{big}]\n[env]\n"))
    with pytest.raises(ValueError, match=r"horizons must be a non-empty array of positive integers \(up to 2\*\*53\)"):
        load_scenario(sc)
    sc.write_text(_TINY.format(desc="x") + f'[rate]\ndefault = {big}\nset = ["env.workload.rates"]\n')
    with pytest.raises(ValueError, match=r"rate.default must be a positive number"):
        load_scenario(sc)
    with pytest.raises(ValueError, match="seeds: a count must be from 1 to 1e\\+06"):
        parse_seeds("10000000000000")
    with pytest.raises(ValueError, match="is not a seed or a range"):
        parse_seeds("0-99999999999")


def test_scenario_agent_label_may_not_be_empty(tmp_path):
    from flowgym.lab.scenarios import load_scenario

    sc = tmp_path / "l.toml"
    sc.write_text(_TINY.format(desc="x") + 'label = ""\n')
    with pytest.raises(ValueError, match=r"agents\[0\].label must be a non-empty string"):
        load_scenario(sc)


def test_evaluate_refuses_seeds_and_horizons_it_would_misread():
    from flowgym.lab.evaluation import evaluate
    from flowgym.lab.scenarios import AgentSpec

    kw = {"M": 2000, "workload": {"kind": "poisson", "classes": [[10, 20]], "rates": 0.3}}
    for seeds, horizons, match in (([0, 0, 0], [20], "lists a seed twice"), ([1.9], [20], "seeds must be"),
                                   ("01", [20], "seeds must be"), ([0], [True], "horizons must be"),
                                   ([0], [20.7], "horizons must be")):
        with pytest.raises(ValueError, match=match):
            evaluate([AgentSpec("mc")], kw, seeds, horizons)


def test_hindsight_refuses_flags_of_the_other_source_and_too_large_instances(tmp_path, capsys):
    from flowgym.lab.cli import main
    from flowgym.lab.hindsight import compare_to_hindsight

    tr = tmp_path / "tr.csv"
    tr.write_text("arrival,prompt_len,output_len\n0,2,3\n1,2,2\n")
    assert main(["hindsight", "--trace", str(tr), "--M", "40", "--online", "0.5", "--seed", "7"]) == 2
    assert "--online and --seed apply to random instances, not with --trace" in capsys.readouterr().err
    assert main(["hindsight", "--random", "3", "--cls-column", "c"]) == 2
    assert "--cls-column applies to traces, not with --random" in capsys.readouterr().err
    assert main(["hindsight", "--random", "3", "--M", str(2**53)]) == 2
    assert "too large for the time-indexed program" in capsys.readouterr().err
    assert main(["hindsight", "--random", "3", "--objectives", "completed", "--T", str(2**53)]) == 2
    assert "horizon T must be a positive integer up to 1e+07" in capsys.readouterr().err
    for kw, match in ((dict(objectives="total_latency"), "objectives must be a list"), (dict(T=-5), "horizon T must"),
                      (dict(time_limit=float("nan")), "time_limit must"), (dict(cls=[0]), "cls has 1 entries")):
        with pytest.raises(ValueError, match=match):  # in this process, before any worker cell
            compare_to_hindsight([0, 1], [2, 2], [3, 2], 40, ["mc"], **kw)


def test_train_refuses_what_a_distribution_would_drop_and_huge_numbers():
    from flowgym.lab.ars import ARSConfig
    from flowgym.lab.distributions import make_distribution

    from flowgym.lab.train import TrainConfig

    for key, value in (("M", 4000), ("horizon", 4000), ("time_model", "llama2-70b-tp2-a100")):
        for cfg in (ARSConfig(env_overrides={key: value}),  # the time model was dropped from every draw silently
                    TrainConfig(distribution="random-mix", env_overrides={key: value})):
            with pytest.raises(ValueError, match=f"env_overrides may not set '{key}' when training on a distribution"):
                cfg.validate()
    with pytest.raises(ValueError, match=r"unknown training distribution \['random-mix'\]"):
        make_distribution({"kind": ["random-mix"]})
    with pytest.raises(ValueError, match=r"random-mix: M_range must be \[low, high\] with 0 < low <= high <= 1e15"):
        make_distribution({"kind": "random-mix", "M_range": [10**400, 10**400]})
    for name in ("rho_range", "overload_rho_range"):  # refused by name, not by a stream's rate when an episode runs
        with pytest.raises(ValueError, match=rf"random-mix: {name} must end at 10 or less"):
            make_distribution({"kind": "random-mix", name: [1.0, 1e4]})
    with pytest.raises(ValueError, match="noise must be a positive number"):
        ARSConfig(noise=10**400).validate()
    with pytest.raises(ValueError, match=r"hidden=\[3000, 3000, 3000\] and memory=0 make 18075002 weights, more than"):
        ARSConfig(hidden=(3000, 3000, 3000)).validate()  # a model the loader would refuse is refused before training


def test_reproduce_checks_write_docs_only_and_claims_fields_before_the_run(tmp_path, capsys):
    from flowgym.lab.cli import main
    from flowgym.lab.reproduce import ClaimsError, load_claims

    out = tmp_path / "out"
    assert main(["reproduce", "--write-docs", str(tmp_path / "none.md"), "--out", str(out)]) == 2
    assert "--write-docs" in capsys.readouterr().err and not out.exists()
    assert main(["reproduce", "--quick", "--only", "bogus", "--out", str(out)]) == 2
    assert "--only: unknown section" in capsys.readouterr().err and not out.exists()
    base = '''[settings.t]
section = "theory"
kind = "theory"
params = {classes = [[10, 20]], budgets = [4], rates = [5.0], M = 16492}
[[claims]]
id = "a"
statement = "s"
setting = "t"
kind = "theory"
verdict = "holds"
check = "%s"
'''
    from flowgym.lab.reproduce import THEORY_CHECKS

    good = base % THEORY_CHECKS[0]
    f = tmp_path / "c.toml"
    f.write_text(good)
    load_claims(str(f))
    for extra, match in (('max_ratio = 2.0\n', "field 'max_ratio' does not apply to a theory claim"),
                         ('comparison = "worse"\n', "field 'comparison' does not apply to a theory claim")):
        f.write_text(good + extra)
        with pytest.raises(ClaimsError, match=match):
            load_claims(str(f))
    f.write_text(good.replace("budgets = [4]", 'budgets = "four"'))
    with pytest.raises(ClaimsError, match="params.budgets must be a non-empty array"):
        load_claims(str(f))
    f.write_text(good.replace("budgets = [4]", "budgets = [1" + "0" * 400 + "]"))  # not finite as a float: named
    with pytest.raises(ClaimsError, match="params.budgets must be a non-empty array"):
        load_claims(str(f))


def test_trace_with_a_wanted_column_twice_is_refused(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text("arrival,prompt_len,output_len,output_len\n0,2,3,9\n1,2,2,9\n")
    with pytest.raises(TraceError, match="has the column 'output_len' \\(for output_len\\) 2 times"):
        Trace.from_csv(str(p))


def test_metric_plots_name_iterations_and_seconds_in_continuous_time(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="needs matplotlib: pip install -e '.[plot]' in the flowgym checkout")
    from flowgym.lab import plots
    from flowgym.lab.evaluation import TABLE_METRICS, ResultTable

    rows = [{"agent": "a", "horizon": h, "seed": 0, **{m: 1.0 for m in TABLE_METRICS}} for h in (10, 20)]
    table = ResultTable(rows, ["a"], [10, 20], [0], time_unit="s")
    seen = []
    import matplotlib.axes

    monkeypatch.setattr(matplotlib.axes.Axes, "set_xlabel", lambda self, t, *a, **k: seen.append(t))
    plots.plot_metrics_vs_horizon(table, str(tmp_path / "m.png"))
    assert seen and all(t == "horizon T (iterations)" for t in seen)


def test_review_of_the_review_fixes(tmp_path, capsys):
    """A path parameter is recorded as text; a clash that tuning could make is refused before the run; a stray
    quote and a ';' inside quotes; a bool in SB3's (n, 1) shape; make_agent names the agent whatever the value;
    seeds keep no upper limit on the command line."""
    import pathlib

    from flowgym.agents import make_agent
    from flowgym.agents.learned import DEFAULT_MODEL
    from flowgym.lab.cli import _agent_list, main
    from flowgym.lab.evaluation import evaluate
    from flowgym.lab.scenarios import AgentSpec, parse_seeds

    t = evaluate([AgentSpec("learned", {"path": pathlib.Path(DEFAULT_MODEL)})], {"horizon": 30}, [0], [20])
    t.to_json(str(tmp_path / "p.json"))
    assert t.agent_specs["learned (generalist)"]["params"]["path"] == pathlib.Path(DEFAULT_MODEL)
    assert '"path": "' in (tmp_path / "p.json").read_text()
    sc = tmp_path / "tuned.toml"
    sc.write_text(_TINY.format(desc="t") + '[[agents]]\nname = "alpha-greedy"\ntune = {param = "alpha", grid = [0.1]}\n')
    out = tmp_path / "out"
    assert main(["compare", "--scenario", str(sc), "--seeds", "1", "--no-plots", "--quiet", "--out", str(out),
                 "--add-agents", "alpha-greedy:alpha=0.1"]) == 2
    assert "may have it after tuning): ['alpha-greedy alpha=0.1']" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match="an unbalanced double quote"):
        AgentSpec.parse('mc:label=a"b,max_budget=8')
    assert _agent_list("--agents", 'mc:label="a; b";fixed:b=8') == ['mc:label="a; b"', "fixed:b=8"]
    with pytest.raises(ValueError, match=r"^agent 'mc': max_budget must be"):
        make_agent("mc", max_budget="mc")
    with pytest.raises(ValueError, match="at most 1e\\+06 seeds in all"):
        parse_seeds("0-999999,1000000-1000001")
    assert main(["run", "--horizon", "20", "--json", "--seed", str(2**60)]) == 0
    pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e '.[train]' in the flowgym checkout")
    from flowgym.envs.sb3 import FlowControlSB3VecEnv

    venv = FlowControlSB3VecEnv(3)
    venv.reset()
    with pytest.raises(ValueError, match="it holds a bool"):
        venv.step([[True], [2], [3]])


@pytest.mark.parametrize("jit", ["1", "0"])
def test_a_negative_or_fractional_budget_is_refused_by_the_engine_and_replay(jit, monkeypatch):
    """Review of the lower layers (2026-11-28): ``replay(budgets=-1)`` ran with negative active counts (compiled),
    a list holding -2 crashed the process, and 2.7 budgets or horizons were cut down quietly."""
    import subprocess
    import sys

    from flowgym.sim.engine import Engine, replay

    code = ("from flowgym.sim.engine import replay\n"
            "try:\n    replay([0, 0, 1], [5, 5, 5], [3, 3, 3], M=100, budgets=[-2, 1, 1, 1], horizon=8)\n"
            "except ValueError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "FLOWGYM_JIT": jit}, timeout=300)
    assert run.returncode == 0 and "budgets[0] = -2 must be >= 0" in run.stdout
    args = ([0, 0, 1], [5, 5, 5], [3, 3, 3])
    for kw, msg in ((dict(budgets=-1), "budgets must be a non-negative integer"),
                    (dict(budgets=2.7), "budgets must be a non-negative integer"),
                    (dict(budgets=[1, True]), "it holds a bool"),
                    (dict(budgets=[1, 2.5]), r"budgets\[1\] = 2.5 is not an integer"),
                    (dict(budgets="3"), "budgets must be an integer or a sequence"),
                    (dict(budgets=2, horizon=2.9), "horizon must be a non-negative integer"),
                    (dict(budgets=2, horizon=-3), "horizon must be a non-negative integer"),
                    (dict(budgets=[1, -1], classes=[0, 1, 0]), r"budgets\[1\] = -1 must be >= 0")):
        with pytest.raises(ValueError, match=msg):
            replay(*args, M=100, **{"horizon": 8, **kw})
    assert replay(*args, M=100, budgets=2, horizon=8)["finish"].tolist() == [3, 3, 4]
    eng = Engine(100, Trace(*args))
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    for bad in (-1, 1.0, True, np.float64(2)):
        with pytest.raises(ValueError, match="budget must be a non-negative integer"):
            eng.serve(bad)
    eng.serve(np.int64(1))  # numpy integers are budgets
    per = Engine(100, Trace(*args, cls=[0, 1, 0]), per_class=True)
    per.reset(np.random.default_rng(0))
    per.arrive()
    for bad in ([1, -1], [1, 0.5], [1, float("inf")], [True, 1], np.array([1, -1]), ["1", 1]):
        with pytest.raises(ValueError, match="per-class budgets must be non-negative integers"):
            per.serve(bad)
    with pytest.raises(ValueError, match="per-class budgets: 2 classes"):
        per.serve([1, 1, 1])


def test_a_periodic_step_schedule_keeps_its_arrivals_in_their_slots():
    """``Steps._F`` reduced t = 1854 by the period 41.2 to a hair below 0 and read the last step there: the slot
    before the cycle's end got 25.6 expected arrivals instead of 5, the slot after none."""
    w = make_workload({"kind": "iid", "rate": {"kind": "steps", "times": [0, 20.6], "rates": [1, 5], "period": 41.2},
                       "lengths": {"kind": "empirical", "pairs": [[5, 5]]}})
    s = w.schedule
    assert float(s.integral(1853.0, 1854.0)) == pytest.approx(5.0)
    assert float(s.integral(1854.0, 1855.0)) == pytest.approx(1.0)
    t = np.arange(0.0, 50_000.0, 0.37)
    slope = np.diff(s._F(t)) / 0.37  # within a step the integral grows at that step's rate, never faster
    assert slope.min() > -1e-6 and slope.max() < 5 + 1e-6
    edges = np.arange(0.0, 20_001.0)
    np.testing.assert_allclose(s.integral(edges[:-1], edges[1:]).sum(), s.integral(0.0, 20_000.0), rtol=1e-9)


def test_a_finite_workload_shared_by_two_environments_gives_each_its_requests():
    """A finite ``IIDPoisson`` counted the requests it made on the workload object: two environments built on one
    object (``gym.make_vec``) cut each other's arrivals and never terminated."""
    from flowgym.sim.workloads import IIDPoisson

    def finish(env):
        done = False
        while not done:
            _, _, te, tr, _ = env.step(8)
            done = te or tr
        return env.unwrapped.metrics()["arrived"], env.unwrapped.engine.t

    # 1,000 requests at 2 a slot span about two 256-slot chunks of the workload: the later chunks are drawn
    # while the other environment has drawn its own (with 70 requests, all in the first chunk, the old code passed)
    wl = {"kind": "empirical", "pairs": [[5, 3]]}
    alone = [finish(_reset(gym.make("FlowControl-v0", workload=IIDPoisson(2.0, wl, n_requests=1000), horizon=3000,
                                    M=1000), s)) for s in (1, 2)]
    shared = IIDPoisson(2.0, wl, n_requests=1000)
    a, b = (gym.make("FlowControl-v0", workload=shared, horizon=3000, M=1000) for _ in range(2))
    a.reset(seed=1)
    b.reset(seed=2)
    for _ in range(400):  # interleaved, as a vector of environments steps them
        a.step(8)
        b.step(8)
    assert [finish(a), finish(b)] == alone and alone[0][0] == alone[1][0] == 1000 and alone[0][1] < 3000


def _reset(env, seed):
    env.reset(seed=seed)
    return env


def test_theory_helpers_and_latency_refuse_bad_numbers_by_name():
    from flowgym.sim.latency import JailletLatency
    from flowgym.sim.theory import load, reflected_walk_mean
    from flowgym.sim.workloads import MultiClassPoisson

    with pytest.raises(ValueError, match=r"latency coefficient c .* must be at least 0.001 .* got 0"):
        JailletLatency(a=0, b=0, c=0, p=0)
    for rate, budget, msg in ((3, 4.0, "budget must be a non-negative integer"), (0, 0.5, "budget must be a non-neg"),
                              (-2, 1, "rate .* must be a non-negative finite number"),
                              (float("nan"), 3, "rate .* must be a non-negative finite number")):
        with pytest.raises(ValueError, match=msg):
            reflected_walk_mean(rate, budget)
    for mean_work in (-5.0, float("nan"), True):
        with pytest.raises(ValueError, match="mean_work .* must be a positive finite number"):
            load(100, 2, mean_work=mean_work)
    with pytest.raises(ValueError, match="rates must be non-negative"):
        load(100, -1, mean_work=3)
    assert load(100, [1, 2], mean_work=5.0) == pytest.approx(0.15)
    np.testing.assert_array_equal(MultiClassPoisson([[10, 20]], np.array(3.0)).rates, [3.0])  # a 0-d rate
    with pytest.raises(TraceError, match="needs the requests' classes"):
        Trace([0], [1], [1], num_classes=3)
    with pytest.raises(TraceError, match="num_classes must be a positive integer"):
        Trace([0], [1], [1], cls=[0], num_classes=2.5)
    for bad in ("2", True):
        with pytest.raises(ValueError, match=r"rate_multiplier must be positive and finite \(a number\)"):
            make_workload({"kind": "azure", "trace": "conv", "rate_multiplier": bad})


@pytest.mark.parametrize("jit", [True, False])
def test_the_batched_engine_checks_its_budgets_shape_and_type(jit):
    """Review (2026-11-28): ``BatchedEngine.advance`` read past a short budget array when compiled (broadcast
    it otherwise), ignored an extra entry, and gave raw numba/numpy errors on floats."""
    from flowgym.envs.vector import FlowControlVectorEnv

    env = FlowControlVectorEnv(2, horizon=20)
    env.reset(seed=0)
    eng = env.engine
    eng.jit = jit and eng.jit
    for bad in (np.array([5]), np.array([5, 5, 5]), np.array([5.0, 5.0]), np.array([True, True])):
        with pytest.raises(ValueError, match=r"budget must be an integer array of shape \(2,\)"):
            eng.advance(bad)
    assert eng.advance(np.array([5, 5], np.int32)).shape[1] == 2


def test_vector_env_seeds_and_request_log_indices_are_checked_and_the_fallback_has_request_log():
    from flowgym.envs.vector import FlowControlSyncVectorEnv, FlowControlVectorEnv

    env = FlowControlVectorEnv(2, horizon=20)
    for bad in (1.5, True, "3", np.array(4)):
        with pytest.raises(ValueError, match="seed must be an int, None or a list of 2 seeds"):
            env.reset(seed=bad)
    env.reset(seed=range(2))  # any sequence of seeds, as the sync fallback takes
    env.reset(seed=0)
    for bad in (1.7, True, 2, -1):
        with pytest.raises(ValueError, match=r"i must be an environment index in \[0, 2\)"):
            env.request_log(bad)
    sync = gym.make_vec("FlowControl-v0", num_envs=2, horizon=20, engine="vllm-v1")
    assert isinstance(sync, FlowControlSyncVectorEnv)
    sync.reset(seed=0)
    for _ in range(5):
        sync.step(np.array([4, 4]))
    log = sync.request_log(1)
    assert log["arrival"].size == sync.envs[1].unwrapped.request_log()["arrival"].size > 0
    with pytest.raises(ValueError, match=r"i must be an environment index in \[0, 2\)"):
        sync.request_log(2)


# ---- review of 2026-11-29: workloads, rate schedules, scenario files ----------------------------------------

def test_a_sinusoid_down_to_zero_never_asks_poisson_for_a_negative_mean():
    """amplitude == mean is allowed; at a trough the integral's rounding went slightly negative (worse as t grows)
    and numpy's Poisson draw raised 'lam < 0' from inside reset."""
    s = make_rate({"kind": "sinusoid", "mean": 1.0, "amplitude": 1.0, "period": 1e5, "phase": 0.75})
    t = np.arange(10_074_744 - 2000, 10_074_744 + 2000, dtype=np.float64)
    assert s.integral(t, t + 1).min() >= 0 and s.rate(t).min() >= 0
    env = gym.make("FlowControl-v0", M=16492, horizon=50, workload={
        "kind": "iid", "rate": {"kind": "sinusoid", "mean": 1.0, "amplitude": 1.0, "period": 1e7, "phase": 0.75},
        "lengths": {"kind": "empirical", "pairs": [[10, 20]]}})
    env.reset(seed=0)
    for _ in range(50):
        env.step(4)


def test_huge_weights_and_lengths_are_handled_or_named():
    e = EmpiricalLengths([[1, 2], [3, 4]], weights=[1e308, 1e308])  # the sum overflowed: p was [0, 0]
    np.testing.assert_allclose(e.p, [0.5, 0.5])
    assert e.max_output() == 4
    assert EmpiricalLengths([[1, 2], [3, 4]], weights=[1, 2]).p.tolist() == [1 / 3, 2 / 3]  # as before, bit for bit
    for key in ("max_output", "max_prompt"):  # a table of 10**18 entries: a memory error, or minutes
        with pytest.raises(ValueError, match=rf"^{key} 1000000000000000000 is too large \(at most 16777216"):
            make_workload({"kind": "iid", "rate": 1.0, "lengths": {"kind": "lognormal", "prompt_median": 10,
                           "output_median": 10, "prompt_sigma": 1, "output_sigma": 1, key: 10**18}})
        with pytest.raises(ValueError, match=rf"^{key} "):
            make_workload({"kind": "iid", "rate": 1.0, "lengths": {"kind": "lmsys-like", key: 10**18}})
    # a sigma so small that z is +inf above the median: that mass is all at the median, as with sigma 0
    tiny = make_workload({"kind": "iid", "rate": 1.0, "lengths": {"kind": "lognormal", "prompt_median": 155,
                          "output_median": 10, "prompt_sigma": 1e-320, "output_sigma": 0}}).lengths
    zero = make_workload({"kind": "iid", "rate": 1.0, "lengths": {"kind": "lognormal", "prompt_median": 155,
                          "output_median": 10, "prompt_sigma": 0, "output_sigma": 0}}).lengths
    assert tiny.mean_work() == zero.mean_work()


@pytest.mark.parametrize("window", [{"start": 0.0, "end": 1800.0}, [1800.0], [True, 100], [0, 100, 7], ["a", 5],
                                    "0-1800", [0, float("nan")]])
def test_a_malformed_azure_window_is_named(window):
    with pytest.raises(ValueError, match=r"window must be two numbers \[start, end\] \(seconds\), got "):
        make_workload({"kind": "azure", "trace": "conv", "window": window})


@pytest.mark.parametrize("spec, match", [
    ({"kind": "iid", "rate": "12", "lengths": {"kind": "empirical", "pairs": [[1, 2]]}}, r"^rate must be .* got '12'"),
    ({"kind": "iid", "rate": 1, "n_requests": "50", "lengths": {"kind": "empirical", "pairs": [[1, 2]]}},
     r"^n_requests must be a positive integer, got '50'"),
    ({"kind": "poisson", "classes": [["10", "20"]], "rates": 1.0}, r"classes\[0\] prompt_len .*'10'"),
    ({"kind": "iid", "rate": {"kind": "steps", "times": ["0", "1e1"], "rates": [1, 2]},
      "lengths": {"kind": "empirical", "pairs": [[1, 2]]}}, r"times\[0\] .* got '0'"),
    ({"kind": "iid", "rate": 1, "lengths": {"kind": "empirical", "pairs": [[1, 2], [3, 4]], "weights": "12"}},
     r"^weights must be a list of non-negative numbers, got '12'"),
    ({"kind": "iid", "rate": 1, "lengths": {"kind": "empirical", "pairs": [[True, 2]]}},
     r"pairs\[0\] must be .* \(a bool is not a length\)"),
    ({"kind": "trace", "arrival": [0, 1], "prompt_len": [True, 5], "output_len": [3, 4]},
     r"column 'prompt_len', index 0: True is not a number"),
    ({"kind": "trace", "arrival": [2**53 + 1], "prompt_len": [1], "output_len": [1]},
     r"column 'arrival', index 0: 9007199254740993 is not exactly a 64-bit float"),
    ({"kind": "iid", "rate": 1, "n_requests": 1e300, "lengths": {"kind": "empirical", "pairs": [[1, 2]]}},
     r"^n_requests 1e\+300 is too large"),
    ({"kind": "mix", "streams": [{"kind": "iid", "rate": 16000, "lengths": {"kind": "empirical", "pairs": [[1, 2]]}}] * 10},
     r"^streams \(their rates together\): 160000 requests per slot is beyond"),
])
def test_text_bools_and_sizes_in_a_workload_are_named_not_guessed(spec, match):
    """Text that float() reads ("12"), bools inside lists (numpy made True a 1), an arrival a float cannot hold,
    a count no run could reach and streams whose rates together overflow a chunk were taken silently."""
    with pytest.raises(ValueError, match=match):
        make_workload(spec)


def test_a_trace_csv_arrival_beyond_what_a_float_holds_is_named(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_len,output_len\n9007199254740993,1,1\n")
    with pytest.raises(TraceError, match=r"column 'arrival', row 2: .*9007199254740993.* not exactly a 64-bit float"):
        make_workload({"kind": "trace", "path": str(p)})


def test_a_random_mix_draw_the_simulator_refuses_names_the_distribution():
    from flowgym.lab.distributions import make_distribution

    d = make_distribution({"kind": "random-mix", "M_range": [1e6, 1e7], "trace_p": 0})
    with pytest.raises(ValueError, match=r"^random-mix: a draw \(M = \d+\) asks more .* narrow M_range"):
        for s in range(40):
            d(np.random.default_rng(s))


_SCENARIO = """name = "t"
{top}
[env]
M = 16492
horizon = 1000
{env}
[[agents]]
name = "mc"
"""


@pytest.mark.parametrize("top, env, match", [
    ('description = "load {rate:g}"', "", r"description: \{rate\} stands for the rate, but this scenario has no rate table"),
    ("finite = true", "horizon_unused = 0", None),  # placeholder replaced below
    ("[train]\nmax_budget = 1000000000000000000000000000000", "",
     r"train\.max_budget must be a positive integer of at most 1000000000"),
    ('rate = {default = 1.0, set = ["env.workload.rate"]}\ntune_env = {workload = {rate = 1.0}}',
     '[env.workload]\nkind = "iid"\nrate = 1.0\nlengths = {kind = "empirical", pairs = [[10, 20]]}',
     r"tune_env sets 'workload\.rate', which the rate table's 'env\.workload\.rate' changes"),
])
def test_scenario_file_mistakes_are_named_at_load(tmp_path, top, env, match):
    from flowgym.lab.scenarios import load_scenario

    if match is None:  # finite = true with no workload: the env's default workload never ends
        text = 'name = "t"\nfinite = true\n[env]\nM = 16492\n[[agents]]\nname = "mc"\n'
        match = r"finite = true runs the workload to its end, but env's workload never ends"
    else:
        text = _SCENARIO.format(top=top, env=env)
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_scenario(p)


def test_a_deeply_nested_scenario_file_is_named(tmp_path):
    from flowgym.lab.scenarios import load_scenario

    for suffix, text in ((".json", "[" * 100_000 + "]" * 100_000), (".toml", "a = " + "[" * 100_000 + "]" * 100_000)):
        p = tmp_path / f"deep{suffix}"
        p.write_text(text)
        with pytest.raises(ValueError, match=r"nested too deeply to read"):
            load_scenario(p)


def test_toml_writer_escapes_del_and_writes_numpy_scalars():
    from flowgym.lab import _toml

    data = {"a": "x\x7fy", "b": np.float64(1.5), "c": np.int64(3), "d": np.bool_(True), "e": [np.float32(0.25)]}
    text = _toml.dumps(data)
    assert "np." not in text and _toml.loads(text) == {"a": "x\x7fy", "b": 1.5, "c": 3, "d": True, "e": [0.25]}


def test_trace_class_lengths_are_each_class_median_grouped_in_one_sort():
    """Trace.classes (each class's median prompt and output) was a scan of every row per class id up to the
    largest; now one sort. Same table as the scan, absent ids zero, num_classes beyond the ids padded."""
    rng = np.random.default_rng(3)
    n = 2000
    cls = rng.choice([0, 2, 5, 9], n)
    tr = Trace(np.arange(n), rng.integers(1, 50, n), rng.integers(1, 50, n), cls=cls, num_classes=12)
    ref = np.zeros((12, 2), dtype=np.int64)
    for k in (0, 2, 5, 9):
        sel = cls == k
        ref[k] = (int(np.median(tr.prompt_len[tr.cls == k])), int(np.median(tr.output_len[tr.cls == k])))
        assert sel.sum() == (tr.cls == k).sum()
    np.testing.assert_array_equal(tr.classes, ref)


def test_jaillet_coefficients_are_checked_in_milliseconds():
    """JailletLatency's a, b, c, p are milliseconds (its formula gives d_ms): a 5-second iteration (c = 5000) is a
    time scale of serving, and the cap is 3,600 s in milliseconds, with a message in that unit."""
    from flowgym.sim.latency import make_latency_model

    assert make_latency_model({"kind": "jaillet", "c": 5000}).duration(0, 0, 0, 0) == 5.0
    with pytest.raises(ValueError, match=r"latency coefficient c = 4000000 milliseconds is beyond .*\(at most 3600000 "
                                         r"milliseconds; this model's coefficients are in milliseconds, not seconds"):
        make_latency_model({"kind": "jaillet", "c": 4_000_000})
    with pytest.raises(ValueError, match=r"c0 = 4000 seconds .* in seconds, not milliseconds"):
        make_latency_model({"kind": "linear", "c0": 4000})


def test_vllm_step_retried_after_a_latency_callable_raises_is_the_same_run():
    """With preempt_order="random" the victims were drawn before the callable ran, so a step retried after it
    raised (which CallableLatency's docstring allows) drew other victims: another run."""
    from flowgym.sim.vllm import VllmEngine

    rng = np.random.default_rng(7)
    n = 60
    arr, L, O = np.sort(rng.uniform(0, 2, n)).tolist(), rng.integers(1, 30, n).tolist(), rng.integers(5, 60, n).tolist()

    def run(fail_at):
        calls = {"k": 0}

        def f(P, D, K, B):
            calls["k"] += 1
            if calls["k"] in fail_at:
                raise RuntimeError("boom")
            return 0.01

        e = VllmEngine(300, Trace(arr, L, O, timed=True), time_model=f,
                       options=dict(block_size=4, max_num_seqs=None, preempt_order="random"))
        e.reset(np.random.default_rng(0))
        fails = 0
        while not (e.exhausted and e.n_queued + e.n_active == 0):
            e.arrive()
            while True:
                try:
                    e.serve(8)
                    break
                except RuntimeError:
                    fails += 1
        return e.request_log()["finish"].tolist(), e.total_evictions, fails

    base = run(set())
    assert base[1] > 0 and base[2] == 0  # victims are drawn in this run
    for k in (12, 40, 61, 117, 152):
        got = run({k})
        assert got[2] == 1 and got[:2] == base[:2]


def test_vllm_a_one_token_last_chunk_of_a_recompute_is_a_prefill_not_a_decode():
    """A recompute prefilled in chunks of 10 whose last chunk is one token was counted as a decode (its step's
    P, D, K and prefill_tokens), as it looks like one: one token, all but one computed, tokens generated before.
    The chunked and the unchunked recompute prefill the same 51 tokens."""
    from flowgym.sim.vllm import VllmEngine

    totals = []
    for thr in (0, 10):
        e = VllmEngine(60, Trace([0, 0], [10, 10], [22, 40]),
                       options=dict(block_size=1, max_num_batched_tokens=None, long_prefill_token_threshold=thr))
        e.reset(np.random.default_rng(0))
        for _ in range(200):
            e.arrive()
            e.serve(2)
        ss = e.step_series()
        assert int(ss["recomputed_tokens"].sum()) == 30 and e.serving_metrics()["num_preemptions"] == 1
        totals.append(e.serving_metrics()["prefill_tokens"])
        if thr:
            assert [(int(ss["prefill_tokens"][i]), int(ss["decode_requests"][i])) for i in range(22, 27)] == \
                [(10, 0), (10, 0), (10, 0), (1, 0), (0, 1)]
    assert totals == [51, 51]


@pytest.mark.parametrize("record", ["full", "stream"])
def test_metrics_mid_episode_are_those_of_the_slots_run(record):
    """env.metrics() mid-episode counted the requests that joined at decision point t (arrive() had run for the
    next slot) as arrived and waiting: not metrics_at(t), and in continuous time negative (the clock had jumped
    to the next arrival)."""
    from flowgym.envs.flow_control import FlowControlEnv
    from flowgym.sim.metrics import metrics_at

    env = FlowControlEnv(M=16492, horizon=1000, record=record)
    env.reset(seed=0)
    for _ in range(10):
        env.step(12)
    ref = FlowControlEnv(M=16492, horizon=1000)
    ref.reset(seed=0)
    for _ in range(10):
        ref.step(12)
    want = metrics_at(ref.request_log(), ref.series(), 16492, 10)
    got = env.metrics()
    for k in ("T", "arrived", "rejected", "unfinished", "completed", "mean_time_in_system"):
        assert got[k] == want[k], k
    env = FlowControlEnv(M=100, workload=Trace([0.0, 100.0], [2, 3], [1, 1], timed=True), horizon=None,
                         time_model={"kind": "linear", "c0": 0.5}, record=record)
    env.reset(seed=0)
    m = env.metrics()  # nothing run yet, the first arrival at 0 s has joined decision point 0
    assert m["arrived"] == 0 and np.isnan(m["mean_time_in_system"])
    env.step(1)
    m = env.metrics()  # the clock has jumped to 100 s for the second arrival: not in the first iteration
    assert m["arrived"] == 1 and m["mean_time_in_system"] == 0.5 and m["elapsed"] == 0.5


def test_vllm_generated_tokens_are_the_sampled_ones():
    """generated_token_throughput counted a token per running request per step, as the paper's model decodes,
    but a vllm-v1 step of prefill only samples none: a 5,000-token prompt prefilled over 3 steps then 3 tokens
    was 5 tokens, not 3."""
    from flowgym.envs.flow_control import FlowControlEnv

    for engine, steps in (("paper", 3), ("vllm-v1", 5)):
        env = FlowControlEnv(M=16000, horizon=None, workload=Trace([0], [5000], [3]), engine=engine)
        env.reset(seed=0)
        for _ in range(100):
            if env.step(1)[2]:
                break
        m = env.metrics()
        assert m["T"] == steps and m["generated_token_throughput"] * m["T"] == pytest.approx(3.0)
    assert env.series()["generated"].tolist() == [0, 0, 1, 1, 1]


def test_metrics_and_sketch_refuse_what_they_would_misread():
    """metrics_at(T=-1) sliced the last slots (T reported 199), T=100.0 gave a raw slice TypeError, True was 1;
    compute_metrics(M=0) divided by zero; QuantileSketch(integers=True) truncated 1.7 to 1, and text gave numpy's
    raw error."""
    from flowgym.envs.flow_control import FlowControlEnv
    from flowgym.sim.metrics import compute_metrics, metrics_at
    from flowgym.sim.streaming import QuantileSketch

    env = FlowControlEnv(M=16492, horizon=200)
    env.reset(seed=0)
    for _ in range(200):
        env.step(12)
    log, s = env.request_log(), env.series()
    assert metrics_at(log, s, 16492, np.int64(100))["T"] == 100
    for bad in (-1, -150, 100.0, True):
        with pytest.raises(ValueError, match=r"^T must be a whole number of slots >= 0, got "):
            metrics_at(log, s, 16492, bad)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match=r"^M \(the KV budget, tokens\) must be a positive integer"):
            compute_metrics(log, s, bad)
    sk = QuantileSketch(integers=True)
    with pytest.raises(ValueError, match="counts integers"):
        sk.add(np.array([1.7, 2.2]))
    for bad in (["a"], [[1, 2], [3, 4]], np.array([1, "x"], dtype=object), np.array([True])):
        with pytest.raises(ValueError, match="one-dimensional array of numbers"):
            sk.add(bad)
    sk.add(np.array([1.0, 3.0]))  # whole floats are integers
    assert sk.count == 2 and sk.quantile(0.5) == 2.0


def test_continuous_time_refuses_what_the_clock_cannot_count():
    """A float64 clock at 2**53 s adds nothing for a 1 s iteration (latencies read 0), a duration of 5e-324 s
    stalls it, a rate of 1e-12 requests/s makes an idle server draw chunks for days, and a callable's "0.1" or
    True is not a duration: each is refused, naming the field, the row or the value."""
    w = {"kind": "trace", "timed": True, "arrival": [0.0, 1e15], "prompt_len": [10, 10], "output_len": [20, 20]}
    with pytest.raises(ValueError, match=r"column 'arrival', index 1: .* too large for an arrival in seconds "
                                         r"\(at most 4294967296: beyond it the clock"):
        gym.make("FlowControl-v0", M=1000, time_model="llama2-70b-tp2-a100", workload=w, horizon=10)
    # Unix timestamps still fit, and an iteration still moves the clock there
    env = gym.make("FlowControl-v0", M=1000, time_model="llama2-70b-tp2-a100", horizon=100,
                   workload={**w, "arrival": [1.7e9, 1.7e9 + 1.0]})
    env.reset(seed=0)
    done = False
    while not done:
        _, _, te, tr, _ = env.step(4)
        done = te or tr
    log = env.unwrapped.request_log()
    assert ((log["finish_time"] - log["arrival_time"]) > 1.0).all()
    with pytest.raises(ValueError, match=r"c0 must be at least 1e-06 seconds .* got 5e-324"):
        gym.make("FlowControl-v0", M=1000, time_model={"kind": "linear", "c0": 5e-324}, workload=w, horizon=10)
    with pytest.raises(ValueError, match=r"c \(milliseconds per iteration\) must be at least 0.001 .* got 1e-09"):
        gym.make("FlowControl-v0", M=1000, time_model={"kind": "jaillet", "c": 1e-9}, workload=w, horizon=10)
    lmsys = {"kind": "lmsys-like"}
    for rate, low, chunks in ((1e-12, "1e-12", r"1\.67e\+10"),
                              ({"kind": "steps", "times": [0, 10], "rates": [1.0, 1e-9]}, "1e-09", r"1\.67e\+07")):
        with pytest.raises(ValueError, match=rf"workload: a long-run arrival rate of {low} requests per second is "
                                             rf"too low for continuous time .* about {chunks} of them"):
            gym.make("FlowControl-v0", M=1000, time_model={"kind": "linear", "c0": 0.01},
                     workload={"kind": "iid", "timed": True, "rate": rate, "lengths": lmsys})
    # what keeps requests coming is fine: bursts on a tiny base, a tiny stream beside a busy one
    for wl in ({"kind": "iid", "timed": True, "lengths": lmsys,
                "rate": {"kind": "bursts", "base": 1e-9, "burst": 5, "every": 100, "duration": 10}},
               {"kind": "mix", "streams": [{"kind": "iid", "timed": True, "rate": 1e-7, "lengths": lmsys},
                                           {"kind": "iid", "timed": True, "rate": 10, "lengths": lmsys}]}):
        env = gym.make("FlowControl-v0", M=1000, time_model={"kind": "linear", "c0": 0.01}, workload=wl)
        env.reset(seed=0)
        env.step(2)
    tw = {**w, "arrival": [0.0, 1.0]}
    for ret, msg in (("0.1", "need a number of seconds"), (True, "need a number of seconds"),
                     (1e-300, "need a duration of 1e-06 to 3600 seconds")):
        env = gym.make("FlowControl-v0", M=1000, time_model=lambda P, D, K, B, r=ret: r, workload=tw, horizon=10)
        env.reset(seed=0)
        with pytest.raises(ValueError, match=msg):
            env.step(1)
    for one in (np.array(0.05), np.array([0.05])):  # a one-element array (a model's predict) is its number
        env = gym.make("FlowControl-v0", M=1000, time_model=lambda P, D, K, B, r=one: r, workload=tw, horizon=10)
        env.reset(seed=0)
        env.step(1)
        assert env.unwrapped.engine.now == pytest.approx(0.05)
    class Tensor:  # a torch-like scalar: size() is a method, numel() counts, item() gives the number
        def size(self):
            return ()

        def numel(self):
            return 1

        def item(self):
            return 0.05

    env = gym.make("FlowControl-v0", M=1000, time_model=lambda P, D, K, B: Tensor(), workload=tw, horizon=10)
    env.reset(seed=0)
    env.step(1)
    assert env.unwrapped.engine.now == pytest.approx(0.05)
    env = gym.make("FlowControl-v0", M=1000, time_model=lambda P, D, K, B: np.array([0.05, 0.1]), workload=tw,
                   horizon=10)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="need a number of seconds"):
        env.step(1)


def test_the_clock_bounds_are_inclusive_at_their_values():
    """2**32 s is the last timed arrival taken, 1e-6 s the shortest iteration (c0, a callable's result), 1e-6
    requests per second the lowest positive long-run rate: each is taken at its value, refused just beyond."""
    from flowgym.sim.latency import MIN_ITERATION_SECONDS, CallableLatency, JailletLatency, LinearLatency
    from flowgym.sim.workloads import MAX_ARRIVAL_SECONDS, MIN_TIMED_RATE

    assert (MAX_ARRIVAL_SECONDS, MIN_ITERATION_SECONDS, MIN_TIMED_RATE) == (2**32, 1e-6, 1e-6)
    Trace([0.0, 2.0**32], [1, 1], [1, 1], timed=True)
    with pytest.raises(TraceError, match="too large for an arrival in seconds"):
        Trace([0.0, 2.0**32 + 1.0], [1, 1], [1, 1], timed=True)
    assert LinearLatency(c0=1e-6).duration(0, 0, 0, 0) == 1e-6
    with pytest.raises(ValueError, match="c0 must be at least 1e-06"):
        LinearLatency(c0=9.99e-7)
    assert CallableLatency(lambda *a: 1e-6).duration(1, 0, 0, 1) == 1e-6
    assert JailletLatency(a=0, b=0, c=0.001, p=0).duration(0, 0, 0, 0) == 1e-6  # Jaillet's c is in milliseconds
    with pytest.raises(ValueError, match="must be at least 0.001"):
        JailletLatency(a=0, b=0, c=0.000999, p=0)
    lm = {"kind": "lmsys-like"}
    gym.make("FlowControl-v0", M=1000, time_model={"kind": "linear", "c0": 0.01},
             workload={"kind": "iid", "timed": True, "rate": 1e-6, "lengths": lm}).reset(seed=0)
    with pytest.raises(ValueError, match="long-run arrival rate of 9.99e-07"):
        gym.make("FlowControl-v0", M=1000, time_model={"kind": "linear", "c0": 0.01},
                 workload={"kind": "iid", "timed": True, "rate": 9.99e-7, "lengths": lm})


def test_json_a_user_gives_refuses_a_key_given_twice(tmp_path):
    """--distribution, --env-overrides and a model's flowgym_agent.json: a key given twice in one object is
    refused by name (json.loads would keep the last one silently); scenario files already were."""
    import json
    import shutil

    from flowgym.agents import make_agent
    from flowgym.agents.learned import DEFAULT_MODEL
    from flowgym.lab.cli import main
    from flowgym.sim import _json

    assert _json.loads('{"a": {"b": 1}, "c": [1, {"d": 2}]}') == {"a": {"b": 1}, "c": [1, {"d": 2}]}
    with pytest.raises(_json.DuplicateKeyError, match="'b' is given twice"):
        _json.loads('{"a": {"b": 1, "b": 2}}')
    for flag in ("--distribution", "--env-overrides"):
        with pytest.raises(SystemExit):
            main(["train", "--quiet", flag, '{"kind": "random-mix", "horizon": 40, "horizon": 50}'])
    model = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, model)
    text = (model / "flowgym_agent.json").read_text()
    assert '"action_repeat": 8' in text  # the model's own, and its search's among the hyperparameters
    (model / "flowgym_agent.json").write_text(
        text.replace('"action_repeat": 8', '"action_repeat": 8, "action_repeat": 1', 1))
    with pytest.raises(ValueError, match="'action_repeat' is given twice"):
        make_agent("learned", path=str(model))
    json.loads((model / "flowgym_agent.json").read_text())  # plain json would have read it (keeping 1)


def test_cli_names_a_key_given_twice(capsys):
    from flowgym.lab.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--quiet", "--distribution", '{"kind": "random-mix", "trace_p": 0, "trace_p": 0.5}'])
    assert "key 'trace_p' is given twice in one object" in capsys.readouterr().err


def test_the_env_refuses_multipliers_its_budget_action_would_ignore():
    with pytest.raises(ValueError, match=r"multipliers=\(1.0, 2.0\) and multiplier_of='rate' shape action='multiplier'"):
        gym.make("FlowControl-v0", multipliers=[1.0, 2.0], multiplier_of="rate")
    with pytest.raises(ValueError, match=r"^multiplier_of='rate' shape"):
        gym.make("FlowControl-v0", multiplier_of="rate", action="budget")
    env = gym.make("FlowControl-v0", action="multiplier", multipliers=[1.0, 2.0], multiplier_of="rate")
    assert env.action_space.n == 2
    gym.make("FlowControl-v0", multipliers=list(flowgym.FlowControlConfig.multipliers))  # the defaults, as given
    with pytest.raises(ValueError, match="max-drain' multiplies both anchors and a drain term, one float each"):
        gym.make("FlowControl-v0", action="multiplier", multiplier_of="max-drain")
    with pytest.raises(ValueError, match="'max' multiplies both anchors, one float each"):
        gym.make("FlowControl-v0", action="multiplier", multiplier_of="max")
    with pytest.raises(ValueError, match="projection_offsets must not repeat an offset"):
        gym.make("FlowControl-v0", projection_offsets=[0, 1, 1])


def test_random_mix_refuses_at_construction_what_a_draw_would_fail_on():
    """trace_rate_range below what the clock can stretch to, and a horizon past 2**53, are refused when the
    distribution is built (naming the field), not when a trace piece is drawn minutes into training; a trace piece
    the simulator refuses is named with the distribution's fields at the draw."""
    from flowgym.lab.distributions import make_distribution

    with pytest.raises(ValueError, match=r"random-mix: trace_rate_range must start at 4.19e-07 or more"):
        make_distribution({"kind": "random-mix", "trace_rate_range": [1e-300, 1e-300]})
    make_distribution({"kind": "random-mix", "trace_rate_range": [1e-6, 1e-6]})  # just above the floor: fine
    floor = 1800 / 2**32  # the default window's 1,800 s over the clock's 2**32 s
    make_distribution({"kind": "random-mix", "trace_rate_range": [floor, 1.0]})  # at the floor: fine
    with pytest.raises(ValueError, match="trace_rate_range must start at"):  # its low end decides, not its high
        make_distribution({"kind": "random-mix", "trace_rate_range": [1e-300, 1.0]})
    # the floor is the window's width: 800 s from 1,000 s to 1,800 s
    make_distribution({"kind": "random-mix", "trace_window": [1000, 1800], "trace_rate_range": [2e-7, 1.0]})
    with pytest.raises(ValueError, match=r"start at 1.86e-07 or more \(a piece of up to 800 s of trace_window"):
        make_distribution({"kind": "random-mix", "trace_window": [1000, 1800], "trace_rate_range": [1e-7, 1.0]})
    make_distribution({"kind": "random-mix", "trace_p": 0, "trace_rate_range": [1e-300, 1e-300]})  # no pieces
    with pytest.raises(ValueError, match=r"random-mix: horizon must be a positive integer up to 2\*\*53"):
        make_distribution({"kind": "random-mix", "horizon": 2**53 + 1})
    d = make_distribution({"kind": "random-mix", "trace_p": 1, "trace_window": [0, 100]})
    with pytest.raises(ValueError, match=r"random-mix: a trace piece \(the \w+ trace from .* trace_window"):
        for i in range(50):
            d(np.random.default_rng(i))


def test_ars_refuses_settings_before_it_makes_the_output_directory(tmp_path):
    from flowgym.lab.ars import ARSConfig, train_ars

    out = tmp_path / "never"
    for kw, msg in (({"max_budget": 10**11}, "max_budget"), ({"env_overrides": {"reward_scale": -1}}, "reward_scale"),
                    ({"action_repeat": 4001}, r"action_repeat 4001 exceeds the episode \(4000 slots\)")):
        with pytest.raises(ValueError, match=msg):
            train_ars(ARSConfig(out=str(out), iterations=1, progress=False, **kw))
        assert not out.exists()
    ARSConfig(out=str(out), action_repeat=4000).validate()  # one decision an episode: odd, but it is the episode


def test_ars_refuses_a_workload_where_no_request_can_finish(tmp_path):
    """A distribution whose draws finish no request: the run says so and writes no model (before, it kept update 0
    with an infinite score and exit status 0)."""
    from flowgym.lab.ars import ARSConfig, train_ars

    cfg = ARSConfig(out=str(tmp_path / "m"), iterations=1, draws=2, directions=1, norm_draws=1, eval_episodes=1,
                    final_eval_seeds=0, workers=1, progress=False,
                    distribution={"kind": "random-mix", "trace_p": 1, "azure_M_range": [4, 4], "horizon": 50})
    with pytest.raises(ValueError, match=r"no selection draw \(seeds 20000..20000\) could be scored: on each, the "
                                         r"policy finished no request .* of the 2 training draws, 2 finished no "
                                         r"request under any candidate .* azure_M_range"):
        train_ars(cfg)
    assert not (tmp_path / "m").exists()  # the directory the run made is removed again: nothing was written
    with pytest.raises(ValueError, match=r"on each, the policy, or the reference rule \(hinge > 0\), finished no"):
        train_ars(dataclasses.replace(cfg, hinge=0.5))
    (tmp_path / "mine").mkdir()  # a directory that was there before is the user's: left, even empty
    with pytest.raises(ValueError, match="could be scored"):
        train_ars(dataclasses.replace(cfg, out=str(tmp_path / "mine")))
    assert (tmp_path / "mine").is_dir()


def test_ars_counts_the_training_draws_it_leaves_out(tmp_path, monkeypatch, capsys):
    """A training draw on which a candidate finishes no request is left out of that update's scores; the run
    counts them (flowgym_agent.json's unscored_draws, a note unless quiet) and still trains on the others."""
    import json

    import flowgym.lab.ars as ars

    real = ars._episode

    def episode(task):
        if len(task) == 5 and task[2] == 40001:  # a training draw no candidate finishes a request on
            return math.nan
        if len(task) == 5 and task[2] == 40000:  # one every candidate finishes, each request in one slot
            return 1.0
        return real(task)

    monkeypatch.setattr(ars, "_episode", episode)
    cfg = ars.ARSConfig(out=str(tmp_path / "m"), iterations=2, draws=2, directions=1, norm_draws=1, eval_episodes=1,
                        final_eval_seeds=0, workers=1, progress=True,
                        distribution={"kind": "random-mix", "trace_p": 0, "horizon": 80})
    ars.train_ars(cfg)
    meta = json.load(open(tmp_path / "m" / "flowgym_agent.json"))
    assert meta["unscored_draws"] == 1  # seed 40001 is the second draw of update 1 only
    assert ("note: 1 of the 4 training draws were left out of the scores (some candidate finished no request there; "
            "on 1 no candidate did)") in capsys.readouterr().err
    ars.train_ars(dataclasses.replace(cfg, out=str(tmp_path / "q"), progress=False))  # quiet: the file only
    assert "note:" not in capsys.readouterr().err
    assert json.load(open(tmp_path / "q" / "flowgym_agent.json"))["unscored_draws"] == 1


def test_ars_validates_overrides_against_its_first_draw():
    """With a distribution, max_budget and env_overrides are checked on the search's first episode (the first
    training draw), not on the report scenario's workload: a continuous-time override passes for trace pieces
    and is refused, naming it, for draws in slots."""
    from flowgym.lab.ars import ARSConfig

    ARSConfig(out="x", distribution={"kind": "random-mix", "trace_p": 1}, env_overrides={"rate_window": 0.5}).validate()
    with pytest.raises(ValueError, match="rate_window"):
        ARSConfig(out="x", distribution={"kind": "random-mix", "trace_p": 0},
                  env_overrides={"rate_window": 0.5}).validate()


def test_train_config_refuses_multipliers_a_budget_action_drops():
    from flowgym.lab.train import TrainConfig

    with pytest.raises(ValueError, match=r"multipliers=\(1.0, 2.0\) shape action='multiplier'"):
        TrainConfig(action="budget", multipliers=(1.0, 2.0)).validate()
    TrainConfig.generalist(action="budget").validate()  # the generalist's own multipliers are dropped with it
    assert TrainConfig.generalist(action="budget").multipliers == TrainConfig().multipliers


def test_json_arguments_refuse_duplicates_and_deep_nesting(capsys):
    from flowgym.lab.cli import main
    from flowgym.lab.scenarios import AgentSpec

    with pytest.raises(SystemExit):
        main(["train", "--algo", "ppo", "--algo-kwargs", '{"a": 1, "a": 2}'])
    assert "key 'a' is given twice in one object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--distribution", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    assert "nested too deeply to read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--distribution", '{"a": ' + "1" * 1000 + ",}"])
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "(1008 characters)" in err and len(err) < 3000  # the text shown cut short
    with pytest.raises(ValueError, match=r"parameter 'b': key 'x' is given twice"):
        AgentSpec.parse('flow-control:b={"x": 1, "x": 2}')
