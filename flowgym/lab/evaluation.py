"""One evaluation path for every agent: run, tabulate, tune.

* :func:`run_episode` runs one agent on one environment configuration and seed.
* :func:`evaluate` runs agents over seeds and reports the metrics at several
  horizons, per seed and as means with 95% confidence intervals. Each
  (agent, seed) is simulated once at the longest horizon; the metrics at a
  shorter horizon ``T`` are those of its first ``T`` slots, which are exactly
  what a ``T``-slot run gives (no agent sees the horizon).
* :func:`tune` grid-searches one parameter on tuning seeds.

The same seed gives every agent the same arrivals: the workload is drawn from
the environment's seed alone, and each agent's own randomness from its own.
"""

from __future__ import annotations

import csv
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowgym.agents import make_agent
from flowgym.envs.flow_control import MAX_COUNT, FlowControlConfig, FlowControlEnv
from flowgym.sim import _json
from flowgym.sim.metrics import METRIC_NAMES, metrics_at
from flowgym.sim.vllm import SERVING_TABLE_METRICS, serving_metrics_at
from flowgym.lab.scenarios import AgentSpec

__all__ = [
    "Episode",
    "ResultTable",
    "build_agent",
    "FINITE_CAP",
    "capped_env",
    "env_for",
    "check_hostable",
    "run_episode",
    "evaluate",
    "tune",
    "Progress",
    "episode_work",
    "t_quantile_975",
    "lower_bounds",
    "format_lower_bounds",
    "bound_unsupported",
]

#: Metrics summarised per agent and horizon (all of the spec's scalar metrics); rows of a ``vllm-v1`` run
#: also carry :data:`SERVING_METRICS`, summarised and written to the CSV too.
TABLE_METRICS = METRIC_NAMES
#: The serving metrics (:data:`flowgym.sim.vllm.SERVING_TABLE_METRICS`) on the rows of a ``vllm-v1`` run.
SERVING_METRICS = SERVING_TABLE_METRICS
#: Columns of the wide terminal table (``--wide``).
DISPLAY_METRICS = (
    "mean_time_in_system",
    "avg_latency",
    "p95_latency",
    "request_throughput",
    "token_throughput",
    "evictions",
    "overflow_events",
    "wasted_tokens",
    "mean_kv_usage",
    "std_kv_usage",
    "max_kv_usage",
)

#: Columns of the terminal table by default (fits 120 columns): the first six, time in system first.
COMPACT_METRICS = DISPLAY_METRICS[:6]
#: Columns the terminal table adds for a ``vllm-v1`` run: time to first token by default, and with ``--wide``
#: its p99 and the admissions the engine refused.
SERVING_COMPACT = ("time_to_first_token_p50",)
SERVING_DISPLAY = ("time_to_first_token_p50", "time_to_first_token_p99", "refused_admissions")


def _cell(v: float, ci: float) -> str:
    """``mean ± ci``, both to the decimal place of the CI's first significant digit (0..3 decimals)."""
    if not np.isfinite(v):
        return "nan" if np.isnan(v) else f"{v}"
    if np.isfinite(ci) and ci > 0:
        d = int(min(3, max(0, -math.floor(math.log10(ci)))))
        return f"{v:.{d}f} ± {ci:.{d}f}"
    d = 0 if abs(v) >= 100 or float(v).is_integer() else 3 if abs(v) < 1 else 2
    return f"{v:.{d}f}" + ("" if not np.isfinite(ci) else f" ± {ci:.{d}f}")


# two-sided 95% Student t quantiles t_{0.975, df}, df = 1..30 (standard table values)
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


#: The standard normal's 0.975 quantile.
_Z975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """``t_{0.975}`` with ``df`` (an integer) degrees of freedom: the table to 30, then the Cornish-Fisher
    expansion of Student's t in ``1/df`` to the fourth order (within 1e-6 of the exact quantile from 31 on,
    1.9623 at 1,000; it tends to 1.95996). ``nan`` below 1."""
    if isinstance(df, (bool, np.bool_)) or not isinstance(df, (int, np.integer)):
        raise ValueError(f"degrees of freedom must be an integer, got {df!r}")
    if df < 1:
        return float("nan")
    if df <= 30:
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    d = float(df)
    return z + g1 / d + g2 / d**2 + g3 / d**3 + g4 / d**4


