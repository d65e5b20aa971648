"""With ``FLOWGYM_EW=corrected`` or ``direct`` in the environment and this folder on ``PYTHONPATH``, every Python
process (the spawned workers of ``flowgym train`` too) starts with :class:`~flowgym.sim.estimators.LoadTracker`
using that estimate of ``E[w]`` (``benchmarks/learned_experiments/estimator.py``'s :func:`patch`): how the search
of ``docs/training.md``, "An unbiased E[w]", ran on it without an option in the package::

    FLOWGYM_EW=direct PYTHONPATH=benchmarks/learned_experiments/estimator_patch flowgym train --out runs/arsEW

Without ``FLOWGYM_EW`` it does nothing (an experiment, not part of the package).
"""

import os

if os.environ.get("FLOWGYM_EW"):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import estimator

    estimator.patch(os.environ["FLOWGYM_EW"])
