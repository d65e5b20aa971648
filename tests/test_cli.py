"""The command line and the examples run end to end."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from flowgym.lab.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_run_prints_metrics_as_json(capsys):
    assert main(["run", "--horizon", "300", "--json", "--seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["T"] == 300 and out["budget"] == 12 and out["completed"] > 0
    assert out["rho"] == pytest.approx(3.5 * 4060 / 16492)


def test_run_is_deterministic(capsys):
    main(["run", "--horizon", "200", "--json", "--budget", "30", "--rate", "5"])
    a = json.loads(capsys.readouterr().out)
    main(["run", "--horizon", "200", "--json", "--budget", "30", "--rate", "5"])
    b = json.loads(capsys.readouterr().out)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b and a["evictions"] > 0


def test_run_table(capsys):
    assert main(["run", "--horizon", "100"]) == 0
    out = capsys.readouterr().out
    for name in ("avg_latency", "p95_latency", "request_throughput", "token_throughput", "evictions"):
        assert name in out


def test_run_trace_csv(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_len,output_len\n0,5,3\n1,4,2\n")
    assert main(["run", "--trace", str(p), "--budget", "2", "--M", "50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] == 2 and out["T"] == 3


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--M", "0"]) == 2
    assert "M must be a positive integer" in capsys.readouterr().err
    p = tmp_path / "bad.csv"
    p.write_text("arrival,prompt_len,output_len\n0,5,3\n1,-4,2\n")
    assert main(["run", "--trace", str(p), "--budget", "2"]) == 2
    err = capsys.readouterr().err
    assert "row 3" in err and "prompt_len" in err and "Traceback" not in err


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "flowgym.lab.cli", "run", "--horizon", "50"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "avg_latency" in r.stdout


def test_quickstart_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    assert "Theorem 2" in capsys.readouterr().out


# --------------------------------------------------------------------------- details a new user meets


def _help(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv + ["--help"])
    return capsys.readouterr().out


def test_help_texts(capsys):
    from flowgym.lab.scenarios import SCENARIOS
    from flowgym.lab.train import DEFAULT_TRAIN_MINUTES

    top = _help([], capsys)
    assert "``" not in top and "flowgym compare" in top
    compare = _help(["compare"], capsys)
    assert "95%%" not in compare and "95%" in compare
    import re

    def once_each(section):
        return {n: len(re.findall(r"(?<![\w-])" + re.escape(n) + r"(?![\w-])", section)) for n in SCENARIOS}

    flat = " ".join(compare.split())
    section = flat.rsplit("--scenario SCENARIO", 1)[1].split("--rate RATE", 1)[0]
    assert set(once_each(section).values()) == {1}  # every scenario, once
    assert "--wide" in compare
    train = " ".join(_help(["train"], capsys).split())
    assert f"about {DEFAULT_TRAIN_MINUTES} minutes" in train
    section = train.rsplit("--scenario SCENARIO", 1)[1].split("--rate RATE", 1)[0]
    assert set(once_each(section).values()) == {1}
    readme = (ROOT / "README.md").read_text()
    assert f"about {DEFAULT_TRAIN_MINUTES} minutes" in " ".join(readme.split())
    from flowgym.lab.train import GENERALIST_TRAIN_MINUTES

    assert f"about {GENERALIST_TRAIN_MINUTES} minutes" in " ".join(readme.split())
    assert f"about {GENERALIST_TRAIN_MINUTES} minutes" in train
    run = _help(["run"], capsys)
    for flag in ("--eviction", "--seed"):
        line = next(ln for ln in run.splitlines() if ln.strip().startswith(flag))
        assert len(line.split()) > 2 or "default" in run.split(flag, 1)[1][:200]


def test_install_hints_name_the_checkout_not_the_pypi_name(capsys):
    """``pip install 'flowgym[train]'`` installs PyPI's ``flowgym``, an unrelated project: the hints install the
    extras from the checkout, quoted for zsh, as the README does."""
    flat = {cmd: " ".join(_help(list(cmd), capsys).split()) for cmd in ((), ("train",), ("compare",), ("reproduce",))}
    for cmd, text in flat.items():
        assert "pip install 'flowgym" not in text and "pip install flowgym" not in text, cmd
    hint = 'pip install -e ".[{}]" in the flowgym checkout'
    assert f"SB3 algorithms with {hint.format('train')}" in flat[()]
    assert f"needs {hint.format('train')}" in flat[("train",)]
    assert f"best evaluated against the tuned baselines ({hint.format('ray')};" in flat[("train",)]
    for cmd in (("compare",), ("reproduce",)):
        assert f"--address; {hint.format('ray')})" in flat[cmd]


def test_train_help_states_the_multipliers_default_of_each_path(monkeypatch, capsys):
    """``--multipliers``' default is the config's that trains: ARS's (with or without --scenario) and the SB3
    generalist's are 0.5..4, an SB3 run on the scenario itself (TrainConfig) 0.25..8. The help said 0.5..4 for
    all; each default it states is checked against the config the command builds."""
    seen = []
    monkeypatch.setattr("flowgym.lab.cli._train_flags_without_effect", lambda args, cfg: seen.append(cfg) or "stop")
    runs = {"ars": [], "ars on a scenario": ["--scenario", "adaptive-mix", "--algo", "ars"],
            "sb3 on a distribution": ["--algo", "ppo"],
            "sb3 on the scenario": ["--scenario", "adaptive-mix", "--action", "multiplier"],
            "sb3, distribution none": ["--distribution", "none", "--algo", "ppo", "--action", "multiplier"]}
    got = {}
    for what, argv in runs.items():
        assert main(["train", *argv, "--quiet"]) == 2, what
        got[what] = ",".join(f"{k:g}" for k in seen[-1].multipliers)
    capsys.readouterr()
    assert got["sb3 on the scenario"] == "0.25,0.5,0.75,1,1.25,1.5,2,3,4,6,8" != got["ars"]
    text = " ".join(_help(["train"], capsys).split())
    text = text.split("--multipliers MULTIPLIERS the multipliers", 1)[1].split("--multiplier-of", 1)[0]
    parts = text.split("Default: ", 1)[1].split("; ")
    assert len(parts) == 2, parts
    ars_part, scenario_part = parts
    assert ars_part.startswith(got["ars"] + " with --algo ars (on a scenario too)")
    assert got["ars on a scenario"] == got["sb3 on a distribution"] == got["ars"]
    assert "an SB3 algorithm on a distribution" in ars_part
    assert scenario_part.startswith(got["sb3 on the scenario"] + " with an SB3 algorithm")
    assert got["sb3, distribution none"] == got["sb3 on the scenario"] and "--distribution none" in scenario_part


def test_run_json_ends_with_a_newline(capsys):
    assert main(["run", "--horizon", "20", "--json"]) == 0
    assert capsys.readouterr().out.endswith("}\n")


def test_bad_input_named_in_user_terms(capsys, tmp_path):
    assert main(["run", "--budget", "-3", "--horizon", "10"]) == 2
    err = capsys.readouterr().err
    assert "--budget" in err and "action space" not in err
    with pytest.raises(SystemExit):
        main(["compare", "--rate", "-1"])
    out = capsys.readouterr()
    assert "--rate must be a positive number" in out.err and "Dong & Cao" not in out.out
    assert main(["compare", "--agents", "mc:foo=1", "--quiet", "--no-plots", "--out", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "has no parameter 'foo'" in out.err and "max_budget" in out.err and "unexpected keyword" not in out.err
    assert out.out == ""  # nothing printed before the error
    empty = tmp_path / "empty.csv"
    empty.write_text("arrival,prompt_len,output_len\n")
    assert main(["run", "--trace", str(empty)]) == 2
    assert "empty trace" in capsys.readouterr().err
    secs = tmp_path / "secs.csv"
    secs.write_text("arrival,prompt_len,output_len\n0.5,3,4\n")
    assert main(["run", "--trace", str(secs)]) == 2
    assert "timed=True" in capsys.readouterr().err


def test_progress_counts_work_and_prints_lines_off_a_terminal():
    import io

    from flowgym.lab.evaluation import Progress

    log = io.StringIO()  # not a terminal
    bar = Progress(10.0, stream=log, interval=0.0)
    bar.update("short", 1.0)
    bar.update("long", 9.0)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2
    assert lines[0].startswith("progress:  10% of the work, 1 done") and lines[0].endswith(": short")
    assert lines[1].startswith("progress: 100% of the work, 2 done")
    quiet = io.StringIO()
    bar = Progress(3.0, stream=quiet, interval=3600.0)
    for _ in range(3):
        bar.update("x")
    assert len(quiet.getvalue().splitlines()) == 1  # only the last line within the interval


def test_make_agent_lists_valid_parameters():
    from flowgym.agents import make_agent

    with pytest.raises(ValueError, match=r"has no parameter 'bb'; its parameters: b, cap"):
        make_agent("flow-control", bb=3)


def test_compare_bound_puts_every_agent_above_the_lower_bound(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["compare", "--scenario", "adaptive-high", "--horizons", "300,600", "--seeds", "2", "--no-tune",
                 "--agents", "flow-control:b=13;mc", "--bound", "--no-plots", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "lower bound on mean time in system, any schedule of these requests (T=300)" in text
    assert "(T=600)" in text
    data = json.loads((out / "adaptive-high.json").read_text())
    rows = data["lower_bound"]
    assert {(r["seed"], r["horizon"]) for r in rows} == {(0, 300), (0, 600), (1, 300), (1, 600)}
    for r in data["rows"]:  # every agent, seed and horizon at or above that seed's bound
        b = next(x for x in rows if x["seed"] == r["seed"] and x["horizon"] == r["horizon"])
        assert b["service"] <= b["bound"] <= r["mean_time_in_system"] + 1e-9


def test_compare_bound_refuses_continuous_time(capsys):
    assert main(["compare", "--scenario", "paper-realdata-low", "--bound", "--no-plots", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--bound does not apply to scenario paper-realdata-low" in err and "continuous time" in err


# --------------------------------------------------------------------------- bad input found by an independent review

_BASE = """name = "mine"
description = "test {rate:g}"
rate = {default = 5.0, meaning = "arrival rate per class per slot", set = ["env.workload.rates"]}

