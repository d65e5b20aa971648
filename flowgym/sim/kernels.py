"""Optional compiled kernels (numba) for the engine's per-slot loops.

The engine's hot path is a handful of small numpy calls per slot; at the sizes
of one slot (a few admissions, a few hundred active requests) their fixed cost
dominates. When numba is installed (``pip install -e '.[fast]' in the flowgym checkout``) these
kernels replace them:

* :func:`fill_range`: append a slot's arrivals (consecutive ids) to a FIFO lane;
* :func:`admit_lane`: move the first ``k`` ids of a queue lane into the active
  arrays and book their completions in the calendar (:func:`count_classes`
  keeps the per-class queue counts when they are observed);
* :func:`histogram_into`: the generated-tokens histogram of the observation;
* :func:`projected_demand`: the known-length projection ``D_{t+h}``.

For the batched engine (:mod:`flowgym.sim.batched`) and its vector environment:

* :func:`batched_step`: a whole slot (admission, eviction, decode, the next
  slot's arrivals) of every environment; :func:`batched_projection` its
  known-length projection; :func:`vector_observe` the vector env's reward,
  flags and observation;
* :func:`poisson_chunk` (:func:`poisson_chunks` for several environments): a
  workload chunk of ``MultiClassPoisson`` (rates below 10) from the uniforms of
  the environment's own generator's stream: the Poisson draws
  (:func:`poisson_counts`; :func:`poisson_counts2` for two environments at
  once), then the requests in their within-slot order (:func:`poisson_place`);
  :func:`pcg_fill` (:func:`pcg_fill2`) draws the uniforms, continuing each
  generator's PCG64 stream from a copy of its state.

They compute exactly what the numpy code does (same integers; the sampler
consumes the generator's uniforms exactly as ``MultiClassPoisson.sample``
does), so results do not depend on whether numba is present
(``tests/test_kernels.py`` runs both paths side by side). Set the environment
variable ``FLOWGYM_JIT=0`` to use the numpy code even when numba is installed;
:attr:`flowgym.sim.engine.Engine.jit` switches one engine.

Kernels are compiled on first use and cached next to this file
(``cache=True``), so only the first process after an install pays the
compilation (about a second).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np

__all__ = ["AVAILABLE", "ENABLED", "load", "admit_lane", "count_classes", "fill_range", "histogram_into",
           "projected_demand", "evict", "EVICT_LIFO", "EVICT_ALL", "EVICT_ESTIMATE", "future_fit", "run_timed", "batched_step", "batched_projection", "poisson_chunk", "poisson_chunks",
           "poisson_counts", "poisson_counts2", "poisson_place", "pcg_fill", "pcg_fill2",
           "vector_observe"]

#: numba is installed (it is imported only when the kernels are used).
AVAILABLE: bool = importlib.util.find_spec("numba") is not None
#: New engines use the kernels (numba available and ``FLOWGYM_JIT`` not ``0``).
ENABLED: bool = AVAILABLE and os.environ.get("FLOWGYM_JIT", "1").strip().lower() not in ("0", "false", "no", "off")

_numba: Any = None  # the numba module, once loaded


def _admit_lane(buf, head, k, a_id, a_start, a_fin, tail, t, output, prompt, finish, cal_n, cal_tok):
    # pragma: no cover - compiled
    """Activate ``buf[head:head+k]`` at slot ``t`` into ``[tail, tail+k)``; return their prompt tokens.

    The calendar's size is a power of two (a ring indexed by ``f & (size - 1)``).
    """
    mask = cal_n.size - 1
    p = 0
    for r in range(k):
        i = buf[head + r]
        f = output[i] + t  # finishes at f_i = t + o_i unless evicted
        a_id[tail + r] = i
        a_start[tail + r] = t
        a_fin[tail + r] = f
        finish[i] = f
        c = f & mask
        ln = prompt[i]
        cal_n[c] += 1
        cal_tok[c] += ln + f - t  # l + o
        p += ln
    return p


def _count_classes(buf, head, k, cls, class_queue):  # pragma: no cover - compiled
    """``class_queue[cls[i]] -= 1`` for the ids ``buf[head:head+k]`` (admitted, with per-class counts)."""
    for r in range(k):
        class_queue[cls[buf[head + r]]] -= 1


def _fill_range(buf, start, lo, hi):  # pragma: no cover - compiled
    """``buf[start + r] = lo + r`` for ``r < hi - lo``."""
    for r in range(hi - lo):
        buf[start + r] = lo + r


def _histogram_into(starts, fin, h, tail, t, edges, out, off):  # pragma: no cover - compiled
    """``out[off + k]`` = alive entries of ``[h, tail)`` with ``t - start`` in ``[edges[k], edges[k+1])`` (last open)."""
    K = edges.size
    for k in range(K):
        out[off + k] = 0
    for r in range(h, tail):
        if fin[r] > t:
            j = t - starts[r]
            if j < edges[0]:  # below the first bin: not counted (as the numpy path)
                continue
            k = K - 1
            while j < edges[k]:  # ends at k = 0 at the latest, since edges[0] <= j
                k -= 1
            out[off + k] += 1


def _projected_demand(held, act, t, mask, cal_n, cal_tok, offsets, out):  # pragma: no cover - compiled
    """``out[j] = D_{t + offsets[j]}`` from the completion calendar (see ``Engine.projected_demand``)."""
    H = 0
    for j in range(offsets.size):
        out[j] = 0
        if offsets[j] > H:
            H = offsets[j]
    for j in range(offsets.size):
        if offsets[j] == 0:
            out[j] = held + act
    sum_act = 0
    tok = 0
    for h in range(1, H + 1):
        sum_act += act
        i = (t + h) & mask
        act -= cal_n[i]
        tok += cal_tok[i]
        if act == 0:  # everyone has finished: D is 0 from here on
            break
        d = held + sum_act - tok + act
        for j in range(offsets.size):
            if offsets[j] == h:
                out[j] = d


#: Eviction rule codes of :func:`evict`: LIFO, all, ascending estimate (ties newest first).
EVICT_LIFO, EVICT_ALL, EVICT_ESTIMATE = 0, 1, 2


def _evict(code, a_id, a_start, a_fin, h, tail, t, prompt, output, estimate, track, excess, cal_n, cal_tok,
           finish, evictions, out):  # pragma: no cover - compiled
    """One eviction phase of the single engine (``Engine._evict``), for the built-in rules.

    The alive entries of ``[h, tail)`` (``a_fin > t``) in activation order are the active set;
    ``code`` picks the rule (:data:`EVICT_LIFO`, :data:`EVICT_ALL`, :data:`EVICT_ESTIMATE`, the
    same choices as ``flowgym.sim.rules``). Victims get ``a_fin = -1``, ``finish = -1``, one more
    eviction, their completion taken off the calendar and (``track``) their estimate raised to
    ``max(e_i, j_i + 1)``. Their ids go to ``out[:n]``, in ascending id order. Returns ``(n,
    freed, wasted, new_n, new_prompt, prompt_sum)``: tokens the active set no longer holds
    (``l + j`` each), generated tokens lost, how many were admitted this slot (``j = 0``) and their
    prompt tokens, and all victims' prompt tokens. ``n = 0`` means the rule freed fewer than
    ``excess`` tokens (cannot happen for these rules; the engine raises).
    """
    mask = cal_n.size - 1
    n = 0
    for r in range(h, tail):
        if a_fin[r] > t:
            n += 1
    pos = np.empty(n, np.int64)  # window positions of the alive entries, activation order
    k = 0
    for r in range(h, tail):
        if a_fin[r] > t:
            pos[k] = r
            k += 1
    order = np.empty(n, np.int64)  # eviction order: indices into pos
    if code == 2:
        keys = np.empty(n, np.int64)
        for q in range(n):
            i = a_id[pos[q]]
            e = max(estimate[i], t - a_start[pos[q]] + 1)
            keys[q] = (e << 32) | (n - 1 - q)  # ascending estimate, ties newest first
        order[:] = np.argsort(keys)
    elif code == 1:
        for q in range(n):
            order[q] = q
    else:
        for q in range(n):
            order[q] = n - 1 - q
    freed = 0
    nv = 0
    if code == 1:
        nv = n
        for q in range(n):
            r = pos[q]
            freed += prompt[a_id[r]] + t - a_start[r] + 1
    else:
        while nv < n and freed < excess:
            r = pos[order[nv]]
            freed += prompt[a_id[r]] + t - a_start[r] + 1
            nv += 1
    if freed < excess:
        return 0, 0, 0, 0, 0, 0
    held = 0
    wasted = 0
    new_n = 0
    new_p = 0
    psum = 0
    for q in range(nv):
        r = pos[order[q]]
        i = a_id[r]
        j = t - a_start[r]
        ln = prompt[i]
        held += ln + j
        wasted += j
        psum += ln
        if j == 0:
            new_n += 1
            new_p += ln
        f = a_fin[r]
        c = f & mask
        cal_n[c] -= 1
        cal_tok[c] -= ln + output[i]
        a_fin[r] = -1
        finish[i] = -1
        evictions[i] += 1
        if track and estimate[i] < j + 1:
            estimate[i] = j + 1
        out[q] = i
    out[:nv].sort()
    return nv, held, wasted, new_n, new_p, psum


# --------------------------------------------------------------------------- fused continuous-time episode


#: Scalar state of :func:`run_timed` (indices into its int64 array ``S``; ``F`` holds
#: ``now``, ``last_duration``, the generated-through time and the latency coefficients).
(S_T, S_ARRIVED, S_NREQ, S_TOTAL, S_QHEAD, S_QTAIL, S_AH, S_ATAIL, S_NACT, S_HELD, S_NQ, S_QPROMPT, S_TARR,
 S_TREJ, S_TDONE, S_TEV, S_OVF, S_WASTE, S_GEN, S_LARR, S_LREJ, S_LDONE, S_RECN, S_CLOCKB, S_HORIZON,
 S_NEED, S_LIMIT) = range(27)
#: Status of :func:`run_timed`: the episode ended; the next arrivals need Python (a new chunk of the
#: workload, or an idle jump past what is generated); a buffer must grow first; the iteration limit.
RUN_DONE, RUN_ARRIVE, RUN_GROW, RUN_LIMIT = 0, 1, 2, 3
#: Admission rules of :func:`run_timed` (``flowgym.sim.policies``).
POL_FIXED, POL_GREEDY, POL_FUTURE = 0, 1, 2


def _lane_merge(buf, kbuf, keyed, S, ids, keys, n):  # pragma: no cover - compiled
    """Merge ``ids[:n]`` (ascending ``keys``, unique) into the ascending lane ``buf[head:tail]``.

    Moves the shorter side: into the free space in front of the head when it is large enough
    and fewer queued requests come before the last new key than after the first one, else
    towards the tail (room checked by the caller). The lane's contents are those of
    ``Lane.push``; only where they sit in the buffer differs.
    """
    if n == 0:
        return
    h, tl = S[S_QHEAD], S[S_QTAIL]
    lo, hi = h, tl
    while lo < hi:  # queued requests before the first new key
        mid = (lo + hi) >> 1
        if kbuf[mid] < keys[0]:
            lo = mid + 1
        else:
            hi = mid
    first = lo
    lo, hi = first, tl
    while lo < hi:  # ... and before the last
        mid = (lo + hi) >> 1
        if kbuf[mid] < keys[n - 1]:
            lo = mid + 1
        else:
            hi = mid
    last = lo
    if h >= n and last - h < tl - first:  # front: write from head - n upwards
        w = h - n
        r = h
        q = 0
        while q < n:
            if r < tl and kbuf[r] < keys[q]:
                buf[w] = buf[r]
                if keyed:
                    kbuf[w] = kbuf[r]
                r += 1
            else:
                buf[w] = ids[q]
                if keyed:
                    kbuf[w] = keys[q]
                q += 1
            w += 1
        S[S_QHEAD] = h - n
    else:  # back: write from tail + n - 1 downwards
        w = tl + n - 1
        r = tl - 1
        q = n - 1
        while q >= 0:
            if r >= h and kbuf[r] > keys[q]:
                buf[w] = buf[r]
                if keyed:
                    kbuf[w] = kbuf[r]
                r -= 1
            else:
                buf[w] = ids[q]
                if keyed:
                    kbuf[w] = keys[q]
                q -= 1
            w -= 1
        S[S_QTAIL] = tl + n


def _future_fit(M, a_prompt, a_gen, a_out, c_prompt, c_out):  # pragma: no cover - compiled
    """``agents.memory_check.future_fit_count`` compiled: the same prefix length."""
    n = a_prompt.size
    kc = c_prompt.size
    if kc == 0:
        return 0
    rem = np.empty(n, np.int64)
    b = np.empty(n, np.int64)
    for i in range(n):
        rem[i] = max(a_out[i] - a_gen[i], 1)
        b[i] = a_prompt[i] + a_gen[i] + 1
    order = np.argsort(rem, kind="mergesort")
    rem_s = rem[order]
    suffix = np.zeros(n + 1, np.int64)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + b[order[i]]

    def free_at(h):
        lo, hi = 0, n  # first active with rem > h
        while lo < hi:
            mid = (lo + hi) >> 1
            if rem_s[mid] <= h:
                lo = mid + 1
            else:
                hi = mid
        return M - (suffix[lo] + h * (n - lo))

    room0 = free_at(0)
    for i in range(n):
        if free_at(rem_s[i] - 1) < 0:  # the active set alone must fit
            return 0
    k = 0
    c = 0
    while k < kc:
        c += c_prompt[k] + 1
        if c > room0:
            break
        k += 1
    if k == 0:
        return 0
    # Candidates one by one, checked at the last slots of the active requests and of the candidates
    # so far. The usage only grows between two of these, so they are the only places it can exceed M;
    # the agent's function also checks at later candidates' last slots, which never fail first.
    pts = np.empty(n + k, np.int64)
    fr = np.empty(n + k, np.int64)
    used = np.zeros(n + k, np.int64)
    for i in range(n):
        pts[i] = rem_s[i] - 1
        fr[i] = free_at(pts[i])
    npt = n
    for ci in range(k):
        hc = c_out[ci] - 1
        u = 0
        for cj in range(ci):
            if hc < c_out[cj]:
                u += c_prompt[cj] + 1 + hc
        pts[npt] = hc
        fr[npt] = free_at(hc)
        used[npt] = u
        npt += 1
        for x in range(npt):
            if pts[x] < c_out[ci]:
                used[x] += c_prompt[ci] + 1 + pts[x]
            if used[x] > fr[x]:
                return ci
    return k


def _run_timed(S, F, pol, pol_limit, lat_code, arrival, arrival_time, prompt, output, finish, evictions, rejected,
               estimate, track, keyed, est_order, buf, kbuf, a_id, a_start, a_fin, cal_n, cal_tok, rec, clock,
               evict_code, M, ev_buf):  # pragma: no cover - compiled
    """Continuous-time iterations of the single engine with a compiled admission rule, from a decision
    point (this iteration's arrivals queued) until the episode ends or Python is needed.

    Every iteration is ``Engine.serve`` (admission, eviction with :func:`evict`, the clock, decode,
    the record) followed by ``Engine.arrive``, with the budget the rule ``pol`` gives (``pol[0]``:
    :data:`POL_FIXED` ``b = pol[1]``; :data:`POL_GREEDY` fit under ``pol_limit`` taking at most
    ``pol[2]`` queued requests; :data:`POL_FUTURE` the memory check over the first ``pol[2]``
    with lengths ``pol[3]``: 0 known, 1 the bound ``pol[4]``, 2 estimates). Returns a ``RUN_*``
    status; the state is in ``S``/``F`` and the arrays, exactly as the numpy path leaves it.
    """
    mask = cal_n.size - 1
    c0, c1, c2, c3 = F[3], F[4], F[5], F[6]
    done_iters = 0
    while True:
        # ---------------------------------------------------------- decision point: room first
        t = S[S_T]
        nq, nact = S[S_NQ], S[S_NACT]
        if S[S_RECN] >= rec.shape[0] or t - S[S_CLOCKB] >= clock.size:
            return RUN_GROW
        h, tl = S[S_QHEAD], S[S_QTAIL]
        # ---------------------------------------------------------- the budget
        code = pol[0]
        if code == 0:
            budget = pol[1]
        elif code == 1:
            room = pol_limit - (S[S_HELD] + nact)
            budget = 0
            if room >= 2 and nq > 0:
                kmax = min(nq, pol[2])
                half = np.floor(room / 2)
                if half < kmax:
                    kmax = int(half)
                c = 0
                for r in range(kmax):
                    c += prompt[buf[h + r]] + 1
                    if c > room:
                        break
                    budget += 1
        else:
            budget = 0
            if nq > 0:
                # only the candidates whose first-slot tokens fit can be admitted (future_fit's quick
                # bound: the room now is M - demand); read no further into the queue
                room0 = M - (S[S_HELD] + nact)
                kc = 0
                c = 0
                while kc < min(nq, pol[2]):
                    c += prompt[buf[h + kc]] + 1
                    if c > room0:
                        break
                    kc += 1
                ap = np.empty(nact, np.int64)
                ag = np.empty(nact, np.int64)
                ao = np.empty(nact, np.int64)
                q = 0
                for r in range(S[S_AH], S[S_ATAIL]):
                    if a_fin[r] > t:
                        i = a_id[r]
                        j = t - a_start[r]
                        ap[q] = prompt[i]
                        ag[q] = j
                        if pol[3] == 0:
                            ao[q] = output[i]
                        elif pol[3] == 1:
                            ao[q] = pol[4]
                        else:
                            ao[q] = max(estimate[i], j + 1)
                        q += 1
                cp = np.empty(kc, np.int64)
                co = np.empty(kc, np.int64)
                for r in range(kc):
                    i = buf[h + r]
                    cp[r] = prompt[i]
                    if pol[3] == 0:
                        co[r] = output[i]
                    elif pol[3] == 1:
                        co[r] = pol[4]
                    else:
                        co[r] = estimate[i]
                budget = future_fit(M, ap, ag, ao, cp, co) if kc > 0 else 0
        k = min(budget, nq)
        # the queue's buffer: this iteration may requeue every active request and the k it admits
        # (evicted in their admission iteration) and append every arrival drawn so far
        bound = nq + nact + (S[S_NREQ] - S[S_ARRIVED])
        if bound + k + 1 > buf.size:
            S[S_NEED] = k
            return RUN_GROW
        if tl + (bound - nq) + k + 1 > buf.size:  # re-centre the queue: room behind it, a gap in front
            g = (buf.size - (tl - h) - (bound - nq) - k - 1) // 2
            if g < h:
                for r in range(tl - h):
                    buf[g + r] = buf[h + r]
                    if keyed:
                        kbuf[g + r] = kbuf[h + r]
            else:
                for r in range(tl - h - 1, -1, -1):
                    buf[g + r] = buf[h + r]
                    if keyed:
                        kbuf[g + r] = kbuf[h + r]
            S[S_QHEAD], S[S_QTAIL] = g, g + tl - h
            h, tl = g, g + tl - h
        # active arrays: drop dead entries (order kept) when they are many or room is short
        ah, at = S[S_AH], S[S_ATAIL]
        if at + k > a_id.size or at - ah - nact > max(256, nact):
            w = 0
            for r in range(ah, at):
                if a_fin[r] > t:
                    a_id[w], a_start[w], a_fin[w] = a_id[r], a_start[r], a_fin[r]
                    w += 1
            S[S_AH], S[S_ATAIL] = 0, w
            ah, at = 0, w
            if at + k > a_id.size:
                S[S_NEED] = k
                return RUN_GROW
        if ev_buf.size < at - ah + k:
            S[S_NEED] = k
            return RUN_GROW
        if done_iters >= S[S_LIMIT]:
            return RUN_LIMIT
        done_iters += 1
        # ---------------------------------------------------------- serve: admission
        adm_prompt = 0
        if k > 0:
            adm_prompt = admit_lane(buf, h, k, a_id, a_start, a_fin, at, t, output, prompt, finish, cal_n, cal_tok)
            S[S_QHEAD] = h + k
            if h + k == tl:
                S[S_QHEAD], S[S_QTAIL] = 0, 0
            S[S_HELD] += adm_prompt
            S[S_QPROMPT] -= adm_prompt
            S[S_NQ] -= k
            S[S_NACT] += k
            S[S_ATAIL] = at + k
        demand = S[S_HELD] + S[S_NACT]
        n_ev = 0
        wasted = 0
        ev_new_n = 0
        ev_new_p = 0
        if demand > M:
            nv, freed, wasted, ev_new_n, ev_new_p, psum = evict(
                evict_code, a_id, a_start, a_fin, S[S_AH], S[S_ATAIL], t, prompt, output, estimate, track,
                demand - M, cal_n, cal_tok, finish, evictions, ev_buf)
            if nv == 0:
                S[S_NEED] = -1  # the rule freed too little (cannot happen for the built-in rules)
                return RUN_GROW
            n_ev = nv
            S[S_NACT] -= nv
            S[S_HELD] -= freed
            S[S_WASTE] += wasted
            S[S_TEV] += nv
            S[S_OVF] += 1
            S[S_NQ] += nv
            S[S_QPROMPT] += psum
            # back to the queue at their places (ev_buf holds them by ascending id)
            if est_order:
                keys = np.empty(nv, np.int64)
                for q in range(nv):
                    keys[q] = (estimate[ev_buf[q]] << 32) | ev_buf[q]
                o = np.argsort(keys)
                lane_merge(buf, kbuf, keyed, S, ev_buf[:nv][o], keys[o], nv)
            else:
                lane_merge(buf, kbuf, keyed, S, ev_buf, ev_buf, nv)
            demand = S[S_HELD] + S[S_NACT]
        # ---------------------------------------------------------- the clock
        new_n = k - ev_new_n
        P = (adm_prompt if k else 0) - ev_new_p
        D = S[S_NACT] - new_n
        K = S[S_HELD] - P
        B = S[S_NACT]
        if lat_code == 0:
            d = c0 + c1 * P + c2 * D + c3 * K
        else:
            mean_ctx = (K + P) / B if B else 0.0
            d = ((c0 * mean_ctx + c1) * B + c2 + c3 * P) / 1000.0
        F[1] = d
        F[0] += d
        clock[t - S[S_CLOCKB]] = F[0]
        # ---------------------------------------------------------- decode
        S[S_HELD] = demand
        S[S_GEN] += S[S_NACT]
        ci = (t + 1) & mask
        n_done = cal_n[ci]
        S[S_LDONE] = 0
        if n_done:
            S[S_LDONE] = cal_tok[ci]
            S[S_HELD] -= cal_tok[ci]
            cal_n[ci] = 0
            cal_tok[ci] = 0
            S[S_NACT] -= n_done
            S[S_TDONE] += n_done
        rn = S[S_RECN]
        rec[rn, 0] = t
        rec[rn, 1] = demand
        rec[rn, 2] = k
        rec[rn, 3] = n_ev
        rec[rn, 4] = wasted
        rec[rn, 5] = n_done
        rec[rn, 6] = S[S_NQ]
        rec[rn, 7] = S[S_NACT]
        S[S_RECN] = rn + 1
        t += 1
        S[S_T] = t
        # ---------------------------------------------------------- the end of the episode
        exhausted = S[S_TOTAL] >= 0 and S[S_ARRIVED] >= S[S_TOTAL]
        if exhausted and S[S_NQ] + S[S_NACT] == 0:
            return RUN_DONE
        if S[S_HORIZON] >= 0 and t >= S[S_HORIZON]:
            return RUN_DONE
        # ---------------------------------------------------------- arrivals of the next iteration
        now = F[0]
        if now >= F[2]:
            return RUN_ARRIVE  # the workload's next chunk is drawn in Python
        lo = S[S_ARRIVED]
        nreq = S[S_NREQ]
        if S[S_NQ] == 0 and S[S_NACT] == 0:  # idle: jump to the next arrival
            if lo >= nreq or arrival_time[lo] >= F[2]:
                return RUN_ARRIVE
            if arrival_time[lo] > now:
                now = arrival_time[lo]
                F[0] = now
        hi = lo
        while hi < nreq and arrival_time[hi] <= now:
            hi += 1
        kk = hi - lo
        S[S_ARRIVED] = hi
        S[S_LARR] = kk
        S[S_LREJ] = 0
        if kk:
            n_rej = 0
            for i in range(lo, hi):
                arrival[i] = t
                if rejected[i]:
                    n_rej += 1
            S[S_TARR] += kk
            S[S_TREJ] += n_rej
            S[S_LREJ] = n_rej
            if keyed:
                nid = np.empty(kk - n_rej, np.int64)
                nk = np.empty(kk - n_rej, np.int64)
            q = 0
            for i in range(lo, hi):
                if not rejected[i]:
                    S[S_NQ] += 1
                    S[S_QPROMPT] += prompt[i]
                    if keyed:
                        nid[q] = i
                        nk[q] = (estimate[i] << 32) | i
                        q += 1
                    else:
                        tl = S[S_QTAIL]
                        buf[tl] = i
                        S[S_QTAIL] = tl + 1
            if keyed:
                wid, wk = nid[:q], nk[:q]  # sort only what was written
                o = np.argsort(wk)  # (arrivals share the floor estimate: already in order)
                lane_merge(buf, kbuf, keyed, S, wid[o], wk[o], q)


# --------------------------------------------------------------------------- batched engine (flowgym.sim.batched)


def _make_pcg_step(intrinsic: Any, types: Any, ir: Any) -> Any:
    """The PCG64 state transition ``state * MULT + inc`` (128-bit, as numpy's C code) as a numba intrinsic.

    States are pairs of uint64 words (high, low); LLVM's i128 arithmetic does the rest.
    """
    mult = (2549297995355413924 << 64) + 4865540595714422341  # PCG_DEFAULT_MULTIPLIER_128

    @intrinsic
    def pcg_step(typingctx, shi, slo, ihi, ilo):  # type: ignore[no-untyped-def]
        sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, types.uint64, types.uint64)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            i128, i64 = ir.IntType(128), ir.IntType(64)

            def join(hi, lo):  # type: ignore[no-untyped-def]
                return builder.or_(builder.shl(builder.zext(hi, i128), ir.Constant(i128, 64)), builder.zext(lo, i128))

            r = builder.add(builder.mul(join(args[0], args[1]), ir.Constant(i128, mult)), join(args[2], args[3]))
            hi = builder.trunc(builder.lshr(r, ir.Constant(i128, 64)), i64)
            return context.make_tuple(builder, signature.return_type, [hi, builder.trunc(r, i64)])

        return sig, codegen

    return pcg_step


def _pcg_double(shi, slo):  # pragma: no cover - compiled
    """``Generator.random``'s double from a PCG64 state just stepped: XSL-RR output, top 53 bits."""
    x = shi ^ slo
    rot = shi >> np.uint64(58)
    v = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
    return np.float64(v >> np.uint64(11)) * (1.0 / 9007199254740992.0)


def _pcg_fill(pcg, i, out, lo, hi):  # pragma: no cover - compiled
    """``out[lo:hi]``: the next doubles of the PCG64 state ``pcg[i]`` (``Generator.random``'s), advancing it.

    ``pcg[i]`` holds the state and the increment as uint64 words: state high, state
    low, inc high, inc low (the ``state`` dict of ``np.random.PCG64``).
    """
    shi, slo, ihi, ilo = pcg[i, 0], pcg[i, 1], pcg[i, 2], pcg[i, 3]
    for k in range(lo, hi):
        shi, slo = pcg_step(shi, slo, ihi, ilo)
        out[k] = pcg_double(shi, slo)
    pcg[i, 0] = shi
    pcg[i, 1] = slo


def _pcg_fill2(pcg, i1, i2, out1, out2, lo1, lo2, hi):  # pragma: no cover - compiled
    """:func:`pcg_fill` of ``out1[lo1:hi]`` from ``pcg[i1]`` and ``out2[lo2:hi]`` from ``pcg[i2]``, stepped together.

    Each stream is a chain of dependent 128-bit multiplies; stepping two at once
    overlaps them.
    """
    n = max(min(hi - lo1, hi - lo2), 0)
    ah, al, aih, ail = pcg[i1, 0], pcg[i1, 1], pcg[i1, 2], pcg[i1, 3]
    bh, bl, bih, bil = pcg[i2, 0], pcg[i2, 1], pcg[i2, 2], pcg[i2, 3]
    for k in range(n):
        ah, al = pcg_step(ah, al, aih, ail)
        bh, bl = pcg_step(bh, bl, bih, bil)
        out1[lo1 + k] = pcg_double(ah, al)
        out2[lo2 + k] = pcg_double(bh, bl)
    pcg[i1, 0] = ah
    pcg[i1, 1] = al
    pcg[i2, 0] = bh
    pcg[i2, 1] = bl
    pcg_fill(pcg, i1, out1, lo1 + n, hi)  # the longer one's rest
    pcg_fill(pcg, i2, out2, lo2 + n, hi)


def _poisson_counts(u, pos, end, nz, enl, m, n_slots, counts):  # pragma: no cover - compiled
    """The Poisson draws of a chunk: ``counts[s * m + k]`` arrivals of class ``k`` in slot ``s``.

    Consumes ``u[pos:end]`` as ``Generator.poisson`` consumes the generator's
    doubles for ``lambda < 10`` (the multiplication method: ``X`` is the number of
    uniforms whose running product stays above ``exp(-lambda)``), slot by slot,
    over the classes ``nz`` (those with a positive rate; ``enl`` their
    ``exp(-lambda)``). ``counts`` must be zero. Returns the position after the
    last uniform used, or ``-1`` when ``u[pos:end]`` ran out.
    """
    mz = nz.size
    q = pos
    for s in range(n_slots):
        for k in range(mz):
            x = 0
            prod = 1.0
            e = enl[k]
            while True:
                if q >= end:
                    return -1
                prod *= u[q]
                q += 1
                if prod > e:
                    x += 1
                else:
                    break
            counts[s * m + nz[k]] = x
    return q


def _poisson_step(u, p, e, x, d, k, dc, enl, mz):  # pragma: no cover - compiled
    """One uniform ``u`` of a stream of Poisson draws, with selects (no branch on the data).

    ``p`` is the running product of draw ``d`` (class index ``k`` into ``enl``, its
    ``exp(-lambda)`` ``e``) and ``x`` its count so far. When ``u`` ends the draw, its
    count goes to ``dc[d]`` and the next draw starts. Returns the new ``p, x, d, k, e``.
    """
    p *= u
    done = p <= e
    dc[d] = x  # overwritten until the draw ends
    d += done
    x = 0 if done else x + 1
    p = 1.0 if done else p
    k += done
    k = 0 if k == mz else k
    return p, x, d, k, enl[k]


def _poisson_counts2(u1, u2, end, nz, enl, m, n_slots, counts1, counts2):  # pragma: no cover - compiled
    """:func:`poisson_counts` from position 0 of two independent streams at once.

    Each draw ends at a data-dependent uniform, a branch mispredicted about once
    per draw; here one loop steps both streams a uniform at a time with selects,
    so their dependency chains (product, compare) overlap. Returns the two end
    positions, or ``(-1, -1)`` when either stream ran out (the caller redoes them
    one at a time).
    """
    mz = nz.size
    nd = n_slots * mz
    if nd == 0:
        return 0, 0
    dc1 = np.empty(nd, np.int64)  # the count of draw d (draw order: slot, then class)
    dc2 = np.empty(nd, np.int64)
    q1 = q2 = d1 = d2 = x1 = x2 = k1 = k2 = 0  # position, draw, count so far, class index of each stream
    p1 = p2 = 1.0  # running products
    e1 = e2 = enl[0]
    while d1 < nd and d2 < nd:
        if q1 >= end or q2 >= end:
            return -1, -1
        p1, x1, d1, k1, e1 = poisson_step(u1[q1], p1, e1, x1, d1, k1, dc1, enl, mz)
        p2, x2, d2, k2, e2 = poisson_step(u2[q2], p2, e2, x2, d2, k2, dc2, enl, mz)
        q1 += 1
        q2 += 1
    while d1 < nd:  # the stream left, alone
        if q1 >= end:
            return -1, -1
        p1, x1, d1, k1, e1 = poisson_step(u1[q1], p1, e1, x1, d1, k1, dc1, enl, mz)
        q1 += 1
    while d2 < nd:
        if q2 >= end:
            return -1, -1
        p2, x2, d2, k2, e2 = poisson_step(u2[q2], p2, e2, x2, d2, k2, dc2, enl, mz)
        q2 += 1
    d = 0
    for s in range(n_slots):
        for k in range(mz):
            counts1[s * m + nz[k]] = dc1[d]
            counts2[s * m + nz[k]] = dc2[d]
            d += 1
    return q1, q2


def _poisson_place(u, q, end, lk, m_track, n_slots, base, cls, bnd, tokc, clsc, counts):
    # pragma: no cover - compiled
    """The requests of a chunk whose Poisson draws are ``counts`` (:func:`poisson_counts`), from ``u[q:end]``.

    Consumes one uniform per request, as ``Generator.random`` does for the
    within-slot shuffle of ``MultiClassPoisson.sample``, and writes the requests'
    classes to ``cls`` from row ``base`` (a request's lengths are its class's), the
    chunk's slot boundaries ``bnd`` (first id of each slot), prompt-token sums
    ``tokc`` and (``m_track > 0``) per-class counts ``clsc``. Up to 16 arrivals a
    slot are ranked by counting (no data-dependent branch: with fresh random data
    an insertion sort's branches are mispredicted).

    Returns the position after the last uniform used, ``-1`` when ``u[q:end]``
    ran out, or ``-2 - n`` when the table needs ``n`` rows (nothing is written then).
    """
    m = lk.size
    total = 0
    for c in range(n_slots * m):
        total += counts[c]
    if base + total > cls.size:
        return -2 - (base + total)
    if q + total + 16 > end:  # the shuffle reads up to 16 uniforms past a slot's own
        return -1
    kp = np.empty(16, np.int64)
    rank = np.empty(16, np.int64)
    cum = np.zeros(m + 1, np.int64)
    running = np.zeros(max(m_track, 1), np.int64)
    r0 = base
    j = q
    tok = 0
    for s in range(n_slots):
        bnd[s] = r0
        tokc[s] = tok
        for c in range(m_track):
            clsc[s, c] = running[c]
        for k in range(m):
            n_k = counts[s * m + k]
            cum[k + 1] = cum[k] + n_k
            tok += n_k * lk[k]
            if m_track > 0:
                running[k] += n_k
        n_s = cum[m]
        # request a of the slot (draw order: by class, then by draw) has uniform u[j + a];
        # it goes to rank r_a of the stable sort by uniform (ties in draw order, as lexsort).
        # Up to 16 requests: rank by counting over packed keys (u * 2**53 is an exact
        # integer below 2**53; the low 4 bits hold a, so keys are distinct), at a fixed
        # width of 16 (padded with the largest key).
        if n_s <= 16:
            for a in range(16):
                kv = (np.int64(u[j + a] * 9007199254740992.0) << 4) | a
                kp[a] = kv if a < n_s else 9223372036854775807
            for a in range(16):
                ka = kp[a]
                r = 0
                for b in range(16):
                    r += kp[b] < ka
                rank[a] = r
            for a in range(n_s):
                c = 0
                for k in range(1, m):
                    c += a >= cum[k]
                cls[r0 + rank[a]] = c
        elif n_s <= 48:
            for a in range(n_s):
                ka = u[j + a]
                r = 0
                for b in range(n_s):
                    kb = u[j + b]
                    r += (kb < ka) | ((kb == ka) & (b < a))
                c = 0
                for k in range(1, m):
                    c += a >= cum[k]
                cls[r0 + r] = c
        else:
            order = np.argsort(u[j : j + n_s], kind="mergesort")
            for r in range(n_s):
                a = order[r]
                c = 0
                for k in range(1, m):
                    c += a >= cum[k]
                cls[r0 + r] = c
        r0 += n_s
        j += n_s
    bnd[n_slots] = r0
    tokc[n_slots] = tok
    for c in range(m_track):
        clsc[n_slots, c] = running[c]
    return j


def _poisson_chunk(u, pos, end, nz, enl, lk, m_track, n_slots, base, cls, bnd, tokc,
                   clsc):  # pragma: no cover - compiled
    """One workload chunk of :class:`~flowgym.sim.workloads.MultiClassPoisson` (every rate below 10) for one environment.

    :func:`poisson_counts` then :func:`poisson_place` on ``u[pos:end]``: the
    uniforms are consumed as ``Generator.poisson`` and then ``Generator.random``
    (the within-slot shuffle) consume the generator's doubles, so the requests
    equal ``MultiClassPoisson.sample``. Returns the position after the last
    uniform used, ``-1`` when ``u[pos:end]`` ran out, or ``-2 - n`` when the table
    needs ``n`` rows (nothing is written then).
    """
    m = lk.size
    counts = np.zeros(n_slots * m, np.int64)
    q = poisson_counts(u, pos, end, nz, enl, m, n_slots, counts)
    if q < 0:
        return q
    return poisson_place(u, q, end, lk, m_track, n_slots, base, cls, bnd, tokc, clsc, counts)


def _poisson_chunks(U, want, envs, pcg, left, left_n, nz, enl, lk, m_track, n_slots, st, cls, abnd, tokc, clsc,
                    res):  # pragma: no cover - compiled
    """:func:`poisson_chunk` for the environments ``envs``, ``want`` uniforms each (row ``r`` of ``U``: ``envs[r]``).

    The uniforms of environment ``i = envs[r]`` are its held-over ones (row ``i``
    of ``left``, ``left_n[i]`` of them, drawn earlier), then the next of its
    generator's stream (the PCG64 state ``pcg[i]``, :func:`pcg_fill`), written to
    row ``r`` of ``U``. Environments are drawn and sampled two at a time
    (:func:`pcg_fill2`, :func:`poisson_counts2`). Each chunk
    starts at the environment's clock ``gen_t`` and next id ``n_req`` (rows of
    ``st``, ``flowgym.sim.batched.STATE_ROWS``), which are advanced on success, and
    what the chunk leaves of the uniforms is held over in ``left`` (which must be
    at least ``want`` wide). ``res[r]`` gets :func:`poisson_chunk`'s result; on a failure
    the environment is left as it was, holding all ``want`` uniforms, for the
    caller to redo alone.
    """
    gen_t, chunk_t0, n_req = st[9], st[10], st[11]
    m = lk.size
    n = envs.size
    for r in range(n):
        i = envs[r]
        for c in range(left_n[i]):
            U[r, c] = left[i, c]
    for r in range(0, n - 1, 2):
        pcg_fill2(pcg, envs[r], envs[r + 1], U[r], U[r + 1], left_n[envs[r]], left_n[envs[r + 1]], want)
    if n % 2:
        pcg_fill(pcg, envs[n - 1], U[n - 1], left_n[envs[n - 1]], want)
    counts = np.zeros((2, n_slots * m), np.int64)
    qs = np.empty(2, np.int64)
    for r0 in range(0, n, 2):
        pair = min(2, n - r0)
        qs[0] = -1
        counts[:] = 0
        if pair == 2:
            qs[0], qs[1] = poisson_counts2(U[r0], U[r0 + 1], want, nz, enl, m, n_slots, counts[0], counts[1])
        if qs[0] < 0:  # alone (a single environment, or a stream of the pair ran out)
            counts[:] = 0
            for h in range(pair):
                qs[h] = poisson_counts(U[r0 + h], 0, want, nz, enl, m, n_slots, counts[h])
        for h in range(pair):
            r = r0 + h
            i = envs[r]
            t0 = gen_t[i]
            q = qs[h]
            if q >= 0:
                c = clsc[i] if m_track > 0 else clsc[0]
                q = poisson_place(U[r], q, want, lk, m_track, n_slots, n_req[i], cls[i],
                                  abnd[i, t0 : t0 + n_slots + 1], tokc[i], c, counts[h])
            res[r] = q
            if q >= 0:
                n_req[i] = abnd[i, t0 + n_slots]
                chunk_t0[i] = t0
                gen_t[i] = t0 + n_slots
                q0 = q
            else:
                q0 = 0
            for c in range(q0, want):
                left[i, c - q0] = U[r, c]
            left_n[i] = want - q0


def _request_lengths(i, rid, by_class, cls, lk, ok, prompt, output):  # pragma: no cover - compiled
    """Prompt and output length of request ``rid`` of environment ``i`` (its class's, or the table's)."""
    if by_class:
        c = cls[i, rid]
        return lk[c], ok[c]
    return np.int64(prompt[i, rid]), np.int64(output[i, rid])


def _batched_step(G, M, evict_all, m_track, horizon, max_budget, budget, skip, st, H, class_queue, by_class, lk, ok,
                  output, prompt, finish, evictions, cls, abnd, tokc, clsc, a_id, a_fin, rs, cal_n, cal_tok, dH,
                  bin_last, bin_j, edges, out, need, xcnt):  # pragma: no cover - compiled
    """Slot ``t`` of every environment of a :class:`~flowgym.sim.batched.BatchedEngine` (phases 2-5, then 1).

    The same integers as ``BatchedEngine.serve`` followed by ``arrive`` for the
    environments not in ``skip`` whose clock is below ``horizon``. Writes the slot's
    figures to ``out`` (rows of ``BatchedEngine.OUT_ROWS``). An environment whose
    next slot needs a new workload chunk is listed in ``need`` (its arrivals are
    left to the caller). ``xcnt`` is an ``(N, K)`` scratch of zeros (left zero).

    Returns ``n >= 0`` (done; ``need[:n]`` lists the environments waiting for a
    chunk), ``-1 - (2 * i + what)`` when environment ``i`` needs more room
    (``what`` 0: active set, 1: eviction stack), or ``-1 - 2 * N - i`` when
    ``budget[i]`` is negative or (``max_budget >= 0``) above ``max_budget``. Both are
    checked before any slot is served (only dead entries of active sets may
    have been dropped), so the caller grows the arrays and calls again.
    """
    # the rows of st (flowgym.sim.batched.STATE_ROWS)
    t, n_arrived, p, rs_n, n_active, held = st[0], st[1], st[2], st[3], st[4], st[5]
    qpt, tail, last_arr, gen_t, chunk_t0 = st[6], st[7], st[8], st[9], st[10]
    N = t.size
    K = H.shape[1]
    A = a_id.shape[1]
    S = rs.shape[1]
    R = cal_n.size // N
    mask = R - 1
    NK = N * K
    for i in range(N):  # a negative budget is always refused; above max_budget when it is given (>= 0)
        if budget[i] < 0 or (max_budget >= 0 and budget[i] > max_budget):
            return -1 - 2 * N - i
    for i in range(N):  # room for this slot's admissions and evictions
        ti = t[i]
        k = min(budget[i], rs_n[i] + n_arrived[i] - p[i])
        if tail[i] + k > A:  # drop dead entries, keeping activation order (no branch per entry)
            w = 0
            for c in range(tail[i]):
                f = a_fin[i, c]
                a_id[i, w] = a_id[i, c]
                a_fin[i, w] = f
                w += f > ti
            tail[i] = w
            if w + k > A:
                return -1 - 2 * i
        if rs_n[i] + n_active[i] + k > S:
            return -2 - 2 * i
    for i in range(N):
        need[i] = 0
        ti = t[i]
        nq = rs_n[i] + n_arrived[i] - p[i]
        k = min(budget[i], nq)
        out[0, i] = ti
        out[8, i] = last_arr[i]
        out[9, i] = nq + n_active[i]
        # ---- admit: evicted first (top of the stack), then fresh ids p, p+1, ...
        kr = rs_n[i]
        if k < kr:
            kr = k
        pos = tail[i]
        psum = 0
        top = 0  # admitted requests cross into bins 1..top (all at the same slots: they start together)
        for r in range(k):
            if r < kr:
                rid = rs[i, rs_n[i] - 1 - r]
            else:
                rid = p[i] + (r - kr)
            ln, o = request_lengths(i, rid, by_class, cls, lk, ok, prompt, output)
            fin = ti + o
            finish[i, rid] = fin
            a_id[i, pos] = rid
            a_fin[i, pos] = fin
            pos += 1
            c = ((G + o) & mask) * N + i
            cal_n[c] += 1
            cal_tok[c] += ln + o
            bl = bin_last[o]
            dH[c * K + bl] -= 1
            xcnt[i, bl] += 1
            if bl > top:
                top = bl
            psum += ln
            if m_track > 0:
                class_queue[i, cls[i, rid]] -= 1
        n_x = 0
        for kk in range(top, 0, -1):  # n_x: admitted with bin_last >= kk cross into bin kk at G + edges[kk]
            n_x += xcnt[i, kk]
            xcnt[i, kk] = 0
            x = ((G + edges[kk]) & mask) * NK + i * K + kk
            dH[x] += n_x
            dH[x - 1] -= n_x
        xcnt[i, 0] = 0
        rs_n[i] -= kr
        p[i] += k - kr
        H[i, 0] += k
        held[i] += psum
        qpt[i] -= psum
        tail[i] = pos
        n_active[i] += k
        # ---- evict on overflow: the newest actives covering the excess (lifo), or everyone (all)
        demand = held[i] + n_active[i]
        ev = 0
        wasted = 0
        if demand > M:
            excess = demand - M
            covered = 0
            freed = 0
            ptok = 0
            c = tail[i] - 1
            while c >= 0:
                if a_fin[i, c] > ti:
                    if covered >= excess and not evict_all:
                        break
                    vid = a_id[i, c]
                    lb, vo = request_lengths(i, vid, by_class, cls, lk, ok, prompt, output)
                    j = ti - (a_fin[i, c] - vo)  # tokens generated so far
                    covered += lb + j + 1
                    a_fin[i, c] = -1
                    finish[i, vid] = -1
                    evictions[i, vid] += 1
                    gs = G - j  # global slot of its activation
                    cc = ((gs + vo) & mask) * N + i
                    cal_n[cc] -= 1
                    cal_tok[cc] -= lb + vo
                    bl = bin_last[vo]
                    bj = bin_j[j]
                    dH[cc * K + bl] += 1
                    H[i, bj] -= 1
                    for kk in range(bj + 1, bl + 1):
                        x = ((gs + edges[kk]) & mask) * NK + i * K + kk
                        dH[x] -= 1
                        dH[x - 1] += 1
                    rs[i, rs_n[i]] = vid  # the oldest victim ends on top
                    rs_n[i] += 1
                    ptok += lb
                    freed += lb + j
                    wasted += j
                    ev += 1
                    if m_track > 0:
                        class_queue[i, cls[i, vid]] += 1
                c -= 1
            tail[i] = c + 1  # nothing alive beyond
            qpt[i] += ptok
            n_active[i] -= ev
            held[i] -= freed
            demand = held[i] + n_active[i]
        # ---- decode
        g1 = ((G + 1) & mask) * N + i
        nd = cal_n[g1]
        held[i] = demand - cal_tok[g1]
        cal_n[g1] = 0
        cal_tok[g1] = 0
        n_active[i] -= nd
        hb = g1 * K
        for kk in range(K):
            H[i, kk] += dH[hb + kk]
            dH[hb + kk] = 0
        out[1, i] = demand
        out[2, i] = k
        out[3, i] = ev
        out[4, i] = wasted
        out[5, i] = nd
        out[6, i] = rs_n[i] + n_arrived[i] - p[i]
        out[7, i] = n_active[i]
        tn = ti + 1
        t[i] = tn
        # ---- phase 1 of the next slot: its arrivals
        if not skip[i] and tn < horizon:
            if tn >= gen_t[i]:
                need[i] = 1  # its chunk is drawn by the caller
            else:
                col = tn - chunk_t0[i]
                lo = abnd[i, tn]
                hi = abnd[i, tn + 1]
                n_arrived[i] = hi
                qpt[i] += tokc[i, col + 1] - tokc[i, col]
                last_arr[i] = hi - lo
                for c in range(m_track):
                    class_queue[i, c] += clsc[i, col + 1, c] - clsc[i, col, c]
    n_need = 0
    for i in range(N):  # flags to a list (n_need <= i: nothing unread is overwritten)
        if need[i]:
            need[n_need] = i
            n_need += 1
    return n_need


def _batched_projection(st, G, cal_n, cal_tok, hmap, hw, out):  # pragma: no cover - compiled
    """``out[i, j] = D_{t + hmap[j]}`` of environment ``i`` (``BatchedEngine.projected_usage``), from the rings."""
    held, n_active = st[5], st[4]
    N = held.size
    mask = cal_n.size // N - 1
    act = n_active.copy()
    sum_act = np.zeros(N, np.int64)
    tok = np.zeros(N, np.int64)
    for j in range(hmap.size):
        if hmap[j] == 0:
            for i in range(N):
                out[i, j] = held[i] + act[i]
    for h in range(1, hw + 1):
        row = ((G + h) & mask) * N
        for i in range(N):
            sum_act[i] += act[i]  # sum over u < h of the active count at t + u
            act[i] -= cal_n[row + i]
            tok[i] += cal_tok[row + i]
        for j in range(hmap.size):
            if hmap[j] == h:
                for i in range(N):
                    out[i, j] = held[i] + sum_act[i] - tok[i] + act[i]


def _vector_observe(st, H, class_queue, m_obs, skip, horizon, update, rate, alpha, M, qc, qtc, c_hist, c_rate, c_cls,
                    v, out, w, reward, kv, flags):
    # pragma: no cover - compiled
    """Observation rows ``v`` of a vector env; when ``update``, also the step's other outputs.

    These are the arrival-rate average, ``reward``, ``kv`` (usage over ``M``) and the
    rows of ``flags``: terminated (never), truncated (``t >= horizon``, not in ``skip``) and overflow
    (an eviction). The same floats as ``FlowControlVectorEnv``'s numpy code (no
    fused operations). Returns the number of truncated environments (0 without ``update``).
    """
    t, n_arrived, p, rs_n, n_active, held = st[0], st[1], st[2], st[3], st[4], st[5]
    qpt, last_arr = st[6], st[8]
    N = held.size
    K = H.shape[1]
    n_trunc = 0
    for i in range(N):
        if update:
            trunc = t[i] >= horizon and not skip[i]  # a skipped environment is resetting, not truncated
            n_trunc += trunc
            if not skip[i] and t[i] < horizon:
                rate[i] += (last_arr[i] - rate[i]) * alpha
            reward[i] = -(w[0] * out[9, i] + w[1] * out[4, i] + w[2] * out[3, i] - w[3] * out[5, i])
            kv[i] = out[1, i] / M
            flags[0, i] = False
            flags[1, i] = trunc
            flags[2, i] = out[3, i] > 0
        v[i, 0] = held[i] / M
        v[i, 1] = min(float(rs_n[i] + n_arrived[i] - p[i]), qc)
        v[i, 2] = n_active[i]
        v[i, 3] = min(qpt[i] / M, qtc)
        for k in range(K):
            v[i, c_hist + k] = H[i, k]
        v[i, c_rate] = min(rate[i], qc)
        for c in range(m_obs):
            v[i, c_cls + c] = min(float(class_queue[i, c]), qc)
    return n_trunc



#: The compiled kernels (``None`` until :func:`load`).
fill_range: Any = None
admit_lane: Any = None
count_classes: Any = None
histogram_into: Any = None
projected_demand: Any = None
poisson_chunk: Any = None
batched_step: Any = None
vector_observe: Any = None
poisson_chunks: Any = None
batched_projection: Any = None
request_lengths: Any = None
poisson_counts: Any = None
poisson_counts2: Any = None
poisson_place: Any = None
poisson_step: Any = None
pcg_step: Any = None
pcg_double: Any = None
pcg_fill: Any = None
pcg_fill2: Any = None
evict: Any = None
lane_merge: Any = None
future_fit: Any = None
run_timed: Any = None


def load() -> None:
    """Import numba and set up the kernels (compiled on first call); raises ``RuntimeError`` without numba."""
    global _numba, fill_range, admit_lane, count_classes, histogram_into, projected_demand
    global poisson_chunk, batched_step, vector_observe, poisson_chunks, batched_projection, request_lengths
    global evict, lane_merge, future_fit, run_timed
    global poisson_counts, poisson_counts2, poisson_place, poisson_step, pcg_step, pcg_double, pcg_fill, pcg_fill2
    if _numba is not None:
        return
    try:
        import numba
    except ImportError:
        raise RuntimeError("the compiled kernels need numba: pip install -e '.[fast]' in the flowgym checkout") from None
    njit = numba.njit(cache=True, nogil=True)
    fill_range, admit_lane, count_classes = njit(_fill_range), njit(_admit_lane), njit(_count_classes)
    histogram_into, projected_demand = njit(_histogram_into), njit(_projected_demand)
    evict = njit(_evict)
    lane_merge, future_fit = njit(_lane_merge), njit(_future_fit)
    run_timed = njit(_run_timed)  # calls admit_lane, evict, lane_merge, future_fit (globals resolved when it compiles)
    request_lengths = njit(_request_lengths)  # called by batched_step (a global resolved when it compiles)
    batched_step, vector_observe = njit(_batched_step), njit(_vector_observe)
    from llvmlite import ir
    from numba.extending import intrinsic

    pcg_step = _make_pcg_step(intrinsic, numba.types, ir)
    pcg_double = njit(_pcg_double)  # called by pcg_fill(2) (globals resolved when they compile)
    pcg_fill = njit(_pcg_fill)
    pcg_fill2 = njit(_pcg_fill2)
    poisson_step = njit(_poisson_step)  # called by poisson_counts2 (a global resolved when it compiles)
    poisson_counts, poisson_counts2 = njit(_poisson_counts), njit(_poisson_counts2)
    poisson_place = njit(_poisson_place)  # the three are called by poisson_chunk(s) (globals resolved when compiled)
    poisson_chunk, poisson_chunks = njit(_poisson_chunk), njit(_poisson_chunks)
    batched_projection = njit(_batched_projection)
    _numba = numba


if ENABLED:
    load()
