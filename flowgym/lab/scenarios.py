"""Scenarios: environment arguments, the agents a comparison runs, how ``--rate`` scales them.

A scenario is data, kept in a TOML (or JSON) file; the named scenarios are such files
shipped in ``flowgym/data/scenarios/`` (``flowgym scenario show NAME`` prints one to start
from). The format, key by key, is ``docs/scenarios.md``. Load one with
:func:`get_scenario` (a name or a path), optionally changing its rate:
``get_scenario("paper-synthetic-known", rate=3.5)``, ``get_scenario("my.toml")``.
Errors name the file, the key path and the allowed values.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from flowgym.envs.flow_control import MAX_BUDGET_CAP, MAX_COUNT, FlowControlConfig
from flowgym.lab import _toml
from flowgym.sim import _json
from flowgym.sim._checks import is_real

__all__ = [
    "AgentSpec",
    "Scenario",
    "SCENARIOS",
    "ADAPTIVE_SCENARIOS",
    "get_scenario",
    "load_scenario",
    "scenario_text",
    "parse_seeds",
    "PAPER_CLASSES",
    "PAPER_M",
]

#: The named scenarios, in the order the command line lists them (files in flowgym/data/scenarios/).
SCENARIOS: tuple[str, ...] = (
    "paper-synthetic-known",
    "paper-synthetic-unknown",
    "paper-realdata-low",
    "paper-realdata-high",
    "azure-conv",
    "azure-code",
    "adaptive-low",
    "adaptive-high",
    "adaptive-switch",
    "adaptive-diurnal",
    "adaptive-mix",
    "adaptive-azure-conv",
)
#: The scenarios of ``flowgym train`` and ``benchmarks/bench_learned.py``.
ADAPTIVE_SCENARIOS = ("adaptive-low", "adaptive-high", "adaptive-switch", "adaptive-diurnal", "adaptive-mix",
                      "adaptive-azure-conv")

# Facts of the named scenarios' files, for code and tests that refer to them.
#: The paper's synthetic classes (l_k, o_k), Section 4.1.
PAPER_CLASSES = [[10, 20], [10, 40], [10, 60]]
#: KV budget of Llama-2-70B on two A100s, as in the paper.
PAPER_M = 16492
#: The alpha-protection greedy's tuning grid.
ALPHA_GRID = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
#: Slots of an adaptive episode, and of one cycle of the switching and diurnal loads.
ADAPTIVE_HORIZON, ADAPTIVE_PERIOD = 4000, 2000
#: Original-time windows (seconds) of the Azure conv trace: the first half hour trains and tunes
#: (``adaptive-azure-conv``'s ``tune_env``), the second half hour is held out for reports.
AZURE_TRAIN_WINDOW, AZURE_REPORT_WINDOW = [0.0, 1800.0], [1800.0, 3600.0]
#: Report horizons of a scenario that does not list its own.
DEFAULT_HORIZONS = [1000, 2000, 3000, 4000, 5000]

#: Keys of a scenario file and what each holds (docs/scenarios.md).
FILE_KEYS = {
    "name": "the scenario's name (a string)",
    "description": "one line; {rate:g} stands for the rate",
    "env": "FlowControl-v0 arguments, the workload included (a table)",
    "agents": "the line-up of a comparison (an array of tables: name, label, params, tune)",
    "rate": "what --rate does: default, meaning, set and/or scale (a table)",
    "finite": "run to the end of the finite workload instead of reporting at horizons (true/false)",
    "horizons": "report horizons in slots (an array of positive integers)",
    "tune_horizon": "horizon of tuning runs (default: the last report horizon, at most 2000)",
    "tune_env": "overrides of env for tuning runs; workload keys are merged (a table)",
    "train": "learned-budget defaults: max_budget and/or budget_levels (a table)",
    "run_time": "measured wall time of its default compare (a string)",
}
#: Keys of an agent's table in a scenario file.
AGENT_KEYS = ("name", "label", "params", "tune")


@dataclass
class AgentSpec:
    """An agent by name and parameters, optionally with one parameter to tune by grid search.

    A spec is data (it names an agent, it does not build one):
    :func:`flowgym.lab.evaluation.build_agent` instantiates it.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    #: ``(parameter, grid)`` tuned on separate seeds before reporting, or ``None``.
    tune: tuple[str, list[Any]] | None = None
    #: Display name (defaults to the agent's own label).
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> AgentSpec:
        """From ``name`` or ``name:key=value,key=value`` (values parsed as JSON, else strings).

        ``flow-control:b=12``, ``flow-control:b=[4,4,4]``, ``alpha-greedy:alpha=0.1``. The key ``label``
        (any agent) is the row's label in tables, taken as written (``label=5`` is the text ``"5"``), so two
        variants of one agent can run side by side: ``mc;mc:max_budget=8,label=mc capped``.
        """
        import json

        name, _, rest = text.partition(":")
        name = name.strip()
        params: dict[str, Any] = {}
        label: str | None = None
        if rest:
            for part in _split_params(rest):
                k, eq, v = part.partition("=")
                k = k.strip()
                if not eq:
                    raise ValueError(f"agent {text!r}: parameter {part!r} is not key=value")
                if k in params or (k == "label" and label is not None):  # the last one would silently win
                    raise ValueError(f"agent {text!r}: parameter {k!r} is given twice")
                if k == "label":
                    label = v.strip()
                    if len(label) >= 2 and label[0] == label[-1] == '"':  # label="a, b": the text inside
                        label = label[1:-1]
                    if not label:
                        raise ValueError(f"agent {text!r}: label is empty")
                    continue
                try:
                    params[k] = _json.loads(v)
                except _json.DuplicateKeyError as e:
                    raise ValueError(f"agent {text!r}: parameter {k!r}: {e}") from None
                except json.JSONDecodeError:
                    params[k] = v
        if label is not None and name == "learned":  # the learned agent takes its label as a parameter too
            params["label"] = label
        return cls(name, params, label=label)


