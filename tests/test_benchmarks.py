"""The benchmark scripts (``benchmarks/``): bad arguments are argparse errors naming the flag, before any run."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script, argv, match", [
    ("bench_agents.py", ["--repeats", "0"], "argument --repeats: must be an integer of at least 1, got '0'"),
    ("bench_agents.py", ["--scenario", "nope"], "argument --scenario: unknown scenario 'nope'"),
    ("bench_agents.py", ["--rate", "-1"], "argument --rate: must be a finite number above 0"),
    ("bench_batched_steps.py", ["--steps", "0"], "argument --steps: must be an integer of at least 1"),
    ("bench_vector.py", ["--quick", "--repeats", "0"], "argument --repeats: must be an integer of at least 1"),
    ("bench_csv.py", ["--rows", "-5"], "argument --rows: must be an integer of at least 1"),
    ("bench_memory.py", ["--slots", "3000"], "argument --slots: must be an integer of at least 200000"),
    ("bench_parallel.py", ["--seeds", "0"], "argument --seeds: must be an integer of at least 1"),
    ("bench_realdata.py", ["--scenario", "nope"], "argument --scenario: unknown scenario 'nope'"),
    ("hindsight_jaillet.py", ["--n", "5:3"], r"argument --n: must be lo:hi with 1 <= lo <= hi, got '5:3'"),
    ("hindsight_jaillet.py", ["--json", "/nonexistent-folder/x.json"], "argument --json: cannot write"),
    ("bench_learned.py", ["--model", "/nonexistent-model"], "argument --model: learned agent: path"),
    ("bench_learned.py", ["--model", "shipped"], "argument --model: learned agent: path 'shipped'"),  # no alias here
    ("select_generalist.py", ["shipped", "/nonexistent-model"], "argument models: learned agent: path"),
    ("selection_noise.py", ["--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_argument_is_named_before_any_run(script, argv, match):
    import re

    out = _run(script, *argv)
    assert out.returncode == 2 and re.search(match, out.stderr), out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_argument_types(tmp_path):
    import argparse

    sys.path.insert(0, str(BENCH))
    try:
        import _args
    finally:
        sys.path.remove(str(BENCH))
    assert _args.at_least(2)("3") == 3 and _args.positive_float("0.5") == 0.5
    for parse, bad in ((_args.at_least(1), "0"), (_args.at_least(1), "1.5"), (_args.positive_float, "nan"),
                       (_args.positive_float, "inf"), (_args.positive_float, "0"), (_args.positive_float, "x")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    ap = argparse.ArgumentParser()
    _args.writable_file(ap, "--json", str(tmp_path / "ok.json"))  # an existing folder: accepted
    _args.model_dir(ap, "--model", "shipped")
    _args.model_dir(ap, "--model", None)
