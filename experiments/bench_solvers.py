"""Benchmark the exact solvers and the baselines on chain graphs and two-type clusters.

For each (layers, devices) pair: solve time, status and gap of ``ilp`` and ``cpsat``,
and the ratio of each baseline's iteration time to the best plan found by anyone.
Prints a markdown table; ``--out FILE`` also writes every result as JSON.

``--schedules`` adds a column per schedule (the cases of :data:`SCHEDULE_CASES`, e.g.
``gpipe,interleaved-1f1b:2,zbv``): every solver is asked to plan the same problem under
that schedule (``v`` stages per device group after the colon), and the cell gives the
best plan any solver found, with the solver, and the proved gap,
``(best - L) / best`` for ``L`` the largest lower bound a solver proved for it.  A
solver that does not plan a schedule refuses it in one line, which the JSON keeps.

The grid pairs layers with devices as the issue asks: (16, 4), (32, 8), (64, 16),
(96, 32), (96, 64), (128, 64); ``--all`` runs the full cross product.  Baselines get
``--baseline-limit`` seconds each; pipeplan's own time-limited heuristics
(``cpsat-split``, ``nsga``) get the exact solvers' ``--time-limit``; the pure-Python DPs (``dapple``, ``alpa``,
``pipedream``) give up on the large instances, and the table shows ``-`` for a
baseline that returned no plan.  HiGHS's banner is silenced at the fd level.

``--version2 64x16`` prints only the version-2 row of issue 37 for that pair: ``ilp`` and
``cpsat`` (or the solvers of ``--solvers``) on every version-2 case of :data:`SCHEDULE_CASES`
(their plan, proved bound, gap, what proved the bound, how many of the version-2 model's group
counts were solved and the most the model can prove), next
to the best version-1 plan (``ilp`` and ``cpsat`` under ``1f1b``, same limit), and whether the
version-2 plan is at least as fast.

Usage::

    python -m pipeplan.experiments.bench_solvers [--quick] [--time-limit 60] [--out bench.json]
        [--schedules gpipe,interleaved-1f1b:2,interleaved-1f1b:4,interleaved-zb:2,looped-bfs:2,zbv]
    python -m pipeplan.experiments.bench_solvers --version2 64x16 --time-limit 5
    python -m pipeplan.experiments.bench_solvers --version2 64x16 --time-limit 300 --solvers ilp
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeplan.models.errors import InputError  # noqa: E402
from pipeplan.models.graph import Layer, LayerGraph  # noqa: E402
from pipeplan.models.jsonio import atomic_write_text  # noqa: E402
from pipeplan.solver.formats.cluster import Cluster, Device, Link  # noqa: E402
from pipeplan.solver.core.problem import PlanningProblem  # noqa: E402
from pipeplan.solver.core.native_output import quiet_stdout  # noqa: E402
from pipeplan.solver.schedules.schedule import schedule_for  # noqa: E402
from pipeplan.solver.solvers import get_solver, solver_names  # noqa: E402

LAYERS = (16, 32, 64, 96, 128)
DEVICES = (4, 8, 16, 32, 64)
SERVERS = {4: 2, 8: 2, 16: 4, 32: 4, 64: 8}
QUICK = [(16, 4), (32, 8), (64, 16)]
PAIRS = [(16, 4), (32, 8), (64, 16), (96, 32), (96, 64), (128, 64)]
EXACT = ("ilp", "cpsat")
FULL_LIMIT = (*EXACT, "cpsat-split", "nsga")
"""Solvers given ``--time-limit`` (the others ``--baseline-limit``)."""

SCHEDULE_CASES = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4),
                  ("interleaved-zb", 2), ("looped-bfs", 2), ("zbv", 2))
"""``(schedule, v)`` pairs the schedule columns (and ``bench_schedules``) compare; ``v`` is the
stages per device group, fixed at 1 for ``gpipe``/``1f1b`` and 2 for ``zbv``."""

VIRTUAL_SCHEDULES = tuple(dict.fromkeys(name for name, _ in SCHEDULE_CASES
                                        if schedule_for(name).stages_per_group is None))
"""Schedules whose stages per group ``v`` is a choice."""


def chain_graph(layers: int, seed: int = 0) -> LayerGraph:
    """A transformer-like chain: similar blocks with +-20 % noise, a heavier head."""
    rng = random.Random(seed)
    blocks = []
    for i in range(layers):
        scale = rng.uniform(0.8, 1.2) * (2.0 if i == layers - 1 else 1.0)
        blocks.append(Layer(f"block.{i}", (2e-5, 1.5e-4 * scale), (4e-5, 3.0e-4 * scale),
                            params=2.0e8 * scale, act=3.0e7 * scale, out=4.0e6))
    return LayerGraph.chain(f"chain{layers}", blocks, input_bytes=4.0e6)


def two_type_cluster(devices: int) -> Cluster:
    """Half the servers hold fast 80 GB devices on NVLink, half slow 24 GB devices on PCIe."""
    servers = SERVERS[devices]
    per = devices // servers
    links, devs = [], []
    for s in range(servers):
        fast = s < servers // 2
        links.append(Link(3.0e11 if fast else 3.2e10, 5e-6 if fast else 1e-5, f"s{s}"))
        for k in range(per):
            devs.append(Device(f"s{s}g{k}", f"s{s}", 1.0 if fast else 0.45, 80e9 if fast else 24e9))
    return Cluster(f"two-type-{devices}", tuple(links), Link(1.25e10, 2e-5), tuple(devs))


def bench_one(layers: int, devices: int, time_limit: float, baseline_limit: float) -> dict:
    problem = PlanningProblem(chain_graph(layers), two_type_cluster(devices), global_batch=64,
                              microbatches=8, schedule="1f1b")
    rows = {name: solve_row(name, problem, time_limit if name in FULL_LIMIT else baseline_limit)
            for name in solver_names()}
    best = min((r["iteration_time"] for r in rows.values() if r.get("iteration_time")), default=None)
    for r in rows.values():
        r["ratio"] = r["iteration_time"] / best if best and r.get("iteration_time") else None
    return {"layers": layers, "devices": devices, "servers": SERVERS[devices], "best": best, "solvers": rows}


def parse_solvers(text: str) -> tuple[str, ...]:
    """``"ilp,cpsat"`` as ``("ilp", "cpsat")``.

    Raises
    ------
    SystemExit
        With status 2, for a name no solver is registered under.
    """
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if name not in solver_names():
            usage_error(f"error: --solvers: {name}: no such solver; give any of {', '.join(solver_names())}")
    return names


def case_name(schedule: str, virtual: int) -> str:
    """``interleaved-1f1b v=2``; the schedules with a fixed ``v`` by name alone."""
    return f"{schedule} v={virtual}" if schedule in VIRTUAL_SCHEDULES else schedule


def usage_error(message: str) -> None:
    """Stop the script on a bad option: ``message`` as one line on stderr (``error: --option: ...``), exit status 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def parse_schedules(text: str) -> list[tuple[str, int]]:
    """``"gpipe,interleaved-1f1b:4,zbv"`` as ``[("gpipe", 1), ("interleaved-1f1b", 4), ("zbv", 2)]``.

    Raises
    ------
    SystemExit
        With status 2, for a name or ``v`` outside :data:`SCHEDULE_CASES`'s schedules.
    """
    names = {schedule for schedule, _ in SCHEDULE_CASES}
    cases = []
    for item in text.split(","):
        schedule, _, v = item.strip().partition(":")
        fixed = schedule_for(schedule).stages_per_group if schedule in names else None
        if schedule not in names or (v and schedule not in VIRTUAL_SCHEDULES and int(v) != fixed):
            usage_error(f"error: --schedules: {item}: give one of {', '.join(sorted(names))}, "
                        f"with :v only for {', '.join(VIRTUAL_SCHEDULES)}")
        cases.append((schedule, int(v) if v else (2 if schedule in VIRTUAL_SCHEDULES else fixed)))
    return cases


