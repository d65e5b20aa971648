"""One map for every grid: the same tables on every backend, failures named, bad addresses refused."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from flowgym.agents import FixedBudget
from flowgym.lab.evaluation import evaluate, tune
from flowgym.lab.parallel import CellError, make_backend
from flowgym.lab.scenarios import AgentSpec, get_scenario

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="needs Ray: pip install -e '.[ray]' in the flowgym checkout")

ENV = get_scenario("adaptive-switch").env_kwargs()
AGENTS = [AgentSpec("flow-control", {"b": 12}, label="fc"), AgentSpec("mc"), AgentSpec("random", {"low": 0, "high": 20})]


class Exploding(FixedBudget):
    """Raises at one slot of one seed (a bug in an agent, inside a worker)."""

    def __init__(self) -> None:
        super().__init__(b=4)

    def reset(self, config, seed=None):
        super().reset(config, seed)
        self._seed, self._n = seed, 0

    def act(self, observation, view):
        self._n += 1
        if self._seed == 901 and self._n == 50:
            raise ArithmeticError("boom at slot 50")
        return super().act(observation, view)

    def label(self) -> str:
        return "exploding"


class Dying(FixedBudget):
    """Ends its worker process at one slot of seed 901 (a crash, not an exception)."""

    def __init__(self) -> None:
        super().__init__(b=4)

    def reset(self, config, seed=None):
        super().reset(config, seed)
        self._seed = seed

    def act(self, observation, view):
        if self._seed == 901:
            import os

            os._exit(3)
        return super().act(observation, view)

    def label(self) -> str:
        return "dying"


class Sleeping(FixedBudget):
    """Takes ten minutes on seed 900 (a long cell beside a failing one)."""

    def __init__(self) -> None:
        super().__init__(b=4)

    def reset(self, config, seed=None):
        super().reset(config, seed)
        if seed == 900:
            import time

            time.sleep(600)

    def label(self) -> str:
        return "sleeping"


def _timed(_cell):
    import time

    t0 = time.time()
    time.sleep(0.5)
    return t0, time.time()


def _tables(backend):
    table = evaluate(AGENTS, ENV, [900, 901, 902], [150, 300], backend=backend)
    best, rows = tune(AgentSpec("flow-control", {"b": 12}, tune=("b", [4, 8, 12])), ENV, [1000, 1001], 300,
                      backend=backend)
    return table, best, rows


def _assert_same(a, b):
    (ta, ba, ra), (tb, bb, rb) = a, b
    assert ta.rows == tb.rows and ta.agents == tb.agents and ta.time_unit == tb.time_unit
    assert ta.kv_usage.keys() == tb.kv_usage.keys()
    for k in ta.kv_usage:
        np.testing.assert_array_equal(ta.kv_usage[k], tb.kv_usage[k])
    assert ta.summary() == tb.summary()
    assert (ba, ra) == (bb, rb)


def test_process_backend_gives_the_serial_tables():
    serial = _tables("serial")
    with make_backend("process", workers=2) as be:
        _assert_same(serial, _tables(be))
    assert len(serial[0].rows) == 3 * 3 * 2


def test_a_failing_cell_is_named_serial_and_process():
    for backend in ("serial", make_backend("process", workers=2)):
        with pytest.raises(CellError, match=r"agent 'exploding', seed 901.*ArithmeticError: boom at slot 50"):
            evaluate([Exploding()], ENV, [900, 901, 902], [200], backend=backend)
        if not isinstance(backend, str):
            backend.close()


def test_a_dead_worker_process_is_reported_without_blaming_one_cell_and_the_backend_recovers():
    """A worker that dies takes every unfinished cell's future with it: the error says a process died and lists
    the cells that may have been in it (the crashing one among them), and the next map gets a new pool."""
    with make_backend("process", workers=2) as be:
        with pytest.raises(CellError, match=r"a worker process died .* cells not finished was running in it: .*"
                           r"agent 'dying', seed 901") as e:
            evaluate([Dying()], ENV, [900, 901, 902, 903], [100], backend=be)
        assert "seed 901" in str(e.value)
        assert len(evaluate([AgentSpec("mc")], ENV, [900, 901], [100], backend=be).rows) == 2


def test_a_dead_workers_message_names_five_cells_and_counts_the_rest():
    from flowgym.lab.parallel import _died

    five = _died(RuntimeError("gone"), [f"c{i}" for i in range(5)])
    assert five == "a worker process died (gone); one of the 5 cells not finished was running in it: c0; c1; c2; c3; c4"
    six = _died(RuntimeError("gone"), [f"c{i}" for i in range(6)])
    assert six.endswith("one of the 6 cells not finished was running in it: c0; c1; c2; c3; c4 and 1 more")


def test_a_failing_cell_is_reported_while_a_long_one_still_runs():
    """The process backend ends its workers on the first error instead of waiting for the cells they run (here one
    of ten minutes)."""
    import time

    from flowgym.lab.parallel import ProcessBackend

    t0 = time.time()
    with pytest.raises(CellError, match=r"agent 'exploding', seed 901"):
        with ProcessBackend(workers=2) as be:
            be.map(_explode_or_sleep, ["sleep", "explode"])
    assert time.time() - t0 < 120


def _explode_or_sleep(what):
    import time

    if what == "sleep":
        time.sleep(600)
    return evaluate([Exploding()], ENV, [901], [200])


def test_lower_bounds_run_on_the_backend_and_give_the_serial_rows(monkeypatch):
    """``compare --bound``'s extra episodes run where the backend runs cells, not in the driver: the process
    backend gives the serial rows while the driver runs no episode."""
    from flowgym.lab import evaluation
    from flowgym.lab.evaluation import lower_bounds

    serial = lower_bounds(AgentSpec("mc"), ENV, [900, 901, 902], [100, 200], iterations=50)
    in_driver = []
    real = evaluation.run_episode
    monkeypatch.setattr(evaluation, "run_episode", lambda *a, **k: in_driver.append(a[2]) or real(*a, **k))
    with make_backend("process", workers=2) as be:
        rows = lower_bounds(AgentSpec("mc"), ENV, [900, 901, 902], [100, 200], iterations=50, backend=be)
    assert rows == serial and len(rows) == 6 and in_driver == []
    with pytest.raises(CellError, match=r"lower bound on the requests of agent 'exploding', seed 901"):
        lower_bounds(Exploding(), ENV, [900, 901], [200], iterations=50)


def test_a_failing_bound_names_its_seed_for_a_spec_too_and_the_table_is_shown_first(monkeypatch, capsys):
    """compare's agents are specs: the bound's cell names a spec's label (or name) and seed, and compare prints its
    table before the bound's episodes run, so a failure there does not lose it."""
    from flowgym.lab import evaluation
    from flowgym.lab.cli import main
    from flowgym.lab.evaluation import BoundCell, lower_bounds

    assert BoundCell(AgentSpec.parse("flow-control:b=12"), {}, 3, [100], 10).describe() == \
        "(lower bound on the requests of agent 'flow-control', seed 3, horizon 100)"
    assert "agent 'fc'" in BoundCell(AgentSpec("flow-control", {"b": 12}, label="fc"), {}, 3, [100], 10).describe()

    def broken(*a, **k):
        raise MemoryError("no room")

    monkeypatch.setattr(evaluation, "run_episode", broken)
    with pytest.raises(CellError, match=r"agent 'mc', seed 900.*MemoryError: no room"):
        lower_bounds(AgentSpec("mc"), ENV, [900, 901], [100])
    monkeypatch.undo()
    monkeypatch.setattr(evaluation, "run_bound_cell", lambda cell: broken())
    assert main(["compare", "--scenario", "adaptive-switch", "--agents", "mc", "--horizons", "50", "--seeds", "1",
                 "--bound", "--no-plots", "--quiet", "--no-tune"]) != 0
    out = capsys.readouterr()
    assert "MemoryError: no room" in out.err and "time in system counts every request" in out.out  # the table


