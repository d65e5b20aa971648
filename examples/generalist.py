"""The shipped generalist learned budget on a workload it never saw, against tuned references.

The generalist (``make_agent("learned")``, no path) was trained by ``flowgym train`` on random
request mixes; it reads only scale-free load features and chooses two multipliers, of the arrival
rate and of the online safe budget ``M / E_hat[w]``, the budget the larger product, so it runs on
any cache size and request mix in the slot model. A linear policy in numpy:
no extra is needed::

    python examples/generalist.py
"""

from __future__ import annotations

from flowgym.lab.evaluation import evaluate, tune
from flowgym.lab.scenarios import AgentSpec


def _stream(pairs, rate, t_on, t_off, period):
    times = sorted({0.0, float(t_on), float(t_off)} - {float(period)})
    return {"kind": "iid",
            "rate": {"kind": "steps", "times": times, "rates": [rate if t_on <= t < t_off else 0.0 for t in times],
                     "period": float(period)},
            "lengths": {"kind": "empirical", "pairs": pairs, "weights": [1.0] * len(pairs)}}


def main() -> None:
    # summarisation (long prompts, short answers) for 800 slots, then code generation (short prompts,
    # long answers) for 1200, repeating; a 24k-token cache; output lengths unknown to every agent
    env = {"M": 24000, "horizon": 4000, "output_length_known": False, "workload": {"kind": "mix", "streams": [
        _stream([[300, 20], [500, 30], [700, 40]], 0.9, 0, 800, 2000),
        _stream([[30, 150], [30, 250], [30, 350]], 0.5, 800, 2000, 2000)]}}
    fixed = AgentSpec("flow-control", {}, tune=("b", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]))
    b, _ = tune(fixed, env, seeds=[1000, 1001], horizon=4000)
    agents = [AgentSpec("learned", {}, label="learned (generalist, zero-shot)"),
              AgentSpec("flow-control", {"b": b}, label=f"best fixed b={b} (tuned)"),
              AgentSpec("safe-budget", {"k": 2.0}, label="safe-budget k=2 (untuned)"),
              AgentSpec("two-anchor", {}, label="two-anchor 1.4 x rate / 1 x safe (untuned)"),
              AgentSpec("greedy-lifo", {}, label="greedy-LIFO (vLLM-like)"),
              AgentSpec("sglang-reserve", {}, label="sglang-reserve (defaults)"),
              AgentSpec("trt-no-evict", {}, label="trt-no-evict (defaults)")]
    table = evaluate(agents, env, seeds=list(range(5)), horizons=[4000])
    print(table.format())


if __name__ == "__main__":
    main()