def _split_params(s: str) -> list[str]:
    """``key=value`` parts at the commas outside brackets, braces and double quotes (``b=[4,4],label="a, b"``,
    ``p={"x": 1, "y": 2}``)."""
    out, depth, cur, quoted = [], 0, "", False
    for ch in s:
        if ch == '"':
            quoted = not quoted
        elif quoted:
            pass
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        elif ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        cur += ch
    if quoted:  # the rest would be read as one value, dropping the parameters after it
        raise ValueError(f"an unbalanced double quote in {s!r}: quote a whole value, as label=\"a, b\"")
    if cur:
        out.append(cur)
    return out


@dataclass
class Scenario:
    """Environment arguments, the default line-up of a comparison, and how ``rate`` changes them.

    Build one with :func:`get_scenario` or :meth:`from_dict`; :meth:`to_dict` gives the
    file's data back (at the default rate, ``{rate:g}`` kept in the description).
    """

    name: str
    description: str
    env: dict[str, Any]
    agents: list[AgentSpec]
    default_rate: float | None = None
    #: Runs to the end of its finite workload (the env's ``horizon`` is only a safety cap)
    #: rather than being reported at given horizons.
    finite: bool = False
    #: Overrides of :attr:`env` for tuning runs (``workload`` entries are merged into the
    #: workload mapping). Finite scenarios tune on a smaller workload run to its end, so every
    #: grid value is judged on the same arrivals over the same drain, not on a cut at an
    #: iteration count (which in continuous time covers a different span of seconds per policy).
    tune_env: dict[str, Any] = field(default_factory=dict)
    #: Largest budget a learned policy gets by default on this scenario (``flowgym train``);
    #: ``None``: derived (:meth:`learned_action_range`).
    learned_max_budget: int | None = None
    #: Budget levels a learned policy chooses among by default (``None``: every budget
    #: ``0..learned_max_budget``); see :attr:`flowgym.lab.train.TrainConfig.budget_levels`.
    learned_budget_levels: tuple[int, ...] | None = None
    #: Wall time of ``flowgym compare --scenario NAME`` with its defaults on 2 cores (measured,
    #: tuning included; ``flowgym compare --help`` lists it), or ``None`` when not measured.
    run_time: str | None = None
    #: Report horizons (``None``: :data:`DEFAULT_HORIZONS`, cut at ``env.horizon`` if it is set, which ends the
    #: list; finite scenarios run to the end).
    horizons: list[int] | None = None
    #: Horizon of tuning runs (``None``: the last report horizon, at most 2000).
    tune_horizon: int | None = None
    #: The rate this scenario was built at (``None`` when it has no ``rate`` table).
    rate: float | None = None
    #: The file's data (at the default rate): what :meth:`to_dict` returns.
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Where it came from: a file path, or ``"named"`` for a shipped scenario.
    source: str = ""

    def env_kwargs(self) -> dict[str, Any]:
        return copy.deepcopy(self.env)

    def tune_env_kwargs(self) -> dict[str, Any]:
        """The environment arguments of tuning runs: :meth:`env_kwargs` with :attr:`tune_env` applied."""
        kw = self.env_kwargs()
        for k, v in copy.deepcopy(self.tune_env).items():
            if k == "workload" and isinstance(kw.get("workload"), dict):
                kw["workload"].update(v)
            else:
                kw[k] = v
        return kw

    def report_horizons(self) -> list[int] | None:
        """The horizons a comparison reports at (``None``: run to the end of the workload): :attr:`horizons`, else,
        when ``env`` sets a ``horizon``, :data:`DEFAULT_HORIZONS` below it and that horizon (an episode's length is
        where its report ends), else :data:`DEFAULT_HORIZONS`."""
        if self.finite:
            return None
        if self.horizons:
            return list(self.horizons)
        h = self.env.get("horizon")
        if isinstance(h, int) and not isinstance(h, bool):
            return [t for t in DEFAULT_HORIZONS if t < h] + [h]
        return list(DEFAULT_HORIZONS)

    def learned_action_range(self) -> tuple[int, tuple[int, ...] | None, str]:
        """``(max_budget, budget_levels, where from)`` of a learned policy on this scenario.

        The ``train`` table's values when given; else the largest budget any agent of the
        line-up may use (its parameters and tuning grids: the flow-control budget ``b``,
        rate-switch's ``high``/``low``), at least 16; else the environment's ``max_budget``.
        """
        if self.learned_budget_levels is not None:
            return int(self.learned_budget_levels[-1]), tuple(self.learned_budget_levels), "the scenario's train table"
        if self.learned_max_budget is not None:
            return int(self.learned_max_budget), None, "the scenario's train table"
        seen: list[int] = []
        for a in self.agents:
            for k, v in a.params.items():
                if k in ("b", "high", "low", "budget") and isinstance(v, int) and not isinstance(v, bool):
                    seen.append(v)
            if a.tune is not None and a.tune[0] in ("b", "high", "low", "budget"):
                seen += [v for v in a.tune[1] if isinstance(v, int) and not isinstance(v, bool)]
        if seen:
            return max(16, max(seen)), None, "the largest budget of the scenario's agents and grids (at least 16)"
        return int(self.env.get("max_budget", 64)), None, "the scenario's env max_budget"

    def to_dict(self) -> dict[str, Any]:
        """The scenario as file data (at the default rate; ``{rate:g}`` kept in the description)."""
        return copy.deepcopy(self.data)

    @classmethod
    def from_dict(cls, data: Any, *, rate: float | None = None, where: str = "scenario") -> Scenario:
        """Validate file data and build the scenario at ``rate`` (``None``: the file's default).

        Errors are ``ValueError`` naming ``where`` (the file), the key path and what is allowed.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a scenario is a table of keys ({', '.join(FILE_KEYS)}), "
                             f"got {type(data).__name__}")
        data = _without_nulls(data)
        unknown = sorted(set(data) - set(FILE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(FILE_KEYS)}")
        for key in ("name", "env", "agents"):
            if key not in data:
                raise ValueError(f"{where}: missing key {key!r} ({FILE_KEYS[key]})")
        name = data["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be a non-empty string, got {name!r}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):  # output files are named after it, inside --out
            raise ValueError(f"{where}: name must be letters, digits and . _ + - (it names the output files, so no "
                             f"path separators), starting with a letter or digit, got {name!r}")
        desc = data.get("description", name)
        if not isinstance(desc, str):
            raise ValueError(f"{where}: description must be a string, got {desc!r}")
        if not isinstance(data["env"], dict):
            raise ValueError(f"{where}: env must be a table of FlowControl-v0 arguments, got {data['env']!r}")
        finite = data.get("finite", False)
        if not isinstance(finite, bool):
            raise ValueError(f"{where}: finite must be true or false, got {finite!r}")
        horizons = data.get("horizons")
        if horizons is not None and (not isinstance(horizons, list) or not horizons or any(
                isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= MAX_COUNT for h in horizons)):
            raise ValueError(f"{where}: horizons must be a non-empty array of positive integers (up to 2**53), "
                             f"got {horizons!r}")
        tune_horizon = data.get("tune_horizon")
        if tune_horizon is not None and (isinstance(tune_horizon, bool) or not isinstance(tune_horizon, int)
                                         or not 1 <= tune_horizon <= MAX_COUNT):
            raise ValueError(f"{where}: tune_horizon must be a positive integer (up to 2**53), got {tune_horizon!r}")
        tune_env = data.get("tune_env", {})
        if not isinstance(tune_env, dict):
            raise ValueError(f"{where}: tune_env must be a table, got {tune_env!r}")
        run_time = data.get("run_time")
        if run_time is not None and not isinstance(run_time, str):
            raise ValueError(f"{where}: run_time must be a string, got {run_time!r}")
        agents = [_agent_from(a, f"{where}: agents[{i}]") for i, a in enumerate(_table_list(data["agents"],
                                                                                           f"{where}: agents"))]
        max_budget, levels = _train_from(data.get("train", {}), f"{where}: train")
        env = copy.deepcopy(data["env"])
        _check_env(env, f"{where}: env")  # as written (at the default rate)
        default_rate, value = None, None
        if "rate" in data:
            default_rate, value = _apply_rate(data["rate"], env, rate, f"{where}: rate")
        elif rate is not None:
            raise ValueError(f"{where}: this scenario has no rate table, so --rate/rate= cannot change it")
        if "rate" not in data and ("{rate}" in desc or "{rate:" in desc):
            raise ValueError(f"{where}: description: {{rate}} stands for the rate, but this scenario has no rate table")
        try:
            desc = desc.format(rate=value if value is not None else float("nan"))
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:  # {load}, {rate[0]}, {rate.x}
            raise ValueError(f"{where}: description: only {{rate}} / {{rate:g}} may stand in braces ({e})") from None
        if rate is not None:
            _check_env(env, f"{where}: env at rate {rate!r}")
        elif "rate" in data:  # the rate table's default rate, applied: what compare and run will build
            _check_env(env, f"{where}: env at the rate table's default rate {value!r}")
        if finite:
            from flowgym.sim.workloads import make_workload

            if env.get("horizon") is None and ("workload" not in env or not make_workload(env["workload"]).finite):
                raise ValueError(f"{where}: finite = true runs the workload to its end, but env's workload never ends "
                                 "(give a trace, or an 'iid' workload with n_requests; or set finite = false)")
        if tune_env and "rate" in data:  # the rate reaches env; a value tune_env sets would hide it from tuning runs
            rs = data["rate"]
            for p in [*rs.get("set", []), *rs.get("scale", [])]:
                parts = p.split(".")
                hidden = (len(parts) >= 2 and parts[0] == "env"
                          and (parts[1] in tune_env and parts[1] != "workload"
                               or parts[1] == "workload" and len(parts) >= 3 and isinstance(tune_env.get("workload"), dict)
                               and parts[2] in tune_env["workload"]))
                if hidden:
                    raise ValueError(f"{where}: tune_env sets {'.'.join(parts[1:3] if parts[1] == 'workload' else parts[1:2])!r}, "
                                     f"which the rate table's {p!r} changes: tuning runs would not see the rate "
                                     "(leave it out of tune_env)")
        if tune_env:
            merged = copy.deepcopy(env)
            for k, v in tune_env.items():
                if k == "workload" and isinstance(merged.get("workload"), dict) and isinstance(v, dict):
                    merged["workload"].update(v)
                else:
                    merged[k] = v
            _check_env(merged, f"{where}: tune_env (merged into env)")
        return cls(name=name, description=desc, env=env, agents=agents, default_rate=default_rate, finite=finite,
                   tune_env=copy.deepcopy(tune_env), learned_max_budget=max_budget, learned_budget_levels=levels,
                   run_time=run_time, horizons=horizons, tune_horizon=tune_horizon, rate=value, data=copy.deepcopy(data), source=where)


def _without_nulls(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with a JSON ``null`` at the top or in an agent's table read as the key left out (its default), before
    anything is validated: ``"rate": null`` is a scenario without a rate table, an agent's ``"params": null`` one
    without parameters, and a required key (``name``, ``env``, ``agents``, an agent's ``name``) set to null is
    missing. An unknown key stays, to be refused by name, null or not."""
    out = {k: v for k, v in data.items() if v is not None or k not in FILE_KEYS}
    if isinstance(out.get("agents"), list):
        out["agents"] = [{k: v for k, v in a.items() if v is not None or k not in AGENT_KEYS}
                         if isinstance(a, dict) else a for a in out["agents"]]
    return out


