"""Tuning the generalist at test time by replaying what it has seen (docs/training.md, "Tuning at test time").

The per-scenario tuned rate-switch is tuned on the scenario; the generalist is not. Can the generalist close
that gap by tuning itself on the load it is serving? Every ``period`` slots :class:`ReplayTuned` rebuilds the
requests that arrived in the last ``window`` slots from what a server knows at that point (arrival slots and
prompt lengths; output lengths of the completed ones; for the others a draw from the completed outputs longer
than what they have generated, or with ``km`` from the Kaplan-Meier estimate that counts the unfinished as
censored), replays them in the simulator from an empty system once per candidate, and plays the candidate
with the lowest replayed mean time in system of those requests until the next retune. The candidates are
either offsets ``(d_rate, d_safe)`` added to the shipped generalist's two log-multipliers (``grid`` x
``grid``) or other model directories (``models``, the first one the default). With ``margin`` the default
(offset 0, or the first model) is kept unless a candidate's replay is that much better. With ``repeat`` the
replay's tail (``tail`` x window slots, for the window's last requests to finish) repeats the window's first
arrivals, so the load goes on; without it the tail has no arrivals.

A probe, not an agent of the package: it tracks arrivals and completions from ``SystemView`` snapshots every
slot (a request admitted and finished within one slot, an output of one token, is never seen active and is
drawn like an unfinished one; no report scenario has such outputs), and slot-model scenarios only. The
unfinished requests' outputs are drawn from every output completed so far, earlier phases' included.
Every candidate acts every slot (each keeps its own held decision), and the picked one's action is played. Usage (screening seeds 7000-7003; ``--rate-switch`` is
``bench_learned.py --out``'s JSON, for the tuned rate-switch's parameters)::

    python benchmarks/learned_experiments/replay_tuning.py --rate-switch results/bench_learned.json \\
        --variant '{"window": 1200, "repeat": false}'

prints each scenario's mean time in system over the tuned rate-switch's for the shipped generalist and each
``--variant`` (a JSON of :class:`ReplayTuned`'s arguments; repeat the option for several).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchors import ADAPTIVE_SCENARIOS, held_out, scenario, seeds_of, tuned_rate_switch  # noqa: E402

from flowgym.agents import make_agent  # noqa: E402
from flowgym.agents.base import Agent  # noqa: E402
from flowgym.lab.evaluation import run_episode  # noqa: E402


def _learned(path: str) -> Any:
    return make_agent("learned", **({"path": path} if path else {}))


class Offset(Agent):
    """The agent ``base`` with ``delta`` added to its log-multiplier action (clipped to ``[-1, 1]``)."""

    name = "offset"

    def __init__(self, base: Any, delta: np.ndarray) -> None:
        self.base, self.delta = base, np.asarray(delta, np.float32)
        self.requires = base.requires

    def reset(self, config: Any, seed: int | None = None) -> None:
        super().reset(config, seed)
        self.base.reset(config, seed)

    def act(self, obs: Any, view: Any) -> Any:
        return np.clip(self.base.act(obs, view) + self.delta, -1, 1).astype(np.float32)

    def label(self) -> str:
        return f"offset {self.delta.tolist()}"


def km_support(done: np.ndarray, cens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier distribution of the output length from completed outputs ``done`` and lower bounds ``cens``
    (``o >= c``) of the unfinished: support and probabilities (the mass left after the last completion at 1.5x
    the largest value seen)."""
    done, cens = np.sort(np.asarray(done, np.int64)), np.sort(np.asarray(cens, np.int64))
    x, d = np.unique(done, return_counts=True)
    at_risk = (done.size - np.searchsorted(done, x)) + (cens.size - np.searchsorted(cens, x))
    surv = np.cumprod(1.0 - d / np.maximum(at_risk, 1))
    p = -np.diff(np.concatenate([[1.0], surv]))
    top = max(int(done[-1]) if done.size else 1, int(cens[-1]) if cens.size else 1)
    return np.append(x, int(1.5 * top) + 1), np.append(p, surv[-1] if surv.size else 1.0)


