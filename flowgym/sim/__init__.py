"""Layer 1, the simulator: the token-level slot model with no Gymnasium import.

Where requests come from (:mod:`~flowgym.sim.workloads`, :mod:`~flowgym.sim.rates`,
:mod:`~flowgym.sim.datasets`), how a slot is served (:mod:`~flowgym.sim.engine` and its
pluggable :mod:`~flowgym.sim.rules`; :mod:`~flowgym.sim.latency` for continuous time),
the same for N environments at once (:mod:`~flowgym.sim.batched`), the optional numba
kernels (:mod:`~flowgym.sim.kernels`), what is reported (:mod:`~flowgym.sim.metrics`) and
the paper's closed forms (:mod:`~flowgym.sim.theory`). The exact semantics of one slot
are ``docs/model.md``.
"""