def _table_list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list) or not v:
        raise ValueError(f"{where} must be a non-empty array of tables ([[agents]] in TOML)")
    return v


def _agent_from(a: Any, where: str) -> AgentSpec:
    from flowgym.agents import AGENTS

    if not isinstance(a, dict):
        raise ValueError(f"{where} must be a table with name, and optionally label, params, tune; got {a!r}")
    unknown = sorted(set(a) - set(AGENT_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(AGENT_KEYS)}")
    name = a.get("name")
    if not isinstance(name, str) or name not in AGENTS:
        raise ValueError(f"{where}.name: {name!r} is not an agent; allowed: {', '.join(AGENTS)}")
    params = a.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"{where}.params must be a table, got {params!r}")
    label = a.get("label")
    if label is not None and (not isinstance(label, str) or not label.strip()):  # "" would fall back to the default
        raise ValueError(f"{where}.label must be a non-empty string, got {label!r}")
    tune = a.get("tune")
    if tune is not None:
        if not isinstance(tune, dict) or set(tune) != {"param", "grid"} or not isinstance(tune["param"], str) \
                or not isinstance(tune["grid"], list) or not tune["grid"]:
            raise ValueError(f"{where}.tune must be a table {{param = \"name\", grid = [values...]}}, got {tune!r}")
        tune = (tune["param"], list(tune["grid"]))
    spec = AgentSpec(name, copy.deepcopy(params), tune, label)
    from flowgym.agents import make_agent

    try:  # the parameters are the agent's (each grid value too)
        make_agent(name, **params)
        if tune is not None:
            for v in tune[1]:
                make_agent(name, **{**params, tune[0]: v})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return spec


