"""The Azure trace tools (``flowgym/sim/datasets.py``): conversion, windows and arguments by hand."""

from __future__ import annotations

import numpy as np
import pytest

from flowgym.agents import make_agent
from flowgym.sim.datasets import azure_columns, build_azure_npz


def test_build_azure_npz_converts_times_and_lengths(tmp_path):
    # three requests at 10:00:02.5, 10:00:00, 10:00:04 (out of order; an extra column is allowed):
    # seconds since the first 0.0, 2.5, 4.0 after sorting, lengths carried with their rows
    csv = tmp_path / "trace.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n"
                   "2023-11-16 10:00:02.500000,30,3,x\n"
                   "2023-11-16 10:00:00.000000,10,1,y\n"
                   "2023-11-16 10:00:04.000000,20,2,z\n")
    out = tmp_path / "t.npz"
    assert build_azure_npz(str(csv), str(out)) == 3
    with np.load(out) as z:
        np.testing.assert_allclose(z["time"], [0.0, 2.5, 4.0])
        assert z["prompt_len"].tolist() == [10, 30, 20] and z["output_len"].tolist() == [1, 3, 2]
    bad = tmp_path / "bad.csv"
    bad.write_text("TIME,ContextTokens,GeneratedTokens\n2023-11-16 10:00:00,1,1\n")
    with pytest.raises(ValueError, match="unexpected header"):
        build_azure_npz(str(bad), str(out))


def test_a_window_is_half_open():
    t, _, _ = azure_columns("conv")
    # [0, t[1]) keeps the requests before the second arrival only; [t[1], t[3]) two, shifted to 0
    first, _, _ = azure_columns("conv", window=(0.0, float(t[1])))
    assert first.tolist() == [0.0]
    mid, _, _ = azure_columns("conv", window=(float(t[1]), float(t[3])))
    np.testing.assert_allclose(mid, [0.0, t[2] - t[1]])


def test_an_empty_window_names_the_traces_span():
    with pytest.raises(ValueError, match=r"holds no request \(trace spans 0\.\.3502 s\)"):
        azure_columns("conv", window=(5000.0, 6000.0))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_rate_multiplier_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="rate_multiplier must be positive"):
        azure_columns("conv", rate_multiplier=bad)


def test_rate_multiplier_divides_the_gaps():
    t, _, _ = azure_columns("conv")
    t2, _, _ = azure_columns("conv", rate_multiplier=2.0)
    np.testing.assert_allclose(t2, t / 2)


def test_an_unknown_agent_parameter_lists_the_agents_parameters():
    with pytest.raises(ValueError, match=r"agent 'flow-control' has no parameter 'z'; its parameters: b, "):
        make_agent("flow-control", z=1)


@pytest.mark.parametrize("rows, match", [
    ("2023-11-16 10:00:00,-5,10\n", r"row 2: ContextTokens must be an integer from 1 to 2\*\*31 - 1, got '-5'"),
    ("2023-11-16 10:00:00,10,1\n2023-11-16 10:00:01,100,0\n", r"row 3: GeneratedTokens must be an integer"),
    ("2023-11-16 10:00:00,1x0,10\n", r"row 2: ContextTokens .* got '1x0'"),
    ("2023-11-16 10:00:00,1e3,10\n", r"row 2: ContextTokens .* got '1e3'"),
    ("2023-11-16 10:00:00,10,99999999999\n", r"row 2: GeneratedTokens .* got '99999999999'"),
    ("2023-11-16 10:00:00,10\n", r"row 2: expected TIMESTAMP, ContextTokens, GeneratedTokens"),
    ("2023-11-16 10:00:00,10,5\n\n", r"row 3: expected TIMESTAMP"),
    ("yesterday,10,5\n", r"row 2: TIMESTAMP 'yesterday' is not a date and time"),
    ("2023-11-16 10:00:00,10,5\n,10,5\n", r"row 3: TIMESTAMP '' is not a date and time"),
    ("NaT,3,4\n", r"row 2: TIMESTAMP 'NaT' is not a date and time"),
    ("2300-01-01 00:00:00,3,4\n", r"row 2: TIMESTAMP '2300-01-01 00:00:00' is outside the years 1678-2261"),
    ("", r"no requests after the header"),
])
def test_build_azure_npz_names_the_row_and_column_of_a_bad_value(tmp_path, rows, match):
    csv = tmp_path / "trace.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    with pytest.raises(ValueError, match=match):
        build_azure_npz(str(csv), str(tmp_path / "t.npz"))
    assert not (tmp_path / "t.npz").exists()


def test_build_azure_npz_names_an_empty_file(tmp_path):
    csv = tmp_path / "empty.csv"
    csv.write_text("")
    with pytest.raises(ValueError, match="unexpected header"):
        build_azure_npz(str(csv), str(tmp_path / "t.npz"))
