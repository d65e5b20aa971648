"""Continuous time: latency models, the clock, timed arrivals, rate schedules, real workloads."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import flowgym
from flowgym import FlowControlEnv, Trace
from flowgym.sim.workloads import azure_lengths, azure_trace, lengths_from_csv, lmsys_like_lengths
from flowgym.sim.latency import PRESETS, JailletLatency, LinearLatency, make_latency_model
from flowgym.sim.rates import Bursts, Sinusoid, Steps, make_rate
from flowgym.sim.workloads import IIDPoisson, make_workload

LIN = {"kind": "linear", "c0": 1.0, "c_prefill": 0.1, "c_decode": 0.01, "c_kv": 0.001}


# ----------------------------------------------------------------- latency models


def test_linear_latency_arithmetic():
    m = LinearLatency(c0=0.05, c_prefill=0.001, c_decode=0.002, c_kv=1e-5)
    # 100 prompt tokens, 10 decoding requests holding 5000 tokens
    assert m.duration(100, 10, 5000, 12) == pytest.approx(0.05 + 0.1 + 0.02 + 0.05)


def test_presets_with_provenance():
    vidur = make_latency_model("llama2-70b-tp2-a100")
    # ms = 55.4 + 0.339 P + 0.166 D + 1.16e-4 K
    assert vidur.duration(1000, 100, 200_000, 105) * 1000 == pytest.approx(55.4 + 339 + 16.6 + 23.2)
    jail = make_latency_model("jaillet2025")
    assert isinstance(jail, JailletLatency)
    # (0.0027 * mean context + 0.52) * batch + 44.6 + 0.378 * prompt tokens, in ms
    # batch of 10 holding K + P = 2000 tokens (mean context 200), 50 prompt tokens
    assert jail.duration(50, 8, 1950, 10) * 1000 == pytest.approx((0.0027 * 200 + 0.52) * 10 + 44.6 + 0.378 * 50)
    assert set(PRESETS) == {"llama2-70b-tp2-a100", "jaillet2025"}
    for name, spec in PRESETS.items():
        assert make_latency_model(spec).to_spec()["kind"] == spec["kind"], name


@pytest.mark.parametrize("bad", [{"c0": -1}, {"c0": float("nan")}, {"c0": 0.05, "c_kv": -1e-6},
                                 {"c0": 0.05, "c_prefill": "x"}, {"c0": 0}])
def test_bad_coefficients_are_clear_errors(bad):
    with pytest.raises(ValueError, match="latency coefficient"):
        make_latency_model({"kind": "linear", **bad})


def test_callable_latency_and_bad_values():
    env = FlowControlEnv(M=100, workload=Trace([0.0], [2], [2], timed=True), horizon=None,
                         time_model=lambda P, D, K, B: 0.5 + P)
    env.reset(seed=0)
    _, _, _, _, info = env.step(1)
    assert info["duration"] == 2.5
    env = FlowControlEnv(M=100, workload=Trace([0.0], [2], [2], timed=True), horizon=None,
                         time_model=lambda P, D, K, B: -1.0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"returned -1.0 .* need a duration of 1e-06 to 3600 seconds"):
        env.step(1)
    with pytest.raises(ValueError, match="preset"):
        FlowControlEnv(time_model="no-such-gpu", workload=Trace([0.0], [2], [2], timed=True), horizon=None)


# ----------------------------------------------------------------- the clock


def run(env, budget):
    env.reset(seed=0)
    infos = []
    done = False
    while not done:
        _, _, te, tr, info = env.step(budget)
        infos.append(info)
        done = te or tr
    return infos


def test_clock_and_arrivals_on_a_hand_made_timed_trace():
    """d = 1 + 0.1 P + 0.01 D + 0.001 K seconds.

    r0 (t=0.0, l=2, o=2), r1 (t=0.5, l=1, o=1), r2 (t=1.2, l=3, o=1), r3 (t=10, l=4, o=1); B = 5.
    iteration 0 starts 0.0: r0 joins; P=2           -> d=1.2, ends 1.2.
    iteration 1 starts 1.2: r1 (0.5) and r2 (1.2, at the start: joins) join; P=4, D=1 (r0), K=3
                                                     -> d=1+0.4+0.01+0.003=1.413, ends 2.613. All finish.
    iteration 2: idle, empty queue: jumps to 10.0; r3 joins; P=4 -> d=1.4, ends 11.4.
    """
    tr = Trace([0.0, 0.5, 1.2, 10.0], [2, 1, 3, 4], [2, 1, 1, 1], timed=True)
    env = FlowControlEnv(M=100, workload=tr, horizon=None, time_model=LIN)
    infos = run(env, 5)
    assert [i["arrived"] for i in infos] == [1, 2, 1]
    assert [round(i["duration"], 9) for i in infos] == [1.2, 1.413, 1.4]
    assert [round(i["time"], 9) for i in infos] == [1.2, 2.613, 11.4]
    assert infos[-1]["t"] == 2
    log = env.request_log()
    assert log["arrival"].tolist() == [0, 1, 1, 2]  # the iteration each joined
    np.testing.assert_allclose(log["finish_time"], [2.613, 2.613, 2.613, 11.4])
    m = env.metrics()
    lat = np.array([2.613 - 0.0, 2.613 - 0.5, 2.613 - 1.2, 1.4])
    assert m["avg_latency"] == pytest.approx(lat.mean())
    assert m["elapsed"] == pytest.approx(11.4)
    assert m["request_throughput"] == pytest.approx(4 / 11.4)


def test_evicted_prefill_is_not_charged_and_reward_is_time_weighted():
    """M = 8: r0 (l=3, o=3) runs; r1 (l=4, o=2) admitted at iteration 1 overflows (demand 5+5 > 8)
    and is evicted (LIFO): iteration 1 prefills nothing, decodes r0 holding K = 4."""
    tr = Trace([0.0, 0.0], [3, 4], [3, 2], timed=True)
    env = FlowControlEnv(M=8, workload=tr, horizon=None, time_model=LIN, reward_scale=1.0,
                         reward_weights={"in_system": 1.0, "wasted_tokens": 0.0})
    env.reset(seed=0)
    _, r0, *_ , i0 = env.step(1)  # admits r0: P=3 -> d = 1.3
    assert i0["duration"] == pytest.approx(1.3)
    assert r0 == pytest.approx(-2 * 1.3)  # two requests in the system for 1.3 s
    _, _, _, _, i1 = env.step(1)  # admits r1, evicted at once
    assert i1["evicted"] == 1
    assert i1["duration"] == pytest.approx(1.0 + 0.01 * 1 + 0.001 * 4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_return_is_the_total_latency_in_continuous_time(seed):
    """The requests that arrive during an iteration join at its end: their wait until then is in the reward
    too (it was not: a review found 0.90 of 0.98 s), so minus the episode's return is the sum of latencies,
    ``mean_time_in_system`` times the requests, with evictions and idle gaps."""
    rng = np.random.default_rng(seed)
    n = 80
    tr = Trace(np.sort(rng.uniform(0, 30, n)), rng.integers(1, 40, n), rng.integers(1, 30, n), timed=True)
    env = FlowControlEnv(M=300, workload=tr, horizon=None, time_model=LIN, reward_scale=1.0,
                         reward_weights={"in_system": 1.0, "wasted_tokens": 0.0})
    env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        _, r, te, tru, _ = env.step(int(rng.integers(0, 6)))
        total -= r
        done = te or tru
    m = env.metrics()
    counted = m["arrived"] - m["rejected"]
    assert m["evictions"] > 0 and counted > 0
    assert total == pytest.approx(m["mean_time_in_system"] * counted, rel=1e-9)
    log = env.request_log()
    done_ = log["finish_time"] >= 0
    np.testing.assert_allclose(m["avg_latency"] * m["completed"],
                               (log["finish_time"] - log["arrival_time"])[done_].sum(), rtol=1e-9)


def test_time_model_needs_a_timed_workload_and_vice_versa():
    with pytest.raises(ValueError, match="timed workload"):
        FlowControlEnv(time_model="llama2-70b-tp2-a100")
    with pytest.raises(ValueError, match="time_model"):
        FlowControlEnv(workload=Trace([0.5], [1], [1], timed=True), horizon=None)


def test_timed_env_passes_check_env_and_observes_duration():
    import gymnasium as gym

    env = gym.make("FlowControl-v0", workload={"kind": "iid", "rate": 20.0, "lengths": {"kind": "lmsys-like"},
                                               "timed": True},
                   time_model="llama2-70b-tp2-a100", horizon=200, rate_window=2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    obs, _ = env.reset(seed=1)
    for _ in range(150):  # about 10 s at ~0.07 s per iteration: five rate windows
        obs, *_ = env.step(4)
    assert 0.05 < obs["last_duration"][0] < 2.0
    # An exponential moving average of a Poisson process of rate 20/s with time constant 2 s has
    # variance lambda / (2 tau) = 5 (sd 2.24): four standard deviations around the true 20.
    assert 11.0 < obs["arrival_rate"][0] < 29.0


def test_arrival_rate_counts_the_idle_jumps():
    """One request every 10 s, served in 0.15 s: the server is idle most of the time and jumps from one
    arrival to the next. The observed rate is a moving average over time (``rate_window`` seconds), so each
    arrival is averaged over the time since the last count, the jump included: 0.1 per second. Counted
    over the iteration's duration alone (0.05 s), it would read about 1.3 per second."""
    n = 200
    tr = Trace(np.arange(n) * 10.0, [5] * n, [3] * n, timed=True)
    env = FlowControlEnv(M=1000, workload=tr, horizon=None, time_model={"kind": "linear", "c0": 0.05},
                         rate_window=100.0, observation="dict")
    env.reset(seed=0)
    seen = []
    done = False
    while not done:
        obs, _, te, tr_, info = env.step(4)
        done = te or tr_
        if info["time"] > 1000.0 and not done:  # ten rate windows in: the start-up from 0 has faded
            seen.append(float(obs["arrival_rate"][0]))
    assert len(seen) > 250
    assert 0.099 < min(seen) and max(seen) < 0.101


