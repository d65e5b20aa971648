"""The mean of an ARS run's iterates as a model (docs/training.md, "The mean of the iterates").

``flowgym train --algo ars`` keeps the update whose policy scored best on the 12 selection draws, one
iterate of a search that wanders on a plateau after about 30 of its 80 updates. The mean of the
iterates over a window of updates (Polyak-Ruppert averaging) averages that wandering out. This writes
it as a model directory beside the run's: the run's files, with ``policy.npz`` the weights averaged over
the updates ``first..last`` of its ``iterates.npy`` (row ``u`` is the weights after update ``u``) and the
window recorded in ``flowgym_agent.json`` (``"averaged_updates"``)::

    python benchmarks/learned_experiments/average_iterates.py runs/ars9r --updates 21-80 --out runs/ars9r-avg21

A run with a memory (``--memory``) averages its memory's weights too (its leak rates are fixed). With
``--with RUN2 [RUN3 ...]`` (memoryless linear policies only) it averages over searches as well: each run's mean
iterate over the same window, rewritten for the first run's normalisation (a linear map of
``(x - m2) / s2`` is the linear map of ``(x - m1) / s1`` with its columns scaled by ``s1 / s2`` and its bias
moved by ``W (m1 - m2) / s2``; exact but for the clip at 10 spreads, which the two normalisations place
differently), then averaged: one linear policy, the mean of the searches' logits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence

import numpy as np

from flowgym.agents.learned import ARRAYS_FILE, META_FILE, NORM_FILE, ArrayPolicy, MemoryArrayPolicy
from flowgym.lab.ars import ITERATES_FILE


def _mean_iterate(run: str, first: int, last: int) -> np.ndarray:
    its = np.load(os.path.join(run, ITERATES_FILE), allow_pickle=False)
    if not 0 <= first <= last < len(its):
        raise ValueError(f"--updates {first}-{last}: {run} has updates 0-{len(its) - 1}")
    return its[first:last + 1].mean(axis=0)


def _spread(run: str) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the divisor ``sqrt(var + eps)`` of a run's normalisation."""
    with np.load(os.path.join(run, NORM_FILE), allow_pickle=False) as z:
        return z["obs_mean"], np.sqrt(z["obs_var"] + float(z["epsilon"]))


def write_average(run: str, first: int, last: int, out: str, others: Sequence[str] = ()) -> np.ndarray:
    """Write the model of the mean iterate over updates ``first..last`` of ``run`` (and of ``others``, in
    ``run``'s normalisation) to ``out``; return its weights."""
    theta = _mean_iterate(run, first, last)
    with open(os.path.join(run, META_FILE)) as fh:
        meta = json.load(fh)
    sizes = meta["layer_sizes"]
    memory = int(meta.get("memory", 0))
    if others:
        if memory:
            raise ValueError(f"--with averages memoryless linear policies only; {run} has a memory of {memory} units")
        if len(sizes) != 2:
            raise ValueError(f"--with averages linear policies only; {run} has layer sizes {sizes}")
        n_in, n_out = sizes
        m1, s1 = _spread(run)
        thetas = [theta]
        for o in others:
            th = _mean_iterate(o, first, last)
            if th.size != theta.size:
                raise ValueError(f"--with {o}: {th.size} weights, {run} has {theta.size}")
            m2, s2 = _spread(o)
            w, b = th[:n_in * n_out].reshape(n_out, n_in), th[n_in * n_out:]
            thetas.append(np.concatenate([(w * (s1 / s2)).reshape(-1), b + w @ ((m1 - m2) / s2)]))
        theta = np.mean(thetas, axis=0)
        meta["averaged_with"] = list(others)
    with np.load(os.path.join(run, NORM_FILE), allow_pickle=False) as z:
        low, high = z["obs_low"], z["obs_high"]
    policy = (MemoryArrayPolicy.from_vector(theta, sizes, low, high, MemoryArrayPolicy.leaks(memory)) if memory
              else ArrayPolicy.from_vector(theta, sizes, low, high))
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(run, NORM_FILE), os.path.join(out, NORM_FILE))
    np.savez(os.path.join(out, ARRAYS_FILE), **policy.arrays())
    meta["averaged_updates"] = [first, last]
    meta["selected"] = f"mean of the iterates of updates {first}-{last} of {run}"
    with open(os.path.join(out, META_FILE), "w") as fh:
        json.dump(meta, fh, indent=1)
    return theta


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a flowgym train --algo ars output directory (with iterates.npy)")
    ap.add_argument("--updates", required=True, help="the window, FIRST-LAST (inclusive), e.g. 21-80")
    ap.add_argument("--out", required=True, help="the model directory to write")
    ap.add_argument("--with", dest="others", nargs="+", default=[], metavar="RUN",
                    help="other runs of the same recipe whose mean iterates (same window) join the average")
    args = ap.parse_args(argv)
    try:
        first, last = (int(x) for x in args.updates.split("-"))
    except ValueError:
        ap.error(f"--updates takes FIRST-LAST, e.g. 21-80 (got {args.updates!r})")
    try:
        write_average(args.run, first, last, args.out, args.others)
    except (OSError, ValueError, KeyError) as e:
        ap.error(str(e))
    print(f"wrote {args.out}: the mean of updates {first}-{last} of {args.run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
