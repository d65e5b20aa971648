"""The generalist searched further on one of the sweep's scenarios: can its action reach the best fixed budget
there? (docs/training.md, "Training on the sweep's kind of load").

On some of ``nonstationary_sweep.py``'s scenarios the generalist is 3-6% behind the best fixed budget, and a
model trained on the sweep's own generator (``family_mix.py``) is too. This asks whether a policy of the same
observation and action *can* play what the fixed budget plays there: a random search from the shipped
generalist on that scenario alone (``per_scenario.py``'s code path: ``train_ars`` with the scenario's arguments
as the distribution, training seeds 40000.., selection seeds 20000..), then the searched model, the generalist
and the sweep's tuned references on the sweep's report seeds 8000..::

    python benchmarks/learned_experiments/tune_sweep.py --refs refs.json --out runs/tune-sweep \\
        --scenarios 9014,9016 [--iterations 12] [--draws 1] [--seeds 10]

``--refs`` is the sweep's reference file (``nonstationary_sweep.py --refs``), which must hold the scenarios,
tuned for them as they are now (its key is checked, as the sweep checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_learned import _fmt, ratio_ci  # noqa: E402
from nonstationary_sweep import HORIZON, draw, reference_key  # noqa: E402
from per_scenario import _Fixed  # noqa: E402

from flowgym.lab.ars import ARSConfig, train_ars  # noqa: E402
from flowgym.lab.evaluation import evaluate  # noqa: E402
from flowgym.lab.scenarios import AgentSpec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refs", required=True, help="the sweep's reference JSON")
    ap.add_argument("--out", required=True, help="directory of the searched models")
    ap.add_argument("--scenarios", required=True, help="comma-separated sweep seeds")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--directions", type=int, default=8)
    ap.add_argument("--draws", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=10, help="report seeds 8000.. (the sweep's)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    with open(args.refs) as fh:
        refs = json.load(fh)
    seeds = list(range(8000, 8000 + args.seeds))
    for s in (int(x) for x in args.scenarios.split(",")):
        label, kw = draw(s)
        hit = refs.get(str(s))
        if hit is None or hit["seeds"][:args.seeds] != seeds:
            raise SystemExit(f"--refs has no references of scenario {s} on seeds {seeds[0]}-{seeds[-1]}")
        if hit.get("key") != reference_key(kw):  # tuned for another scenario, grid or version: stale
            raise SystemExit(f"--refs holds stale references of scenario {s} (their key is not this scenario's); "
                             "rerun nonstationary_sweep.py --refs FILE to tune them again")
        out = os.path.join(args.out, str(s))
        t0 = time.perf_counter()
        train_ars(ARSConfig(distribution=_Fixed(label, kw), init="shipped", workers=args.workers, final_eval_seeds=0,
                            out=out, progress=False, iterations=args.iterations, directions=args.directions,
                            draws=args.draws, eval_every=args.eval_every, eval_episodes=args.eval_episodes))
        wall = time.perf_counter() - t0
        specs = [AgentSpec("learned", {"path": out}, label="tuned here"), AgentSpec("learned", {}, label="generalist")]
        table = evaluate(specs, kw, seeds, [HORIZON], backend="serial")
        per = {lab: np.array([r["mean_time_in_system"] for r in table.rows if r["agent"] == lab]) for lab in table.agents}
        fixed = np.asarray(hit["tis"]["best fixed"][:args.seeds])
        rs = np.asarray(hit["tis"]["rate-switch (tuned)"][:args.seeds])
        print(f"{s} {label} (b={hit['b']}; search {wall:.0f} s): tuned / best fixed "
              f"{_fmt(ratio_ci(per['tuned here'], fixed))}, / rate-switch {_fmt(ratio_ci(per['tuned here'], rs))}; "
              f"generalist / best fixed {_fmt(ratio_ci(per['generalist'], fixed))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
