"""The hindsight integer programs: brute force on tiny traces, replay in the simulator, honest statuses."""

from __future__ import annotations

import numpy as np
import pytest

import scipy  # noqa: F401  (the `solve` extra; part of the `test` extra, so a missing SciPy fails instead of skipping)

from flowgym.lab.hindsight import (
    ReplayMismatch,
    heuristic_schedule,
    replay_schedule,
    run_agent_on_trace,
    schedule_usage,
    solve_hindsight,
)

# --------------------------------------------------------------------------- an independent brute force


def _usage_by_hand(l, o, start):
    """KV tokens per slot, one request and one slot at a time (the spec's U_t)."""
    T = max((s + oi for s, oi in zip(start, o) if s >= 0), default=0)
    u = [0] * T
    for li, oi, s in zip(l, o, start):
        if s < 0:
            continue
        for t in range(s, s + oi):
            u[t] += li + (t - s + 1)
    return u


def _serial(a, o):
    """One request at a time in arrival order: always feasible (l + o <= M)."""
    start, t = [], 0
    for i in sorted(range(len(a)), key=lambda i: (a[i], i)):
        t = max(t, a[i])
        start.append((i, t))
        t += o[i]
    out = [0] * len(a)
    for i, s in start:
        out[i] = s
    return out


def _brute(a, l, o, M, objective, T=None):
    """Best objective over every start vector in a window that provably holds an optimum.

    total latency: a schedule at least as good as the serial one waits at most the
    serial schedule's total wait W per request, so s_i in [a_i, a_i + W];
    max latency: s_i + o_i - a_i <= the serial maximum; completed/tokens: s_i in
    [a_i, T - o_i] or not started. Depth-first over requests, pruning partial
    schedules that already overflow.
    """
    n = len(a)
    ser = _serial(a, o)
    if objective == "total_latency":
        W = sum(ser[i] - a[i] for i in range(n))
        windows = [range(a[i], a[i] + W + 1) for i in range(n)]
    elif objective == "max_latency":
        Z = max(ser[i] + o[i] - a[i] for i in range(n))
        windows = [range(a[i], a[i] + Z - o[i] + 1) for i in range(n)]
    else:
        windows = [[-1] + list(range(a[i], T - o[i] + 1)) for i in range(n)]
    horizon = max(max(w) for w in windows) + max(o) + 1
    usage = [0] * horizon
    best = [None]

    def value(st):
        if objective == "total_latency":
            return sum(st[i] + o[i] - a[i] for i in range(n))
        if objective == "max_latency":
            return max(st[i] + o[i] - a[i] for i in range(n))
        if objective == "completed":
            return -sum(1 for i in range(n) if st[i] >= 0)
        return -sum(o[i] for i in range(n) if st[i] >= 0)

    def dfs(i, st):
        if i == n:
            v = value(st)
            if best[0] is None or v < best[0]:
                best[0] = v
            return
        for s in windows[i]:
            if s >= 0:
                slots = range(s, s + o[i])
                if any(usage[t] + l[i] + (t - s + 1) > M for t in slots):
                    continue
                for t in slots:
                    usage[t] += l[i] + (t - s + 1)
            dfs(i + 1, st + [s])
            if s >= 0:
                for t in slots:
                    usage[t] -= l[i] + (t - s + 1)

    dfs(0, [])
    return best[0] if objective in ("total_latency", "max_latency") else -best[0]


