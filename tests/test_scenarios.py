"""Scenario files: the named scenarios are files, round trips, the rate table, seeds, errors."""

from __future__ import annotations

import copy
import json

import pytest

from flowgym.lab import _toml
from flowgym.lab.evaluation import evaluate
from flowgym.lab.scenarios import (
    AGENT_KEYS,
    FILE_KEYS,
    SCENARIOS,
    AgentSpec,
    Scenario,
    get_scenario,
    load_scenario,
    parse_seeds,
    scenario_text,
)


def _same(a, b):
    assert a.name == b.name and a.env == b.env and a.tune_env == b.tune_env and a.finite == b.finite
    assert [(s.name, s.params, s.tune, s.label) for s in a.agents] == [(s.name, s.params, s.tune, s.label)
                                                                       for s in b.agents]
    assert (a.learned_max_budget, a.learned_budget_levels, a.default_rate, a.description) == \
        (b.learned_max_budget, b.learned_budget_levels, b.default_rate, b.description)


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_named_scenario_to_file_and_back(name, fmt, tmp_path):
    path = tmp_path / f"mine.{fmt}"
    path.write_text(scenario_text(name, fmt))
    _same(load_scenario(path), get_scenario(name))
    sc = get_scenario(name)
    rate = 2 * sc.default_rate
    _same(load_scenario(path, rate=rate), get_scenario(name, rate=rate))
    # the writer: data -> TOML -> data is the identity
    assert _toml.loads(_toml.dumps(sc.to_dict())) == sc.to_dict()


def test_every_named_scenario_is_a_shipped_file():
    from importlib import resources

    files = {p.name for p in resources.files("flowgym.data").joinpath("scenarios").iterdir() if p.name.endswith(".toml")}
    assert files == {f"{n}.toml" for n in SCENARIOS}


def test_file_scenario_gives_the_named_scenarios_results(tmp_path):
    path = tmp_path / "switch.toml"
    path.write_text(scenario_text("adaptive-switch"))
    agents = [AgentSpec("flow-control", {"b": 12}), AgentSpec("mc")]
    a = evaluate(agents, get_scenario("adaptive-switch").env_kwargs(), [900, 901], [300], keep_kv_usage=False)
    b = evaluate(agents, load_scenario(path).env_kwargs(), [900, 901], [300], keep_kv_usage=False)
    assert a.rows == b.rows and len(a.rows) == 4


def test_rate_table_sets_and_scales():
    assert get_scenario("paper-synthetic-known", rate=3.5).env["workload"]["rates"] == 3.5
    assert get_scenario("paper-realdata-low", rate=7.0).env["workload"]["rate"] == 7.0
    sw = get_scenario("adaptive-switch", rate=2.0).env["workload"]["rate"]
    assert sw["rates"] == [12.0, 27.0] and sw["times"] == [0.0, 1000.0]  # rates doubled, times kept
    mix = get_scenario("adaptive-mix", rate=0.5).env["workload"]["streams"]
    assert [s["rate"]["rates"] for s in mix] == [[15.0, 0.0], [0.0, 1.2]]
    d = get_scenario("adaptive-diurnal", rate=2.0).env["workload"]["rate"]
    assert (d["mean"], d["amplitude"]) == (19.5, 7.5)
    assert "lambda=3.5 per class" in get_scenario("paper-synthetic-known", rate=3.5).description
    assert get_scenario("paper-synthetic-known").rate == 5.0
    with pytest.raises(ValueError, match="rate must be a positive number"):
        get_scenario("adaptive-mix", rate=-1.0)


def _data(**changes):
    d = get_scenario("adaptive-switch").to_dict()
    d.update(changes)
    return d


