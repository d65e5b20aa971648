#!/usr/bin/env python
"""Differential check of mutants of ``flowgym/sim/vllm.py`` claimed equivalent (docs/testing.md).

The mutant module (built by ``tools/mutate.py``'s own mutation, by its ``#k`` number) and the
original run the same random scenarios (every ``vllm-v1`` option combined at random, slots and
continuous time, per-class budgets); any difference in the per-step stats, the engine's counters,
the request log, the series or the serving metrics is counted::

    python tools/mutant_diff_vllm.py 19,171 400     # mutants #19 and #171 on 400 scenarios
"""
import ast
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutate  # noqa: E402
import flowgym.sim.vllm as orig  # noqa: E402
from flowgym.sim.workloads import Trace  # noqa: E402

SRC = open(orig.__file__).read()
TREE = ast.parse(SRC)

def load(k):
    src, mut, *_ = mutate._mutate(TREE, k)
    mod = types.ModuleType(f"vllm_mut{k}")
    mod.__dict__["__name__"] = f"vllm_mut{k}"
    sys.modules[f"vllm_mut{k}"] = mod
    exec(compile(src, f"mut{k}", "exec"), mod.__dict__)
    return mod, mut

def scenario(seed):
    r = np.random.default_rng(seed)
    n, T = int(r.integers(3, 40)), int(r.integers(10, 120))
    timed = r.random() < 0.25
    M = int(r.integers(20, 600))
    bs = int(r.choice([1, 2, 4, 16]))
    count = r.random() < 0.2
    opts = dict(block_size=bs, lookahead_tokens=int(r.integers(0, 3)),
                max_num_seqs=None if r.random() < 0.5 else int(r.integers(1, 8)),
                max_num_batched_tokens=None if (count or r.random() < 0.3) else int(r.integers(1, 80)),
                long_prefill_token_threshold=0 if r.random() < 0.6 else int(r.integers(1, 20)),
                chunked_prefill=bool(r.random() < 0.7), admission="count" if count else "blocks",
                reserve_full_prompt=bool(r.random() < 0.3), watermark=float(r.choice([0.0, 0.0, 0.1, 0.3])),
                preemption=str(r.choice(["recompute", "discard"])),
                preempt_order=str(r.choice(["lifo", "least-progress", "least-computed", "random"])),
                requeue=str(r.choice(["front", "back"])))
    if not opts["chunked_prefill"] and opts["max_num_batched_tokens"] is not None:  # unchunked needs a cap >= M
        opts["max_num_batched_tokens"] = max(opts["max_num_batched_tokens"], M)
    lp, op = r.integers(1, 40, n), r.integers(1, 40, n)
    per_class = r.random() < 0.25
    track = r.random() < 0.2
    kw = {}
    cls = r.integers(0, 3, n)
    if timed and not per_class:
        tr = Trace(np.sort(r.uniform(0, 3.0, n)), lp, op, cls=cls, num_classes=3, timed=True)
        kw["time_model"] = {"kind": "jaillet"} if r.random() < 0.5 else {"kind": "linear", "c0": 0.01,
                                                                         "c_prefill": 1e-4, "c_decode": 1e-3, "c_kv": 1e-5}
        b = r.integers(0, 8, T)
    else:
        tr = Trace(np.sort(r.integers(0, T // 2 + 1, n)), lp, op, cls=cls, num_classes=3)
        b = r.integers(0, 4, (T, 3)) if per_class else r.integers(0, 8, T)
    if per_class:
        kw["per_class"] = True
    if track:
        kw["track_class_queue"] = True
    return M, tr, opts, kw, b, T

def run(mod, seed):
    M, tr, opts, kw, b, T = scenario(seed)
    try:
        eng = mod.VllmEngine(M, tr, options=opts, **kw)
    except ValueError as e:
        return ("ctor", str(e))
    eng.reset(np.random.default_rng(seed))
    out = []
    for t in range(T):
        eng.arrive()
        st = eng.serve(b[t])
        out.append(tuple(st) + (eng.held, eng.n_queued, eng.queued_prompt_tokens, eng.last_completed_tokens,
                                eng.used_blocks, eng.recomputed_tokens, eng.overflow_events, eng.last_evicted,
                                float(eng.now) if eng.timed else 0.0) + tuple(eng.class_queue.tolist()) + tuple(eng.queue_ids().tolist())
                   + tuple(eng.active_ids().tolist()) + tuple(eng.active_computed().tolist())
                   + tuple(eng.active_blocks().tolist()))
    log = {k: v.tolist() for k, v in eng.request_log().items()}
    ser = {k: v.tolist() for k, v in eng.series().items()}
    m = {k: (None if isinstance(v, float) and v != v else v) for k, v in eng.serving_metrics().items()}
    return out, log, ser, m

if __name__ == "__main__":
    ks = [int(x) for x in sys.argv[1].split(",")]
    N = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    base = [run(orig, s) for s in range(N)]
    for k in ks:
        mod, mut = load(k)
        diffs = []
        for s in range(N):
            try:
                got = run(mod, s)
            except Exception as e:
                got = ("error", repr(e))
            if repr(got) != repr(base[s]):
                diffs.append(s)
        print(f"#{k} line {mut.line} {mut.what}: {len(diffs)} of {N} scenarios differ {diffs[:10]}", flush=True)