def schedule_problem(layers: int, devices: int, schedule: str, virtual: int) -> PlanningProblem:
    """The benchmark's problem for ``(layers, devices)`` under ``schedule`` with ``v = virtual``.

    Raises
    ------
    ValueError, TypeError
        Where :class:`PlanningProblem` does not take the schedule or ``virtual_stages``.
    """
    extra = {"virtual_stages": virtual} if schedule_for(schedule).several_stages else {}
    return PlanningProblem(chain_graph(layers), two_type_cluster(devices), global_batch=64, microbatches=8,
                           schedule=schedule, **extra)


def solve_row(name: str, problem: PlanningProblem, limit: float) -> dict:
    """One solver on ``problem``: what :func:`bench_one` records of it, or why it refused."""
    start = time.perf_counter()
    try:
        with quiet_stdout():
            result = get_solver(name).solve(problem, time_limit=limit, seed=0)
    except InputError as err:  # the solver does not plan this schedule
        return {"refused": str(err)}
    return {"status": result.status, "iteration_time": result.iteration_time,
            "lower_bound": result.lower_bound, "gap": result.gap,
            "wall_time": time.perf_counter() - start,
            "stages": len(result.plan.stages) if result.plan else None, "bound_by": result.bound_by,
            "details": {k: v for k, v in result.details.items() if isinstance(v, (int, float, str))}}