def _tiny(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    M = int(rng.integers(6, 13))
    a = rng.integers(0, 3, n)
    l = rng.integers(1, 4, n)
    o = np.array([int(rng.integers(1, M - li + 1)) for li in l])
    if seed % 3 == 0:  # identical requests: one integer variable per type must still be right
        a[1], l[1], o[1] = a[0], l[0], o[0]
    return a.tolist(), l.tolist(), o.tolist(), M


# --------------------------------------------------------------------------- optimum = brute force


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("objective", ["total_latency", "max_latency"])
def test_latency_optimum_equals_brute_force(seed, objective):
    a, l, o, M = _tiny(seed)
    r = solve_hindsight(a, l, o, M, objective=objective, time_limit=30)
    assert r.optimal and r.status == "optimal" and r.gap == 0.0
    assert r.value == _brute(a, l, o, M, objective)
    assert r.bound == r.value
    lat = np.asarray(r.finish) - np.asarray(a)
    assert r.value == (lat.sum() if objective == "total_latency" else lat.max())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("objective", ["completed", "tokens"])
def test_throughput_optimum_equals_brute_force(seed, objective):
    a, l, o, M = _tiny(seed)
    T = int(max(a) + max(o) + 2)
    r = solve_hindsight(a, l, o, M, objective=objective, horizon=T, time_limit=30)
    assert r.optimal and r.status == "optimal"
    assert r.value == _brute(a, l, o, M, objective, T)
    done = (r.start >= 0) & (r.finish <= T)
    assert (r.start >= 0).sum() == done.sum()  # nothing started that misses T
    assert r.value == (done.sum() if objective == "completed" else np.asarray(o)[done].sum())


# --------------------------------------------------------------------------- replay in the simulator


def _online(seed, n=14, M=40):
    rng = np.random.default_rng(seed)
    l = rng.integers(1, 6, n)
    o = np.array([int(rng.integers(1, M // 2)) for li in l])
    a = np.sort(rng.integers(0, 30, n))
    perm = rng.permutation(n)  # input not sorted by arrival: replay must map engine ids back
    return a[perm], l[perm], o[perm], M


@pytest.mark.parametrize("objective", ["total_latency", "max_latency", "completed"])
def test_replay_reproduces_the_optimal_schedule(objective):
    a, l, o, M = _online(1)
    T = 90 if objective == "completed" else None
    r = solve_hindsight(a, l, o, M, objective=objective, horizon=T, time_limit=30)
    assert r.optimal, r.summary()
    out = r.replay()  # raises ReplayMismatch on any disagreement
    on = r.start >= 0
    assert np.array_equal(out["finish"][on], (r.start + o)[on])
    assert (out["evictions"] == 0).all() and out["overflow_events"] == 0
    assert out["usage"].max() <= M
    ref = schedule_usage(l, o, r.start)
    assert np.array_equal(out["usage"][: ref.size], ref)
    assert np.array_equal(ref, np.asarray(_usage_by_hand(l, o, r.start.tolist()))[: ref.size])
    m = r.metrics()
    assert m["evictions"] == 0 and m["max_kv_usage"] <= 1.0


def test_replay_catches_an_overflowing_schedule():
    a, l, o, M = [0, 0], [2, 2], [5, 5], 10  # both at once: 3 + 3 ... 7 + 7 > 10
    with pytest.raises(ReplayMismatch):
        replay_schedule(a, l, o, [0, 0], M)
    replay_schedule(a, l, o, [0, 5], M)  # one after the other is fine
    with pytest.raises(ValueError, match="before its arrival"):
        replay_schedule([3, 0], l, o, [0, 5], M)


def test_heuristic_is_the_mc_sf_and_mc_agents():
    a, l, o, M = _online(2, n=25)
    for order, agent in (("sf", "mc-sf"), ("fcfs", "mc")):
        st = heuristic_schedule(a, l, o, M, order=order)
        run = run_agent_on_trace(agent, a, l, o, M)
        assert np.array_equal(st + o, run["finish"]), agent
        assert run["evictions"] == 0


# --------------------------------------------------------------------------- honesty


def test_time_limited_solve_reports_a_gap_not_optimality():
    rng = np.random.default_rng(0)
    n, M, s = 45, 40, 3  # Jaillet et al.'s regime: far beyond what HiGHS proves in a second
    o = rng.integers(1, M - s + 1, n)
    r = solve_hindsight(np.zeros(n, int), np.full(n, s), o, M, time_limit=1.0)
    assert not r.optimal
    assert r.status.startswith("time_limit (feasible, gap ")
    assert r.bound < r.value and r.gap > 0
    assert r.gap == pytest.approx((r.value - r.bound) / r.value)
    assert r.bound >= o.sum()
    r.replay()  # the incumbent is still a valid schedule


def test_request_that_can_never_complete_is_a_clear_error():
    with pytest.raises(ValueError, match=r"request 2 .*prompt_len 4 \+ output_len 7 = 11 > M = 10"):
        solve_hindsight([0, 0, 1], [1, 2, 4], [3, 3, 7], 10)
    with pytest.raises(ValueError, match="horizon"):
        solve_hindsight([0], [1], [3], 10, objective="completed")
    with pytest.raises(ValueError, match="objective"):
        solve_hindsight([0], [1], [3], 10, objective="p95")
    with pytest.raises(ValueError, match="output_len"):
        solve_hindsight([0, 1], [1, 1], [3], 10)


def test_too_short_horizon_is_infeasible():
    # the second request can start at slot 4 at the earliest (slot 4: 7 + 3 = 10 tokens),
    # so it cannot finish by slot 8
    r = solve_hindsight([0, 0], [2, 2], [5, 5], 10, horizon=8, time_limit=10)
    assert r.status == "infeasible" and not r.optimal
    assert (r.start == -1).all()
    r = solve_hindsight([0, 0], [2, 2], [5, 5], 10, horizon=9, time_limit=10)
    assert r.optimal and r.value == 5 + 9 and sorted(r.start.tolist()) == [0, 4]


def test_cli_hindsight(capsys):
    from flowgym.lab.cli import main

    assert main(["hindsight", "--random", "6", "--seed", "1", "--time-limit", "20", "--agents", "mc-sf;mc"]) == 0
    out = capsys.readouterr().out
    assert "hindsight: total_latency" in out and "hindsight: max_latency" in out
    assert "mc-sf" in out and "/opt total" in out
    assert "total_latency: optimal" in out


def test_solve_hindsight_names_a_bad_slack_horizon_or_time_limit():
    from flowgym.lab.hindsight import solve_hindsight

    inst = ([0, 0, 1, 2], [3, 2, 4, 1], [4, 5, 2, 6], 12)
    for kw, match in (({"slack": -3}, "slack must be a non-negative integer"),
                      ({"slack": -100}, "slack must be a non-negative integer"),
                      ({"slack": 2.5}, "slack must be a non-negative integer"),
                      ({"time_limit": "5"}, "time_limit must be a positive number"),
                      ({"horizon": float("nan")}, "horizon must be a positive integer, got nan")):
        with pytest.raises(ValueError, match=match):
            solve_hindsight(*inst, **kw)


def test_an_agent_matching_an_optimum_of_zero_has_ratio_one():
    from flowgym.lab.hindsight import compare_to_hindsight

    res, rows = compare_to_hindsight([0, 0], [3, 2], [5, 6], 20, ["mc"], objectives=("completed", "tokens"), T=3)
    assert res["completed"].value == 0 and res["completed"].status == "optimal"
    row = rows[-1]
    assert row["completed_by_T"] == 0 and row["ratio_completed"] == 1.0 and row["ratio_completed_max"] == 1.0
    assert row["ratio_tokens"] == 1.0


def test_agents_that_cannot_run_are_refused_before_any_solve(monkeypatch):
    """compare_to_hindsight checks every agent on the trace's environment first (an unknown name, options that
    conflict, per-class budgets for other classes, one string for a list), so a bad agent costs no solve."""
    import flowgym.lab.hindsight as hs

    def no_solve(*a, **k):
        raise AssertionError("a solve ran before the agents were checked")

    monkeypatch.setattr(hs, "solve_hindsight", no_solve)
    inst = ([3, 0, 0, 1], [2, 3, 1, 2], [5, 4, 6, 2], 12)
    for agents, cls, match in ((["nosuch"], None, "unknown agent 'nosuch'"),
                               ("mc", None, "agents must be a list of agents or agent specs"),
                               (["flow-control:b=[1,1]"], [1, 2, 1, 2], "cannot run on this scenario: action")):
        with pytest.raises(ValueError, match=match):
            hs.compare_to_hindsight(*inst, agents, cls=cls)


def test_agents_run_on_a_trace_with_the_length_knowledge_they_need():
    """run_agent_on_trace takes output_length_known from the agent by default (MC-SF needs True; the shipped
    learned agent reads no length and runs either way), else True; an explicit value the agent cannot take is
    refused naming both."""
    from flowgym.lab.hindsight import compare_to_hindsight, run_agent_on_trace

    inst = ([3, 0, 0, 1], [2, 3, 1, 2], [5, 4, 6, 2], 12)
    res, rows = compare_to_hindsight(*inst, ["mc-sf", "learned"], objectives=("total_latency",))
    assert [r["name"] for r in rows if r["kind"] == "agent"] == ["mc-sf", "learned (generalist)"]
    assert all(r["ratio_total_latency"] >= 1.0 for r in rows if r["kind"] == "agent")
    with pytest.raises(ValueError, match="needs output_length_known=True but the scenario sets output_length_known=False"):
        run_agent_on_trace("mc-sf", *inst, output_length_known=False)
    a = run_agent_on_trace("learned", *inst, output_length_known=False)
    b = run_agent_on_trace("learned", *inst)
    assert np.array_equal(a["finish"], b["finish"]) and a["completed"] == 4


def test_schedule_usage_names_a_bad_array():
    from flowgym.lab.hindsight import schedule_usage

    np.testing.assert_array_equal(schedule_usage([2, 3, 1], [3, 2, 4], [0, 5, -1]), [3, 4, 5, 0, 0, 4, 5])
    for args, match in ((([2, 3, 1], [3, 2, 4], [0, 5]), "start has 2 entries, expected 3"),
                        (([2, 3, 1], [3, 2, 0], [0, 5, 1]), r"output_len\[2\] = 0 must be >= 1"),
                        (([2, 3, 1], [3, 2, 4], [0, 5, 1.5]), r"start\[2\] = 1.5 is not an integer")):
        with pytest.raises(ValueError, match=match):
            schedule_usage(*args)


def test_schedule_usage_names_a_slots_that_is_not_a_whole_number():
    from flowgym.lab.hindsight import schedule_usage

    for slots in (float("inf"), float("nan"), -1, 2.5, True):
        with pytest.raises(ValueError, match="slots must be a non-negative whole number"):
            schedule_usage([2], [3], [0], slots=slots)


def test_without_scipy_the_commands_name_the_extra_before_any_work(monkeypatch, capsys, tmp_path):
    """The program's solver is SciPy's: without it ``flowgym hindsight`` and a ``reproduce`` that needs a hindsight
    setting stop at once, naming ``flowgym[solve]`` (they failed in a worker cell, with its traceback)."""
    import sys

    from flowgym.lab.cli import main
    from flowgym.lab.hindsight import require_scipy

    monkeypatch.setitem(sys.modules, "scipy.optimize", None)  # import scipy.optimize raises ImportError
    with pytest.raises(ImportError, match=r"pip install -e '\.\[solve\]' in the flowgym checkout"):
        require_scipy()
    assert main(["hindsight", "--random", "3", "--time-limit", "5"]) == 2
    assert "needs SciPy" in capsys.readouterr().err
    assert main(["reproduce", "--quick", "--only", "hindsight", "--quiet", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "needs SciPy" in err and "Traceback" not in err and "cell" not in err
    assert main(["reproduce", "--quick", "--only", "theory", "--quiet", "--out", str(tmp_path / "t")]) == 0
