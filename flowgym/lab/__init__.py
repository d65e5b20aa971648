"""Layer 4, what people run: evaluation, scenarios, plots, hindsight, training, the CLI.

* :mod:`flowgym.lab.evaluation` - one run / tune / tabulate path for every agent.
* :mod:`flowgym.lab.scenarios` - named scenarios (environment arguments and line-ups).
* :mod:`flowgym.lab.plots` - figures (needs ``flowgym[plot]``).
* :mod:`flowgym.lab.hindsight` - the hindsight optimum as an integer program (``flowgym[solve]``).
* :mod:`flowgym.lab.train` - training a learned budget with Stable-Baselines3 (``flowgym[train]``).
* :mod:`flowgym.lab.cli` - the ``flowgym`` command.
"""
