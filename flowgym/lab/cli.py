"""The ``flowgym`` command.

* ``flowgym compare``: every agent of a scenario on the same arrivals, tuned on
  separate seeds, reported per horizon with 95% confidence intervals, written
  as CSV, JSON and PNG plots (the paper's Section 4.1 experiment by default).
* ``flowgym run``: one scenario under a fixed activation budget, metrics printed.
* ``flowgym hindsight``: the hindsight optimum of a small trace against the agents.
* ``flowgym train``: train a learned budget (the generalist by augmented random search,
  or an SB3 algorithm, PPO by default, on a scenario) and evaluate it against the baselines; ``compare --agents
  "learned:path=DIR"`` then includes it.
"""



from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from flowgym.envs.flow_control import MAX_BUDGET_CAP, MAX_COUNT, FlowControlEnv
from flowgym.envs.spaces import LOAD_OBSERVATIONS, MULTIPLIER_OF
from flowgym.lab.train import DEFAULT_TRAIN_MINUTES, GENERALIST_TRAIN_MINUTES
from flowgym.sim import _json
from flowgym.sim.metrics import METRIC_NAMES
from flowgym.sim.theory import max_global_budget

DESCRIPTION = """\
LLM serving under a KV-cache limit as a Gymnasium environment (FlowControl-v0).

  flowgym compare    every agent of a scenario on the same arrivals, tuned on separate
                     seeds, per horizon with 95% confidence intervals (CSV, JSON, plots)
  flowgym run        one scenario under a fixed activation budget, metrics printed
  flowgym hindsight  the hindsight optimum of a small trace against the agents
  flowgym scenario   list the named scenarios, or print one as a file to start from
  flowgym reproduce  rerun the paper's experiments and check each claim against the docs
  flowgym train      train a learned budget (random search, or Stable-Baselines3) and compare
                     it with the baselines; then: flowgym compare --agents "learned:path=DIR"

'flowgym COMMAND --help' tells each command's options."""


def _run(args: argparse.Namespace) -> int:
    if args.scenario is not None:
        from flowgym.lab.scenarios import get_scenario

        if args.trace is not None:
            print("error: give --scenario or --trace, not both", file=sys.stderr)
            return 2
        sc = get_scenario(args.scenario, rate=args.rate)
        kwargs: dict[str, Any] = sc.env_kwargs()
        if args.horizon_given:
            kwargs["horizon"] = args.horizon
        elif sc.finite and kwargs.get("horizon") is None:  # run to the end (under the safety cap), as compare does
            kwargs["horizon"] = None
    else:
        kwargs = {"horizon": args.horizon, "M": 16492}
        if args.rate is not None:
            kwargs["workload"] = {"kind": "poisson", "classes": [[10, 20], [10, 40], [10, 60]], "rates": args.rate}
        if args.trace is not None:
            if args.rate is not None:
                print("error: --rate sets the paper classes' Poisson rate; a --trace replays its own arrivals: drop "
                      "one of them", file=sys.stderr)
                return 2
            if args.seed is not None:
                print("error: a --trace replays its own arrivals, which no seed changes: drop --seed", file=sys.stderr)
                return 2
            kwargs["workload"] = {"kind": "trace", "path": args.trace}
            kwargs["horizon"] = args.horizon if args.horizon_given else None
    seed_given = args.seed is not None
    if args.seed is None:
        args.seed = 0
    if args.M is not None:
        kwargs["M"] = args.M
    if args.eviction is not None:
        kwargs["eviction"] = args.eviction
    if args.budget is not None and not 0 <= args.budget <= MAX_BUDGET_CAP:
        print(f"error: --budget must be a non-negative number of requests per slot, at most {MAX_BUDGET_CAP} (the "
              f"largest the environment takes), got {args.budget}", file=sys.stderr)
        return 2
    from flowgym.lab.evaluation import capped_env

    env = capped_env(kwargs)  # run to the end of a finite workload: never past a safety cap
    if env.config.action != "budget" or env.config.per_class_budget:  # its numbers would not be budgets
        what = (f"action={env.config.action!r}" if env.config.action != "budget" else "per_class_budget=true")
        print(f"error: scenario {args.scenario} sets env {what}; flowgym run plays one fixed budget B_t, which "
              "that action space does not take (use flowgym compare with an agent made for it)", file=sys.stderr)
        return 2
    from flowgym.sim.workloads import Trace

    if args.scenario is not None and seed_given and isinstance(env.workload, Trace):
        print(f"error: scenario {args.scenario} replays a trace, whose arrivals no seed changes: drop --seed",
              file=sys.stderr)
        return 2
    mean_work = env.workload.mean_work()
    budget = args.budget
    if budget is None:
        if mean_work is None:
            print("error: give --budget (this workload's mean work is unknown)", file=sys.stderr)
            return 2
        budget = max(1, max_global_budget(env.config.M, mean_work))
    if budget > env.config.max_budget:  # the action space must hold the budget
        env = capped_env({**kwargs, "max_budget": budget})
    t0 = time.perf_counter()
    _, info = env.reset(seed=args.seed)
    rho = info["rho"]
    done = False
    while not done:
        _, _, te, tr, _ = env.step(budget)
        done = te or tr
    wall = time.perf_counter() - t0
    m = env.metrics()
    m.pop("kv_usage")
    result = {"budget": budget, "rho": rho, "seed": args.seed, "wall_seconds": wall, **m}
    total = env.workload.total_requests
    if total is not None:  # a finite workload: requests the horizon or the cap kept from arriving
        result["not_arrived"] = max(0, int(total) - int(m["arrived"]))
    if args.json:
        print(_json.dumps(result, indent=2))
        return 0
    load = "unknown" if rho is None else f"{rho:.3f}"
    print(f"FlowControl-v0  M={env.config.M}  load rho={load}  fixed budget B_t={budget}  "
          f"eviction={env.config.eviction}  seed={args.seed}")
    print(f"{m['T']} {'slots' if env.config.time_model == 'slot' else 'iterations'} in {wall:.2f} s")
    for name in METRIC_NAMES:
        v = m[name]
        print(f"  {name:28s} {v:12.4f}" if isinstance(v, float) else f"  {name:28s} {v:12d}")
    never = result.get("not_arrived", 0)
    unit = "slots" if env.config.time_model == "slot" else "iterations"
    if total is not None and not te and (m["unfinished"] > 0 or never) and not args.horizon_given:
        # a finite workload stopped by its cap (the scenario's env.horizon, or the safety cap): not a drained run
        print(f"! did not drain: stopped at the cap ({m['T']:,} {unit}) with {m['unfinished']:,} "
              "requests unfinished, counted in time in system up to the cap"
              + (f", and {never:,} not yet arrived, not counted" if never else ""))
    return 0


def _writable_dir(flag: str, path: str) -> None:
    """Make ``path`` (an output folder) now, so that a folder that cannot be written fails before the run, not
    after it; ``ValueError`` naming ``flag``."""
    import os

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path!r} cannot be made a folder ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r} is not a folder this user can write")


def _writable_file(flag: str, path: str) -> None:
    """``ValueError`` naming ``flag`` unless ``path``'s folder exists and can be written (checked before the run)."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r} cannot be written (is its folder there, and writable?)")


def _horizons(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if "..." in part or ":" in part:
            raise argparse.ArgumentTypeError(f"list horizons one by one, e.g. 1000,2000,3000 (got {part!r})")
        try:
            v = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"horizon {part!r} is not an integer") from None
        if not 1 <= v <= MAX_COUNT:  # the slots the simulator counts exactly (2**53)
            raise argparse.ArgumentTypeError(f"horizon {part} must be a positive integer up to 2**53")
        out.append(v)
    return out


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside double quotes (``mc:label="a; b";fixed:b=8``)."""
    out, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def _agent_list(flag: str, text: str) -> list[str]:
    """The agents of a semicolon-separated ``flag`` (an empty one is an error, not the default lineup; so is an
    empty entry, as in ``mc;;fixed:b=8``, which is likely a typo)."""
    items = [x.strip() for x in _split_outside_quotes(text, ";")]
    if items and not items[-1] and len(items) > 1:  # one trailing ';' is harmless
        items.pop()
    if not any(items):
        raise ValueError(f"{flag} names no agent ({text!r}); leave it out for the default agents")
    if not all(items):
        raise ValueError(f"{flag} has an empty entry ({text!r}): agents are separated by one ';'")
    return items


