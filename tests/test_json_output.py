"""flowgym.lab._json: every JSON file flowgym writes is strict JSON (no bare NaN / Infinity)."""

import json
import math

import numpy as np
import pytest

from flowgym.sim import _json
from flowgym.lab.evaluation import ResultTable
from flowgym.sim.metrics import METRIC_NAMES


def _strict_load(path):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    with open(path) as fh:
        return json.load(fh, parse_constant=refuse)


def test_plain_turns_numpy_into_python_and_non_finite_into_null():
    data = {"a": np.float32(1.5), "b": np.int64(3), "c": np.array([1.0, np.nan, np.inf]), "d": (1, -math.inf),
            "e": np.bool_(True), "f": [{"g": float("nan")}], "h": "NaN"}
    out = _json.plain(data)
    assert out == {"a": 1.5, "b": 3, "c": [1.0, None, None], "d": [1, None], "e": True, "f": [{"g": None}],
                   "h": "NaN"}
    assert type(out["b"]) is int and type(out["e"]) is bool
    assert json.loads(_json.dumps(data)) == out


def test_dump_refuses_what_is_still_not_json(tmp_path):
    with open(tmp_path / "x.json", "w") as fh, pytest.raises(TypeError):
        _json.dump({"x": object()}, fh)


def test_a_result_table_with_a_metric_no_request_gave_is_written_as_null(tmp_path):
    """An agent that finished no request has a NaN latency: the file says null, and stays readable by a
    strict JSON reader."""
    rows = [{**{m: 1.0 for m in METRIC_NAMES}, "agent": "a", "horizon": 10, "seed": i} for i in range(2)]
    rows[1]["avg_latency"] = float("nan")
    rows[0]["p95_latency"] = float("inf")
    ResultTable(rows, ["a"], [10], [0, 1]).to_json(str(tmp_path / "t.json"))
    data = _strict_load(tmp_path / "t.json")
    assert data["rows"][1]["avg_latency"] is None and data["rows"][0]["p95_latency"] is None
    assert data["rows"][0]["avg_latency"] == 1.0
