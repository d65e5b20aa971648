"""Layer 2, the Gymnasium faces of the simulator (imports :mod:`flowgym.sim` only).

* :mod:`flowgym.envs.flow_control` - ``FlowControlEnv`` (``FlowControl-v0``) and
  ``FlowControlConfig``; the class docstring is the environment's spec.
* :mod:`flowgym.envs.spaces` - observation types and action types.
* :mod:`flowgym.envs.view` - ``SystemView``, the read-only view scripted agents get.
* :mod:`flowgym.envs.vector` - the batched vector env (``gym.make_vec``).
* :mod:`flowgym.envs.sb3` - its Stable-Baselines3 ``VecEnv`` adapter (needs ``flowgym[train]``).

Importing this package registers ``FlowControl-v0`` with Gymnasium (entry point
``flowgym.envs.flow_control:FlowControlEnv``; ``gym.make_vec`` builds the batched
``flowgym.envs.vector:make_vector_env``).
"""

import gymnasium as _gym

from flowgym.envs.flow_control import FlowControlConfig, FlowControlEnv

__all__ = ["FlowControlConfig", "FlowControlEnv"]

if "FlowControl-v0" not in _gym.registry:
    _gym.register(
        id="FlowControl-v0",
        entry_point="flowgym.envs.flow_control:FlowControlEnv",
        vector_entry_point="flowgym.envs.vector:make_vector_env",
    )
