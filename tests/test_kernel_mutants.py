"""Tests that kill mutants of flowgym/sim/kernels.py which the equivalence suites let through.

``python tools/mutate.py flowgym/sim/kernels.py --paths interpreted --by-line ...`` (docs/testing.md)
runs the kernels as plain Python; each test here names the mutant it was written for. The
kernels are called directly (compiled when numba is installed, as in CI).
"""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.sim import kernels

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed (pip install -e '.[fast]' in the flowgym checkout)")


@pytest.fixture(scope="module", autouse=True)
def _load() -> None:
    kernels.load()


def _numpy_poisson_mult(u: np.ndarray, pos: int, lam: float) -> tuple[int, int]:
    """numpy's ``random_poisson_mult`` (lambda < 10): count the uniforms while the product stays above exp(-lam)."""
    enlam, x, prod = np.exp(-lam), 0, 1.0
    while True:
        prod *= u[pos]
        pos += 1
        if prod > enlam:
            x += 1
        else:
            return x, pos


def test_a_poisson_draw_ends_when_the_product_equals_exp_minus_lambda() -> None:
    """``prod > exp(-lam)`` continues a draw, equality ends it (``p <= e`` -> ``p < e`` in ``poisson_step``).

    With uniforms drawn by a generator the product hits ``exp(-lam)`` exactly with probability 0,
    so the equivalence suites cannot see it; here the uniforms are chosen: ``u = exp(-lam)``.
    """
    lam = 0.7
    e = float(np.exp(-lam))
    enl = np.array([e])
    nz = np.array([0], np.int64)
    # draw 1: 0.9 (product 0.9 > e: count 1), then 0.9 * x == e exactly? use e itself as a lone draw
    u = np.array([e, 0.9, e / 0.9 * 0.5, e, 0.99, 0.3, 0.2, 0.1], np.float64)
    want, pos = [], 0
    for _ in range(4):
        x, pos = _numpy_poisson_mult(u, pos, lam)
        want.append(x)
    c = np.zeros(4, np.int64)
    end = kernels.poisson_counts(u, 0, u.size, nz, enl, 1, 4, c)
    assert c.tolist() == want and end == pos
    assert want[0] == 0  # the first uniform equals exp(-lam): no arrival
    c1, c2 = np.zeros(4, np.int64), np.zeros(4, np.int64)
    q1, q2 = kernels.poisson_counts2(u, u.copy(), u.size, nz, enl, 1, 4, c1, c2)
    assert c1.tolist() == want and c2.tolist() == want and q1 == q2 == pos


def test_poisson_place_uses_a_table_and_uniforms_that_fit_exactly() -> None:
    """A chunk whose requests fill the table to its last row, with exactly the uniforms the shuffle reads.

    ``poisson_place`` returns ``-2 - n`` only when the table needs more rows, and ``-1`` only when
    ``u[q:end]`` has fewer than ``total + 16`` uniforms; at equality it writes the chunk. Kills
    ``total = 0`` -> ``1`` and ``base + total > cls.size`` -> ``>=`` (both ask for a bigger table,
    or more uniforms, than the chunk needs).
    """
    lk = np.array([10, 30], np.int64)  # prompt tokens of the two classes
    counts = np.array([2, 1, 0, 3], np.int64)  # slot 0: 2 + 1 requests, slot 1: 0 + 3
    total, base, q = 6, 4, 5
    rng = np.random.default_rng(3)
    u = rng.random(q + total + 16)
    cls = np.full(base + total, -1, np.int64)  # exactly base + total rows
    bnd, tokc = np.zeros(3, np.int64), np.zeros(3, np.int64)
    clsc = np.zeros((3, 2), np.int64)
    j = kernels.poisson_place(u, q, u.size, lk, 2, 2, base, cls, bnd, tokc, clsc, counts)
    assert j == q + total
    assert bnd.tolist() == [base, base + 3, base + 6]
    assert tokc.tolist() == [0, 2 * 10 + 30, 2 * 10 + 4 * 30]
    assert clsc.tolist() == [[0, 0], [2, 1], [2, 4]]
    # slot 0: the request of class 1 is drawn third; its rank is its uniform's rank among the three
    ranks = np.argsort(np.argsort(u[q:q + 3], kind="stable"), kind="stable")
    assert cls[base + ranks[2]] == 1 and sorted(cls[base:base + 3].tolist()) == [0, 0, 1]
    assert cls[base + 3:].tolist() == [1, 1, 1] and (cls[:base] == -1).all()
    # one row short, or one uniform short: the documented refusals
    assert kernels.poisson_place(u, q, u.size, lk, 2, 2, base, cls[:-1].copy(), bnd, tokc, clsc, counts) \
        == -2 - (base + total)
    assert kernels.poisson_place(u, q, u.size - 1, lk, 2, 2, base, cls, bnd, tokc, clsc, counts) == -1


