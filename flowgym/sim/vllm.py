"""The ``vllm-v1`` engine mode: a scheduler step faithful to vLLM's V1 scheduler.

The paper's token-level model (:class:`~flowgym.sim.engine.Engine`, ``engine="paper"``) stays
the default and unchanged. This mode replaces its admit / evict / decode phases by one
iteration of vLLM V1's ``Scheduler.schedule()`` (``vllm/v1/core/sched/scheduler.py``) over a
block-granular KV cache (``vllm/v1/core/kv_cache_manager.py``, ``KVCacheManager.allocate_slots``;
``vllm/v1/core/block_pool.py``, ``BlockPool.get_num_free_blocks``). One environment step is one
scheduler step (a slot, or one batch iteration in continuous time):

1. **Arrive** (unchanged): requests join the back of the waiting queue. A request that could
   could never fit (``ceil((l + o - 1 + lookahead) / block_size) > num_blocks``) is rejected: with a
   lookahead, exactly the requests longer than ``max_model_len`` (``M`` in whole blocks, less
   ``lookahead - 1``); with none (the default), a request of ``max_model_len + 1`` tokens is still
   served, as its last token is never stored (vLLM would refuse it). Its ``max_tokens`` keeps
   ``l + max_tokens`` within ``max_model_len`` where the request allows it (never below ``o``).
2. **Running requests first** (``schedule()``, "First, schedule the RUNNING requests"): in
   running order (admission order), each running request asks for its next tokens:
   ``num_tokens - num_computed_tokens`` (one for a decode, the rest of the prompt for a
   request still prefilling, capped by ``long_prefill_token_threshold``), within what is left
   of the per-step token budget ``max_num_batched_tokens``. Its blocks grow to
   ``ceil((num_computed + new + lookahead) / block_size)``. When the free blocks do not
   cover that, the scheduler **preempts** (``preempt_order="lifo"``: ``self.running.pop()``, the
   most recently admitted request, possibly the asking request itself): the victim's blocks
   are freed (``KVCacheManager.free``), ``num_computed_tokens = 0`` and it is put back
   at the **front** of the waiting queue (``self.waiting.prepend_request``). It keeps its
   output tokens (recompute preemption): once readmitted it rebuilds its cache with one
   (chunked) prefill of ``l + j`` tokens.
3. **Waiting requests** ("Next, schedule the WAITING requests"), only when the step
   preempted nobody (``if not preempted_reqs``): queue heads are admitted in order while
   ``len(running) < max_num_seqs``, token budget is left (a prompt longer than the rest is
   prefilled in chunks; with ``chunked_prefill=False`` it waits) and ``allocate_slots`` finds
   free blocks: the blocks of the whole sequence ``l + j`` must be free (``reserve_full_isl``,
   V1's ``full_sequence_must_fit`` gate, on by default) though only the first chunk's are
   allocated (``reserve_full_prompt=True``: the whole prompt's, as vLLM V0's
   ``BlockSpaceManager.can_allocate``); ``watermark`` keeps that fraction of all blocks free,
   while some request runs (V1's ``has_scheduled_reqs``). The first head that does not fit
   stops admission. The agent's action ``B_t`` bounds the number admitted this step; agents
   that need another eviction rule or queue order than vLLM's (``alpha-greedy``, ``a-min``,
   ``mc-sf``) are refused, naming the option.
4. **Execute**: every scheduled request computes its tokens; one whose computed tokens reach
   ``num_tokens`` samples its next output token (a prefill that completes samples the first
   one). A request reaching ``o`` output tokens finishes at the end of the step and frees its
   blocks.
5. **Record**: ``usage`` is the allocated blocks times ``block_size`` (KV tokens of cache in use,
   after preemption, before completions, as the paper counts it), plus the serving records of
   :data:`STEP_FIELDS` (``used_blocks`` after completions, as vLLM's ``kv_cache_usage``).

The rules follow vLLM's ``main`` at commit ``003df2961dd8830c317a61f9745ccd557da9fa06``
(``vllm/v1/core/sched/scheduler.py``, ``vllm/v1/core/kv_cache_manager.py``).

Continuous time charges each step through the latency model: ``P`` = prefill tokens scheduled
(first prefills, chunks and recompute prefills), ``D`` = decoding requests, ``K`` = their
context (``l + j``), ``B`` = requests scheduled.

**Bridge to the paper's model.** With ``block_size=1``, ``lookahead_tokens=1`` (a request
holds ``l + j + 1`` tokens while generating its ``j + 1``-th, as in ``docs/model.md``),
``max_num_seqs=None`` and ``max_num_batched_tokens=None`` (unlimited), ``admission="count"``
(the ``B_t`` queue heads start before the running requests are scheduled, as the paper
admits before evicting; no admission gate applies) and ``preemption="discard"`` (a preempted
request loses its output tokens), this mode reproduces the paper mode's request log exactly (``tests/test_vllm.py``):
LIFO popping while the running requests are served in order keeps the longest prefix of the
running list that fits, which is the paper's LIFO eviction. :data:`BRIDGE_OPTIONS` holds them.

Besides vLLM's order, ``preempt_order`` offers ``"least-progress"`` (SGLang's
``ScheduleBatch.retract_decode``, ``python/sglang/srt/managers/schedule_batch.py``: fewest output
tokens first, longest prompt first among ties), ``"least-computed"`` (fewest computed tokens
first: the least recompute) and ``"random"``; with these the victims are chosen from the whole
running list until the step fits, and a victim's token budget is not handed to others within
the step. ``requeue="back"`` puts victims at the back of the queue (SGLang:
``self.waiting_queue.extend(retracted_reqs)``).

State is struct-of-arrays: the request table of the base engine plus output tokens kept,
``max_tokens`` and token times; the running set as three int64 arrays in running order
(ids, computed tokens, blocks); the waiting queue as one or ``m`` :class:`Deque` lanes. A step
is a fixed number of numpy operations over the running set: no Python object per request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgym.sim._checks import MAX_COUNT, is_real
from flowgym.sim.engine import Engine, SlotStats
from flowgym.sim.metrics import metrics_at
from flowgym.sim.rules import Lane

__all__ = [
    "ENGINE_MODES",
    "VLLM_MODE",
    "VllmOptions",
    "VllmEngine",
    "BRIDGE_OPTIONS",
    "PREEMPT_ORDERS",
    "STEP_FIELDS",
    "default_max_tokens",
    "make_engine",
    "SERVING_TABLE_METRICS",
    "serving_metrics_at",
]

_I64 = np.int64
#: The engine modes: ``"paper"`` (the token-level model of ``docs/model.md``, the default) and
#: ``"vllm-v1"`` (:class:`VllmEngine`).
ENGINE_MODES = ("paper", "vllm-v1")
VLLM_MODE = "vllm-v1"
#: Victim orders of the ``vllm-v1`` mode.
PREEMPT_ORDERS = ("lifo", "least-progress", "least-computed", "random")
_BIG = 1 << 62
#: Per-step serving records of the ``vllm-v1`` mode (``VllmEngine.step_series()``; ``used_blocks`` after the
#: step's completions).
STEP_FIELDS = ("refused", "prefill_tokens", "decode_requests", "recomputed_tokens", "scheduled", "used_blocks",
               "generated")


def default_max_tokens(prompt_len: np.ndarray, output_len: np.ndarray, bound: int | None, M: int) -> np.ndarray:
    """The ``max_tokens`` of requests whose workload sets none.

    A client that sets no cap gets vLLM's default, ``max_model_len - prompt_len``; with a KV
    budget of ``M`` tokens that is ``M - l``. When the workload bounds its outputs (the paper's
    classes: the longest class output; a trace: its longest output) the cap is that bound,
    as a client that knows its application's longest answer would set it; never below the
    request's true output ``o`` (the cap bounds the output).
    """
    cap = (M - prompt_len) if bound is None else np.minimum(int(bound), M - prompt_len)
    return np.maximum(cap, output_len).astype(_I64)


@dataclass(frozen=True)
class VllmOptions:
    """Options of the ``vllm-v1`` engine mode, with vLLM's names and defaults where it has them.

    Pass them as ``engine_options`` (a mapping) to ``gym.make("FlowControl-v0",
    engine="vllm-v1", ...)``.
    """

    #: Tokens per KV block (vLLM ``--block-size``, 16 on GPUs). ``num_gpu_blocks = M // block_size``.
    block_size: int = 16
    #: Most running requests (``--max-num-seqs``, default 256); ``None``: unlimited.
    max_num_seqs: int | None = 256
    #: Per-step token budget (``--max-num-batched-tokens``; vLLM's default with chunked prefill is
    #: 2048); ``None``: unlimited.
    max_num_batched_tokens: int | None = 2048
    #: Largest prefill chunk of one request per step (``--long-prefill-token-threshold``); 0: none.
    long_prefill_token_threshold: int = 0
    #: Prefill long prompts in chunks (V1 always does). ``False``: a waiting request whose
    #: prompt exceeds the token budget left waits (admission stops there).
    chunked_prefill: bool = True
    #: ``"blocks"`` (vLLM): admit waiting heads that fit in free blocks, after the running
    #: requests, never on a step that preempted. ``"count"``: the ``B_t`` heads start before
    #: the running requests are scheduled, whatever the cache holds (the paper's admission; it
    #: checks no blocks, so ``watermark`` and ``reserve_full_prompt`` are refused with it and
    #: ``reserve_full_isl`` does not apply).
    admission: str = "blocks"
    #: vLLM V1's admission gate (``SchedulerConfig.scheduler_reserve_full_isl``, default ``True``;
    #: ``allocate_slots(full_sequence_must_fit=True)``): a waiting request is admitted only if
    #: the blocks of its whole current sequence, ``ceil((l + j) / block_size)`` (its prompt, plus
    #: the output tokens a preempted request kept), and the watermark fit in the free blocks;
    #: only its first chunk's blocks are allocated. ``False``: the first chunk alone must fit
    #: (vLLM V1 before the gate).
    reserve_full_isl: bool = True
    #: Admission allocates blocks for the whole prompt (vLLM V0 ``can_allocate``/``allocate``)
    #: instead of the first chunk only (V1 ``allocate_slots``).
    reserve_full_prompt: bool = False
    #: Fraction of all blocks admission keeps free (vLLM V1 ``SchedulerConfig.watermark``,
    #: default 0; ``watermark_blocks = int(watermark * num_blocks)``). As in V1's
    #: ``allocate_slots(has_scheduled_reqs=bool(self.running))`` it applies only while some request
    #: is running (one admitted earlier in the same step counts): the first admission into an
    #: empty cache ignores it.
    watermark: float = 0.0
    #: ``"recompute"`` (vLLM V1): a preempted request keeps its output tokens and is prefilled
    #: again over ``l + j``. ``"discard"``: it loses them (the paper's eviction).
    preemption: str = "recompute"
    #: Victim order: ``"lifo"`` (vLLM FCFS: ``running.pop()``), ``"least-progress"`` (SGLang
    #: ``retract_decode``), ``"least-computed"``, ``"random"``.
    preempt_order: str = "lifo"
    #: Where victims rejoin the queue: ``"front"`` (vLLM ``prepend_request``) or ``"back"`` (SGLang).
    requeue: str = "front"
    #: Extra KV slots allocated per scheduled request (vLLM ``num_lookahead_tokens`` of
    #: ``allocate_slots``, for speculative decoding; 0). 1 reproduces the paper's ``l + j + 1``.
    lookahead_tokens: int = 0
    #: ``max_tokens`` of requests whose workload sets none: ``"default"``
    #: (:func:`default_max_tokens`), ``"output"`` (the true output: a perfect client) or an
    #: integer cap. An integer is lowered to ``max_model_len - l`` where the prompt leaves less
    #: room (:attr:`VllmEngine.max_model_len`; as :func:`default_max_tokens` caps vLLM's default;
    #: vLLM's server would refuse such a request) and raised to the request's output ``o`` where
    #: smaller (the cap bounds the output).
    max_tokens: Any = "default"

    @classmethod
    def from_any(cls, options: VllmOptions | Mapping[str, Any] | None) -> VllmOptions:
        """Build from an instance or a mapping; ``ValueError`` naming an unknown or bad field."""
        if options is None:
            return cls()
        if isinstance(options, VllmOptions):
            opts = options
        elif isinstance(options, Mapping):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(options) - names)
            if unknown:
                raise ValueError(f"unknown engine_options {unknown} for engine 'vllm-v1'; valid: {sorted(names)}")
            opts = cls(**dict(options))
        else:
            raise ValueError(f"engine_options must be a mapping, got {type(options).__name__}")
        opts.validate()
        return opts

    def validate(self) -> None:
        """``ValueError`` naming the first bad field."""

        def pos_int(name: str, v: Any, none_ok: bool = False) -> None:
            if none_ok and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"engine_options {name} must be a positive integer{' or None' if none_ok else ''}, "
                                 f"got {v!r}")

        pos_int("block_size", self.block_size)
        pos_int("max_num_seqs", self.max_num_seqs, none_ok=True)
        pos_int("max_num_batched_tokens", self.max_num_batched_tokens, none_ok=True)
        t = self.long_prefill_token_threshold
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"engine_options long_prefill_token_threshold must be an integer >= 0, got {t!r}")
        la = self.lookahead_tokens
        if isinstance(la, bool) or not isinstance(la, (int, np.integer)) or la < 0:
            raise ValueError(f"engine_options lookahead_tokens must be an integer >= 0, got {la!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold",
                     "lookahead_tokens"):  # token and sequence counts: int64 sums of them must not wrap
            v = getattr(self, name)
            if v is not None and v > MAX_COUNT:
                raise ValueError(f"engine_options {name} must be at most 2**53, got {v!r}")
        for name in ("chunked_prefill", "reserve_full_isl", "reserve_full_prompt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"engine_options {name} must be True or False, got {getattr(self, name)!r}")
        w = self.watermark
        if not is_real(w) or not (0.0 <= w < 1.0):
            raise ValueError(f"engine_options watermark must be a fraction in [0, 1), got {w!r}")
        for name, valid in (("admission", ("blocks", "count")), ("preemption", ("recompute", "discard")),
                            ("preempt_order", PREEMPT_ORDERS), ("requeue", ("front", "back"))):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in valid:  # not np.array(['blocks'])
                raise ValueError(f"engine_options {name} must be one of {list(valid)}, got {getattr(self, name)!r}")
        mt = self.max_tokens
        if not ((isinstance(mt, str) and mt in ("default", "output"))
                or (isinstance(mt, (int, np.integer)) and not isinstance(mt, bool) and mt >= 1)):
            raise ValueError(f"engine_options max_tokens must be 'default', 'output' or a positive integer, got {mt!r}")
        if not isinstance(mt, str) and mt > MAX_COUNT:
            raise ValueError(f"engine_options max_tokens must be at most 2**53, got {mt!r}")
        if self.admission == "count" and self.max_num_batched_tokens is not None:
            raise ValueError("engine_options admission='count' starts the B_t heads whatever the step holds: it needs "
                             "max_num_batched_tokens=None (unlimited)")
        if self.admission == "count":  # count mode checks no blocks: these would be ignored silently
            if w != 0:
                raise ValueError(f"engine_options watermark={w!r} needs admission='blocks': admission='count' starts "
                                 "the B_t heads whatever the cache holds and keeps no blocks free")
            if self.reserve_full_prompt:
                raise ValueError("engine_options reserve_full_prompt=True needs admission='blocks': admission='count' "
                                 "starts the B_t heads whatever the cache holds and reserves no blocks")


#: The options under which ``vllm-v1`` reproduces the paper's model exactly (the bridge).
BRIDGE_OPTIONS: dict[str, Any] = {
    "block_size": 1,
    "lookahead_tokens": 1,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "chunked_prefill": False,
    "admission": "count",
    "preemption": "discard",
}


class Deque(Lane):
    """A FIFO lane that also takes ids at its front (preempted requests) or back, whatever their ids."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(keyed=False)

    def prepend(self, ids: np.ndarray) -> None:
        """Put ``ids`` (in this order) before the head."""
        k = ids.size
        if k == 0:
            return
        h, t = self.head, self.tail
        if h < k:  # re-lay with room in front
            n = t - h
            cap = max(self.buf.size, 2 * (n + k) + 64)
            buf = np.empty(cap, _I64)
            front = k + (cap - n - k) // 2
            buf[front : front + n] = self.buf[h:t]
            self.buf = self.kbuf = buf
            h, self.tail = front, front + n
        self.buf[h - k : h] = ids
        self.head = h - k

    def append(self, ids: np.ndarray) -> None:
        """Put ``ids`` (in this order) after the tail."""
        k = ids.size
        if k == 0:
            return
        self._reserve(k)
        self.buf[self.tail : self.tail + k] = ids
        self.tail += k