def sample_above(x: np.ndarray, p: np.ndarray, lower: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per entry of ``lower`` from ``(x, p)`` conditioned on ``o >= lower``."""
    cdf = np.cumsum(p)
    out = np.empty(lower.size, np.int64)
    for k, c in enumerate(lower):
        i = int(np.searchsorted(x, c))
        if i >= x.size:
            out[k] = c
            continue
        lo = cdf[i - 1] if i else 0.0
        j = int(np.searchsorted(cdf, lo + rng.random() * (cdf[-1] - lo)))
        out[k] = max(int(x[min(j, x.size - 1)]), int(c))
    return out


class ReplayTuned(Agent):
    """The shipped generalist (or one of ``models``) retuned every ``period`` slots on a replay of the last
    ``window`` slots (module docstring)."""

    name = "replay-tuned"

    def __init__(self, env_kwargs: dict[str, Any], period: int = 400, window: int = 1200, warm: int = 400,
                 grid: tuple[float, ...] = (-0.4, 0.0, 0.4), tail: float = 0.5, margin: float = 0.0,
                 km: bool = False, repeat: bool = True, models: list[str] | None = None) -> None:
        self.kw = {k: v for k, v in env_kwargs.items() if k not in ("workload", "horizon")}
        self.period, self.window, self.warm, self.tail = period, window, warm, tail
        self.margin, self.km, self.repeat, self.models = margin, km, repeat, models
        if 0.0 not in grid:
            raise ValueError(f"grid must hold 0 (the shipped generalist itself), got {grid!r}")
        self.cands = [np.array(d, np.float32) for d in itertools.product(grid, grid)]
        #: the candidate that is kept unless another replays ``margin`` better: the first model, or offset 0
        self.default = 0 if models else next(i for i, d in enumerate(self.cands) if not d.any())
        self.requires = _learned("").requires

    def _candidates(self) -> list[Any]:
        """Fresh agents, one per candidate: the models, or the shipped generalist with each offset."""
        return [_learned(m) for m in self.models] if self.models else [Offset(_learned(""), d) for d in self.cands]

    def reset(self, config: Any, seed: int | None = None) -> None:
        super().reset(config, seed)
        self.players = self._candidates()
        for pl in self.players:
            pl.reset(config, seed)
        n = 1 << 14
        self.arr, self.pl, self.out = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.max_id = -1
        self.prev_ids = self.prev_gen = np.zeros(0, np.int64)
        self.pick = self.default
        self.next_tune = self.warm
        self.log: list[tuple[int, Any]] = []

    def act(self, obs: Any, view: Any) -> Any:
        q, a = view.queue(), view.active()
        new = q.ids > self.max_id  # arrivals since the last slot (ids grow with arrival)
        if new.any():
            ids = q.ids[new]
            while ids.max() >= self.arr.size:
                self.arr = np.concatenate([self.arr, np.full(self.arr.size, -1, np.int64)])
                self.pl, self.out = (np.concatenate([v, np.zeros(v.size, np.int64)]) for v in (self.pl, self.out))
            self.arr[ids], self.pl[ids] = q.arrival[new], q.prompt_len[new]
            self.max_id = int(ids.max())
        gone = ~np.isin(self.prev_ids, a.ids) & ~np.isin(self.prev_ids, q.ids)  # completed in the last slot
        self.out[self.prev_ids[gone]] = self.prev_gen[gone] + 1
        self.prev_ids, self.prev_gen = np.array(a.ids), np.array(a.generated)
        if view.t >= self.next_tune:
            self._tune(int(view.t), a)
            self.next_tune = int(view.t) + self.period
        # every candidate acts, so a newly picked one plays its own current decision
        return [pl.act(obs, view) for pl in self.players][self.pick]

    def _tune(self, t: int, a: Any) -> None:
        lo = max(0, t - self.window)
        ids = np.flatnonzero((self.arr >= lo) & (self.arr < t))
        seen = np.arange(self.max_id + 1)
        fin = self.out[seen] > 0
        if ids.size < 20 or fin.sum() < 10:
            return
        gen = np.zeros(self.arr.size, np.int64)
        gen[a.ids] = a.generated
        out = self.out[ids].copy()
        todo = np.flatnonzero(out == 0)
        lower = gen[ids[todo]] + 1
        rng = np.random.default_rng(t)
        if self.km:
            x, p = km_support(self.out[seen[fin]], np.maximum(gen[seen[~fin]] + 1, 1))
            out[todo] = sample_above(x, p, lower, rng)
        else:
            srt = np.sort(self.out[seen[fin]])
            for k, c in zip(todo, lower):
                pool = srt[np.searchsorted(srt, c - 1, side="right"):]
                out[k] = int(rng.choice(pool)) if pool.size else c + c // 2
        W = t - lo
        arr0, pl = self.arr[ids] - lo, self.pl[ids]
        ext = arr0 < self.tail * W if self.repeat else np.zeros(ids.size, bool)
        wl = {"kind": "trace", "arrival": np.concatenate([arr0, arr0[ext] + W]).tolist(),
              "prompt_len": np.concatenate([pl, pl[ext]]).tolist(), "output_len": np.concatenate([out, out[ext]]).tolist()}
        kw, H = {**self.kw, "workload": wl}, int(W * (1 + self.tail))
        scores = []
        for cand in self._candidates():
            ep = run_episode(cand, kw, 0, H)
            lg, T = ep.log, ep.series["usage"].size
            mine = lg["arrival"] < W  # the window's own requests, charged up to the replay's end
            end = np.where((lg["finish"] >= 0) & (lg["finish"] <= T), lg["finish"], T)
            scores.append(float((end[mine] - lg["arrival"][mine]).mean()))
        best = int(np.argmin(scores))
        self.pick = best if scores[best] < (1 - self.margin) * scores[self.default] else self.default
        self.log.append((t, self.pick))

    def label(self) -> str:
        return "replay-tuned"


def replay_episode(kw: dict[str, Any], seed: int, horizon: int | None, **options: Any) -> float:
    """The mean time in system of one episode of :class:`ReplayTuned` with ``options``."""
    return run_episode(ReplayTuned(kw, **options), kw, seed, horizon).metrics(horizon)["mean_time_in_system"]


def _job(task: tuple[Any, str, int, str, dict[str, Any]]) -> tuple[str, str, float, float]:
    play, name, seed, who, rs = task
    kw, H = scenario(name)
    t0 = time.perf_counter()
    if who in ("shipped", "rate-switch"):
        agent = _learned("") if who == "shipped" else make_agent("rate-switch", **rs)
        v = run_episode(agent, kw, seed, H).metrics(H)["mean_time_in_system"]
    else:
        v = play(kw, seed, H, **json.loads(who))
    return name, who, float(v), time.perf_counter() - t0


def screen_variants(play: Any, description: str, argv: list[str] | None = None) -> int:
    """The command line of a probe whose variants are ``play(kw, seed, horizon, **json) -> mean time in
    system`` (a module-level function): each variant, the shipped generalist and the tuned rate-switch on
    the screening seeds of every slot-model report scenario, printed / the tuned rate-switch."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rate-switch", required=True, help="bench_learned.py's JSON (the tuned rate-switch parameters)")
    ap.add_argument("--variant", action="append", default=[], help="the probe's arguments as JSON (repeatable)")
    ap.add_argument("--scenarios", default=None, help="comma-separated (default: the slot-model report scenarios)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    rs = tuned_rate_switch(args.rate_switch)
    names = (args.scenarios.split(",") if args.scenarios else
             [n for n in [*ADAPTIVE_SCENARIOS, *held_out()] if scenario(n)[0].get("time_model") is None])
    for n in names:
        if n not in rs:
            raise SystemExit(f"{n!r} has no tuned rate-switch in {args.rate_switch}")
    whos = ["shipped", "rate-switch", *(args.variant or ["{}"])]
    tasks = [(play, n, s, w, rs[n]) for n in names for s in seeds_of(n) for w in whos]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        res = pool.map(_job, tasks, chunksize=1)
    acc: dict[str, dict[str, list[float]]] = {}
    wall: dict[str, list[float]] = {}
    for n, w, v, dt in res:
        acc.setdefault(n, {}).setdefault(w, []).append(v)
        wall.setdefault(w, []).append(dt)
    shown = [w for w in whos if w != "rate-switch"]
    print("scenario | " + " | ".join(shown) + "   (mean time in system / tuned rate-switch)")
    logs: dict[str, list[float]] = {w: [] for w in shown}
    for n, d in acc.items():
        ref = float(np.mean(d["rate-switch"]))
        for w in shown:
            logs[w].append(np.log(float(np.mean(d[w])) / ref))
        print(f"{n} | " + " | ".join(f"{np.exp(logs[w][-1]):.3f}" for w in shown))
    print("geometric mean | " + " | ".join(f"{np.exp(np.mean(v)):.3f}" for v in logs.values()))
    print("seconds per episode | " + " | ".join(f"{np.mean(wall[w]):.1f}" for w in shown))
    return 0


def main(argv: list[str] | None = None) -> int:
    return screen_variants(replay_episode, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