[env]
M = 16492
workload = {kind = "poisson", classes = [[10, 20], [10, 40], [10, 60]], rates = 5.0}
output_length_known = true

[[agents]]
name = "mc"
"""


def _scenario_file(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("argv, match", [
    (["run", "--seed", "-1", "--horizon", "20"], "--seed must be an integer >= 0"),
    (["hindsight", "--random", "0"], "--random must be an integer >= 1"),
    (["hindsight", "--random", "5", "--online", "-1"], "--online must be a positive number"),
    (["hindsight", "--random", "5", "--time-limit", "0"], "--time-limit must be a positive number"),
    (["hindsight", "--random", "5", "--T", "0", "--objectives", "completed"], "--T must be an integer >= 1"),
])
def test_bad_flags_are_named_by_argparse(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["hindsight", "--random", "5", "--agents", "nosuch", "--time-limit", "5"], "unknown agent 'nosuch'"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", "flow-control:b=12,b=14",
      "--no-tune"], "parameter 'b' is given twice"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", "flow-control:b=[4,4]"],
     r"agent 'flow-control b=(4, 4)' cannot run on this scenario: action array([4, 4]) is not in the action space"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", "mc", "--workers", "2"],
     "workers configures the process or ray backend"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", "mc", "--backend",
      "process", "--address", "auto"], "address names a Ray cluster"),
    (["scenario", "list", "adaptive-mix"], "takes no name or --format"),
    (["run", "--trace", "x.csv", "--rate", "3"], "--rate sets the paper classes' Poisson rate"),
    (["run", "--budget", "99999999999999999999", "--horizon", "5"],
     "--budget must be a non-negative number of requests per slot, at most 1000000000"),
    (["run", "--budget", "-1", "--horizon", "5"], "--budget must be a non-negative number of requests per slot"),
    # an empty list is not the default lineup
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", ""], "--agents names no agent"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", " ; "],
     "--agents names no agent"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--add-agents", ";"],
     "--add-agents names no agent"),
    (["hindsight", "--random", "5", "--agents", "", "--time-limit", "5"], "--agents names no agent"),
    (["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", "mc;;a-min"],
     "--agents has an empty entry ('mc;;a-min')"),
])
def test_bad_input_is_refused_before_any_run(argv, match, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_output_folders_that_cannot_be_written_fail_before_the_run(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["compare", "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet", "--agents", "mc",
                 "--out", str(afile)]) == 2
    captured = capsys.readouterr()
    assert f"--out {str(afile)!r} cannot be made a folder" in captured.err and "mean" not in captured.out
    assert main(["hindsight", "--random", "4", "--time-limit", "5", "--json", str(tmp_path / "no" / "x.json")]) == 2
    captured = capsys.readouterr()
    assert "--json" in captured.err and "cannot be written" in captured.err and captured.out == ""
    assert main(["reproduce", "--claims", str(tmp_path / "missing.toml"), "--quick", "--only", "theory",
                 "--out", str(tmp_path / "rep")]) == 2
    assert "No such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("edit, match", [
    (('name = "mine"', 'name = "a/b"'), "name must be letters, digits"),
    (('name = "mine"', 'name = "/tmp/elsewhere"'), "name must be letters, digits"),
    (("M = 16492", "M = 99999999999999999999"), "M must be at most"),
    (("M = 16492", "M = 16492\nrecord = \"stream\""), "record='stream'"),
    (("M = 16492", "M = 16492\nper_class_budget = true"), "agents[0]: agent 'mc' cannot run on this scenario"),
    (("M = 16492", 'M = 16492\naction = "multiplier"'), "agents[0]: agent 'mc' sends budgets (action='budget') but "
                                                         "the scenario sets action='multiplier'"),
    (('rates = 5.0}', 'rates = 5.0, timed = "false"}'), "timed must be true or false"),
    (('name = "mine"', 'name = "mine"\nfinite = true'), "finite = true runs the workload to its end"),
    (('set = ["env.workload.rates"]', 'set = ["env.M"]'), "the rate table's default rate 5.0: M must be"),
])
def test_scenario_files_that_cannot_run_are_refused_by_name(tmp_path, edit, match, capsys):
    path = _scenario_file(tmp_path, _BASE.replace(*edit, 1))
    assert main(["compare", "--scenario", path, "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert not Path("/tmp/elsewhere.csv").exists()  # where an absolute name would have written


def test_run_refuses_what_would_not_be_a_fixed_budget_or_would_be_ignored(tmp_path, capsys):
    """flowgym run plays one budget: a scenario whose action space reads numbers otherwise (multipliers, per-class
    budgets) is refused by its key, as is a --seed that a trace scenario's replay would ignore; the same run without
    the key or the seed goes."""
    for key in ('action = "multiplier"', "action = \"log-multiplier\"", "per_class_budget = true"):
        path = _scenario_file(tmp_path, _BASE.replace("M = 16492", f"M = 16492\n{key}", 1))
        assert main(["run", "--scenario", path, "--budget", "5", "--horizon", "30"]) == 2
        err = capsys.readouterr().err
        want = key.replace(" = ", "=").replace('"', "'")
        assert f"sets env {want}; flowgym run plays one fixed budget" in err and "Traceback" not in err
    assert main(["run", "--scenario", _scenario_file(tmp_path, _BASE), "--budget", "5", "--horizon", "30"]) == 0
    capsys.readouterr()
    assert main(["run", "--scenario", "azure-conv", "--seed", "5", "--budget", "4", "--horizon", "30"]) == 2
    assert "replays a trace, whose arrivals no seed changes: drop --seed" in capsys.readouterr().err
    assert main(["run", "--scenario", "azure-conv", "--budget", "4", "--horizon", "30", "--json"]) == 0


def test_compare_names_the_agent_entry_it_refuses(capsys):
    assert main(["compare", "--scenario", "paper-synthetic-unknown", "--agents", "flow-control:b=4;fixed:b=x",
                 "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet"]) == 2
    assert "error: --agents entry 2: agent 'fixed': b must be" in capsys.readouterr().err
    assert main(["compare", "--scenario", "paper-synthetic-unknown", "--add-agents", "fixed:b=-1",
                 "--horizons", "50", "--seeds", "1", "--no-plots", "--quiet"]) == 2
    assert "error: --add-agents entry 1: agent 'fixed'" in capsys.readouterr().err


def test_json_scenario_with_a_duplicate_key_is_refused(tmp_path, capsys):
    path = _scenario_file(tmp_path, '{"name": "d", "env": {"M": 16492, "M": 100}, "agents": [{"name": "mc"}]}',
                          "d.json")
    assert main(["scenario", "show", path]) == 2
    assert "key 'M' is given twice" in capsys.readouterr().err


def test_trace_rows_longer_than_the_header_are_named(tmp_path, capsys):
    p = tmp_path / "ragged.csv"
    p.write_text("arrival,prompt_len,output_len\n0,5,10\n1,5,10,7\n")
    assert main(["run", "--trace", str(p), "--budget", "4"]) == 2
    assert "row 3: 4 fields, header has 3" in capsys.readouterr().err
    p.write_text("arrival,prompt_len,output_len\n0,5,10,\n1,5,10\n")  # a trailing comma is an empty field: fine
    assert main(["run", "--trace", str(p), "--budget", "4", "--json"]) == 0


def test_a_horizon_past_a_trace_s_end_is_noted(tmp_path, capsys):
    (tmp_path / "tr.csv").write_text("arrival,prompt_len,output_len\n0,5,10\n1,5,10\n3,4,6\n")
    path = _scenario_file(tmp_path, 'name = "trsc"\nhorizons = [5, 1000]\n[env]\nM = 200\nhorizon = 1000\n'
                                    'workload = {kind = "trace", path = "tr.csv"}\n[[agents]]\nname = "mc"\n')
    assert main(["compare", "--scenario", path, "--seeds", "1", "--no-plots", "--quiet",
                 "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "every episode ended before T=1000 (the workload ran out of requests): a row there is its whole run's" in err
    assert "T=5" not in err


def test_claims_file_typos_are_refused(tmp_path, capsys):
    from flowgym.lab import _toml  # noqa: F401  (the packaged claims, edited)
    from importlib import resources

    text = resources.files("flowgym.data").joinpath("claims.toml").read_text()
    for old, new, match in (('[settings.theorem1]\n', '[settings.theorem1]\nbogus_setting_key = 1\n',
                             "setting 'theorem1': unknown field 'bogus_setting_key'"),
                            ('verdict = ', 'quick_verdit = "holds"\nverdict = ', "unknown field 'quick_verdit'")):
        assert old in text
        p = tmp_path / "claims.toml"
        p.write_text(text.replace(old, new, 1))
        assert main(["reproduce", "--claims", str(p), "--quick", "--only", "theory", "--quiet",
                     "--out", str(tmp_path / "rep")]) == 2
        assert match in capsys.readouterr().err


def test_ars_trains_on_a_scenario_without_a_horizon(tmp_path, capsys):
    assert main(["train", "--algo", "ars", "--scenario", "paper-synthetic-known", "--iterations", "1",
                 "--directions", "1", "--draws", "1", "--eval-every", "1", "--eval-episodes", "1", "--norm-draws", "1",
                 "--final-eval-seeds", "0", "--workers", "1", "--quiet", "--no-plots", "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "policy.npz").exists()
    assert main(["train", "--algo", "ars", "--scenario", "paper-synthetic-known", "--iterations", "1",
                 "--tune-seeds", "0", "--final-eval-seeds", "1", "--out", str(tmp_path / "m2")]) == 2
    assert "tune_seeds must be at least 1 when final_eval_seeds > 0: the final table tunes" in capsys.readouterr().err


def test_reproduce_refuses_an_only_with_an_empty_name(tmp_path, capsys):
    """``--only ""``, ``--only ,`` or a doubled comma would otherwise select nothing, which ran everything."""
    for only in ("", ",", "theory,,sec4.1", "theory,"):
        assert main(["reproduce", "--only", only, "--out", str(tmp_path / "r")]) == 2
        assert f"--only {only!r} has an empty name" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any output


def test_run_refuses_a_seed_for_a_trace(tmp_path, capsys):
    """A trace replays its own arrivals: a --seed would change nothing, so it is refused, not dropped."""
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_len,output_len\n0,10,20\n1,10,4\n")
    assert main(["run", "--trace", str(p), "--seed", "5", "--budget", "2"]) == 2
    assert "drop --seed" in capsys.readouterr().err
    assert main(["run", "--trace", str(p), "--budget", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["seed"] == 0 and got["not_arrived"] == 0 and got["completed"] == 2


def test_train_names_its_default_folder_after_a_scenario_file_on_every_algorithm(tmp_path, monkeypatch):
    """``flowgym train --scenario my.toml`` writes ``runs/ppo-my`` (the README's example), as ``--algo ars`` writes
    ``runs/ars-my``, whatever the file's ``name``; a built-in scenario's folder is its name."""
    import flowgym.agents.learned as learned_mod
    import flowgym.lab.ars as ars_mod
    import flowgym.lab.train as train_mod

    class Stop(Exception):
        pass

    outs = []

    def capture(cfg):
        outs.append(cfg.out)
        raise Stop

    monkeypatch.setattr(train_mod, "train", capture)
    monkeypatch.setattr(ars_mod, "train_ars", capture)
    monkeypatch.setattr(learned_mod, "require_sb3", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    from flowgym.lab import _toml
    from flowgym.lab.scenarios import get_scenario

    (tmp_path / "my.toml").write_text(_toml.dumps(get_scenario("adaptive-mix").to_dict()))  # name "adaptive-mix"
    for argv in (["--scenario", "my.toml"], ["--scenario", "my.toml", "--algo", "ars"],
                 ["--scenario", "adaptive-switch"]):
        with pytest.raises(Stop):
            main(["train", *argv, "--quiet", "--no-plots"])
    assert outs == ["runs/ppo-my", "runs/ars-my", "runs/ppo-adaptive-switch"]


def test_run_scenario_runs_a_finite_workload_to_its_end_without_a_horizon(tmp_path, capsys):
    """``finite = true`` and no ``env.horizon``: ``flowgym run --scenario`` runs to the end (under the safety cap),
    as ``compare`` does; it stopped at the environment's default horizon of 1,000 slots."""
    rows = "\n".join(f"{5 * i},20,40" for i in range(300))  # arrivals until slot 1495
    (tmp_path / "tr.csv").write_text("arrival,prompt_len,output_len\n" + rows + "\n")
    (tmp_path / "tr.toml").write_text(f'name = "tr"\ndescription = "x"\nfinite = true\n[env]\nM = 4000\n'
                                      f'[env.workload]\nkind = "trace"\npath = "{tmp_path / "tr.csv"}"\n'
                                      '[[agents]]\nname = "mc"\n')
    assert main(["run", "--scenario", str(tmp_path / "tr.toml"), "--budget", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] == 300 and out["unfinished"] == 0 and out["T"] > 1495
    # its env.horizon, when set, is a cap: a run it stops did not drain, and says so; an endless workload never does
    (tmp_path / "cap.toml").write_text((tmp_path / "tr.toml").read_text().replace("M = 4000", "M = 4000\nhorizon = 50"))
    assert main(["run", "--scenario", str(tmp_path / "cap.toml"), "--budget", "4"]) == 0
    assert "! did not drain: stopped at the cap (50 slots)" in capsys.readouterr().out
    assert main(["run", "--scenario", "paper-synthetic-known", "--budget", "12"]) == 0
    assert "did not drain" not in capsys.readouterr().out


def test_compare_notes_a_trace_that_no_seed_changes_and_horizons_past_the_episode(tmp_path, capsys):
    """A trace replayed with several seeds is one run, and tuned on the very requests it reports: both said on
    stderr; horizons beyond ``env.horizon`` (which they win over) are noted too; the built-in Azure scenario, whose
    tuning has its own window, with one seed, gets no note."""
    rows = "\n".join(f"{5 * i},20,40" for i in range(60))
    (tmp_path / "tr.csv").write_text("arrival,prompt_len,output_len\n" + rows + "\n")
    (tmp_path / "tr.toml").write_text(
        f'name = "tr"\ndescription = "x"\nfinite = true\n[env]\nM = 4000\n[env.workload]\nkind = "trace"\n'
        f'path = "{tmp_path / "tr.csv"}"\n[[agents]]\nname = "flow-control"\nparams = {{b = 4}}\n'
        'tune = {param = "b", grid = [2, 4]}\n')
    out = ["--no-plots", "--quiet", "--out", str(tmp_path / "o")]
    assert main(["compare", "--scenario", str(tmp_path / "tr.toml"), "--seeds", "2", *out]) == 0
    err = capsys.readouterr().err
    assert "tr replays a trace, which no seed changes: its 2 seeds are one run" in err
    assert "tuned on the very requests reported here" in err
    (tmp_path / "h.toml").write_text('name = "h"\ndescription = "x"\nhorizons = [50, 80]\n[env]\nM = 2000\n'
                                     'horizon = 60\n[[agents]]\nname = "mc"\n')
    assert main(["compare", "--scenario", str(tmp_path / "h.toml"), "--seeds", "1", *out]) == 0
    assert "go beyond the scenario's env.horizon 60" in capsys.readouterr().err
    assert main(["compare", "--scenario", "azure-conv", "--seeds", "1", "--agents", "mc", *out]) == 0
    assert "note:" not in capsys.readouterr().err


def test_trains_closing_line_suggests_one_seed_for_a_trace():
    """flowgym train ends with the compare command to run next: held-out seeds 900-919 for a generated workload,
    one seed for a trace scenario (a replay is the same on every seed: 20 seeds would be one run 20 times)."""
    from flowgym.lab.cli import _compare_hint

    assert "on held-out seeds" in _compare_hint("adaptive-mix", None, "runs/x")
    assert "--seeds 900-919" in _compare_hint("adaptive-mix", None, "runs/x")
    hint = _compare_hint("adaptive-azure-conv", None, "runs/x")
    assert "--seeds 1 " in hint and "900-919" not in hint and "a replay, the same on every seed" in hint
    assert 'learned:path=runs/x"' in hint
    # trained at another rate: compare at that rate, not the scenario's default
    assert "--scenario paper-realdata-low --rate 3 --seeds 900-919" in _compare_hint("paper-realdata-low", 3.0, "o")
    assert "--scenario azure-conv --rate 0.5 --seeds 1 " in _compare_hint("azure-conv", 0.5, "o")


@pytest.mark.parametrize("flags, match", [
    (["--multipliers", "1,2,3"], "--multipliers shape the multiplier actions; this run's action is the budget itself"),
    (["--multiplier-of", "rate"], "--multiplier-of shape the multiplier actions"),
    (["--workers", "3"], "--workers configure a search on Ray (--backend ray); ppo trains in this process"),
    (["--address", "auto"], "--address configure a search on Ray"),
    (["--tune-seeds", "3", "--final-eval-seeds", "0"], "--tune-seeds tunes the baselines of the final table"),
    (["--eval-seed", "5", "--eval-freq", "0"], "--eval-seed configure the evaluations during training, which "
                                               "--eval-freq 0 turns off"),
    (["--select", "best", "--eval-freq", "0"], "--select configure the evaluations"),
    (["--no-norm-obs", "--clip-obs", "3"], "--clip-obs clips normalised observations, which --no-norm-obs turns off"),
    (["--backend", "ray", "--seed", "5", "--gamma", "0.9"], "the search on Ray draws seed, learning_rate, ent_coef, "
                                                            "gamma for each trial; --seed, --gamma would be overridden"),
])
def test_train_cli_refuses_flags_that_would_change_nothing(flags, match, capsys, tmp_path):
    """Each of these was accepted and silently had no effect (no torch needed: refused before the training extra is
    looked for)."""
    assert main(["train", "--scenario", "adaptive-mix", "--quiet", "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_train_cli_takes_algorithm_names_in_any_case(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr("flowgym.lab.cli._writable_dir", lambda flag, out: seen.append(out) or (_ for _ in ()).throw(
        SystemExit(7)))
    monkeypatch.setattr("flowgym.agents.learned.require_sb3", lambda: None)
    with pytest.raises(SystemExit, match="7"):
        main(["train", "--algo", "PPO", "--scenario", "adaptive-mix", "--quiet"])
    assert len(seen) == 1 and seen[0].startswith("runs/ppo")
    assert main(["train", "--algo", "ARS", "--iterations", "0", "--quiet"]) == 2  # the ARS path, whose check names it
    assert "iterations must be a positive integer" in capsys.readouterr().err
    assert main(["train", "--tune-seeds", "3", "--final-eval-seeds", "0", "--quiet"]) == 2  # ARS refuses it too
    assert "--tune-seeds tunes the baselines of the final table" in capsys.readouterr().err


def test_train_cli_keeps_a_class_paths_case(monkeypatch):
    """Short algorithm names are not case-sensitive; a ``module:Class`` path is (lower-cased, it names a module)."""
    seen = []

    def stop(cfg):
        seen.append(cfg.algo)
        raise SystemExit(7)

    monkeypatch.setattr("flowgym.agents.learned.require_sb3", lambda: None)
    monkeypatch.setattr("flowgym.lab.train.train", stop)
    monkeypatch.setattr("flowgym.lab.cli._writable_dir", lambda flag, out: None)
    for algo, want in (("sb3_contrib:QRDQN", "sb3_contrib:QRDQN"), ("PPO", "ppo")):
        with pytest.raises(SystemExit, match="7"):
            main(["train", "--algo", algo, "--scenario", "adaptive-low", "--quiet"])
        assert seen[-1] == want


@pytest.mark.parametrize("flags", [["--no-norm-obs"], ["--clip-obs", "3"], ["--eval-freq", "0"], ["--eval-seed", "5"],
                                   ["--final-eval-seeds", "0"], ["--tune-seeds", "3"], ["--select", "last"],
                                   ["--action", "multiplier", "--multipliers", "1,2,3"]])
def test_train_cli_takes_each_flag_that_acts(flags, monkeypatch):
    """The other side of the refusals above: each flag alone, or with what makes it act, reaches training."""
    seen = []

    def stop(cfg):
        seen.append(cfg)
        raise SystemExit(7)

    monkeypatch.setattr("flowgym.agents.learned.require_sb3", lambda: None)
    monkeypatch.setattr("flowgym.lab.train.train", stop)
    monkeypatch.setattr("flowgym.lab.cli._writable_dir", lambda flag, out: None)
    with pytest.raises(SystemExit, match="7"):
        main(["train", "--scenario", "adaptive-mix", "--quiet", *flags])
    assert len(seen) == 1


def test_run_takes_a_budget_of_zero_and_the_largest(capsys):
    """The ends of --budget's range: 0 (nothing admitted) and the largest action space run."""
    for b in ("0", "1000000000"):
        assert main(["run", "--budget", b, "--horizon", "5", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["budget"] == int(b)