def _train_from(t: Any, where: str) -> tuple[int | None, tuple[int, ...] | None]:
    if not isinstance(t, dict):
        raise ValueError(f"{where} must be a table (max_budget, budget_levels), got {t!r}")
    unknown = sorted(set(t) - {"max_budget", "budget_levels"})
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: max_budget, budget_levels")
    mb = t.get("max_budget")
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or not 1 <= mb <= MAX_BUDGET_CAP):
        raise ValueError(f"{where}.max_budget must be a positive integer of at most {MAX_BUDGET_CAP}, got {mb!r}")
    levels = t.get("budget_levels")
    if levels is not None:
        from flowgym.agents.learned import valid_levels

        if not valid_levels(levels):
            raise ValueError(f"{where}.budget_levels must be at least two ascending distinct non-negative "
                             f"integers, got {levels!r}")
        if mb is not None and mb != levels[-1]:
            raise ValueError(f"{where}: max_budget ({mb}) must be the largest of budget_levels ({levels[-1]})")
        levels = tuple(levels)
    return mb, levels


def _check_env(env: dict[str, Any], where: str) -> None:
    from flowgym.envs.flow_control import FlowControlConfig
    from flowgym.sim.engine import check_time_model
    from flowgym.sim.workloads import make_workload

    try:
        cfg = FlowControlConfig.from_any(env)
        # the engine's own check, made here because no run builds an engine before a scenario is shown or saved
        check_time_model(make_workload(cfg.workload).timed, cfg.time_model != "slot")
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


