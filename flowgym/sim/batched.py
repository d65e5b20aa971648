"""A batched engine: ``N`` independent copies of :class:`~flowgym.sim.engine.Engine` in one set of arrays.

:class:`BatchedEngine` runs the slot semantics of ``docs/model.md`` for ``N``
environments at once. Two paths compute the same integers:

* compiled (numba, ``flowgym[fast]``; :attr:`BatchedEngine.jit`, the default
  when numba is installed): one kernel call per slot for all environments
  (:func:`flowgym.sim.kernels.batched_step`: admission, eviction, decode and the next
  slot's arrivals), and, for :class:`~flowgym.sim.workloads.MultiClassPoisson`
  workloads with every rate below 10, a compiled sampler that turns the
  generator's own uniforms into the requests ``MultiClassPoisson.sample``
  draws (:func:`flowgym.sim.kernels.poisson_chunk`);
* numpy: a fixed number of numpy operations per slot whatever ``N`` (no Python
  loop over environments in the slot).

Either way workload chunks are drawn environment by environment, every 256
slots, from each environment's own generator, so the requests are exactly
those the single engine draws from the same generator.

Supported: the discrete-time model (unit slots) with

* a :class:`~flowgym.sim.workloads.MultiClassPoisson` or an endless
  :class:`~flowgym.sim.workloads.IIDPoisson` workload whose requests always fit
  (``l + o <= M`` for every possible request, so nothing is ever rejected),
* the ``fifo`` queue order and a global budget ``B_t``,
* ``lifo`` or ``all`` eviction.

:func:`unsupported` names the first argument outside this set; the vector
environment (:mod:`flowgym.envs.vector`) then falls back to single engines.

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

Memory: per environment, the request table of the current episode (int32:
class, finish slot and eviction count per request, plus prompt and output
lengths unless the workload has classes, whose lengths are the class's), the
first id of each slot, the active set (id and finish slot, int32, compacted
when full) and two rings of ``R`` slots (``R`` the smallest power of two above
the longest output): ``R * (1 + K)`` int32 and ``R`` int64 (tokens due) for
``K`` histogram bins. int32 bounds an episode to fewer than ``2**31`` requests
per environment and to slots below ``2**31 - max(o)``; beyond either the engine
raises ``OverflowError`` naming the value. Only what
a slot touches is written per request (the table's finish and eviction columns
are not initialised: ids not yet admitted are masked in :meth:`request_log`),
which keeps the memory traffic of a slot small.

This module does not import Gymnasium.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

import numpy as np

from flowgym.sim import kernels
from flowgym.sim._checks import calendar_span
from flowgym.sim.workloads import CHUNK_SLOTS, IIDPoisson, MultiClassPoisson, Workload, make_workload

__all__ = ["BatchedEngine", "BudgetError", "unsupported", "SUPPORTED_EVICTIONS", "check_kernels"]

_I64 = np.int64
_I32 = np.int32

_NO_HORIZON = np.iinfo(np.int64).max
_I32_MAX = int(np.iinfo(np.int32).max)
_U64_MASK = (1 << 64) - 1


class BudgetError(ValueError):
    """A budget passed to :meth:`BatchedEngine.advance` is outside ``0..max_budget``."""


#: Per-environment counters, in the order of the rows of ``BatchedEngine.counters``: the slot
#: ``t``, the arrived requests, the next fresh (never admitted) id ``p``, the evicted
#: requests waiting (a stack), the active requests, the tokens held, the prompt tokens
#: queued, the end of the active set, the arrivals of slot ``t``, the first slot of the
#: next workload chunk, the first slot of the current one, and the requests drawn.
STATE_ROWS = ("t", "n_arrived", "p", "rs_n", "n_active", "held", "queued_prompt_tokens", "tail", "last_arrivals",
              "gen_t", "chunk_t0", "n_req")

def _budget_error(budget: np.ndarray, i: int, max_budget: int | None) -> BudgetError:
    upper = "" if max_budget is None else max_budget
    return BudgetError(f"budget {int(budget[i])} of environment {i} is not in 0..{upper}")


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
    ``Generator`` each, then call :meth:`advance` once per slot (or alternate
    :meth:`serve` and :meth:`arrive`, the numpy path; a reset includes slot 0's
    arrivals). Per-environment state is exposed as arrays of length ``N``
    (``t``, ``held``, ``n_active``, :attr:`n_queued`, ...): the rows of
    :attr:`counters` (:data:`STATE_ROWS`), updated in place. :attr:`jit`
    chooses the compiled path (read at each call; the sampler is chosen per
    environment at its reset); results do not depend on it (given a fresh
    generator per episode: see :meth:`reset`).
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
        calendar_span(M, max_o)  # refuses, by name, outputs too long to schedule (before allocating)
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

        # per environment: the rows of one array (the compiled kernels take it whole); the
        # attributes are views of its rows and are only ever updated in place
        self.counters = np.zeros((len(STATE_ROWS), N), _I64)
        for r, name in enumerate(STATE_ROWS):
            setattr(self, name, self.counters[r])
        self.H = np.zeros((N, K), _I64)  # generated-tokens histogram at the decision point
        self.class_queue = np.zeros((N, max(self.m, 1)), _I64)

        # request table (current episode), ids are per environment. With class workloads
        # (MultiClassPoisson) a request's lengths are its class's, so only the class is
        # stored; other workloads store prompt and output lengths (class -1).
        self._by_class = isinstance(self.workload, MultiClassPoisson)
        if self._by_class:
            wl = self.workload
            assert isinstance(wl, MultiClassPoisson)
            self._lk = wl.classes[:, 0].astype(_I64)
            self._ok = wl.classes[:, 1].astype(_I64)
        else:
            self._lk = self._ok = np.zeros(1, _I64)
        self._no_table = np.zeros((N, 1), _I32)
        self._kargs: tuple[Any, ...] | None = None
        self.C = 0
        self._alloc_table(4096)
        CH = CHUNK_SLOTS
        self.T = 0
        self._alloc_bounds(4 * CH)
        self._tokc = np.zeros((N, CH + 1), _I64)  # prompt tokens arrived before each slot of the chunk
        self._clsc = np.zeros((N, CH + 1, max(self.m, 1)), _I64) if self.track_class_queue else None
        self._rngs: list[np.random.Generator | None] = [None] * N
        #: use the compiled kernels of :mod:`flowgym.sim.kernels` (numba) for the slot and, for
        #: :class:`~flowgym.sim.workloads.MultiClassPoisson` workloads with every rate below 10,
        #: the workload chunks (default: ``flowgym.sim.kernels.ENABLED``). Same results either way.
        self.jit: bool = kernels.ENABLED
        # compiled chunk sampler, chosen per environment at its reset (its uniforms: _left, _pcg below)
        self._fast_ok = self._by_class and bool(np.all(self.workload.rates < 10))  # type: ignore[attr-defined]
        self._fast = np.zeros(N, bool)
        # uniforms drawn, not yet used: row i holds env i's first _left_n[i] (the next of its stream)
        self._left = np.zeros((N, 0))
        self._left_n = np.zeros(N, _I64)
        # compiled sampler: a copy of each generator's PCG64 state (high, low words of state, then inc)
        self._pcg = np.zeros((N, 4), np.uint64)
        self._uscratch = np.zeros(0)
        self._ugroup = np.zeros((16, 0))
        if self._fast_ok:
            rates = self.workload.rates  # type: ignore[attr-defined]
            self._nz = np.flatnonzero(rates > 0).astype(_I64)  # classes that draw (a zero rate draws nothing)
            self._enlam = np.array([math.exp(-float(rates[k])) for k in self._nz])  # as numpy's C code: exp(-lam)
            # uniforms one chunk uses on average: lambda + 1 per Poisson draw (rate > 0), one per request
            per_slot = float(np.sum(np.where(rates > 0, rates + 1.0, 0.0)) + rates.sum())
            self._u_chunk = int(per_slot * CHUNK_SLOTS) + 64
            # uniforms drawn before a chunk: its mean plus 6 standard deviations (a chunk uses
            # 2 X + (classes drawing) per slot, X ~ Poisson(sum of rates)); rarely too few (then redone)
            self._u_want = self._u_chunk + int(12 * math.sqrt(float(rates.sum()) * CHUNK_SLOTS)) + 64
            lam = float(rates.sum()) * CHUNK_SLOTS  # requests per chunk: Poisson(lam)
            self._req_chunk = int(lam + 8 * math.sqrt(lam) + 16)
        self._need = np.zeros(N, _I64)
        self._xcnt = np.zeros((N, K), _I64)
        self._no_skip = np.zeros(N, bool)
        self._dummy_clsc = np.zeros((1, 1, 1), _I64)

        # active set: per env, entries [0, tail) in activation order (id and finish slot);
        # alive iff fin > t (evicted entries get fin = -1)
        self.A = 512
        self._a_id = np.zeros((N, self.A), _I32)
        self._a_fin = np.full((N, self.A), -1, _I32)
        # evicted requests waiting: ids, top of stack (smallest id) at rs_n - 1
        self.S = 64
        self._rs = np.zeros((N, self.S), _I64)

        # rings over the global clock: completions and histogram changes
        self._cal_n = np.zeros(R * N, _I32)
        self._cal_tok = np.zeros(R * N, _I64)  # l + o of many requests: may pass 2**31
        self._dH = np.zeros(R * N * K, _I32)  # net change of H at each slot

    # ------------------------------------------------------------------ storage

    def _alloc_table(self, C: int) -> None:
        """Room for ``C`` requests per environment (copying the current table)."""
        N, c0 = self.N, self.C
        if C > _I32_MAX:
            raise OverflowError(f"{C} requests in one episode: the batched engine stores ids as int32 "
                                f"(at most {_I32_MAX}; use a shorter horizon)")
        names = ["_cls", "_finish", "_evictions"] + ([] if self._by_class else ["_prompt", "_output"])
        for name in names:
            new = np.zeros((N, C), _I32)
            if c0:
                new[:, :c0] = getattr(self, name)
            setattr(self, name, new)
        if self._by_class:
            self._prompt = self._output = self._no_table
        self.C = C
        self._kargs = None

    def _alloc_bounds(self, T: int) -> None:
        """Room for the arrivals of ``T`` slots per environment: ``_abnd[i, s]`` is the first id arriving at slot ``s``."""
        new = np.zeros((self.N, T + 1), _I32)
        if self.T:
            new[:, : self.T + 1] = self._abnd
        self._abnd = new
        self.T = T
        self._kargs = None

    def _room_for_slots(self, t1: int) -> None:
        """Room for the arrivals of slots below ``t1`` (refusing slots int32 cannot hold)."""
        if t1 + self.max_o > _I32_MAX:
            raise OverflowError(f"slot {t1}: the batched engine stores slots as int32; episodes must end before "
                                f"slot {_I32_MAX - self.max_o} (use a shorter horizon)")
        if t1 > self.T:
            self._alloc_bounds(max(2 * self.T, t1))

    def _lengths(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output lengths (int64) of the requests at flat table positions ``env * C + id``."""
        if self._by_class:
            c = self._cls.ravel()[flat]
            return self._lk[c], self._ok[c]
        return self._prompt.ravel()[flat].astype(_I64), self._output.ravel()[flat].astype(_I64)

    def _grow_active(self, need: int) -> None:
        A = max(2 * self.A, need)
        for name, fill in (("_a_id", 0), ("_a_fin", -1)):
            old = getattr(self, name)
            new = np.full((self.N, A), fill, _I32)
            new[:, : self.A] = old
            setattr(self, name, new)
        self.A = A
        self._kargs = None

    def _grow_stack(self, S: int) -> None:
        """Room for ``S`` evicted requests waiting per environment."""
        rs = np.zeros((self.N, S), _I64)
        rs[:, : self.S] = self._rs
        self._rs, self.S = rs, S
        self._kargs = None

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
        for name in ("_a_id", "_a_fin"):
            flat = getattr(self, name).reshape(-1)  # a view: the arrays are contiguous
            flat[dst] = flat[src]  # the right side is gathered first, so overlap is safe
        self.tail[rows] = cnt

    # ------------------------------------------------------------------ reset and workload

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (also ``copy.deepcopy``): the counters' rows become views of :attr:`counters` again."""
        self.__dict__.update(state)
        for r, name in enumerate(STATE_ROWS):  # pickled as separate arrays, the kernels update counters
            setattr(self, name, self.counters[r])
        self._kargs = None

    def reset(self, envs: np.ndarray | Sequence[int], rngs: Sequence[np.random.Generator]) -> None:
        """Empty environments ``envs`` and start them at slot 0 with slot 0's arrivals queued.

        ``rngs[i]`` draws the workload of ``envs[i]`` (as :meth:`Engine.reset`'s generator):
        the same requests as :class:`~flowgym.sim.engine.Engine` draws from it. The engine owns
        it for the episode and leaves it in a state that depends on the path: do not share
        one generator between environments, draw from it elsewhere during the episode, or
        reuse it after the episode without re-seeding it (the vector environment re-seeds
        each environment's generator at its reset). The compiled sampler (numba, a
        ``MultiClassPoisson`` workload with rates below 10 and a PCG64 generator, numpy's
        default) draws from a copy of the generator's state, in blocks, ahead of use; the
        generator itself is not advanced. The numpy path advances it.
        """
        idx = np.asarray(envs, dtype=_I64).ravel()
        if len(rngs) != idx.size:
            raise ValueError(f"rngs must hold one generator per environment reset ({idx.size}), got {len(rngs)}")
        if idx.size == 0:
            return
        # eviction counts are the only table column that must start at 0 (ids >= n_req are 0 already)
        used = int(self.n_req[idx].max())
        if used:
            self._evictions[idx, :used] = 0
        self.counters[:, idx] = 0  # every row of STATE_ROWS
        self.H[idx] = 0
        self.class_queue[idx] = 0
        self._dH.reshape(self.R, self.N, self.K)[:, idx, :] = 0
        self._cal_n.reshape(self.R, self.N)[:, idx] = 0
        self._cal_tok.reshape(self.R, self.N)[:, idx] = 0
        fast = bool(self.jit) and self._fast_ok
        if fast:
            kernels.load()
        for i, rng in zip(idx.tolist(), rngs):
            self._rngs[i] = rng
            # the compiled sampler continues the generator's PCG64 stream from a copy of its state
            self._fast[i] = fast and isinstance(rng.bit_generator, np.random.PCG64)
            if self._fast[i]:
                st = rng.bit_generator.state["state"]
                s_, inc = st["state"], st["inc"]
                self._pcg[i] = (s_ >> 64, s_ & _U64_MASK, inc >> 64, inc & _U64_MASK)
        self._left_n[idx] = 0
        self.arrive(idx)

    def _generate_all(self, envs: np.ndarray) -> None:
        """:meth:`_generate` for ``envs``; those on the compiled sampler in groups of 16, one kernel call each."""
        fast = envs[self._fast[envs]]
        if fast.size < 2:
            for i in envs.tolist():
                self._generate(i)
            return
        for i in envs[~self._fast[envs]].tolist():
            self._generate(i)
        t1 = int(self.gen_t[fast].max()) + CHUNK_SLOTS
        self._room_for_slots(t1)
        need = int(self.n_req[fast].max()) + self._req_chunk  # room for a chunk, almost surely (else grown below)
        if need > self.C:
            self._alloc_table(max(2 * self.C, need))
        clsc = self._clsc if self._clsc is not None else self._dummy_clsc
        m_track = self.m if self.track_class_queue else 0
        res = np.empty(16, _I64)
        for g0 in range(0, fast.size, 16):
            grp = fast[g0 : g0 + 16]
            held = self._left_n[grp].tolist()
            # a chunk's worth and margin; more held over (after a retry) is used up first, nothing drawn on top
            want = max(self._u_want, *held)
            U = self._ugroup
            if U.shape[1] < want:
                U = self._ugroup = np.empty((16, want))
            self._hold(want)
            kernels.poisson_chunks(U, want, grp, self._pcg, self._left, self._left_n, self._nz, self._enlam, self._lk,
                                m_track, CHUNK_SLOTS, self.counters, self._cls, self._abnd, self._tokc, clsc, res)
            for r in np.flatnonzero(res[: grp.size] < 0).tolist():
                self._generate(int(grp[r]))  # rare: alone, from the same uniforms (held over: none is lost)

    def _hold(self, width: int) -> None:
        """Make room for ``width`` held-over uniforms per environment."""
        if self._left.shape[1] < width:
            left = np.zeros((self.N, max(width, 2 * self._left.shape[1])))
            left[:, : self._left.shape[1]] = self._left
            self._left = left

    def _generate(self, i: int) -> None:
        """Draw env ``i``'s next chunk of requests (exactly as :meth:`Engine._generate`)."""
        rng = self._rngs[i]
        assert rng is not None, "call reset() first"
        t0 = int(self.gen_t[i])
        t1 = t0 + CHUNK_SLOTS
        self._room_for_slots(t1)
        if self._fast[i]:
            self._generate_fast(i, t0)
            return
        req = self.workload.sample(rng, t0, t1)
        k = req.arrival.size
        base = int(self.n_req[i])
        if base + k > self.C:
            self._alloc_table(max(2 * self.C, base + k))
        s = slice(base, base + k)
        self._cls[i, s] = req.cls
        if not self._by_class:
            self._prompt[i, s] = req.prompt_len
            self._output[i, s] = req.output_len
        pos = np.searchsorted(req.arrival, np.arange(t0, t1 + 1), side="left")
        self._abnd[i, t0 : t1 + 1] = base + pos
        tok = np.zeros(k + 1, _I64)
        np.cumsum(req.prompt_len, out=tok[1:])
        self._tokc[i] = tok[pos]
        if self.track_class_queue:
            onehot = np.zeros((k + 1, self.m), _I64)
            onehot[np.arange(1, k + 1), req.cls] = 1
            self._clsc[i] = np.cumsum(onehot, axis=0)[pos]  # type: ignore[index]
        self.n_req[i] = base + k
        self.chunk_t0[i] = t0
        self.gen_t[i] = t1

    def _generate_fast(self, i: int, t0: int) -> None:
        """:meth:`_generate` with the compiled sampler (:func:`flowgym.sim.kernels.poisson_chunk`).

        ``MultiClassPoisson.sample`` draws, for rates below 10, only doubles of
        ``rng`` (Poisson by the multiplication method, then the shuffle's uniforms),
        one ``next_double`` each, the same as ``rng.random``. So the uniforms are
        drawn in blocks, as ``rng.random`` would draw them (its PCG64 stream,
        continued from the copy of its state taken at reset: :func:`flowgym.sim.kernels.pcg_fill`),
        and the kernel uses them in that order: the requests are those the numpy
        sampler draws from the same generator. The block is drawn into one scratch
        buffer shared by all environments (still in the CPU cache), after the
        uniforms env ``i`` had left over from its previous chunk; what this chunk
        leaves over is kept for the next.
        """
        base = int(self.n_req[i])
        t1 = t0 + CHUNK_SLOTS
        n_held = int(self._left_n[i])
        want = max(self._u_want, n_held)  # a chunk's worth and margin (held-over uniforms first)
        if self._uscratch.size < want:
            self._uscratch = np.empty(want)
        buf = self._uscratch
        buf[:n_held] = self._left[i, :n_held]
        end = want
        kernels.pcg_fill(self._pcg, i, buf, n_held, end)  # the generator's stream, after the uniforms held
        while True:
            clsc = self._clsc[i] if self._clsc is not None else self._dummy_clsc[0]
            res = kernels.poisson_chunk(
                buf, 0, end, self._nz, self._enlam, self._lk, self.m if self.track_class_queue else 0, CHUNK_SLOTS,
                base, self._cls[i], self._abnd[i, t0 : t1 + 1], self._tokc[i], clsc)
            if res >= 0:
                break
            if res == -1:  # out of uniforms: draw more after those held and start the chunk again
                grown = np.empty(2 * end)
                grown[:end] = buf[:end]
                kernels.pcg_fill(self._pcg, i, grown, end, grown.size)
                self._uscratch = buf = grown
                end = grown.size
            else:
                self._alloc_table(max(2 * self.C, -2 - res))
        self._hold(end - res)
        self._left[i, : end - res] = buf[res:end]
        self._left_n[i] = end - res
        self.n_req[i] = int(self._abnd[i, t1])
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
            self._generate_all(which)
        if envs is None:
            rows = self._ar
            col = t - self.chunk_t0
        else:
            rows = envs
            col = t - self.chunk_t0[envs]
        lo = self._abnd[rows, t].astype(_I64)
        hi = self._abnd[rows, t + 1].astype(_I64)
        tok = self._tokc[rows, col + 1] - self._tokc[rows, col]
        if envs is None:
            self.n_arrived[:] = hi
            self.queued_prompt_tokens += tok
            self.last_arrivals[:] = hi - lo
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
        and ``active`` (the fields of :class:`~flowgym.sim.engine.SlotStats`).
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
            l, o = self._lengths(flat)
            ts = t[env]
            fin = ts + o
            self._finish.ravel()[flat] = fin
            apos = env * self.A + pos
            self._a_id.ravel()[apos] = ids
            self._a_fin.ravel()[apos] = fin
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
        self.held[:] = demand
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
        self.t += 1  # (t is this array: its copy is in the figures above)
        self.G = G + 1
        return out

    #: Rows of the array :meth:`advance` returns.
    OUT_ROWS = ("t", "usage", "admitted", "evicted", "wasted_tokens", "completed", "queue_len", "active",
                "arrived", "in_system")

    def advance(self, budget: np.ndarray, skip: np.ndarray | None = None, horizon: int | None = None,
                max_budget: int | None = None) -> np.ndarray:
        """Slot ``t`` of every environment, then the next slot's arrivals where the episode goes on.

        :meth:`serve` with ``budget`` (int64, shape ``(N,)``), then :meth:`arrive`
        for the environments not in ``skip`` (boolean, shape ``(N,)``) whose clock
        is below ``horizon``. Returns a fresh int64 array of shape
        ``(len(OUT_ROWS), N)``: the fields of :meth:`serve`, plus ``arrived`` (the
        arrivals slot ``t`` had) and ``in_system`` (waiting + active at the
        decision point). With :attr:`jit` this is one compiled pass
        (:func:`flowgym.sim.kernels.batched_step`); the numpy path gives the same integers.

        A negative budget, or with ``max_budget`` one above it, raises
        :class:`BudgetError` (naming the environment and the value) before anything changes.
        """
        N = self.N
        b = np.asarray(budget)
        if b.shape != (N,) or b.dtype.kind not in "iu":  # the compiled step trusts the shape (no bounds checks)
            raise ValueError(f"budget must be an integer array of shape ({N},), one per environment, got "
                             f"{b.dtype} values of shape {b.shape}")
        budget = b.astype(_I64, copy=False)
        hz = _NO_HORIZON if horizon is None else int(horizon)
        out = np.empty((len(self.OUT_ROWS), N), _I64)
        if not self.jit:
            out_of_range = budget < 0 if max_budget is None else (budget < 0) | (budget > max_budget)
            bad = np.flatnonzero(out_of_range)
            if bad.size:
                raise _budget_error(budget, int(bad[0]), max_budget)
            out[8] = self.last_arrivals
            out[9] = self.n_queued + self.n_active
            st = self.serve(budget)
            for r, name in enumerate(self.OUT_ROWS[:8]):
                out[r] = st[name]
            go = self.t < hz
            if skip is not None:
                go &= ~skip
            if go.all():
                self.arrive()
            elif go.any():
                self.arrive(np.flatnonzero(go))
            return out
        kernels.load()
        skip_a = self._no_skip if skip is None else skip
        mb = -1 if max_budget is None else int(max_budget)
        while True:
            kargs = self._kargs
            if kargs is None:  # the arrays the kernel takes (rebuilt after any of them grows)
                clsc = self._clsc if self._clsc is not None else self._dummy_clsc
                kargs = self._kargs = (
                    self.counters, self.H, self.class_queue, self._by_class, self._lk, self._ok, self._output,
                    self._prompt, self._finish, self._evictions, self._cls, self._abnd, self._tokc, clsc, self._a_id,
                    self._a_fin, self._rs, self._cal_n, self._cal_tok, self._dH, self._bin_last, self._bin_j,
                    self.edges)
            res = kernels.batched_step(self.G, self.M, self.evict_all, self.m if self.track_class_queue else 0, hz, mb,
                                    budget, skip_a, *kargs, out, self._need, self._xcnt)
            if res >= 0:
                break
            if res <= -1 - 2 * N:  # a budget out of range (checked before anything changed)
                raise _budget_error(budget, -1 - 2 * N - res, max_budget)
            i, what = divmod(-1 - res, 2)  # env i needs room (no slot was served yet)
            if what == 0:
                self._grow_active(2 * self.A)
            else:
                self._grow_stack(2 * self.S + int(self.rs_n[i] + self.n_active[i] + budget[i]))
        self.G += 1
        if res:
            self.arrive(self._need[:res].copy())
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
            fin = self._a_fin.ravel()[flat].astype(_I64)
            alive = valid & (fin > t_r[:, None])
            lb, o = self._lengths(rows[:, None] * self.C + self._a_id.ravel()[flat])
            st = fin - o  # activation slot (meaningful where alive)
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
            self._grow_stack(max(2 * self.S, top))
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
        if self.jit:
            kernels.load()
            out = np.empty((N, self.offsets.size), _I64)
            kernels.batched_projection(self.counters, self.G, self._cal_n, self._cal_tok,
                                    np.minimum(self.offsets, hw), hw, out)
            return out
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
        T = int(self.gen_t[i])
        arrival = np.repeat(np.arange(T, dtype=_I64), np.diff(self._abnd[i, : T + 1]))[:n]
        prompt, output = self._lengths(i * self.C + np.arange(n))
        finish = self._finish[i, :n].astype(_I64)
        finish[int(self.p[i]):] = -1  # never admitted (the table is not initialised there)
        finish[finish > self.t[i]] = -1
        return {
            "arrival": arrival,
            "prompt_len": prompt,
            "output_len": output,
            "cls": self._cls[i, :n].astype(_I64),
            "finish": finish,
            "evictions": self._evictions[i, :n].astype(_I64),
            "rejected": np.zeros(n, bool),
        }


