"""Real and published-figure workloads for continuous time.

* :func:`azure_trace` - the Azure LLM inference traces 2023 (``"conv"``,
  ``"code"``; Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0, see
  ``flowgym/data/NOTICE``), replayed with their real timestamps (seconds
  from the first request), optionally sped up by ``rate_multiplier`` and cut
  to a ``window``.
* :func:`azure_lengths` - their ``(prompt, output)`` pairs as an empirical
  distribution, for i.i.d. sampling with Poisson arrivals at a chosen rate.
* :func:`lmsys_like_lengths` - a clearly labelled **synthetic** stand-in for
  the LMSYS-Chat-1M lengths the paper used (the dataset itself may not be
  passed on): independent log-normals matching the published median and mean
  of a 10,000-conversation sample (Jaillet et al. 2025; words as tokens).
  Users who hold the dataset load their own lengths with :func:`lengths_from_csv`.

The package data are compact ``.npz`` files built from the original CSVs by
:func:`build_azure_npz` (the original files are in the project's shared data).
"""

from __future__ import annotations

import csv
import os
from importlib import resources
from typing import Any

import numpy as np

from flowgym.workloads import EmpiricalLengths, LogNormalLengths, Trace, TraceError

__all__ = [
    "AZURE_KINDS",
    "azure_trace",
    "azure_lengths",
    "lmsys_like_lengths",
    "lengths_from_csv",
    "build_azure_npz",
    "LMSYS_SAMPLE",
]

AZURE_KINDS = ("conv", "code")

#: Published figures of a 10,000-conversation LMSYS-Chat-1M sample (Jaillet et al. 2025), in words.
LMSYS_SAMPLE = {"prompt_median": 11.0, "prompt_mean": 40.62, "output_median": 45.0, "output_mean": 85.32}


def build_azure_npz(csv_path: str, npz_path: str) -> int:
    """Convert an Azure trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens) to the package's npz form.

    Timestamps become float64 seconds since the first request; lengths int32.
    Returns the row count.
    """
    ts, ctx, gen = [], [], []
    with open(csv_path, newline="") as fh:
        rd = csv.reader(fh)
        header = next(rd)
        if [h.strip() for h in header[:3]] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise TraceError(f"{csv_path}: unexpected header {header}")
        for row in rd:
            ts.append(row[0].strip().replace(" ", "T"))
            ctx.append(int(row[1]))
            gen.append(int(row[2]))
    t = np.array(ts, dtype="datetime64[ns]")
    sec = (t - t.min()).astype(np.int64) / 1e9
    order = np.argsort(sec, kind="stable")
    np.savez_compressed(
        npz_path,
        time=sec[order],
        prompt_len=np.asarray(ctx, dtype=np.int32)[order],
        output_len=np.asarray(gen, dtype=np.int32)[order],
    )
    return len(ts)


def _load(kind: str) -> dict[str, np.ndarray]:
    if kind not in AZURE_KINDS:
        raise ValueError(f"Azure trace kind must be one of {AZURE_KINDS}, got {kind!r}")
    with resources.files("flowgym.data").joinpath(f"azure_{kind}_2023.npz").open("rb") as fh:
        with np.load(fh) as z:
            return {k: z[k] for k in z.files}


def azure_trace(trace: str = "conv", *, rate_multiplier: float = 1.0,
                window: tuple[float, float] | None = None) -> Trace:
    """The Azure 2023 trace as a timed :class:`~flowgym.workloads.Trace`.

    Args:
        trace: ``"conv"`` (19,366 requests) or ``"code"`` (8,819).
        rate_multiplier: divide all inter-arrival times by this (2.0 = twice the load).
        window: keep requests whose original time (seconds from the first) is in
            ``[start, end)``; times are then shifted to start at 0.
    """
    d = _load(trace)
    t = d["time"]
    keep = np.ones(t.size, bool)
    if window is not None:
        lo, hi = float(window[0]), float(window[1])
        if not 0 <= lo < hi:
            raise ValueError(f"window must satisfy 0 <= start < end, got {window!r}")
        keep = (t >= lo) & (t < hi)
        if not keep.any():
            raise ValueError(f"window {window!r} holds no request (trace spans 0..{t[-1]:.0f} s)")
    if not (rate_multiplier > 0 and np.isfinite(rate_multiplier)):
        raise ValueError(f"rate_multiplier must be positive, got {rate_multiplier!r}")
    tt = t[keep]
    tt = (tt - tt[0]) / float(rate_multiplier)
    tr = Trace(tt, d["prompt_len"][keep].astype(np.int64), d["output_len"][keep].astype(np.int64), timed=True)
    spec: dict[str, Any] = {"kind": "azure", "trace": trace, "rate_multiplier": float(rate_multiplier)}
    if window is not None:
        spec["window"] = [float(window[0]), float(window[1])]
    tr._source = spec
    return tr


def azure_lengths(trace: str = "conv") -> EmpiricalLengths:
    """The trace's (``"conv"`` or ``"code"``) ``(prompt, output)`` pairs, each weighted by how often it occurs."""
    d = _load(trace)
    pairs, counts = np.unique(np.stack([d["prompt_len"], d["output_len"]], axis=1), axis=0, return_counts=True)
    return EmpiricalLengths(pairs.tolist(), counts.tolist())


def lmsys_like_lengths(max_prompt: int = 4096, max_output: int = 4096) -> LogNormalLengths:
    """SYNTHETIC LMSYS-like lengths: log-normals with the published sample's median and mean.

    Prompt median 11 / mean 40.62, output median 45 / mean 85.32 (words used as
    tokens, as the paper did), clipped to ``[1, max]``. Not the dataset: a
    stand-in from its published summary figures.
    """
    return LogNormalLengths(max_prompt=max_prompt, max_output=max_output, **LMSYS_SAMPLE)


def lengths_from_csv(path: str | os.PathLike[str], *, prompt_len: str = "prompt_len",
                     output_len: str = "output_len") -> EmpiricalLengths:
    """An empirical length distribution from your own CSV (e.g. LMSYS-Chat-1M word counts).

    Errors name the column and the row (the header is row 1).
    """
    tr = Trace.from_csv(path, arrival=prompt_len, prompt_len=prompt_len, output_len=output_len)
    pairs, counts = np.unique(np.stack([tr.prompt_len, tr.output_len], axis=1), axis=0, return_counts=True)
    return EmpiricalLengths(pairs.tolist(), counts.tolist())
