"""Figures and tables: what the KV-usage plot shows, and the unit of time a table names."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from flowgym.lab.evaluation import ResultTable  # noqa: E402
from flowgym.lab.plots import plot_kv_usage  # noqa: E402


def _table(horizons, n):
    u = (np.arange(n) % 97) / 97.0
    return ResultTable(rows=[], agents=["a"], horizons=horizons, seeds=[0], kv_usage={"a": u})


def test_fixed_horizon_shows_the_last_500_slots(tmp_path):
    shown = plot_kv_usage(_table([3000], 3000), str(tmp_path / "kv.png"))
    assert shown == {"a": (2500, 2999)}
    assert (tmp_path / "kv.png").stat().st_size > 0


def test_run_to_the_end_shows_the_whole_run_binned(tmp_path):
    shown = plot_kv_usage(_table([None], 50_001), str(tmp_path / "kv.png"), max_points=1000)
    assert shown == {"a": (0, 50_000)}
    assert (tmp_path / "kv.png").stat().st_size > 0


def test_explicit_window_wins(tmp_path):
    assert plot_kv_usage(_table([None], 800), str(tmp_path / "kv.png"), window=100) == {"a": (700, 799)}


def test_tables_name_their_unit_of_time():
    from flowgym.lab.evaluation import evaluate
    from flowgym.agents import make_agent

    slots = evaluate([make_agent("fixed", b=4)], {"horizon": 50}, seeds=[0], horizons=[50])
    assert slots.time_unit == "slot" and "req/slot" in slots.format()
    timed = {"horizon": 50, "time_model": "llama2-70b-tp2-a100",
             "workload": {"kind": "iid", "rate": 2.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    secs = evaluate([make_agent("fixed", b=4)], timed, seeds=[0], horizons=[50])
    assert secs.time_unit == "s" and "req/s" in secs.format() and "req/slot" not in secs.format()


def test_empty_series_and_bad_arguments(tmp_path):
    t = _table([None], 10)
    t.kv_usage["empty"] = np.zeros(0)
    assert plot_kv_usage(t, str(tmp_path / "kv.png")) == {"a": (0, 9)}
    none = ResultTable(rows=[], agents=[], horizons=[None], seeds=[0])
    assert plot_kv_usage(none, str(tmp_path / "none.png")) == {}
    assert not (tmp_path / "none.png").exists()
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="window"):
            plot_kv_usage(t, str(tmp_path / "kv.png"), window=bad)
    with pytest.raises(ValueError, match="max_points"):
        plot_kv_usage(t, str(tmp_path / "kv.png"), max_points=0)


def test_unit_of_time_follows_the_built_environment():
    from flowgym.lab.evaluation import evaluate
    from flowgym.agents import make_agent

    explicit_slot = evaluate([make_agent("fixed", b=4)], {"horizon": 20, "time_model": "slot"}, seeds=[0], horizons=[20])
    assert explicit_slot.time_unit == "slot" and "req/slot" in explicit_slot.format()
    timed = {"horizon": 20, "time_model": "llama2-70b-tp2-a100",
             "workload": {"kind": "iid", "rate": 2.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    as_config = evaluate([make_agent("fixed", b=4)], {"config": timed}, seeds=[0], horizons=[20])
    assert as_config.time_unit == "s"