def _ci95(v: np.ndarray) -> float:
    """Half-width of the 95% t-interval of the mean of ``v`` (``nan`` for fewer than two values)."""
    return float(t_quantile_975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else float("nan")


@dataclass
class Episode:
    """One agent's run on one seed."""

    label: str
    seed: int
    config: FlowControlConfig
    log: dict[str, np.ndarray]
    series: dict[str, np.ndarray]
    wall_seconds: float
    #: Requests of a finite workload that had not arrived when the run stopped (0 for an endless workload).
    not_arrived: int = 0

    def metrics(self, T: int | None = None) -> dict[str, Any]:
        """Metrics of the first ``T`` slots (all by default); a ``vllm-v1`` run's add its
        :data:`~flowgym.sim.vllm.SERVING_TABLE_METRICS` (time to first token, refused admissions, ...)."""
        T = int(self.series["usage"].size) if T is None else T
        m = metrics_at(self.log, self.series, self.config.M, T)
        if "first_token" in self.log:
            m.update(serving_metrics_at(self.log, self.series, T))
        return m


#: The fewest iterations a run to the end of a finite workload stops at when neither the caller nor the scenario
#: sets a horizon (:func:`capped_env`): a policy that admits nothing would otherwise never drain.
FINITE_CAP = 1_000_000


def finite_cap(workload: Any, timed: bool) -> int:
    """The safety cap of a run to the end of the finite ``workload``: at least :data:`FINITE_CAP` iterations, and
    for a trace its last arrival (in slots) plus ten iterations per token of every request and 100 per request (a
    policy that serves the requests one after another, each evicted several times, stays below it)."""
    n = int(workload.total_requests or 0)
    cap = max(FINITE_CAP, 100 * n)
    prompt, output = getattr(workload, "prompt_len", None), getattr(workload, "output_len", None)
    if prompt is not None and output is not None and n:
        last = 0 if timed else max(0, int(math.ceil(float(workload.last_arrival))))
        cap = max(cap, last + 10 * int(np.sum(prompt, dtype=np.int64) + np.sum(output, dtype=np.int64)) + 100 * n)
    return min(cap, int(MAX_COUNT))


def capped_env(env_kwargs: dict[str, Any]) -> FlowControlEnv:
    """``FlowControlEnv(**env_kwargs)``, but with no ``horizon`` (a finite workload run to its end) the safety cap
    :func:`finite_cap`. A run that reaches it has requests unfinished or not yet arrived, which the tables and
    ``flowgym run`` report ("did not drain")."""
    env = FlowControlEnv(**env_kwargs)
    if env.config.horizon is None:
        env = FlowControlEnv(**{**env_kwargs, "horizon": finite_cap(env.workload, env.config.time_model != "slot")})
    return env


def env_for(agent: Any, env_kwargs: dict[str, Any], horizon: int | None) -> FlowControlEnv:
    """The environment an agent runs in: the scenario's arguments plus the agent's needs.

    ``max_budget`` takes the larger of the two; any other option the agent
    needs must agree with the scenario's (or the scenario must leave it unset),
    else ``ValueError`` says which. An agent that names no ``action`` sends budgets:
    a scenario with another action is refused for it. With no horizon from either (a finite workload
    run to its end), :func:`capped_env`'s safety cap.
    """
    kw = dict(env_kwargs)
    if horizon is not None or "horizon" not in kw:
        kw["horizon"] = horizon  # None: the scenario's own (a cap), or run to the end of a finite workload
    options = agent.env_options()
    if "action" not in options and kw.get("action", "budget") != "budget":  # its budgets would be read otherwise
        raise ValueError(f"agent {agent.label()!r} sends budgets (action='budget') but the scenario sets "
                         f"action={kw['action']!r}, which would read them as another action")
    for key, value in options.items():
        if key == "max_budget":
            kw["max_budget"] = max(int(kw.get("max_budget", FlowControlConfig.max_budget)), int(value))
        elif key in kw and _plain(kw[key]) != _plain(value):  # a scenario file's list is the agent's tuple
            raise ValueError(
                f"agent {agent.label()!r} needs {key}={value!r} but the scenario sets {key}={kw[key]!r}"
            )
        else:
            kw[key] = value
    return capped_env(kw)


def _plain(value: Any) -> Any:
    """``value`` with every list and tuple in it a tuple (and every mapping's values so), for comparing options."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def check_hostable(agent: Any, env_kwargs: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the agent unless the scenario can run it: its environment builds (the agent's
    options agree with the scenario's) and its first action is one the environment takes (e.g. per-class budgets
    for as many classes as the workload has). One reset and one step, so that a grid refuses such an agent before
    any cell runs rather than inside one."""
    try:  # building the environment too: the agent's options may not suit the scenario's (e.g. per-class budgets)
        env = env_for(agent, env_kwargs, 1)
        obs, _ = env.reset(seed=0)
        agent.reset(env.config, seed=0)
        env.step(agent.act(obs, env.view()))
    except ValueError as e:
        if str(e).startswith(f"agent {agent.label()!r}"):  # env_for's conflict message names it already
            raise
        raise ValueError(f"agent {agent.label()!r} cannot run on this scenario: {e}") from None


def run_episode(
    agent: Any, env_kwargs: dict[str, Any], seed: int, horizon: int | None, label: str | None = None,
    *, compiled: bool = True,
) -> Episode:
    """Run ``agent`` for ``horizon`` slots on ``seed``.

    ``horizon=None`` keeps the scenario's ``horizon`` (for a finite workload, a safety cap:
    the run ends when the workload drains) or, if it has none, runs to the end, never past
    :func:`capped_env`'s cap. An agent that
    states its :meth:`~flowgym.agents.base.Agent.admission_rule` runs in one compiled loop
    where the environment allows (:meth:`FlowControlEnv.run_rule`: continuous time, numba),
    with the same result; ``compiled=False`` steps it in Python every iteration.
    """
    env = env_for(agent, env_kwargs, horizon)
    t0 = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    agent.reset(env.config, seed=seed)
    rule = agent.admission_rule(env.view()) if compiled else None
    done = rule is not None and env.rule_unsupported(rule) is None
    if done:  # the agent's rule, one compiled loop: the same run as stepping it (tests/test_compiled_episode.py)
        env.run_rule(rule)
    while not done:
        obs, _, terminated, truncated, _ = env.step(agent.act(obs, env.view()))
        done = terminated or truncated
    wall = time.perf_counter() - t0
    log = env.request_log()
    total = env.workload.total_requests
    left = 0 if total is None else max(0, int(total) - int(log["finish"].size))
    return Episode(label or agent.label(), seed, env.config, log, env.series(), wall, left)


class Progress:
    """Progress of a run of episodes on stderr, its ETA counted in work, not items.

    ``total`` is the total work (e.g. slots to simulate: :func:`episode_work` of each
    episode) and :meth:`update` adds an item's ``work`` when it finishes. On a terminal it
    redraws one line (``\\r``), also every second while a long item runs, so the elapsed
    time never freezes; elsewhere (a log file, CI) it prints a plain line at most every
    ``interval`` seconds and at the end. Silent when ``enabled`` is false.
    """

    def __init__(self, total: float, enabled: bool = True, width: int = 30, *, stream: Any = None,
                 interval: float = 10.0) -> None:
        self.total, self.done, self.n, self.enabled, self.width = max(float(total), 1e-12), 0.0, 0, enabled, width
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = float(interval)
        self.what = ""
        self.t0 = time.perf_counter()
        self._last_line = self.t0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled and self.tty:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw()

    def _line(self) -> tuple[str, float]:
        frac = min(self.done / self.total, 1.0)
        el = time.perf_counter() - self.t0
        eta = f"{el / frac - el:4.0f}s" if frac > 0 else "   ?"
        return f"{frac:4.0%} of the work, {self.n} done, {el:5.0f}s elapsed, eta {eta}", frac

    def _draw(self, final: bool = False) -> None:
        text, frac = self._line()
        if self.tty:
            bar = "#" * int(frac * self.width)
            self.stream.write(f"\r[{bar:<{self.width}}] {text} {self.what[:40]:<40}" + ("\n" if final else ""))
        else:
            self.stream.write(f"progress: {text}: {self.what}\n")
            self._last_line = time.perf_counter()
        self.stream.flush()

    def update(self, what: str = "", work: float = 1.0) -> None:
        """One item (``what``) finished, ``work`` of the total."""
        with self._lock:
            self.n += 1
            self.done += float(work)
            self.what = what
            if not self.enabled:
                return
            final = self.done >= self.total * (1 - 1e-9)
            if final:
                self._stop.set()
            if self.tty or final or time.perf_counter() - self._last_line >= self.interval:
                self._draw(final)

    def close(self) -> None:
        """Stop redrawing (the last item's update does this by itself)."""
        self._stop.set()


def episode_work(env_kwargs: dict[str, Any], horizon: int | None) -> float:
    """How long an episode runs, for :class:`Progress`: its horizon, else its finite workload's requests."""
    if horizon is not None:
        return float(horizon)
    try:
        from flowgym.sim.workloads import make_workload

        wl = make_workload(env_kwargs.get("workload", {"kind": "poisson", "classes": [[10, 20]], "rates": 1.0}))
        n = getattr(wl, "n_requests", None)
        n = len(wl) if n is None and hasattr(wl, "__len__") else n
        return float(n) if n else 1.0
    except (ValueError, TypeError):
        return 1.0


@dataclass
class ResultTable:
    """Per-seed rows and per-(agent, horizon) summaries with 95% confidence intervals."""

    rows: list[dict[str, Any]]
    agents: list[str]
    horizons: list[int]
    seeds: list[int]
    #: ``U_t / M`` of each agent's first seed, for trajectory plots.
    kv_usage: dict[str, np.ndarray] = field(default_factory=dict)
    #: tuned parameter values by agent label.
    tuned: dict[str, Any] = field(default_factory=dict)
    wall_seconds: dict[str, float] = field(default_factory=dict)
    #: unit of time of latencies and throughputs: ``"slot"``, or ``"s"`` in continuous time.
    time_unit: str = "slot"
    #: what each label ran, by label: ``{"name": agent name, "params": its parameters}`` (an agent given as an
    #: object: its name and class), so the JSON says which variant a row is.
    agent_specs: dict[str, Any] = field(default_factory=dict)

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metrics of the rows: :data:`TABLE_METRICS`, and :data:`SERVING_METRICS` if every row has them
        (a ``vllm-v1`` run)."""
        serving = bool(self.rows) and all(all(m in r for m in SERVING_METRICS) for r in self.rows)
        return TABLE_METRICS + SERVING_METRICS if serving else TABLE_METRICS

    def summary(self) -> list[dict[str, Any]]:
        """Mean and 95% CI half-width (``<metric>_ci``) of each metric (:attr:`metric_names`), per agent and
        horizon.

        ``n`` is the number of seeds; a metric's mean and interval are over the seeds where it has a value
        (a latency is NaN on a seed where no request finished), so they can rest on fewer than ``n``.
        """
        out = []
        names = self.metric_names
        for agent in self.agents:
            for T in self.horizons:
                rs = [r for r in self.rows if r["agent"] == agent and r["horizon"] == T]
                row: dict[str, Any] = {"agent": agent, "horizon": T, "n": len(rs)}
                for m in names:
                    v = np.asarray([r[m] for r in rs], dtype=np.float64)
                    v = v[np.isfinite(v)]
                    row[m] = float(v.mean()) if v.size else float("nan")
                    row[m + "_ci"] = _ci95(v)
                out.append(row)
        return out

    def format(self, horizon: int | None = None, metrics: Sequence[str] | None = None, *, wide: bool = False) -> str:
        """A text table of the summary at ``horizon`` (the longest by default).

        ``metrics`` (default :data:`COMPACT_METRICS`, which fits 120 columns; ``wide=True``:
        every one of :data:`DISPLAY_METRICS`; a ``vllm-v1`` run adds :data:`SERVING_COMPACT` or
        :data:`SERVING_DISPLAY`). Each cell is the mean over seeds and the 95% CI
        half-width, both to the decimal place of the CI's first significant digit (at most 3
        decimals). The header names each column's unit; latencies marked ``*`` are over
        completed requests only (survivors), which rewards leaving long requests waiting: time
        in system counts every request.
        """
        if metrics is None:
            metrics = DISPLAY_METRICS if wide else COMPACT_METRICS
            if self.metric_names != TABLE_METRICS:  # a vllm-v1 run: its time to first token too
                metrics = metrics + (SERVING_DISPLAY if wide else SERVING_COMPACT)
        T = self.horizons[-1] if horizon is None else horizon
        rows = [r for r in self.summary() if r["horizon"] == T]
        u = self.time_unit
        names = {"avg_latency": ("avg lat*", u), "p95_latency": ("p95 lat*", u),
                 "mean_time_in_system": ("time in sys", u), "request_throughput": ("requests", f"/{u}"),
                 "token_throughput": ("tokens", f"/{u}"), "evictions": ("evictions", "count"),
                 "overflow_events": ("overflows", "count"), "wasted_tokens": ("wasted", "tokens"),
                 "mean_kv_usage": ("mean U/M", "share"), "std_kv_usage": ("std U/M", "share"),
                 "max_kv_usage": ("max U/M", "share"), "completed": ("completed", "count"),
                 "unfinished": ("unfinished", "count"), "time_to_first_token_p50": ("TTFT p50", u),
                 "time_to_first_token_p99": ("TTFT p99", u), "time_to_first_token_mean": ("TTFT mean", u),
                 "refused_admissions": ("refused", "count")}
        cells = [[_cell(r[m], r[m + "_ci"]) for m in metrics] for r in rows]
        widths = [max([len(names.get(m, (m, ""))[0]), len(names.get(m, (m, ""))[1]) + 2]
                      + [len(c[i]) for c in cells]) for i, m in enumerate(metrics)]
        w = max([len("agent")] + [len(r["agent"]) for r in rows])
        head1 = f"{'agent':<{w}}  " + "  ".join(f"{names.get(m, (m, ''))[0]:>{k}}" for m, k in zip(metrics, widths))
        head2 = f"{'':<{w}}  " + "  ".join(f"{'(' + names.get(m, (m, ''))[1] + ')':>{k}}" for m, k in zip(metrics, widths))
        when = "the end of the workload" if T is None else f"T = {T}"
        shown = [h for h in self.horizons if h is not None]
        others = f" (of horizons {', '.join(map(str, shown))}; the CSV has all)" if len(shown) > 1 else ""
        ns = len(self.seeds)
        lines = [f"at {when}{others}, {ns} seed{'' if ns == 1 else 's'}, mean ± 95% CI", head1, head2, "-" * len(head1)]
        for r, c in zip(rows, cells):
            lines.append(f"{r['agent']:<{w}}  " + "  ".join(f"{s:>{k}}" for s, k in zip(c, widths)))
        if any(m in ("avg_latency", "p95_latency") for m in metrics):
            lines.append("* over completed requests only (survivors); time in system counts every request")
        if T is None:  # runs to the end of a finite workload: say which ones stopped at the cap instead
            for agent in self.agents:
                rs = [r for r in self.rows if r["agent"] == agent and r["horizon"] is None]
                stuck = [r for r in rs if r.get("unfinished", 0) > 0 or r.get("not_arrived", 0) > 0]
                if stuck:
                    its = max(int(r.get("T", 0)) for r in stuck)
                    left = float(np.mean([r["unfinished"] for r in stuck]))
                    never = float(np.mean([r.get("not_arrived", 0) for r in stuck]))
                    lines.append(f"! {agent}: did not drain on {len(stuck)} of {len(rs)} seeds: stopped at the "
                                 f"iteration cap ({its:,} iterations) with {left:,.0f} requests unfinished on "
                                 "average, counted in time in system up to the cap"
                                 + (f", and {never:,.0f} not yet arrived, not counted" if never else ""))
        return "\n".join(lines)

    def to_csv(self, path: str) -> None:
        """Per-seed rows and summary rows (``seed`` = ``mean``) in one CSV; ``T`` (the slots run) and ``elapsed``
        (the seconds run by the horizon, in continuous time from the run's start: 0 for a generated workload, a trace's
        first arrival) on the per-seed rows, ``n`` (seeds) on the summary's;
        the serving metrics too for a ``vllm-v1`` run (:attr:`metric_names`)."""
        names = self.metric_names
        cols = (["agent", "horizon", "seed"] + list(names) + [m + "_ci" for m in names]
                + ["T", "elapsed", "n"])
        with open(path, "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            wr.writeheader()
            for r in self.rows:
                wr.writerow(r)
            for r in self.summary():
                wr.writerow({**r, "seed": "mean"})

    def to_json(self, path: str, **extra: Any) -> None:
        data = {
            "agents": self.agents,
            "horizons": self.horizons,
            "seeds": self.seeds,
            "tuned": self.tuned,
            "wall_seconds": self.wall_seconds,
            "time_unit": self.time_unit,
            "agent_specs": self.agent_specs,
            "rows": self.rows,
            "summary": self.summary(),
            **extra,
        }
        with open(path, "w") as fh:
            _json.dump(data, fh, indent=1)


def _recordable(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as the JSON can hold them: each value JSON can write as is (numbers, text, lists, paths as
    text), any other (an object given from Python) as its ``repr``."""
    out = {}
    for k, v in params.items():
        try:
            _json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out


