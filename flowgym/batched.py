"""A batched engine: ``N`` independent copies of :class:`~flowgym.engine.Engine` in one set of arrays.

:class:`BatchedEngine` runs the slot semantics of ``docs/model.md`` for ``N``
environments at once, with a fixed number of numpy operations per slot
whatever ``N`` (no Python loop over environments in the slot; workload chunks
are still drawn environment by environment, every 256 slots, from each
environment's own generator, so the requests are exactly those the single
engine draws from the same generator).

Supported: the discrete-time model (unit slots) with

* a :class:`~flowgym.workloads.MultiClassPoisson` or an endless
  :class:`~flowgym.workloads.IIDPoisson` workload whose requests always fit
  (``l + o <= M`` for every possible request, so nothing is ever rejected),
* the ``fifo`` queue order and a global budget ``B_t``,
* ``lifo`` or ``all`` eviction.

:func:`unsupported` names the first argument outside this set; the vector
environment (:mod:`flowgym.vector`) then falls back to single engines.

Why these rules batch well. With FIFO admission and ``lifo``/``all`` eviction
every active request has a smaller id than every queued one (admission takes
the smallest queued ids; eviction removes the newest actives, which go back to
the queue head). So the queue of an environment is a *stack* of evicted
requests (smallest id on top) followed by the untouched range of fresh
arrivals ``[p, n_arrived)``, and an eviction is a suffix of the active set in
activation order. Everything else is kept as running per-environment counts and
ring calendars indexed by a global clock ``G`` (all environments advance one
slot per call): completions (count and ``l + o`` tokens per finish slot), the
net change of the generated-tokens histogram per slot (a request moves to bin
``k`` at ``start + e_k`` and leaves at ``start + o``), so observations never
scan the active set.

Memory: per environment, the request table of the current episode (4 int32 per
request), the active set (4 int64 per entry, compacted when full) and two rings
of ``R`` slots (``R`` the smallest power of two above the longest output):
``R * (2 + K)`` numbers for ``K`` histogram bins.

This module does not import Gymnasium.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgym.workloads import CHUNK_SLOTS, IIDPoisson, MultiClassPoisson, Workload, make_workload

__all__ = ["BatchedEngine", "unsupported", "SUPPORTED_EVICTIONS"]

_I64 = np.int64
_I32 = np.int32

#: Eviction rules the batched engine implements.
SUPPORTED_EVICTIONS = ("lifo", "all")


def unsupported(
    M: int,
    workload: Workload,
    *,
    eviction: Any = "lifo",
    queue_order: Any = "fifo",
    per_class: bool = False,
    timed: bool = False,
) -> str | None:
    """Why :class:`BatchedEngine` cannot run this configuration (naming the argument), or ``None``."""
    if timed or workload.timed:
        return "time_model: the batched engine runs unit slots only (time_model='slot')"
    if per_class:
        return "per_class_budget=True: the batched engine takes one global budget per environment"
    if queue_order != "fifo":
        return f"queue_order={queue_order!r}: the batched engine implements 'fifo' only"
    if eviction not in SUPPORTED_EVICTIONS:
        return f"eviction={eviction!r}: the batched engine implements {list(SUPPORTED_EVICTIONS)}"
    if not isinstance(workload, (MultiClassPoisson, IIDPoisson)):
        return f"workload: {type(workload).__name__} (the batched engine takes 'poisson' or endless 'iid' workloads)"
    if workload.finite:
        return "workload: n_requests (finite workloads end episodes by termination; use the single env)"
    mt, mo = workload.max_request_tokens(), workload.max_output_tokens()
    if mt is None or mo is None:
        return "workload: lengths without a known bound"
    if mt > M:
        return f"M={M}: the workload can draw requests with l + o = {mt} > M (rejections are not batched)"
    return None


def _excl_cumsum(k: np.ndarray) -> tuple[np.ndarray, int]:
    cs = np.cumsum(k)
    total = int(cs[-1]) if cs.size else 0
    return cs - k, total


class BatchedEngine:
    """``N`` engines of the supported kind (see the module docstring), stepped together.

    Args:
        num_envs: ``N``.
        M: KV-cache budget in tokens (the same for every environment).
        workload: a workload or its mapping form (shared; each environment draws
            from its own generator).
        eviction: ``"lifo"`` or ``"all"``.
        hist_edges: left edges of the generated-tokens histogram bins (from 0).
        projection_offsets: offsets of the projected usage (``None``: not computed).
        track_class_queue: keep per-class queue counts.

    Call :meth:`reset` with the environments to reset and one numpy
    ``Generator`` each, then alternate :meth:`serve` and :meth:`arrive`
    (a reset includes slot 0's arrivals). Per-environment state is exposed
    as arrays of length ``N`` (``t``, ``held``, ``n_active``, :attr:`n_queued`, ...).
    """

    def __init__(
        self,
        num_envs: int,
        M: int,
        workload: Workload | dict[str, Any],
        *,
        eviction: str = "lifo",
        hist_edges: Sequence[int] = (0, 8, 16, 32, 64, 128, 256, 512),
        projection_offsets: Sequence[int] | None = None,
        track_class_queue: bool = False,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
            raise ValueError(f"M (the KV-cache budget in tokens) must be a positive integer, got {M!r}")
        self.N = N = int(num_envs)
        self.M = int(M)
        self.workload = make_workload(workload)
        why = unsupported(self.M, self.workload, eviction=eviction)
        if why is not None:
            raise ValueError(f"BatchedEngine does not support {why}")
        self.evict_all = eviction == "all"
        self.m = self.workload.num_classes
        self.track_class_queue = bool(track_class_queue) and self.m > 0
        max_o = int(self.workload.max_output_tokens())  # type: ignore[arg-type]
        self.max_o = max_o
        edges = np.asarray(hist_edges, dtype=_I64)
        if edges.ndim != 1 or edges.size == 0 or edges[0] != 0 or np.any(np.diff(edges) <= 0):
            raise ValueError(f"hist_edges must start at 0 and increase strictly, got {hist_edges!r}")
        self.edges = edges
        self.K = K = int(edges.size)
        # bin of j generated tokens (j = 0..max_o), and of a request's last j = o - 1
        self._bin_j = (np.searchsorted(edges, np.arange(max_o + 1), side="right") - 1).astype(_I64)
        self._bin_last = np.zeros(max_o + 1, _I64)
        self._bin_last[1:] = self._bin_j[: max_o]
        # crossings into bins 1..Kx happen (e_k < max_o); ring of R > max_o slots
        self.Kx = int(self._bin_j[max_o - 1]) if max_o >= 1 else 0
        self.offsets = None if projection_offsets is None else np.asarray(projection_offsets, dtype=_I64)
        self.R = R = 1 << max(4, int(max_o).bit_length())
        self._mask = R - 1
        self._ar = np.arange(N, dtype=_I64)
        self._arK = self._ar * K
        self.G = 0  # global clock (ring index), +1 per serve()

        # per environment
        z = lambda: np.zeros(N, _I64)  # noqa: E731
        self.t = z()
        self.n_req = z()
        self.gen_t = z()
        self.chunk_t0 = z()
        self.n_arrived = z()
        self.p = z()  # next fresh (never admitted) id
        self.rs_n = z()  # evicted requests waiting (stack)
        self.n_active = z()
        self.held = z()
        self.queued_prompt_tokens = z()
        self.tail = z()
        self.last_arrivals = z()
        self.H = np.zeros((N, K), _I64)  # generated-tokens histogram at the decision point
        self.class_queue = np.zeros((N, max(self.m, 1)), _I64)

        # request table (current episode), ids are per environment
        self.C = 4096
        self._alloc_table(self.C)
        CH = CHUNK_SLOTS
        self._bnd = np.zeros((N, CH + 1), _I64)  # first id arriving at each slot of the chunk
        self._tokc = np.zeros((N, CH + 1), _I64)  # prompt tokens arrived before each slot of the chunk
        self._clsc = np.zeros((N, CH + 1, max(self.m, 1)), _I64) if self.track_class_queue else None
        self._chunks: list[list[Any]] = [[] for _ in range(N)]
        self._rngs: list[np.random.Generator | None] = [None] * N

        # active set: per env, entries [0, tail) in activation order; alive iff fin > t
        self.A = 512
        self._a_id = np.zeros((N, self.A), _I64)
        self._a_start = np.zeros((N, self.A), _I64)
        self._a_fin = np.full((N, self.A), -1, _I64)
        self._a_l = np.zeros((N, self.A), _I64)
        # evicted requests waiting: ids, top of stack (smallest id) at rs_n - 1
        self.S = 64
        self._rs = np.zeros((N, self.S), _I64)

        # rings over the global clock: completions and histogram changes
        self._cal_n = np.zeros(R * N, _I64)
        self._cal_tok = np.zeros(R * N, _I64)
        self._dH = np.zeros(R * N * K, _I64)  # net change of H at each slot

    # ------------------------------------------------------------------ storage

    def _alloc_table(self, C: int) -> None:
        N = self.N
        old = getattr(self, "_prompt", None)
        new = {
            "_prompt": np.zeros((N, C), _I32),
            "_output": np.zeros((N, C), _I32),
            "_finish": np.full((N, C), -1, _I32),
            "_evictions": np.zeros((N, C), _I32),
        }
        if self.track_class_queue:
            new["_cls"] = np.zeros((N, C), _I32)
        if old is not None:
            c0 = old.shape[1]
            for name, arr in new.items():
                arr[:, :c0] = getattr(self, name)
        for name, arr in new.items():
            setattr(self, name, arr)
        self.C = C

    def _grow_active(self, need: int) -> None:
        A = max(2 * self.A, need)
        for name in ("_a_id", "_a_start", "_a_fin", "_a_l"):
            old = getattr(self, name)
            new = np.full((self.N, A), -1, _I64)
            new[:, : self.A] = old
            setattr(self, name, new)
        self.A = A

    def _compact(self, rows: np.ndarray) -> None:
        """Drop dead entries of the active set of ``rows`` (keeping activation order)."""
        tail = self.tail[rows]
        w = int(tail.max())
        alive = (self._a_fin[rows, :w] > self.t[rows, None]) & (np.arange(w) < tail[:, None])
        r, c = np.nonzero(alive)  # row-major: activation order within each row
        cnt = alive.sum(axis=1)
        first, _ = _excl_cumsum(cnt)
        base = rows[r] * self.A
        src = base + c
        dst = base + (np.arange(r.size) - first[r])
        for name in ("_a_id", "_a_start", "_a_fin", "_a_l"):
            flat = getattr(self, name).reshape(-1)  # a view: the arrays are contiguous
            flat[dst] = flat[src]  # the right side is gathered first, so overlap is safe
        self.tail[rows] = cnt

    # ------------------------------------------------------------------ reset and workload

    def reset(self, envs: np.ndarray | Sequence[int], rngs: Sequence[np.random.Generator]) -> None:
        """Empty environments ``envs`` and start them at slot 0 with slot 0's arrivals queued.

        ``rngs[i]`` draws the workload of ``envs[i]`` (as :meth:`Engine.reset`'s generator).
        """
        idx = np.asarray(envs, dtype=_I64).ravel()
        if len(rngs) != idx.size:
            raise ValueError(f"rngs must hold one generator per environment reset ({idx.size}), got {len(rngs)}")
        if idx.size == 0:
            return
        for name in ("t", "n_req", "gen_t", "chunk_t0", "n_arrived", "p", "rs_n", "n_active", "held",
                     "queued_prompt_tokens", "tail", "last_arrivals"):
            getattr(self, name)[idx] = 0
        self.H[idx] = 0
        self.class_queue[idx] = 0
        NK = self.N * self.K
        dH = self._dH.reshape(self.R, self.N, self.K)
        dH[:, idx, :] = 0
        self._cal_n.reshape(self.R, self.N)[:, idx] = 0
        self._cal_tok.reshape(self.R, self.N)[:, idx] = 0
        del NK
        for i, rng in zip(idx.tolist(), rngs):
            self._rngs[i] = rng
            self._chunks[i] = []
        self.arrive(idx)

    def _generate(self, i: int) -> None:
        """Draw env ``i``'s next chunk of requests (exactly as :meth:`Engine._generate`)."""
        rng = self._rngs[i]
        assert rng is not None, "call reset() first"
        t0 = int(self.gen_t[i])
        t1 = t0 + CHUNK_SLOTS
        req = self.workload.sample(rng, t0, t1)
        k = req.arrival.size
        base = int(self.n_req[i])
        if base + k > self.C:
            self._alloc_table(max(2 * self.C, base + k))
        s = slice(base, base + k)
        self._prompt[i, s] = req.prompt_len
        self._output[i, s] = req.output_len
        self._finish[i, s] = -1
        self._evictions[i, s] = 0
        pos = np.searchsorted(req.arrival, np.arange(t0, t1 + 1), side="left")
        self._bnd[i] = base + pos
        tok = np.zeros(k + 1, _I64)
        np.cumsum(req.prompt_len, out=tok[1:])
        self._tokc[i] = tok[pos]
        if self.track_class_queue:
            self._cls[i, s] = req.cls
            onehot = np.zeros((k + 1, self.m), _I64)
            onehot[np.arange(1, k + 1), req.cls] = 1
            self._clsc[i] = np.cumsum(onehot, axis=0)[pos]  # type: ignore[index]
        self._chunks[i].append(req)
        self.n_req[i] = base + k
        self.chunk_t0[i] = t0
        self.gen_t[i] = t1

    # ------------------------------------------------------------------ phases

    def arrive(self, envs: np.ndarray | None = None) -> np.ndarray:
        """Phase 1 of slot ``t`` for ``envs`` (default: all): queue the arrivals. Returns the counts (all envs)."""
        t = self.t if envs is None else self.t[envs]
        gen_t = self.gen_t if envs is None else self.gen_t[envs]
        need = t >= gen_t
        if need.any():
            which = np.flatnonzero(need) if envs is None else envs[need]
            for i in which.tolist():
                self._generate(i)
        if envs is None:
            rows = self._ar
            col = t - self.chunk_t0
        else:
            rows = envs
            col = t - self.chunk_t0[envs]
        lo = self._bnd[rows, col]
        hi = self._bnd[rows, col + 1]
        tok = self._tokc[rows, col + 1] - self._tokc[rows, col]
        if envs is None:
            self.n_arrived = hi
            self.queued_prompt_tokens += tok
            self.last_arrivals = hi - lo
        else:
            self.n_arrived[envs] = hi
            self.queued_prompt_tokens[envs] += tok
            self.last_arrivals[envs] = hi - lo
        if self.track_class_queue:
            clsc = self._clsc
            assert clsc is not None
            self.class_queue[rows] += clsc[rows, col + 1] - clsc[rows, col]
        return self.last_arrivals

    @property
    def n_queued(self) -> np.ndarray:
        """Waiting requests of each environment."""
        return self.rs_n + (self.n_arrived - self.p)

    def serve(self, budget: np.ndarray) -> dict[str, np.ndarray]:
        """Phases 2-5 of slot ``t`` of every environment with budgets ``budget`` (int64, shape ``(N,)``).

        Returns per-environment arrays ``t`` (the slot served), ``usage``,
        ``admitted``, ``evicted``, ``wasted_tokens``, ``completed``, ``queue_len``
        and ``active`` (the fields of :class:`~flowgym.engine.SlotStats`).
        """
        N, K, G, mask = self.N, self.K, self.G, self._mask
        t = self.t
        nq = self.n_queued
        k = np.minimum(budget, nq)
        need = self.tail + k
        if int(need.max()) > self.A:
            # compact every environment at once and keep at least half the width free,
            # so compactions are rare (amortised O(1) per admission)
            self._compact(self._ar)
            top = int((self.tail + k).max())
            if 2 * top > self.A:
                self._grow_active(2 * top)
        if self.rs_n.any():
            kr = np.minimum(k, self.rs_n)
            kf = k - kr
        else:
            kr = None
            kf = k
        # ---- admit: evicted first (top of the stack, ascending ids), then fresh ids p, p+1, ...
        start, n_f = _excl_cumsum(kf)
        parts_env, parts_id, parts_pos = [], [], []
        if kr is not None:
            start_r, n_r = _excl_cumsum(kr)
            if n_r:
                env_r = np.repeat(self._ar, kr)
                r = np.arange(n_r) - start_r[env_r]
                parts_env.append(env_r)
                parts_id.append(self._rs[env_r, self.rs_n[env_r] - 1 - r])
                parts_pos.append(self.tail[env_r] + r)
                self.rs_n -= kr
        if n_f:
            env_f = np.repeat(self._ar, kf)
            r = np.arange(n_f) - start[env_f]
            parts_env.append(env_f)
            parts_id.append(self.p[env_f] + r)
            off = self.tail if kr is None else self.tail + kr
            parts_pos.append(off[env_f] + r)
            self.p += kf
        n_adm = len(parts_env)
        if n_adm:
            if n_adm == 1:
                env, ids, pos = parts_env[0], parts_id[0], parts_pos[0]
            else:
                env, ids, pos = (np.concatenate(x) for x in (parts_env, parts_id, parts_pos))
            flat = env * self.C + ids
            l = self._prompt.ravel()[flat].astype(_I64)
            o = self._output.ravel()[flat].astype(_I64)
            ts = t[env]
            fin = ts + o
            self._finish.ravel()[flat] = fin
            apos = env * self.A + pos
            self._a_id.ravel()[apos] = ids
            self._a_start.ravel()[apos] = ts
            self._a_fin.ravel()[apos] = fin
            self._a_l.ravel()[apos] = l
            # completion calendar (global clock)
            cidx = ((G + o) & mask) * N + env
            np.add.at(self._cal_n, cidx, 1)
            np.add.at(self._cal_tok, cidx, l + o)
            # histogram: +k in bin 0 now; crossings into bins 1..Kx; leave the last bin at the finish
            bl = self._bin_last[o]
            np.add.at(self._dH, cidx * K + bl, -1)
            if self.Kx:
                cnt = np.bincount(env * K + bl, minlength=N * K).reshape(N, K)
                cross = cnt[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1 : self.Kx + 1]  # admitted with bin_last >= k
                xk = np.arange(1, self.Kx + 1)
                xidx = (((G + self.edges[1 : self.Kx + 1]) & mask) * (N * K) + xk)[None, :] + self._arK[:, None]
                self._dH[xidx] += cross
                self._dH[xidx - 1] -= cross
            self.H[:, 0] += k
            p_sum = np.bincount(env, weights=l, minlength=N).astype(_I64)  # exact: integer sums < 2**53
            self.held += p_sum
            self.queued_prompt_tokens -= p_sum
            if self.track_class_queue:
                c = self._cls.ravel()[flat]
                self.class_queue -= np.bincount(env * self.m + c, minlength=N * self.m).reshape(N, self.m)
            self.tail += k
            self.n_active += k
        # ---- evict on overflow
        demand = self.held + self.n_active
        over = demand > self.M
        evicted = wasted = None
        if over.any():
            evicted, wasted = self._evict(np.flatnonzero(over), demand)
            demand = self.held + self.n_active
        # ---- decode
        self.held = demand.copy()
        g1 = (G + 1) & mask
        cs = slice(g1 * N, g1 * N + N)
        n_done = self._cal_n[cs].copy()
        self.held -= self._cal_tok[cs]
        self._cal_n[cs] = 0
        self._cal_tok[cs] = 0
        self.n_active -= n_done
        hs = slice(g1 * N * K, (g1 + 1) * N * K)
        self.H += self._dH[hs].reshape(N, K)
        self._dH[hs] = 0
        out = {
            "t": t.copy(),
            "usage": demand,
            "admitted": k,
            "evicted": evicted if evicted is not None else np.zeros(N, _I64),
            "wasted_tokens": wasted if wasted is not None else np.zeros(N, _I64),
            "completed": n_done,
            "queue_len": self.n_queued,
            "active": self.n_active.copy(),
        }
        self.t = t + 1
        self.G = G + 1
        return out

    def _evict(self, rows: np.ndarray, demand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Evict (lifo: the shortest newest suffix covering the excess; all: everyone) in ``rows``."""
        N, K, G, mask = self.N, self.K, self.G, self._mask
        excess = demand[rows] - self.M
        tail = self.tail[rows]
        t_r = self.t[rows]
        w = int(tail.max()) if self.evict_all else min(int(tail.max()), 64)
        while True:
            cols = tail[:, None] - w + np.arange(w)[None, :]
            valid = cols >= 0
            flat = rows[:, None] * self.A + np.maximum(cols, 0)
            fin = self._a_fin.ravel()[flat]
            alive = valid & (fin > t_r[:, None])
            st = self._a_start.ravel()[flat]
            lb = self._a_l.ravel()[flat]
            j = t_r[:, None] - st
            dem = np.where(alive, lb + j + 1, 0)
            if self.evict_all:
                victim = alive
                break
            incl = dem[:, ::-1].cumsum(axis=1)[:, ::-1]
            if w >= int(tail.max()) or bool((incl[:, 0] >= excess).all()):
                victim = alive & (incl - dem < excess[:, None])
                break
            w = min(2 * w, int(tail.max()))
        cnt = victim.sum(axis=1)
        vr, vc = np.nonzero(victim)
        ve = rows[vr]
        vflat = flat[vr, vc]
        vj = j[vr, vc]
        vl = lb[vr, vc]
        vs = st[vr, vc]
        vo = fin[vr, vc] - vs
        vid = self._a_id.ravel()[vflat]
        # bookkeeping per env
        wasted_r = (np.where(victim, j, 0)).sum(axis=1)
        freed_r = (np.where(victim, lb + j, 0)).sum(axis=1)
        ptok_r = (np.where(victim, lb, 0)).sum(axis=1)
        self._a_fin.ravel()[vflat] = -1
        tflat = ve * self.C + vid
        self._finish.ravel()[tflat] = -1
        self._evictions.ravel()[tflat] += 1
        # cancel their futures: completion, histogram crossings; drop them from H now
        gs = G - vj  # global slot of their activation
        cidx = ((gs + vo) & mask) * N + ve
        np.subtract.at(self._cal_n, cidx, 1)
        np.subtract.at(self._cal_tok, cidx, vl + vo)
        bl = self._bin_last[vo]
        bj = self._bin_j[vj]
        np.add.at(self._dH, cidx * K + bl, 1)
        np.subtract.at(self.H.ravel(), ve * K + bj, 1)
        if self.Kx:
            ks = np.arange(1, self.Kx + 1)
            sel = (ks[None, :] > bj[:, None]) & (ks[None, :] <= bl[:, None])
            if sel.any():
                er, kc = np.nonzero(sel)
                kk = ks[kc]
                xi = ((gs[er] + self.edges[kk]) & mask) * (N * K) + ve[er] * K + kk
                np.subtract.at(self._dH, xi, 1)
                np.add.at(self._dH, xi - 1, 1)
        # back to the queue head: push on the stack in descending id order (smallest on top)
        top = int((self.rs_n[rows] + cnt).max())
        if top > self.S:
            S = max(2 * self.S, top)
            rs = np.zeros((N, S), _I64)
            rs[:, : self.S] = self._rs
            self._rs, self.S = rs, S
        vstart, _ = _excl_cumsum(cnt)
        rank = np.arange(vr.size) - vstart[vr]
        self._rs[ve, self.rs_n[ve] + cnt[vr] - 1 - rank] = vid
        self.rs_n[rows] += cnt
        self.queued_prompt_tokens[rows] += ptok_r
        if self.track_class_queue:
            c = self._cls.ravel()[tflat]
            self.class_queue += np.bincount(ve * self.m + c, minlength=N * self.m).reshape(N, self.m)
        self.n_active[rows] -= cnt
        self.held[rows] -= freed_r
        evicted = np.zeros(N, _I64)
        evicted[rows] = cnt
        wasted = np.zeros(N, _I64)
        wasted[rows] = wasted_r
        return evicted, wasted

    # ------------------------------------------------------------------ reading

    def projected_usage(self) -> np.ndarray:
        """``(N, H)``: each environment's demand at ``t + h`` for the offsets, with no admission or eviction."""
        assert self.offsets is not None
        N, mask = self.N, self._mask
        hw = int(min(int(self.offsets.max()), self.max_o))
        if hw == 0:
            return np.broadcast_to((self.held + self.n_active)[:, None], (N, self.offsets.size)).copy()
        rows = (self.G + np.arange(1, hw + 1)) & mask
        nd = self._cal_n.reshape(self.R, N)[rows]  # (hw, N): completions at t + u
        td = self._cal_tok.reshape(self.R, N)[rows]
        cum_nd = np.zeros((hw + 1, N), _I64)
        np.cumsum(nd, axis=0, out=cum_nd[1:])
        cum_td = np.zeros((hw + 1, N), _I64)
        np.cumsum(td, axis=0, out=cum_td[1:])
        act = self.n_active[None, :] - cum_nd  # active at t + u, u = 0..hw
        sum_act = np.zeros((hw + 1, N), _I64)  # sum_{u < h} act[u]
        np.cumsum(act[:-1], axis=0, out=sum_act[1:])
        D = self.held[None, :] + sum_act - cum_td + act  # (hw + 1, N)
        h = np.minimum(self.offsets, hw)
        return D[h].T

    def request_log(self, i: int) -> dict[str, np.ndarray]:
        """Per-request arrays of environment ``i``, as :meth:`Engine.request_log`."""
        n = int(self.n_arrived[i])
        chunks = self._chunks[i]

        def col(name: str) -> np.ndarray:
            if not chunks:
                return np.zeros(0, _I64)
            return np.concatenate([getattr(c, name) for c in chunks])[:n].astype(_I64)

        finish = self._finish[i, :n].astype(_I64)
        finish[finish > self.t[i]] = -1
        return {
            "arrival": col("arrival"),
            "prompt_len": col("prompt_len"),
            "output_len": col("output_len"),
            "cls": col("cls"),
            "finish": finish,
            "evictions": self._evictions[i, :n].astype(_I64),
            "rejected": np.zeros(n, bool),
        }
