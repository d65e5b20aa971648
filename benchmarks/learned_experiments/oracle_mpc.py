"""An upper bound for retuning the generalist from the system's current state (docs/training.md, "What
retuning from the current state could gain at best").

The replay probe (``replay_tuning.py``) replays the past from an empty system and loses the backlog the
window started with. A retune from the *current* state would clone the engine and redraw what a server does
not know (the output lengths of the requests in the system, the arrivals to come). Before building that,
this measures what it could gain at best: every ``period`` slots the environment is deep-copied *with* its
future (the same random stream, so the clone sees the real arrivals and output lengths), each candidate (the
shipped generalist with an offset on its two log-multipliers, a ``grid`` x ``grid``) is played on its own
copy for ``lookahead`` slots, and the candidate with the least time in system accrued over them (the sum of
the requests in the system, slot by slot) is played until the next retune. With ``margin`` offset 0 is kept
unless a candidate is that much better. Perfect foresight over the lookahead: no server has it, so this is
a ceiling, not an agent (it holds the environment itself). With ``"future": "law"`` the copies draw the
arrivals to come afresh from the scenario's workload instead (its law known, its realisation not); with
``"future": "window"`` they see the last ``window`` slots' arrivals again (the law estimated from the past).
The docs' finding: the gain is the law's (a phased scenario's law holds its phase schedule); with the past
as the forecast the retune loses to the generalist. Usage (screening seeds 7000-7003)::

    python benchmarks/learned_experiments/oracle_mpc.py --rate-switch results/bench_learned.json \\
        --variant '{"lookahead": 800}' --variant '{"future": "law"}'
"""

from __future__ import annotations

import copy
import itertools
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay_tuning import Offset, _learned, screen_variants  # noqa: E402

from flowgym.lab.evaluation import Episode, env_for  # noqa: E402
from flowgym.sim.workloads import Trace  # noqa: E402


def _window_trace(eng: Any, window: int) -> Trace:
    """The requests that arrived in the last ``window`` slots, ``window`` slots later (real output lengths)."""
    t = int(eng.t)
    ids = np.arange(eng.n_arrived)
    ids = ids[eng.arrival[ids] > t - window]
    cls = (eng.cls[ids],) if eng.m > 0 else ()
    return Trace(eng.arrival[ids] + window, eng.prompt[ids], eng.output[ids], *cls,
                 **({"num_classes": eng.m} if eng.m > 0 else {}))


def oracle_episode(kw: dict[str, Any], seed: int, horizon: int | None, period: int = 400, lookahead: int = 800,
                   grid: tuple[float, ...] = (-0.4, 0.0, 0.4), margin: float = 0.0,
                   future: str = "real", window: int = 1200) -> tuple[float, list[int]]:
    """The mean time in system of one episode played by the oracle retune, and the offset picked at each retune.

    ``future``: what the copies see after the current slot. ``"real"``: the real arrivals (perfect
    foresight). ``"law"``: arrivals drawn afresh from the workload (a new random stream, the same for every
    candidate of a retune): the workload's law without its realisation. ``"window"``: the arrivals of the
    last ``window`` slots again, shifted by ``window`` (their arrival slots, prompts and real output
    lengths): the law estimated from the recent past. In every case the requests already in the system keep
    their real output lengths (reads the engine's private fields: a diagnostic, not an agent)."""
    if future not in ("real", "law", "window"):
        raise ValueError(f"future must be 'real', 'law' or 'window', got {future!r}")
    cands = [np.array(d, np.float32) for d in itertools.product(grid, grid)]
    default = next(i for i, d in enumerate(cands) if not d.any())
    players = [Offset(_learned(""), d) for d in cands]
    env = env_for(players[0], kw, horizon)
    obs, _ = env.reset(seed=seed)
    for p in players:
        p.reset(env.config, seed=seed)
    pick, picks, done, t = default, [], False, 0
    while not done:
        if t > 0 and t % period == 0:
            scores = []
            past = _window_trace(env.engine, window) if future == "window" else None
            for i in range(len(cands)):
                e2, p2, o2 = copy.deepcopy(env), copy.deepcopy(players[i]), obs
                if future != "real":  # forget the requests generated beyond this slot; draw the rest anew
                    eng = e2.engine
                    eng.n_req, eng._gen_t = eng.n_arrived, eng.t + 1
                    if past is None:
                        eng._rng = np.random.default_rng((seed, t))
                    else:
                        eng.workload = past
                acc = 0.0
                for _ in range(lookahead):
                    v = e2.view()
                    acc += v.n_queued + v.n_active
                    o2, _, term, trunc, _ = e2.step(p2.act(o2, v))
                    if term or trunc:
                        break
                scores.append(acc)
            best = int(np.argmin(scores))
            pick = best if scores[best] < (1 - margin) * scores[default] else default
            picks.append(pick)
        view = env.view()
        acts = [p.act(obs, view) for p in players]  # every candidate acts: a new pick plays its own held decision
        obs, _, term, trunc, _ = env.step(acts[pick])
        done, t = term or trunc, t + 1
    ep_log, series = env.request_log(), env.series()
    ep = Episode("oracle", seed, env.config, ep_log, series, 0.0)
    return float(ep.metrics(horizon)["mean_time_in_system"]), picks


def main(argv: list[str] | None = None) -> int:
    return screen_variants(oracle_value, __doc__.split("\n\n")[0], argv)


def oracle_value(kw: dict[str, Any], seed: int, horizon: int | None, **options: Any) -> float:
    """:func:`oracle_episode`'s mean time in system (the function :func:`screen_variants` plays)."""
    return oracle_episode(kw, seed, horizon, **options)[0]


if __name__ == "__main__":
    raise SystemExit(main())
