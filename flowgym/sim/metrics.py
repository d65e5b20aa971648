"""The metrics of the contract (``shared/spec/model.md``; ``docs/model.md``) over a horizon of ``T`` slots."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["METRIC_NAMES", "compute_metrics", "metrics_at"]

#: Scalar metrics, in the order tables print them.
METRIC_NAMES = (
    "avg_latency",
    "p95_latency",
    "mean_time_in_system",
    "request_throughput",
    "token_throughput",
    "generated_token_throughput",
    "completed",
    "arrived",
    "rejected",
    "unfinished",
    "evictions",
    "overflow_events",
    "wasted_tokens",
    "mean_kv_usage",
    "std_kv_usage",
    "max_kv_usage",
)


def compute_metrics(log: dict[str, np.ndarray], series: dict[str, np.ndarray], M: int) -> dict[str, Any]:
    """Metrics over the slots recorded in ``series`` (``T = len(series["usage"])``).

    Args:
        log: per-request arrays (``arrival``, ``output_len``, ``finish``,
            ``evictions``, ``rejected``) of every request that arrived.
        series: per-slot arrays (``usage``, ``evicted``, ``wasted_tokens``, ...).
        M: the KV budget.

    Returns:
        a dict with the :data:`METRIC_NAMES` (latencies are ``nan`` when no
        request completed; latencies in slots and throughputs per slot, or in
        continuous time, when ``series`` has ``time``, in seconds and per
        second), ``T`` (slots or iterations), ``elapsed`` (slots or seconds), and the series
        ``kv_usage`` (``U_t / M``) for plots. The throughputs divide by ``elapsed``: ``T`` slots, or
        in continuous time the seconds from the run's start to the end of its last iteration,
        ``series["elapsed"][-1]`` (the engine's :meth:`~flowgym.sim.engine.Engine.series` measures
        them from :attr:`~flowgym.sim.engine.Engine.time_origin`: 0 for a generated workload, a
        timed trace's first arrival, so a trace shifted by a constant, e.g. Unix timestamps, has
        the same throughputs); a series without ``elapsed`` counts from time 0 of ``time``. Latencies
        and time in system are differences of the log's times and ``time``, in any one time base.
        ``mean_time_in_system`` averages
        ``min(f_i, T) - a_i`` over every request that arrived and was not
        rejected: unlike ``avg_latency`` it charges unfinished requests, so a
        policy cannot look fast by leaving long requests waiting. Its sum over
        requests is the sum of the default reward's ``N_t`` (Little's law).
    """
    if isinstance(M, (bool, np.bool_)) or not isinstance(M, (int, np.integer)) or M < 1:
        raise ValueError(f"M (the KV budget, tokens) must be a positive integer, got {M!r}")
    T = int(series["usage"].size)
    finish = log["finish"]
    done = (finish >= 0) & (finish <= T)
    timed = "time" in series  # continuous time: latencies and throughputs in seconds
    if timed:
        span = float(series["time"][-1]) if T else 0.0  # the run's end, in the log's time base
        elapsed = float(series["elapsed"][-1]) if T and "elapsed" in series else span  # from the run's start
        arr_t, fin_t = log["arrival_time"], log["finish_time"]
    else:
        span = elapsed = float(T)
        arr_t, fin_t = log["arrival"], finish
    lat = (fin_t[done] - arr_t[done]).astype(np.float64)
    n_done = int(done.sum())
    rejected = int(log["rejected"].sum())
    usage = series["usage"].astype(np.float64) / M
    # time in system up to the end of the run of every request that was not rejected
    ok = ~log["rejected"]
    end = np.where(done, fin_t, span)[ok]
    in_sys = float((end - arr_t[ok]).sum())
    # tokens decoded, wasted ones included: one per running request a slot (the paper's model), or as the
    # engine counted them (vllm-v1 records ``generated``: a step of prefill only samples none)
    gen = float(series["generated"].sum() if "generated" in series else (series["active"] + series["completed"]).sum())
    out: dict[str, Any] = {
        "T": T,
        "elapsed": elapsed,
        "avg_latency": float(lat.mean()) if n_done else float("nan"),
        "p95_latency": float(np.percentile(lat, 95)) if n_done else float("nan"),
        "mean_time_in_system": in_sys / int(ok.sum()) if ok.any() else float("nan"),
        "request_throughput": n_done / elapsed if elapsed else float("nan"),
        "token_throughput": float(log["output_len"][done].sum()) / elapsed if elapsed else float("nan"),
        "generated_token_throughput": gen / elapsed if elapsed else float("nan"),
        "completed": n_done,
        "arrived": int(finish.size),
        "rejected": rejected,
        "unfinished": int(finish.size) - rejected - n_done,
        "evictions": int(series["evicted"].sum()),
        "overflow_events": int((series["evicted"] > 0).sum()),
        "wasted_tokens": int(series["wasted_tokens"].sum()),
        "mean_kv_usage": float(usage.mean()) if T else float("nan"),
        "std_kv_usage": float(usage.std()) if T else float("nan"),
        "max_kv_usage": float(usage.max()) if T else float("nan"),
        "kv_usage": usage,
    }
    return out


def metrics_at(log: dict[str, np.ndarray], series: dict[str, np.ndarray], M: int, T: int) -> dict[str, Any]:
    """Metrics of the first ``T`` slots of a longer run.

    The first ``T`` slots of a run do not depend on what comes after them (no
    policy here sees the horizon), so this equals the metrics of a ``T``-slot
    run on the same seed: requests arriving at or after ``T`` are left out and
    requests finishing after ``T`` count as unfinished.
    """
    if isinstance(T, (bool, np.bool_)) or not isinstance(T, (int, np.integer)) or T < 0:
        raise ValueError(f"T must be a whole number of slots >= 0, got {T!r}")
    if T > series["usage"].size:
        raise ValueError(f"T={T} is longer than the run ({series['usage'].size} slots)")
    arrived = log["arrival"] < T
    cut = {k: v[arrived] for k, v in log.items()}
    late = cut["finish"] > T
    cut["finish"] = np.where(late, -1, cut["finish"])
    if "finish_time" in cut:
        cut["finish_time"] = np.where(late, np.nan, cut["finish_time"])
    return compute_metrics(cut, {k: v[:T] for k, v in series.items()}, M)