def test_discrete_mode_has_no_time_keys():
    env = FlowControlEnv()
    env.reset(seed=0)
    info = env.step(3)[4]
    assert "duration" not in info and "last_duration" not in env.observation_space.spaces
    assert "finish_time" not in env.request_log()


@settings(max_examples=25, deadline=None)
@given(M=st.integers(200, 5000), rate=st.floats(0.5, 30.0), seed=st.integers(0, 10**6),
       eviction=st.sampled_from(["lifo", "all"]))
def test_invariants_in_continuous_time(M, rate, seed, eviction):
    env = FlowControlEnv(
        M=M, eviction=eviction, horizon=150, time_model=LIN,
        workload={"kind": "iid", "rate": rate, "timed": True,
                  "lengths": {"kind": "lognormal", "prompt_median": 20, "prompt_mean": 40,
                              "output_median": 10, "output_mean": 20, "max_prompt": 300, "max_output": 100}},
    )
    env.reset(seed=seed)
    env.action_space.seed(seed)
    last = 0.0
    for _ in range(150):
        _, r, _, _, info = env.step(env.action_space.sample())
        assert info["usage"] <= M and info["time"] > last and np.isfinite(r)
        last = info["time"]
        eng = env.engine
        log = env.request_log()
        done = ~np.isnan(log["finish_time"])
        assert log["arrival"].size == log["rejected"].sum() + eng.n_queued + eng.n_active + done.sum()
        assert np.all(log["arrival_time"] <= eng.now + 1e-12)
        # a request finishes no earlier than o iterations of at least c0 = 1 s after it arrived
        assert np.all(log["finish_time"][done] - log["arrival_time"][done] >= log["output_len"][done] * 1.0 - 1e-9)