@pytest.mark.parametrize("change, match", [
    ({"colour": "red"}, r"mine.toml: unknown key 'colour'; allowed keys: name, description, env"),
    ({"agents": [{"name": "oracle"}]}, r"agents\[0\].name: 'oracle' is not an agent; allowed: flow-control, "),
    ({"agents": [{"name": ["mc"]}]}, r"agents\[0\].name: \['mc'\] is not an agent; allowed: flow-control, "),
    ({"agents": [{"name": "mc", "params": {"bb": 1}}]}, r"agents\[0\]: agent 'mc' has no parameter 'bb'; its parameters"),
    ({"agents": [{"name": "flow-control", "tune": {"param": "b"}}]}, r"agents\[0\].tune must be a table"),
    ({"env": {"M": -3}}, r"mine.toml: env: M must be a positive integer"),
    ({"env": {"workload": {"kind": "poison"}}}, r"env: workload kind must be 'poisson', 'iid', 'mix'"),
    ({"rate": {"default": 1.0, "scale": ["env.workload.rate.speed"]}},
     r"rate.scale: 'env.workload.rate.speed' names no value in env"),
    ({"rate": {"default": 0, "set": ["env.M"]}}, r"rate.default must be a positive number"),
    ({"rate": {"default": 1.0, "scale": ["env.workload.rate.rates.\u00b2"]}}, "rate.scale: .* no item '\u00b2'"),
    ({"rate": {"default": 1.0, "set": ["env.M"], "scale": ["env.M"]}},
     r"rate: 'env.M' is named more than once in set and scale"),
    ({"rate": {"default": 1.0, "scale": ["env.workload.rate.rates", "env.workload.rate.rates"]}},
     r"rate: 'env.workload.rate.rates' is named more than once"),
    ({"rate": {"default": 1.0, "scale": ["env.workload.rate.rates", "env.workload.rate.rates.1"]}},
     r"rate: 'env.workload.rate.rates' and 'env.workload.rate.rates.1' name the same value \(or one holds"),
    ({"rate": {"default": 1.0, "scale": ["env.workload.rate.rates.1", "env.workload.rate.rates.01"]}},
     r"rate: 'env.workload.rate.rates.1' and 'env.workload.rate.rates.01' name the same value"),
    ({"train": {"max_budget": 16, "budget_levels": [0, 4, 8]}}, r"train: max_budget \(16\) must be the largest"),
    ({"horizons": [100, -1]}, r"horizons must be a non-empty array of positive integers"),
    ({"description": "at {load}"}, r"description: only \{rate\}"),
])
def test_errors_name_the_file_the_key_and_the_allowed_values(tmp_path, change, match):
    path = tmp_path / "mine.toml"
    path.write_text(_toml.dumps(_data(**change)))
    with pytest.raises(ValueError, match=match):
        load_scenario(path)


