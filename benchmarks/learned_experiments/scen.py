"""Held-out scenarios (not among the named ones, not used in training or selection)."""
import copy

def _stream(pairs, on_rate, t_on, t_off, period, bg=0.0):
    pts = sorted({0.0, float(t_on), float(t_off)} - {float(period)})
    rs = [on_rate if t_on <= p < t_off else bg for p in pts]
    return {"kind": "iid", "rate": {"kind": "steps", "times": pts, "rates": rs, "period": float(period)},
            "lengths": {"kind": "empirical", "pairs": pairs, "weights": [1.0] * len(pairs)}}

def _w(pairs):
    return sum(l * o + o * (o + 1) / 2 for l, o in pairs) / len(pairs)

def rate_for(rho, M, pairs):
    return rho * M / _w(pairs)

def heldout():
    out = {}
    M = 16492
    A = [[30, 8], [30, 16], [30, 24]]; B = [[20, 80], [20, 120], [20, 160]]
    out["H1-codechat"] = {"M": M, "workload": {"kind": "mix", "streams": [
        _stream(A, rate_for(0.8, M, A), 0, 600, 2000), _stream(B, rate_for(0.9, M, B), 600, 2000, 2000)]}}
    M = 32768
    S = [[10, 10], [10, 20], [10, 30]]; Md = [[50, 30], [50, 50], [50, 70]]; L = [[10, 100], [10, 150], [10, 200]]
    out["H2-three-phase"] = {"M": M, "workload": {"kind": "mix", "streams": [
        _stream(S, rate_for(0.8, M, S), 0, 700, 2600), _stream(L, rate_for(0.97, M, L), 700, 2000, 2600),
        _stream(Md, rate_for(0.9, M, Md), 2000, 2600, 2600)]}}
    M = 8192
    S = [[10, 5], [10, 10], [10, 15]]; L = [[10, 60], [10, 90], [10, 120]]
    rs = rate_for(0.85, M, S)
    out["H3-bursty-smallM"] = {"M": M, "workload": {"kind": "mix", "streams": [
        _stream(S, rs, 0, 500, 1500, bg=0.1 * rs), _stream(L, rate_for(0.97, M, L), 500, 1500, 1500)]}}
    M = 16492
    C = [[20, 10], [20, 25], [20, 40]]; L = [[10, 80], [10, 110], [10, 140]]
    out["H4-short-phases"] = {"M": M, "workload": {"kind": "mix", "streams": [
        _stream(C, rate_for(0.85, M, C), 0, 300, 1000), _stream(L, rate_for(0.95, M, L), 300, 1000, 1000)]}}
    M = 24000
    P = [[25, 40], [25, 80], [25, 120]]
    out["S1-stationary"] = {"M": M, "workload": {"kind": "iid", "rate": rate_for(0.9, M, P),
                            "lengths": {"kind": "empirical", "pairs": P, "weights": [1, 1, 1]}}}
    for k, v in out.items():
        v.update({"output_length_known": False, "max_budget": 256, "horizon": 4000})
    from flowgym.lab.scenarios import get_scenario
    for name in ("adaptive-mix", "adaptive-high", "adaptive-switch"):
        kw = get_scenario(name).env_kwargs(); kw["max_budget"] = 256
        out[name] = kw
    return out