# ----------------------------------------------------------------- timed workloads and rates


def test_timed_poisson_rate_and_determinism():
    w = IIDPoisson(5.0, {"kind": "empirical", "pairs": [[1, 1]]}, timed=True)
    a = w.sample(np.random.default_rng(3), 0.0, 2000.0)
    b = w.sample(np.random.default_rng(3), 0.0, 2000.0)
    np.testing.assert_array_equal(a.arrival, b.arrival)
    assert a.arrival.dtype == np.float64 and np.all(np.diff(a.arrival) >= 0)
    assert a.arrival.size == pytest.approx(10000, abs=5 * math.sqrt(10000))


def test_finite_iid_workload_stops_at_n_requests():
    env = FlowControlEnv(workload={"kind": "iid", "rate": 50.0, "lengths": {"kind": "lmsys-like"},
                                   "n_requests": 300, "timed": True},
                         time_model="llama2-70b-tp2-a100", horizon=None)
    infos = run(env, 64)
    log = env.request_log()
    assert log["arrival"].size == 300 and (~np.isnan(log["finish_time"])).sum() == 300
    assert len(infos) < 10_000


@pytest.mark.parametrize("sched", [
    Steps([0, 100, 300], [2.0, 10.0, 4.0]),
    Steps([0, 50], [1.0, 6.0], period=200),
    Sinusoid(5.0, 4.0, period=250.0, phase=0.1),
    Bursts(1.0, 20.0, every=100, duration=10, start=30),
    Bursts(1.0, 20.0, every=100, duration=25, start=75),  # the burst ends with the period
    Bursts(1.0, 20.0, every=100, duration=25, start=85),  # the burst wraps into the next period
])
def test_rate_schedules_integral_and_sampling(sched):
    # integral against a fine Riemann sum
    t = np.linspace(0, 1000, 200_001)
    num = np.trapezoid(sched.rate(t), t)
    assert float(sched.integral(0.0, 1000.0)) == pytest.approx(num, rel=2e-3)
    times = np.concatenate([sched.sample_times(np.random.default_rng(s), 0.0, 1000.0) for s in range(20)])
    assert times.size / 20 == pytest.approx(float(sched.integral(0.0, 1000.0)), rel=0.05)
    # arrivals follow the intensity: compare counts in the busiest and quietest 50 s
    edges = np.arange(0, 1001, 50.0)
    expect = sched.integral(edges[:-1], edges[1:]) * 20
    got = np.histogram(times, edges)[0]
    k = int(np.argmax(expect))
    assert got[k] == pytest.approx(expect[k], rel=0.2)
    assert make_rate(sched.to_spec()).to_spec() == sched.to_spec()


