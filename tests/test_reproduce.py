"""`flowgym reproduce`: the claims file, claim verdicts, the exit code, and the docs' verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowgym.lab import _toml
from flowgym.lab.cli import main
from flowgym.lab.reproduce import (
    FAILS,
    HOLDS,
    SOME,
    VERDICTS,
    ClaimsError,
    check_docs,
    evaluate_claim,
    load_claims,
    paired_ci,
)

ROOT = Path(__file__).resolve().parents[1]

THEORY_SETTING = """
[settings.th]
section = "theory"
kind = "theory"
params = {classes = [[10, 20], [10, 40], [10, 60]], budgets = [4, 4, 4], rates = [5.0, 5.0, 5.0], M = 16492}
"""

TINY_SETTING = """
[settings.tiny]
section = "sec4.1"
scenario = "paper-synthetic-known"
rate = 5.0
full = {horizons = [300], seeds = 3, tune_seeds = 1, tune_horizon = 200}
"""


def _claim(**kw: object) -> str:
    fields = {"id": "c1", "statement": "s", "setting": "th", "kind": "theory", "check": "memory", "verdict": "holds"}
    fields.update(kw)
    body = "\n".join(f"{k} = {_toml._value(v, k)}" for k, v in fields.items() if v is not None)
    return f"\n[[claims]]\n{body}\n"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "claims.toml"
    p.write_text(text)
    return p


def test_packaged_claims_parse_and_cover_the_issue():
    cs = load_claims()
    ids = {c.id for c in cs.claims}
    assert len(ids) == len(cs.claims) >= 20
    for c in cs.claims:
        assert c.verdict in VERDICTS and c.quick_verdict in VERDICTS
        assert c.setting in cs.settings
    # what the issue lists: Theorem 1, lambda = 5 vs Thm 1 and Prop 1, per-baseline comparisons, KV usage,
    # alpha's tuning, Section 4.2 high and low, the hindsight optimum
    for must in ("thm1-memory", "thm1-rates-lambda5", "prop1-load-lambda5", "known-vs-mcsf", "unknown-vs-amin",
                 "kv-steadier-known", "alpha-tuned-stable", "realdata-high-all-metrics", "realdata-low-competitive",
                 "hindsight-alg1"):
        assert must in ids
    # the p95 verdict the issue named: with A_min's first estimate at 1 token, Alg. 2 did not beat it on every
    # metric; with the paper's A_min (the shortest possible output, 20 here: docs/agents.md) it does, as the
    # paper says (docs/reproduction.md, the full run's record)
    assert next(c for c in cs.claims if c.id == "unknown-vs-amin").verdict == HOLDS


@pytest.mark.parametrize("claim, field", [
    (_claim(statement=None), "statement"),
    (_claim(verdict="mostly"), "verdict"),
    (_claim(quick_verdict="maybe"), "quick_verdict"),
    (_claim(setting="nowhere"), "setting"),
    (_claim(kind="vibes"), "kind"),
    (_claim(check="speed"), "check"),
    (_claim(kind="compare", agent="MC", baselines=["MC-SF"], metrics=["avg_latency"]), "compare setting"),
    (_claim(id=None), "id"),
])
def test_bad_claims_are_named(tmp_path, claim, field):
    with pytest.raises(ClaimsError, match=field):
        load_claims(_write(tmp_path, THEORY_SETTING + claim))


def test_bad_compare_claims_are_named(tmp_path):
    base = {"setting": "tiny", "kind": "compare", "agent": "MC", "check": None}
    cases = [({"baselines": ["MC-SF"], "metrics": ["speed"]}, "unknown metric 'speed'"),
             ({"metrics": ["avg_latency"]}, "baselines"),
             ({"baselines": ["MC-SF"]}, "metrics"),
             ({"baselines": ["MC-SF"], "metrics": ["avg_latency"], "comparison": "similar"}, "comparison")]
    for extra, msg in cases:
        with pytest.raises(ClaimsError, match=msg):
            load_claims(_write(tmp_path, TINY_SETTING + _claim(**base, **extra)))
    with pytest.raises(ClaimsError, match="duplicate id"):
        load_claims(_write(tmp_path, THEORY_SETTING + _claim() + _claim()))
    with pytest.raises(ClaimsError, match="section"):
        load_claims(_write(tmp_path, THEORY_SETTING.replace('"theory"\nkind', '"sec9"\nkind') + _claim()))
    with pytest.raises(ClaimsError, match="scenario"):
        load_claims(_write(tmp_path, TINY_SETTING.replace("paper-synthetic-known", "no-such") + _claim(**base)))


def test_paired_ci():
    mean, lo, hi, n = paired_ci([3.0, 4.0, 5.0], [1.0, 2.0, 3.0])
    assert (mean, lo, hi, n) == (2.0, 2.0, 2.0, 3)  # no spread: the interval is the mean
    mean, lo, hi, n = paired_ci([1.0, 3.0], [0.0, 0.0])
    assert n == 2 and lo < 0 < hi  # t_{0.975,1} = 12.7: wide
    assert paired_ci([1.0], [0.0])[1:3] == (float("-inf"), float("inf"))


def _rows(values: dict[str, list[dict[str, float]]]) -> dict[str, object]:
    rows = []
    for agent, per_seed in values.items():
        for s, m in enumerate(per_seed):
            rows.append({"agent": agent, "seed": s, "horizon": 100, **m})
    return {"rows": rows, "labels": {}}


def test_claim_verdicts_on_synthetic_numbers(tmp_path):
    text = (TINY_SETTING + THEORY_SETTING
            + _claim(id="lat", setting="tiny", kind="compare", agent="A", baselines=["B"], check=None,
                     metrics=["avg_latency", "request_throughput"])
            + _claim(id="nw", setting="tiny", kind="compare", agent="A", baselines=["B"], check=None,
                     metrics=["avg_latency"], comparison="not_worse")
            + _claim(id="bnd", setting="tiny", kind="bound", agent="A", check=None, max={"evictions": 0}))
    cs = load_claims(_write(tmp_path, text))
    lat, nw, bnd = cs.claims
    # A: lower latency on every seed and higher throughput: holds
    d = _rows({"A": [{"avg_latency": 10 + s, "request_throughput": 5.0 + s, "evictions": 0} for s in range(4)],
               "B": [{"avg_latency": 12 + s, "request_throughput": 4.0 + s * 1.1, "evictions": 3} for s in range(4)]})
    r = evaluate_claim(lat, d)
    assert r.verdict == HOLDS and r.matches and all(x["holds"] for x in r.details)
    assert evaluate_claim(bnd, d).verdict == HOLDS
    # lower latency, throughput the same up to noise: holds only on some metrics
    d = _rows({"A": [{"avg_latency": 10 + s, "request_throughput": 5.0 + (-1) ** s * 0.1} for s in range(4)],
               "B": [{"avg_latency": 12 + s, "request_throughput": 5.0} for s in range(4)]})
    r = evaluate_claim(lat, d)
    assert r.verdict == SOME and not r.matches and "docs record: holds" in r.line()
    # worse on both: does not hold; and "not worse" fails when B is clearly better
    d = _rows({"A": [{"avg_latency": 20 + s, "request_throughput": 3.0, "evictions": 1} for s in range(4)],
               "B": [{"avg_latency": 12 + s, "request_throughput": 5.0} for s in range(4)]})
    assert evaluate_claim(lat, d).verdict == FAILS
    assert evaluate_claim(nw, d).verdict == FAILS
    assert evaluate_claim(bnd, d).verdict == FAILS
    # a difference inside the noise: not worse holds, better does not
    d = _rows({"A": [{"avg_latency": 12 + (-1) ** s} for s in range(4)], "B": [{"avg_latency": 12.0} for s in range(4)]})
    assert evaluate_claim(nw, d).verdict == HOLDS
    # A completed nothing on two of five seeds (its latency NaN): the means shown are over the three paired seeds,
    # so they differ by the difference shown, and the line says how many seeds decided it
    nan = float("nan")
    d = _rows({"A": [{"avg_latency": v} for v in (nan, 10.0, 11.0, nan, 12.0)],
               "B": [{"avg_latency": v} for v in (30.0, 12.0, 13.0, 30.0, 14.0)]})
    r = evaluate_claim(nw, d)
    x = r.details[0]
    assert (x["agent_mean"], x["baseline_mean"], x["diff"], x["n"], x["seeds"]) == (11.0, 13.0, -2.0, 3, 5)
    assert "avg lat 11.0 vs 13.0 (diff -2.00, CI [-2.00, -2.00], over 3 of 5 seeds: the others have no value)" in r.line()
    d = _rows({"A": [{"avg_latency": 10.0 + s} for s in range(3)], "B": [{"avg_latency": 12.0 + s} for s in range(3)]})
    assert "seeds" not in evaluate_claim(nw, d).line()  # every seed paired: the line as before


def test_claim_verdicts_at_their_edges(tmp_path):
    """A tie is not better but is not worse; one seed decides nothing either way but 'not worse'; a metric with no
    value on any seed holds neither; a throughput's difference and interval are oriented as its values are."""
    text = (TINY_SETTING
            + _claim(id="b", setting="tiny", kind="compare", agent="A", baselines=["B"], check=None,
                     metrics=["avg_latency"])
            + _claim(id="nw", setting="tiny", kind="compare", agent="A", baselines=["B"], check=None,
                     metrics=["avg_latency"], comparison="not_worse")
            + _claim(id="tp", setting="tiny", kind="compare", agent="A", baselines=["B"], check=None,
                     metrics=["request_throughput"]))
    better, nw, tp = load_claims(_write(tmp_path, text)).claims
    tie = _rows({"A": [{"avg_latency": 10.0 + s} for s in range(3)], "B": [{"avg_latency": 10.0 + s} for s in range(3)]})
    assert evaluate_claim(better, tie).verdict == FAILS and evaluate_claim(nw, tie).verdict == HOLDS
    one = _rows({"A": [{"avg_latency": 10.0}], "B": [{"avg_latency": 12.0}]})
    assert evaluate_claim(better, one).verdict == FAILS and evaluate_claim(nw, one).verdict == HOLDS
    nan = float("nan")
    none = _rows({"A": [{"avg_latency": nan} for _ in range(3)], "B": [{"avg_latency": 12.0} for _ in range(3)]})
    assert evaluate_claim(better, none).verdict == FAILS and evaluate_claim(nw, none).verdict == FAILS
    more = _rows({"A": [{"request_throughput": 5.0 + 0.1 * s} for s in range(3)],
                  "B": [{"request_throughput": 4.0} for _ in range(3)]})
    x = evaluate_claim(tp, more).details[0]
    assert x["holds"] and x["diff"] == pytest.approx(1.1) and 0 < x["diff_lo"] < 1.1 < x["diff_hi"]