def best_and_gap(rows: dict[str, dict]) -> dict:
    """The best plan among ``rows`` (solver name -> :func:`solve_row`), its solver, and the proved gap.

    The gap is ``(best - L) / best`` with ``L`` the largest lower bound any solver
    proved; ``None`` without a plan or a bound.

    Examples
    --------
    >>> best_and_gap({"a": {"iteration_time": 2.0, "lower_bound": 1.0}, "b": {"iteration_time": 1.25},
    ...               "c": {"refused": "no"}})
    {'best': 1.25, 'solver': 'b', 'lower_bound': 1.0, 'gap': 0.2}
    """
    found = {n: r["iteration_time"] for n, r in rows.items() if r.get("iteration_time")}
    bounds = [r["lower_bound"] for r in rows.values() if r.get("lower_bound") is not None]
    if not found:
        return {"best": None, "solver": None, "lower_bound": max(bounds, default=None), "gap": None}
    # on a tie, name a solver that proved the plan optimal
    solver = min(found, key=lambda n: (found[n], rows[n].get("status") != "optimal", n))
    best, bound = found[solver], max(bounds, default=None)
    return {"best": best, "solver": solver, "lower_bound": bound,
            "gap": max(0.0, (best - bound) / best) if bound is not None else None}


def bench_schedule(layers: int, devices: int, schedule: str, virtual: int, time_limit: float,
                   baseline_limit: float, solvers: tuple[str, ...] | None = None) -> dict:
    """The solvers (default: every registered one) on the ``(layers, devices)`` problem under one
    schedule: :func:`best_and_gap` and the rows."""
    head = {"schedule": schedule, "virtual": virtual, "name": case_name(schedule, virtual)}
    try:
        problem = schedule_problem(layers, devices, schedule, virtual)
    except (TypeError, ValueError) as err:  # a PlanningProblem without this schedule
        return {**head, "refused": f"PlanningProblem refuses it: {err}", **best_and_gap({})}
    rows = {name: solve_row(name, problem, time_limit if name in FULL_LIMIT else baseline_limit)
            for name in solvers or solver_names()}
    return {**head, **best_and_gap(rows), "solvers": rows}