def check_kernels() -> None:
    """Run every compiled kernel once on tiny inputs (compiles them; raises if numba cannot).

    The single-environment kernels directly, the batched ones and the compiled
    sampler through a small :class:`BatchedEngine` (kernels that only other kernels
    call are compiled inside their callers); does nothing without numba.
    """
    if not kernels.AVAILABLE:
        return
    kernels.load()
    z = np.zeros(8, np.int64)
    e = np.array([0, 2], np.int64)
    f32 = np.zeros(4, np.float32)
    kernels.fill_range(z, 0, 0, 0)
    kernels.admit_lane(z, 0, 0, z, z, z, 0, 0, z, z, z, z, z)
    kernels.count_classes(z, 0, 0, z, z)
    kernels.histogram_into(z, z, 0, 0, 0, e, f32, 0)
    kernels.projected_demand(0, 0, 0, 7, z, z, e, z)
    # the batched kernels, through a small batched engine (every one of them runs)
    eng = BatchedEngine(2, 400, {"kind": "poisson", "classes": [[2, 3], [4, 5]], "rates": 1.0},
                        projection_offsets=[0, 2])
    eng.jit = True
    eng.reset(np.arange(2), [np.random.default_rng(0), np.random.default_rng(1)])
    eng.advance(np.full(2, 2, np.int64), max_budget=4)
    eng.projected_usage()
    out = eng.advance(np.ones(2, np.int64))
    eng._generate(0)  # one environment's chunk alone (the single-stream sampler of retries)
    st, H = eng.counters, eng.H
    v = np.zeros((2, 4 + H.shape[1] + 1), np.float32)
    kernels.vector_observe(st, H, eng.class_queue, 0, np.zeros(2, bool), 10, True, np.zeros(2), 0.5, 400, 9.0, 1.0,
                           4, 4 + H.shape[1], 0, v, out, np.ones(4), np.zeros(2), np.zeros(2), np.zeros((3, 2), bool))
    # the compiled continuous-time episode (its evict, lane_merge and future_fit inside): one
    # short run of each admission rule on a tiny engine
    from flowgym.sim.admission import AdmissionRule
    from flowgym.sim.engine import Engine

    for rule in (AdmissionRule("fixed", budget=2), AdmissionRule("greedy", limit=300.0, max_count=4),
                 AdmissionRule("future-fit", max_count=4, lengths="bound", bound=20)):
        te = Engine(300, {"kind": "iid", "rate": 5.0, "timed": True,
                          "lengths": {"kind": "empirical", "pairs": [[10, 20]]}},
                    time_model={"kind": "linear", "c0": 0.05})
        te.jit = True
        te.reset(np.random.default_rng(0))
        te.arrive()
        te.run_rule(rule, horizon=20)
    # the eviction kernel as the stepped engine calls it (a cached run_timed holds its own copy):
    # three requests of 10 + 1 tokens in a 30-token cache, all admitted, one evicted
    se = Engine(30, {"kind": "trace", "arrival": [0, 0, 0], "prompt_len": [10, 10, 10], "output_len": [5, 5, 5]})
    se.jit = True
    se.reset(np.random.default_rng(0))
    se.arrive()
    se.serve(3)
