"""Figures in the paper's layout (needs matplotlib: ``pip install flowgym[plot]``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from flowgym.lab.evaluation import ResultTable

__all__ = ["plot_metrics_vs_horizon", "plot_metrics_bars", "plot_kv_usage"]

PANELS = (
    ("avg_latency", "average latency (slots)"),
    ("p95_latency", "95% latency (slots)"),
    ("request_throughput", "request throughput (per slot)"),
    ("token_throughput", "token throughput (per slot)"),
)


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("plots need matplotlib: pip install 'flowgym[plot]'") from e
    return plt


def plot_metrics_vs_horizon(table: ResultTable, path: str, title: str = "") -> None:
    """The paper's Figure 1 layout: four metrics against the horizon, one line per agent (95% CI bands)."""
    plt = _plt()
    summ = table.summary()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for ax, (metric, ylabel) in zip(axes, PANELS):
        for agent in table.agents:
            rows = [r for r in summ if r["agent"] == agent]
            x = np.array([r["horizon"] for r in rows])
            y = np.array([r[metric] for r in rows])
            ci = np.array([r[metric + "_ci"] for r in rows])
            ax.plot(x, y, marker="o", ms=3, label=agent)
            if np.isfinite(ci).all():
                ax.fill_between(x, y - ci, y + ci, alpha=0.15)
        ax.set_xlabel("horizon T (slots)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_metrics_bars(table: ResultTable, path: str, title: str = "", unit: str | None = None) -> None:
    """The four metrics per agent as bars with 95% CI whiskers (runs to the end of a workload).

    ``unit``: of latencies and throughputs (default: the table's ``time_unit``).
    """
    plt = _plt()
    unit = table.time_unit if unit is None else unit
    summ = table.summary()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    labels = {"avg_latency": f"average latency ({unit})", "p95_latency": f"95% latency ({unit})",
              "request_throughput": f"request throughput (per {unit})",
              "token_throughput": f"token throughput (per {unit})"}
    x = np.arange(len(table.agents))
    for ax, (metric, _) in zip(axes, PANELS):
        y = [next(r[metric] for r in summ if r["agent"] == a) for a in table.agents]
        ci = [next(r[metric + "_ci"] for r in summ if r["agent"] == a) for a in table.agents]
        ax.bar(x, y, yerr=[c if np.isfinite(c) else 0 for c in ci], color=[f"C{i}" for i in x], capsize=3)
        ax.set_xticks(x, table.agents, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(labels[metric])
        ax.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title, fontsize=9)
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
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return shown