def build_agent(spec: AgentSpec, **override: Any) -> Any:
    """The agent a spec names (:func:`flowgym.agents.make_agent`), its ``params`` updated by ``override``."""
    return make_agent(spec.name, **{**spec.params, **override})


@dataclass
class EpisodeCell:
    """One (agent, seed) episode of :func:`evaluate`: what travels to a worker."""

    #: an :class:`~flowgym.lab.scenarios.AgentSpec` (built in the worker) or an agent
    agent: Any
    label: str
    env_kwargs: dict[str, Any]
    seed: int
    #: report horizons (``[None]``: run to the end of the workload)
    horizons: list[Any]
    keep_kv_usage: bool

    def describe(self) -> str:
        return f"(agent {self.label!r}, seed {self.seed}, horizon {self.horizons[-1]})"


def run_episode_cell(cell: EpisodeCell) -> dict[str, Any]:
    """Run one cell; return its rows (metrics at each horizon), KV usage if asked, wall time, unit."""
    agent = build_agent(cell.agent) if isinstance(cell.agent, AgentSpec) else cell.agent
    ep = run_episode(agent, cell.env_kwargs, int(cell.seed), cell.horizons[-1], cell.label)
    rows = []
    for T in cell.horizons:
        # a finite workload drained before T: a run with horizon T is this run (the episode ends when it drains),
        # so its row at T is the whole run's (it was dropped, leaving the slower seeds only at T)
        m = ep.metrics(None if T is not None and T > ep.series["usage"].size else T)
        m.pop("kv_usage")
        rows.append({"agent": cell.label, "seed": int(cell.seed), "horizon": T, **m})
        if T is None:  # run to the end: requests the cap kept from arriving
            rows[-1]["not_arrived"] = ep.not_arrived
    return {"rows": rows, "wall": ep.wall_seconds, "time_unit": "slot" if ep.config.time_model == "slot" else "s",
            "kv_usage": ep.series["usage"] / ep.config.M if cell.keep_kv_usage else None}