def _walk(env_root: dict[str, Any], path: str, where: str) -> tuple[Any, Any]:
    """The container and key of a dotted ``env.a.0.b`` path (``where`` names it in errors)."""
    parts = path.split(".")
    if parts[0] != "env" or len(parts) < 2:
        raise ValueError(f"{where}: {path!r} must be a path into env, e.g. 'env.workload.rate'")
    node: Any = env_root
    for i, p in enumerate(parts[1:-1], start=1):
        node = _step(node, p, ".".join(parts[: i + 1]), where)
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdecimal() or int(last) >= len(node):
            raise ValueError(f"{where}: {path!r}: no item {last!r} (the list has {len(node)})")
        return node, int(last)
    if not isinstance(node, dict) or last not in node:
        raise ValueError(f"{where}: {path!r} names no value in env")
    return node, last


def _step(node: Any, p: str, sofar: str, where: str) -> Any:
    if isinstance(node, list) and p.isdecimal() and int(p) < len(node):
        return node[int(p)]
    if isinstance(node, dict) and p in node:
        return node[p]
    raise ValueError(f"{where}: {sofar!r} names no value in env")


#: The largest rate (or rate default) a scenario takes: any finite rate a float holds with room to scale.
MAX_RATE = 1e300


def _apply_rate(spec: Any, env: dict[str, Any], rate: Any, where: str) -> tuple[float, float]:
    """Set and/or scale the env values the ``rate`` table names; returns (default, value used)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a table (default, meaning, set, scale), got {spec!r}")
    unknown = sorted(set(spec) - {"default", "meaning", "set", "scale"})
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: default, meaning, set, scale")
    default = spec.get("default")
    if not is_real(default) or not (0 < default <= MAX_RATE):  # the range first: no float(10**400)
        raise ValueError(f"{where}.default must be a positive number, got {default!r}")
    paths = {k: spec.get(k, []) for k in ("set", "scale")}
    for k, v in paths.items():
        if not isinstance(v, list) or any(not isinstance(p, str) for p in v):
            raise ValueError(f"{where}.{k} must be an array of paths such as 'env.workload.rate', got {v!r}")
    if not paths["set"] and not paths["scale"]:
        raise ValueError(f"{where}: give set and/or scale (the env values the rate sets or multiplies)")
    # each value once: set then scaled, scaled twice (also as 'rates.01' beside 'rates.1'), or a list scaled
    # beside one of its items, would apply the rate to it twice
    named = [(p, ".".join(str(int(x)) if x.isdecimal() else x for x in p.split("."))) for p in paths["set"] + paths["scale"]]
    for i, (p, cp) in enumerate(named):
        for q, cq in named[i + 1:]:
            if cp == cq or cq.startswith(cp + ".") or cp.startswith(cq + "."):
                raise ValueError(f"{where}: {p!r} and {q!r} name the same value (or one holds the other) in set "
                                 "and scale; name each value once" if p != q else
                                 f"{where}: {p!r} is named more than once in set and scale; name each value once")
    value = default if rate is None else rate
    if not is_real(value) or not (0 < value <= MAX_RATE):
        raise ValueError(f"rate must be a positive number ({spec.get('meaning', 'the scenario rate')}), got {rate!r}")
    value = float(value)
    for p in paths["set"]:
        node, key = _walk(env, p, f"{where}.set")
        node[key] = value
    if rate is not None:  # the file holds the values at the default rate: scale by the ratio
        factor = value / float(default)
        for p in paths["scale"]:
            node, key = _walk(env, p, f"{where}.scale")
            node[key] = _scaled(node[key], factor, f"{where}.scale: {p!r}")
    else:  # the values stay, but must be ones a --rate could scale
        for p in paths["scale"]:
            node, key = _walk(env, p, f"{where}.scale")
            _scaled(node[key], 1.0, f"{where}.scale: {p!r}")
    return float(default), value


def _scaled(v: Any, factor: float, where: str) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"{where} is not a number ({v!r})")
    if isinstance(v, (int, float)):
        return v * factor
    if isinstance(v, list):
        return [_scaled(x, factor, where) for x in v]
    raise ValueError(f"{where} is not a number or an array of numbers ({v!r})")


# --------------------------------------------------------------------------- loading


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8-sig") as fh:  # a byte-order mark (some editors write one) is not text
            text = fh.read()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if path.lower().endswith(".json"):
        try:
            return _json.loads(text)  # a key given twice is refused (json.loads would keep the last; TOML refuses)
        except _json.DuplicateKeyError as e:
            raise ValueError(f"{path}: {e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: "
                             f"{e.msg}") from None
        except RecursionError:
            raise ValueError(f"{path}: its arrays or objects are nested too deeply to read") from None
    try:
        return _toml.loads(text)
    except _toml.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: its arrays or tables are nested too deeply to read") from None


def load_scenario(path: str | os.PathLike[str], *, rate: float | None = None) -> Scenario:
    """The scenario of a TOML (``.toml``) or JSON (``.json``) file, at ``rate`` (default: the file's).

    A trace workload's relative ``path`` is taken relative to the file's folder.
    """
    path = os.fspath(path)
    data = _read(path)
    # a trace given by a relative path is relative to the scenario file's folder
    for table in (data.get("env"), data.get("tune_env")) if isinstance(data, dict) else ():
        wl = table.get("workload") if isinstance(table, dict) else None
        if isinstance(wl, dict) and isinstance(wl.get("path"), str) and not os.path.isabs(wl["path"]):
            wl["path"] = os.path.join(os.path.dirname(os.path.abspath(path)), wl["path"])
    return Scenario.from_dict(data, rate=rate, where=path)


def _named_text(name: str) -> str:
    return resources.files("flowgym.data").joinpath("scenarios", f"{name}.toml").read_text(encoding="utf-8")


def is_scenario_file(name: str) -> bool:
    """``name`` is meant as a file: it ends in ``.toml`` or ``.json``, or names an existing file."""
    return name.lower().endswith((".toml", ".json")) or os.path.isfile(name)


def get_scenario(name: str | dict[str, Any], *, rate: float | None = None) -> Scenario:
    """A named scenario, a scenario file (a path ending in ``.toml``/``.json``), or scenario data (a dict).

    ``rate`` changes what the scenario's ``rate`` table says (per class per slot for the
    synthetic ones, requests per second for paper-realdata, a speed-up of the Azure
    timestamps, a multiplier of every rate for the ``adaptive-*`` synthetic ones).
    """
    if isinstance(name, dict):
        return Scenario.from_dict(name, rate=rate, where="scenario data")
    if not isinstance(name, str):
        raise ValueError(f"a scenario is a name, a file path or a dict, got {type(name).__name__}")
    if name in SCENARIOS:
        sc = Scenario.from_dict(_toml.loads(_named_text(name)), rate=rate, where=f"scenario {name!r}")
        sc.source = "named"
        return sc
    if is_scenario_file(name):
        return load_scenario(name, rate=rate)
    raise ValueError(f"unknown scenario {name!r}: not a file, and not one of {', '.join(SCENARIOS)} "
                     "(files end in .toml or .json)")


def scenario_text(name: str, fmt: str = "toml") -> str:
    """A scenario as the text of a file to start from (``fmt``: ``"toml"`` or ``"json"``)."""
    if fmt not in ("toml", "json"):
        raise ValueError(f"format must be 'toml' or 'json', got {fmt!r}")
    if fmt == "toml" and name in SCENARIOS:
        return _named_text(name)
    data = get_scenario(name).to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    # TOML has no null: an env key set to None whose default is None (estimate_floor) is left out; another (horizon
    # None: run a finite workload to its end, where the default is 1000) keeps TOML's refusal, naming the key
    none_default = {f.name for f in dataclasses.fields(FlowControlConfig) if f.default is None}
    for key in ("env", "tune_env"):
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if v is not None or k not in none_default}
    # a JSON null at the top or in an agent's table is read as the key left out (its default): from_dict dropped it
    # before validating, so to_dict has none there and the TOML leaves the key out
    return _toml.dumps(data, f"flowgym scenario {data['name']!r}; format: docs/scenarios.md")


#: The most seeds a seed list holds (a count, ranges and lists together).
MAX_SEEDS = 10**6


def parse_seeds(text: str | int | list[int], *, first: int = 0) -> list[int]:
    """Seeds from ``"5"`` (five seeds ``first..first+4``), ``"900-919"`` (a range, both ends
    included), ``"1,2,7"`` or ``"900-904,910"``; an int is a count, a list is taken as is."""
    if isinstance(text, bool):
        raise ValueError(f"seeds: got {text!r}")
    if isinstance(text, int):
        if not 1 <= text <= MAX_SEEDS:
            raise ValueError(f"seeds: a count must be from 1 to {MAX_SEEDS:g}, got {text}")
        return list(range(first, first + text))
    if isinstance(text, list):
        if not text or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in text):
            raise ValueError(f"seeds: a list of non-negative integers, got {text!r}")
        return list(text)
    s = str(text).strip()
    if s.isdecimal():
        return parse_seeds(int(s), first=first)
    out: list[int] = []
    for part in s.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if a < 0 or b < a or len(out) + b - a + 1 > MAX_SEEDS:  # counted before the list is built
                    raise ValueError
                out += list(range(a, b + 1))
            else:
                a = int(part)
                if a < 0:
                    raise ValueError
                out.append(a)
        except ValueError:
            raise ValueError(f"seeds: {part!r} in {s!r} is not a seed or a range such as 900-919 "
                             f"(give a count, ranges and/or lists: 5, 900-919, 1,2,7; at most {MAX_SEEDS:g} seeds in all)") from None
    if len(set(out)) != len(out):
        raise ValueError(f"seeds: {s!r} lists a seed twice")
    if len(out) > MAX_SEEDS:
        raise ValueError(f"seeds: {s!r} holds {len(out)} seeds; at most {MAX_SEEDS:g}")
    return out
