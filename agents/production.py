"""Admission controllers of production LLM servers, as agents: SGLang's and TensorRT-LLM's.

Both choose ``B_t`` by reserving KV cache against each request's ``max_tokens`` (the client's
cap on its output, :attr:`flowgym.envs.view.QueueSnapshot.max_tokens`), never against its true
output length: they run with ``output_length_known=False`` as a real server does. They read the
cache through the view's block accounting (:meth:`flowgym.envs.view.SystemView.blocks_for`,
``free_blocks``), so the same rule runs on the paper's model (one-token blocks, a request holding
``l + j + 1`` tokens) and on the ``vllm-v1`` engine mode (blocks of ``block_size`` tokens).
They decide admissions only; preemption is the engine's (in ``vllm-v1``,
``engine_options={"preempt_order": "least-progress", "requeue": "back"}`` is SGLang's
retraction).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowgym.agents.base import DEFAULT_REQUEST, MAX_INT_PARAM, Agent, int_param
from flowgym.envs.flow_control import FlowControlConfig
from flowgym.envs.view import SystemView
from flowgym.sim._checks import is_real

__all__ = ["SGLangReservation", "GuaranteedNoEvict"]


class SGLangReservation(Agent):
    """SGLang's adaptive reservation admission (``new_token_ratio``).

    The rule of SGLang's ``PrefillAdder`` (``python/sglang/srt/managers/schedule_policy.py``,
    ``PrefillAdder.__init__``, ``rem_total_tokens``, ``add_one_req``) and of its scheduler's
    ratio updates (``python/sglang/srt/managers/scheduler.py``, ``update_running_batch``;
    ``schedule_batch.py``, ``ScheduleBatch.retract_decode``):

    * Each running request reserves ``min(max_tokens - j, clip_max_new_tokens) * new_token_ratio``
      tokens for its remaining output. The room left is
      ``rem = free KV tokens - sum of those reservations``.
    * Queue heads are admitted in order while the next one's ``(l + j) + min(max_tokens - j,
      clip_max_new_tokens)`` (its prefill and its whole remaining cap, unscaled) is below what is
      left of ``rem`` (``total_tokens >= rem_total_tokens`` gives ``NO_TOKEN``: stop); each admitted
      one takes that much off ``rem``.
    * ``new_token_ratio`` starts at ``init = min(init_new_token_ratio * schedule_conservativeness, 1)``
      and decays by ``(init - min) / new_token_ratio_decay_steps`` per decode step down to
      ``min = init * min_new_token_ratio_factor``. After a step that preempted (SGLang retracts
      on memory pressure) it is reset to ``min(1, (sum j + retract_decode_steps * n) / sum
      max_tokens)`` over the running batch, as ``retract_decode`` returns it.

    Args (SGLang's defaults, ``python/sglang/srt/environ.py`` / ``global_config``):
        init_new_token_ratio: 0.7 (``SGLANG_INIT_NEW_TOKEN_RATIO``).
        min_new_token_ratio_factor: 0.14 (``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``); at most 1 (the ratio decays
            from ``init`` down to ``init * factor``).
        new_token_ratio_decay_steps: 600 (``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``).
        retract_decode_steps: 20 (``SGLANG_RETRACT_DECODE_STEPS``).
        clip_max_new_tokens: 4096 (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``).
        schedule_conservativeness: 1.0 (``--schedule-conservativeness``).
        max_budget: largest ``B_t`` (environment option).
    """

    name = "sglang-reserve"

    def __init__(self, init_new_token_ratio: float = 0.7, min_new_token_ratio_factor: float = 0.14,
                 new_token_ratio_decay_steps: int = 600, retract_decode_steps: int = 20,
                 clip_max_new_tokens: int = 4096, schedule_conservativeness: float = 1.0,
                 max_budget: int | None = None) -> None:
        for nm, v, hi in (("init_new_token_ratio", init_new_token_ratio, 1e12),
                          ("min_new_token_ratio_factor", min_new_token_ratio_factor, 1.0),  # min <= init: it decays
                          ("schedule_conservativeness", schedule_conservativeness, 1e12)):
            if not is_real(v) or not 0 < v <= hi:  # the range before float(): no float(10**400); nan fails it
                raise ValueError(f"{nm} must be a positive number (at most {hi:g}), got {v!r}")
        for nm, v in (("new_token_ratio_decay_steps", new_token_ratio_decay_steps),
                      ("retract_decode_steps", retract_decode_steps), ("clip_max_new_tokens", clip_max_new_tokens)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_INT_PARAM:
                raise ValueError(f"{nm} must be a positive integer (at most {MAX_INT_PARAM:g}), got {v!r}")
        self.init_ratio = min(float(init_new_token_ratio) * float(schedule_conservativeness), 1.0)
        self.min_ratio = min(self.init_ratio * float(min_new_token_ratio_factor), 1.0)
        self.decay = (self.init_ratio - self.min_ratio) / int(new_token_ratio_decay_steps)
        self.retract_steps = int(retract_decode_steps)
        self.factor, self.decay_steps = float(min_new_token_ratio_factor), int(new_token_ratio_decay_steps)
        self.clip = int(clip_max_new_tokens)
        self.params = dict(init_new_token_ratio=init_new_token_ratio, min_new_token_ratio_factor=min_new_token_ratio_factor,
                           new_token_ratio_decay_steps=new_token_ratio_decay_steps, schedule_conservativeness=schedule_conservativeness)
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget}

    def reset(self, config: FlowControlConfig, seed: int | None = None) -> None:
        super().reset(config, seed)
        self.ratio = self.init_ratio
        self.evictions_seen = 0

    def act(self, observation: Any, view: SystemView) -> int:
        a = view.active()
        assert a.max_tokens is not None
        ev = view.total_evictions
        if ev > self.evictions_seen and a.ids.size:  # the last step retracted: retract_decode's new ratio
            self.ratio = min(1.0, float(a.generated.sum() + self.retract_steps * a.ids.size) / float(a.max_tokens.sum()))
        elif a.ids.size:  # one decode step
            self.ratio = max(self.ratio - self.decay, self.min_ratio)
        self.evictions_seen = ev
        if view.n_queued == 0:
            return 0
        reserved = float((np.minimum(a.max_tokens - a.generated, self.clip) * self.ratio).sum())
        rem = view.free_blocks * view.block_size - reserved
        if rem <= 0:
            return 0
        q = view.queue(self.limit)
        assert q.max_tokens is not None and q.generated is not None
        cost = (q.prompt_len + q.generated) + np.minimum(q.max_tokens - q.generated, self.clip)
        return int(np.searchsorted(np.cumsum(cost), rem, side="left"))

    def label(self) -> str:
        # ratio0 (init x conservativeness) as before; the other settings where they are not SGLang's defaults
        rest = "".join(f" {k}={v:g}" for k, v, default in (
            ("min_factor", self.factor, 0.14), ("decay_steps", self.decay_steps, 600),
            ("retract_steps", self.retract_steps, 20), ("clip", self.clip, 4096)) if v != default)
        return f"sglang-reserve ratio0={self.init_ratio:g}" + rest + self._max_budget_label()


class GuaranteedNoEvict(Agent):
    """TensorRT-LLM's default capacity scheduler, ``GUARANTEED_NO_EVICT``.

    ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``, ``GuaranteedNoEvictScheduler::impl``:
    every request in generation keeps the blocks it needs to run to completion reserved
    (``enoughAvailableBlocks`` / ``commitBlocks`` with its remaining blocks to completion, from its
    prompt plus ``max_new_tokens``); then pending requests are taken in order while the blocks of
    their whole prompt plus ``max_new_tokens`` fit in what is left, stopping at the first that does
    not ("If one requests fails to be scheduled, break"), up to ``max_num_requests``. With
    ``max_tokens >= o`` the cache never overflows: no eviction, ever.

    Here a request reserves ``blocks_for(l + max_tokens - 1)`` (its KV at its last step; in the
    paper mode ``l + max_tokens`` tokens, its peak).

    Args:
        max_num_requests: most running requests (TensorRT-LLM ``max_batch_size``); ``None``: no cap
            besides the engine's.
        max_budget: largest ``B_t`` (environment option).
    """

    name = "trt-no-evict"

    def __init__(self, max_num_requests: int | None = None, max_budget: int | None = None) -> None:
        self.max_num_requests = None if max_num_requests is None else int_param("max_num_requests", max_num_requests, 1)
        self.max_budget = None if max_budget is None else int_param("max_budget", max_budget, 1)
        self.requires = {"max_budget": DEFAULT_REQUEST if self.max_budget is None else self.max_budget}

    def act(self, observation: Any, view: SystemView) -> int:
        if view.n_queued == 0:
            return 0
        a = view.active()
        assert a.max_tokens is not None and a.blocks is not None
        final = view.blocks_for(a.prompt_len + a.max_tokens - 1)
        reserved = int(np.maximum(final, a.blocks).sum())
        avail = view.num_blocks - reserved
        if avail <= 0:
            return 0
        k_max = self.limit
        if self.max_num_requests is not None:
            k_max = min(k_max, self.max_num_requests - view.n_active)
            if k_max <= 0:
                return 0
        q = view.queue(k_max)
        assert q.max_tokens is not None
        need = view.blocks_for(q.prompt_len + q.max_tokens - 1)
        return int(np.searchsorted(np.cumsum(need), avail, side="right"))

    def label(self) -> str:
        n = "" if self.max_num_requests is None else f" n={self.max_num_requests}"
        return "trt-no-evict" + n + self._max_budget_label()