#: The metrics where more is better, which :func:`tune` maximises (it minimises the others).
HIGHER_IS_BETTER = ("request_throughput", "token_throughput", "generated_token_throughput", "completed",
                    "generation_tokens")
#: Metrics with no better direction to tune by: the workload's (``arrived``, ``rejected``) and, on ``vllm-v1``, work
#: done or held whose more or less is not by itself better (``prefill_tokens``: recomputes add to it;
#: ``num_requests_running_mean``: a fuller batch is faster or slower).
NO_DIRECTION = ("arrived", "rejected", "prefill_tokens", "num_requests_running_mean")


def _check_seeds(seeds: Any) -> list[int]:
    """``seeds`` (any iterable of them) as a list; ``ValueError`` unless non-empty, non-negative integers, none twice."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise ValueError(f"seeds must be a non-empty list of non-negative integers, got {seeds!r}")
    given = seeds
    seeds = list(seeds)  # a generator is read once, here
    if not seeds or not all(
            isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= 0 for x in seeds):
        raise ValueError(f"seeds must be a non-empty list of non-negative integers, got {seeds if seeds else given!r}")
    if len(set(int(x) for x in seeds)) != len(seeds):  # a seed twice is one sample counted twice: a narrower CI
        raise ValueError(f"seeds lists a seed twice: {seeds!r}")
    return seeds


def evaluate(
    agents: Iterable[Any],
    env_kwargs: dict[str, Any],
    seeds: Sequence[int],
    horizons: Sequence[int] | None,
    *,
    progress: bool | Progress = False,
    keep_kv_usage: bool = True,
    backend: Any = "serial",
) -> ResultTable:
    """Run every agent (an ``Agent`` or an :class:`~flowgym.lab.scenarios.AgentSpec`) on every seed.

    Returns a :class:`ResultTable` with one row per (agent, seed, horizon).
    ``horizons=None`` runs every episode to the end of its finite workload
    (rows then have ``horizon`` ``None``); an episode of a finite workload that
    drains before a horizon has there its whole run's row (what a run with that
    horizon gives; its ``T`` says how long it ran). Agents with the same label are an
    error (their rows would mix). ``backend`` (``"serial"``, ``"process"``, ``"ray"`` or a
    :class:`flowgym.lab.parallel.Backend`) runs the (agent, seed) cells; the table is the
    same on every backend.
    """
    from flowgym.lab.parallel import using

    items = [(a, a.label or build_agent(a).label()) if isinstance(a, AgentSpec) else (a, a.label())
             for a in agents]
    labels = [lab for _, lab in items]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"agents with the same label: {dup}; give them distinct labels")
    if horizons is None:  # run each episode to the end of its (finite) workload
        hs: list[Any] = [None]
    else:
        if isinstance(horizons, (str, bytes)) or not all(
                isinstance(h, (int, np.integer)) and not isinstance(h, (bool, np.bool_)) and 1 <= h <= MAX_COUNT
                for h in horizons) or not len(horizons):  # True is not 1, 20.7 is not 20
            raise ValueError(f"horizons must be positive integers (up to 2**53), got {horizons!r}")
        hs = sorted({int(h) for h in horizons})
    seeds = _check_seeds(seeds)
    for agent, _ in items:  # bad input (an agent the scenario cannot host) fails here, before any run
        check_hostable(build_agent(agent) if isinstance(agent, AgentSpec) else agent, env_kwargs)
    work = episode_work(env_kwargs, hs[-1])
    bar = progress if isinstance(progress, Progress) else Progress(len(items) * len(seeds) * work, bool(progress))
    cells = [EpisodeCell(agent, label, env_kwargs, int(seed), hs, keep_kv_usage and k == 0)
             for agent, label in items for k, seed in enumerate(seeds)]
    with using(backend) as be:
        results = be.map(run_episode_cell, cells, done=lambda c: bar.update(f"{c.label} seed {c.seed}", work))
    table = ResultTable([], labels, hs, list(seeds))
    table.agent_specs = {lab: ({"name": a.name, "params": _recordable(a.params)} if isinstance(a, AgentSpec)
                               else {"name": getattr(a, "name", type(a).__name__), "class": type(a).__name__})
                         for a, lab in items}
    for cell, res in zip(cells, results):  # in the cells' order: agents, then seeds
        table.time_unit = res["time_unit"]  # as the env built it
        table.rows.extend(res["rows"])
        table.wall_seconds[cell.label] = table.wall_seconds.get(cell.label, 0.0) + res["wall"]
        if res["kv_usage"] is not None:
            table.kv_usage[cell.label] = res["kv_usage"]
    return table


def bound_unsupported(config: FlowControlConfig) -> str | None:
    """Why :func:`lower_bounds` does not apply to an environment configuration, or ``None`` if it does: it
    is for the paper's engine in the slot model (the bound counts slots and the tokens of ``docs/model.md``)."""
    if config.time_model != "slot":
        return f"the lower bound is for the slot model; this runs in continuous time (time_model={config.time_model!r})"
    if config.engine != "paper":
        return (f"the lower bound is for the paper's engine; engine={config.engine!r} holds other token counts "
                "(KV blocks, recompute preemption)")
    if config.record != "full":
        return (f"the lower bound reads every request's arrival and lengths, which record={config.record!r} does not "
                "keep: use record='full'")
    return None


