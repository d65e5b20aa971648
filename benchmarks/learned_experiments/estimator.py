"""Would an unbiased estimate of ``E[w]`` make a better anchor? (2026-11-29, a probe)

The online estimate of the KV token-slots a request holds, ``E_hat[w]`` of
:class:`flowgym.sim.estimators.LoadTracker`, is biased low (its module docstring): it leaves out the ``o / 2``
of ``w = l o + o (o + 1) / 2`` and takes the spread of ``l + o`` between slots' means only, so the safe budget
``M / E_hat[w]`` reads 5-20% high, more so under load. A constant bias is a multiplier's, which a search
absorbs; a load-dependent one is not. Before building a new observation version and a new search on a
corrected estimate, this probe asks whether the *anchor* gets better: it plays fixed rules on the safe budget
under three estimates, each with a grid of multipliers (a bias that moves the best multiplier is not a loss),
on the report scenarios' screening seeds 7000-7003 (the Azure replay: one episode), as ratios to the tuned
rate-switch:

* ``moments``: the package's estimate, unchanged;
* ``corrected``: the same structure (``l`` from the arrivals, ``o = s - l`` with ``s`` the completions' mean
  ``l + o``) with the ``o / 2`` term and the spread of ``l + o`` over every completion, not between slots';
* ``direct``: the moving mean of each completed request's own ``w`` (its ``l`` and ``o`` are known once it
  finishes): unbiased over completions, but it follows a change of prompt lengths only as requests complete.

Both new estimates keep the package's time constant (64 decision points) and its floor from the active
requests. The rules: ``safe-budget`` (``B_t = k x M / E_hat[w]``) and ``two-anchor:head=true``
(``max(1.4 x head-era rate, k x M / E_hat[w])``), each at several ``k``, and the shipped generalist (ars9),
whose multipliers were searched on ``moments``.

The estimate is replaced by patching :class:`~flowgym.sim.estimators.LoadTracker` in this process only (the
completed requests are read from the engine's public ``finish``, ``prompt`` and ``output`` arrays): an
experiment, not an option of the package. ``--models DIR`` plays model directories too (e.g. one searched on an
estimate: ``estimator_patch/sitecustomize.py`` makes ``flowgym train`` do that), and ``--draws N`` compares them
with the shipped model on new draws of the training distribution (``select_generalist.py``'s seeds and
statistics) instead of the screen. Results: ``docs/training.md``, "An unbiased E[w]".

    python benchmarks/learned_experiments/estimator.py --rate-switch runs/bench_rs.json   # about 4 min on 2 cores
    python benchmarks/learned_experiments/estimator.py --draws 192 --models runs/arsEW --estimates direct  # 40 s
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchors import scenario, seeds_of, tuned_rate_switch  # noqa: E402
from bench_learned import held_out  # noqa: E402
from fractional import print_ratio_table  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _args import at_least, model_dir  # noqa: E402
from select_generalist import FIRST_SEED, LIGHT, geometric_ratio_ci, time_in_system  # noqa: E402

from flowgym.agents import make_agent  # noqa: E402
from flowgym.lab.evaluation import run_episode  # noqa: E402
from flowgym.lab.scenarios import ADAPTIVE_SCENARIOS  # noqa: E402
from flowgym.sim.estimators import LoadTracker  # noqa: E402

ESTIMATES = ("moments", "corrected", "direct")
_OBSERVE = LoadTracker._observe
_WORK_NOW = LoadTracker._work_now


def _observe(self: LoadTracker, eng: Any, completed: int, completed_tokens: int) -> None:
    """The package's ``_observe``, after adding this slot's completions to three more moving sums: ``(l + o)^2``
    and ``o`` and ``w`` of each completed request (the same decay as the package's sums)."""
    if not self._started:
        self._X2 = self._O = self._W = 0.0
    d = self._d
    x2 = o_sum = w_sum = 0.0
    if completed:
        ids = np.flatnonzero(eng.finish[: eng.n_arrived] == eng.t)
        if ids.size != completed:
            raise RuntimeError(f"slot {eng.t}: {ids.size} requests finish now, the engine says {completed}")
        lo = eng.prompt[ids].astype(np.float64)
        o = eng.output[ids].astype(np.float64)
        x2 = float(((lo + o) ** 2).sum())
        o_sum = float(o.sum())
        w_sum = float((lo * o + o * (o + 1) / 2).sum())
    self._X2 = (1 - d) * self._X2 + x2
    self._O = (1 - d) * self._O + o_sum
    self._W = (1 - d) * self._W + w_sum
    _OBSERVE(self, eng, completed, completed_tokens)


def _work(kind: str) -> Any:
    """``_work_now`` for the estimate ``kind``."""

    def work_now(self: LoadTracker) -> float | None:
        if kind == "moments" or self._N <= 1e-6:
            return _WORK_NOW(self)
        l = self._lA / self._lN if self._lN > 1e-6 else 0.0
        if kind == "corrected":
            s = self._A / self._N
            var = max(self._X2 / self._N - s * s, 0.0)
            o = max(s - l, 1.0)
            w = l * o + 0.5 * (o * o + var + o)
        else:
            w = self._W / self._N
        if self._nact:
            o_lb = max(self._held / self._nact - l, 1.0)
            w = max(w, l * o_lb + 0.5 * o_lb * o_lb)
        return w

    return work_now


#: The rules, by label: a factory of the agent.
RULES: dict[str, Any] = {
    **{f"safe k={k:g}": (lambda k=k: make_agent("safe-budget", k=k)) for k in (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)},
    **{f"head-2a k={k:g}": (lambda k=k: make_agent("two-anchor", k_rate=1.4, k_safe=k, head=True))
       for k in (0.8, 1.0, 1.25)},
    "ars9": lambda: make_agent("learned"),
}


def _agent(rule: str, rs: dict[str, Any]) -> Any:
    """The agent of ``rule``: the tuned rate-switch, a rule of :data:`RULES`, or ``model DIR`` (a learned model)."""
    if rule == "rate-switch (tuned)":
        return make_agent("rate-switch", **rs)
    if rule.startswith("model "):
        return make_agent("learned", path=rule[len("model "):])
    return RULES[rule]()


def patch(kind: str) -> None:
    """Make every :class:`LoadTracker` of this process use the estimate ``kind`` (``moments``: the package's, undone)."""
    if kind not in ESTIMATES:
        raise ValueError(f"estimate must be one of {ESTIMATES}, got {kind!r}")
    LoadTracker._observe = _OBSERVE if kind == "moments" else _observe
    LoadTracker._work_now = _WORK_NOW if kind == "moments" else _work(kind)


@contextlib.contextmanager
def patched(kind: str) -> Iterator[None]:
    """:func:`patch` for the block, then the package's estimate again."""
    patch(kind)
    try:
        yield
    finally:
        patch("moments")


def _job(task: tuple[str, str, str, int, dict[str, Any]]) -> tuple[str, str, float]:
    name, kind, rule, seed, rs = task
    kw, H = scenario(name)
    with patched(kind):
        agent = _agent(rule, rs)
        return name, rule if rule == "rate-switch (tuned)" else f"{rule} [{kind}]", \
            run_episode(agent, kw, seed, H).metrics(H)["mean_time_in_system"]


def _draw_job(task: tuple[str, str, int]) -> tuple[str, str, int, float]:
    """``(model, estimate, seed, time in system)`` on the training distribution's draw of ``seed``
    (``select_generalist.py``'s protocol)."""
    model, kind, seed = task
    with patched(kind):
        return model, kind, seed, float(time_in_system(model, [seed])[0])


def draws(models: Sequence[str], estimates: Sequence[str], n: int, workers: int) -> list[str]:
    """The shipped model (on ``moments``) and each of ``models`` under each of ``estimates`` on ``n`` new draws of the
    training distribution (seeds 30000..), as paired ratios of geometric means to the shipped model, with 95%
    bootstrap intervals, also over the light draws (the shipped model's time in system below 50) and the heavy
    ones."""
    seeds = list(range(FIRST_SEED, FIRST_SEED + n))
    tasks = [("shipped", "moments", s) for s in seeds] + [(m, k, s) for m in models for k in estimates for s in seeds]
    with mp.get_context("spawn").Pool(workers) as pool:
        out = pool.map(_draw_job, tasks, chunksize=1)
    v = {(m, k, s): t for m, k, s, t in out}
    ref = np.array([v["shipped", "moments", s] for s in seeds])
    light = ref < LIGHT
    lines = [f"{n} draws (seeds {seeds[0]}-{seeds[-1]}); / the shipped model on moments, 95% paired bootstrap"]
    for m in models:
        for k in estimates:
            d = np.log([v[m, k, s] for s in seeds]) - np.log(ref)
            parts = [("all", d), (f"light {int(light.sum())}", d[light]), (f"heavy {int((~light).sum())}", d[~light])]
            lines.append(f"{m} [{k}]: " + "; ".join("{} {:.4f} [{:.4f}, {:.4f}]".format(lab, *geometric_ratio_ci(x))
                                                       for lab, x in parts if len(x)))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-switch", help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ap.add_argument("--estimates", nargs="+", choices=ESTIMATES, default=list(ESTIMATES))
    ap.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    ap.add_argument("--models", nargs="+", default=[], metavar="DIR",
                    help="model directories to play too, under each estimate (e.g. one searched on an estimate)")
    ap.add_argument("--scenarios", nargs="+", default=None, help="default: every report scenario")
    ap.add_argument("--workers", type=at_least(1), default=2)
    ap.add_argument("--draws", type=at_least(2), default=None,
                    help="instead of the screen: the shipped model and each of --models under each of --estimates on "
                    "this many new draws of the training distribution (select_generalist.py's seeds and statistics)")
    args = ap.parse_args(argv)
    for d in args.models:  # checked before the grid runs, not after it
        model_dir(ap, "--models", d, shipped=False)
    if args.draws is not None:
        if not args.models:
            ap.error("--draws compares --models with the shipped model: give at least one")
        print("\n".join(draws(args.models, args.estimates, args.draws, args.workers)))
        return 0
    if args.rate_switch is None:
        ap.error("the screen needs --rate-switch (bench_learned.py's JSON)")
    rs = tuned_rate_switch(args.rate_switch)
    names = args.scenarios or [*ADAPTIVE_SCENARIOS, *held_out()]
    unknown = sorted(set(names) - set(rs))
    if unknown:
        ap.error(f"no tuned rate-switch for {unknown} in {args.rate_switch}")
    tasks = [(n, "moments", "rate-switch (tuned)", s, rs[n]) for n in names for s in seeds_of(n)]
    rules = [*args.rules, *(f"model {d}" for d in args.models)]
    tasks += [(n, kind, r, s, rs[n]) for kind in args.estimates for r in rules for n in names for s in seeds_of(n)]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        out = pool.map(_job, tasks, chunksize=1)
    labels = [f"{r} [{kind}]" for r in rules for kind in args.estimates]
    print_ratio_table(out, names, ["rate-switch (tuned)", *labels], geo=labels)
    best = {}
    for kind in args.estimates:
        for family in ("safe", "head-2a"):
            fam = [lab for lab in labels if lab.startswith(family + " ") and lab.endswith(f"[{kind}]")]
            if fam:
                best[(family, kind)] = _per_scenario_best(out, names, fam)
    for (family, kind), v in best.items():
        print(f"{family} [{kind}]: per-scenario best k, geometric mean over the scenarios {v:.3f}")
    return 0


def _per_scenario_best(out: Sequence[tuple[str, str, float]], names: Sequence[str], labels: Sequence[str]) -> float:
    """Geometric mean over the scenarios of the best of ``labels`` on each (its k chosen with hindsight), as a ratio
    to the tuned rate-switch."""
    acc: dict[tuple[str, str], list[float]] = {}
    for n, r, v in out:
        acc.setdefault((n, r), []).append(v)
    logs = [math.log(min(np.mean(acc[(n, lab)]) for lab in labels) / np.mean(acc[(n, "rate-switch (tuned)")]))
            for n in names]
    return math.exp(float(np.mean(logs)))


if __name__ == "__main__":
    raise SystemExit(main())