@pytest.mark.parametrize("start", [0.0, 30.0, 75.0, 85.0])
def test_bursts_rate_where_the_burst_is(start):
    b = Bursts(1.0, 20.0, every=100, duration=25, start=start)
    t = np.arange(0.0, 300.0, 0.5)
    inside = ((t - start) % 100) < 25
    np.testing.assert_array_equal(b.rate(t), np.where(inside, 20.0, 1.0))


def test_discrete_time_varying_rates():
    w = make_workload({"kind": "iid", "rate": {"kind": "steps", "times": [0, 1000], "rates": [1.0, 9.0]},
                       "lengths": {"kind": "empirical", "pairs": [[1, 1]]}})
    req = w.sample(np.random.default_rng(0), 0, 2000)
    first, second = (req.arrival < 1000).sum(), (req.arrival >= 1000).sum()
    assert first == pytest.approx(1000, abs=150) and second == pytest.approx(9000, abs=450)


@pytest.mark.parametrize("bad,match", [
    ({"kind": "steps", "times": [1, 2], "rates": [1, 2]}, "start at 0"),
    ({"kind": "steps", "times": [0], "rates": [-1]}, "rates\\[0\\]"),
    ({"kind": "sinusoid", "mean": 1, "amplitude": 2, "period": 10}, "amplitude"),
    ({"kind": "bursts", "base": 1, "burst": 5, "every": 10, "duration": 20}, "duration"),
    ({"kind": "wave"}, "rate kind"),
])
def test_bad_rate_schedules(bad, match):
    with pytest.raises(ValueError, match=match):
        make_rate(bad)


# ----------------------------------------------------------------- real workloads


@pytest.mark.parametrize("kind,rows", [("conv", 19366), ("code", 8819)])
def test_azure_traces(kind, rows):
    tr = azure_trace(kind)
    assert len(tr) == rows and tr.timed
    assert np.all(np.diff(tr.arrival) >= 0) and tr.arrival[0] == 0.0
    assert tr.prompt_len.min() >= 1 and tr.output_len.min() >= 1
    assert 3000 < tr.last_arrival < 4000  # about an hour
    fast = azure_trace(kind, rate_multiplier=2.0)
    np.testing.assert_allclose(fast.arrival, tr.arrival / 2)
    cut = azure_trace(kind, window=(600, 1200))
    assert cut.arrival[0] == 0.0 and cut.last_arrival < 600 and 0 < len(cut) < rows
    with pytest.raises(ValueError, match="window"):
        azure_trace(kind, window=(10**6, 10**6 + 1))
    lengths = azure_lengths(kind)
    assert lengths.mean_work() > 0


def test_azure_figures_match_the_data_readme():
    conv = azure_trace("conv")
    assert conv.prompt_len.mean() == pytest.approx(1155, abs=1)
    assert np.median(conv.output_len) == pytest.approx(129, abs=1)
    assert conv.prompt_len.max() == 14050


def test_lmsys_like_is_fitted_to_published_figures():
    d = lmsys_like_lengths()
    l, o = d.sample(np.random.default_rng(0), 200_000)
    assert np.median(l) == pytest.approx(11, abs=1) and np.median(o) == pytest.approx(45, abs=1)
    assert l.mean() == pytest.approx(40.62, rel=0.05) and o.mean() == pytest.approx(85.32, rel=0.05)