@dataclass
class BoundCell:
    """One seed of :func:`lower_bounds`: what travels to a worker."""

    #: an :class:`~flowgym.lab.scenarios.AgentSpec` (built in the worker) or an agent
    agent: Any
    env_kwargs: dict[str, Any]
    seed: int
    #: the horizons bounded, ascending (``[None]``: run to the end of the workload)
    horizons: list[Any]
    iterations: int

    def describe(self) -> str:
        a = self.agent
        label = (a.label or a.name) if isinstance(a, AgentSpec) else a.label()
        return f"(lower bound on the requests of agent {label!r}, seed {self.seed}, horizon {self.horizons[-1]})"


def run_bound_cell(cell: BoundCell) -> list[dict[str, Any]]:
    """One seed's rows of :func:`lower_bounds`: one episode of the cell's agent, the bound at each horizon."""
    from flowgym.sim.theory import time_in_system_bound

    agent = build_agent(cell.agent) if isinstance(cell.agent, AgentSpec) else cell.agent
    ep = run_episode(agent, cell.env_kwargs, int(cell.seed), cell.horizons[-1])
    lg, M, span = ep.log, int(ep.config.M), int(ep.series["usage"].size)
    rows = []
    for h in cell.horizons:
        T = span if h is None else min(int(h), span)
        b = time_in_system_bound(lg["arrival"], lg["prompt_len"], lg["output_len"], M, T, iterations=cell.iterations)
        rows.append({"seed": int(cell.seed), "horizon": h, "T": T, "bound": b.bound, "service": b.service,
                     "memory": b.memory, "slotwise": b.slotwise, "lagrangian": b.lagrangian, "requests": b.requests})
    return rows