def test_unreadable_files_are_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nenv = {M = \n')
    with pytest.raises(ValueError, match=r"bad.toml: invalid TOML: .*line 2"):
        load_scenario(bad)
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",}')
    with pytest.raises(ValueError, match=r"bad.json: invalid JSON at line 1, column 14"):
        load_scenario(bad)
    missing = tmp_path / "gone.toml"
    with pytest.raises(ValueError, match=r"gone.toml: No such file"):
        get_scenario(str(missing))
    with pytest.raises(ValueError, match=r"unknown scenario 'nope': not a file, and not one of paper-synthetic-known"):
        get_scenario("nope")
    (tmp_path / "no-name.toml").write_text(_toml.dumps({k: v for k, v in _data().items() if k != "name"}))
    with pytest.raises(ValueError, match=r"no-name.toml: missing key 'name'"):
        load_scenario(tmp_path / "no-name.toml")


def test_scenario_data_as_a_dict():
    sc = get_scenario(_data(name="from-python"))
    assert sc.name == "from-python" and sc.env == get_scenario("adaptive-switch").env
    with pytest.raises(ValueError, match=r"scenario data: unknown key 'x'"):
        get_scenario(_data(x=1))


def test_seeds():
    assert parse_seeds("3") == [0, 1, 2] and parse_seeds(2, first=1000) == [1000, 1001]
    assert parse_seeds("900-903") == [900, 901, 902, 903]
    assert parse_seeds("1,2,7") == [1, 2, 7] and parse_seeds("900-901,910") == [900, 901, 910]
    for bad in ("0", "9-3", "a-b", "1,,2", "-1", "3,3"):
        with pytest.raises(ValueError, match="seeds"):
            parse_seeds(bad)


def test_learned_action_range_derived_not_capped():
    named = get_scenario("adaptive-mix")
    assert named.learned_action_range()[:2] == (64, named.learned_budget_levels)
    d = _data()
    del d["train"]
    d["agents"] = [{"name": "flow-control", "params": {"b": 20}, "tune": {"param": "b", "grid": [10, 20, 40]}}]
    mb, levels, why = get_scenario(d).learned_action_range()
    assert (mb, levels) == (40, None) and "agents" in why  # the grid reaches 40: no silent cap at 16
    d["agents"] = [{"name": "mc"}]
    assert get_scenario(d).learned_action_range()[0] == 64  # nothing to go by: the env's max_budget


def test_cli_three_commands_from_files(tmp_path, capsys):
    from flowgym.lab.cli import main

    assert main(["scenario", "show", "adaptive-switch"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "mine.toml"
    path.write_text(text.replace('name = "adaptive-switch"', 'name = "mine"').replace("M = 16492", "M = 12000"))
    assert main(["run", "--scenario", str(path), "--horizon", "200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["T"] == 200
    assert main(["compare", "--scenario", str(path), "--seeds", "900-901", "--horizons", "300",
                 "--agents", "flow-control:b=8;mc", "--no-plots", "--quiet", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "mine.json").read_text())
    assert res["seeds"] == [900, 901] and res["env"]["M"] == 12000
    assert main(["compare", "--seeds", "1000-1001", "--quiet", "--no-plots", "--out", str(tmp_path)]) == 2
    assert "overlap" in capsys.readouterr().err
    assert main(["scenario", "show", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "mine"


def test_trace_path_relative_to_the_scenario_file(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text("arrival,prompt_len,output_len\n0,3,4\n1,2,5\n")
    d = {"name": "tr", "finite": True, "env": {"M": 100, "horizon": 1000, "workload": {"kind": "trace", "path": "data/t.csv"}},
         "agents": [{"name": "flow-control", "params": {"b": 2}}]}
    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "s.toml"
    f.write_text(_toml.dumps({**d, "env": {**d["env"], "workload": {"kind": "trace", "path": "../data/t.csv"}}}))
    sc = load_scenario(f)
    assert sc.env["workload"]["path"] == str(tmp_path / "sub" / "../data/t.csv")
    table = evaluate([AgentSpec("flow-control", {"b": 2})], sc.env_kwargs(), [0], None)
    assert table.rows[0]["completed"] == 2


def test_compare_adds_agents_to_the_tuned_line_up(tmp_path, capsys):
    from flowgym.lab.cli import main

    assert main(["compare", "--scenario", "adaptive-switch", "--horizons", "200", "--seeds", "900-900", "--tune-seeds",
                 "1", "--add-agents", "fixed:b=3", "--no-plots", "--quiet", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "adaptive-switch.json").read_text())
    assert res["agents"][-1] == "fixed b=3" and res["agents"][0].startswith("flow-control (best fixed b) b=")


def test_report_horizons_end_at_the_episode_the_scenario_sets(tmp_path):
    """With no ``horizons``, a scenario whose ``env.horizon`` is set reports at the default horizons below it and at
    it (the ``adaptive-*`` scenarios at 1000-4000, their 4,000-slot episodes), not past it; ``horizons`` wins; a
    scenario without an ``env.horizon`` keeps the defaults."""
    from flowgym.lab.scenarios import DEFAULT_HORIZONS, load_scenario

    assert get_scenario("adaptive-mix").report_horizons() == [1000, 2000, 3000, 4000]
    assert get_scenario("paper-synthetic-known").report_horizons() == DEFAULT_HORIZONS
    body = 'name = "h"\n[env]\nM = 2000\nhorizon = 2500\n[[agents]]\nname = "mc"\n'
    (tmp_path / "h.toml").write_text(body)
    assert load_scenario(tmp_path / "h.toml").report_horizons() == [1000, 2000, 2500]
    (tmp_path / "g.toml").write_text('horizons = [300, 6000]\n' + body)
    assert load_scenario(tmp_path / "g.toml").report_horizons() == [300, 6000]
    (tmp_path / "s.toml").write_text(body.replace("2500", "700"))
    assert load_scenario(tmp_path / "s.toml").report_horizons() == [700]


def test_a_scenario_file_is_refused_for_what_a_run_would_only_find_later(tmp_path):
    """At load (``scenario show`` too), naming the file: an empty inline trace, a trace given both in a file and
    inline, an Azure workload in slots and a latency model over a workload in slots."""
    from flowgym.lab.scenarios import load_scenario

    csv = tmp_path / "t.csv"
    csv.write_text("arrival,prompt_len,output_len\n0,1,3\n")
    cases = {
        '{kind = "trace", arrival = [], prompt_len = [], output_len = []}': "an empty trace",
        f'{{kind = "trace", path = "{csv}", arrival = [0], prompt_len = [1], output_len = [3]}}':
            "'arrival' names a column of the CSV",
        '{kind = "azure", trace = "conv"}': "timestamps in seconds",
        '{kind = "iid", rate = 1.0, n_requests = 5, lengths = {kind = "empirical", pairs = [[1, 2]]}}\n'
        'time_model = "llama2-70b-tp2-a100"': "needs a timed workload",
    }
    for workload, says in cases.items():
        p = tmp_path / "w.toml"
        p.write_text(f'name = "w"\nfinite = true\n[env]\nM = 20000\nworkload = {workload}\n[[agents]]\nname = "mc"\n')
        with pytest.raises(ValueError, match=says) as e:
            load_scenario(p)
        assert str(e.value).startswith(f"{p}: env: "), e.value


def test_a_json_scenario_with_a_null_env_key_shows_as_toml(tmp_path):
    """``"estimate_floor": null`` (the default: the workload's shortest output) is valid JSON and loads; shown as
    TOML, which has no null, the key is left out, and the TOML loads back to the same environment."""
    import json

    data = json.loads(scenario_text("paper-synthetic-unknown", "json"))
    data["env"]["estimate_floor"] = None
    path = tmp_path / "u.json"
    path.write_text(json.dumps(data))
    text = scenario_text(str(path))
    assert "estimate_floor" not in text
    back = tmp_path / "u.toml"
    back.write_text(text)
    assert get_scenario(str(back)).env_kwargs() == {k: v for k, v in get_scenario(str(path)).env_kwargs().items()
                                                    if v is not None}
    # horizon None is not its default (1000): leaving it out would cut every run; TOML's refusal names it
    data["env"]["horizon"] = None
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="horizon"):
        scenario_text(str(path))


def test_json_nulls_at_the_top_and_in_agents_show_as_toml_as_the_keys_left_out(tmp_path):
    """A JSON ``null`` for ``horizons`` or an agent's ``label`` or ``tune`` loads as the key left out; shown as TOML
    (no null) those keys are left out, and the TOML loads back to the same scenario."""
    data = json.loads(scenario_text("paper-synthetic-unknown", "json"))
    data["horizons"] = None
    data["agents"][0]["label"] = None
    data["agents"][-1]["tune"] = None
    path = tmp_path / "n.json"
    path.write_text(json.dumps(data))
    text = scenario_text(str(path))
    assert "null" not in text and "horizons" not in text
    back = tmp_path / "n.toml"
    back.write_text(text)
    _same(get_scenario(str(back)), get_scenario(str(path)))


def test_a_byte_order_mark_is_not_part_of_the_file(tmp_path):
    for fmt in ("toml", "json"):
        p = tmp_path / f"bom.{fmt}"
        p.write_text(scenario_text("paper-synthetic-unknown", fmt), encoding="utf-8-sig")
        _same(load_scenario(p), get_scenario("paper-synthetic-unknown"))


def test_a_scaled_path_to_no_number_is_refused_at_load_not_only_at_another_rate(tmp_path):
    text = scenario_text("adaptive-mix").replace('scale = [', 'scale = ["env.workload.streams.0.kind", ', 1)
    assert '"env.workload.streams.0.kind"' in text
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ValueError, match=r"rate.scale: 'env.workload.streams.0.kind' is not a number or an array"):
        load_scenario(p)


def test_scenario_show_checks_each_agent_against_the_env(tmp_path, capsys):
    from flowgym.lab.cli import main

    text = scenario_text("paper-synthetic-known")
    assert "[[agents]]" in text
    p = tmp_path / "b.toml"
    p.write_text(text + '\n[[agents]]\nname = "flow-control"\nparams = {b = [4, 4]}\n')
    assert main(["scenario", "show", str(p)]) == 2
    err = capsys.readouterr().err
    n = text.count("[[agents]]")
    assert f"agents[{n}]: agent 'flow-control b=(4, 4)' cannot run on this scenario" in err and "Traceback" not in err
    assert main(["scenario", "show", "paper-synthetic-known"]) == 0


# --------------------------------------------------------------------------- JSON null: the key left out


def _null_base():
    """A scenario's data with every top-level key and every agent key set to something other than its default."""
    data = get_scenario("paper-synthetic-unknown").to_dict()
    data.update(finite=False, horizons=[300, 600], tune_horizon=200, tune_env={"max_budget": 512})
    assert set(data) == set(FILE_KEYS) and set(data["agents"][0]) == set(AGENT_KEYS)
    return data


def _outcome(path, **kw):
    """The scenario a file loads to, or the error it is refused with."""
    try:
        return load_scenario(path, **kw)
    except ValueError as e:
        return f"refused: {e}"


def _null_and_absent(tmp_path, data, put, **kw):
    """What the file loads to with ``put(data, None)`` and with ``put(data, DROP)``, at one path."""
    path = tmp_path / "n.json"
    out = []
    for value in (None, _DROP):
        d = copy.deepcopy(data)
        put(d, value)
        path.write_text(json.dumps(d))
        out.append(_outcome(path, **kw))
    return out, path


_DROP = object()


def _set(table, key, value):
    if value is _DROP:
        del table[key]
    else:
        table[key] = value


@pytest.mark.parametrize("key", list(FILE_KEYS))
def test_a_json_null_at_the_top_loads_as_the_key_left_out(key, tmp_path):
    """docs/scenarios.md: a JSON ``null`` at the top is read as the key left out. ``rate``, ``description``,
    ``tune_env``, ``train`` and ``finite`` refused it (``rate must be a table ..., got None``); a required key set to
    null is missing, as when left out."""
    data = _null_base()
    if key == "rate":  # without a rate table the description may not stand for the rate
        data["description"] = "no rate here"
    (null, absent), path = _null_and_absent(tmp_path, data, lambda d, v: _set(d, key, v))
    assert null == absent  # the whole Scenario: every field, to_dict's data and the source
    if key in ("name", "env", "agents"):
        assert absent == f"refused: {path}: missing key {key!r} ({FILE_KEYS[key]})"
    else:
        assert isinstance(null, Scenario), null
        assert key not in null.to_dict()  # nothing to write back as null (TOML has none)
        assert _toml.loads(scenario_text(str(path))) == null.to_dict()


def test_a_null_rate_table_is_no_rate_table_also_for_a_rate_argument(tmp_path):
    data = _null_base()
    data["description"] = "no rate here"
    (null, absent), path = _null_and_absent(tmp_path, data, lambda d, v: _set(d, "rate", v), rate=2.0)
    assert null == absent == f"refused: {path}: this scenario has no rate table, so --rate/rate= cannot change it"
    # with {rate:g} in the description, both are refused for the same reason
    data["description"] = "lambda={rate:g}"
    (null, absent), path = _null_and_absent(tmp_path, data, lambda d, v: _set(d, "rate", v))
    assert null == absent and "this scenario has no rate table" in null


@pytest.mark.parametrize("key", AGENT_KEYS)
def test_a_json_null_in_an_agents_table_loads_as_the_key_left_out(key, tmp_path):
    """An agent's ``"params": null`` was refused (``params must be a table, got None``); now it, and a null label,
    tune or name, is the key left out (a missing name is refused as not an agent, as before)."""
    data = _null_base()
    (null, absent), path = _null_and_absent(tmp_path, data, lambda d, v: _set(d["agents"][0], key, v))
    assert null == absent
    if key == "name":
        assert absent.startswith(f"refused: {path}: agents[0].name: None is not an agent; allowed: ")
    else:
        assert isinstance(null, Scenario), null
        assert key not in null.to_dict()["agents"][0]
        spec = null.agents[0]
        assert {"label": spec.label is None, "params": spec.params == {}, "tune": spec.tune is None}[key]


def test_nulls_are_dropped_from_a_copy_of_the_callers_data():
    data = _null_base()
    data["train"] = None
    data["agents"][0]["params"] = None
    sc = get_scenario(data)
    assert data["train"] is None and data["agents"][0]["params"] is None  # the caller's dict is not changed
    assert sc.learned_max_budget is None and sc.agents[0].params == {} and "train" not in sc.to_dict()


@pytest.mark.parametrize("table, key, value, says", [
    ("top", "name", 5, "name must be a non-empty string, got 5"),
    ("top", "description", 3, "description must be a string, got 3"),
    ("top", "env", 5, "env must be a table of FlowControl-v0 arguments, got 5"),
    ("top", "agents", 5, "agents must be a non-empty array of tables"),
    ("top", "rate", 5, "rate must be a table (default, meaning, set, scale), got 5"),
    ("top", "finite", "yes", "finite must be true or false, got 'yes'"),
    ("top", "horizons", "x", "horizons must be a non-empty array of positive integers"),
    ("top", "tune_horizon", "x", "tune_horizon must be a positive integer"),
    ("top", "tune_env", [], "tune_env must be a table, got []"),
    ("top", "train", "x", "train must be a table (max_budget, budget_levels), got 'x'"),
    ("top", "run_time", 5, "run_time must be a string, got 5"),
    ("top", "speed", None, "unknown key 'speed'; allowed keys: "),  # an unknown key, null or not
    ("agent", "name", 5, "agents[0].name: 5 is not an agent"),
    ("agent", "label", 5, "agents[0].label must be a non-empty string, got 5"),
    ("agent", "params", [], "agents[0].params must be a table, got []"),
    ("agent", "tune", 5, "agents[0].tune must be a table"),
    ("agent", "prams", None, "agents[0]: unknown key 'prams'; allowed: name, label, params, tune"),
])
def test_a_wrong_non_null_value_is_still_refused_naming_its_field(table, key, value, says, tmp_path):
    data = _null_base()
    (data if table == "top" else data["agents"][0])[key] = value
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as e:
        load_scenario(path)
    assert str(e.value).startswith(f"{path}: {says}"), e.value


def test_the_docs_from_python_snippet_trains_at_the_rate_it_loads(monkeypatch):
    """docs/scenarios.md "From Python": ``sc.to_dict()`` is the file's data at its default rate, so the snippet's
    ``TrainConfig`` must carry ``rate=1.2`` itself; it trained at the default rate. The snippet runs here with
    ``train`` replaced by a capture (nothing is trained)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "scenarios.md").read_text()
    code = re.search(r"## From Python\n\n```python\n(.*?)```", doc, re.S).group(1)
    seen = []
    monkeypatch.setattr("flowgym.lab.train.train", seen.append)
    monkeypatch.chdir(root)
    exec(compile(code, "docs/scenarios.md", "exec"), {})
    (cfg,) = seen
    built = get_scenario(cfg.scenario, rate=cfg.rate).env_kwargs()
    streams = built["workload"]["streams"]
    default = load_scenario(root / "examples" / "scenarios" / "bursty-chat.toml").env_kwargs()["workload"]["streams"]
    assert (streams[0]["rate"]["base"], streams[0]["rate"]["burst"], streams[1]["rate"]) == pytest.approx(
        (1.2 * default[0]["rate"]["base"], 1.2 * default[0]["rate"]["burst"], 1.2 * default[1]["rate"]))
    assert built == get_scenario("examples/scenarios/bursty-chat.toml", rate=1.2).env_kwargs() != \
        get_scenario(cfg.scenario).env_kwargs()