def test_a_poisson_chunk_with_no_positive_rate_still_writes_its_slots() -> None:
    """All rates 0: no uniform is used (``poisson_counts`` returns ``pos`` = 0), and the chunk's slot
    boundaries and token sums are still written. Kills ``q < 0`` -> ``q <= 0`` in ``poisson_chunk``
    (which returned position 0 as if it were the "ran out" code, leaving ``bnd`` unwritten)."""
    lk = np.array([10, 30], np.int64)
    nz = np.empty(0, np.int64)
    enl = np.empty(0, np.float64)
    u = np.random.default_rng(0).random(64)
    cls = np.full(8, -1, np.int64)
    bnd, tokc = np.full(4, -7, np.int64), np.full(4, -7, np.int64)
    clsc = np.full((4, 2), -7, np.int64)
    q = kernels.poisson_chunk(u, 0, u.size, nz, enl, lk, 2, 3, 5, cls, bnd, tokc, clsc)
    assert q == 0
    assert bnd.tolist() == [5, 5, 5, 5] and tokc.tolist() == [0, 0, 0, 0] and (clsc == 0).all()
    assert (cls == -1).all()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_poisson_chunks_with_no_positive_rate_still_write_every_environments_slots(n) -> None:
    """:func:`poisson_chunks` (the batched sampler, environments in pairs): all rates 0, so no
    uniform is used (position 0); each environment's chunk is still written (bounds at its next id,
    token sums 0, clock advanced), not taken for "ran out". Kills ``q >= 0`` -> ``q > 0`` / ``q >= 1``
    there (which skipped the placement and left the bounds unwritten)."""
    lk = np.array([10, 30], np.int64)
    nz, enl = np.empty(0, np.int64), np.empty(0, np.float64)
    want, n_slots = 40, 3
    pcg = np.zeros((n, 4), np.uint64)
    pcg[:, 3] = 2 * np.arange(n) + 1  # PCG64 increments are odd
    left, left_n = np.zeros((n, want)), np.zeros(n, np.int64)
    st = np.zeros((12, n), np.int64)
    st[9], st[11] = 6, [5, 9, 2][:n]  # gen_t (the chunk starts at slot 6), the next request ids
    cls = np.full((n, 16), -1, np.int64)
    abnd = np.full((n, 12), -7, np.int64)
    tokc = np.full((n, n_slots + 1), -7, np.int64)
    clsc = np.full((n, n_slots + 1, 2), -7, np.int64)
    res = np.full(16, -99, np.int64)
    kernels.poisson_chunks(np.empty((16, want)), want, np.arange(n, dtype=np.int64), pcg, left, left_n, nz, enl, lk,
                           2, n_slots, st, cls, abnd, tokc, clsc, res)
    assert res[:n].tolist() == [0] * n
    for i in range(n):
        base = [5, 9, 2][i]
        assert abnd[i, 6:10].tolist() == [base] * 4 and (abnd[i, :6] == -7).all() and (abnd[i, 10:] == -7).all()
        assert tokc[i].tolist() == [0] * 4 and (clsc[i] == 0).all()
    assert st[9].tolist() == [9] * n and st[10].tolist() == [6] * n and st[11].tolist() == [5, 9, 2][:n]
    assert left_n.tolist() == [want] * n  # every uniform drawn is held over for the next chunk
    assert (cls == -1).all()


@pytest.mark.parametrize("short", [1, 2])
def test_paired_poisson_counts_use_no_uniform_past_end_when_one_stream_runs_on_alone(short: int) -> None:
    """``poisson_counts2`` reads only ``u[:end]`` also in its one-stream tail loops (``q >= end`` ->
    ``q > end`` there read ``u[end]``). Stream ``short`` ends its one draw at its first uniform; the
    other's product stays above ``exp(-1)`` through ``u[:end]``, and ``u[end]`` (past the end) would end
    it: reading it turns "ran out" into a finished draw."""
    end = 500
    quick = np.full(end + 10, 0.001)
    slow = np.full(end + 10, 0.999)
    slow[end:] = 0.0  # 0.999 ** 500 = 0.61 > exp(-1): the draw needs a uniform past end to finish
    nz, enl = np.array([0], np.int64), np.exp(-np.array([1.0]))
    u1, u2 = (quick, slow) if short == 1 else (slow, quick)
    c1, c2 = np.zeros(1, np.int64), np.zeros(1, np.int64)
    assert kernels.poisson_counts2(u1, u2, end, nz, enl, 1, 1, c1, c2) == (-1, -1)
    c = np.zeros(1, np.int64)
    assert kernels.poisson_counts(slow, 0, end, nz, enl, 1, 1, c) == -1
    assert kernels.poisson_counts(slow, 0, end + 1, nz, enl, 1, 1, c) == end + 1  # the control: u[end] ends it