def lower_bounds(
    agent: Any, env_kwargs: dict[str, Any], seeds: Sequence[int], horizons: Sequence[int] | None,
    *, iterations: int = 300, backend: Any = "serial",
) -> list[dict[str, Any]]:
    """A lower bound on the mean time in system of *any* schedule of each seed's requests, at each horizon.

    :func:`flowgym.sim.theory.time_in_system_bound` on the requests of one episode of ``agent`` (an
    ``Agent`` or an :class:`~flowgym.lab.scenarios.AgentSpec`) per seed: the arrivals and lengths of a
    seed do not depend on the actions, so the bound holds for every agent run on that seed. One row per
    (seed, horizon): ``seed``, ``horizon``, ``T`` (the slots bounded), ``bound``, ``service``, ``memory``,
    ``slotwise``, ``lagrangian``, ``requests``. ``horizons=None`` runs a finite workload to its end and
    bounds the time in system over that run (every request to its finish); a horizon past the end of a
    finite workload bounds the run's slots (``T`` says how many). The seeds' episodes run on ``backend``
    (a name of :func:`~flowgym.lab.parallel.make_backend` or a backend, as :func:`evaluate`'s).

    Raises:
        ValueError: no horizon in a given list, or a configuration :func:`bound_unsupported` names
            (continuous time, the ``vllm-v1`` engine).
    """
    from flowgym.lab.parallel import using

    if horizons is not None and len(horizons) == 0:
        raise ValueError("give at least one horizon, or None to run a finite workload to its end")
    if horizons is not None:
        for h in horizons:
            if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
                raise ValueError(f"horizons must be positive integers (slots), got {h!r}")
    hs: list[int | None] = [None] if horizons is None else sorted({int(h) for h in horizons})
    spec_agent = build_agent(agent) if isinstance(agent, AgentSpec) else agent
    why = bound_unsupported(env_for(spec_agent, env_kwargs, hs[-1]).config)
    if why is not None:
        raise ValueError(why)
    cells = [BoundCell(agent, env_kwargs, int(seed), hs, iterations) for seed in seeds]
    with using(backend) as be:
        per_seed = be.map(run_bound_cell, cells)
    return [row for rows in per_seed for row in rows]


