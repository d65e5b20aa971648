"""Figures in the paper's layout (needs matplotlib: ``pip install -e '.[plot]' in the flowgym checkout``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgym.lab.evaluation import ResultTable

__all__ = ["plot_metrics_vs_horizon", "plot_metrics_bars", "plot_kv_usage"]

#: Panels of the metric figures, time in system first: ``(metric, label, unit kind)``.
PANELS = (
    ("mean_time_in_system", "time in system, all requests", "time"),
    ("avg_latency", "average latency, completed only (survivors)", "time"),
    ("p95_latency", "95% latency, completed only (survivors)", "time"),
    ("evictions", "evictions (symlog scale)", "count"),
    ("request_throughput", "request throughput", "rate"),
    ("token_throughput", "token throughput", "rate"),
)

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_DASHES = ("-", "--", "-.", ":")


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("plots need matplotlib: pip install -e '.[plot]' in the flowgym checkout") from e
    return plt


def _style(i: int) -> dict[str, Any]:
    """Agent ``i``'s line style: colour, marker and dash all differ, so lines that coincide stay visible."""
    return {"color": f"C{i % 10}", "marker": _MARKERS[i % len(_MARKERS)], "ls": _DASHES[i % len(_DASHES)]}


def _label(kind: str, text: str, unit: str) -> str:
    if kind == "time":
        return f"{text} ({unit})"
    if kind == "rate":
        return f"{text} (per {unit})"
    return text


def _title(fig: Any, title: str) -> None:
    if title:
        import textwrap

        fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=9)


def _ci_whiskers(y: np.ndarray, ci: np.ndarray) -> np.ndarray:
    """Error bars ``[below, above]`` for means ``y`` with 95% half-widths ``ci``: none where either is unknown, and
    never below 0 (every metric drawn is a count, a time or a rate)."""
    ok = np.isfinite(y) & np.isfinite(ci)
    up = np.where(ok, ci, 0.0)
    return np.vstack([np.where(ok, np.minimum(ci, np.maximum(y, 0.0)), 0.0), up])


def _note_empty(ax: Any, agents: Sequence[str]) -> None:
    """Say in the panel which agents have no value there (no request finished: the metric is undefined), rather than
    leave them out without a word."""
    if agents:
        ax.text(0.01, 0.99, "no value: " + ", ".join(agents), transform=ax.transAxes, va="top", ha="left", fontsize=7,
                color="0.3")


