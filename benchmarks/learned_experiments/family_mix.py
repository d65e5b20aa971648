"""Train the generalist's recipe on ``RandomMix`` mixed with the sweep's scenario generator.

A test of one explanation of where the generalist loses: that the loads it loses on (the blind H6-H8,
the sweep's ``overload`` and ``burst`` scenarios) are unlike its training draws. ``RandomMix`` draws
three length pairs around one drawn prompt and output length, streams that take turns, and overload
only in stationary draws; :func:`nonstationary_sweep.draw_from` draws fixed request families (chat,
code, mid, long generations, long prompts, reasoning) in three shapes: streams taking turns, a burst
on a base stream, an overload phase then a light one. Here each training draw is one of the sweep's
with probability ``--p`` (default 0.5) and a ``RandomMix()`` draw otherwise; everything else is the
shipped recipe (``ARSConfig()``: 80 updates of 8 directions on 8 draws, seed 40000).

The sweep's seeds 9000-9031 and 9100-9115 and the report scenarios are not training draws (those are
drawn from the training seeds 40000.., the selection draws from 20000..), but with ``--p > 0`` the
sweep's scenarios are of the training distribution's kind, so the sweep no longer measures loads the
model never saw: only the report scenarios the generator did not imitate (the ``adaptive-*`` ones and
the Azure replay) stay out of its kind::

    python benchmarks/learned_experiments/family_mix.py --out runs/fam1 [--p 0.5] [--seed 40000] [--workers 2]
        [--iterations 80] [--hidden 8]

Results: docs/training.md, "Training on the sweep's kind of load".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nonstationary_sweep import draw_from  # noqa: E402

from flowgym.lab.ars import ARSConfig, train_ars  # noqa: E402
from flowgym.lab.distributions import RandomMix  # noqa: E402


class FamilyMix:
    """A training distribution: the sweep's generator with probability ``p``, else ``RandomMix()``.

    Deterministic in the stream it is given (the first number drawn picks the kind of draw)."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)
        self.mix = RandomMix()

    def __call__(self, rng: np.random.Generator) -> dict[str, Any]:
        if rng.random() < self.p:
            return draw_from(rng)[1]
        return self.mix(rng)

    def to_spec(self) -> dict[str, Any]:
        """What a model's ``flowgym_agent.json`` records under ``trained_on``: both parts and the share."""
        return {"kind": "family-mix", "p": self.p, "sweep": "nonstationary_sweep.draw_from",
                "random_mix": self.mix.to_spec()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the model directory to write")
    ap.add_argument("--p", type=float, default=0.5, help="share of the sweep's draws (default 0.5)")
    ap.add_argument("--seed", type=int, default=40_000, help="the search's seed (default 40000, the shipped one)")
    ap.add_argument("--iterations", type=int, default=80, help="updates (default 80)")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--hidden", type=int, nargs="*", default=[],
                    help="widths of the policy's tanh hidden layers (default none: the linear policy)")
    args = ap.parse_args(argv)
    if any(h < 1 for h in args.hidden):
        ap.error(f"--hidden: every width must be a positive integer, got {args.hidden}")
    cfg = ARSConfig(distribution=FamilyMix(args.p), seed=args.seed, iterations=args.iterations,
                    workers=args.workers, final_eval_seeds=0, out=args.out, hidden=tuple(args.hidden))
    res = train_ars(cfg)
    print(f"wrote {args.out}: {res}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