def _compare(args: argparse.Namespace) -> int:
    import os

    from flowgym.lab.evaluation import Progress, build_agent, episode_work, evaluate, tune
    from flowgym.lab.scenarios import AgentSpec, get_scenario, parse_seeds

    sc = get_scenario(args.scenario, rate=args.rate)
    env_kwargs = sc.env_kwargs()
    specs = ([AgentSpec.parse(a) for a in _agent_list("--agents", args.agents)] if args.agents is not None
             else list(sc.agents))
    origins = ([f"--agents entry {i + 1}" for i in range(len(specs))] if args.agents is not None
               else [f"scenario {args.scenario}, agents[{i}]" for i in range(len(specs))])
    if args.add_agents is not None:
        added = [AgentSpec.parse(a) for a in _agent_list("--add-agents", args.add_agents)]
        origins += [f"--add-agents entry {i + 1}" for i in range(len(added))]
        specs += added
    probe = FlowControlEnv(**env_kwargs)  # bad scenario arguments (e.g. a negative --rate) fail here, before any output
    if args.bound:
        from flowgym.lab.evaluation import bound_unsupported

        why = bound_unsupported(probe.config)
        if why is not None:
            print(f"error: --bound does not apply to scenario {sc.name}: {why}", file=sys.stderr)
            return 2
    if probe.config.record != "full":
        print(f"error: scenario {sc.name} sets env record={probe.config.record!r}; compare reports metrics from "
              "every request's history, which needs record='full'", file=sys.stderr)
        return 2
    from flowgym.lab.evaluation import check_hostable

    for spec, origin in zip(specs, origins):
        try:  # an unknown agent or parameter, or one the scenario cannot run
            check_hostable(build_agent(spec), env_kwargs)
        except ValueError as e:
            raise ValueError(f"{origin}: {e}") from None
    tuning = any(s.tune for s in specs) and not args.no_tune
    if not tuning:  # a tuning flag with nothing to tune would be dropped silently: refuse it
        given = [f for f, v in (("--tune-seeds", args.tune_seeds), ("--tune-horizon", args.tune_horizon)) if v is not None]
        if given:
            why = "--no-tune" if args.no_tune else "no agent of this line-up has a tuning grid"
            print(f"error: {' and '.join(given)} has no effect: {why}; drop it", file=sys.stderr)
            return 2
    if sc.finite:
        if args.horizons is not None:
            print(f"error: scenario {sc.name} runs to the end of its workload; drop --horizons", file=sys.stderr)
            return 2
        horizons = None
        tune_h = args.tune_horizon  # None: the scenario's smaller tuning workload, run to its end
    else:
        horizons = sorted(set(args.horizons or sc.report_horizons()))
        tune_h = (args.tune_horizon if args.tune_horizon is not None
                  else sc.tune_horizon or min(horizons[-1], 2000))
        h_env = env_kwargs.get("horizon")
        if isinstance(h_env, int) and horizons[-1] > h_env:
            print(f"note: the horizons go beyond the scenario's env.horizon {h_env} (the episode of flowgym run and "
                  f"of training): these episodes run to T={horizons[-1]}", file=sys.stderr)
    tune_kwargs = sc.tune_env_kwargs()
    seeds = parse_seeds(args.seeds)
    tune_seeds = parse_seeds("2" if args.tune_seeds is None else args.tune_seeds, first=1000) if tuning else []
    if set(seeds) & set(tune_seeds):
        print(f"error: reporting seeds and tuning seeds overlap ({sorted(set(seeds) & set(tune_seeds))[:5]}); "
              "report on seeds the tuning did not see", file=sys.stderr)
        return 2
    from flowgym.sim.workloads import Trace

    same = tuning and tune_kwargs.get("workload") == env_kwargs.get("workload")
    if isinstance(probe.workload, Trace) and (len(seeds) > 1 or same):  # the seeds draw nothing; tuning saw the report
        print(f"note: {sc.name} replays a trace, which no seed changes"
              + (f": its {len(seeds)} seeds are one run (the +/- are 0)" if len(seeds) > 1 else "")
              + ("; the tuned agents were tuned on the very requests reported here (a tune_env with another part "
                 "of the trace holds the report out)" if same else ""), file=sys.stderr)
    from flowgym.lab.parallel import check_backend

    check_backend(args.backend, workers=args.workers, address=args.address)
    # the table's labels: a tuned agent's is one of "<label> <param>=<grid value>"; two that are or may turn
    # out alike are refused now, not after the tuning
    may = [{f"{s.label or s.name} {s.tune[0]}={v}" for v in s.tune[1]} if s.tune and tuning
           else {s.label or build_agent(s).label()} for s in specs]
    dup = sorted({x for i, a in enumerate(may) for b in may[i + 1:] for x in a & b})
    if dup:
        print(f"error: agents with the same label (or that may have it after tuning): {dup}; give them distinct "
              "labels (label=TEXT in an agent string)", file=sys.stderr)
        return 2
    _writable_dir("--out", args.out)  # the last check before the run: a refused command leaves no folder
    n_tune = sum(len(s.tune[1]) * len(tune_seeds) for s in specs if s.tune and not args.no_tune)
    if not tuning:
        tune_h = None  # nothing tuned: the JSON records no tuning horizon (and no tuning seeds)
    w_tune = episode_work(tune_kwargs, tune_h) if tuning else 0
    w_run = episode_work(env_kwargs, None if horizons is None else horizons[-1])
    bar = Progress(n_tune * w_tune + len(specs) * len(seeds) * w_run, enabled=not args.quiet)
    print(sc.description)
    tuned: dict[str, object] = {}
    final = []
    from flowgym.lab.parallel import make_backend

    with make_backend(args.backend, workers=args.workers, address=args.address) as backend:
        for spec in specs:
            if spec.tune and not args.no_tune:
                param = spec.tune[0]
                best, _ = tune(spec, tune_kwargs, tune_seeds, tune_h, progress=lambda what: bar.update(what, w_tune),
                               backend=backend)
                base = spec.label or spec.name
                label = f"{base} {param}={best}"
                tuned[label] = {param: best}
                spec = AgentSpec(spec.name, {**spec.params, param: best}, None, label)
            final.append(spec)
        table = evaluate(final, env_kwargs, seeds, horizons, progress=bar, backend=backend)
        table.tuned = tuned
        print(table.format(wide=args.wide))  # before the bound's episodes: a failure there keeps the table shown
        if horizons is not None:
            for h in horizons:  # a finite workload (a trace) that ended before a horizon: its rows are whole runs
                at = [r for r in table.rows if r["horizon"] == h]
                ended = sum(1 for r in at if r["T"] < h)
                if ended:
                    who = "every episode" if ended == len(at) else f"{ended} of {len(at)} episodes"
                    print(f"note: {who} ended before T={h} (the workload ran out of requests): a row there is its "
                          "whole run's; set finite = true in the scenario to run it to its end", file=sys.stderr)
        bound_rows = None
        if args.bound:  # the requests of one more episode per seed, of the line-up's first agent
            from flowgym.lab.evaluation import lower_bounds

            bound_rows = lower_bounds(final[0], env_kwargs, seeds, horizons, backend=backend)
    if bound_rows is not None:
        from flowgym.lab.evaluation import format_lower_bounds

        print(format_lower_bounds(bound_rows, table))
    if tuned:
        where = f"T={tune_h}" if tune_h else ("the end of " + json.dumps(sc.tune_env.get("workload", {})) if sc.tune_env else "the end")
        print(f"tuned on seeds {tune_seeds} at {where} (lowest mean time in system): "
              + ", ".join(f"{k}" for k in tuned))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, sc.name)
    table.to_csv(stem + ".csv")
    table.to_json(stem + ".json", scenario=sc.name, description=sc.description, env=env_kwargs,
                  tune_seeds=tune_seeds, tune_horizon=tune_h, tune_env=sc.tune_env,
                  **({"lower_bound": bound_rows} if bound_rows is not None else {}))
    written = [stem + ".csv", stem + ".json"]
    if not args.no_plots:
        from flowgym.lab.plots import plot_kv_usage, plot_metrics_bars, plot_metrics_vs_horizon

        if horizons is None:
            plot_metrics_bars(table, stem + "_metrics.png", title=sc.description)
        else:
            plot_metrics_vs_horizon(table, stem + "_metrics.png", title=sc.description)
        plot_kv_usage(table, stem + "_kv_usage.png", title=f"{sc.name}: KV usage, seed {seeds[0]}")
        written += [stem + "_metrics.png", stem + "_kv_usage.png"]
    print("wrote " + ", ".join(written))
    return 0