def plot_metrics_vs_horizon(table: ResultTable, path: str, title: str = "") -> None:
    """Six metrics against the horizon (time in system first), one line per agent, 95% CI bands.

    With a single horizon each agent is a point with a 95% CI error bar. Bands and bars stop at 0 (no metric
    drawn can be negative); an agent with no value in a panel (no request finished) is named there.
    """
    plt = _plt()
    summ = table.summary()
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    single = len(table.horizons) == 1
    for ax, (metric, text, kind) in zip(axes.flat, PANELS):
        empty = []
        for i, agent in enumerate(table.agents):
            rows = [r for r in summ if r["agent"] == agent]
            x = np.array([r["horizon"] for r in rows], dtype=np.float64)
            y = np.array([r[metric] for r in rows], dtype=np.float64)
            ci = np.array([r[metric + "_ci"] for r in rows], dtype=np.float64)
            st = _style(i)
            if not np.isfinite(y).any():
                empty.append(agent)
            if single:
                # agents side by side around the one horizon, so their error bars do not overlap
                xs = x + (i - (len(table.agents) - 1) / 2) * 0.04 * max(abs(x[0]), 1.0)
                ax.errorbar(xs, y, yerr=_ci_whiskers(y, ci), fmt=st["marker"], color=st["color"],
                            capsize=3, ms=6, label=agent)
            else:
                ax.plot(x, y, marker=st["marker"], ls=st["ls"], color=st["color"], ms=5, mfc="none", label=agent,
                        markevery=1)
                ok = np.isfinite(y) & np.isfinite(ci)
                if ok.any():  # the band where the interval is known; a metric below 0 does not exist
                    lo, hi = np.where(ok, np.maximum(y - ci, 0.0), 0.0), np.where(ok, y + ci, 0.0)
                    ax.fill_between(x, lo, hi, where=ok, alpha=0.12, color=st["color"])
                    # a known interval between two unknown ones has no band to span: an error bar there
                    alone = ok & ~(np.r_[False, ok[:-1]] | np.r_[ok[1:], False])
                    if alone.any():
                        ax.errorbar(x[alone], y[alone], yerr=_ci_whiskers(y[alone], ci[alone]), fmt="none",
                                    color=st["color"], alpha=0.5, capsize=3)
        if single and table.horizons[0] is not None:  # the one horizon stays in view when no agent has a value
            h, half = table.horizons[0], 0.04 * (len(table.agents) + 1) / 2 * max(abs(table.horizons[0]), 1.0)
            ax.set_xlim(h - half, h + half)
        _note_empty(ax, empty)
        # in continuous time a horizon counts engine iterations and latencies are in seconds
        ax.set_xlabel("horizon T (slots)" if table.time_unit == "slot" else "horizon T (iterations)")
        ax.set_ylabel(_label(kind, text, table.time_unit), fontsize=8)
        if kind == "count":
            ax.set_yscale("symlog", linthresh=1.0)  # zero and hundreds of thousands on one panel
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    _title(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_metrics_bars(table: ResultTable, path: str, title: str = "", unit: str | None = None) -> None:
    """Six metrics per agent as bars with 95% CI whiskers (time in system first; runs to the end of a workload).

    ``unit``: of latencies and throughputs (default: the table's ``time_unit``).
    """
    plt = _plt()
    unit = table.time_unit if unit is None else unit
    summ = table.summary()
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    x = np.arange(len(table.agents))
    for ax, (metric, text, kind) in zip(axes.flat, PANELS):
        y = [next(r[metric] for r in summ if r["agent"] == a) for a in table.agents]
        ci = [next(r[metric + "_ci"] for r in summ if r["agent"] == a) for a in table.agents]
        ax.bar(x, y, yerr=_ci_whiskers(np.array(y, dtype=np.float64), np.array(ci, dtype=np.float64)),
               color=[f"C{i % 10}" for i in x], capsize=3)
        _note_empty(ax, [a for a, v in zip(table.agents, y) if not np.isfinite(v)])
        ax.set_xticks(x, table.agents, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(_label(kind, text, unit), fontsize=8)
        if kind == "count":
            ax.set_yscale("symlog", linthresh=1.0)
        ax.grid(alpha=0.3, axis="y")
    _title(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_kv_usage(table: ResultTable, path: str, title: str = "", window: int | None | str = "auto",
                  max_points: int = 2000) -> dict[str, tuple[int, int]]:
    """KV usage ``U_t / M`` over time per agent (first seed), one panel each, with its std in the title.

    ``window`` shows the last ``window`` slots, ``None`` the whole run; ``"auto"`` (default)
    shows the last 500 slots of a fixed-horizon run (its steady state) and the whole of a
    run-to-the-end one (whose last slots are only the drain). A longer series is drawn as
    ``max_points`` bins: the bin mean, with the bin's min-max range shaded. The mean and std
    in each title are over the whole shown series. Agents with an empty series are left out
    (no file is written when none is left). Returns each agent's first and last slot shown.
    """
    if window == "auto":
        window = None if any(h is None for h in table.horizons) else 500
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive number of slots, None or 'auto', got {window!r}")
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise ValueError(f"max_points must be a positive integer, got {max_points!r}")
    series = {a: u for a, u in table.kv_usage.items() if u.size}  # an empty series has nothing to draw
    n = len(series)
    if n == 0:
        return {}
    plt = _plt()
    step = "slot" if table.time_unit == "slot" else "iteration"
    shown: dict[str, tuple[int, int]] = {}
    # whole runs of different lengths (a policy that never drains runs to the iteration cap)
    # get their own x axes; windows of a fixed-horizon table share one
    fig, axes = plt.subplots(n, 1, figsize=(12, 1.7 * n + 0.6), sharex=window is not None, squeeze=False)
    for ax, (agent, u) in zip(axes[:, 0], series.items()):
        t = np.arange(u.size)
        if window is not None and u.size > window:
            t, u = t[-window:], u[-window:]
        shown[agent] = (int(t[0]), int(t[-1]))
        label = f"{agent}: {step}s {t[0]}-{t[-1]}: mean {u.mean():.3f}, std {u.std():.3f}"
        if u.size > max_points:
            edges = np.linspace(0, u.size, max_points + 1).astype(np.int64)
            starts = edges[:-1]
            counts = np.diff(edges)
            mean = np.add.reduceat(u, starts) / counts
            centre = t[starts] + (counts - 1) / 2
            ax.fill_between(centre, np.minimum.reduceat(u, starts), np.maximum.reduceat(u, starts),
                            alpha=0.3, lw=0)
            ax.plot(centre, mean, lw=0.8)
        else:
            ax.plot(t, u, lw=0.8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("U/M", fontsize=8)
        ax.set_title(label, fontsize=8, loc="left")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("slot" if table.time_unit == "slot" else "iteration (batch)")
    _title(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return shown
