"""The ``vllm-v1`` mode against vLLM V1 as it is now (review of 2026-11-29), every expected value by hand.

vLLM ``main`` at commit ``003df2961dd8830c317a61f9745ccd557da9fa06``:

* ``vllm/v1/core/sched/scheduler.py``: the waiting loop calls ``allocate_slots(...,
  full_sequence_must_fit=self.scheduler_reserve_full_isl, has_scheduled_reqs=bool(self.running))``
  (``SchedulerConfig.scheduler_reserve_full_isl`` defaults to ``True``);
* ``vllm/v1/core/kv_cache_manager.py``: ``watermark_blocks = int(watermark * num_blocks)``, applied to
  waiting or preempted requests only when ``has_scheduled_reqs``; with ``full_sequence_must_fit`` the
  blocks of ``request.num_tokens`` (prompt plus the output tokens kept) plus the watermark must be free,
  then only the chunk (and its lookahead) is allocated.

Also: ``max_tokens`` never lets ``l + max_tokens`` exceed ``max_model_len`` (a trace row that does is
refused, the integer option is capped), ``admission="count"`` refuses the options it cannot honour, and
``kv_cache_usage_perc`` counts the blocks held after a step's completions.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import flowgym  # noqa: F401  (registers FlowControl-v0)
from flowgym.agents import make_agent
from flowgym.sim.vllm import VllmEngine, VllmOptions
from flowgym.sim.workloads import CappedRequests, Requests, Trace, TraceError, make_workload

from tests._vllm import UNLIMITED
from tests._vllm import vllm_engine as _eng
from tests._vllm import vllm_step as _step


def _drain(name: str, horizon: int, **kw):
    """Run agent ``name`` on ``FlowControl-v0`` (vllm-v1) for at most ``horizon`` steps; the request log."""
    ag = make_agent(name)
    env = gym.make("FlowControl-v0", engine="vllm-v1", horizon=horizon, **{**ag.env_options(), **kw}).unwrapped
    obs, _ = env.reset(seed=0)
    ag.reset(env.config, seed=0)
    done = False
    while not done:
        obs, _, te, tr, _ = env.step(ag.act(obs, env.view()))
        done = te or tr
    return env.request_log()


# ---------------------------------------------------------------- 1. max_tokens within max_model_len


def test_max_model_len_is_m_in_whole_blocks():
    """M = 1000, bs = 16: 62 blocks, 992 tokens; bs = 1, lookahead 1 (the bridge): M; lookahead 3 with
    bs = 1: a sequence of L tokens holds L - 1 + 3 at its last step, so L <= 1000 - 2 = 998."""
    assert _eng(1000, Trace([0], [1], [1]), block_size=16).max_model_len == 992
    assert _eng(1000, Trace([0], [1], [1]), block_size=1, lookahead_tokens=1).max_model_len == 1000
    assert _eng(1000, Trace([0], [1], [1]), block_size=1, lookahead_tokens=3).max_model_len == 998
    assert _eng(1024, Trace([0], [1], [1]), block_size=16).max_model_len == 1024


def test_the_rejection_rule_against_max_model_len_with_and_without_lookahead():
    """M = 96 in blocks of 16 (6 blocks). With a lookahead of 2 (max_model_len 95) every request longer than
    max_model_len is rejected: 90 + 7 and 89 + 7. With none (max_model_len 96) the rule is the blocks of the last
    step, ``ceil((l + o - 1) / 16) > 6``: 90 + 7 = 97 tokens still fits (its last token is never stored) and is served,
    one token beyond max_model_len (vLLM would refuse it; docs/serving.md says so); 91 + 7 is rejected."""
    for la, served in ((0, [True, True, False]), (2, [False, False, False])):
        eng = _eng(96, Trace([0, 0, 0], [90, 89, 91], [7, 7, 7]), block_size=16, lookahead_tokens=la, **UNLIMITED)
        assert eng.max_model_len == 96 - max(la - 1, 0)
        for _ in range(60):
            _step(eng, 3)
        log = eng.request_log()
        assert list(~log["rejected"]) == served, la
        assert list(log["finish"] > 0) == served, la


def test_a_trace_row_whose_prompt_plus_max_tokens_exceeds_max_model_len_is_refused():
    """Review: a Trace row with l + max_tokens > M was accepted, and then trt-no-evict (which reserves
    blocks_for(l + max_tokens - 1)) and sglang-reserve never admitted it: the queue stalled behind it for
    good. vLLM refuses such a request; here the engine refuses the trace, naming the row and the values.
    M = 1000, bs = 16: max_model_len 992 (62 blocks); l = 10: max_tokens 982 fits, 983 does not, nor does
    990 (l + max_tokens = M, which the cache's 62 blocks cannot hold: blocks_for(999) = 63)."""
    _eng(1000, Trace([0, 0], [10, 10], [5, 5], max_tokens=[5, 982]), block_size=16)
    for mt in (983, 990, 10**6):
        with pytest.raises(TraceError, match=rf"column 'max_tokens', index 1: prompt_len 10 \+ max_tokens {mt} = "
                                             rf"{10 + mt} exceeds max_model_len 992 \(M = 1000 tokens in 62 blocks of 16"):
            VllmEngine(1000, Trace([0, 0], [10, 10], [5, 5], max_tokens=[5, mt]), options={"block_size": 16})
    # the first row in input order is named (the trace sorts by arrival: row 2 arrives first)
    with pytest.raises(TraceError, match="index 0: prompt_len 500 "):
        VllmEngine(1000, Trace([3, 1, 0], [500, 500, 10], [5, 5, 5], max_tokens=[600, 700, 5]), options={"block_size": 1})
    with pytest.raises(ValueError, match="index 1: prompt_len 10 \\+ max_tokens 1000000"):
        gym.make("FlowControl-v0", engine="vllm-v1", M=1000, horizon=50,
                 workload=Trace([0, 0], [10, 10], [5, 5], max_tokens=[5, 10**6]))
    # the paper mode does not read the column (its view gives the default cap): nothing to refuse there
    gym.make("FlowControl-v0", M=1000, horizon=50, workload=Trace([0, 0], [10, 10], [5, 5], max_tokens=[5, 10**6]))


def test_a_csv_trace_row_beyond_max_model_len_is_named_by_its_line(tmp_path):
    """CSV line 3 (the header is line 1) asks l + max_tokens = 5 + 200 > max_model_len 100 (read by pyarrow when
    installed, which numbers no rows: the csv module numbers them for the message)."""
    path = tmp_path / "t.csv"
    path.write_text("t,l,o,cap\n0,5,10,12\n0,5,3,200\n1,4,2,2\n")
    tr = make_workload({"kind": "trace", "path": str(path), "arrival": "t", "prompt_len": "l", "output_len": "o",
                        "max_tokens_column": "cap"})
    with pytest.raises(TraceError, match=r"t\.csv': column 'cap', row 3: prompt_len 5 \+ max_tokens 200 = 205 "
                                         r"exceeds max_model_len 100"):
        VllmEngine(100, tr, options={"block_size": 1})
    path.write_text("t,l,o,cap\n0,5,10,12\n\n0,5,3,200\n")  # a blank line: the row is line 4
    tr = make_workload({"kind": "trace", "path": str(path), "arrival": "t", "prompt_len": "l", "output_len": "o",
                        "max_tokens_column": "cap"})
    with pytest.raises(TraceError, match="column 'cap', row 4: prompt_len 5"):
        VllmEngine(100, tr, options={"block_size": 1})


def test_trt_no_evict_drains_a_trace_at_the_max_model_len_boundary():
    """Three requests (l = 10, o = 5) with max_tokens 982 (l + max_tokens = 992 = max_model_len), M = 1000,
    bs = 16: each reserves blocks_for(991) = 62 = every block, so trt-no-evict admits them one at a time; none
    waits for good, nothing is preempted."""
    log = _drain("trt-no-evict", 100, M=1000, engine_options={"block_size": 16},
                 workload=Trace([0, 0, 0], [10, 10, 10], [5, 5, 5], max_tokens=[982, 982, 982]))
    assert (log["finish"] > 0).all() and log["evictions"].sum() == 0
    assert log["finish"].tolist() == [5, 10, 15]


def test_the_integer_max_tokens_option_is_capped_at_what_max_model_len_leaves():
    """engine_options max_tokens = 10**6, M = 1000, bs = 16 (max_model_len 992): each request's cap is
    min(10**6, 992 - l), never below its output: l = 10 -> 982; l = 500 -> 492; l = 10, o = 983 (l + o - 1 =
    992: 62 blocks, accepted) -> 983. (Before: 10**6 each, and trt-no-evict, reserving blocks_for(l + 10**6 - 1)
    > 62 blocks, never admitted anyone.)"""
    eng = _eng(1000, Trace([0, 0, 0], [10, 500, 10], [5, 5, 983]), block_size=16, max_tokens=10**6)
    eng.arrive()
    assert eng.request_log()["max_tokens"].tolist() == [982, 492, 983]
    assert not eng.request_log()["rejected"].any()
    log = _drain("trt-no-evict", 200, M=1000, engine_options={"block_size": 16, "max_tokens": 10**6},
                 workload=Trace([0, 0, 0], [10, 500, 10], [5, 5, 7]))
    assert log["finish"].tolist() == [5, 10, 17] and log["evictions"].sum() == 0


def test_the_default_max_tokens_leaves_room_in_whole_blocks():
    """The default cap is min(the workload's longest output, max_model_len - l): a trace with outputs 900 and
    5, M = 1000, bs = 16: l = 10 -> min(900, 982) = 900; l = 500 -> min(900, 492) = 492 (M - l = 500 before:
    trt-no-evict reserved blocks_for(999) = 63 > 62 blocks for it and stalled; now 62)."""
    tr = Trace([0, 0], [10, 500], [900, 5])
    log = _drain("trt-no-evict", 2000, M=1000, engine_options={"block_size": 16}, workload=tr)
    assert log["max_tokens"].tolist() == [900, 492]
    assert (log["finish"] > 0).all() and log["finish"][1] > log["finish"][0]


def test_a_workloads_own_caps_beyond_max_model_len_are_refused_on_arrival():
    """A workload other than a Trace whose requests carry max_tokens (CappedRequests) is checked as they
    arrive: request 0 asks l + max_tokens = 10 + 95 > max_model_len 100."""

    class Capped(Trace):
        def check_max_tokens(self, limit, what):  # a workload that does not check itself
            return None

        def sample(self, rng, t0, t1):
            req = Requests(*Trace.sample(self, rng, t0, t1)[:4])
            return CappedRequests.of(req, np.full(len(req.arrival), 95, np.int64))

    eng = _eng(100, Capped([0], [10], [5]), block_size=1)
    with pytest.raises(ValueError, match=r"request 0: prompt_len 10 \+ max_tokens 95 = 105 exceeds max_model_len 100"):
        eng.arrive()
    eng = _eng(100, Capped([0], [5], [5]), block_size=1)  # 5 + 95 = 100: within it
    eng.arrive()
    assert eng.request_log()["max_tokens"].tolist() == [95]
    eng = _eng(100, Capped([0, 0], [5, 10], [5, 5]), block_size=1)  # the second request of the chunk is named
    with pytest.raises(ValueError, match=r"request 1: prompt_len 10 \+ max_tokens 95 = 105 exceeds"):
        eng.arrive()


def test_the_max_tokens_option_is_at_most_two_to_the_53():
    """The integer option's upper end: 2**53 is accepted, 2**53 + 1 refused by name."""
    VllmOptions(max_tokens=2**53).validate()
    with pytest.raises(ValueError, match=r"max_tokens must be at most 2\*\*53"):
        VllmOptions(max_tokens=2**53 + 1).validate()


def test_the_gate_counts_no_lookahead_slots():
    """vLLM's gate counts the blocks of request.num_tokens only; the allocation adds the lookahead. bs = 1, la = 1,
    NB = 20, thr = 4. A (l = 4, o = 8) starts at step 0 (4 + 1 = 5 blocks). B (l = 14, o = 2; 14 + 2 - 1 + 1 = 16
    blocks at its last step) arrives at step 1: A decodes (4 + 1 + 1 = 6 blocks), 14 free; B's first chunk takes
    4 + 1 = 5 blocks, its gate ceil(14 / 1) = 14 <= 14: admitted."""
    eng = _eng(20, Trace([0, 1], [4, 14], [8, 2]), block_size=1, lookahead_tokens=1, long_prefill_token_threshold=4,
               **UNLIMITED)
    _step(eng, 1)
    assert _step(eng, 1).admitted == 1 and eng.active_blocks().tolist() == [6, 5]


# ---------------------------------------------------------------- 2. vLLM V1's admission gate and watermark


def test_reserve_full_isl_is_on_by_default_and_validated():
    assert VllmOptions().reserve_full_isl is True
    with pytest.raises(ValueError, match="engine_options reserve_full_isl must be True or False"):
        VllmOptions.from_any({"reserve_full_isl": 1})


@pytest.mark.parametrize("gate", [True, False])
def test_the_full_isl_gate_needs_the_whole_prompts_blocks_and_allocates_the_chunk(gate):
    """bs = 16, NB = 6, token budget 48. A (l=40) and B (l=64) arrive at step 0, B_t = 2.
    A: chunk 40 (3 blocks), gate ceil(40/16) = 3 <= 6: admitted, 3 blocks. B: 48 - 40 = 8 tokens left:
    chunk 8 (1 block); the gate needs ceil(64/16) = 4 blocks free, 3 are: refused with the gate;
    without it the chunk's 1 block fits: admitted. Either way only the chunk is allocated."""
    eng = _eng(96, Trace([0, 0], [40, 64], [3, 3]), block_size=16, max_num_batched_tokens=48, reserve_full_isl=gate)
    st = _step(eng, 2)
    if gate:
        assert st.admitted == 1 and eng.total_refused == 1 and eng.active_blocks().tolist() == [3]
    else:
        assert st.admitted == 2 and eng.total_refused == 0 and eng.active_blocks().tolist() == [3, 1]
        assert eng.active_computed().tolist() == [40, 8]


def _preempted_head(gate: bool) -> VllmEngine:
    """bs = 1, NB = 20, long_prefill_token_threshold = 4 (chunks of 4), no token budget. A and B (l = 2, o = 19;
    2 + 19 - 1 = 20 blocks at their last step: accepted) start at step 0 (2 blocks each) and sample token 1. At
    step k >= 1 each needs 2 + k blocks: 2(2 + k) <= 20 until k = 8; at step 9, 11 + 11 > 20: B (the newest)
    is preempted with 9 output tokens and 10 computed tokens (10 tokens to recompute). A holds 11 blocks.
    Step 10: A needs 12, 8 are free. B's sequence is l + j = 11 tokens, its first chunk 4 (4 blocks)."""
    eng = _eng(20, Trace([0, 0], [2, 2], [19, 19]), block_size=1, long_prefill_token_threshold=4,
               reserve_full_isl=gate, **UNLIMITED)
    out = [_step(eng, 2) for _ in range(10)]
    assert [s.evicted for s in out] == [0] * 9 + [1]
    assert eng.queue_ids().tolist() == [1] and eng.gen[1] == 9
    assert eng.step_series()["recomputed_tokens"].tolist() == [0] * 9 + [10]
    return eng


def test_the_gate_counts_a_preempted_requests_kept_output_tokens():
    """The gate needs ceil((l + j) / bs) = 11 blocks free for B, not its prompt's 2: B waits while A runs
    (free 20 - (2 + k) < 11 for k >= 10) and is admitted at step 19, after A's last token at step 18 (finish 19),
    prefills 11 tokens in chunks 4, 4, 3 (steps 19-21, token 10 at step 21), then decodes tokens 11..19 at steps
    22..30: finish 31, preempted once."""
    eng = _preempted_head(True)
    st = _step(eng, 2)
    assert st.admitted == 0 and eng.total_refused == 1
    for _ in range(30):
        _step(eng, 2)
    log = eng.request_log()
    assert log["finish"].tolist() == [19, 31] and log["evictions"].tolist() == [0, 1]
    assert eng.step_series()["prefill_tokens"][19:22].tolist() == [4, 4, 3]
    assert eng.recomputed_tokens == 10


def test_without_the_gate_the_first_chunk_is_admitted_and_preempted_again():
    """Without the gate (reserve_full_isl=False) B's first chunk (4 blocks <= 8 free) is admitted at step 10;
    at step 11 A needs 13 and B 8: 21 > 20: B, the newest, is preempted again (4 more tokens recomputed)."""
    eng = _preempted_head(False)
    assert _step(eng, 2).admitted == 1 and eng.active_blocks().tolist() == [12, 4]
    st = _step(eng, 2)
    assert st.evicted == 1 and eng.request_log()["evictions"].tolist() == [0, 2]
    assert eng.recomputed_tokens == 10 + 4


def test_the_watermark_does_not_apply_while_nothing_runs():
    """Review: bs = 1, NB = 100, watermark 0.5 (50 blocks), no token budget; one request l = 60, o = 10.
    Before: rejected on arrival, since its first chunk's 60 blocks > 100 - 50 (V0's AllocStatus.NEVER). vLLM V1
    applies the watermark only with has_scheduled_reqs = bool(self.running): into the empty cache it is admitted
    (gate 60 <= 100), samples its tokens at steps 0..9 and finishes at step 10. With a token budget of 32 its
    first chunk is 32 blocks and its prompt takes two steps: finish 11."""
    eng = _eng(100, Trace([0], [60], [10]), block_size=1, watermark=0.5, **UNLIMITED)
    st = _step(eng, 1)
    assert not eng.request_log()["rejected"][0] and st.admitted == 1 and eng.active_blocks().tolist() == [60]
    for _ in range(12):
        _step(eng, 1)
    assert eng.request_log()["finish"].tolist() == [10]
    eng = _eng(100, Trace([0], [60], [10]), block_size=1, watermark=0.5, max_num_batched_tokens=32)
    st = _step(eng, 1)
    assert not eng.request_log()["rejected"][0] and st.admitted == 1 and eng.active_blocks().tolist() == [32]
    for _ in range(12):
        _step(eng, 1)
    assert eng.request_log()["finish"].tolist() == [11]


def test_the_watermark_applies_once_a_request_was_admitted_in_the_same_step():
    """bs = 1, NB = 100, watermark 50 blocks. A and B (l = 30) at step 0, B_t = 2: A enters the empty cache
    (30 <= 100); for B, A is running: 30 + 50 > 70 free: refused. B waits while A runs (A holds 31..34 blocks)
    and enters at step 5, when A (o = 5) has finished."""
    eng = _eng(100, Trace([0, 0], [30, 30], [5, 5]), block_size=1, watermark=0.5, **UNLIMITED)
    assert _step(eng, 2).admitted == 1
    adm = [_step(eng, 2).admitted for _ in range(5)]
    assert adm == [0, 0, 0, 0, 1]
    assert eng.request_log()["first_token"].tolist() == [1, 6]


# ---------------------------------------------------------------- 3. admission by count refuses what it ignores


@pytest.mark.parametrize("opts, name", [({"watermark": 0.5}, "watermark=0.5"),
                                        ({"reserve_full_prompt": True}, "reserve_full_prompt=True")])
def test_count_admission_refuses_the_block_options_it_would_ignore(opts, name):
    """Review: admission='count' starts the heads whatever the cache holds: a watermark or full-prompt
    reservation set with it was silently ignored. Now refused, naming the option; their defaults pass."""
    base = {"admission": "count", "max_num_batched_tokens": None}
    with pytest.raises(ValueError, match=f"engine_options {name} needs admission='blocks'"):
        VllmOptions.from_any({**base, **opts})
    with pytest.raises(ValueError, match=f"engine_options {name} needs admission='blocks'"):
        gym.make("FlowControl-v0", engine="vllm-v1", engine_options={**base, **opts}, horizon=5)
    VllmOptions.from_any({**base, "watermark": 0.0, "reserve_full_prompt": False})


# ---------------------------------------------------------------- 4. KV usage after the step's completions


def test_kv_cache_usage_counts_the_blocks_held_after_the_steps_completions():
    """Review: bs = 16, NB = 10. A (l = 16, o = 1) and B (l = 16, o = 3) prefill at step 0 (1 block each) and
    sample a token; A is done and frees its block. vLLM frees finished requests before make_stats: 1 block
    in use (usage 0.1), though the step itself held 2 (the paper's usage: 32 tokens). Alone, A leaves 0."""
    eng = _eng(160, Trace([0, 0], [16, 16], [1, 3]), block_size=16)
    st = _step(eng, 2)
    assert st.completed == 1 and st.usage == 32
    assert eng.step_series()["used_blocks"].tolist() == [1]
    assert eng.serving_metrics()["kv_cache_usage_perc_max"] == pytest.approx(0.1)
    one = _eng(160, Trace([0], [16], [1]), block_size=16)
    _step(one, 1)
    assert one.serving_metrics()["kv_cache_usage_perc_max"] == 0.0 and one.series()["usage"].tolist() == [16]


# ---------------------------------------------------------------- 5. which agents run on vllm-v1


@pytest.mark.parametrize("agent, option", [("alpha-greedy", "eviction='all'"), ("a-min", "eviction='estimate'"),
                                           ("mc-sf", "queue_order='sjf'")])
def test_agents_that_need_another_eviction_rule_or_queue_order_are_refused_by_name(agent, option):
    """docs/serving.md says which agents do not run on vllm-v1 and why: their environment options."""
    ag = make_agent(agent)
    with pytest.raises(ValueError, match=f"engine='vllm-v1' needs .*got {option}"):
        gym.make("FlowControl-v0", engine="vllm-v1", horizon=5, **ag.env_options())


def test_a_preempted_head_the_watermark_held_back_is_readmitted_once_the_cache_empties():
    """The case of test_hardening's former stall test (a V0 watermark stalled the head for good and warned):
    bs = 1, NB = 1000, watermark 0.6 (600 blocks), no token budget. A, B (l = 200, o = 700) at step 0, C (10, 5)
    at step 5, B_t = 10. A enters the empty cache; B fits beside it (200 + 600 <= 800 free). At step k each needs
    200 + k blocks: 2(200 + k) > 1000 first at k = 301: B is preempted (301 tokens kept). Its sequence, 501
    tokens, plus the watermark never fits beside A; A's last token comes at step 699 (finish 700). At step 700
    nothing runs: no watermark, B is readmitted (501 blocks) and prefills 501 tokens (token 302 at step 700), then
    tokens 303..700 at steps 701..1098 (finish 1099); C, behind it (10 + 600 > 499 free), enters at step 1099 and
    finishes at 1104. No warning; no request waits for good."""
    import warnings

    env = gym.make("FlowControl-v0", engine="vllm-v1", M=1000, horizon=None,
                   engine_options={"block_size": 1, "watermark": 0.6, "max_num_batched_tokens": None},
                   workload={"kind": "trace", "arrival": [0, 0, 5], "prompt_len": [200, 200, 10],
                             "output_len": [700, 700, 5]}).unwrapped
    env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for t in range(2000):
            if env.step(10)[2]:
                break
    log = env.request_log()
    assert t == 1103 and log["finish"].tolist() == [700, 1099, 1104] and log["evictions"].tolist() == [0, 1, 0]
    assert log["first_token"].tolist() == [1, 1, 1100]