def _ceil_div(a: np.ndarray | int, b: int) -> Any:
    return -(-a // b)


class VllmEngine(Engine):
    """The ``vllm-v1`` engine mode (module docstring): an :class:`~flowgym.sim.engine.Engine`
    whose :meth:`serve` is one vLLM V1 scheduler step over a block-granular KV cache.

    Args:
        M: KV-cache budget in tokens; the cache holds ``num_blocks = M // block_size`` blocks.
        workload: as for :class:`~flowgym.sim.engine.Engine`.
        options: :class:`VllmOptions` or its mapping form.
        time_model, per_class, track_class_queue: as for :class:`~flowgym.sim.engine.Engine`.
        eviction: must be ``"lifo"`` (the victim order is ``options.preempt_order``).
        queue_order: must be ``"fifo"`` (vLLM's FCFS policy).
        record: must be ``"full"``.

    The per-class budgets of Algorithm 1 (``per_class=True``) bound admissions per class:
    heads are taken ``b_k`` per class in class order and then checked in that order.
    """

    mode = VLLM_MODE

    def __init__(
        self,
        M: int,
        workload: Any,
        *,
        options: VllmOptions | Mapping[str, Any] | None = None,
        eviction: str = "lifo",
        queue_order: str = "fifo",
        estimate_floor: int = 1,
        time_model: Any = None,
        per_class: bool = False,
        track_class_queue: bool = False,
        record: str = "full",
    ) -> None:
        if eviction != "lifo":
            raise ValueError(f"engine 'vllm-v1' chooses victims by engine_options preempt_order; eviction must be "
                             f"'lifo' (the default), got {eviction!r}")
        if queue_order != "fifo":
            raise ValueError(f"engine 'vllm-v1' runs vLLM's FCFS waiting queue; queue_order must be 'fifo', "
                             f"got {queue_order!r}")
        if record != "full":
            raise ValueError(f"engine 'vllm-v1' keeps full records; record must be 'full', got {record!r}")
        super().__init__(M, workload, eviction="lifo", queue_order="fifo", estimate_floor=estimate_floor,
                         time_model=time_model, per_class=per_class, track_class_queue=track_class_queue,
                         record="full")
        self.options = opts = VllmOptions.from_any(options)
        self.block_size = bs = int(opts.block_size)
        self.num_blocks = self.M // bs
        if self.num_blocks < 1:
            raise ValueError(f"engine_options block_size={bs} is larger than the KV budget M={self.M}: no block fits")
        self.lookahead = int(opts.lookahead_tokens)
        #: The longest sequence (prompt + output) served: ``M`` rounded down to whole blocks (vLLM refuses a
        #: ``max_model_len`` whose blocks exceed the cache), less ``lookahead - 1`` when the lookahead slots of
        #: its last step would not fit otherwise. ``prompt + max_tokens`` of every request stays within it.
        self.max_model_len = min(self.M, self.num_blocks * bs - max(self.lookahead - 1, 0))
        self.watermark_blocks = int(opts.watermark * self.num_blocks)
        self._seq_cap = _BIG if opts.max_num_seqs is None else int(opts.max_num_seqs)
        self._tok_cap = _BIG if opts.max_num_batched_tokens is None else int(opts.max_num_batched_tokens)
        self._thr = int(opts.long_prefill_token_threshold)
        if not opts.chunked_prefill and self._tok_cap < self.M:
            # vLLM's own SchedulerConfig check (max_model_len = M here): an unchunked prefill longer than the
            # step's token budget (a long prompt, or a recompute of l + j tokens) would wait at the head forever
            raise ValueError(f"engine_options max_num_batched_tokens ({self._tok_cap}) is smaller than M ({self.M}, "
                             "the longest sequence) with chunked_prefill=False: a longer prefill could never be "
                             "scheduled (vLLM refuses the same); raise it to at least M or enable chunked_prefill")
        check = getattr(workload, "check_max_tokens", None)
        if callable(check):  # a trace's max_tokens column: a row beyond max_model_len is refused, naming it
            check(self.max_model_len, self._max_model_len_text())
        self.jit = False

    def _rebases_clock(self) -> bool:
        """This mode runs its clock from :attr:`time_origin` as the paper's engine does (its token times on the
        clock inside; :meth:`request_log` reports them in the workload's time base)."""
        return True

    def _max_model_len_text(self) -> str:
        """``max_model_len`` and where it comes from, for error messages."""
        return (f"max_model_len {self.max_model_len} (M = {self.M} tokens in {self.num_blocks} blocks of {self.block_size}"
                + (f", lookahead {self.lookahead}" if self.lookahead > 1 else "")
                + "); vLLM refuses a request whose prompt + max_tokens exceeds max_model_len")

    # ------------------------------------------------------------------ setup

    def reset(self, rng: np.random.Generator) -> None:
        """Empty the system and start a new run (as :meth:`Engine.reset`)."""
        self.jit = False
        try:  # the random victim order draws from its own stream: the workload's draws do not change
            self._prng = rng.spawn(1)[0]
        except (AttributeError, TypeError, ValueError):
            self._prng = np.random.default_rng(0)
        cap = 1024
        self.max_tokens = np.empty(cap, _I64)
        self.gen = np.empty(cap, _I64)
        self.first_token = np.empty(cap, np.float64)
        self.last_token = np.empty(cap, np.float64)
        self.first_token_step = np.empty(cap, _I64)
        super().reset(rng)
        self.lanes = [Deque() for _ in range(self.m if self.per_class else 1)]
        self._fast_fifo = not self.per_class and not self.track_class_queue
        self._r_id = np.zeros(0, _I64)
        self._r_comp = np.zeros(0, _I64)
        self._r_blk = np.zeros(0, _I64)
        self._r_start = np.zeros(0, _I64)
        # whether each running request has sampled a token since its last admission: its steps are decodes
        # from then on (a recompute's last prefill chunk of one token is not, though it looks the same)
        self._r_dec = np.zeros(0, bool)
        self.used_blocks = 0
        self.total_refused = 0
        self.recomputed_tokens = 0
        self.prefill_tokens = 0
        self.last_evicted = 0
        self._steps: list[tuple[int, ...]] = []
        # inter-token gaps: integer slots in slot mode; in continuous time round(1000 ln(seconds))
        self._itl_counts = np.zeros(0, _I64)
        self._itl_offset = 0

    def _grow_table(self, need: int) -> None:
        cap = self.arrival.size
        super()._grow_table(need)
        new_cap = self.arrival.size
        if new_cap != cap:
            for name in ("max_tokens", "gen", "first_token", "last_token", "first_token_step"):
                old = getattr(self, name)
                new = np.empty(new_cap, old.dtype)
                new[: self.n_req] = old[: self.n_req]
                setattr(self, name, new)

    def _on_sample(self, req: Any, rows: slice, rejected: np.ndarray) -> np.ndarray:
        l, o = req.prompt_len, req.output_len
        mt = getattr(req, "max_tokens", None)
        opt = self.options.max_tokens
        L = self.max_model_len
        if mt is None:
            if opt == "default":
                mt = default_max_tokens(l, o, self.workload.max_output_tokens(), L)
            elif opt == "output":
                mt = o
            else:  # the client's cap, lowered to what max_model_len leaves after the prompt, never below o
                mt = np.maximum(np.minimum(int(opt), L - l), o)
        else:
            over = np.flatnonzero(l + mt > L)
            if over.size:  # a workload's own caps (a Trace checks its column on construction)
                i = int(over[0])
                raise ValueError(f"request {rows.start + i}: prompt_len {int(l[i])} + max_tokens {int(mt[i])} = "
                                 f"{int(l[i] + mt[i])} exceeds {self._max_model_len_text()}")
        self.max_tokens[rows] = mt
        self.gen[rows] = 0
        self.first_token[rows] = np.nan
        self.last_token[rows] = np.nan
        self.first_token_step[rows] = -1
        # a request needs ceil((l + o - 1 + lookahead) / block_size) blocks at its last step: with lookahead >= 1 that
        # rejects exactly l + o > max_model_len; with lookahead 0 a request of max_model_len + 1 tokens still fits
        # (its last token is never stored) and is served (vLLM would refuse it: docs/serving.md). Nothing else can keep
        # it out: with the V1 watermark (none while nothing runs) every such request is admitted into an empty cache
        return _ceil_div(l + o - 1 + self.lookahead, self.block_size) > self.num_blocks

    # ------------------------------------------------------------------ queue

    def _peek(self, budget: Any) -> np.ndarray:
        """The queue heads the budget allows, in admission order (per-class lanes in class order)."""
        if self.per_class:
            b = np.asarray(budget).ravel()
            parts = [ln.items()[: max(0, min(int(k), len(ln)))] for ln, k in zip(self.lanes, b)]
            return np.concatenate(parts) if parts else np.zeros(0, _I64)
        ln = self.lanes[0]
        return ln.items()[: max(0, min(int(budget), len(ln)))]

    def _take(self, ids: np.ndarray) -> None:
        """Remove admitted ``ids`` (a prefix of :meth:`_peek`) from their lanes."""
        if self.per_class:
            c = self.cls[ids]
            for k, ln in enumerate(self.lanes):
                n = int((c == k).sum())
                if n:
                    ln.drop(n)
        else:
            self.lanes[0].drop(ids.size)
        if self.track_class_queue:
            self.class_queue -= np.bincount(self.cls[ids], minlength=self.m)
        self.n_queued -= ids.size
        self.queued_prompt_tokens -= int(self.prompt[ids].sum())

    def _requeue(self, ids: np.ndarray) -> None:
        """Victims (in pop order) back to the queue: front (vLLM) or back (SGLang)."""
        front = self.options.requeue == "front"
        if front:
            ids = ids[::-1]  # each prepend goes before the previous one
        if self.per_class:
            c = self.cls[ids]
            for k, ln in enumerate(self.lanes):
                sel = ids[c == k]
                if sel.size:
                    (ln.prepend if front else ln.append)(sel)
        else:
            (self.lanes[0].prepend if front else self.lanes[0].append)(ids)
        if self.track_class_queue:
            self.class_queue += np.bincount(self.cls[ids], minlength=self.m)
        self.n_queued += ids.size
        self.queued_prompt_tokens += int(self.prompt[ids].sum())

    # ------------------------------------------------------------------ the step

    def _victims(self, need: np.ndarray, rid: np.ndarray, comp: np.ndarray) -> np.ndarray:
        """Positions (in the step's running list ``rid``, computed tokens ``comp``; with admission by
        count it includes the heads started this step) of the requests to preempt, in pop order."""
        n = need.size
        total = int(need.sum())
        NB = self.num_blocks
        if total <= NB:
            return np.zeros(0, _I64)
        order = self.options.preempt_order
        if order == "lifo":  # keep the longest prefix that fits; pop the rest newest first
            k = int(np.searchsorted(np.cumsum(need), NB, side="right"))
            return np.arange(n - 1, k - 1, -1, dtype=_I64)
        if order == "least-progress":  # SGLang: fewest output tokens, then longest prompt, popped first
            pos = np.lexsort((-self.prompt[rid], self.gen[rid]))
        elif order == "least-computed":
            pos = np.lexsort((-np.arange(n), comp))  # ties: newest first
        else:
            pos = self._prng.permutation(n)
        freed = np.cumsum(need[pos])
        m = int(np.searchsorted(freed, total - NB, side="left")) + 1
        return pos[:m].astype(_I64)

    def serve(self, budget: int | Sequence[int] | np.ndarray) -> SlotStats:
        """One scheduler step with admission bound ``budget`` (``B_t``, or per-class budgets); ``t += 1``."""
        self._check_budget(budget)
        t = self.t
        opts = self.options
        bs, la, NB = self.block_size, self.lookahead, self.num_blocks
        prompt, gen = self.prompt, self.gen
        if self.timed and t - self._clock_base >= self._clock.size:
            self._clock = np.concatenate([self._clock, np.zeros_like(self._clock)])

        # ---- plan (nothing changes until the duration is known) ----
        allowed = self._peek(budget)
        n_allowed = int(allowed.size)
        count_mode = opts.admission == "count"
        if count_mode:
            room = max(0, self._seq_cap - self._r_id.size)
            adm0 = allowed[:room].copy()
            rid = np.concatenate([self._r_id, adm0])
            comp = np.concatenate([self._r_comp, np.zeros(adm0.size, _I64)])
            blk = np.concatenate([self._r_blk, np.zeros(adm0.size, _I64)])
            dec = np.concatenate([self._r_dec, np.zeros(adm0.size, bool)])
        else:
            adm0 = allowed[:0]
            rid, comp, blk, dec = self._r_id, self._r_comp, self._r_blk, self._r_dec
        ntok = prompt[rid] + gen[rid]
        new = ntok - comp
        if self._thr:
            new = np.minimum(new, self._thr)
        excl = np.cumsum(new) - new
        s = np.clip(self._tok_cap - excl, 0, new)
        want = np.where(s > 0, _ceil_div(comp + s + la, bs), blk)
        need = np.maximum(want, blk)
        prng_before = self._prng.bit_generator.state if opts.preempt_order == "random" else None
        vpos = self._victims(need, rid, comp)
        keep = np.ones(rid.size, bool)
        keep[vpos] = False
        n_ev = int(vpos.size)
        # waiting admission: never on a preempting step (vLLM: `if not preempted_reqs`)
        adm = adm0[:0]
        adm_s = adm_blk = np.zeros(0, _I64)
        if not count_mode and n_ev == 0 and n_allowed:
            k = min(n_allowed, max(0, self._seq_cap - rid.size))
            cand = allowed[:k]
            c_ntok = prompt[cand] + gen[cand]
            c_new = np.minimum(c_ntok, self._thr) if self._thr else c_ntok
            left = self._tok_cap - int(s.sum())
            c_excl = np.cumsum(c_new) - c_new
            rem = left - c_excl
            if opts.chunked_prefill:
                c_s = np.clip(rem, 0, c_new)
                ok = rem > 0
            else:
                c_s = c_new
                ok = c_new <= rem
            c_blk = _ceil_div(c_s + la, bs)  # allocated: the first chunk and the lookahead slots
            if opts.reserve_full_prompt:
                c_blk = np.maximum(c_blk, _ceil_div(c_ntok + la, bs))
            # KVCacheManager.allocate_slots: the watermark only while a request runs (has_scheduled_reqs=
            # bool(self.running): one admitted before in this step counts); with reserve_full_isl the whole
            # sequence, l + j tokens (no lookahead), must fit too (full_sequence_must_fit), though only c_blk
            # is allocated. Free blocks before candidate i: NB - need - the blocks of candidates 0..i-1.
            wm = np.full(cand.size, self.watermark_blocks, _I64)
            if rid.size == 0 and cand.size:
                wm[0] = 0
            gate = np.maximum(c_blk, _ceil_div(c_ntok, bs)) if opts.reserve_full_isl else c_blk
            ok &= (np.cumsum(c_blk) - c_blk) + gate + wm <= NB - int(need.sum())
            k = int(np.argmin(ok)) if not ok.all() else k
            adm, adm_s, adm_blk = cand[:k].copy(), c_s[:k], c_blk[:k]
        n_refused = n_allowed - int(adm.size) - int(adm0.size)

        # the running list after the step's decisions, in order: kept running (+ count-mode heads), admitted
        rid2 = np.concatenate([rid[keep], adm])
        comp_before = np.concatenate([comp[keep], np.zeros(adm.size, _I64)])
        s2 = np.concatenate([s[keep], adm_s])
        blk2 = np.concatenate([need[keep], adm_blk])
        ntok2 = prompt[rid2] + gen[rid2]
        dec2 = np.concatenate([dec[keep], np.zeros(adm.size, bool)])
        is_dec = dec2 & (s2 == 1) & (comp_before == ntok2 - 1)
        P = int(s2[~is_dec].sum())
        D = int(is_dec.sum())
        K = int(ntok2[is_dec].sum())
        Bn = int((s2 > 0).sum())
        d = 0.0
        if self.timed:
            assert self.time_model is not None
            try:
                d = float(self.time_model.duration(P, D, K, Bn))
            except BaseException:  # a callable raised: the step is not applied, and a retry draws the same victims
                if prng_before is not None:
                    self._prng.bit_generator.state = prng_before
                raise

        # ---- commit ----
        wasted = 0
        if count_mode and adm0.size:  # heads leave the queue before any victim rejoins its front
            self._take(adm0)
        if n_ev:
            vid = rid[vpos]
            self.recomputed_tokens += int(comp[vpos].sum())
            if opts.preemption == "discard":
                wasted = int(gen[vid].sum())
                gen[vid] = 0
                self.wasted_tokens += wasted
            self.finish[vid] = -1
            self.evictions[vid] += 1
            self.total_evictions += n_ev
            self.overflow_events += 1
            self._requeue(vid)
        if adm.size:
            self._take(adm)
        starts = np.concatenate([self._r_start, np.full(adm0.size, t, _I64)])[keep]
        starts = np.concatenate([starts, np.full(adm.size, t, _I64)])
        n_adm = int(adm0.size + adm.size)
        # the count-mode heads popped in this step are admissions too; one admitted and popped in the
        # same step is an eviction (as in the paper)
        comp2 = comp_before + s2
        used = int(blk2.sum())
        sampled = (s2 > 0) & (comp2 == ntok2)
        sid = rid2[sampled]
        if self.timed:
            self.last_duration = d
            self._now += d  # the clock inside (from time_origin): token times stay on it, the log adds _shift
            self._clock[t - self._clock_base] = self._now
            t_end = self._now
        else:
            t_end = float(t + 1)
        g_before = gen[sid]
        later = g_before > 0
        if later.any():
            self._record_gaps(t_end - self.last_token[sid[later]])
        first = sid[~later]
        fresh = first[np.isnan(self.first_token[first])]
        self.first_token[fresh] = t_end
        self.first_token_step[fresh] = t + 1
        self.last_token[sid] = t_end
        gen[sid] = g_before + 1
        done_mask = np.zeros(rid2.size, bool)
        done_mask[sampled] = gen[sid] >= self.output[sid]
        done_ids = rid2[done_mask]
        n_done = int(done_ids.size)
        self.generated_tokens += int(sid.size)
        self.prefill_tokens += P
        if n_done:
            self.finish[done_ids] = t + 1
            self.total_completed += n_done
            self.last_completed_tokens = int((prompt[done_ids] + self.output[done_ids]).sum())
        else:
            self.last_completed_tokens = 0
        live = ~done_mask
        self._r_id, self._r_comp, self._r_blk, self._r_start = rid2[live], comp2[live], blk2[live], starts[live]
        self._r_dec = (dec2 | sampled)[live]
        self.used_blocks = int(self._r_blk.sum())
        self.n_active = int(self._r_id.size)
        self.held = self.used_blocks * bs
        self.total_refused += n_refused
        self.last_evicted = n_ev
        st = SlotStats(t, used * bs, n_adm, n_ev, wasted, n_done, self.n_queued, self.n_active)
        # used_blocks after completions: vLLM frees a finished request's blocks before make_stats
        self._steps.append((n_refused, P, D, int(comp[vpos].sum()) if n_ev else 0, Bn, self.used_blocks,
                            int(sid.size)))
        self._pending.append(st)
        self.t = t + 1
        if len(self._pending) == 256:
            self._flush_records()
        return st

    def _record_gaps(self, gaps: np.ndarray) -> None:
        """Add inter-token gaps to the histogram (exact slots; in continuous time 0.1% log bins)."""
        if self.timed:
            idx = np.rint(1000.0 * np.log(np.maximum(gaps, 1e-9))).astype(_I64)
        else:
            idx = np.rint(gaps).astype(_I64)
        lo, hi = int(idx.min()), int(idx.max())
        if self._itl_counts.size == 0:
            self._itl_offset = lo
            self._itl_counts = np.zeros(hi - lo + 1, _I64)
        if lo < self._itl_offset:
            self._itl_counts = np.concatenate([np.zeros(self._itl_offset - lo, _I64), self._itl_counts])
            self._itl_offset = lo
        top = self._itl_offset + self._itl_counts.size - 1
        if hi > top:
            self._itl_counts = np.concatenate([self._itl_counts, np.zeros(hi - top, _I64)])
        self._itl_counts += np.bincount(idx - self._itl_offset, minlength=self._itl_counts.size)

    def _itl_quantile(self, q: float) -> float:
        c = self._itl_counts
        n = int(c.sum())
        if n == 0:
            return float("nan")
        i = int(np.searchsorted(np.cumsum(c), q * n, side="left"))
        v = float(i + self._itl_offset)
        return math.exp(v / 1000.0) if self.timed else v

    # ------------------------------------------------------------------ reading

    def active_ids(self) -> np.ndarray:
        """Ids of running requests in running order (oldest admission first)."""
        return self._r_id.copy()

    def active_starts(self) -> np.ndarray:
        """Step at which each running request was (last) admitted."""
        return self._r_start.copy()

    def active_generated(self) -> np.ndarray:
        """Output tokens of each running request (kept across recompute preemptions)."""
        return self.gen[self._r_id]

    def active_computed(self) -> np.ndarray:
        """``num_computed_tokens`` of each running request."""
        return self._r_comp.copy()

    def active_blocks(self) -> np.ndarray:
        """KV blocks held by each running request."""
        return self._r_blk.copy()

    def active_remaining(self) -> np.ndarray:
        """Output tokens each running request still has to generate (uses output lengths)."""
        return self.output[self._r_id] - self.gen[self._r_id]

    def generated_histogram(self, edges: np.ndarray, out: np.ndarray | None = None, offset: int = 0) -> np.ndarray:
        """Running requests by output tokens, bins ``[edges[k], edges[k+1])`` (last open)."""
        g = self.gen[self._r_id]
        idx = np.searchsorted(edges, g, side="right") - 1
        hist = np.bincount(idx, minlength=edges.size).astype(_I64)
        if out is None:
            return hist
        out[offset : offset + edges.size] = hist
        return out

    def projected_demand(self, offsets: np.ndarray) -> np.ndarray:
        """The paper's ``D_{t+h}`` of the running set if nothing were admitted or preempted (in tokens).

        A running request with ``j`` of ``o`` tokens holds ``l + j + h + 1`` at ``t + h`` while
        ``h < o - j`` (the same projection as the paper mode's, ignoring block rounding).
        """
        rid = self._r_id
        out = np.zeros(offsets.size, _I64)
        if rid.size == 0:
            return out
        base = self.prompt[rid] + self.gen[rid] + 1
        rem = self.output[rid] - self.gen[rid]
        h = np.asarray(offsets, _I64)
        alive = rem[None, :] > h[:, None]
        return ((base[None, :] + h[:, None]) * alive).sum(axis=1).astype(_I64)

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any running request."""
        return self.num_blocks - self.used_blocks

    def step_series(self) -> dict[str, np.ndarray]:
        """Per-step serving records (:data:`STEP_FIELDS`): ``refused`` admissions (the budget allowed,
        the cache, the token budget or ``max_num_seqs`` did not), ``prefill_tokens``, ``decode_requests``,
        ``recomputed_tokens`` (KV tokens preemption dropped: prefilled again with ``preemption="recompute"``;
        with ``"discard"`` the prompt's are prefilled again and the output's regenerated, also counted in
        ``wasted_tokens``), ``scheduled`` requests, ``used_blocks`` (held at the end of the step: the blocks of the
        requests that finished in it are free, as in vLLM's stats), ``generated`` tokens (sampled: a step
        of prefill only samples none, so the paper's ``active + completed`` would overcount them; the metrics'
        ``generated_token_throughput`` reads this)."""
        a = np.asarray(self._steps, dtype=_I64).reshape(-1, len(STEP_FIELDS))
        return {name: a[:, i].copy() for i, name in enumerate(STEP_FIELDS)}

    def series(self) -> dict[str, np.ndarray]:
        """The base per-step records plus :meth:`step_series`."""
        out = super().series()
        out.update(self.step_series())
        return out

    def request_log(self) -> dict[str, np.ndarray]:
        """The base per-request arrays plus ``max_tokens``, ``first_token`` (step at whose end the first
        output token came, ``-1`` if none yet) and, in continuous time, ``first_token_time`` (seconds)."""
        log = super().request_log()
        n = self.n_arrived
        log["max_tokens"] = self.max_tokens[:n].copy()
        log["first_token"] = self.first_token_step[:n].copy()
        if self.timed:
            log["first_token_time"] = self.first_token[:n] + self._shift  # in the workload's time base
        return log

    def metrics(self) -> dict[str, Any]:
        """The paper's metrics over the steps run so far (:func:`~flowgym.sim.metrics.metrics_at`) plus
        :meth:`serving_metrics`."""
        log, series = self.request_log(), self.series()
        m = metrics_at(log, series, self.M, self.t)
        m.update(self._serving_metrics(log, series))
        return m

    def serving_metrics(self) -> dict[str, Any]:
        """Serving metrics, named after vLLM's Prometheus metrics where one exists (slots or seconds).

        * ``num_preemptions`` (``vllm:num_preemptions_total``); ``refused_admissions``: admissions the
          budget ``B_t`` allowed that the engine refused (no blocks, token budget, ``max_num_seqs``
          or a preempting step); ``recomputed_tokens``: KV tokens preemption dropped (prefilled again; with
          ``preemption="discard"`` only the prompt's are, the output's are regenerated and also in ``wasted_tokens``).
        * ``time_to_first_token_mean/p50/p99`` (``vllm:time_to_first_token_seconds``): first output
          token minus arrival, over requests that have one.
        * ``inter_token_latency_p50/p99`` (``vllm:inter_token_latency_seconds``): gaps between a
          request's consecutive output tokens (preemption stalls included); exact in slots, 0.1%
          bins in continuous time. Kept as a histogram, so the percentile is the order statistic at
          rank ``ceil(q n)`` (nearest rank), not numpy's interpolation between two gaps that the TTFT
          percentiles use (55 gaps of 1 and one of 8: p99 8, where ``np.percentile`` gives 4.15).
        * ``num_requests_running_mean``, ``num_requests_waiting_mean`` (``vllm:num_requests_running``,
          ``vllm:num_requests_waiting``): means over steps.
        * ``kv_cache_usage_perc_mean/max`` (``vllm:kv_cache_usage_perc``): blocks held at the end of each step
          (after its completions) / blocks.
        * ``prefill_tokens`` (computed, recomputes included) and ``generation_tokens``
          (``vllm:generation_tokens_total``).

        All but the preemptions, inter-token latencies and KV usage are :func:`serving_metrics_at` of the whole run.
        """
        return self._serving_metrics(self.request_log(), self.series())

    def _serving_metrics(self, log: dict[str, np.ndarray], series: dict[str, np.ndarray]) -> dict[str, Any]:
        T = int(series["usage"].size)
        at = serving_metrics_at(log, series, T)
        used = series["used_blocks"]
        nan = float("nan")
        return {
            "num_preemptions": int(self.total_evictions),
            "refused_admissions": at["refused_admissions"],
            "recomputed_tokens": at["recomputed_tokens"],
            "time_to_first_token_mean": at["time_to_first_token_mean"],
            "time_to_first_token_p50": at["time_to_first_token_p50"],
            "time_to_first_token_p99": at["time_to_first_token_p99"],
            "inter_token_latency_p50": self._itl_quantile(0.5),
            "inter_token_latency_p99": self._itl_quantile(0.99),
            "num_requests_running_mean": at["num_requests_running_mean"],
            "num_requests_waiting_mean": at["num_requests_waiting_mean"],
            "kv_cache_usage_perc_mean": float(used.mean() / self.num_blocks) if T else nan,
            "kv_cache_usage_perc_max": float(used.max() / self.num_blocks) if T else nan,
            "prefill_tokens": at["prefill_tokens"],
            "generation_tokens": at["generation_tokens"],
        }

    def memory_bytes(self) -> int:
        extra = sum(getattr(self, n).nbytes for n in ("max_tokens", "gen", "first_token", "last_token",
                                                       "first_token_step", "_r_id", "_r_comp", "_r_blk", "_r_start",
                                                       "_r_dec"))
        return super().memory_bytes() + extra


#: The serving metrics :func:`serving_metrics_at` derives for any horizon of a ``vllm-v1`` run (the per-seed
#: rows and tables of ``flowgym compare``); the inter-token latencies need every token's time and come from
#: :meth:`VllmEngine.serving_metrics` (the whole run) only; ``num_preemptions`` is the table's ``evictions``.
SERVING_TABLE_METRICS = (
    "time_to_first_token_mean",
    "time_to_first_token_p50",
    "time_to_first_token_p99",
    "refused_admissions",
    "recomputed_tokens",
    "prefill_tokens",
    "generation_tokens",
    "num_requests_running_mean",
    "num_requests_waiting_mean",
)


def serving_metrics_at(log: Mapping[str, np.ndarray], series: Mapping[str, np.ndarray], T: int) -> dict[str, Any]:
    """The :data:`SERVING_TABLE_METRICS` of the first ``T`` steps of a ``vllm-v1`` run, from its
    :meth:`VllmEngine.request_log` and :meth:`VllmEngine.series` (as :func:`~flowgym.sim.metrics.metrics_at`
    does for the paper's metrics): the same values as :meth:`VllmEngine.serving_metrics` of a ``T``-step run
    on the same seed. TTFT counts the requests whose first output token came by the end of step ``T``.
    ``ValueError`` if the log is not a ``vllm-v1`` run's (no ``first_token``) or ``T`` is out of range."""
    if "first_token" not in log or "refused" not in series:
        raise ValueError("serving metrics need a vllm-v1 run's request log and series (first_token, refused); "
                         "this run has none: engine='paper' records no per-token times")
    size = int(series["usage"].size)
    if isinstance(T, (bool, np.bool_)) or not isinstance(T, (int, np.integer)) or not 0 <= T <= size:
        raise ValueError(f"T must be a whole number of steps in [0, {size}], got {T!r}")
    T = int(T)
    first = np.asarray(log["first_token"])
    has = (first >= 0) & (first <= T)  # the first output token came by the end of step T
    if "first_token_time" in log:  # continuous time: seconds
        ttft = (log["first_token_time"][has] - log["arrival_time"][has]).astype(np.float64)
    else:
        ttft = (first[has] - np.asarray(log["arrival"])[has]).astype(np.float64)
    nan = float("nan")
    return {
        "time_to_first_token_mean": float(ttft.mean()) if ttft.size else nan,
        "time_to_first_token_p50": float(np.percentile(ttft, 50)) if ttft.size else nan,
        "time_to_first_token_p99": float(np.percentile(ttft, 99)) if ttft.size else nan,
        "refused_admissions": int(series["refused"][:T].sum()),
        "recomputed_tokens": int(series["recomputed_tokens"][:T].sum()),
        "prefill_tokens": int(series["prefill_tokens"][:T].sum()),
        "generation_tokens": int(series["generated"][:T].sum()),
        "num_requests_running_mean": float(series["active"][:T].mean()) if T else nan,
        "num_requests_waiting_mean": float(series["queue_len"][:T].mean()) if T else nan,
    }


def make_engine(mode: str, M: int, workload: Any, *, engine_options: Mapping[str, Any] | None = None,
                **kwargs: Any) -> Engine:
    """An engine of ``mode`` (:data:`ENGINE_MODES`): the paper's :class:`Engine` or :class:`VllmEngine`."""
    if mode == "paper":
        if engine_options:
            raise ValueError(f"engine_options {sorted(engine_options)} are options of engine 'vllm-v1'; "
                             "engine 'paper' takes none")
        return Engine(M, workload, **kwargs)
    if mode == VLLM_MODE:
        return VllmEngine(M, workload, options=engine_options, **kwargs)
    raise ValueError(f"engine must be one of {list(ENGINE_MODES)}, got {mode!r}")
