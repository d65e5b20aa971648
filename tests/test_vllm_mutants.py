"""The ``vllm-v1`` engine mode's rules that the mutation run of ``flowgym/sim/vllm.py`` found
unpinned by ``tests/test_vllm.py`` (the survivors are listed with these tests in the run's
report). Every expected value is worked out by hand from vLLM V1's scheduling rules as the
module docstring states them; the derivation is in each test's comments.

Notation: ``bs`` block size, ``NB`` blocks (``M // bs``), ``la`` lookahead, ``cap`` the token
budget ``max_num_batched_tokens``. A request with ``comp`` computed tokens that is scheduled ``s``
tokens holds ``ceil((comp + s + la) / bs)`` blocks; one prefilled over its whole prompt ``l``
samples its first output token in that step, and then decodes one token per step.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from flowgym.sim.engine import Engine
from flowgym.sim.vllm import Deque, VllmEngine, VllmOptions, default_max_tokens
from flowgym.sim.workloads import Trace

from tests._vllm import UNLIMITED
from tests._vllm import vllm_engine as _eng
from tests._vllm import vllm_step as _step


# ---------------------------------------------------------------- token budget of running requests


def test_a_running_prefill_gets_only_the_token_budget_left_after_the_decodes_before_it():
    """cap = 32, bs = 16. A (l=3, o=50) and B (l=100, o=2), both arriving at step 0.

    step 0, B_t=1: A prefills its 3 tokens (comp 3, 1 block), samples token 1.
    step 1, B_t=1: A decodes 1 (comp 4); B is admitted with the 32 - 1 = 31 tokens left (2 blocks).
    step 2, B_t=0: A decodes 1 (comp 5); B is second in running order: 32 - 1 = 31 left of its
      69 remaining prompt tokens -> comp 62, ceil(62/16) = 4 blocks.
    step 3: A comp 6; B 31 more -> 93, ceil(93/16) = 6 blocks.
    step 4: A comp 7; B's last 7 -> 100, ceil(100/16) = 7 blocks; B samples its first token.
    Prefill tokens per step: 3, 31, 31, 31, 7; decodes: 0, 1, 1, 1, 1.
    """
    eng = _eng(10_000, Trace([0, 0], [3, 100], [50, 2]), block_size=16, max_num_batched_tokens=32)
    _step(eng, 1)
    _step(eng, 1)
    assert eng.active_computed().tolist() == [4, 31]
    seen = []
    for _ in range(3):
        _step(eng, 0)
        seen.append((eng.active_computed().tolist(), eng.active_blocks().tolist()))
    assert seen == [([5, 62], [1, 4]), ([6, 93], [1, 6]), ([7, 100], [1, 7])]
    steps = eng.step_series()
    assert steps["prefill_tokens"].tolist() == [3, 31, 31, 31, 7]
    assert steps["decode_requests"].tolist() == [0, 1, 1, 1, 1]
    assert eng.gen.tolist()[:2] == [5, 1]


# ---------------------------------------------------------------- victim orders other than LIFO


def _three(order: str) -> VllmEngine:
    """bs = 1, NB = 18, unlimited budgets. A (l=2), B (l=8), C (l=6), outputs 10, all at step 0.

    step 0, B_t=3: 2 + 8 + 6 = 16 <= 18 blocks: all admitted, each prefills and samples token 1
      (comp 2, 8, 6; gen 1, 1, 1).
    step 1: each decodes one token: 3 + 9 + 7 = 19 > 18 blocks: excess 1, one victim whose
      blocks (3, 9 or 7) cover it is enough.
    """
    eng = _eng(18, Trace([0, 0, 0], [2, 8, 6], [10, 10, 10]), block_size=1, preempt_order=order, **UNLIMITED)
    eng.arrive()
    assert eng.queued_prompt_tokens == 2 + 8 + 6
    st = eng.serve(3)
    assert st.admitted == 3 and st.usage == 16
    assert eng.n_queued == 0 and eng.queued_prompt_tokens == 0  # all three prompts left the queue
    return eng


def test_least_computed_preempts_the_fewest_computed_tokens_and_only_as_many_as_needed():
    """least-computed: computed tokens 2 (A), 8 (B), 6 (C): A goes first and frees 3 >= 1, so A
    alone is preempted (LIFO would pop C). A keeps its token (recompute), rejoins the queue front;
    recomputed tokens: A's 2. Running after step 1: B (9 blocks), C (7 blocks) = 16.

    step 2, B_t=3: B wants 10, C 8: 18 blocks, exactly the cache: nobody is preempted. A's
    readmission needs l + j = 3 blocks, none is free: refused (1 refused in all).
    """
    eng = _three("least-computed")
    st = _step(eng, 3)
    assert st.evicted == 1 and st.admitted == 0 and st.usage == 16
    assert eng.active_ids().tolist() == [1, 2] and eng.queue_ids().tolist() == [0]
    assert eng.gen[0] == 1 and eng.recomputed_tokens == 2
    st = _step(eng, 3)
    assert st.evicted == 0 and st.admitted == 0 and st.usage == 18
    assert eng.active_ids().tolist() == [1, 2] and eng.active_blocks().tolist() == [10, 8]
    assert eng.total_refused == 1 and eng.total_evictions == 1


def test_least_progress_preempts_the_longest_prompt_among_equal_outputs():
    """least-progress (SGLang's retract_decode): all three have 1 output token; among ties the
    longest prompt goes first: B (l=8), freeing 9 >= 1: B alone is preempted (least-computed
    would take A, LIFO C). Recomputed tokens: B's 8. Running: A (3 blocks), C (7 blocks)."""
    eng = _three("least-progress")
    st = _step(eng, 3)
    assert st.evicted == 1 and st.usage == 10
    assert eng.active_ids().tolist() == [0, 2] and eng.queue_ids().tolist() == [1]
    assert eng.recomputed_tokens == 8


def test_least_computed_ties_go_newest_first():
    """bs = 1, NB = 9, A and B (l=4, o=5; 4 + 5 - 1 = 8 <= 9 blocks: accepted) admitted together:
    8 blocks. Step 1 they want 5 + 5 = 10 > 9; both computed 4: the tie goes to the newest, B,
    and B alone frees enough."""
    eng = _eng(9, Trace([0, 0], [4, 4], [5, 5]), block_size=1, preempt_order="least-computed", **UNLIMITED)
    assert _step(eng, 2).admitted == 2
    st = _step(eng, 2)
    assert st.evicted == 1 and eng.active_ids().tolist() == [0] and eng.queue_ids().tolist() == [1]


# ---------------------------------------------------------------- LIFO with two victims


def test_two_lifo_victims_in_one_step_requeue_both_prompts_and_recompute_both():
    """bs = 4, NB = 3 blocks; A, B, C with l = 4, o = 8 (ceil((4 + 8 - 1)/4) = 3 <= 3: accepted).

    step 0, B_t=3: each prompt fills one block: 3 blocks, all admitted.
    step 1: each decode needs ceil(5/4) = 2 blocks: prefix sums 2, 4, 6: only A fits in 3, so C
      then B are popped (two victims), both put at the queue front in the order B, C. Their
      computed tokens (4 + 4 = 8) are dropped; the queue holds their prompts, 4 + 4 = 8 tokens.
      Usage: A's 2 blocks = 8 tokens. No step without a preemption records recomputed tokens.
    """
    eng = _eng(12, Trace([0, 0, 0], [4, 4, 4], [8, 8, 8]), block_size=4, **UNLIMITED)
    _step(eng, 3)
    st = _step(eng, 3)
    assert st.evicted == 2 and st.usage == 8
    assert eng.queue_ids().tolist() == [1, 2]
    assert eng.n_queued == 2 and eng.queued_prompt_tokens == 8
    assert eng.recomputed_tokens == 8
    assert eng.step_series()["recomputed_tokens"].tolist() == [0, 8]
    assert eng.overflow_events == 1 and eng.total_evictions == 2
    # held (read by the observations) is the allocated KV tokens: blocks times block size
    assert eng.used_blocks == 2 and eng.held == 8


# ---------------------------------------------------------------- admission edges


def test_admission_may_fill_the_free_blocks_exactly():
    """bs = 1, NB = 8: A and B (l=4, o=2) need 4 + 4 = 8 blocks, exactly the cache: both admitted."""
    eng = _eng(8, Trace([0, 0], [4, 4], [2, 2]), block_size=1, **UNLIMITED)
    st = _step(eng, 2)
    assert st.admitted == 2 and st.usage == 8 and eng.total_refused == 0


def test_a_head_is_admitted_with_one_token_left_but_not_with_none():
    """bs = 16, chunked prefill. A (l=16) is admitted first and takes 16 tokens.
    cap = 16: 0 tokens are left for B (l=5): B is refused (V1 schedules no empty chunk).
    cap = 17: 1 token is left: B is admitted with a 1-token chunk (comp 1, 1 block)."""
    tr = Trace([0, 0], [16, 5], [4, 4])
    eng = _eng(1600, tr, block_size=16, max_num_batched_tokens=16)
    st = _step(eng, 2)
    assert st.admitted == 1 and eng.total_refused == 1 and eng.active_computed().tolist() == [16]
    eng = _eng(1600, tr, block_size=16, max_num_batched_tokens=17)
    st = _step(eng, 2)
    assert st.admitted == 2 and eng.total_refused == 0
    assert eng.active_computed().tolist() == [16, 1] and eng.active_blocks().tolist() == [1, 1]


def test_an_unchunked_prompt_that_exactly_fits_the_budget_left_is_admitted():
    """chunked_prefill=False, cap = 20 (= M, as unchunked prefill needs): A (l=12) leaves 8 tokens, B (l=8) needs
    8 <= 8: admitted (5 blocks of 4 tokens, 3 + 2 of them)."""
    eng = _eng(20, Trace([0, 0], [12, 8], [4, 4]), block_size=4, max_num_batched_tokens=20,
               chunked_prefill=False)
    st = _step(eng, 2)
    assert st.admitted == 2 and eng.active_computed().tolist() == [12, 8]


def test_admission_allocates_the_lookahead_slots():
    """bs = 4, la = 1: a 4-token prompt allocates ceil((4 + 1)/4) = 2 blocks."""
    eng = _eng(400, Trace([0], [4], [3]), block_size=4, lookahead_tokens=1, **UNLIMITED)
    st = _step(eng, 1)
    assert eng.active_blocks().tolist() == [2] and st.usage == 8


def test_full_prompt_reservation_counts_the_lookahead():
    """bs = 4, la = 1, cap = 16, reserve_full_prompt: a 20-token prompt's first chunk is 16 tokens
    (ceil(17/4) = 5 blocks) but the reservation covers the whole prompt: ceil((20 + 1)/4) = 6."""
    eng = _eng(400, Trace([0], [20], [3]), block_size=4, lookahead_tokens=1, max_num_batched_tokens=16,
               reserve_full_prompt=True)
    st = _step(eng, 1)
    assert eng.active_computed().tolist() == [16] and eng.active_blocks().tolist() == [6] and st.usage == 24


# ---------------------------------------------------------------- count-mode admission


def test_count_admission_refuses_nothing_it_starts_and_respects_max_num_seqs():
    """admission='count' (token budget unlimited), max_num_seqs = 2, three requests (l=5, o=20).
    step 0, B_t=3: room for 2: A and B start, C is refused (1).
    step 1, B_t=3: 2 running = max_num_seqs: no room, C refused again (2 in all).
    Without max_num_seqs, B_t=2 starts 2 and refuses none."""
    eng = _eng(10_000, Trace([0, 0, 0], [5, 5, 5], [20, 20, 20]), admission="count", max_num_batched_tokens=None,
               max_num_seqs=2)
    assert _step(eng, 3).admitted == 2
    assert _step(eng, 3).admitted == 0
    assert eng.step_series()["refused"].tolist() == [1, 1] and eng.total_refused == 2
    assert eng.active_ids().tolist() == [0, 1]
    eng = _eng(10_000, Trace([0, 0, 0], [5, 5, 5], [20, 20, 20]), admission="count", **UNLIMITED)
    assert _step(eng, 2).admitted == 2
    assert eng.step_series()["refused"].tolist() == [0] and eng.total_refused == 0


# ---------------------------------------------------------------- records


def test_a_request_with_two_tokens_has_one_inter_token_gap_of_one_step():
    """l = 4, o = 2: token 1 at the end of step 0, token 2 at the end of step 1: one gap of 1."""
    eng = _eng(400, Trace([0], [4], [2]), block_size=4, **UNLIMITED)
    _step(eng, 1)
    _step(eng, 1)
    m = eng.serving_metrics()
    assert m["inter_token_latency_p50"] == 1.0 and m["inter_token_latency_p99"] == 1.0
    assert eng.request_log()["finish"].tolist() == [2]


def test_completed_tokens_of_a_step_sum_every_completion_and_reset_to_zero():
    """bs = 1, A (l=3, o=2) and B (l=5, o=2): both prefill in step 0 (token 1), both finish in
    step 1 (token 2): l + o = 5 + 7 = 12 completed tokens. Step 2 completes nothing: 0."""
    eng = _eng(100, Trace([0, 0], [3, 5], [2, 2]), block_size=1, **UNLIMITED)
    _step(eng, 2)
    assert eng.last_completed_tokens == 0
    st = _step(eng, 2)
    assert st.completed == 2 and eng.last_completed_tokens == 12
    _step(eng, 2)
    assert eng.last_completed_tokens == 0


def test_continuous_time_runs_past_the_first_clock_array():
    """Continuous time, linear latency c0 = 0.5, c_prefill = 0.25, c_decode = 0.125, c_kv = 0:
    one request (l=1, o=300) arriving at 0. Step 0 prefills 1 token: 0.5 + 0.25 = 0.75 s;
    steps 1..299 decode one request each: 0.625 s. The request finishes at step 300, at
    0.75 + 299 * 0.625 = 187.625 s (more steps than the 256 entries the clock starts with)."""
    lat = {"kind": "linear", "c0": 0.5, "c_prefill": 0.25, "c_decode": 0.125, "c_kv": 0.0}
    eng = VllmEngine(1600, Trace(np.array([0.0]), [1], [300], timed=True), time_model=lat,
                     options={"block_size": 16, **UNLIMITED})
    eng.reset(np.random.default_rng(0))
    for _ in range(300):
        eng.arrive()
        eng.serve(1)
    assert eng.t == 300 and eng.now == 187.625
    assert eng.request_log()["finish"].tolist() == [300]


def test_continuous_time_charges_each_step_its_prefill_tokens_decodes_context_and_batch():
    """The latency model gets, per step, P = prefill tokens scheduled, D = decoding requests,
    K = their context l + j, B = requests scheduled. The chunking case of the first test
    (cap = 32; A: l=3, o=50; B: l=100, o=2; both arrive at time 0):
    step 0: A prefills 3 -> (3, 0, 0, 1); step 1: A decodes with context 3 + 1 = 4, B's first
    chunk is 31 -> (31, 1, 4, 2); steps 2, 3: (31, 1, 5, 2), (31, 1, 6, 2); step 4: B's last 7
    -> (7, 1, 7, 2)."""
    calls = []

    def lat(P, D, K, B):
        calls.append((P, D, K, B))
        return 1.0

    eng = VllmEngine(10_000, Trace(np.array([0.0, 0.0]), [3, 100], [50, 2], timed=True), time_model=lat,
                     options={"block_size": 16, "max_num_batched_tokens": 32})
    eng.reset(np.random.default_rng(0))
    for b in (1, 1, 0, 0, 0):
        eng.arrive()
        eng.serve(b)
    assert calls == [(3, 0, 0, 1), (31, 1, 4, 2), (31, 1, 5, 2), (31, 1, 6, 2), (7, 1, 7, 2)]
    assert eng.now == 5.0


# ---------------------------------------------------------------- construction and reset


def test_a_cache_of_one_block_is_valid_and_a_smaller_one_is_refused():
    """num_blocks = M // block_size: M = 16, bs = 16 is one block (a request with l + o - 1 <= 16
    runs in it); M = 15 holds none: ValueError."""
    eng = _eng(16, Trace([0], [8], [9]), block_size=16, **UNLIMITED)
    assert eng.num_blocks == 1 and eng.free_blocks == 1
    st = _step(eng, 1)
    assert st.admitted == 1 and eng.free_blocks == 0
    with pytest.raises(ValueError, match="no block fits"):
        VllmEngine(15, Trace([0], [8], [9]), options={"block_size": 16})


def test_reset_frees_every_block():
    """After reset no block is held, also after a run that held some: free_blocks = num_blocks."""
    eng = _eng(64, Trace([0], [20], [9]), block_size=16, **UNLIMITED)
    assert eng.free_blocks == 4 and eng.used_blocks == 0
    _step(eng, 1)
    assert eng.free_blocks == 4 - 2  # ceil(20/16) = 2 blocks
    eng.reset(np.random.default_rng(0))
    assert eng.free_blocks == 4 and eng.used_blocks == 0


def test_last_evicted_is_the_preemptions_of_the_last_step_and_zero_after_reset():
    """The two-victim case (bs = 4, NB = 3, three requests l = 4, o = 8): step 0 preempts nobody,
    step 1 preempts two; a reset clears it."""
    eng = _eng(12, Trace([0, 0, 0], [4, 4, 4], [8, 8, 8]), block_size=4, **UNLIMITED)
    assert eng.last_evicted == 0
    _step(eng, 3)
    assert eng.last_evicted == 0
    _step(eng, 3)
    assert eng.last_evicted == 2
    eng.reset(np.random.default_rng(0))
    assert eng.last_evicted == 0


def test_first_token_is_minus_one_until_the_first_output_token():
    """bs = 16, cap = 16: A (l=16) takes the whole step-0 budget; B (l=4) waits (0 tokens left).
    After step 0: A has its first token (step 1), B none (-1) and B counts in no time to first token.
    Step 1: A decodes 1, B is admitted with 15 left >= 4 and samples its first token: step 2."""
    eng = _eng(1600, Trace([0, 0], [16, 4], [5, 5]), block_size=16, max_num_batched_tokens=16)
    _step(eng, 2)
    assert eng.request_log()["first_token"].tolist() == [1, -1]
    assert eng.serving_metrics()["time_to_first_token_mean"] == 1.0  # A only: 1 - 0
    _step(eng, 2)
    assert eng.request_log()["first_token"].tolist() == [1, 2]


def test_class_queue_counts_arrivals_and_admissions_with_one_fifo_lane():
    """track_class_queue without per-class budgets: one FIFO lane, but the per-class queue counts
    are kept. Classes 0, 1, 1, 2 arrive: [1, 2, 1]; B_t = 2 admits the first two (classes 0, 1):
    [0, 1, 1]."""
    tr = Trace([0, 0, 0, 0], [4, 4, 4, 4], [3, 3, 3, 3], cls=[0, 1, 1, 2], num_classes=3)
    eng = VllmEngine(1600, tr, options={"block_size": 16, **UNLIMITED}, track_class_queue=True)
    eng.reset(np.random.default_rng(0))
    eng.arrive()
    assert eng.class_queue.tolist() == [1, 2, 1] and eng.queue_ids().tolist() == [0, 1, 2, 3]
    assert eng.serve(2).admitted == 2
    assert eng.class_queue.tolist() == [0, 1, 1]


# ---------------------------------------------------------------- the random victim order's stream


def _random_victim(rng) -> int:
    """The case of ``_three`` with ``preempt_order='random'``: step 1 has an excess of 1 block and
    every request holds at least 3, so the victim is the first position of the stream's
    permutation of the 3 running positions (positions are ids here: A=0, B=1, C=2)."""
    eng = VllmEngine(18, Trace([0, 0, 0], [2, 8, 6], [10, 10, 10]), options={"block_size": 1,
                     "preempt_order": "random", **UNLIMITED})
    eng.reset(rng)
    assert _step(eng, 3).admitted == 3
    assert _step(eng, 3).evicted == 1
    return int(eng.queue_ids()[0]), eng


def test_the_random_victim_order_draws_from_the_generators_next_child_stream():
    """The random order draws from ``rng.spawn(1)[0]``, its own stream (the workload's draws do
    not change): for a reused generator each reset takes the next child (spawn keys 0, 1, ...).
    With seed 3 the first two children permute (0, 1, 2) as [0, 1, 2] and [2, 1, 0]: victims A,
    then C (a third child, [1, 2, 0], would give B)."""
    children = np.random.default_rng(3).spawn(2)
    expect = [int(c.permutation(3)[0]) for c in children]
    g = np.random.default_rng(3)
    v0, eng = _random_victim(g)
    eng.reset(g)
    assert _step(eng, 3).admitted == 3 and _step(eng, 3).evicted == 1
    assert [v0, int(eng.queue_ids()[0])] == expect == [0, 2]


def test_a_generator_that_cannot_spawn_falls_back_to_seed_zero():
    """A generator without a spawnable seed sequence (legacy seeding) gets ``default_rng(0)`` for
    the random order: its permutation of 3 is [2, 0, 1]: victim C."""
    bg = np.random.MT19937()
    bg._legacy_seeding(3)
    v, _ = _random_victim(np.random.Generator(bg))
    assert v == int(np.random.default_rng(0).permutation(3)[0]) == 2


# ---------------------------------------------------------------- max_tokens option


def test_max_tokens_output_and_integer_options():
    """'output': each request's cap is its true output; an integer: that cap, raised to the
    output where smaller (outputs 3 and 10, cap 7: 7 and 10)."""
    tr = Trace([0, 0], [5, 5], [3, 10])
    eng = _eng(1000, tr, block_size=1, max_tokens="output")
    eng.arrive()
    assert eng.request_log()["max_tokens"].tolist() == [3, 10]
    eng = _eng(1000, tr, block_size=1, max_tokens=7)
    eng.arrive()
    assert eng.request_log()["max_tokens"].tolist() == [7, 10]


def test_victims_rejoin_the_queue_front_in_running_order_or_its_back_in_pop_order():
    """The two-victim case (bs = 4, NB = 3, l = 4, o = 8) with a fourth request D waiting: step 0
    admits A, B, C (B_t = 3), D waits; step 1 pops C then B. requeue='front' (vLLM
    prepend_request, each before the previous): B, C, D. requeue='back' (SGLang extend): D, C, B."""
    tr = Trace([0, 0, 0, 0], [4, 4, 4, 4], [8, 8, 8, 8])
    for requeue, expect in (("front", [1, 2, 3]), ("back", [3, 2, 1])):
        eng = _eng(12, tr, block_size=4, requeue=requeue, **UNLIMITED)
        assert _step(eng, 3).admitted == 3
        assert _step(eng, 3).evicted == 2
        assert eng.queue_ids().tolist() == expect, requeue
        assert eng.n_queued == 3 and eng.queued_prompt_tokens == 12


# ---------------------------------------------------------------- options and defaults


def test_default_options_are_vllms_and_the_engine_defaults_the_paper_engines():
    """vLLM's defaults: --block-size 16, --max-num-seqs 256, --max-num-batched-tokens 2048 (with
    chunked prefill), no long-prefill threshold, no lookahead; the engine's estimate floor is the
    paper engine's (1)."""
    o = VllmOptions()
    assert (o.block_size, o.max_num_seqs, o.max_num_batched_tokens) == (16, 256, 2048)
    assert (o.long_prefill_token_threshold, o.lookahead_tokens, o.watermark) == (0, 0, 0.0)
    eng = VllmEngine(1600, Trace([0], [4], [3]))
    assert eng.num_blocks == 100 and eng.estimate_floor == Engine(1600, Trace([0], [4], [3])).estimate_floor == 1


@pytest.mark.parametrize("field", ["long_prefill_token_threshold", "lookahead_tokens"])
@pytest.mark.parametrize("bad", [True, 1.5, -1])
def test_nonnegative_integer_options_refuse_bools_floats_and_negatives(field, bad):
    with pytest.raises(ValueError, match=field):
        VllmOptions.from_any({field: bad})
    assert VllmOptions.from_any({field: 0}) == VllmOptions()


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens"])
@pytest.mark.parametrize("bad", [0, -3, True, 2.0])
def test_options_that_may_be_none_still_refuse_bad_integers(field, bad):
    with pytest.raises(ValueError, match=field):
        VllmOptions.from_any({field: bad})
    assert getattr(VllmOptions.from_any({field: None}), field) is None


def test_default_max_tokens_never_exceeds_what_the_cache_leaves_after_the_prompt():
    """A workload bound of 60 with M = 100 and l = 50: the cap is min(60, 100 - 50) = 50 (vLLM's
    max_model_len - l), raised to o = 10 where smaller: 50."""
    assert default_max_tokens(np.array([50, 95]), np.array([10, 10]), 60, 100).tolist() == [50, 10]


@pytest.mark.parametrize("bad", ["foo", True, 0, -2, 2.5])
def test_max_tokens_option_refuses_anything_but_default_output_or_a_positive_integer(bad):
    with pytest.raises(ValueError, match="max_tokens"):
        VllmOptions.from_any({"max_tokens": bad})


def test_max_tokens_option_of_one_is_valid():
    assert VllmOptions.from_any({"max_tokens": 1}).max_tokens == 1
    eng = _eng(1000, Trace([0, 0], [5, 5], [1, 4]), block_size=1, max_tokens=1)
    eng.arrive()
    assert eng.request_log()["max_tokens"].tolist() == [1, 4]  # raised to the output where smaller


def test_one_victim_requeued_at_the_back_is_in_the_queue():
    """bs = 1, NB = 18, A (l=2), B (l=8), C (l=6), o = 10, LIFO, requeue='back': step 1 needs
    3 + 9 + 7 = 19 > 18; the prefix A, B (12) fits, C is popped and is the whole queue."""
    eng = _eng(18, Trace([0, 0, 0], [2, 8, 6], [10, 10, 10]), block_size=1, requeue="back", **UNLIMITED)
    assert _step(eng, 3).admitted == 3
    assert _step(eng, 3).evicted == 1
    assert eng.queue_ids().tolist() == [2] and eng.n_queued == 1


def test_victims_prepended_to_a_queue_that_fills_its_buffer():
    """The two-victim case (bs = 4, NB = 3, l = 4, o = 8): step 0 admits A, B, C and empties the
    queue; 255 requests arrive at step 1 (ids 3..257, filling 255 of the queue buffer's 256
    entries); step 1 pops C and B to the queue front: the queue is B, C, then the 255 arrivals."""
    n = 3 + 255
    tr = Trace([0, 0, 0] + [1] * 255, [4] * n, [8] * n)
    eng = _eng(12, tr, block_size=4, **UNLIMITED)
    assert _step(eng, 3).admitted == 3 and eng.n_queued == 0
    assert _step(eng, 3).evicted == 2
    assert eng.queue_ids().tolist() == [1, 2] + list(range(3, n))
    assert eng.n_queued == 257


def test_deque_prepends_many_ids_before_a_long_queue():
    """The queue lane of the vllm-v1 mode: 200 ids appended to an empty lane (buffer 256), then
    100 ids prepended at once (more than the 0 free entries before the head, and together more
    than the buffer holds): the lane reads the 100, then the 200, in order; appending after that
    still works."""
    d = Deque()
    d.append(np.arange(200, dtype=np.int64))
    d.prepend(np.arange(1000, 1100, dtype=np.int64))
    assert d.items().tolist() == list(range(1000, 1100)) + list(range(200))
    d.append(np.array([7], dtype=np.int64))
    d.prepend(np.array([9], dtype=np.int64))
    assert len(d) == 302 and d.items()[0] == 9 and d.items()[-1] == 7
    e = Deque()  # 100 ids prepended to an empty lane (victims requeued when nobody waits)
    e.prepend(np.arange(100, dtype=np.int64))
    assert e.items().tolist() == list(range(100))


# ---------------------------------------------------------------- readers of the running set


def _two_running() -> VllmEngine:
    """bs = 1, M = 1000, unlimited budgets. A (l=4, o=10) arrives at step 0, B (l=2, o=5) at step 3;
    B_t = 1 every step. A is admitted at step 0 and samples one token per step: 5 tokens after
    steps 0..4. B is admitted at step 3: 2 tokens after steps 3, 4."""
    eng = _eng(1000, Trace([0, 3], [4, 2], [10, 5]), block_size=1, **UNLIMITED)
    for _ in range(5):
        _step(eng, 1)
    assert eng.active_ids().tolist() == [0, 1] and eng.active_generated().tolist() == [5, 2]
    return eng


def test_active_remaining_is_output_minus_generated():
    """A: 10 - 5 = 5; B: 5 - 2 = 3."""
    assert _two_running().active_remaining().tolist() == [5, 3]


def test_generated_histogram_bins_are_closed_left_and_the_last_is_open():
    """Edges [0, 2, 5]: bins [0, 2), [2, 5), [5, inf). A (5 tokens) is in the last, B (2) in the
    middle: [0, 1, 1]. Written into ``out`` at offset 0 by default, or at the offset given."""
    eng = _two_running()
    edges = np.array([0, 2, 5])
    assert eng.generated_histogram(edges).tolist() == [0, 1, 1]
    assert eng.generated_histogram(edges, np.zeros(5, np.int64)).tolist() == [0, 1, 1, 0, 0]
    assert eng.generated_histogram(edges, np.zeros(5, np.int64), offset=2).tolist() == [0, 0, 0, 1, 1]


def test_projected_demand_is_the_papers_d_t_plus_h_of_the_running_set():
    """A request with j of o tokens holds l + j + h + 1 at t + h while h < o - j.
    A: l=4, j=5, o=10: 10 + h for h < 5; B: l=2, j=2, o=5: 5 + h for h < 3.
    h = 0..5: A 10, 11, 12, 13, 14, 0; B 5, 6, 7, 0, 0, 0; sum 15, 17, 19, 13, 14, 0.
    With A alone (after step 0: j = 1): 6 + h for h < 9. With nobody running: zeros."""
    eng = _two_running()
    assert eng.projected_demand(np.arange(6)).tolist() == [15, 17, 19, 13, 14, 0]
    eng = _eng(1000, Trace([0, 3], [4, 2], [10, 5]), block_size=1, **UNLIMITED)
    assert eng.projected_demand(np.arange(3)).tolist() == [0, 0, 0]
    _step(eng, 1)
    assert eng.projected_demand(np.array([0, 1, 8, 9])).tolist() == [6, 7, 14, 0]


def test_projected_demand_raises_no_numpy_warning():
    """Offsets past a request's end (its term is 0) must not divide by zero or warn."""
    eng = _two_running()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert eng.projected_demand(np.array([4, 5, 9])).tolist() == [14, 0, 0]


def test_memory_bytes_adds_the_per_request_and_running_arrays():
    """Five per-request int64/float64 arrays of the table's capacity (max_tokens, gen, first_token,
    last_token, first_token_step), four int64 arrays and one bool array of the running set (2 running
    here) on top of the paper engine's count."""
    eng = _two_running()
    extra = 5 * 8 * eng.arrival.size + 4 * 8 * 2 + 1 * 2
    assert eng.memory_bytes() == Engine.memory_bytes(eng) + extra


# ---------------------------------------------------------------- serving metrics by hand


def test_serving_metrics_by_hand_in_slots():
    """bs = 1, M = 100 blocks, unlimited budgets. A arrives at 0, B and C at 1; l = 4, o = 2 each.
    B_t = 1, 0, 1, 0, 1, 0:
    step 0: A prefills 4 (4 blocks), first token at step 1.   running 1, waiting 0
    step 1: A decodes (5 blocks) and finishes; B, C wait.      running 0, waiting 2
    step 2: B prefills (4 blocks), first token at step 3.     running 1, waiting 1
    step 3: B decodes (5 blocks) and finishes.                 running 0, waiting 1
    step 4: C prefills (4 blocks), first token at step 5.     running 1, waiting 0
    step 5: C decodes (5 blocks) and finishes.                 running 0, waiting 0
    Time to first token: A 1 - 0 = 1, B 3 - 1 = 2, C 5 - 1 = 4: mean 7/3, p50 2, p99 (numpy's
    linear interpolation at rank 0.99 * 2 = 1.98) 2 + 0.98 * (4 - 2) = 3.96. Running mean 3/6,
    waiting mean 4/6; blocks held in each step 4, 5, 4, 5, 4, 5 (the paper's usage), but at the end of
    steps 1, 3, 5 the request that finished has freed its blocks (vLLM frees them before it records
    kv_cache_usage): 4, 0, 4, 0, 4, 0, usage mean 2 / 100, max 4 / 100. Every request's one gap is 1
    step."""
    eng = _eng(100, Trace([0, 1, 1], [4, 4, 4], [2, 2, 2]), block_size=1, **UNLIMITED)
    for b in (1, 0, 1, 0, 1, 0):
        _step(eng, b)
    assert eng.request_log()["first_token"].tolist() == [1, 3, 5]
    assert eng.request_log()["finish"].tolist() == [2, 4, 6]
    m = eng.serving_metrics()
    assert m["time_to_first_token_mean"] == pytest.approx(7 / 3)
    assert m["time_to_first_token_p50"] == pytest.approx(2.0)
    assert m["time_to_first_token_p99"] == pytest.approx(3.96)
    assert m["num_requests_running_mean"] == pytest.approx(0.5)
    assert m["num_requests_waiting_mean"] == pytest.approx(4 / 6)
    assert m["kv_cache_usage_perc_mean"] == pytest.approx(0.02)
    assert m["kv_cache_usage_perc_max"] == pytest.approx(0.04)
    assert m["inter_token_latency_p50"] == m["inter_token_latency_p99"] == 1.0
    assert eng.step_series()["used_blocks"].tolist() == [4, 0, 4, 0, 4, 0]
    assert eng.series()["usage"].tolist() == [4, 5, 4, 5, 4, 5]


def _stall_case(timed: bool):
    """bs = 1, long_prefill_token_threshold = 4, no token budget, least-computed victims, NB = 14.
    F (l=3, o=2), B (l=2, o=3), E (l=8, o=1) arrive at 0 (in this order); B_t = 3.
    step 0: F prefills 3 (3 blocks), B 2 (2 blocks): both sample token 1; E's first chunk is 4
      (thr): 4 blocks. 9 <= 14.
    step 1: F decodes (4 blocks), B decodes (3), E's second chunk (8): 15 > 14, excess 1. Fewest
      computed: B (2, against F 3 and E 4), freeing 3: B alone is preempted (keeps its token).
      F samples token 2 (a gap of 1 step) and finishes; E samples its only token and finishes.
    step 2: B is readmitted (l + j = 3 tokens, 3 blocks) and samples token 2: a gap of 3 - 1 = 2.
    step 3: B samples token 3 (a gap of 1) and finishes.
    Gaps: 1 (step 1), 2 (step 2), 1 (step 3)."""
    tr = Trace(np.zeros(3) if timed else [0, 0, 0], [3, 2, 8], [2, 3, 1], timed=timed)
    kw = {"time_model": {"kind": "linear", "c0": 1.0, "c_prefill": 0.0, "c_decode": 0.0, "c_kv": 0.0}} if timed else {}
    eng = VllmEngine(14, tr, options={"block_size": 1, "long_prefill_token_threshold": 4,
                                      "preempt_order": "least-computed", **UNLIMITED}, **kw)
    eng.reset(np.random.default_rng(0))
    out = [_step(eng, 3) for _ in range(4)]
    assert [s.evicted for s in out] == [0, 1, 0, 0] and eng.queue_ids().size == 0
    assert eng.request_log()["finish"].tolist() == [2, 4, 2]
    assert eng.request_log()["evictions"].tolist() == [0, 1, 0]
    return eng


def test_inter_token_gaps_accumulate_over_steps_with_a_preemption_stall():
    """The stall case in slots: gaps 1, 2, 1: p50 = 1 (2 of 3 gaps), p99 = 2 (the stall)."""
    m = _stall_case(False).serving_metrics()
    assert m["inter_token_latency_p50"] == 1.0 and m["inter_token_latency_p99"] == 2.0


def test_inter_token_gaps_in_seconds_use_their_log_bins():
    """The stall case in continuous time, every step 1 s (c0 = 1): gaps 1 s, 2 s, 1 s, binned at
    round(1000 ln gap): 0 and 693. p50 = exp(0) = 1 s; p99 = exp(0.693) s (the 2 s bin, 0.1% wide)."""
    m = _stall_case(True).serving_metrics()
    assert m["inter_token_latency_p50"] == 1.0
    assert m["inter_token_latency_p99"] == pytest.approx(math.exp(0.693)) and abs(m["inter_token_latency_p99"] - 2) < 2e-3


def test_the_first_gaps_recorded_in_one_step_may_differ():
    """Two requests whose first recorded gaps (in the same step) differ: the histogram starts at
    the smaller. bs = 1, thr = 4, no token budget, least-computed, NB = 18; B (l=2, o=3),
    E (l=8, o=1), D (l=8, o=3) at step 0, B_t = 3.
    step 0: B prefills 2 (token 1), E and D chunks of 4: 2 + 4 + 4 = 10 blocks.
    step 1: B 3, E 8, D 8 = 19 > 18: B (2 computed) is preempted; E and D finish their prompts
      and sample token 1 (E is done). No gap yet.
    step 2: D decodes (9 blocks): token 2, a gap of 1; B is readmitted (3 tokens, 3 <= 18 - 9
      blocks): token 2, a gap of 3 - 1 = 2.
    step 3: D and B sample token 3 (gaps 1, 1) and finish. Gaps 1, 2, 1, 1: p50 1, p99 2."""
    eng = _eng(18, Trace([0, 0, 0], [2, 8, 8], [3, 1, 3]), block_size=1, long_prefill_token_threshold=4,
               preempt_order="least-computed", **UNLIMITED)
    out = [_step(eng, 3) for _ in range(4)]
    assert [s.evicted for s in out] == [0, 1, 0, 0]
    assert eng.request_log()["finish"].tolist() == [4, 2, 4]
    m = eng.serving_metrics()
    assert m["inter_token_latency_p50"] == 1.0 and m["inter_token_latency_p99"] == 2.0


def test_time_to_first_token_in_seconds_is_from_the_arrival_time():
    """Continuous time, every step 1 s. A arrives at 0.0, B at 0.5 (l = 4, o = 3). Step 0 (0 -> 1 s):
    A prefills, first token at 1.0. Step 1 (1 -> 2 s): B (arrived during step 0) prefills, first
    token at 2.0. TTFT: A 1.0, B 2.0 - 0.5 = 1.5; mean 1.25."""
    lat = {"kind": "linear", "c0": 1.0, "c_prefill": 0.0, "c_decode": 0.0, "c_kv": 0.0}
    eng = VllmEngine(1000, Trace(np.array([0.0, 0.5]), [4, 4], [3, 3], timed=True), time_model=lat,
                     options={"block_size": 1, **UNLIMITED})
    eng.reset(np.random.default_rng(0))
    for _ in range(2):
        eng.arrive()
        eng.serve(1)
    assert eng.request_log()["first_token_time"].tolist() == [1.0, 2.0]
    assert eng.serving_metrics()["time_to_first_token_mean"] == 1.25


# ---------------------------------------------------------------- a defect the run found


@pytest.mark.parametrize("order", ["least-computed", "least-progress"])
def test_count_admission_heads_are_candidate_victims_in_every_order(order):
    """admission='count' starts the B_t heads before the running requests are scheduled, so a
    head started this step is in the step's running list and may be preempted (as in the paper:
    admitted and evicted in one slot). bs = 1, NB = 8; A (l=4, o=5; 4 + 5 - 1 = 8 blocks: accepted)
    starts at step 0 (4 blocks); B (l=4, o=5) arrives at step 1 and starts: A needs 5, B 4:
    9 > 8, excess 1. least-computed: B (0 computed, A 4) first; least-progress: B (0 output
    tokens, A 1) first; B frees 4 >= 1: B alone is preempted, back to the queue front, and A
    decodes (5 blocks). (Before the fix, least-computed raised a shape error and least-progress
    chose among the requests running before the step only: A.)"""
    eng = _eng(8, Trace([0, 1], [4, 4], [5, 5]), block_size=1, admission="count", preempt_order=order,
               **UNLIMITED)
    assert _step(eng, 1).admitted == 1
    st = _step(eng, 1)
    assert st.evicted == 1 and st.admitted == 1 and st.usage == 5
    assert eng.active_ids().tolist() == [0] and eng.queue_ids().tolist() == [1]
    assert eng.gen.tolist()[:2] == [2, 0] and eng.request_log()["evictions"].tolist() == [0, 1]


def test_count_admission_heads_preempted_by_least_progress_keep_the_step_within_the_cache():
    """bs = 1, NB = 8, admission='count', least-progress. A (l=1, o=5) starts at step 0 (1 block);
    B (l=4, o=1) and C (l=5, o=1) arrive at step 1 and start: A needs 2, B 4, C 5: 11 > 8, excess 3.
    B and C have 0 output tokens (A 1); the longer prompt first: C, freeing 5 >= 3: C alone is
    preempted. The step holds A's 2 + B's 4 = 6 blocks; B samples its only token and finishes.
    (Before the fix the victims came from A alone: 9 blocks held in a cache of 8.)"""
    eng = _eng(8, Trace([0, 1, 1], [1, 4, 5], [5, 1, 1]), block_size=1, admission="count",
               preempt_order="least-progress", **UNLIMITED)
    _step(eng, 1)
    st = _step(eng, 2)
    assert st.evicted == 1 and st.usage == 6 and st.completed == 1
    assert eng.active_ids().tolist() == [0] and eng.queue_ids().tolist() == [2]


# ---------------------------------------------------------------- survivors of the 2026-11-29 review


def test_the_watermark_is_int_of_its_fraction_of_the_blocks():
    """vLLM: watermark_blocks = int(watermark * num_blocks). bs = 1, NB = 10, watermark 0.15: int(1.5) = 1
    block (ceil would keep 2). A (l = 3, o = 5) starts at step 0 (3 blocks). B (l = 5, o = 2) arrives at step 1:
    A decodes (4 blocks), 6 free; A runs, so the watermark applies: B's 5 blocks + 1 <= 6: admitted (with 2
    kept free, 7 > 6 would refuse it)."""
    eng = _eng(10, Trace([0, 1], [3, 5], [5, 2]), block_size=1, watermark=0.15, **UNLIMITED)
    assert eng.watermark_blocks == 1
    assert _step(eng, 1).admitted == 1
    st = _step(eng, 1)
    assert st.admitted == 1 and eng.active_blocks().tolist() == [4, 5]


def test_inter_token_latency_percentiles_are_the_nearest_rank_at_a_tie():
    """Nearest rank: the order statistic at rank ceil(q n). The stall case with B's output cut to 2 tokens
    (bs = 1, thr = 4, least-computed, NB = 14; F (3, 2), B (2, 2), E (8, 1) at step 0): step 0 as there; step 1:
    F 4 + B 3 + E 8 = 15 > 14: B (2 computed) is preempted; F samples token 2 (gap 1) and finishes, E finishes.
    Step 2: B is readmitted (3 tokens) and samples token 2: gap 2, done. Gaps 1, 2: n = 2, p50 at rank
    ceil(1.0) = 1: 1 (the count reaching exactly q n = 1 is enough; the next bin would give 2); p99 at rank 2: 2."""
    eng = _eng(14, Trace([0, 0, 0], [3, 2, 8], [2, 2, 1]), block_size=1, long_prefill_token_threshold=4,
               preempt_order="least-computed", **UNLIMITED)
    out = [_step(eng, 3) for _ in range(3)]
    assert [s.evicted for s in out] == [0, 1, 0] and eng.request_log()["finish"].tolist() == [2, 3, 2]
    m = eng.serving_metrics()
    assert m["inter_token_latency_p50"] == 1.0 and m["inter_token_latency_p99"] == 2.0


def test_a_victims_recomputed_tokens_include_the_output_tokens_it_had_computed():
    """bs = 1, NB = 12, no budgets. A and B (l = 2, o = 10; 11 blocks at their last step) start at step 0 and sample
    token 1. At step k each has k output tokens and k + 1 computed, and needs 2 + k blocks: 2(2 + k) > 12 first
    at k = 5: B (the newest: 5 output tokens, 6 computed, its prompt's 2 and 4 output tokens' KV) is preempted:
    6 tokens dropped, not just its prompt's 2; readmitted once A is done, it prefills l + j = 2 + 5 = 7 tokens."""
    eng = _eng(12, Trace([0, 0], [2, 2], [10, 10]), block_size=1, reserve_full_isl=False, **UNLIMITED)
    out = [_step(eng, 2) for _ in range(6)]
    assert [s.evicted for s in out] == [0, 0, 0, 0, 0, 1] and eng.gen[1] == 5
    assert eng.recomputed_tokens == 6 and eng.step_series()["recomputed_tokens"][5] == 6
    for _ in range(20):
        _step(eng, 2)
    assert eng.step_series()["prefill_tokens"].tolist().count(7) == 1 and eng.request_log()["finish"][1] > 0