def format_lower_bounds(rows: list[dict[str, Any]], table: ResultTable) -> str:
    """Lines for :func:`lower_bounds`' rows beside a table of the same seeds: per horizon the bound's mean
    (with a 95% interval over seeds), its parts, and each agent's mean time in system over it, best first."""
    out = []
    for h in sorted({r["horizon"] for r in rows}, key=lambda x: -1 if x is None else x):
        # a seed whose bound is NaN (no request arrived before h) counts in neither the bound nor the ratios, as
        # ResultTable.summary leaves out a seed with no time in system
        here = [r for r in rows if r["horizon"] == h and math.isfinite(r["bound"])]
        v = np.asarray([r["bound"] for r in here], dtype=np.float64)
        if v.size == 0:
            out.append(f"lower bound on mean time in system ({'to the end' if h is None else f'T={h}'}): none (no "
                       "request arrived before this horizon on any seed)")
            continue
        ci = _ci95(v)
        parts = {k: float(np.nanmean([r[k] for r in here])) if any(math.isfinite(r[k]) for r in here)
                 else float("nan") for k in ("service", "memory", "slotwise", "lagrangian")}
        bound_of = {r["seed"]: r["bound"] for r in here}
        ratios = []
        for agent in table.agents:  # paired: the seeds with both a bound and a time in system
            pairs = [(r["mean_time_in_system"], bound_of[r["seed"]]) for r in table.rows
                     if r["agent"] == agent and r["horizon"] == h and r["seed"] in bound_of
                     and math.isfinite(r["mean_time_in_system"])]
            mean_bound = float(np.mean([b for _, b in pairs])) if pairs else 0.0
            if mean_bound > 0:
                ratios.append((float(np.mean([t for t, _ in pairs])) / mean_bound, agent))
        where = "to the end" if h is None else f"T={h}"
        agents = (", ".join(f"{r:.3f}x ({a})" for r, a in sorted(ratios)) if ratios
                  else "none at this horizon (the workload ended before it)")
        out.append(f"lower bound on mean time in system, any schedule of these requests ({where}): {v.mean():.2f}"
                   + (f" +- {ci:.2f}" if math.isfinite(ci) else "")
                   + f" (service floor {parts['service']:.2f}, memory floor {parts['memory']:.2f}, their slot-wise "
                   f"max {parts['slotwise']:.2f}, LP bound {parts['lagrangian']:.2f}); agents at " + agents)
    return "\n".join(out)