def test_user_length_csv(tmp_path):
    p = tmp_path / "lmsys.csv"
    p.write_text("prompt_words,response_words\n10,20\n10,20\n5,7\n")
    d = lengths_from_csv(p, prompt_len="prompt_words", output_len="response_words")
    assert d.pairs.tolist() == [[5, 7], [10, 20]] and d.p.tolist() == pytest.approx([1 / 3, 2 / 3])
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt_words,response_words\n10,20\n10,x\n")
    with pytest.raises(flowgym.TraceError, match="row 3"):
        lengths_from_csv(bad, prompt_len="prompt_words", output_len="response_words")
    (tmp_path / "renamed.csv").write_text("prompt,response_words\n10,20\n")  # the prompt column named by its role
    with pytest.raises(flowgym.TraceError, match=r"no column 'prompt_words' \(for prompt_len\)"):
        lengths_from_csv(tmp_path / "renamed.csv", prompt_len="prompt_words", output_len="response_words")
    (tmp_path / "empty.csv").write_text("prompt_words,response_words\n")
    with pytest.raises(flowgym.TraceError, match="empty.csv' has no rows after the header"):
        lengths_from_csv(tmp_path / "empty.csv", prompt_len="prompt_words", output_len="response_words")


def test_timed_trace_csv_and_spec_round_trip(tmp_path):
    import gymnasium as gym

    p = tmp_path / "t.csv"
    p.write_text("ts,in,out\n0.25,5,3\n0.0,4,2\n2.5,3,3\n")
    wl = {"kind": "trace", "path": str(p), "arrival": "ts", "prompt_len": "in", "output_len": "out", "timed": True}
    env = gym.make("FlowControl-v0", M=100, workload=wl, horizon=None, time_model="jaillet2025")
    env2 = gym.make(gym.envs.registration.EnvSpec.from_json(env.spec.to_json()))
    a, b = run(env, 2), run(env2, 2)
    assert a == b
    assert env.unwrapped.request_log()["arrival_time"].tolist() == [0.0, 0.25, 2.5]
    env3 = gym.make("FlowControl-v0", workload={"kind": "azure", "trace": "code", "window": [0, 120]},
                    time_model="llama2-70b-tp2-a100", horizon=None, M=131072)
    json_spec = env3.spec.to_json()
    assert "azure" in json_spec


def test_realdata_and_azure_scenarios_run():
    from flowgym.agents import make_agent
    from flowgym.lab.evaluation import run_episode
    from flowgym.lab.scenarios import get_scenario

    sc = get_scenario("paper-realdata-low")
    kw = sc.env_kwargs()
    kw["workload"]["n_requests"] = 400
    ep = run_episode(make_agent("flow-control", b=2), kw, seed=0, horizon=None)
    m = ep.metrics()
    assert m["completed"] == 400 and m["elapsed"] > 30  # 400 requests at 10/s
    az = get_scenario("azure-code")
    kw = az.env_kwargs()
    kw["workload"]["window"] = [0, 200]
    ep = run_episode(make_agent("greedy-lifo"), kw, seed=0, horizon=None)
    assert ep.metrics()["completed"] == ep.log["arrival"].size


def test_finite_scenarios_tune_on_a_smaller_workload_run_to_its_end():
    from flowgym.lab.scenarios import get_scenario

    sc = get_scenario("paper-realdata-low")
    kw = sc.tune_env_kwargs()
    assert kw["workload"]["n_requests"] == 5_000 and kw["workload"]["rate"] == 10.0
    assert kw["workload"]["lengths"] == {"kind": "lmsys-like"}
    assert sc.env_kwargs()["workload"]["n_requests"] == 50_000  # the reported runs are untouched
    assert kw["horizon"] < sc.env_kwargs()["horizon"]
    az = get_scenario("azure-code", rate=0.5).tune_env_kwargs()
    assert az["workload"] == {"kind": "azure", "trace": "code", "rate_multiplier": 0.5, "window": [0.0, 900.0]}
    env = flowgym.FlowControlEnv(**az)
    env.reset(seed=0)
    from importlib import resources

    with resources.files("flowgym.data").joinpath("azure_code_2023.npz").open("rb") as fh:
        seconds = np.load(fh)["time"]  # seconds from the trace's first request
    assert env.unwrapped.workload.total_requests == int((seconds < 900.0).sum()) == 2598  # the first 15 minutes