def test_ratio_and_theory_claims(tmp_path):
    cs = load_claims()
    ratio = next(c for c in cs.claims if c.id == "hindsight-mcsf")
    close = {"instances": [{"optimal": True, "ratios": {"MC-SF": 1.0 + 0.01 * i}} for i in range(3)]}
    far = {"instances": [{"optimal": True, "ratios": {"MC-SF": 1.3 + 0.01 * i}} for i in range(3)]
           + [{"optimal": False, "ratios": {"MC-SF": 1.0}}]}
    assert evaluate_claim(ratio, close).verdict == HOLDS
    r = evaluate_claim(ratio, far)
    assert r.verdict == FAILS and r.details[0]["instances_optimal"] == 3
    mem = next(c for c in cs.claims if c.id == "thm1-memory")
    th = {"theory": {"peak": 16240.0, "M": 16492.0, "budgets": [4, 4, 4], "rates": [5, 5, 5], "rho": 1.23}}
    assert evaluate_claim(mem, th).verdict == HOLDS
    assert evaluate_claim(mem, {"theory": {**th["theory"], "peak": 17000.0}}).verdict == FAILS


def test_exit_code_follows_recorded_verdicts(tmp_path, capsys):
    good = _write(tmp_path, THEORY_SETTING + _claim(id="mem") + _claim(id="load", check="load", verdict="does not hold"))
    assert main(["reproduce", "--claims", str(good), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "[ok ] mem: HOLDS" in out and "rho = sum_k lambda_k w_k / M = 1.231" in out
    flipped = tmp_path / "flipped.toml"
    flipped.write_text(THEORY_SETTING + _claim(id="mem") + _claim(id="load", check="load", verdict="holds"))
    assert main(["reproduce", "--claims", str(flipped), "--out", str(tmp_path / "b"), "--quiet"]) == 1
    assert "[DIFFERS] load: DOES NOT HOLD (docs record: holds)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "b" / "claims.json").read_text())
    assert [c["matches"] for c in saved["claims"]] == [True, False]


def test_exit_code_on_a_tiny_simulated_setting(tmp_path, capsys):
    text = TINY_SETTING + _claim(id="mc-vs-alpha", setting="tiny", kind="compare", agent="flow-control (Alg. 1) b=(4,4,4)",
                                 baselines=["MC"], metrics=["request_throughput"], check=None, verdict="does not hold")
    p = _write(tmp_path, text)
    assert main(["reproduce", "--claims", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "[DIFFERS] mc-vs-alpha: HOLDS (docs record: does not hold)" in out
    assert (tmp_path / "o" / "tiny.csv").exists() and (tmp_path / "o" / "claims.md").exists()


def test_cli_quick_only_theory_end_to_end(tmp_path, capsys):
    assert main(["reproduce", "--quick", "--only", "theory", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "thm1-rates-lambda5: DOES NOT HOLD" in out and "all 3 verdicts match" in out
    md = (tmp_path / "claims.md").read_text()
    assert "prop1-load-lambda5" in md and "unknown-vs-amin" not in md


def test_only_rejects_unknown_names(tmp_path, capsys):
    assert main(["reproduce", "--quick", "--only", "sec9", "--out", str(tmp_path)]) == 2
    assert "sec9" in capsys.readouterr().err


def test_docs_verdicts_match_the_claims_file():
    """docs/reproduction.md's generated verdict block agrees with every claim's recorded full-run verdict."""
    assert check_docs(ROOT / "docs" / "reproduction.md") == []


HINDSIGHT_SETTING = """
[settings.hb]
section = "hindsight"
kind = "hindsight"
full = {instances = 1, span = 2, time_limit = 5.0}
params = {agents = {"MC-SF" = "mc-sf"}}
"""


@pytest.mark.parametrize("text, match", [
    (TINY_SETTING.replace("tune_horizon = 200", "tune_horizon = 200, time_limit = 5.0") + _claim(),
     r"setting 'tiny': full \(of a compare setting\): unknown field 'time_limit'"),
    (HINDSIGHT_SETTING.replace("time_limit = 5.0", "time_limit = 5.0, seeds = 7") + _claim(setting="hb"),
     r"setting 'hb': full \(of a hindsight setting\): unknown field 'seeds'"),
    (THEORY_SETTING + 'quick = {seeds = 2}\n' + _claim(), r"a theory setting reads no run fields, got \['seeds'\]"),
    (HINDSIGHT_SETTING + _claim(setting="hb", kind="ratio", agent="MC-SFF", max_ratio=1.1, check=None),
     r"claim 'c1': field 'agent' names 'MC-SFF', which is not one of setting 'hb''s agents \(MC-SF\)"),
])
def test_run_fields_a_setting_would_not_read_and_unknown_ratio_agents_are_refused_at_load(tmp_path, text, match):
    with pytest.raises(ClaimsError, match=match):
        load_claims(_write(tmp_path, text))


def test_a_claim_on_numbers_that_are_all_nan_does_not_hold(tmp_path):
    nan = float("nan")
    text = (TINY_SETTING
            + _claim(id="nw", setting="tiny", kind="compare", agent="A", baselines=["B"], check=None,
                     metrics=["avg_latency"], comparison="not_worse")
            + _claim(id="bnd", setting="tiny", kind="bound", agent="A", check=None, max={"p95_latency": 10}))
    nw, bnd = load_claims(_write(tmp_path, text)).claims
    d = _rows({"A": [{"avg_latency": nan} for s in range(5)], "B": [{"avg_latency": 5.0} for s in range(5)]})
    r = evaluate_claim(nw, d)
    assert r.verdict == FAILS and r.details[0]["n"] == 0
    for order in ([5.0, nan], [nan, 5.0]):  # a run with no value breaks the bound, wherever it sits
        d = _rows({"A": [{"p95_latency": v} for v in order]})
        assert evaluate_claim(bnd, d).verdict == FAILS
    assert evaluate_claim(bnd, _rows({"A": [{"p95_latency": v} for v in (5.0, 9.0)]})).verdict == HOLDS