def test_bad_backend_arguments():
    with pytest.raises(ValueError, match="backend must be one of serial, process, ray"):
        make_backend("threads")
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        make_backend("process", workers=0)
    with pytest.raises(ValueError, match="with address .* its own CPUs decide"):  # workers would be ignored
        make_backend("ray", workers=2, address="auto")


def test_compare_cli_backends_agree(tmp_path, capsys):
    from flowgym.lab.cli import main

    args = ["compare", "--scenario", "adaptive-switch", "--horizons", "200", "--seeds", "900-901",
            "--agents", "flow-control:b=8;mc", "--no-plots", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "s")]) == 0
    assert main(args + ["--backend", "process", "--workers", "2", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "s" / "adaptive-switch.csv").read_text() == (tmp_path / "p" / "adaptive-switch.csv").read_text()


@needs_ray
def test_ray_backend_gives_the_serial_tables_and_names_failures():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's agent travels by value
    serial = _tables("serial")
    with make_backend("ray", workers=2) as be:
        _assert_same(serial, _tables(be))
        with pytest.raises(CellError, match=r"agent 'exploding', seed 901.*boom at slot 50"):
            evaluate([Exploding()], ENV, [900, 901], [200], backend=be)


@needs_ray
def test_ray_names_the_cell_whose_worker_died():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with make_backend("ray", workers=2) as be:
        with pytest.raises(CellError, match=r"agent 'dying', seed 901.* failed in a Ray task: WorkerCrashedError"):
            evaluate([Dying()], ENV, [900, 901], [100], backend=be)


@needs_ray
def test_ray_running_already_bounds_the_cells_in_flight_and_refuses_an_address():
    """In a process already connected to Ray, ``workers`` bounds how many cells run at once (the session's own
    size would otherwise decide) and ``address`` is refused, not ignored."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with pytest.raises(ValueError, match=r"already running in this process, so address='auto'"):
            make_backend("ray", address="auto")
        with make_backend("ray", workers=1) as be:
            spans = sorted(be.map(_timed, [0, 1, 2]))
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # one after the other
        with make_backend("ray") as be:  # no workers: the session's own size decides
            assert len(be.map(_timed, [0, 1])) == 2
        assert ray.is_initialized()  # the session it found is left running
    finally:
        ray.shutdown()


@needs_ray
def test_ray_bad_address_fails_clearly():
    with pytest.raises(ConnectionError, match=r"cannot reach a Ray cluster at '127.0.0.1:1'"):
        make_backend("ray", address="127.0.0.1:1")
    with pytest.raises(ConnectionError, match="is not host:port"):
        make_backend("ray", address="nowhere")


def test_a_fresh_process_makes_the_env_by_module_name():
    """gym.make("flowgym:FlowControl-v0") imports flowgym first: it works in any fresh worker."""
    import subprocess

    code = ("import gymnasium as gym; env = gym.make('flowgym:FlowControl-v0', horizon=5); env.reset(seed=0); "
            "print(env.step(3)[4]['t'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


@needs_ray
def test_training_search_on_ray_end_to_end(tmp_path):
    from _requires import HAVE_SB3

    if not HAVE_SB3:
        pytest.skip("needs Stable-Baselines3 and torch: pip install -e '.[train]' in the flowgym checkout")
    import csv
    import json

    from flowgym.lab.train import TrainConfig, train_search

    cfg = TrainConfig(scenario="adaptive-switch", total_timesteps=1024, n_envs=2, n_steps=256, batch_size=128,
                      n_epochs=1, eval_freq=256, eval_episodes=1, checkpoint_freq=0, final_eval_seeds=1, tune_seeds=1,
                      action_repeat=2, env_overrides={"horizon": 300}, progress=False, plot=False,
                      out=str(tmp_path / "search"))
    res = train_search(cfg, 1, workers=2, space={"seed": ("grid", [10_000, 10_001])})  # one sample of a 2-grid
    rows = list(csv.DictReader(open(tmp_path / "search" / "search.csv")))
    assert sorted(int(r["seed"]) for r in rows) == [10_000, 10_001] and all(r["evaluations"] == "4" for r in rows)
    best = min(rows, key=lambda r: float(r["best_time_in_system"]))
    assert res["best"]["model_dir"] == best["model_dir"]
    meta = json.load(open(tmp_path / "search" / "best" / "flowgym_agent.json"))
    assert meta["hyperparameters"]["seed"] == int(best["seed"])
    assert res["table"].agents[0] == "learned (best)" and len(res["table"].agents) > 3
    with pytest.raises(ValueError, match="not a TrainConfig field"):
        train_search(cfg, 1, space={"colour": ("choice", [1])})


def test_hindsight_comparison_on_a_backend():
    pytest.importorskip("scipy", reason="needs SciPy: pip install -e '.[solve]' in the flowgym checkout")
    from flowgym.lab.hindsight import compare_to_hindsight

    rng = np.random.default_rng(3)
    a = np.sort(rng.integers(0, 6, 8))
    l, o = rng.integers(1, 4, 8), rng.integers(1, 8, 8)
    agents = ["mc-sf", "greedy-lifo", "flow-control:b=3"]
    _, serial = compare_to_hindsight(a, l, o, 24, agents, time_limit=20)
    with make_backend("process", workers=2) as be:
        _, par = compare_to_hindsight(a, l, o, 24, agents, time_limit=20, backend=be)
    strip = [{k: v for k, v in r.items() if k != "solve_seconds"} for r in serial]
    assert strip == [{k: v for k, v in r.items() if k != "solve_seconds"} for r in par]
    assert [r["name"] for r in serial][:2] == ["hindsight: total_latency", "hindsight: max_latency"]
