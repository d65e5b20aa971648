"""The vllm-v1 engine mode (flowgym.sim.vllm): the bridge to the paper's model and vLLM's rules."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import flowgym  # noqa: F401  (registers FlowControl-v0)
from flowgym.agents import make_agent
from flowgym.sim.engine import Engine
from flowgym.sim.vllm import BRIDGE_OPTIONS, VllmEngine, VllmOptions, default_max_tokens
from flowgym.sim.workloads import Trace, TraceError, make_workload

LINEAR = {"kind": "linear", "c0": 0.01, "c_prefill": 1e-4, "c_decode": 1e-3, "c_kv": 1e-5}


def _run(eng: Engine, budget, T: int):
    eng.reset(np.random.default_rng(0))
    for t in range(T):
        eng.arrive()
        eng.serve(budget(t))
    return eng.request_log(), eng.series()


def _same(a: dict, b: dict) -> None:
    for k in a:
        x, y = a[k], b[k]
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k


@pytest.mark.parametrize("case", range(60))
def test_bridge_reproduces_the_paper_mode(case):
    """Block size 1, lookahead 1, no chunking, no max_num_seqs or token budget, admission by count
    and progress lost on eviction: the request log and the slot records are the paper mode's, on
    random traces in unit slots, with per-class budgets and in continuous time."""
    r = np.random.default_rng(case)
    n, T = int(r.integers(5, 80)), int(r.integers(20, 160))
    lp, op, M = r.integers(1, 30, n), r.integers(1, 40, n), int(r.integers(30, 400))
    kind = case % 3
    kw: dict = {}
    if kind == 0:
        tr = Trace(np.sort(r.integers(0, T // 2 + 1, n)), lp, op)
        b = r.integers(0, 6, T)
    elif kind == 1:
        tr = Trace(np.sort(r.integers(0, T // 2 + 1, n)), lp, op, cls=r.integers(0, 3, n), num_classes=3)
        kw["per_class"] = True
        b = r.integers(0, 3, (T, 3))
    else:
        tr = Trace(np.sort(r.uniform(0, 2.0, n)), lp, op, timed=True)
        kw["time_model"] = LINEAR
        b = r.integers(0, 6, T)
    log_p, ser_p = _run(Engine(M, tr, **kw), lambda t: b[t], T)
    log_v, ser_v = _run(VllmEngine(M, tr, options=BRIDGE_OPTIONS, **kw), lambda t: b[t], T)
    _same(log_p, {k: log_v[k] for k in log_p})
    _same(ser_p, {k: ser_v[k] for k in ser_p})


def test_bridge_cases_exercise_eviction():
    """The bridge cases are not trivially eviction-free."""
    total = 0
    for case in range(0, 60, 3):
        r = np.random.default_rng(case)
        n, T = int(r.integers(5, 80)), int(r.integers(20, 160))
        lp, op, M = r.integers(1, 30, n), r.integers(1, 40, n), int(r.integers(30, 400))
        tr = Trace(np.sort(r.integers(0, T // 2 + 1, n)), lp, op)
        b = r.integers(0, 6, T)
        log, _ = _run(Engine(M, tr), lambda t: b[t], T)
        total += int(log["evictions"].sum())
    assert total > 50


def _one(eng: VllmEngine, budgets):
    eng.reset(np.random.default_rng(0))
    out = []
    for b in budgets:
        eng.arrive()
        out.append(eng.serve(b))
    return out


def test_blocks_and_recompute_preemption_keep_output_tokens():
    """A 3-block cache of 16-token blocks, two requests of prompt 16 and output 30: both prefill
    (one block each); next step A needs a second block, then B does too: none is free, so B (the
    most recently admitted) preempts itself, keeps its one output token, and is prefilled again
    over 17 tokens once A has finished."""
    tr = Trace([0, 0], [16, 16], [30, 30])
    eng = VllmEngine(48, tr, options={"block_size": 16, "max_num_batched_tokens": None})
    st = _one(eng, [2] * 80)
    log = eng.request_log()
    assert st[0].admitted == 2 and st[0].usage == 32
    assert st[1].evicted == 1 and st[1].usage == 32 and eng.request_log()["evictions"].tolist() == [0, 1]
    assert (log["finish"] > 0).all() and log["finish"][0] == 30 and log["finish"][1] > 30
    assert eng.recomputed_tokens == 16 and eng.wasted_tokens == 0
    assert eng.generated_tokens == 60  # nothing generated is lost (the paper would regenerate B's token)
    assert eng.prefill_tokens == 16 + 16 + 17
    assert log["first_token"].tolist() == [1, 1]
    assert eng.serving_metrics()["num_preemptions"] == 1


def test_lifo_victim_goes_to_the_front_and_no_admission_on_a_preempting_step():
    # cache of 3 blocks of 4 tokens: A (l=4) and B (l=4) run; C waits; B is preempted when A grows
    tr = Trace([0, 0, 0], [4, 4, 2], [9, 9, 1])
    eng = VllmEngine(12, tr, options={"block_size": 4, "max_num_batched_tokens": None})
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    st = eng.serve(2)  # A, B prefill: 1 block each
    assert st.admitted == 2 and eng.used_blocks == 2
    for _ in range(10):
        eng.arrive()
        st = eng.serve(5)
        if st.evicted:
            break
    assert st.evicted == 1 and st.admitted == 0  # a preempting step admits nobody
    q = eng.queue_ids()
    assert q[0] == 1  # B, the most recently admitted, at the front, ahead of C
    assert eng.gen[1] > 0  # B kept its output tokens


def test_token_budget_chunks_long_prompts_decodes_first():
    tr = Trace([0, 0], [3, 100], [50, 2])
    eng = VllmEngine(10_000, tr, options={"block_size": 16, "max_num_batched_tokens": 32})
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    eng.serve(1)  # request 0 prefills 3 tokens
    eng.arrive()
    eng.serve(1)  # request 0 decodes 1; request 1 gets the 31 tokens left
    assert eng.active_computed().tolist() == [4, 31]
    steps = eng.step_series()
    assert steps["prefill_tokens"].tolist() == [3, 31] and steps["decode_requests"].tolist() == [0, 1]
    for _ in range(3):
        eng.arrive()
        eng.serve(0)
    assert eng.active_computed().tolist()[1] == 100  # 31 + 31 + 31 + 7: chunks until the prompt is in
    assert eng.gen[1] == 1  # the step that completes the prompt samples its first token


def test_unchunked_prefill_waits_for_the_budget():
    tr = Trace([0, 0], [60, 100], [50, 2])  # 60 + 100 > the step's 128 tokens: the second waits
    eng = VllmEngine(128, tr, options={"block_size": 16, "max_num_batched_tokens": 128, "chunked_prefill": False})
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    st = eng.serve(2)
    assert st.admitted == 1 and eng.total_refused == 1


def test_what_could_never_be_admitted_is_refused_or_rejected():
    """Review (2026-11-28): an unchunked prefill longer than the step's token budget (a long prompt, or the
    recompute of a preempted request) waited at the head forever: it is refused as vLLM refuses it. A request
    whose admission needs more blocks than the watermark leaves was rejected on arrival (V0's AllocStatus.NEVER);
    vLLM V1's watermark applies only while some request runs (allocate_slots(has_scheduled_reqs=
    bool(self.running))), so it is admitted into the empty cache and nothing waits at the head for good (review
    2026-11-29). Integer options beyond 2**53 are named."""
    import gymnasium as gym

    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(64\) is smaller than M \(150"):
        VllmEngine(150, Trace([0], [40], [100]), options={"chunked_prefill": False, "max_num_batched_tokens": 64})
    # bs = 1, NB = 100, watermark 50 blocks. Request 0 (l=60, o=10) at step 0: nothing runs, no watermark:
    # 60 <= 100, admitted (its tokens at steps 0..9: finish 10). Request 1 (l=20, o=5) at step 1: 0 runs,
    # 20 + 50 > 100 - 61 free: it waits until 0 is done, then is admitted at step 10 (tokens 10..14: finish 15).
    for opts in ({"watermark": 0.5, "reserve_full_prompt": True, "block_size": 1}, {"watermark": 0.5, "block_size": 1}):
        eng = VllmEngine(100, Trace([0, 1], [60, 20], [10, 5]), options=opts)
        eng.reset(np.random.default_rng(0))
        for _ in range(40):
            eng.arrive()
            eng.serve(1)
        log = eng.request_log()
        assert log["rejected"].tolist() == [False, False] and eng.n_queued == 0
        assert log["finish"].tolist() == [10, 15] and log["first_token"].tolist() == [1, 11]
    ok = VllmEngine(100, Trace([0], [60], [10]), options={"watermark": 0.3, "block_size": 1})
    ok.reset(np.random.default_rng(0))
    ok.arrive()
    assert ok.serve(1).admitted == 1 and not ok.request_log()["rejected"][0]
    with pytest.raises(ValueError, match="engine_options watermark=0.5 needs admission='blocks'"):
        VllmEngine(100, Trace([0], [60], [10]), options={"watermark": 0.5, "block_size": 1, "admission": "count",
                                                          "max_num_batched_tokens": None})
    for eo, name in (({"max_num_batched_tokens": 2**64}, "max_num_batched_tokens"),
                     ({"lookahead_tokens": 2**63 - 1}, "lookahead_tokens"), ({"max_tokens": 2**60}, "max_tokens")):
        with pytest.raises(ValueError, match=f"engine_options {name} must be at most 2\\*\\*53"):
            gym.make("FlowControl-v0", engine="vllm-v1", engine_options=eo, horizon=5)


def test_max_num_seqs_and_refused_count():
    tr = Trace([0] * 10, [5] * 10, [20] * 10)
    eng = VllmEngine(10_000, tr, options={"max_num_seqs": 4})
    st = _one(eng, [10, 10])
    assert st[0].admitted == 4 and st[1].admitted == 0
    assert eng.total_refused == 6 + 6


def test_watermark_and_full_prompt_reservation_refuse_what_v1_admits():
    tr = Trace([0, 0], [40, 40], [3, 3])
    base = {"block_size": 16, "max_num_batched_tokens": 16}
    v1 = VllmEngine(96, tr, options=base)  # 6 blocks; V1 allocates the first 16-token chunk only
    assert _one(v1, [2])[0].admitted == 1  # the token budget (16) is spent by the first chunk
    full = VllmEngine(80, Trace([0, 0], [40, 40], [3, 3]), options={**base, "max_num_batched_tokens": 100,
                                                                    "reserve_full_prompt": True})
    assert _one(full, [2])[0].admitted == 1  # 5 blocks: the first prompt's 3 blocks, then 2 < 3 free
    wm = VllmEngine(96, Trace([0, 0], [40, 40], [3, 3]), options={"block_size": 16, "max_num_batched_tokens": None,
                                                                  "watermark": 0.2})
    # 6 blocks, int(0.2 * 6) = 1 kept free once a request runs: the first enters the empty cache (3 <= 6); for
    # the second the first is running: 3 + 1 > 3 free
    assert _one(wm, [2])[0].admitted == 1


def test_block_rounding_rejects_what_never_fits():
    # l + o = 60 <= M = 60 fits the paper's model; with 16-token blocks it needs ceil(59/16) = 4 > 3 blocks
    tr = Trace([0], [30], [30])
    eng = VllmEngine(60, tr, options={"block_size": 16})
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    assert eng.total_rejected == 1
    p = Engine(60, Trace([0], [30], [30]))
    p.reset(np.random.default_rng(0))
    p.arrive()
    assert p.total_rejected == 0


def test_same_seed_same_result_and_random_order_is_seeded():
    kw = dict(workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 5.0},
              engine="vllm-v1", engine_options={"preempt_order": "random", "max_num_seqs": None, "block_size": 16},
              horizon=300)
    runs = []
    for _ in range(2):
        env = gym.make("FlowControl-v0", **kw)
        env.reset(seed=11)
        for _ in range(300):
            env.step(40)
        runs.append(env.unwrapped.request_log())
    _same(runs[0], runs[1])
    assert runs[0]["evictions"].sum() > 0


def test_serving_metrics_are_named_and_consistent():
    env = gym.make("FlowControl-v0", engine="vllm-v1", engine_options={"max_num_seqs": None}, horizon=400,
                   workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 5.0})
    env.reset(seed=2)
    for _ in range(400):
        _, _, _, _, info = env.step(30)
    m = env.unwrapped.metrics()
    for k in ("num_preemptions", "refused_admissions", "time_to_first_token_p50", "time_to_first_token_p99",
              "inter_token_latency_p50", "inter_token_latency_p99", "num_requests_running_mean",
              "num_requests_waiting_mean", "kv_cache_usage_perc_mean", "kv_cache_usage_perc_max"):
        assert k in m, k
    assert m["num_preemptions"] == m["evictions"] > 0
    assert m["inter_token_latency_p50"] == 1.0 and m["inter_token_latency_p99"] >= 1.0
    assert 1.0 <= m["time_to_first_token_p50"] <= m["time_to_first_token_p99"]
    assert 0 < m["kv_cache_usage_perc_mean"] <= m["kv_cache_usage_perc_max"] <= 1.0
    assert "refused" in info and "prefill_tokens" in info
    log = env.unwrapped.request_log()
    done = log["finish"] > 0
    assert (log["first_token"][done] > log["arrival"][done]).all()
    assert (log["max_tokens"] >= log["output_len"]).all()


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="engine must be one of"):
        gym.make("FlowControl-v0", engine="vllm")
    with pytest.raises(ValueError, match="block_size"):
        gym.make("FlowControl-v0", engine="vllm-v1", engine_options={"block_size": 0})
    with pytest.raises(ValueError, match="unknown engine_options"):
        gym.make("FlowControl-v0", engine="vllm-v1", engine_options={"blocksize": 16})
    with pytest.raises(ValueError, match="engine 'paper' takes none"):
        gym.make("FlowControl-v0", engine_options={"block_size": 16})
    with pytest.raises(ValueError, match="queue_order"):
        gym.make("FlowControl-v0", engine="vllm-v1", queue_order="sjf", output_length_known=True)
    with pytest.raises(ValueError, match="watermark"):
        VllmOptions.from_any({"watermark": 1.5})
    with pytest.raises(ValueError, match="preempt_order"):
        VllmOptions.from_any({"preempt_order": "fifo"})


def test_max_tokens_trace_column_and_default():
    tr = Trace([0, 0], [5, 5], [10, 3], max_tokens=[12, 100])
    eng = VllmEngine(1000, tr, options={"block_size": 1})
    _one(eng, [2])
    assert eng.request_log()["max_tokens"].tolist() == [12, 100]
    with pytest.raises(TraceError, match="max_tokens"):
        Trace([0], [5], [10], max_tokens=[9])
    assert default_max_tokens(np.array([10, 10]), np.array([20, 60]), 60, 16492).tolist() == [60, 60]
    assert default_max_tokens(np.array([10]), np.array([20]), None, 100).tolist() == [90]


def test_max_tokens_from_a_csv_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t,l,o,cap\n0,5,10,12\n0,5,3,100\n1,4,2,2\n")
    spec = {"kind": "trace", "path": str(path), "arrival": "t", "prompt_len": "l", "output_len": "o",
            "max_tokens_column": "cap"}
    tr = make_workload(spec)
    assert tr.max_tokens.tolist() == [12, 100, 2]
    assert make_workload(tr.to_spec()).max_tokens.tolist() == [12, 100, 2]  # the spec round trip keeps it
    path.write_text("t,l,o,cap\n0,5,10,12\n0,5,3,2\n")
    with pytest.raises(TraceError, match="row 3.*max_tokens 2"):  # below the output length: row and value named
        make_workload(spec)


@pytest.mark.parametrize("engine", ["paper", "vllm-v1"])
def test_no_evict_controller_never_evicts_and_sglang_runs(engine):
    kw = dict(workload={"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": 5.0},
              engine=engine, horizon=600, max_budget=1024)
    if engine == "vllm-v1":
        kw["engine_options"] = {"max_num_seqs": None}
    res = {}
    for name in ("trt-no-evict", "sglang-reserve", "greedy-lifo"):
        ag = make_agent(name)
        env = gym.make("FlowControl-v0", **kw)
        obs, _ = env.reset(seed=5)
        ag.reset(env.unwrapped.config, seed=5)
        done = False
        while not done:
            obs, _, te, tr, _ = env.step(ag.act(obs, env.unwrapped.view()))
            done = te or tr
        res[name] = env.unwrapped.metrics()
    assert res["trt-no-evict"]["evictions"] == 0 and res["trt-no-evict"]["completed"] > 1000
    assert res["greedy-lifo"]["evictions"] > 0
    # reserving against a discounted remainder admits more than reserving the whole cap
    assert res["sglang-reserve"]["mean_kv_usage"] > res["trt-no-evict"]["mean_kv_usage"]


SERVING_KEYS = ("time_to_first_token_mean", "time_to_first_token_p50", "time_to_first_token_p99",
                "refused_admissions", "recomputed_tokens", "prefill_tokens", "generation_tokens",
                "num_requests_running_mean", "num_requests_waiting_mean")


@pytest.mark.parametrize("timed", [False, True])
def test_serving_metrics_at_a_horizon_are_a_shorter_runs(timed):
    """serving_metrics_at(log, series, T) of a long run equals the engine's serving_metrics() of a T-step run on
    the same arrivals, at every T (TTFT counts first tokens by the end of step T), in slots and seconds."""
    from flowgym.sim.vllm import SERVING_TABLE_METRICS, serving_metrics_at

    assert SERVING_TABLE_METRICS == SERVING_KEYS
    r = np.random.default_rng(5)
    n = 120
    lp, op = r.integers(1, 200, n), r.integers(1, 80, n)
    if timed:
        tr, kw = Trace(np.sort(r.uniform(0, 3.0, n)), lp, op, timed=True), {"time_model": LINEAR}
    else:
        tr, kw = Trace(np.sort(r.integers(0, 60, n)), lp, op), {}
    opts = {"block_size": 16, "max_num_seqs": 40, "max_num_batched_tokens": 256}
    b = r.integers(0, 8, 300)
    log, ser = _run(VllmEngine(2000, tr, options=opts, **kw), lambda t: b[t], 300)
    whole = VllmEngine(2000, tr, options=opts, **kw)
    _run(whole, lambda t: b[t], 300)
    full = whole.serving_metrics()
    assert full["recomputed_tokens"] > 0 and full["refused_admissions"] > 0  # the case exercises both
    for T in (0, 1, 17, 80, 151, 300):
        eng = VllmEngine(2000, tr, options=opts, **kw)
        _run(eng, lambda t: b[t], T)
        want, got = eng.serving_metrics(), serving_metrics_at(log, ser, T)
        for k in SERVING_KEYS:
            assert got[k] == pytest.approx(want[k], nan_ok=True), (T, k)
    with pytest.raises(ValueError, match=r"T must be a whole number of steps in \[0, 300\], got 301"):
        serving_metrics_at(log, ser, 301)
    p_log, p_ser = _run(Engine(2000, tr, **kw), lambda t: b[t], 50)
    with pytest.raises(ValueError, match="engine='paper' records no per-token times"):
        serving_metrics_at(p_log, p_ser, 10)


def test_compare_tables_carry_the_serving_metrics_of_a_vllm_run(tmp_path):
    """evaluate() on engine vllm-v1: every row, the summary and the CSV have the serving metrics at each
    horizon, the terminal table a TTFT column; the paper engine's table has none. tune() takes a serving metric
    on vllm-v1 and refuses it, naming the engine, on the paper's."""
    import csv

    from flowgym.lab.evaluation import SERVING_METRICS, TABLE_METRICS, build_agent, evaluate, run_episode, tune
    from flowgym.lab.scenarios import AgentSpec

    env = {"M": 4000, "workload": {"kind": "poisson", "classes": [[10, 20], [10, 40]], "rates": 2.0}}
    vk = {**env, "engine": "vllm-v1", "engine_options": {"max_num_seqs": 64}}
    agents = [AgentSpec("flow-control", {"b": 4}), AgentSpec("greedy-lifo", {})]
    t = evaluate(agents, vk, [0, 1], [100, 250])
    assert t.metric_names == TABLE_METRICS + SERVING_METRICS
    assert all(all(k in r for k in SERVING_KEYS) for r in t.rows)
    ep = run_episode(build_agent(agents[0]), vk, 1, 250)
    row = next(r for r in t.rows if r["agent"] == "flow-control b=4" and r["seed"] == 1 and r["horizon"] == 100)
    assert row["time_to_first_token_p50"] == ep.metrics(100)["time_to_first_token_p50"]
    assert row["refused_admissions"] == int(ep.series["refused"][:100].sum())
    s = [x for x in t.summary() if x["horizon"] == 250]
    assert all(np.isfinite(x["time_to_first_token_p50"]) and "time_to_first_token_p50_ci" in x for x in s)
    text = t.format()
    assert "TTFT p50" in text.splitlines()[1] and "TTFT p99" not in text
    assert "TTFT p99" in t.format(wide=True) and "refused" in t.format(wide=True)
    t.to_csv(str(tmp_path / "v.csv"))
    with open(tmp_path / "v.csv") as fh:
        head = next(csv.reader(fh))
    assert "time_to_first_token_p99" in head and "refused_admissions_ci" in head
    paper = evaluate(agents[:1], env, [0], [100])
    assert paper.metric_names == TABLE_METRICS and "TTFT" not in paper.format()
    assert not any("time_to_first_token_p50" in r for r in paper.rows)
    spec = AgentSpec("flow-control", {}, tune=("b", [2, 8]))
    best, rows = tune(spec, vk, [0], 200, metric="time_to_first_token_p99")
    assert best in (2, 8) and all(np.isfinite(r["time_to_first_token_p99"]) for r in rows)
    with pytest.raises(ValueError, match="serving metric of engine 'vllm-v1'.*runs engine 'paper'"):
        tune(spec, env, [0], 200, metric="time_to_first_token_p99")
    with pytest.raises(ValueError, match="metric must be one of"):
        tune(spec, vk, [0], 200, metric="ttft")
    # more generated tokens is better (as generated_token_throughput); prefill and batch size have no direction
    best, rows = tune(AgentSpec("flow-control", {}, tune=("b", [1, 8])), vk, [0], 200, metric="generation_tokens")
    assert best == 8 and rows[1]["generation_tokens"] > rows[0]["generation_tokens"]
    for m in ("prefill_tokens", "num_requests_running_mean"):
        with pytest.raises(ValueError, match=f"metric '{m}' has no better direction"):
            tune(spec, vk, [0], 200, metric=m)