def schedule_markdown(results: list[dict]) -> str:
    """One row per ``(layers, devices)``, one column per schedule: ``best ms (solver) / proved gap``."""
    cases = [c["name"] for c in results[0]["schedules"]] if results and results[0].get("schedules") else []
    if not cases:
        return ""
    lines = ["| L x D (servers) | " + " | ".join(f"{n}: best (solver) / gap" for n in cases) + " |",
             "|" + "---|" * (len(cases) + 1)]
    for res in results:
        cells = [f"{res['layers']} x {res['devices']} ({res['servers']})"]
        for c in res["schedules"]:
            gap = f"{100 * c['gap']:.2f} %" if c["gap"] is not None else "-"
            cells.append(f"{1e3 * c['best']:.1f} ms ({c['solver']}) / {gap}" if c["best"] else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def version2_row(layers: int, devices: int, time_limit: float, solvers: tuple[str, ...] = EXACT) -> dict:
    """``solvers`` on every version-2 case of :data:`SCHEDULE_CASES` for ``(layers, devices)``, and the best
    version-1 plan (the same solvers under ``1f1b``) to compare with."""
    one = {name: solve_row(name, schedule_problem(layers, devices, "1f1b", 1), time_limit) for name in solvers}
    v1 = best_and_gap(one)
    cases = []
    for schedule, virtual in SCHEDULE_CASES:
        if not schedule_for(schedule).several_stages:
            continue
        case = bench_schedule(layers, devices, schedule, virtual, time_limit, time_limit, solvers)
        case["beats_v1"] = (case["best"] is not None and v1["best"] is not None
                            and case["best"] <= v1["best"] * (1 + 1e-12))
        cases.append(case)
    return {"layers": layers, "devices": devices, "servers": SERVERS[devices], "time_limit": time_limit,
            "version1": {**v1, "solvers": one}, "cases": cases}


def model_summary(details: dict) -> str:
    """``R 2-3 by the model, R 1 by target LPs, all`` from a record's ``model_groups`` and ``model_complete``, and
    ``model's limit 223.1 ms`` from its ``model_limit``.

    Examples
    --------
    >>> model_summary({"model_groups": "R=1:target R=2:model R=3:model", "model_complete": False})
    'R 2-3 by the model, R 1 by target LPs'
    >>> model_summary({"model_groups": "R=1:model R=2:target R=3:target", "model_complete": True})
    'R 1 by the model, R 2-3 by target LPs, all'
    >>> model_summary({"model_groups": "R=1:model", "model_complete": True, "model_limit": 0.22308})
    "R 1 by the model, all, model's limit 223.1 ms"
    >>> model_summary({})
    'no model'
    """
    parts = [p.split(":") for p in details.get("model_groups", "").split()]
    if not parts:
        return "no model"

    def span(status: str) -> str:
        rs = [int(r[2:]) for r, s in parts if s == status]
        return "" if not rs else f"R {rs[0]}" if len(rs) == 1 else f"R {rs[0]}-{rs[-1]}" \
            if rs == list(range(rs[0], rs[-1] + 1)) else "R " + ",".join(map(str, rs))

    text = ", ".join(f"{span(s)} {word}" for s, word in (("model", "by the model"), ("target", "by target LPs"))
                     if span(s))
    limit = details.get("model_limit")
    return text + (", all" if details.get("model_complete") else "") + \
        (f", model's limit {1e3 * limit:.1f} ms" if limit is not None else "")


def version2_markdown(row: dict) -> str:
    """One line per version-2 case: each solver's ``plan / bound / gap (bound by, model R solved)``, the best."""
    solvers = list(row["cases"][0]["solvers"]) if row["cases"] else []
    lines = ["| schedule | " + " | ".join(f"{n}: plan / bound / gap (bound by; model)" for n in solvers)
             + " | best v2 | best v1 (1f1b) | v2 <= v1 |", "|" + "---|" * (len(solvers) + 4)]
    v1 = row["version1"]
    for case in row["cases"]:
        cells = [case["name"]]
        for n in solvers:
            r = case["solvers"][n]
            if r.get("iteration_time") is None:
                cells.append(r.get("refused", r.get("status", "-")))
                continue
            d = r["details"]
            how = model_summary(d) if r["status"] != "optimal" or "model_groups" in d else "the search proved it"
            cells.append(f"{1e3 * r['iteration_time']:.1f} / {_fmt(r['lower_bound'] and 1e3 * r['lower_bound'], '.1f')} ms"
                         f" / {_fmt(r['gap'] and 100 * r['gap'], '.2f')} % ({r.get('bound_by') or '-'}; "
                         f"{how})")
        gap = f"{100 * case['gap']:.2f} %" if case["gap"] is not None else "-"
        cells += [f"{1e3 * case['best']:.1f} ms / {gap}" if case["best"] else "-",
                  f"{1e3 * v1['best']:.1f} ms" if v1["best"] else "-", "yes" if case["beats_v1"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def markdown(results: list[dict]) -> str:
    baselines = [n for n in results[0]["solvers"] if n not in EXACT] if results else []
    head = ["L x D (servers)", *(f"{n} time / status / gap / ratio" for n in EXACT if n in results[0]["solvers"]),
            *(f"{n} ratio" for n in baselines)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        cells = [f"{res['layers']} x {res['devices']} ({res['servers']})"]
        for n in EXACT:
            r = res["solvers"].get(n)
            if r is not None:
                gap = f"{100 * r['gap']:.2f} %" if r["gap"] is not None else "-"
                cells.append(f"{r['wall_time']:.2f} s / {r['status']} / {gap} / {_fmt(r['ratio'], '.3f')}")
        cells += [_fmt(res["solvers"][n]["ratio"], ".3f") for n in baselines]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset: " + ", ".join(f"{l}x{d}" for l, d in QUICK))
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact solve (default 60)")
    parser.add_argument("--baseline-limit", type=float, default=10.0, help="seconds per baseline (default 10)")
    parser.add_argument("--all", action="store_true", help="every (layers, devices) pair, not the paired grid")
    parser.add_argument("--pairs", help="explicit pairs, e.g. 16x4,32x8")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--schedules", help="a column per schedule, e.g. gpipe,interleaved-1f1b:2,zbv "
                                            "(v after the colon); all: every case of SCHEDULE_CASES")
    parser.add_argument("--version2", metavar="LxD", help="only the version-2 row for one pair, e.g. 64x16")
    parser.add_argument("--solvers", help="with --version2: comma-separated solvers, e.g. ilp (default: ilp,cpsat)")
    args = parser.parse_args(argv)
    if args.solvers and not args.version2:
        usage_error("error: --solvers: only the version-2 row takes it; add --version2 LxD")
    if args.version2:
        layers, devices = (int(v) for v in args.version2.split("x"))
        row = version2_row(layers, devices, args.time_limit, parse_solvers(args.solvers) if args.solvers else EXACT)
        print(version2_markdown(row))
        if args.out:
            atomic_write_text(args.out, json.dumps(row, indent=1))
        return 0
    cases = (list(SCHEDULE_CASES) if args.schedules == "all" else
             parse_schedules(args.schedules) if args.schedules else [])
    if args.pairs:
        pairs = [tuple(int(v) for v in p.split("x")) for p in args.pairs.split(",")]
    else:
        pairs = QUICK if args.quick else [(l, d) for l in LAYERS for d in DEVICES] if args.all else PAIRS
    results = []
    for layers, devices in pairs:
        res = bench_one(layers, devices, args.time_limit, args.baseline_limit)
        if cases:  # the 1f1b column is the main table's problem: its rows are reused
            res["schedules"] = [{"schedule": "1f1b", "virtual": 1, "name": "1f1b", **best_and_gap(res["solvers"]),
                                 "solvers": res["solvers"]} if (schedule, v) == ("1f1b", 1) else
                                bench_schedule(layers, devices, schedule, v, args.time_limit, args.baseline_limit)
                                for schedule, v in cases]
        results.append(res)
        print(f"done {layers} x {devices}", file=sys.stderr, flush=True)
        if args.out:  # keep partial results of a long run
            atomic_write_text(args.out, json.dumps(results, indent=1))
    print(markdown(results))
    if cases:
        print("\n" + schedule_markdown(results))
    if args.out:
        atomic_write_text(args.out, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
