"""Argument checks of ``flowgym/sim/batched.py`` that its mutation run found unpinned (docs/testing.md)."""

from __future__ import annotations

import pytest

from flowgym.sim.batched import BatchedEngine, unsupported
from flowgym.sim.workloads import IIDPoisson, MultiClassPoisson

PAIRS = {"kind": "empirical", "pairs": [[10, 20]]}


def test_a_timed_workload_is_refused_even_without_a_time_model():
    why = unsupported(100, IIDPoisson(1.0, PAIRS, timed=True))
    assert why is not None and why.startswith("time_model:")
    assert unsupported(100, IIDPoisson(1.0, PAIRS), timed=True).startswith("time_model:")
    assert unsupported(100, IIDPoisson(1.0, PAIRS)) is None


def test_requests_exactly_filling_the_cache_are_supported():
    # l + o = 10 + 20 = 30: fits M = 30 (a request of l + o <= M is never rejected), not M = 29
    assert unsupported(30, MultiClassPoisson([(10, 20)], 1.0)) is None
    assert unsupported(29, MultiClassPoisson([(10, 20)], 1.0)).startswith("M=29: ")


@pytest.mark.parametrize("M", [True, 1.5, 0, -3, "40"])
def test_m_must_be_a_positive_integer(M):
    with pytest.raises(ValueError, match="M \\(the KV-cache budget in tokens\\) must be a positive integer"):
        BatchedEngine(2, M, MultiClassPoisson([(1, 1)], 1.0))


@pytest.mark.parametrize("n", [True, 1.0, 0])
def test_num_envs_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        BatchedEngine(n, 100, MultiClassPoisson([(1, 1)], 1.0))


def test_class_queue_tracking_needs_classes():
    # an iid workload has no classes (m = 0): nothing to track
    assert BatchedEngine(2, 100, IIDPoisson(1.0, PAIRS), track_class_queue=True).track_class_queue is False
    assert BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), track_class_queue=True).track_class_queue is True


@pytest.mark.parametrize("edges", [[], [1, 2], [0, 0], [0, 5, 3], [[0, 1]]])
def test_histogram_edges_must_start_at_0_and_increase(edges):
    with pytest.raises(ValueError, match="hist_edges must start at 0 and increase strictly"):
        BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), hist_edges=edges)
    assert BatchedEngine(2, 100, MultiClassPoisson([(10, 20)], 1.0), hist_edges=[0]).K == 1
