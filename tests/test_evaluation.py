"""The evaluation path: determinism, same arrivals for every agent, horizons, tuning, CI, files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flowgym.agents import FixedBudget, FlowControl, MemoryCheck, make_agent
from flowgym.lab.evaluation import build_agent, env_for, evaluate, run_episode, t_quantile_975, tune
from flowgym.sim.metrics import metrics_at
from flowgym.lab.scenarios import (
    ADAPTIVE_HORIZON,
    ADAPTIVE_PERIOD,
    AZURE_REPORT_WINDOW,
    AZURE_TRAIN_WINDOW,
    SCENARIOS,
    AgentSpec,
    get_scenario,
)

SMALL = {
    "M": 3000,
    "workload": {"kind": "poisson", "classes": [[10, 20], [10, 40]], "rates": 1.0},
    "output_length_known": True,
    "max_budget": 64,
}


def test_evaluate_is_deterministic():
    a = evaluate([FixedBudget(3), MemoryCheck()], SMALL, seeds=[0, 1], horizons=[100, 200])
    b = evaluate([FixedBudget(3), MemoryCheck()], SMALL, seeds=[0, 1], horizons=[100, 200])
    assert a.rows == b.rows
    assert len(a.rows) == 2 * 2 * 2


def test_every_agent_sees_the_same_arrivals():
    e1 = run_episode(FixedBudget(1), SMALL, seed=5, horizon=150)
    e2 = run_episode(make_agent("greedy-lifo"), SMALL, seed=5, horizon=150)
    e3 = run_episode(make_agent("mc-sf"), SMALL, seed=5, horizon=150)
    for e in (e2, e3):
        np.testing.assert_array_equal(e1.log["arrival"], e.log["arrival"])
        np.testing.assert_array_equal(e1.log["prompt_len"], e.log["prompt_len"])
        np.testing.assert_array_equal(e1.log["output_len"], e.log["output_len"])
    assert not np.array_equal(e1.log["finish"], e2.log["finish"])  # different policies, different outcomes


def test_prefix_metrics_equal_a_shorter_run():
    long = run_episode(FlowControl(b=4), SMALL, seed=2, horizon=300)
    short = run_episode(FlowControl(b=4), SMALL, seed=2, horizon=120)
    a = metrics_at(long.log, long.series, 3000, 120)
    b = short.metrics()
    for k in a:
        if k == "kv_usage":
            np.testing.assert_array_equal(a[k], b[k])
        elif isinstance(a[k], float) and np.isnan(a[k]):
            assert np.isnan(b[k])
        else:
            assert a[k] == b[k], k


def test_summary_mean_and_confidence_interval():
    from flowgym.lab.evaluation import ResultTable
    from flowgym.sim.metrics import METRIC_NAMES

    # four seeds with avg_latency 1, 2, 3, 6 (a nan elsewhere is left out of its metric's mean)
    rows = [{**{m: float(v) for m in METRIC_NAMES}, "agent": "a", "horizon": 10, "seed": i}
            for i, v in enumerate([1, 2, 3, 6])]
    rows[3]["p95_latency"] = float("nan")
    s = ResultTable(rows, ["a"], [10], [0, 1, 2, 3]).summary()[0]
    assert s["avg_latency"] == 3.0 and s["n"] == 4
    # sample sd: sqrt(((1-3)^2 + (2-3)^2 + 0 + (6-3)^2) / 3) = sqrt(14/3); t_{0.975, 3} = 3.182; / sqrt(4)
    assert s["avg_latency_ci"] == pytest.approx(3.182 * (14 / 3) ** 0.5 / 2)
    assert s["p95_latency"] == 2.0  # mean of 1, 2, 3
    assert s["p95_latency_ci"] == pytest.approx(4.303 * 1.0 / 3**0.5)
    tab = evaluate([FixedBudget(2)], SMALL, seeds=[0, 1, 2, 3], horizons=[150])
    assert t_quantile_975(1) == 12.706 and t_quantile_975(30) == 2.042
    # beyond the table, Student's t quantiles (scipy.stats.t.ppf(0.975, df)) to 1e-5: it was linear to 2.000 at
    # 60 and 1.980 at 120, then 1.96 (CIs of 121-1,000 seeds about 1% too narrow)
    for df, exact in ((31, 2.039513), (40, 2.021075), (121, 1.979764), (200, 1.971896), (1000, 1.962339)):
        assert t_quantile_975(df) == pytest.approx(exact, abs=1e-5)
    for bad in (2.5, True, "3"):
        with pytest.raises(ValueError, match="degrees of freedom must be an integer"):
            t_quantile_975(bad)
    assert "fixed b=2" in tab.format()


def test_agent_requirements_conflict_is_an_error():
    unknown = dict(SMALL, output_length_known=False)
    with pytest.raises(ValueError, match="output_length_known"):
        env_for(make_agent("mc-sf"), unknown, 10)
    env = env_for(make_agent("alpha-greedy", alpha=0.2), SMALL, 10)
    assert env.config.eviction == "all" and env.config.max_budget >= 1024


def test_duplicate_labels_rejected():
    with pytest.raises(ValueError, match="same label"):
        evaluate([FixedBudget(2), FixedBudget(2)], SMALL, seeds=[0], horizons=[10])


def test_tune_picks_the_best_grid_value():
    spec = AgentSpec("flow-control", {"b": 1}, tune=("b", [0, 1, 4]))
    best, rows = tune(spec, SMALL, seeds=[7], horizon=200)
    by_value = {r["value"]: r["mean_time_in_system"] for r in rows}
    assert best == min(by_value, key=by_value.get)
    assert by_value[0] > by_value[4]  # admitting nothing is the worst possible


def test_tune_maximises_what_is_better_higher_and_checks_its_seeds():
    """Throughput is tuned up, not down; a metric no agent changes, no seeds or a seed twice are refused by name;
    seeds may come from any iterable (a generator too), in tune and evaluate alike."""
    spec = AgentSpec("flow-control", {"b": 1}, tune=("b", [0, 1, 4]))
    best, rows = tune(spec, SMALL, seeds=[7], horizon=200, metric="request_throughput")
    by_value = {r["value"]: r["request_throughput"] for r in rows}
    assert best == max(by_value, key=by_value.get) == 4 and by_value[0] == 0.0
    for bad, says in (([], "non-empty list"), ([7, 7], "a seed twice"), ("7", "non-empty list")):
        with pytest.raises(ValueError, match=says):
            tune(spec, SMALL, seeds=bad, horizon=200)
    with pytest.raises(ValueError, match="'arrived' does not depend on the agent"):
        tune(spec, SMALL, seeds=[7], horizon=200, metric="arrived")
    best2, _ = tune(spec, SMALL, seeds=(s for s in [7]), horizon=200)
    assert best2 == tune(spec, SMALL, seeds=[7], horizon=200)[0]
    a = evaluate([FlowControl(b=4)], SMALL, seeds=(s for s in [0, 1]), horizons=[100])
    b = evaluate([FlowControl(b=4)], SMALL, seeds=[0, 1], horizons=[100])
    assert a.rows == b.rows


def test_table_files(tmp_path):
    tab = evaluate([FixedBudget(2), FlowControl(b=[1, 1])], SMALL, seeds=[0, 1], horizons=[50, 100])
    tab.to_csv(str(tmp_path / "r.csv"))
    tab.to_json(str(tmp_path / "r.json"), scenario="x")
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert len(lines) == 1 + 8 + 4  # header, per-seed rows, summary rows
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["scenario"] == "x" and len(data["summary"]) == 4


def test_scenarios_and_agent_spec_parsing():
    for name in SCENARIOS:
        sc = get_scenario(name)
        if name.startswith("paper-synthetic"):
            assert sc.env["workload"]["rates"] == 5.0 and not sc.finite
        elif name in ("adaptive-low", "adaptive-high", "adaptive-switch", "adaptive-diurnal", "adaptive-mix"):
            # slotted, reported at their own horizon, which holds two full cycles of the load
            assert not sc.finite and sc.env.get("time_model", "slot") == "slot"
            assert sc.env["horizon"] == ADAPTIVE_HORIZON == 2 * ADAPTIVE_PERIOD
            assert sc.tune_env_kwargs() == sc.env_kwargs()
            assert sc.agents[0].name == "flow-control" and sc.agents[0].tune is not None
        elif name == "adaptive-azure-conv":
            # tuned and trained on the first half hour of the trace, reported on the second
            assert sc.finite and sc.env["time_model"] == "llama2-70b-tp2-a100"
            assert sc.env["workload"]["window"] == AZURE_REPORT_WINDOW
            assert sc.tune_env_kwargs()["workload"]["window"] == AZURE_TRAIN_WINDOW
            assert AZURE_TRAIN_WINDOW[1] <= AZURE_REPORT_WINDOW[0]
        else:
            assert sc.finite and sc.env["time_model"] == "llama2-70b-tp2-a100"
        for spec in sc.agents:
            env_for(build_agent(spec), sc.env_kwargs(), 5)  # every default agent fits its scenario
    assert get_scenario("paper-synthetic-unknown", rate=3.5).env["workload"]["rates"] == 3.5
    s = AgentSpec.parse("flow-control:b=[4,4,4]")
    assert s.name == "flow-control" and s.params == {"b": [4, 4, 4]}
    s = AgentSpec.parse("alpha-greedy:alpha=0.2,max_budget=64")
    assert s.params == {"alpha": 0.2, "max_budget": 64}
    with pytest.raises(ValueError, match="unknown scenario"):
        get_scenario("nope")
    with pytest.raises(ValueError, match="key=value"):
        AgentSpec.parse("mc:oops")


def test_compare_cli_end_to_end(tmp_path, capsys):
    from flowgym.lab.cli import main

    out = tmp_path / "res"
    rc = main(["compare", "--scenario", "paper-synthetic-unknown", "--horizons", "50,100", "--seeds", "2",
               "--tune-seeds", "1", "--tune-horizon", "40", "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "A_min" in text and "flow-control (Alg. 2) b=" in text
    for suffix in (".csv", ".json", "_metrics.png", "_kv_usage.png"):
        f = out / f"paper-synthetic-unknown{suffix}"
        assert f.exists() and f.stat().st_size > 0
    data = json.loads((out / "paper-synthetic-unknown.json").read_text())
    assert data["horizons"] == [50, 100] and data["seeds"] == [0, 1]
    assert {r["agent"] for r in data["rows"]} == set(data["agents"])


def test_compare_cli_agents_and_errors(tmp_path, capsys):
    from flowgym.lab.cli import main

    rc = main(["compare", "--agents", "flow-control:b=10;mc", "--horizons", "30", "--seeds", "1",
               "--out", str(tmp_path), "--no-plots", "--quiet"])
    assert rc == 0
    assert "flow-control b=10" in capsys.readouterr().out
    assert main(["compare", "--agents", "nosuch", "--horizons", "30", "--out", str(tmp_path), "--quiet"]) == 2
    assert "unknown agent 'nosuch'" in capsys.readouterr().err
    assert main(["compare", "--scenario", "paper-synthetic-unknown", "--agents", "mc-sf", "--horizons", "30",
                 "--out", str(tmp_path), "--quiet", "--no-plots"]) == 2
    assert "output_length_known" in capsys.readouterr().err


def test_a_run_that_stops_at_the_iteration_cap_is_named_in_the_table():
    """Finite workloads run to their end; one that never drains stops at the cap, and the table says so."""
    from flowgym.agents import FlowControl
    from flowgym.lab.evaluation import evaluate

    env = {"M": 6000, "time_model": "llama2-70b-tp2-a100", "horizon": 4000,
           "workload": {"kind": "iid", "rate": 2.0, "timed": True, "n_requests": 40, "lengths": {"kind": "lmsys-like"}}}
    table = evaluate([FlowControl(b=0), FlowControl(b=4)], env, seeds=[0, 1], horizons=None)
    text = table.format()
    stuck = [line for line in text.splitlines() if line.startswith("! ")]
    assert stuck == ["! flow-control b=0: did not drain on 2 of 2 seeds: stopped at the iteration cap (4,000 "
                     "iterations) with 40 requests unfinished on average, counted in time in system up to the cap"]


def test_a_finite_run_with_no_horizon_stops_at_the_safety_cap(monkeypatch, tmp_path, capsys):
    """A finite workload with no horizon anywhere (a user's scenario, ``run --trace``) runs to its end, but a policy
    that admits nothing stops at the safety cap (at least ``FINITE_CAP``, 100 iterations per request) instead of
    running forever, in the compiled loop and stepped alike; the table and ``flowgym run`` say it did not drain.
    A workload that never ends still needs a horizon."""
    from flowgym.agents import FlowControl
    from flowgym.lab import evaluation
    from flowgym.lab.cli import main

    monkeypatch.setattr(evaluation, "FINITE_CAP", 3000)
    env = {"M": 2000, "workload": {"kind": "trace", "arrival": [0, 0, 3], "prompt_len": [5, 8, 2],
                                   "output_len": [30, 10, 7]}}
    for compiled in (True, False):
        m = run_episode(FlowControl(b=0), env, 0, None, compiled=compiled).metrics()
        assert (m["T"], m["unfinished"]) == (3000, 3), compiled
    m = run_episode(FlowControl(b=4), env, 0, None).metrics()
    assert m["unfinished"] == 0 and m["T"] < 100  # a policy that drains ends with the workload
    many = {"M": 2000, "workload": {"kind": "iid", "rate": 1.0, "n_requests": 40,
                                    "lengths": {"kind": "empirical", "pairs": [[5, 5]]}}}
    assert run_episode(FlowControl(b=0), many, 0, None).metrics()["T"] == 4000  # 100 per request above the floor
    text = evaluate([FlowControl(b=0)], env, seeds=[0], horizons=None).format()
    assert "did not drain on 1 of 1 seeds: stopped at the iteration cap (3,000 iterations)" in text
    # a trace's cap covers its last arrival and its work: a sparse trace drains under a policy that admits
    sparse = {"M": 2000, "workload": {"kind": "trace", "arrival": [0, 5000], "prompt_len": [5, 5],
                                     "output_len": [30, 30]}}
    ep = run_episode(FlowControl(b=2), sparse, 0, None)
    assert (ep.metrics()["completed"], ep.not_arrived) == (2, 0)
    # a finite stream whose arrivals outlast the cap: the requests it kept out are counted and reported
    slow = {"M": 2000, "workload": {"kind": "iid", "rate": 0.001, "n_requests": 40,
                                    "lengths": {"kind": "empirical", "pairs": [[5, 5]]}}}
    ep = run_episode(FlowControl(b=4), slow, 0, None)
    assert ep.metrics()["unfinished"] == 0 and ep.not_arrived == 40 - ep.metrics()["arrived"] > 20
    text = evaluate([FlowControl(b=4)], slow, seeds=[0], horizons=None).format()
    assert f"with 0 requests unfinished on average, counted in time in system up to the cap, and {ep.not_arrived} " \
           "not yet arrived, not counted" in text
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,prompt_len,output_len\n0,10,20\n1,10,4\n")
    assert main(["run", "--trace", str(trace), "--budget", "0"]) == 0
    out = capsys.readouterr().out
    assert "! did not drain: stopped at the cap (3,000 slots) with 2 requests unfinished" in out
    assert main(["run", "--trace", str(trace), "--budget", "1"]) == 0
    assert "did not drain" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="horizon=None needs a finite workload"):
        evaluation.capped_env({"M": 2000, "horizon": None})


def test_lower_bounds_hold_for_every_agent_and_do_not_depend_on_whose_requests():
    from flowgym.lab.evaluation import lower_bounds
    from flowgym.lab.scenarios import AgentSpec, get_scenario

    kw = get_scenario("adaptive-high").env_kwargs()
    specs = [AgentSpec("flow-control", {"b": 4}), AgentSpec("flow-control", {"b": 64}), AgentSpec("mc", {})]
    table = evaluate(specs, kw, [3, 4], [300, 800])
    a = lower_bounds(specs[0], kw, [3, 4], [300, 800])
    b = lower_bounds(specs[2], kw, [3, 4], [300, 800])
    assert [r["bound"] for r in a] == [r["bound"] for r in b]  # the same requests whoever serves them
    for r in table.rows:
        bound = next(x["bound"] for x in a if x["seed"] == r["seed"] and x["horizon"] == r["horizon"])
        assert bound <= r["mean_time_in_system"] + 1e-9
    # somewhere the bound is above the service floor (the cache binds): it is not the trivial floor alone
    assert any(x["bound"] > x["service"] + 1 for x in a)
    with pytest.raises(ValueError, match="continuous time"):
        lower_bounds(specs[0], get_scenario("paper-realdata-low").env_kwargs(), [0], None)


def test_lower_bounds_refuse_the_vllm_engine_and_label_a_finite_trace_run():
    from flowgym.lab.evaluation import format_lower_bounds, lower_bounds
    from flowgym.lab.scenarios import AgentSpec

    trace = {"kind": "trace", "arrival": [0] * 6, "prompt_len": [3] * 6, "output_len": [1] * 6}
    # vllm-v1 holds other token counts: there an agent can go below what the paper's engine allows
    with pytest.raises(ValueError, match="paper's engine"):
        lower_bounds(AgentSpec("flow-control", {"b": 64}), {"M": 9, "workload": trace, "engine": "vllm-v1",
                                                          "engine_options": {"block_size": 1}}, [0], [2])
    with pytest.raises(ValueError, match="at least one horizon"):
        lower_bounds(AgentSpec("flow-control", {"b": 2}), {"M": 9, "workload": trace}, [0], [])
    # six one-token requests of 4 tokens each, M = 9: two a slot, so 1, 1, 2, 2, 3, 3 (mean 2) at best
    kw = {"M": 9, "workload": trace}
    spec = AgentSpec("flow-control", {"b": 2})
    (end,) = lower_bounds(spec, kw, [0], None)
    assert end["horizon"] is None and end["T"] == 3 and end["bound"] == pytest.approx(2.0)
    rows = lower_bounds(spec, kw, [0], [2, 50])  # 50: past the end of the trace, the run's 3 slots are bounded
    assert [(r["horizon"], r["T"]) for r in rows] == [(2, 2), (50, 3)]
    table = evaluate([spec], kw, [0], [2, 50])
    text = format_lower_bounds(rows, table)
    assert "(T=2)" in text and "1.000x" in text  # b = 2 reaches the bound
    assert text.count("\n") == 1


def test_bound_lines_leave_out_seeds_without_requests_as_the_table_does():
    from flowgym.agents import make_agent
    from flowgym.lab.evaluation import evaluate, format_lower_bounds, lower_bounds

    env = {"M": 2000, "workload": {"kind": "poisson", "classes": [[10, 20]], "rates": 0.5}, "horizon": 2}
    agents = [make_agent("flow-control", b=4), make_agent("mc")]
    rows = lower_bounds(agents[0], env, range(6), [2])
    assert any(not np.isfinite(r["bound"]) for r in rows) and any(np.isfinite(r["bound"]) for r in rows)
    line = format_lower_bounds(rows, evaluate(agents, env, range(6), [2]))
    assert "nan" not in line and "agents at 1.000x (flow-control b=4)" in line
    with pytest.raises(ValueError, match="horizons must be positive integers"):
        lower_bounds(agents[0], env, [0], [0, 10])
    with pytest.raises(ValueError, match="record='stream'"):
        lower_bounds(agents[0], {**env, "record": "stream"}, [0], [2])


def test_a_seed_that_drains_before_a_horizon_keeps_its_row_there():
    """A finite workload that drains before horizon T: a run with horizon T is that run (the episode ends when it
    drains), so its row at T is the whole run's. The row was dropped, leaving only the slower seeds at T (and the
    table still said 8 seeds)."""
    from flowgym.agents import make_agent

    kw = dict(M=2000, workload={"kind": "iid", "rate": 2.0, "n_requests": 60, "lengths": {
        "kind": "lognormal", "prompt_median": 20, "prompt_mean": 40, "output_median": 10, "output_mean": 20,
        "max_prompt": 300, "max_output": 100}})
    ends = evaluate([make_agent("fixed", b=4)], kw, seeds=list(range(8)), horizons=None)
    T = sorted(r["T"] for r in ends.rows)[4]  # four seeds drain before T
    tab = evaluate([make_agent("fixed", b=4)], kw, seeds=list(range(8)), horizons=[T])
    assert sorted(r["seed"] for r in tab.rows) == list(range(8)) and tab.summary()[0]["n"] == 8
    whole = {r["seed"]: r for r in ends.rows}
    for r in tab.rows:
        if whole[r["seed"]]["T"] <= T:
            assert r["mean_time_in_system"] == whole[r["seed"]]["mean_time_in_system"]
    assert tab.summary()[0]["mean_time_in_system"] == pytest.approx(np.mean([r["mean_time_in_system"] for r in tab.rows]))


def test_tune_scores_a_value_by_its_mean_over_the_seeds_and_keeps_the_first_of_a_tie():
    """Each grid value's score is the mean of its runs' metric over the tuning seeds (each run that of
    run_episode on that seed), and two values that tie keep the first in the grid: b = 64 and b = 32 play the
    same light load alike, so the grid [64, 32] picks 64 and [32, 64] picks 32."""
    from flowgym.lab.evaluation import build_agent, run_episode

    spec = AgentSpec("flow-control", {"b": 1}, tune=("b", [1, 3]))
    best, rows = tune(spec, SMALL, seeds=[3, 8, 11], horizon=150)
    for r in rows:
        runs = [run_episode(build_agent(spec, b=r["value"]), SMALL, s, 150).metrics()["mean_time_in_system"]
                for s in (3, 8, 11)]
        assert r["mean_time_in_system"] == pytest.approx(float(np.mean(runs)))
        assert len(set(runs)) > 1  # the seeds differ, so a max or one seed's value would not match
    assert best == min(rows, key=lambda r: r["mean_time_in_system"])["value"]
    for grid in ([64, 32], [32, 64]):
        best, rows = tune(AgentSpec("flow-control", {"b": 1}, tune=("b", grid)), SMALL, seeds=[3, 8], horizon=150)
        assert rows[0]["mean_time_in_system"] == rows[1]["mean_time_in_system"] and best == grid[0]


def test_the_tables_kv_usage_is_each_agents_first_seed_u_over_m():
    """ResultTable.kv_usage (the trajectory plots' data) is U_t / M of each agent's first seed, in [0, 1]."""
    from flowgym.lab.evaluation import run_episode

    tab = evaluate([FlowControl(b=4)], SMALL, seeds=[5, 6], horizons=[120])
    ep = run_episode(FlowControl(b=4), SMALL, 5, 120)
    u = tab.kv_usage[FlowControl(b=4).label()]
    np.testing.assert_allclose(u, ep.series["usage"] / SMALL["M"])
    assert 0 < u.max() <= 1.0
    assert tab.time_unit == "slot"  # and seconds in continuous time
    timed = {"M": 3000, "time_model": {"kind": "linear", "c0": 0.01}, "horizon": None,
             "workload": {"kind": "trace", "timed": True, "arrival": [0.0, 0.5], "prompt_len": [5, 5],
                          "output_len": [3, 3]}}
    assert evaluate([FlowControl(b=4)], timed, seeds=[0], horizons=None).time_unit == "s"


def test_lower_bounds_take_a_horizon_of_one_slot_and_refuse_zero():
    from flowgym.lab.evaluation import lower_bounds

    env = get_scenario("adaptive-high").env_kwargs()
    row = lower_bounds(AgentSpec("mc"), env, [900], [1])[0]
    assert (row["horizon"], row["T"], row["bound"]) == (1, 1, 1.0)  # one slot: every request waits it
    with pytest.raises(ValueError, match="horizons must be positive integers"):
        lower_bounds(AgentSpec("mc"), env, [900], [0])