def _hindsight(args: argparse.Namespace) -> int:
    import numpy as np

    from flowgym.lab.hindsight import OBJECTIVES, compare_to_hindsight, format_comparison

    objectives = [k.strip() for k in args.objectives.split(",") if k.strip()]
    bad = [k for k in objectives if k not in OBJECTIVES]
    if bad or not objectives:
        print(f"error: --objectives must be a comma-separated subset of {','.join(OBJECTIVES)}", file=sys.stderr)
        return 2
    cls = None
    other = ([f for f, v in (("--online", args.online), ("--seed", args.seed)) if v is not None] if args.trace is not None
             else ["--cls-column"] if args.cls_column is not None else [])
    if other:  # a flag of the other source would be dropped silently
        mode, kind = ("--trace", "random instances") if args.trace is not None else ("--random", "traces")
        verb = "applies" if len(other) == 1 else "apply"
        print(f"error: {' and '.join(other)} {verb} to {kind}, not with {mode}; drop it", file=sys.stderr)
        return 2
    if args.trace is not None:
        from flowgym.sim.workloads import Trace

        if args.M is None:
            print("error: give --M (the KV budget) with --trace", file=sys.stderr)
            return 2
        tr = Trace.from_csv(args.trace, cls_column=args.cls_column)
        inv = np.empty(len(tr), dtype=np.int64)
        inv[tr.row] = np.arange(len(tr))
        a, l, o = tr.arrival[inv], tr.prompt_len[inv], tr.output_len[inv]
        cls = tr.cls[inv] if args.cls_column else None
        M = args.M
        what = f"trace {args.trace} ({len(tr)} requests), M={M}"
    else:
        args.seed = 0 if args.seed is None else args.seed
        rng = np.random.default_rng(args.seed)
        M = args.M if args.M is not None else int(rng.integers(30, 51))
        s = int(rng.integers(1, min(6, M)))  # a prompt of 1..5 tokens that leaves room for one output token
        o = rng.integers(1, M - s + 1, size=args.random)
        l = np.full(args.random, s)
        if args.online is None:
            a = np.zeros(args.random, dtype=np.int64)
            how = "all arriving at slot 0"
        else:
            rate = args.online * M / float((l * o + o * (o + 1) / 2).mean())
            a = np.floor(np.cumsum(rng.exponential(1.0 / rate, args.random))).astype(np.int64)
            how = f"Poisson arrivals at load {args.online:g} ({rate:.3f} per slot)"
        what = (f"random instance (Jaillet et al.): {args.random} requests, prompt {s}, outputs U{{1..{M - s}}}, "
                f"M={M}, {how}, seed {args.seed}")
    if args.agents is not None:
        agents = _agent_list("--agents", args.agents)
    else:
        from flowgym.sim.theory import max_global_budget
        from flowgym.sim.workloads import request_work

        b = max(1, max_global_budget(M, float(np.mean(request_work(l, o)))))
        agents = ["mc-sf", "mc", "a-min", "greedy-lifo", f"flow-control:b={b}"]
    T = args.T
    if T is None and any(k in ("completed", "tokens") for k in objectives):
        print("error: the completed/tokens objectives need --T", file=sys.stderr)
        return 2
    if args.json:
        _writable_file("--json", args.json)
    print(what)
    with _backend(args) as backend:
        res, rows = compare_to_hindsight(a, l, o, M, agents, objectives=objectives, T=T, time_limit=args.time_limit,
                                         cls=cls, backend=backend)
    print(format_comparison(res, rows))
    if args.json:
        out = {
            "instance": {"arrival": a.tolist(), "prompt_len": l.tolist(), "output_len": o.tolist(), "M": int(M)},
            "T": T,
            "hindsight": {k: {"status": r.status, "optimal": r.optimal, "value": r.value, "bound": r.bound, "gap": r.gap,
                              "horizon": r.horizon, "horizon_exact": r.horizon_exact, "solve_seconds": r.solve_seconds,
                              "heuristic": r.heuristic, "heuristic_value": r.heuristic_value,
                              "refine_status": r.refine_status, "start": r.start.tolist()}
                          for k, r in res.items()},
            "rows": rows,
        }
        with open(args.json, "w") as fh:
            _json.dump(out, fh, indent=1)
        print(f"wrote {args.json}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    """``flowgym reproduce``: rerun the paper's experiments, check every claim against the docs' verdicts."""
    import os

    from flowgym.lab.reproduce import reproduce, write_docs

    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only is not None else None
    if only is not None and (not only or len(only) != len(args.only.split(","))):
        print(f"error: --only {args.only!r} has an empty name: list sections, setting ids or claim ids separated by "
              "commas (leave --only out to run everything)", file=sys.stderr)
        return 2
    if args.write_docs and (args.quick or only):
        print("error: --write-docs records the full run of every claim: drop --quick and --only", file=sys.stderr)
        return 2
    from flowgym.lab.reproduce import load_claims

    from flowgym.lab.parallel import check_backend
    from flowgym.lab.reproduce import select_claims

    select_claims(load_claims(args.claims), only)  # a bad claims file or --only is named before the folder is made
    check_backend(args.backend, workers=args.workers, address=args.address)
    if args.write_docs:
        from flowgym.lab.reproduce import writable_docs

        writable_docs(args.write_docs)  # a missing file or one without the claims block: named now, not after the run
    _writable_dir("--out", args.out)
    t0 = time.perf_counter()
    with _backend(args) as backend:
        results = reproduce(quick=args.quick, only=only, out=args.out, claims_path=args.claims, backend=backend,
                            log=(lambda s: None) if args.quiet else print)
    print(f"\nclaims ({'quick' if args.quick else 'full'} run, {time.perf_counter() - t0:.0f} s; "
          "'A better than B' holds when the 95% CI of the paired difference excludes 0 in A's favour):")
    for r in results:
        print(r.line())
    if args.write_docs:
        write_docs(args.write_docs, results)
        print(f"wrote the verdicts to {args.write_docs}")
    differ = [r for r in results if not r.matches]
    print(f"wrote {os.path.join(args.out, 'claims.md')}, {os.path.join(args.out, 'claims.json')} and the tables")
    if differ:
        print(f"{len(differ)} of {len(results)} verdicts differ from the recorded ones: "
              + ", ".join(r.claim.id for r in differ), file=sys.stderr)
        return 1
    print(f"all {len(results)} verdicts match the recorded ones")
    return 0


def _int_from(flag: str, minimum: int, maximum: int | None = MAX_COUNT) -> Any:
    """An argparse type: an integer from ``minimum`` to ``maximum`` (default 2**53, the counts the simulator
    keeps exactly; ``None``: no upper limit, for seeds; errors name ``flag``)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer >= {minimum}, got {text!r}")
        if maximum is not None and v > maximum:
            limit = "2**53" if maximum == MAX_COUNT else str(maximum)
            raise argparse.ArgumentTypeError(f"{flag} must be an integer <= {limit}, got {text!r}")
        return v

    return parse


def _positive_float(flag: str) -> Any:
    """An argparse type: a positive finite number (errors name ``flag``)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a number, got {text!r}") from None
        if not (v > 0 and v < float("inf")):
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {text!r}")
        return v

    return parse


def _train_search(args: argparse.Namespace, cfg: Any) -> int:
    from flowgym.lab.parallel import check_backend
    from flowgym.lab.train import SEARCH_SPACE, train_search

    check_backend("ray", workers=args.workers, address=args.address)  # before the run prints or writes
    trials = args.trials or 4
    space = ", ".join(f"{k} ({kind} {vals})" for k, (kind, vals) in SEARCH_SPACE.items())
    print(f"searching {trials} trials of {cfg.algo} on {cfg.scenario if isinstance(cfg.scenario, str) else 'data'} "
          f"on Ray (ASHA early stopping) over {space}; writing {cfg.out}/")
    res = train_search(cfg, trials, address=args.address, workers=args.workers)
    for r in sorted(res["trials"], key=lambda r: (r["best_time_in_system"] is None, r["best_time_in_system"] or 0)):
        settings = ", ".join(f"{k}={r[k]}" for k in SEARCH_SPACE if k in r)
        tis = r["best_time_in_system"]
        print(f"  {settings}: evaluations {r['evaluations']}, best time in system "
              + ("-" if tis is None else f"{tis:.2f}") + (f" (error: {r['error'].splitlines()[0]})" if r["error"] else ""))
    print(f"best trial: {res['best_dir']} (copied from {res['best']['model_dir']})")
    if res["table"] is not None:
        print(res["table"].format())
    print(f"wrote {cfg.out}/search.csv and {cfg.out}/best/")
    print(_compare_hint(cfg.scenario, cfg.rate, res["best_dir"]))
    return 0


def _scenario(args: argparse.Namespace) -> int:
    from flowgym.lab.scenarios import SCENARIOS, get_scenario, scenario_text

    if args.action == "list":
        if args.name is not None or args.format is not None:
            print("error: 'flowgym scenario list' takes no name or --format (show one: flowgym scenario show NAME "
                  "--format json)", file=sys.stderr)
            return 2
        for name in SCENARIOS:
            print(f"{name:24s} {get_scenario(name).description}")
        return 0
    if args.name is None:
        print("error: flowgym scenario show NAME (a named scenario or a file)", file=sys.stderr)
        return 2
    text = scenario_text(args.name, args.format or "toml")
    from flowgym.lab.evaluation import build_agent, check_hostable

    sc = get_scenario(args.name)
    for i, spec in enumerate(sc.agents):  # each agent runs in the file's env (its options, its action space)
        try:
            check_hostable(build_agent(spec), sc.env_kwargs())
        except ValueError as e:
            raise ValueError(f"scenario {args.name}, agents[{i}]: {e}") from None
    sys.stdout.write(text)
    return 0


def _add_backend_args(p: argparse.ArgumentParser, what: str) -> None:
    """--backend, --workers and --address of a command whose cells are ``what``."""
    p.add_argument("--backend", choices=["serial", "process", "ray"], default="serial",
                   help=f"where {what} run: serial (this process, default), process (--workers local processes), "
                   "ray (a local Ray cluster, or the one at --address; pip install -e \".[ray]\" in the flowgym "
                   "checkout); the results are the same on every backend (docs/scaling.md)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (process) or CPUs of the local Ray cluster (default: the cores)")
    p.add_argument("--address", default=None, help="an existing Ray cluster (e.g. auto, ray://head:10001)")


def _backend(args: argparse.Namespace) -> Any:
    from flowgym.lab.parallel import make_backend

    return make_backend(args.backend, workers=args.workers, address=args.address)


def _json_arg(text: str) -> Any:
    shown = repr(text) if len(text) <= 200 else repr(text[:200]) + f" ... ({len(text)} characters)"
    try:
        return _json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {shown}") from None
    except _json.DuplicateKeyError as e:  # json.loads would keep the last one, silently
        raise argparse.ArgumentTypeError(f"{e}: {shown}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("its arrays or objects are nested too deeply to read") from None


def _distribution_arg(text: str) -> Any:
    """A distribution name (``random-mix``, ``none``) or its JSON mapping."""
    text = text.strip()
    return _json_arg(text) if text.startswith("{") else text


def _float_list(flag: str) -> Any:
    def parse(text: str) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be comma-separated numbers, got {text!r}") from None

    return parse


def _int_list(flag: str, minimum: int, example: str) -> Any:
    """An argparse type: comma-separated integers ``>= minimum`` as a tuple (errors name ``flag``)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            out = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes comma-separated integers, e.g. {example} (got {text!r})") from None
        if not out or min(out) < minimum:
            raise argparse.ArgumentTypeError(f"{flag} takes integers >= {minimum}, got {text!r}")
        return out

    return parse


_net_arch = _int_list("--net-arch", 1, "64,64")


def _run_dir(algo: str, scenario: Any) -> str:
    """``flowgym train``'s default folder for a model of one scenario, on every algorithm: ``runs/<algo>-<name>``,
    with a built-in scenario's name or a scenario file's name without its folder and extension (``my.toml`` ->
    ``runs/ppo-my``)."""
    import os

    return f"runs/{algo}-{os.path.splitext(os.path.basename(str(scenario)))[0]}"


def _trained_on(cfg: Any) -> str:
    """What a training configuration trains on, for the first line of ``flowgym train``."""
    if cfg.distribution is None:
        return str(cfg.scenario)
    d = cfg.distribution
    name = d if isinstance(d, str) else str(d.get("kind", "given")) if isinstance(d, dict) else "given"
    return f"the {name} distribution (reported on {cfg.scenario})"


def _print_table(table: Any) -> None:
    """The final table of ``flowgym train`` and the tuned baselines, if there is one."""
    if table is not None:
        print(table.format())
        if table.tuned:
            print("baselines tuned on seeds 1000.. (lowest mean time in system): " + ", ".join(table.tuned))


#: ``flowgym train`` options of the SB3 path only, and of ``--algo ars`` only (dest names).
_SB3_ONLY = ("n_envs", "vec_env", "learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda",
             "clip_range", "ent_coef", "vf_coef", "max_grad_norm", "net_arch", "log_std_init", "algo_kwargs",
             "action_rule", "budget_levels", "norm_obs", "norm_reward", "clip_obs", "eval_freq", "checkpoint_freq",
             "select", "torch_threads", "device", "total_timesteps", "trials", "address")
_ARS_ONLY = ("iterations", "directions", "draws", "noise", "step_size", "hidden", "eval_every", "norm_draws", "init",
             "search", "hinge", "input_noise", "memory")


def _multiplier_flags_without_effect(args: argparse.Namespace, cfg: Any) -> str | None:
    """Why ``--multipliers`` or ``--multiplier-of`` would change nothing under ``cfg``: its action is the budget
    (checked before the configuration's own validation, whose message would not name the flags)."""
    if getattr(cfg, "action", "log-multiplier") == "budget":
        given = [f for f, v in (("--multipliers", args.multipliers), ("--multiplier-of", args.multiplier_of))
                 if v is not None]
        if given:
            return f"{' and '.join(given)} shape the multiplier actions; this run's action is the budget itself"
    return None


def _train_flags_without_effect(args: argparse.Namespace, cfg: Any) -> str | None:
    """Why a flag given to ``flowgym train`` would change nothing under ``cfg`` (``None``: each one acts), so that it
    is refused rather than dropped."""
    if args.tune_seeds is not None and cfg.final_eval_seeds == 0:
        return "--tune-seeds tunes the baselines of the final table, which --final-eval-seeds 0 leaves out"
    why = _multiplier_flags_without_effect(args, cfg)
    if why is not None:
        return why
    if getattr(cfg, "eval_freq", 1) == 0:
        given = [f for f, v in (("--eval-seed", args.eval_seed), ("--eval-episodes", args.eval_episodes),
                                ("--select", args.select)) if v is not None]
        if given:
            return f"{' and '.join(given)} configure the evaluations during training, which --eval-freq 0 turns off"
    if getattr(cfg, "norm_obs", True) is False and args.clip_obs is not None:
        return "--clip-obs clips normalised observations, which --no-norm-obs turns off"
    return None


def _train_ars(args: argparse.Namespace) -> int:
    import os

    from flowgym.lab.ars import ARSConfig, train_ars

    given = [f"--{k.replace('_', '-')}" for k in _SB3_ONLY if getattr(args, k, None) is not None]
    if args.backend != "serial":
        given.append("--backend")
    if args.observation not in (None, *LOAD_OBSERVATIONS):
        given.append(f"--observation {args.observation}")
    if args.action not in (None, "log-multiplier"):
        given.append(f"--action {args.action}")
    if given:
        print(f"error: {', '.join(given)} configure the SB3 algorithms (add --algo ppo, or another, to train with "
              "SB3); --algo ars, the default without --scenario, trains a numpy policy on the load "
              "features with the log-multiplier action (its options: --iterations, --directions, --draws, --noise, "
              "--step-size, --hidden, --memory, --eval-every, --norm-draws, --init, --search, --hinge, --input-noise; "
              "docs/training.md)", file=sys.stderr)
        return 2
    kw: dict[str, Any] = {}
    for k in ("scenario", "rate", "observation", "multipliers", "multiplier_of", "max_budget", "action_repeat", "eval_episodes",
              "eval_seed", "seed", "final_eval_seeds", "tune_seeds", "env_overrides", "out", *_ARS_ONLY):
        v = getattr(args, k, None)
        if v is not None:
            kw[k] = tuple(v) if k in ("multipliers", "hidden") else v
    kw["workers"] = args.workers if args.workers is not None else 2
    kw["progress"] = not args.quiet
    if args.distribution == "none" or (args.distribution is None and args.scenario is not None):
        kw["distribution"] = None  # train on the scenario itself, as the SB3 path does
    elif args.distribution is not None:
        kw["distribution"] = args.distribution
    if "out" not in kw:
        kw["out"] = "runs/ars-generalist" if kw.get("distribution", "random-mix") is not None else \
            _run_dir("ars", kw.get("scenario", "adaptive-mix"))
    cfg = ARSConfig(**kw)
    cfg.validate()
    why = _train_flags_without_effect(args, cfg)
    if why is not None:
        print(f"error: {why}; drop it", file=sys.stderr)
        return 2
    _writable_dir("--out", cfg.out)
    on = _trained_on(cfg)
    shape = ('linear' if not cfg.hidden else 'hidden ' + str(list(cfg.hidden))) + " policy"
    shape += f" with a memory of {cfg.memory} units" if cfg.memory else ""
    print(f"training ars (augmented random search, {shape}) on {on}: {cfg.iterations} updates x {2 * cfg.directions} candidates x {cfg.draws} draws "
          f"({cfg.workers} processes, seed {cfg.seed}); load average {os.getloadavg()[0]:.2f}; writing {cfg.out}/")
    res = train_ars(cfg)
    score = "geometric mean time in system" + (f" penalised by --hinge {cfg.hinge:g}" if cfg.hinge else "")
    print(f"trained {res.iterations} updates ({res.episodes} episodes) in {res.wall_seconds:.0f} s; kept the policy "
          f"of update {res.best_iteration} ({score} {res.best_eval:.2f} on the {cfg.eval_episodes} evaluation draws)")
    _print_table(res.table)
    print(f"wrote {cfg.out}/ (policy.npz, normalization.npz, flowgym_agent.json, curves.csv, iterates.npy"
          + (", eval.*" if res.table is not None else "") + ")")
    print(_compare_hint(cfg.scenario, cfg.rate, cfg.out))
    return 0


def _train(args: argparse.Namespace) -> int:
    from flowgym.agents.learned import require_sb3
    from flowgym.lab.train import TrainConfig, train

    if args.algo is None:
        args.algo = "ars" if args.scenario is None else "ppo"
    if ":" not in args.algo:  # --algo PPO as --algo ARS: short names are not case-sensitive (a class path is)
        args.algo = args.algo.lower()
    if args.algo == "ars":
        return _train_ars(args)
    given = [f"--{k.replace('_', '-')}" for k in _ARS_ONLY if getattr(args, k, None) is not None]
    if given:
        print(f"error: {', '.join(given)} configure --algo ars, not {args.algo}", file=sys.stderr)
        return 2

    fields = {f for f in TrainConfig.__dataclass_fields__}
    kw = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    kw["progress"] = not args.quiet
    kw["plot"] = not args.no_plots
    dist = kw.pop("distribution", None)
    if dist == "none" or (dist is None and args.scenario is not None):  # train on the scenario itself
        kw.setdefault("scenario", "adaptive-mix")
        if kw.get("out") is None:
            kw["out"] = _run_dir(args.algo, kw["scenario"])
        cfg = TrainConfig(**kw)
    else:  # the generalist: a distribution of workloads, reported zero-shot on the scenario
        if dist is not None:
            kw["distribution"] = dist
        cfg = TrainConfig.generalist(**kw)
    why = _multiplier_flags_without_effect(args, cfg)
    if why is not None:
        print(f"error: {why}; drop it", file=sys.stderr)
        return 2
    cfg.validate()  # bad settings are named first, with or without the training extra
    if args.backend != "ray":
        given = [f for f, v in (("--workers", args.workers), ("--address", args.address)) if v is not None]
        if given:
            print(f"error: {' and '.join(given)} configure a search on Ray (--backend ray); {args.algo} trains in "
                  "this process", file=sys.stderr)
            return 2
    else:
        from flowgym.lab.train import SEARCH_SPACE

        drawn = [f"--{k.replace('_', '-')}" for k in SEARCH_SPACE if getattr(args, k, None) is not None]
        if drawn:
            print(f"error: the search on Ray draws {', '.join(SEARCH_SPACE)} for each trial; {', '.join(drawn)} would "
                  "be overridden: drop it (or train one model without --backend ray)", file=sys.stderr)
            return 2
    why = _train_flags_without_effect(args, cfg)
    if why is not None:
        print(f"error: {why}; drop it", file=sys.stderr)
        return 2
    try:
        require_sb3()
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.backend != "ray" and args.trials is not None:
        print("error: --trials runs a search on Ray: add --backend ray", file=sys.stderr)
        return 2
    _writable_dir("--out", cfg.out)
    if args.backend == "ray":
        return _train_search(args, cfg)
    import os

    on = _trained_on(cfg)
    unit = "steps"  # a distribution's draws may mix slots and continuous-time iterations
    if cfg.distribution is None:
        from flowgym.lab.scenarios import get_scenario

        timed = get_scenario(cfg.scenario, rate=cfg.rate).env_kwargs().get("time_model", "slot") != "slot"
        unit = "iterations" if timed else "slots"
    print(f"training {cfg.algo} on {on} for {cfg.total_timesteps} decisions of {cfg.action_repeat} {unit} "
          f"({cfg.n_envs} {cfg.vec_env} envs, "
          f"seed {cfg.seed}); load average {os.getloadavg()[0]:.2f}; writing {cfg.out}/")
    res = train(cfg)
    print(f"trained {res.timesteps} decisions ({res.timesteps * cfg.action_repeat} {unit}) in {res.wall_seconds:.0f} s "
          f"({res.steps_per_second:.0f} decisions/s, {res.steps_per_second * cfg.action_repeat:.0f} {unit}/s, "
          f"load average {os.getloadavg()[0]:.2f}); model.zip is the {res.selected} policy")
    _print_table(res.table)
    print(f"wrote {cfg.out}/ (policy.pt, normalization.npz, flowgym_agent.json, model.zip, vecnormalize.pkl, curves.csv"
          + ("" if args.no_plots else ", curves.png") + (", eval.*" if res.table is not None else "") + ")")
    print(_compare_hint(cfg.scenario, cfg.rate, cfg.out))
    return 0


def _compare_hint(scenario: Any, rate: Any, out: str) -> str:
    """``flowgym train``'s closing line: the compare command that puts the model beside the scenario's tuned
    line-up, on held-out seeds, or on one seed for a trace (its replay is the same whatever the seed)."""
    from flowgym.lab.scenarios import get_scenario
    from flowgym.sim.workloads import Trace, make_workload

    name = scenario if isinstance(scenario, str) else "FILE"
    at = "" if rate is None else f" --rate {rate:g}"  # the rate it was trained at, not the scenario's default
    if isinstance(make_workload(get_scenario(scenario, rate=rate).env_kwargs()["workload"]), Trace):
        return (f"compare it with the scenario's tuned line-up on its trace (a replay, the same on every seed): "
                f'flowgym compare --scenario {name}{at} --seeds 1 --add-agents "learned:path={out}"')
    return (f"compare it with the scenario's tuned line-up on held-out seeds: flowgym compare --scenario {name}{at} "
            f'--seeds 900-919 --add-agents "learned:path={out}"')


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowgym", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "compare", formatter_class=_HelpFormatter,
        help="compare every agent of a scenario on the same arrivals (CSV, JSON, plots)",
        description="Run the scenario's agents (each tunable one grid-searched on separate seeds) over the "
        "reporting seeds, report time in system, the latencies of completed requests, throughputs, evictions "
        "and KV usage at each horizon with 95% confidence intervals, and write a CSV, a JSON and plots.",
    )
    c.add_argument("--scenario", default="paper-synthetic-known",
                   help="a scenario file (.toml or .json; 'flowgym scenario show NAME' prints one to start from) or "
                   "one of (with the wall time of its default compare on 2 cores, tuning included): "
                   + _scenario_list("paper-synthetic-known"))
    c.add_argument("--rate", type=_positive_float("--rate"), default=None,
                   help="arrival rate: per class per slot for paper-synthetic (default 5, the paper's), "
                   "requests/s for paper-realdata (10, 50), timestamp speed-up for azure (0.25, 0.4)")
    c.add_argument("--horizons", type=_horizons, default=None,
                   help="comma-separated horizons T (default: the scenario's, else 1000,2000,3000,4000,5000 cut at "
                   "the scenario's env.horizon, which ends the list); "
                   "finite scenarios (realdata, azure) run to the end of their workload instead")
    c.add_argument("--seeds", default="3",
                   help="reporting seeds: a count N (seeds 0..N-1; default 3), a range such as 900-919 (one seed: "
                   "900-900), or a list such as 1,2,7 (ranges and lists mix: 900-904,910)")
    c.add_argument("--tune-seeds", default=None,
                   help="tuning seeds: a count N (seeds 1000..1000+N-1; default 2), a range or a list as --seeds; "
                   "they may not overlap the reporting seeds (only with an agent to tune)")
    c.add_argument("--tune-horizon", type=_int_from("--tune-horizon", 1), default=None,
                   help="horizon of tuning runs (default: the scenario's tune_horizon, else min(T, 2000); run-to-end "
                   "scenarios tune on a smaller workload "
                   "run to its end: the first 5,000 requests, or the first 15 minutes of an Azure trace)")
    c.add_argument("--no-tune", action="store_true", help="use the scenario's default parameters")
    c.add_argument("--agents", default=None,
                   help="semicolon-separated agents, e.g. 'flow-control:b=12;mc;alpha-greedy:alpha=0.2'; "
                   "a trained model: 'learned:path=examples/ppo_default'; label=TEXT names a row "
                   "('mc;mc:max_budget=8,label=mc capped')")
    c.add_argument("--add-agents", default=None,
                   help="agents to add to the line-up (the scenario's, tuned as usual, or --agents), e.g. "
                   "'learned:path=runs/ppo-my'")
    _add_backend_args(c, "the episodes")
    c.add_argument("--out", default="results", help="output folder (default results/)")
    c.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    c.add_argument("--wide", action="store_true",
                   help="print every metric column (default: the six that fit 120 columns; the CSV has all)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.add_argument("--bound", action="store_true",
                   help="also print a lower bound on the mean time in system of any schedule of the same requests "
                   "(flowgym.sim.theory.time_in_system_bound; the paper's engine in the slot model) and each agent's "
                   "ratio to it; "
                   "one more episode per seed")
    c.set_defaults(func=_compare)
    r = sub.add_parser(
        "run", formatter_class=_HelpFormatter,
        help="simulate a scenario under a fixed activation budget and print the metrics",
        description="Simulate FlowControl-v0 (default: the paper's three classes at lambda = 3.5 per class, "
        "M = 16492, 1000 slots) under a fixed budget B_t = b (Algorithm 2; default: the largest b "
        "with b E[w] <= M, the edge of Theorem 2's memory condition b E[w] <= (1 - eps) M) and print the metrics "
        "of docs/model.md.",
    )
    r.add_argument("--budget", type=int, default=None,
                   help="fixed activation budget b (default: the largest b with b E[w] <= M, Theorem 2's "
                   "memory condition at eps -> 0)")
    r.add_argument("--horizon", type=_int_from("--horizon", 1), default=None, help="slots to simulate (default 1000)")
    r.add_argument("--rate", type=_positive_float("--rate"), default=None, help="arrival rate per class per slot (default 3.5)")
    r.add_argument("--scenario", default=None,
                   help="run a scenario's environment (a name or a .toml/.json file) instead of the paper's classes; "
                   "--rate is then the scenario's rate, --horizon, --M and --eviction override it")
    r.add_argument("--M", type=int, default=None, help="KV-cache budget in tokens (default 16492, or the scenario's)")
    r.add_argument("--eviction", choices=["lifo", "all", "estimate"], default=None,
                   help="who leaves on overflow: lifo (the newest first, Algorithm 2; default), all, or estimate")
    r.add_argument("--trace", default=None, help="replay a CSV trace (columns arrival,prompt_len,output_len)")
    r.add_argument("--seed", type=_int_from("--seed", 0, None), default=None,
                   help="seed of the arrivals (default 0; a --trace replays its own, so not with --trace)")
    r.add_argument("--json", action="store_true", help="print the metrics as JSON")
    r.set_defaults(func=_run)
    h = sub.add_parser(
        "hindsight", formatter_class=_HelpFormatter,
        help="the hindsight optimum of a small trace (integer program, HiGHS) against the agents",
        description="Solve the offline schedule of a finite trace as an integer program with SciPy's HiGHS "
        "(minimum total latency, minimum maximum latency, or maximum completions by T), check it by replaying "
        "it in the simulator, run the agents on the same trace and print each agent's ratio to the optimum. "
        "A solve stopped by the time limit reports its gap, never optimality. Small instances only "
        "(tens of requests).",
    )
    src = h.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", default=None, help="CSV trace (columns arrival,prompt_len,output_len)")
    src.add_argument("--random", type=_int_from("--random", 1), default=None, metavar="N",
                     help="a random instance of N requests as in Jaillet et al.: M ~ U[30,50], one prompt "
                     "size s ~ U{1..5}, outputs U{1..M-s}")
    h.add_argument("--M", type=_int_from("--M", 2), default=None, help="KV budget (required with --trace; random: drawn)")
    h.add_argument("--cls-column", default=None, help="class-id column of the trace (for per-class flow control)")
    h.add_argument("--online", type=_positive_float("--online"), default=None, metavar="RHO",
                   help="random instance: Poisson arrivals at load RHO instead of all at slot 0")
    h.add_argument("--seed", type=_int_from("--seed", 0, None), default=None, help="seed of the random instance (default 0)")
    h.add_argument("--objectives", default="total_latency,max_latency",
                   help="comma-separated: total_latency, max_latency, completed, tokens (default the first two)")
    h.add_argument("--T", type=_int_from("--T", 1), default=None, help="horizon of the completed/tokens objectives")
    h.add_argument("--agents", default=None,
                   help="semicolon-separated agents (default mc-sf;mc;a-min;greedy-lifo;"
                   "flow-control:b=<the largest b with b E[w] <= M>)")
    h.add_argument("--time-limit", type=_positive_float("--time-limit"), default=60.0,
                   help="seconds per objective (default 60)")
    h.add_argument("--json", default=None, help="also write the instance, schedules and rows as JSON")
    _add_backend_args(h, "the solves and the agents' runs")
    h.set_defaults(func=_hindsight)
    q = sub.add_parser(
        "reproduce", formatter_class=_HelpFormatter,
        help="rerun the paper's experiments and check each claim (flowgym/data/claims.toml) against the docs",
        description="Rerun the experiments behind docs/reproduction.md (the full settings, or a short version with "
        "--quick), write tables, CSVs, figures and claims.json/claims.md, and print one verdict per claim (holds / "
        "does not hold / holds only on some metrics) with its deciding numbers and 95% CIs. 'A better than B on "
        "m' holds when the 95% Student-t CI of the paired (same-seed) difference excludes 0 in A's favour. Exits 1 "
        "when a verdict differs from the one the docs record.",
    )
    q.add_argument("--quick", action="store_true", help="the short version (fewer seeds, shorter runs; CI runs it)")
    q.add_argument("--only", default=None,
                   help="comma-separated sections (theory, sec4.1, sec4.2, hindsight), setting ids or claim ids")
    q.add_argument("--out", default="results/reproduce", help="output folder (default results/reproduce)")
    q.add_argument("--claims", default=None, help="a claims file (default: the packaged flowgym/data/claims.toml)")
    q.add_argument("--write-docs", default=None, metavar="PATH",
                   help="write the full run's verdicts into the generated block of PATH (docs/reproduction.md)")
    q.add_argument("--quiet", action="store_true", help="print only the claim lines")
    _add_backend_args(q, "the episodes")
    q.set_defaults(func=_reproduce)
    s = sub.add_parser(
        "scenario", formatter_class=_HelpFormatter,
        help="list the named scenarios, or print one as a file to start your own from",
        description="'flowgym scenario list' lists the named scenarios; 'flowgym scenario show NAME' prints one "
        "(or a scenario file, validated) as TOML or JSON: save it, edit it, and pass the file to compare, run "
        "or train with --scenario. The format is docs/scenarios.md.",
    )
    s.add_argument("action", choices=["list", "show"])
    s.add_argument("name", nargs="?", default=None, help="the scenario (show)")
    s.add_argument("--format", choices=["toml", "json"], default=None, help="(show) file format (default toml)")
    s.set_defaults(func=_scenario)
    t = sub.add_parser(
        "train", formatter_class=_HelpFormatter,
        help="train a learned activation budget (the generalist by random search; SB3 algorithms with "
        "pip install -e \".[train]\" in the flowgym checkout)",
        description="With no --scenario, train the generalist (the shipped default learned agent): augmented "
        "random search (--algo ars, flowgym.lab.ars) of a linear policy of the scale-free load features on "
        "random-mix workloads, its action two multipliers (of the arrival rate and of the safe budget M/E[w], the budget the larger product), every candidate policy of an update "
        "run on the same draws (common random numbers), the best of the evaluations on 12 fixed draws kept; "
        f"about {GENERALIST_TRAIN_MINUTES} minutes on 2 CPU cores, numpy only. With --scenario (or --algo ppo, "
        "a2c, ...), an SB3 agent (PPO by default) with vectorised environments, VecNormalize (saved with the "
        "model), evaluation on separate seeds during training and a progress bar "
        f"(about {DEFAULT_TRAIN_MINUTES} minutes on a scenario; needs pip install -e \".[train]\" in the flowgym "
        "checkout). Either way it then evaluates the model against the scenario's baselines (fixed budget tuned by "
        "grid search) on seeds 0..N-1 and writes a model directory that 'flowgym compare --agents "
        "\"learned:path=DIR\"' and flowgym.agents.LearnedBudget load. See docs/training.md.",
    )
    d = _train_defaults()
    g = d.generalist()
    from flowgym.lab.ars import ARSConfig

    t.add_argument("--scenario", default=None,
                   help="scenario to train on (with --distribution, or without --scenario: the scenario the final "
                   "table reports on, zero-shot): a scenario file (.toml or .json) or one of: "
                   + _scenario_list(d.scenario, times=False))
    t.add_argument("--distribution", type=_distribution_arg, default=None,
                   help="train on a distribution of workloads: random-mix (default without --scenario), its JSON "
                   "('{\"kind\": \"random-mix\", \"stationary_p\": 0.5}'; fields in docs/training.md), or none "
                   "(train on --scenario)")
    t.add_argument("--observation", choices=["flat", *LOAD_OBSERVATIONS], default=None,
                   help="the policy's observation: the environment's flat one (default with --scenario and an SB3 "
                   "algorithm), the 17 scale-free load features (load; the SB3 default on a distribution), those "
                   "and three more (load-v2; the default of --algo ars, the generalist), those 20 and two moving "
                   "averages of the backlog (load-v3), or those 22 and how much the load swung over about the last "
                   "1,000 slots (load-v4)")
    t.add_argument("--action", choices=["budget", "multiplier", "log-multiplier"], default=None,
                   help="the policy's action: a budget (or a budget level's index; default with --scenario), the "
                   "index of a multiplier (of the arrival rate on a distribution; --multiplier-of), or "
                   "log-multiplier: one float in [-1, 1] (two with --multiplier-of max or max-head, three with max-drain), a "
                   "multiplier between the "
                   "smallest and largest of --multipliers on a log scale (a Gaussian policy)")
    def ks(multipliers: Sequence[float]) -> str:
        return ",".join(f"{k:g}" for k in multipliers)

    # the default is the config's that trains: ARSConfig (--algo ars), TrainConfig.generalist (an SB3 algorithm on a
    # distribution) or TrainConfig (an SB3 algorithm on the scenario itself)
    ars_k, dist_k, scenario_k = ARSConfig().multipliers, g.multipliers, d.multipliers
    on_dist = "an SB3 algorithm on a distribution (no --scenario, or a --distribution other than none)"
    by_path = (f"{ks(ars_k)} with --algo ars (on a scenario too) and with {on_dist}" if ars_k == dist_k else
               f"{ks(ars_k)} with --algo ars (on a scenario too); {ks(dist_k)} with {on_dist}")
    t.add_argument("--multipliers", type=_float_list("--multipliers"), default=None,
                   help="the multipliers of --action multiplier, or the range of log-multiplier (their smallest and "
                   f"largest). Default: {by_path}; {ks(scenario_k)} with an SB3 algorithm (PPO, the default with "
                   "--scenario) trained on the scenario itself (--scenario without --distribution, or --distribution "
                   "none)")
    t.add_argument("--multiplier-of", choices=list(MULTIPLIER_OF), default=None,
                   help="what a multiplier action multiplies: the online safe budget M/E[w], the arrival rate "
                   "(PPO's generalist), both (twice the actions), the smaller of the two, or max (log-multiplier "
                   "only: one multiplier per anchor, the budget the larger product) or max-head (the same, the rate "
                   "anchor the larger of the rate now and when the queue head arrived; the ARS generalist's default) or "
                   "max-drain (those two and a third multiplier, of a drain term min(queue/50, k_drain x safe budget))")
    t.add_argument("--rate", type=float, default=None, help="the scenario's rate argument (default: its own)")
    t.add_argument("--algo", default=None,
                   help="ars: augmented random search of a small numpy policy with common random numbers "
                   "(flowgym.lab.ars; the default without --scenario: the shipped generalist's recipe, no torch "
                   "needed), ppo (the default with --scenario), a2c, dqn, sac, td3, ddpg, qrdqn, trpo, maskable-ppo, "
                   "recurrent-ppo (an LSTM policy), "
                   "or package.module:Class (its model then loads only with trust=True)")
    t.add_argument("--total-timesteps", type=int, default=None,
                   help="decisions (SB3 timesteps; slots = decisions x action repeat) "
                   f"(default {g.total_timesteps} for the generalist, {d.total_timesteps} with --scenario)")
    t.add_argument("--n-envs", type=int, default=None, help=f"vectorised environments (default {d.n_envs})")
    t.add_argument("--vec-env", choices=["auto", "batched", "dummy", "subproc"], default=None,
                   help="auto (default): the batched VecEnv (flowgym.envs.sb3) where the configuration allows, else "
                   "dummy; batched: that or an error naming why not; dummy: one process; subproc: one process per env")
    t.add_argument("--seed", type=int, default=None, help=f"seed of the algorithm and of training env 0 (default {d.seed}; ars: its first training draw, "
                   f"default {ARSConfig().seed})")
    t.add_argument("--learning-rate", type=float, default=None, help=f"(default {d.learning_rate})")
    t.add_argument("--n-steps", type=int, default=None, help=f"rollout steps per env (default {d.n_steps})")
    t.add_argument("--batch-size", type=int, default=None, help=f"minibatch (default {d.batch_size})")
    t.add_argument("--n-epochs", type=int, default=None, help=f"PPO epochs (default {d.n_epochs})")
    t.add_argument("--gamma", type=float, default=None,
                   help=f"discount (default {g.gamma} for the generalist, {d.gamma} with --scenario)")
    t.add_argument("--gae-lambda", type=float, default=None, help=f"(default {d.gae_lambda})")
    t.add_argument("--clip-range", type=float, default=None, help=f"PPO clip (default {d.clip_range})")
    t.add_argument("--ent-coef", type=float, default=None, help=f"entropy bonus (default {d.ent_coef})")
    t.add_argument("--vf-coef", type=float, default=None, help=f"(default {d.vf_coef})")
    t.add_argument("--max-grad-norm", type=float, default=None, help=f"(default {d.max_grad_norm})")
    t.add_argument("--net-arch", type=_net_arch, default=None,
                   help="hidden layer sizes of policy and value nets (default " + ",".join(map(str, d.net_arch)) + ")")
    t.add_argument("--log-std-init", type=float, default=None,
                   help="initial log standard deviation of a Gaussian policy (--action log-multiplier; SB3's default 0)")
    t.add_argument("--algo-kwargs", type=_json_arg, default=None,
                   help='JSON of extra algorithm arguments, e.g. \'{"target_kl": 0.02}\'')
    t.add_argument("--action-repeat", type=int, default=None,
                   help=f"slots each decision is held for; --total-timesteps counts decisions (default {d.action_repeat})")
    t.add_argument("--action-rule", choices=["mean", "mode"], default=None,
                   help="deterministic budget of the policy: expected budget, rounded (default; with budget "
                   "levels the expected level index), or argmax")
    t.add_argument("--max-budget", type=int, default=None,
                   help="largest budget the policy may choose (default: the scenario's, 16; 64 on adaptive-mix)")
    t.add_argument("--budget-levels", type=_int_list("--budget-levels", 0, "0,1,2,4,8,16,32,64"), default=None,
                   help="the budgets the policy chooses among (ascending), e.g. 0,1,2,3,4,6,8,12,16,24,32,40,48,64; "
                   "the action is a level's index (default: the scenario's levels on adaptive-mix, "
                   "else every budget 0..max-budget; --max-budget alone: every budget)")
    t.add_argument("--env-overrides", type=_json_arg, default=None,
                   help='JSON of FlowControl-v0 arguments overriding the scenario\'s, e.g. '
                   '\'{"reward_weights": {"in_system": 1, "wasted_tokens": 0.5}}\' (on a distribution not M, '
                   'horizon or time_model: each draw sets its own)')
    t.add_argument("--no-norm-obs", dest="norm_obs", action="store_false", default=None,
                   help="do not normalise observations")
    t.add_argument("--no-norm-reward", dest="norm_reward", action="store_false", default=None,
                   help="do not normalise rewards")
    t.add_argument("--clip-obs", type=float, default=None, help=f"(default {d.clip_obs})")
    t.add_argument("--eval-freq", type=int, default=None,
                   help=f"evaluate every N decisions, 0 = never (default {g.eval_freq} for the generalist, "
                   f"{d.eval_freq} with --scenario)")
    t.add_argument("--eval-episodes", type=int, default=None,
                   help=f"(default {g.eval_episodes} fixed draws for the generalist and for --algo ars, "
                   f"{d.eval_episodes} episodes with --scenario and an SB3 algorithm)")
    t.add_argument("--eval-seed", type=int, default=None, help=f"first evaluation seed (default {d.eval_seed})")
    t.add_argument("--checkpoint-freq", type=int, default=None,
                   help=f"checkpoint every N decisions, 0 = never (default {g.checkpoint_freq} for the generalist, "
                   f"{d.checkpoint_freq} with --scenario)")
    t.add_argument("--final-eval-seeds", type=int, default=None,
                   help=f"report seeds 0..N-1 of the final table, 0 = no table (default {d.final_eval_seeds})")
    t.add_argument("--tune-seeds", type=int, default=None,
                   help=f"tuning seeds 1000.. of the baselines (default {d.tune_seeds})")
    t.add_argument("--select", choices=["best", "last"], default=None,
                   help="model.zip = the best evaluated policy (default) or the last")
    t.add_argument("--torch-threads", type=int, default=None, help=f"(default {d.torch_threads})")
    t.add_argument("--device", default=None, help=f"torch device (default {d.device})")
    t.add_argument("--backend", choices=["serial", "ray"], default="serial",
                   help="serial: one training run (default); ray: a Ray Tune search of --trials runs over seeds and "
                   "the settings that matter (flowgym.lab.train.SEARCH_SPACE), the worst stopped early (ASHA), the "
                   "best evaluated against the tuned baselines (pip install -e \".[ray]\" in the flowgym checkout; "
                   "docs/scaling.md)")
    t.add_argument("--trials", type=int, default=None, help="trials of a --backend ray search (default 4)")
    t.add_argument("--workers", type=int, default=None, help="CPUs of the local Ray cluster (default: the cores); with --algo ars, processes running "
                   "episodes (default 2; the result does not depend on it)")
    t.add_argument("--address", default=None, help="an existing Ray cluster (auto, ray://head:10001)")
    a = ARSConfig()
    t.add_argument("--iterations", type=int, default=None, help=f"(ars) policy updates (default {a.iterations})")
    t.add_argument("--directions", type=int, default=None,
                   help=f"(ars) random directions per update, each run + and - (default {a.directions})")
    t.add_argument("--draws", type=int, default=None,
                   help=f"(ars) draws of the workload per candidate and update, the same for all (default {a.draws})")
    t.add_argument("--noise", type=float, default=None, help=f"(ars) perturbation of each weight (default {a.noise})")
    t.add_argument("--step-size", type=float, default=None, help=f"(ars) step size (default {a.step_size})")
    t.add_argument("--hidden", type=_int_list("--hidden", 1, "8"), default=None,
                   help="(ars) hidden layer sizes of the policy (default: none, a linear policy)")
    t.add_argument("--memory", type=int, default=None, metavar="M",
                   help="(ars) a memory of M leaky tanh units carried from decision to decision, read by the policy "
                   f"(default {a.memory}: none; not with --input-noise; docs/training.md, 'A memory searched by ARS')")
    t.add_argument("--init", default=None, metavar="DIR|shipped",
                   help="(ars) start the search from the weights and normalisation of an earlier --algo ars model "
                   "(same observation and hidden layers; new action outputs copy its last, so --multiplier-of "
                   "max-drain from a max-head model starts at that model's policy); 'shipped': the shipped "
                   "generalist, e.g. to tune it to --scenario FILE (docs/training.md)")
    t.add_argument("--search", choices=["all", "new-inputs"], default=None,
                   help="(ars) the weights the search moves: all (default), or new-inputs: with --init and a longer "
                   "--observation than that model's, only the weights on the new features and the output biases")
    t.add_argument("--hinge", type=float, default=None, metavar="W",
                   help="(ars) weigh the draws where the policy loses to the untuned two-anchor rule 1 + W times "
                   f"(default {a.hinge:g}: no penalty; docs/training.md, 'Losing less often')")
    t.add_argument("--input-noise", type=float, default=None, metavar="SIGMA",
                   help="(ars) Gaussian noise of this spread on the policy's normalised inputs in the training "
                   f"episodes, a regulariser (default {a.input_noise:g}: none; docs/training.md, 'Feature noise')")
    t.add_argument("--eval-every", type=int, default=None,
                   help=f"(ars) evaluate every N updates on the fixed draws; the best is kept (default {a.eval_every})")
    t.add_argument("--norm-draws", type=int, default=None,
                   help=f"(ars) draws that set the observation normalisation (default {a.norm_draws})")
    t.add_argument("--out", default=None, help="output directory (default runs/<algo>-<scenario>: the scenario's "
                   "name, or its file's without the extension; runs/<algo>-generalist for a generalist)")
    t.add_argument("--no-plots", action="store_true", help="skip curves.png")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=_train)
    return p


