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
