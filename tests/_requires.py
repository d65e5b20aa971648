"""Skip markers for tests that need an optional extra, each naming the extra to install."""

from __future__ import annotations

import importlib.util

import pytest


def _have(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


#: Stable-Baselines3, sb3-contrib and torch, the train extra (training, learned agents, the SB3 checker and adapter).
HAVE_SB3 = _have("stable_baselines3", "sb3_contrib", "torch")
needs_sb3 = pytest.mark.skipif(
    not HAVE_SB3,
    reason='needs Stable-Baselines3 and torch: pip install -e ".[train]" in the checkout (CPU torch first: see README)',
)
#: matplotlib (figures, the 'human' render mode).
needs_matplotlib = pytest.mark.skipif(not _have("matplotlib"),
                                      reason='needs matplotlib: pip install -e ".[plot]" in the checkout')
