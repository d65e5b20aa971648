"""The production admission controllers (``agents/production.py``), pinned by hand arithmetic.

Each agent reads only the :class:`~flowgym.envs.view.SystemView` interface, so most tests drive it
with a small stand-in view whose numbers are chosen by hand; the expected budget of each test is
worked out in its comments from the rule in the agent's docstring (SGLang's ``PrefillAdder`` and
``new_token_ratio`` updates; TensorRT-LLM's ``GUARANTEED_NO_EVICT``). The last tests run the
agents in the real environment, where the same arithmetic is done from the real view.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from flowgym.agents import make_agent
from flowgym.agents.production import GuaranteedNoEvict, SGLangReservation
from flowgym.envs.flow_control import FlowControlConfig
from flowgym.envs.view import ActiveSnapshot, QueueSnapshot

I = np.int64


class FakeView:
    """The parts of :class:`SystemView` the two agents read, set by hand.

    ``active`` and ``queue`` are lists of ``(prompt_len, generated, max_tokens[, blocks])``.
    ``blocks_for`` is the view's ``ceil((tokens + lookahead) / block_size)``.
    """

    def __init__(self, active=(), queue=(), free_blocks=0, num_blocks=100, block_size=1, lookahead=1,
                 total_evictions=0):
        self._active = [tuple(r) for r in active]
        self._queue = [tuple(r) for r in queue]
        self.free_blocks = free_blocks
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.lookahead = lookahead
        self.total_evictions = total_evictions
        self.queue_calls: list = []

    @property
    def n_queued(self) -> int:
        return len(self._queue)

    @property
    def n_active(self) -> int:
        return len(self._active)

    def blocks_for(self, tokens):
        return -(-(np.asarray(tokens) + self.lookahead) // self.block_size)

    def active(self) -> ActiveSnapshot:
        n = len(self._active)
        col = lambda k: np.array([r[k] for r in self._active], I)  # noqa: E731
        blocks = (np.array([r[3] for r in self._active], I) if n and len(self._active[0]) > 3
                  else self.blocks_for(col(0) + col(1)) if n else np.zeros(0, I))
        return ActiveSnapshot(np.arange(n, dtype=I), col(0), col(1), None, col(1) + 1, col(2), blocks)

    def queue(self, k=None) -> QueueSnapshot:
        self.queue_calls.append(k)
        rows = self._queue if k is None else self._queue[:k]
        col = lambda j: np.array([r[j] for r in rows], I)  # noqa: E731
        n = len(rows)
        return QueueSnapshot(np.arange(n, dtype=I), np.zeros(n), col(0), None, None, np.ones(n, I),
                             np.zeros(n, I), col(2), col(1))


def _ready(agent, max_budget=1024):
    agent.reset(FlowControlConfig(max_budget=max_budget), seed=0)
    return agent


# --------------------------------------------------------------------------- SGLang: arguments


@pytest.mark.parametrize("field", ["init_new_token_ratio", "min_new_token_ratio_factor", "schedule_conservativeness"])
@pytest.mark.parametrize("bad", [0, 0.0, -0.5, float("nan"), float("inf"), True, "1"])
def test_sglang_ratio_arguments_must_be_positive_finite_numbers(field, bad):
    with pytest.raises(ValueError, match=field):
        SGLangReservation(**{field: bad})


@pytest.mark.parametrize("field", ["new_token_ratio_decay_steps", "retract_decode_steps", "clip_max_new_tokens"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_sglang_integer_arguments_must_be_positive_integers(field, bad):
    with pytest.raises(ValueError, match=field):
        SGLangReservation(**{field: bad})


def test_sglang_smallest_valid_arguments_are_accepted():
    # 1 is the smallest positive integer; a tiny positive ratio is valid
    ag = SGLangReservation(init_new_token_ratio=1e-9, min_new_token_ratio_factor=1e-9, new_token_ratio_decay_steps=1,
                           retract_decode_steps=1, clip_max_new_tokens=1, schedule_conservativeness=1e-9)
    assert ag.retract_steps == 1 and ag.clip == 1
    SGLangReservation(new_token_ratio_decay_steps=np.int64(3))  # numpy integers are integers


def test_sglang_defaults_are_sglangs():
    ag = SGLangReservation()
    # init = min(0.7 * 1.0, 1) = 0.7; min = 0.7 * 0.14 = 0.098; decay = (0.7 - 0.098) / 600
    assert ag.init_ratio == pytest.approx(0.7)
    assert ag.min_ratio == pytest.approx(0.098)
    assert ag.decay == pytest.approx(0.602 / 600)
    assert ag.retract_steps == 20 and ag.clip == 4096
    assert ag.env_options() == {"max_budget": 1024}
    assert ag.label() == "sglang-reserve ratio0=0.7"
    assert ag.params == dict(init_new_token_ratio=0.7, min_new_token_ratio_factor=0.14,
                             new_token_ratio_decay_steps=600, schedule_conservativeness=1.0)


def test_sglang_conservativeness_scales_the_initial_ratio_capped_at_one():
    # init = min(0.7 * c, 1): c = 0.5 -> 0.35 (min 0.049); c = 2 -> 1.4 capped to 1 (min 0.14)
    half = SGLangReservation(schedule_conservativeness=0.5)
    assert half.init_ratio == pytest.approx(0.35) and half.min_ratio == pytest.approx(0.049)
    assert half.decay == pytest.approx((0.35 - 0.049) / 600)
    two = SGLangReservation(schedule_conservativeness=2.0)
    assert two.init_ratio == 1.0 and two.min_ratio == pytest.approx(0.14)
    assert two.label() == "sglang-reserve ratio0=1"
    # a factor above 1 would put the floor above the start, the decay negative and the ratio growing without end
    assert SGLangReservation(min_new_token_ratio_factor=1.0).min_ratio == pytest.approx(0.7)
    with pytest.raises(ValueError, match=r"min_new_token_ratio_factor must be a positive number \(at most 1\)"):
        SGLangReservation(min_new_token_ratio_factor=2.0)
    for nm in ("init_new_token_ratio", "schedule_conservativeness", "clip_max_new_tokens",
               "new_token_ratio_decay_steps"):  # a 400-digit integer: named, not numpy's OverflowError
        with pytest.raises(ValueError, match=nm):
            SGLangReservation(**{nm: 10**400})
    assert SGLangReservation(max_budget=7).env_options() == {"max_budget": 7}


# --------------------------------------------------------------------------- SGLang: the ratio


def test_sglang_ratio_decays_per_step_with_a_running_batch_down_to_its_floor():
    # init 0.7, floor 0.07 (factor 0.1), 3 decay steps: decay = (0.7 - 0.07) / 3 = 0.21 per step
    ag = _ready(SGLangReservation(min_new_token_ratio_factor=0.1, new_token_ratio_decay_steps=3))
    assert ag.ratio == pytest.approx(0.7) and ag.evictions_seen == 0
    v = FakeView(active=[(5, 1, 10)], free_blocks=50)
    expected = [0.49, 0.28, 0.07, 0.07, 0.07]  # 0.7 - 0.21 k, floored at 0.07
    for r in expected:
        ag.act(None, v)
        assert ag.ratio == pytest.approx(r)


def test_sglang_ratio_does_not_decay_without_a_running_batch():
    ag = _ready(SGLangReservation())
    v = FakeView(active=[], queue=[(5, 0, 10)], free_blocks=50)
    for _ in range(3):
        ag.act(None, v)
    assert ag.ratio == pytest.approx(0.7)


def test_sglang_ratio_resets_after_a_retraction_to_retract_decodes_value():
    # running: generated 10 and 30, max_tokens 100 and 200, 2 requests, 20 retract steps:
    # min(1, (10 + 30 + 20 * 2) / (100 + 200)) = 80 / 300
    ag = _ready(SGLangReservation())
    v = FakeView(active=[(4, 10, 100), (4, 30, 200)], free_blocks=500, total_evictions=3)
    ag.act(None, v)
    assert ag.ratio == pytest.approx(80 / 300)
    assert ag.evictions_seen == 3
    # the next step with no new eviction decays from there: 80/300 - 0.602/600
    ag.act(None, v)
    assert ag.ratio == pytest.approx(80 / 300 - 0.602 / 600)
    # another retraction: the reset value again (it does not depend on the ratio before)
    v.total_evictions = 4
    ag.act(None, v)
    assert ag.ratio == pytest.approx(80 / 300)


def test_sglang_reset_ratio_is_capped_at_one():
    # (90 + 20) / 100 = 1.1 -> 1
    ag = _ready(SGLangReservation(retract_decode_steps=20))
    ag.act(None, FakeView(active=[(4, 90, 100)], free_blocks=10, total_evictions=1))
    assert ag.ratio == 1.0


def test_sglang_retraction_with_an_empty_batch_leaves_the_ratio_and_is_remembered():
    ag = _ready(SGLangReservation())
    ag.act(None, FakeView(active=[], queue=[(5, 0, 10)], free_blocks=100, total_evictions=2))
    assert ag.ratio == pytest.approx(0.7) and ag.evictions_seen == 2
    # the same eviction count next step, with a batch: a decay step, not a reset
    ag.act(None, FakeView(active=[(4, 10, 100)], free_blocks=100, total_evictions=2))
    assert ag.ratio == pytest.approx(0.7 - 0.602 / 600)


def test_sglang_reset_of_an_episode_restores_the_initial_ratio():
    ag = _ready(SGLangReservation())
    ag.act(None, FakeView(active=[(4, 90, 100)], free_blocks=10, total_evictions=5))
    _ready(ag)
    assert ag.ratio == pytest.approx(0.7) and ag.evictions_seen == 0


# --------------------------------------------------------------------------- SGLang: the budget


def test_sglang_admits_heads_while_their_whole_cost_is_below_the_room():
    # an empty running batch: no decay and no reservation, rem = free_blocks * block_size = 30.
    # queue costs (l + g) + min(mt - g, clip): (3+0)+7 = 10, (2+0)+8 = 10, (5+0)+5 = 10, ...
    # cumsum 10, 20, 30, 40: SGLang stops at the first head whose total reaches rem (>= 30):
    # heads 1 and 2 are admitted (10 < 30, 20 < 30), the third (30 >= 30) is not.
    ag = _ready(SGLangReservation())
    q = [(3, 0, 7), (2, 0, 8), (5, 0, 5), (1, 0, 9)]
    assert ag.act(None, FakeView(queue=q, free_blocks=30)) == 2
    # one token more of room: 30 < 31, three heads
    assert ag.act(None, FakeView(queue=q, free_blocks=31)) == 3
    # blocks of 16 tokens: rem = 2 * 16 = 32 -> three heads (30 < 32), the fourth (40) not
    assert ag.act(None, FakeView(queue=q, free_blocks=2, block_size=16)) == 3
    # room for everything: all four
    assert ag.act(None, FakeView(queue=q, free_blocks=1000)) == 4


def test_sglang_reserves_the_running_batchs_scaled_remaining_caps():
    # ratio after one decay step from 0.7 with decay 0.21 (factor 0.1, 3 steps): 0.49
    # running: (l, j, mt) = (4, 10, 110), (4, 0, 50): remaining caps 100 and 50, reserved
    # 0.49 * 150 = 73.5; free 100 tokens -> rem = 26.5
    # queue costs: (5 + 0) + 5 = 10, (1 + 0) + 9 = 10, 10: cumsum 10, 20, 30 -> two below 26.5
    ag = _ready(SGLangReservation(min_new_token_ratio_factor=0.1, new_token_ratio_decay_steps=3))
    v = FakeView(active=[(4, 10, 110), (4, 0, 50)], queue=[(5, 0, 5), (1, 0, 9), (2, 0, 8)], free_blocks=100)
    assert ag.act(None, v) == 2
    # next step: ratio 0.28, reserved 42, rem 58: all three (30 < 58)
    assert ag.act(None, v) == 3


def test_sglang_admits_nobody_when_the_reservation_fills_the_room():
    # ratio 0.7 - 0.602/600 after the step; remaining cap 200 -> reserved ~ 139.8 > 100 free: none
    ag = _ready(SGLangReservation())
    assert ag.act(None, FakeView(active=[(4, 0, 200)], queue=[(1, 0, 1)], free_blocks=100)) == 0
    ag = _ready(SGLangReservation())
    v = FakeView(active=[(0, 80, 100)], queue=[(1, 0, 1)], free_blocks=100, total_evictions=1)
    # reset: ratio = min(1, (80 + 20) / 100) = 1; reserved = 1 * (100 - 80) = 20; rem = 80 -> head cost 2 < 80
    assert ag.act(None, v) == 1
    v = FakeView(active=[(0, 80, 100)], queue=[(1, 0, 1)], free_blocks=20, total_evictions=2)
    # reserved 20, free 20: rem = 0 -> none, even for a head costing 2
    assert ag.act(None, v) == 0


def test_sglang_costs_count_kept_output_and_clip_the_cap():
    # a requeued request (vllm-v1 recompute) with g = 30 generated: cost (l + g) + min(mt - g, clip)
    # = (10 + 30) + (100 - 30) = 110; rem 111 -> admitted, rem 110 -> not (110 >= 110)
    ag = _ready(SGLangReservation())
    assert ag.act(None, FakeView(queue=[(10, 30, 100)], free_blocks=111)) == 1
    assert ag.act(None, FakeView(queue=[(10, 30, 100)], free_blocks=110)) == 0
    # clip 50: cost (10 + 30) + min(70, 50) = 90
    ag = _ready(SGLangReservation(clip_max_new_tokens=50))
    assert ag.act(None, FakeView(queue=[(10, 30, 100)], free_blocks=91)) == 1
    assert ag.act(None, FakeView(queue=[(10, 30, 100)], free_blocks=90)) == 0
    # the clip applies to the running batch's reservation too (remaining cap 1000 clipped to 50):
    ag = _ready(SGLangReservation(clip_max_new_tokens=50, min_new_token_ratio_factor=0.1,
                                  new_token_ratio_decay_steps=3))
    # ratio 0.49; reserved 0.49 * min(1000, 50) = 24.5; free 100 -> rem 75.5; head cost 1 + 50 = 51 -> 1
    # (without the clip: reserved 490 -> none)
    assert ag.act(None, FakeView(active=[(4, 0, 1000)], queue=[(1, 0, 1000), (1, 0, 1000)], free_blocks=100)) == 1


def test_sglang_reads_at_most_max_budget_heads_and_returns_0_on_an_empty_queue():
    ag = _ready(SGLangReservation(), max_budget=3)
    v = FakeView(queue=[(1, 0, 1)] * 10, free_blocks=1000)
    assert ag.act(None, v) == 3
    assert v.queue_calls == [3]
    v = FakeView(active=[(4, 0, 10)], queue=[], free_blocks=1000)
    assert ag.act(None, v) == 0 and v.queue_calls == []
    assert ag.ratio == pytest.approx(0.7 - 0.602 / 600)  # the ratio still moved this step


# --------------------------------------------------------------------------- TensorRT-LLM


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3", 10**100, float("nan")])
def test_trt_max_num_requests_must_be_a_positive_integer_or_none(bad):
    with pytest.raises(ValueError, match="max_num_requests"):
        GuaranteedNoEvict(max_num_requests=bad)


def test_trt_arguments_and_label():
    assert GuaranteedNoEvict(max_num_requests=1).max_num_requests == 1
    assert GuaranteedNoEvict().env_options() == {"max_budget": 1024}
    assert GuaranteedNoEvict(max_budget=9).env_options() == {"max_budget": 9}
    assert GuaranteedNoEvict().label() == "trt-no-evict"
    assert GuaranteedNoEvict(max_num_requests=4).label() == "trt-no-evict n=4"


def test_trt_reserves_each_running_requests_blocks_to_completion():
    # paper-mode accounting (block 1, lookahead 1): blocks_for(x) = x + 1.
    # running (l, j, mt): (10, 5, 20) -> final blocks_for(10 + 20 - 1) = 30;
    #                     (4, 0, 6)   -> blocks_for(4 + 6 - 1) = 10.  reserved 40 of 60: avail 20.
    # queue: (3, 0, 5) -> blocks_for(7) = 8, (2, 0, 4) -> 6, (1, 0, 7) -> 8: cumsum 8, 14, 22.
    # TRT takes heads while the cumsum fits (<= 20): two.
    ag = _ready(GuaranteedNoEvict())
    q = [(3, 0, 5), (2, 0, 4), (1, 0, 7)]
    assert ag.act(None, FakeView(active=[(10, 5, 20), (4, 0, 6)], queue=q, num_blocks=60)) == 2
    # 2 more blocks: cumsum 22 <= 22 fits exactly (side="right": a request that exactly fills the cache runs)
    assert ag.act(None, FakeView(active=[(10, 5, 20), (4, 0, 6)], queue=q, num_blocks=62)) == 3
    # 53 blocks: avail 13; 8 <= 13 < 14: one
    assert ag.act(None, FakeView(active=[(10, 5, 20), (4, 0, 6)], queue=q, num_blocks=53)) == 1


def test_trt_counts_blocks_already_held_beyond_the_final_estimate():
    # a request holding more blocks than its final need (e.g. a vllm-v1 lookahead slot) keeps them:
    # running final = blocks_for(10 + 20 - 1) = 30 but it holds 35: reserved 35, avail 5 of 40.
    # head needs blocks_for(3 + 1 - 1) = 4 <= 5: one; the next (4 more) does not fit.
    ag = _ready(GuaranteedNoEvict())
    v = FakeView(active=[(10, 5, 20, 35)], queue=[(3, 0, 1), (3, 0, 1)], num_blocks=40)
    assert ag.act(None, v) == 1
    # held fewer than final: the final (30) counts: avail 10 -> both (4 + 4 = 8 <= 10)
    v = FakeView(active=[(10, 5, 20, 12)], queue=[(3, 0, 1), (3, 0, 1)], num_blocks=40)
    assert ag.act(None, v) == 2


def test_trt_block_rounding():
    # blocks of 16 tokens, lookahead 0: blocks_for(x) = ceil(x / 16).
    # running (20, 3, 45): final ceil((20 + 45 - 1) / 16) = ceil(64/16) = 4. 10 blocks: avail 6.
    # queue (16, 0, 1): ceil(16/16) = 1; (16, 0, 2): ceil(17/16) = 2; (40, 0, 9): ceil(48/16) = 3
    # cumsum 1, 3, 6 <= 6: three
    ag = _ready(GuaranteedNoEvict())
    q = [(16, 0, 1), (16, 0, 2), (40, 0, 9)]
    v = FakeView(active=[(20, 3, 45)], queue=q, num_blocks=10, block_size=16, lookahead=0)
    assert ag.act(None, v) == 3
    v = FakeView(active=[(20, 3, 45)], queue=q, num_blocks=9, block_size=16, lookahead=0)
    assert ag.act(None, v) == 2


def test_trt_admits_nobody_with_no_room_or_no_queue():
    ag = _ready(GuaranteedNoEvict())
    # reserved = blocks_for(10 + 10 - 1) = 20 = num_blocks: avail 0 -> none
    assert ag.act(None, FakeView(active=[(10, 0, 10)], queue=[(1, 0, 1)], num_blocks=20)) == 0
    # one more block: the head needs blocks_for(1) = 2 > 1: still none
    assert ag.act(None, FakeView(active=[(10, 0, 10)], queue=[(1, 0, 1)], num_blocks=21)) == 0
    # two more: it fits exactly
    assert ag.act(None, FakeView(active=[(10, 0, 10)], queue=[(1, 0, 1)], num_blocks=22)) == 1
    v = FakeView(active=[], queue=[], num_blocks=100)
    assert ag.act(None, v) == 0 and v.queue_calls == []


def test_trt_caps_running_requests_and_budget():
    # max_num_requests 3 with 1 running: at most 2 more, whatever fits
    ag = _ready(GuaranteedNoEvict(max_num_requests=3))
    v = FakeView(active=[(1, 0, 1)], queue=[(1, 0, 1)] * 10, num_blocks=1000)
    assert ag.act(None, v) == 2 and v.queue_calls == [2]
    # 3 running: none, and the queue is not read
    v = FakeView(active=[(1, 0, 1)] * 3, queue=[(1, 0, 1)] * 10, num_blocks=1000)
    assert ag.act(None, v) == 0 and v.queue_calls == []
    # more running than the cap (it was lowered): none
    v = FakeView(active=[(1, 0, 1)] * 4, queue=[(1, 0, 1)] * 10, num_blocks=1000)
    assert ag.act(None, v) == 0
    # no cap: the env's max_budget bounds the heads read
    ag = _ready(GuaranteedNoEvict(), max_budget=4)
    v = FakeView(queue=[(1, 0, 1)] * 10, num_blocks=1000)
    assert ag.act(None, v) == 4 and v.queue_calls == [4]
    # both: the smaller of max_budget 4 and max_num_requests - running = 10 - 1 = 9
    ag = _ready(GuaranteedNoEvict(max_num_requests=10), max_budget=4)
    v = FakeView(active=[(1, 0, 1)], queue=[(1, 0, 1)] * 10, num_blocks=1000)
    assert ag.act(None, v) == 4 and v.queue_calls == [4]


# --------------------------------------------------------------------------- in the environment


def _first_action(name, **kw):
    env = gym.make("FlowControl-v0", **kw)
    env.reset(seed=0)
    ag = make_agent(name)
    ag.reset(env.unwrapped.config, seed=0)
    return ag.act(None, env.unwrapped.view())


def test_trt_first_slot_in_the_paper_mode_by_hand():
    # a trace of 4 requests at t = 0 with (l, o) = (10, 20), (10, 40), (10, 60), (10, 30), M = 200.
    # paper-mode max_tokens = max(min(bound, M - l), o) with the trace's bound 60: 60 each.
    # each needs blocks_for(10 + 60 - 1) = 70 (block 1, lookahead 1): cumsum 70, 140, 210 <= 200: two.
    trace = {"kind": "trace", "arrival": [0, 0, 0, 0], "prompt_len": [10, 10, 10, 10], "output_len": [20, 40, 60, 30]}
    assert _first_action("trt-no-evict", workload=trace, M=200, max_budget=16) == 2
    assert _first_action("trt-no-evict", workload=trace, M=210, max_budget=16) == 3


def test_sglang_first_slot_in_the_paper_mode_by_hand():
    # same trace, empty batch: no reservation, rem = M = 200. Cost per head l + max_tokens = 70:
    # cumsum 70, 140, 210: heads with cumsum < 200: two. With M = 211: 210 < 211 -> three.
    trace = {"kind": "trace", "arrival": [0, 0, 0, 0], "prompt_len": [10, 10, 10, 10], "output_len": [20, 40, 60, 30]}
    assert _first_action("sglang-reserve", workload=trace, M=200, max_budget=16) == 2
    assert _first_action("sglang-reserve", workload=trace, M=211, max_budget=16) == 3
    assert _first_action("sglang-reserve", workload=trace, M=210, max_budget=16) == 2


def test_trt_admits_into_a_single_free_block():
    # blocks of 16, lookahead 1 (vllm-v1's decode slot): blocks_for(x) = ceil((x + 1) / 16).
    # running (10, 0, 20): final ceil((10 + 20 - 1 + 1) / 16) = 2 of 3 blocks: avail 1.
    # head (1, 0, 1): ceil((1 + 1 - 1 + 1) / 16) = 1 <= 1: admitted (avail 1 is room, not none)
    ag = _ready(GuaranteedNoEvict())
    v = FakeView(active=[(10, 0, 20)], queue=[(1, 0, 1), (1, 0, 1)], num_blocks=3, block_size=16)
    assert ag.act(None, v) == 1


def test_trt_one_request_below_the_cap_admits_one():
    # max_num_requests 3 with 2 running: room for exactly one more
    ag = _ready(GuaranteedNoEvict(max_num_requests=3))
    v = FakeView(active=[(1, 0, 1)] * 2, queue=[(1, 0, 1)] * 5, num_blocks=1000)
    assert ag.act(None, v) == 1 and v.queue_calls == [1]


# ---------------------------------------------------------------- the real view's accounting in the paper mode


def test_the_paper_mode_view_counts_the_decode_slot_and_each_active_requests_next_token():
    """The paper mode's view: blocks of one token and a lookahead of 1 (a request holds l + j + 1 tokens while it
    generates its (j + 1)-th), and the free room M - demand = M - (held + n_active). Four requests (l = 10,
    o = 20, 40, 60, 30), two at t = 0 and two at t = 1, M = 246: slot 0 starts the first two (B_t = 2), each
    generates one token: held 2 (10 + 1) = 22, n_active 2, free 246 - 24 = 222; blocks_for(69) = 70."""
    trace = {"kind": "trace", "arrival": [0, 0, 1, 1], "prompt_len": [10, 10, 10, 10], "output_len": [20, 40, 60, 30]}
    env = gym.make("FlowControl-v0", workload=trace, M=246, max_budget=16).unwrapped
    env.reset(seed=0)
    env.step(2)
    v = env.view()
    assert (v.held_tokens, v.n_active, v.demand) == (22, 2, 24)
    assert v.free_blocks == 222 and v.lookahead == 1 and v.blocks_for(69) == 70


def test_trt_first_slot_in_the_paper_mode_one_token_below_the_boundary():
    """The trace of test_trt_first_slot_in_the_paper_mode_by_hand, M = 209: each request needs blocks_for(10 + 60
    - 1) = 70 (its peak l + max_tokens, the decode slot included): cumsum 70, 140, 210 > 209: two (without the
    decode slot, 69 each: 207 <= 209 would take three)."""
    trace = {"kind": "trace", "arrival": [0, 0, 0, 0], "prompt_len": [10, 10, 10, 10], "output_len": [20, 40, 60, 30]}
    assert _first_action("trt-no-evict", workload=trace, M=209, max_budget=16) == 2


def test_sglang_second_slot_in_the_paper_mode_reads_the_free_room_net_of_the_decode_slots():
    """The trace of the view test, M = 246, sglang-reserve at its defaults. Slot 0: empty batch, rem = 246,
    costs l + max_tokens = 70, 70: cumsum 140 < 246: both start. Slot 1: the ratio decays once (two decoding):
    0.7 - (0.7 - 0.098) / 600 = 0.69899667; the running requests reserve (60 - 1) 0.69899667 each, 82.4816 in
    all; rem = free 222 - 82.4816 = 139.518: of the new heads' cumsum 70, 140 only the first is below: one.
    (Counting free as M - held = 224, without each active request's decode slot, rem 141.5 would take two.)"""
    trace = {"kind": "trace", "arrival": [0, 0, 1, 1], "prompt_len": [10, 10, 10, 10], "output_len": [20, 40, 60, 30]}
    env = gym.make("FlowControl-v0", workload=trace, M=246, max_budget=16).unwrapped
    obs, _ = env.reset(seed=0)
    ag = make_agent("sglang-reserve")
    ag.reset(env.config, seed=0)
    first = ag.act(obs, env.view())
    obs, *_ = env.step(first)
    assert first == 2 and ag.act(obs, env.view()) == 1
    assert ag.ratio == pytest.approx(0.7 - (0.7 - 0.098) / 600)
