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
    assert slots.time_unit == "slot" and "(/slot)" in slots.format()
    timed = {"horizon": 50, "time_model": "llama2-70b-tp2-a100",
             "workload": {"kind": "iid", "rate": 2.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    secs = evaluate([make_agent("fixed", b=4)], timed, seeds=[0], horizons=[50])
    assert secs.time_unit == "s" and "(/s)" in secs.format() and "(/slot)" not in secs.format()


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
    assert explicit_slot.time_unit == "slot" and "(/slot)" in explicit_slot.format()
    timed = {"horizon": 20, "time_model": "llama2-70b-tp2-a100",
             "workload": {"kind": "iid", "rate": 2.0, "timed": True, "lengths": {"kind": "lmsys-like"}}}
    as_config = evaluate([make_agent("fixed", b=4)], {"config": timed}, seeds=[0], horizons=[20])
    assert as_config.time_unit == "s"


# --------------------------------------------------------------------------- figures and tables people read right

PAPER_LABELS = ["flow-control (Alg. 1) b=(4,4,4)", "flow-control (Alg. 2) b=12", "alpha-greedy alpha=0.7", "MC",
                "MC-SF", "greedy-LIFO (vLLM-like)"]


def _paper_like_table(horizons):
    from flowgym.sim.metrics import METRIC_NAMES

    rng = np.random.default_rng(0)
    rows = []
    for i, a in enumerate(PAPER_LABELS):
        for T in horizons:
            for seed in range(3):
                r = {m: float(rng.uniform(0, 1000)) for m in METRIC_NAMES}
                r["evictions"] = float(rng.integers(0, 400_000))
                r["wasted_tokens"] = float(rng.integers(0, 3_000_000))
                # MC and greedy-LIFO coincide (as in the paper's setting)
                if a == "greedy-LIFO (vLLM-like)":
                    r = dict(next(x for x in rows if x["agent"] == "MC" and x["horizon"] == T and x["seed"] == seed))
                rows.append({**r, "agent": a, "horizon": T, "seed": seed})
    return ResultTable(rows=rows, agents=PAPER_LABELS, horizons=horizons, seeds=[0, 1, 2])


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw (kept open instead of closed)."""
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for f in kept:
        plt.figure(f.number)
        plt.clf()


def test_metric_figures_lead_with_time_in_system_and_mark_survivor_metrics(tmp_path, figures):
    from flowgym.lab.plots import plot_metrics_bars, plot_metrics_vs_horizon

    plot_metrics_vs_horizon(_paper_like_table([1000, 2000, 3000]), str(tmp_path / "m.png"), title="x " * 120)
    plot_metrics_bars(_paper_like_table([None]), str(tmp_path / "b.png"))
    for fig in figures:
        labels = [ax.get_ylabel() for ax in fig.axes]
        assert labels[0].startswith("time in system")
        assert any(lb.startswith("evictions") for lb in labels)
        assert all("survivors" in lb for lb in labels if "latency" in lb)
    assert "\n" in figures[0]._suptitle.get_text()  # a long title wraps


def test_coinciding_lines_stay_visible(tmp_path, figures):
    from flowgym.lab.plots import plot_metrics_vs_horizon

    plot_metrics_vs_horizon(_paper_like_table([1000, 2000, 3000]), str(tmp_path / "m.png"))
    lines = figures[0].axes[0].get_lines()
    styles = [(ln.get_marker(), ln.get_linestyle(), ln.get_color()) for ln in lines]
    assert len(styles) == len(PAPER_LABELS) and len(set(styles)) == len(styles)
    mc, lifo = lines[PAPER_LABELS.index("MC")], lines[PAPER_LABELS.index("greedy-LIFO (vLLM-like)")]
    np.testing.assert_array_equal(mc.get_ydata(), lifo.get_ydata())  # the same data, drawn differently
    assert (mc.get_marker(), mc.get_linestyle()) != (lifo.get_marker(), lifo.get_linestyle())


def test_single_horizon_plots_show_confidence_intervals(tmp_path, figures):
    from flowgym.lab.plots import plot_metrics_vs_horizon

    plot_metrics_vs_horizon(_paper_like_table([4000]), str(tmp_path / "m.png"))
    ax = figures[0].axes[0]
    assert len(ax.containers) == len(PAPER_LABELS)  # one error bar per agent
    xs = [c.lines[0].get_xdata()[0] for c in ax.containers]
    assert len(set(xs)) == len(xs)  # side by side, not on top of each other


def test_table_fits_120_columns_names_units_and_horizons():
    table = _paper_like_table([1000, 2000, 5000])
    text = table.format()
    assert max(len(line) for line in text.splitlines()) <= 120
    head = text.splitlines()
    assert head[0].startswith("at T = 5000 (of horizons 1000, 2000, 5000")
    assert "time in sys" in head[1] and head[1].index("time in sys") < head[1].index("avg lat*")
    assert "(slot)" in head[2] and "(/slot)" in head[2] and "(count)" in head[2]
    assert text.splitlines()[-1].startswith("* over completed requests only")
    wide = table.format(wide=True)
    for name in ("overflows", "wasted", "mean U/M", "std U/M", "max U/M"):
        assert name in wide and name not in text
    assert "at T = 1000" in table.format(horizon=1000)


def test_table_cells_round_mean_and_ci_alike():
    from flowgym.lab.evaluation import _cell

    assert _cell(1035.2, 43.4) == "1035 ± 43"
    assert _cell(477.7912, 0.0512) == "477.79 ± 0.05"
    assert _cell(0.98213, 0.00012) == "0.982 ± 0.000"
    assert _cell(7.0, float("nan")) == "7"
    assert _cell(float("nan"), float("nan")) == "nan"


def test_bands_stop_at_zero_and_agents_without_a_value_are_named(tmp_path, figures):
    """A wide interval on a count does not draw a band below 0; an agent whose metric has no value (no request
    finished) is named in the panel; a band is drawn where its interval is known even if one horizon's is not; a
    single horizon stays in view when no agent has a value."""
    from flowgym.lab.plots import plot_metrics_bars, plot_metrics_vs_horizon
    from flowgym.sim.metrics import METRIC_NAMES

    def row(agent, T, seed, v):
        return {**{m: v for m in METRIC_NAMES}, "agent": agent, "horizon": T, "seed": seed}

    rows = []
    for T in (100, 200, 300):
        rows += [row("wide", T, 0, 1.0), row("wide", T, 1, 90.0)]  # mean 45.5, CI far beyond it
        rows += [row("none", T, s, float("nan")) for s in (0, 1)]
        rows += [row("gap", T, 0, 10.0), row("gap", T, 1, 20.0 if T != 200 else float("nan"))]
    plot_metrics_vs_horizon(ResultTable(rows, ["wide", "none", "gap"], [100, 200, 300], [0, 1]),
                            str(tmp_path / "m.png"))
    ax = figures[0].axes[3]  # evictions, symlog
    bands = [c for c in ax.collections if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
    lows = [min(p.vertices[:, 1].min() for p in b.get_paths()) for b in bands]
    assert len(bands) == 2 and min(lows) >= 0.0  # "wide" and "gap", none below 0
    wide = bands[0].get_paths()[0].vertices
    assert np.ptp(wide[:, 1]) > 0 and np.ptp(wide[:, 0]) == 200  # a band of some area over 100..300
    assert len(ax.containers) == 1  # "gap": its known horizons 100 and 300 sit between unknown ones: error bars
    xs = ax.containers[0].lines[2][0].get_segments()
    assert sorted(float(s[0][0]) for s in xs) == [100.0, 300.0] and min(float(s[:, 1].min()) for s in xs) >= 0.0
    assert any("no value: none" in t.get_text() for t in ax.texts)
    one = [r for r in rows if r["horizon"] == 100 and r["agent"] == "none"]
    plot_metrics_vs_horizon(ResultTable(one, ["none"], [100], [0, 1]), str(tmp_path / "s.png"))
    lo, hi = figures[1].axes[0].get_xlim()
    assert lo < 100 < hi and any("no value: none" in t.get_text() for t in figures[1].axes[0].texts)
    plot_metrics_vs_horizon(ResultTable([{**r, "horizon": None} for r in one], ["none"], [None], [0, 1]),
                            str(tmp_path / "end.png"))  # a run-to-the-end table still draws (no horizon to show)
    ends = [{**r, "horizon": None} for r in rows if r["horizon"] == 100]  # runs to the end of a workload
    plot_metrics_bars(ResultTable(ends, ["wide", "none", "gap"], [None], [0, 1]), str(tmp_path / "b.png"))
    bar_ax = figures[3].axes[0]
    assert any("no value: none" in t.get_text() for t in bar_ax.texts)
    segments = [np.asarray(seg).reshape(-1, 2) for c in bar_ax.collections
                for seg in getattr(c, "get_segments", lambda: [])()]
    whisker_lows = [seg[:, 1].min() for seg in segments if seg.size]
    assert whisker_lows and min(whisker_lows) >= 0.0