def _scenario_list(default: str, times: bool = True) -> str:
    """Every named scenario once, the default marked (and the measured run time of its default compare)."""
    from flowgym.lab.scenarios import SCENARIOS, get_scenario

    out = []
    for name in SCENARIOS:
        notes = (["default"] if name == default else []) + ([get_scenario(name).run_time] if times else [])
        notes = [n for n in notes if n]
        out.append(f"{name} ({', '.join(notes)})" if notes else name)
    return ", ".join(out)


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter without breaking lines at hyphens (scenario names stay whole)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _train_defaults() -> Any:
    from flowgym.lab.train import TrainConfig

    return TrainConfig()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowgym`` command."""
    args = build_parser().parse_args(argv)
    if getattr(args, "horizon", None) is None:
        args.horizon_given = False
        args.horizon = 1000
    else:
        args.horizon_given = True
    from flowgym.lab.parallel import CellError

    try:
        return int(args.func(args))
    except (ValueError, CellError) as e:  # bad input, or a cell of a grid that failed: say which
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConnectionError, ImportError) as e:  # a Ray cluster that cannot be reached, a missing extra
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file that cannot be read or written (a path the user gave)
        where = f" {e.filename!r}" if getattr(e, "filename", None) else ""
        print(f"error:{where} {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