@dataclass
class TuneCell:
    """One (grid value, seed) run of :func:`tune`."""

    spec: AgentSpec
    param: str
    value: Any
    env_kwargs: dict[str, Any]
    seed: int
    horizon: int | None
    metric: str

    def describe(self) -> str:
        return f"(tuning {self.spec.name} {self.param}={self.value!r}, seed {self.seed})"


def run_tune_cell(cell: TuneCell) -> float:
    """The ``metric`` of one tuning run."""
    agent = build_agent(cell.spec, **{cell.param: cell.value})
    return run_episode(agent, cell.env_kwargs, int(cell.seed), cell.horizon).metrics()[cell.metric]


def tune(
    spec: AgentSpec,
    env_kwargs: dict[str, Any],
    seeds: Sequence[int],
    horizon: int | None,
    *,
    metric: str = "mean_time_in_system",
    progress: Callable[[str], None] | None = None,
    backend: Any = "serial",
) -> tuple[Any, list[dict[str, Any]]]:
    """Grid-search ``spec.tune`` on ``seeds``; the value with the best mean ``metric``: the lowest, or the highest
    for the metrics of :data:`HIGHER_IS_BETTER` (throughputs, completed requests, generated tokens). ``metric`` is
    one of :data:`~flowgym.sim.metrics.METRIC_NAMES` or, on engine ``vllm-v1``, of :data:`SERVING_METRICS`; those
    of :data:`NO_DIRECTION` are refused.

    Ties keep the first value of the grid. Returns ``(best, rows)`` with one row per grid value (its mean
    metric, ``inf`` when a run had no value: no request completed, or no first token). ``backend`` runs the
    (value, seed) cells, as in :func:`evaluate`.
    """
    if spec.tune is None:
        raise ValueError(f"agent {spec.name!r} has nothing to tune")
    if metric not in METRIC_NAMES and metric not in SERVING_METRICS:
        raise ValueError(f"metric must be one of {METRIC_NAMES + SERVING_METRICS}, got {metric!r}")
    if metric in NO_DIRECTION:
        why = ("does not depend on the agent" if metric in ("arrived", "rejected")  # the workload's, whatever the policy
               else "has no better direction (more is not by itself better or worse)")
        raise ValueError(f"metric {metric!r} {why}: tune by another")
    seeds = _check_seeds(seeds)
    sign = -1.0 if metric in HIGHER_IS_BETTER else 1.0
    param, grid = spec.tune
    for value in grid:  # every value must build and fit the scenario (a bad grid fails before any run)
        engine = env_for(build_agent(spec, **{param: value}), env_kwargs, horizon).config.engine
        if metric in SERVING_METRICS and engine != "vllm-v1":
            raise ValueError(f"metric {metric!r} is a serving metric of engine 'vllm-v1'; {spec.name} "
                             f"{param}={value!r} runs engine {engine!r}: tune by one of {METRIC_NAMES}")
    from flowgym.lab.parallel import using

    cells = [TuneCell(spec, param, value, env_kwargs, int(seed), horizon, metric) for value in grid for seed in seeds]
    with using(backend) as be:
        got = be.map(run_tune_cell, cells,
                     done=(lambda c: progress(f"tune {spec.name} {param}={c.value}")) if progress else None)
    rows = []
    best, best_v = None, math.inf
    for i, value in enumerate(grid):
        vals = got[i * len(seeds):(i + 1) * len(seeds)]
        finite = bool(np.all(np.isfinite(vals)))
        v = float(np.mean(vals)) if finite else math.inf
        rows.append({"param": param, "value": value, metric: v})
        if finite and sign * v < best_v:
            best, best_v = value, sign * v
    if best is None:
        done = "produced a first token" if metric.startswith("time_to_first_token") else "completed a request"
        raise ValueError(f"no value of {param} in {grid} {done} on the tuning seeds")
    return best, rows
