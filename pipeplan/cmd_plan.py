"""``pipeplan plan`` and ``pipeplan compare``: solve a planning problem with one solver, or all.

``plan`` writes the best plan with a ``"solver"`` record; ``compare`` runs every
solver and prints a table (or JSON, CSV, a bar chart).  Exit status 3 when no plan
fits, with the tightest memory constraint named on stderr; 2 on bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import textwrap
from typing import Any

from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.views.figures import pyplot, save_png
from pipeplan.solver.views.gantt import write_gantt
from pipeplan.solver.bounds.infeasibility import UNPROVED, memory_verdict
from pipeplan.solver.formats.plan import MAX_SAMPLES
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, VIRTUAL_SCHEDULES, Overflow, PlanningProblem, TooLarge
from pipeplan.solver.core.registry import get_solver, solver_names
from pipeplan.solver.core.result import SolverResult
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.termination import interruptible, interrupted
from pipeplan.solver.core.warm_start import load_warm_start

NO_PLAN = 3
"""Exit status when no plan fits."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument("--batch", type=int, required=True, help="global batch B (samples)")
    p.add_argument("--microbatches", type=_microbatches, required=True, metavar="M|auto",
                   help="M equal microbatches (M <= B), or 'auto': split-aware solvers choose the count")
    p.add_argument("--max-microbatches", type=int, default=None, metavar="K",
                   help="most microbatches a split-aware solver may use (only with auto; default min(B, 8))")
    p.add_argument("--per-stage", action="store_true",
                   help="split-aware solvers may give each stage its own split")
    p.add_argument("--generations", type=int, default=None, metavar="G", help="nsga: generations (default 60)")
    p.add_argument("--population", type=int, default=None, metavar="P", help="nsga: population (default 48)")
    p.add_argument("--backend", choices=("highs", "cbc"), default=None,
                   help="ilp: the MILP solver (default highs, in-process)")
    p.add_argument("--schedule", choices=PLANNED_SCHEDULES + ("auto",), default="1f1b", metavar="NAME",
                   help=f"pipeline schedule: {', '.join(PLANNED_SCHEDULES)}, or auto (plan: each one, the fastest "
                        f"that fits is written; default 1f1b)")
    p.add_argument("--virtual-stages", type=_virtual, default=None, metavar="V|auto",
                   help="stages per device group for interleaved-1f1b, interleaved-zb and looped-bfs "
                        "(default auto: every V that fits); zbv has 2")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds per solver, a cap (default 60); a solve it cuts short may differ on another machine")
    p.add_argument("--budget", type=float, default=None, metavar="N",
                   help="work per solver, in the solver's own unit (nsga: generations; cpsat, cpsat-split: CP-SAT "
                        "deterministic seconds; ilp: HiGHS nodes; group-search: patterns); for ilp and cpsat it "
                        "also scales every counted phase of the exact search by N / the default (walk prefixes, "
                        "table entries, patterns, greedy plans, NSGA-II generations); same budget and seed, "
                        "same plan on any machine (default: each solver's own, see docs/determinism.md)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the randomised solvers (default 0; same seed, same plan)")
    p.add_argument("--no-replication", action="store_true", help="one device per stage")
    p.add_argument("--no-recompute", action="store_true", help="never recompute activations")
    p.add_argument("--max-stages", type=int, default=None, metavar="K",
                   help="most pipeline stages (default: as many as layers and devices allow)")
    p.add_argument("--state-factor", type=float, default=4.0, metavar="F",
                   help="bytes of training state per parameter byte (default 4: fp32 Adam)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan with one solver and write the plan", description=__doc__)
    _common(p)
    p.add_argument("--solver", required=True, metavar="NAME",
                   help="a registered solver: cpsat, ilp, group-search, nsga, cpsat-split, a baseline "
                        "(even, pipedream, alpa, ...); an unknown name lists them all")
    p.add_argument("-o", "--output", required=True, metavar="PLAN.json")
    add_force_option(p)
    p.add_argument("--warm-start", metavar="PLAN.json",
                   help="start from this earlier plan (checked against the problem); the result is never slower")
    p.set_defaults(func=run_plan)
    c = sub.add_parser("compare", help="run every solver and compare", description=__doc__)
    _common(c)
    c.add_argument("--solvers", metavar="A,B,...", help="only these solvers (default: all)")
    c.add_argument("--schedules", metavar="A,B,...",
                   help=f"compare these schedules (or 'all': {', '.join(PLANNED_SCHEDULES)}) instead of --schedule; "
                        f"the table has a row per schedule and solver, the fastest fitting plan is the best")
    c.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    c.add_argument("--csv", metavar="OUT.csv", help="also write the rows as CSV")
    c.add_argument("--plot", metavar="OUT.png", help="also write a bar chart of iteration times")
    c.add_argument("--best", metavar="PLAN.json", help="also write the fastest fitting plan, with its record")
    c.add_argument("--gantt", metavar="OUT.png", help="also write the Gantt chart of the fastest plan")
    add_force_option(c)
    c.set_defaults(func=run_compare)


def _virtual(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of stages per group or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 stage per group, got {value}")
    return value


def _microbatches(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of microbatches or 'auto', got {text!r}") from None


MAX_SEED = 2 ** 31 - 1
"""Largest ``--seed``: CP-SAT's ``random_seed`` is a 32-bit signed integer."""


def check_options(args: argparse.Namespace) -> None:
    """Refuse numeric options no solver could use (``InputError``: one line, exit 2).

    Examples
    --------
    >>> check_options(argparse.Namespace(time_limit=float("nan"), seed=0, state_factor=4.0))
    Traceback (most recent call last):
    ...
    models.errors.InputError: -: --time-limit: must be positive finite seconds, got nan
    """
    from pipeplan.solver.heuristics.nsga import MAX_POPULATION  # pymoo: imported to run, not while the parser is built

    limit, seed, factor = (getattr(args, key, None) for key in ("time_limit", "seed", "state_factor"))
    if limit is not None and not 0 < limit < float("inf"):
        raise InputError("-", "--time-limit", f"must be positive finite seconds, got {limit}")
    budget = getattr(args, "budget", None)
    if budget is not None and not 0 < budget < float("inf"):
        raise InputError("-", "--budget", f"must be a positive finite amount of work, got {budget}")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise InputError("-", "--seed", f"must be 0 to 2**31-1 = {MAX_SEED}, got {seed}")
    if factor is not None and not 0 <= factor < float("inf"):
        raise InputError("-", "--state-factor", f"must be finite and >= 0 (bytes of state per parameter byte; "
                                                f"4 for fp32 Adam), got {factor}")
    if getattr(args, "max_microbatches", None) is not None and getattr(args, "microbatches", "auto") != "auto":
        # with a fixed M every solver uses exactly M microbatches: a ceiling would be ignored
        raise InputError("-", "--max-microbatches", f"only applies with --microbatches auto (got --microbatches "
                                                    f"{args.microbatches}, which fixes the count); drop one of them")
    for flag, least, most in (("generations", 1, None), ("population", 2, MAX_POPULATION), ("batch", 1, MAX_SAMPLES)):
        value = getattr(args, flag, None)
        if value is not None and value < least:
            raise InputError("-", f"--{flag}", f"must be at least {least}, got {value}")
        if value is not None and most is not None and value > most:
            raise InputError("-", f"--{flag}", f"must be at most {most}, got {value}")


def problem_from_args(args: argparse.Namespace, schedule: str | None = None) -> PlanningProblem:
    """The planning problem the common options describe (files loaded and checked), for ``schedule``
    (default ``--schedule``).

    Raises
    ------
    InputError
        On unreadable or invalid files or inconsistent numbers (``M > B``, ...).
    """
    graph = load_graph(args.graph)
    cluster = load_cluster(args.cluster)
    check_options(args)
    auto = args.microbatches == "auto"
    top = getattr(args, "max_microbatches", None)
    # with auto, the seeding baselines use the largest allowed equal split (most pipelining)
    equal = min(args.batch, top or 8) if auto else args.microbatches
    try:
        return PlanningProblem(graph, cluster, global_batch=args.batch, microbatches=equal,
                               schedule=schedule or args.schedule, state_factor=args.state_factor,
                               allow_replication=not args.no_replication, allow_recompute=not args.no_recompute,
                               max_stages=args.max_stages, auto_microbatches=auto,
                               max_microbatches=top if top is not None else (equal if auto else None),
                               per_stage=getattr(args, "per_stage", False),
                               virtual_stages=_virtual_for(args, schedule or args.schedule))
    except Overflow as exc:  # the file at fault: the cluster's speeds and links, or the graph's bytes
        file, where = (args.cluster, "devices and links") if exc.what == "time" else (args.graph, "layers")
        raise InputError(file, where, str(exc)) from None
    except TooLarge as exc:
        file, where = {"graph": (args.graph, "layers"), "cluster": (args.cluster, "devices")}.get(
            exc.role, ("-", "--max-microbatches" if auto else "--microbatches"))
        raise InputError(file, where, str(exc)) from None
    except ValueError as exc:
        raise InputError("-", "arguments", str(exc)) from None


def _virtual_for(args: argparse.Namespace, schedule: str) -> int | None:
    """``--virtual-stages`` where the schedule takes it; with several schedules (auto, ``--schedules``) the
    others keep their own fixed count."""
    v = getattr(args, "virtual_stages", None)
    several = args.schedule == "auto" or getattr(args, "schedules", None)
    return None if several and schedule not in VIRTUAL_SCHEDULES else v


def _solve(problem: PlanningProblem, names: list[str], args: argparse.Namespace,
           warm_start: Plan | None = None, skip_refusals: bool = False) -> list[SolverResult]:
    """Run the named solvers with a progress display on stderr.

    The first SIGINT or SIGTERM stops the running solver, which returns its best plan so
    far (``stopped_by: interrupt``); the solvers after it are not run.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    solvers = [get_solver(n) for n in names]     # unknown names fail before any work
    for solver in solvers:  # the GA's own knobs, where given
        if getattr(args, "generations", None) is not None and hasattr(solver, "generations"):
            solver.generations = args.generations
        if getattr(args, "population", None) is not None and hasattr(solver, "population"):
            solver.population = args.population
        if getattr(args, "backend", None) is not None and hasattr(solver, "backend"):
            solver.backend = args.backend
    results = []
    console = Console(file=sys.stderr)
    with interruptible(), Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                   TimeElapsedColumn(), console=console, transient=True,
                                   disable=not console.is_terminal) as progress:
        task = progress.add_task("solving", total=len(solvers))
        for name, solver in zip(names, solvers):
            if interrupted():
                console.print(f"interrupted: {name} and the solvers after it not run")
                break
            progress.update(task, description=f"solving with {name}")
            try:
                results.append(solver.solve(problem, time_limit=args.time_limit, seed=args.seed,
                                            budget=getattr(args, "budget", None), warm_start=warm_start))
            except InputError as exc:
                if len(solvers) == 1 and not skip_refusals:
                    raise
                # compare: a solver outside its scope (ilp with unequal splits) is left out, said
                warn(f"skipped {name}: {exc.what}")
            progress.advance(task)
    return results


INTERRUPTED = 130
"""Exit status when an interrupt came before any plan was found (128 + SIGINT, as shells use)."""

PROVING = ("ilp", "cpsat")
"""Solvers whose ``infeasible`` is a proof (they search the whole space)."""


def no_plan(problem: PlanningProblem, results: list[SolverResult]) -> int:
    """Say why no plan came back: a proof that none fits, or only that none was found."""
    if any(r.stopped_by == "interrupt" for r in results) or not results:
        sys.stderr.write("interrupted: no plan found before the interrupt\n")
        return INTERRUPTED
    bounds_prove, constraint = memory_verdict(problem)
    if problem.is_v2 and bounds_prove and " alone needs " not in constraint:
        bounds_prove = False  # the model verdict reasons about one stage per device; a layer's alone holds in v2
    # the records' own words follow the first line, without repeating the constraint or "not a proof"
    why = "; ".join(f"{r.name}: {r.message.replace('; ' + UNPROVED, '')}" for r in results
                    if r.message and constraint not in r.message)
    proved = bounds_prove or any(r.status == "infeasible" and r.name in PROVING for r in results)
    if proved:
        sys.stderr.write(f"no plan fits: {constraint}\n")
    else:
        names = ", ".join(r.name for r in results)
        timed_out = any(r.stopped_by == "time" or r.details.get("stopped_by_time_limit") or "time limit" in r.message
                        for r in results)
        sys.stderr.write(f"no plan found: {names} found no fitting plan{' in the time given' if timed_out else ''}, "
                         f"which does not prove that none fits (ilp and cpsat decide it, given time)\n")
    if why:
        sys.stderr.write(f"  ({why})\n")
    return NO_PLAN


def run_plan(args: argparse.Namespace) -> int:
    """``pipeplan plan``: solve with one solver and write the plan atomically.

    With ``--schedule auto`` the solver plans for every schedule and the fastest fitting
    plan is written, after a table of the schedules.
    """
    check_outputs(args, args.output, inputs={"graph": args.graph, "cluster": args.cluster})
    schedules = schedules_from_args(args)
    if len(schedules) > 1:
        return _plan_each_schedule(args, schedules)
    problem = problem_from_args(args)
    warm = load_warm_start(args.warm_start, problem) if args.warm_start else None
    results = _solve(problem, [args.solver], args, warm)
    if not results or results[0].plan is None:
        return no_plan(problem, results)
    _write_plan(problem, results[0], args)
    return 0


def _write_plan(problem: PlanningProblem, result: SolverResult, args: argparse.Namespace) -> None:
    comparison_rows(problem, [result])  # refuses a throughput beyond the float range, before writing
    atomic_write_text(args.output, dumps(result.plan_with_record().to_dict()))
    gap = "-" if result.gap is None else f"{100 * result.gap:.2f}%"
    named = f"{result.plan.schedule}, " if problem.is_v2 or args.schedule == "auto" else ""
    print(f"{result.name}: {result.status}, {named}{len(result.plan.stages)} stages, iteration "
          f"time {result.iteration_time * 1e3:.4f} ms, throughput {_throughput(problem, result.iteration_time)} "
          f"samples/s, gap {gap}, {result.wall_time:.2f} s, stopped by {result.stopped_by} -> {args.output}")


def schedules_from_args(args: argparse.Namespace) -> list[str]:
    """The schedules to plan for: ``--schedules`` (``all`` for every one), every one for ``--schedule auto``,
    else ``--schedule``.

    Raises
    ------
    InputError
        For an unknown name in ``--schedules``, naming the valid ones.
    """
    listed = getattr(args, "schedules", None)
    if listed is not None:
        names = list(PLANNED_SCHEDULES) if listed.strip() == "all" else \
            [n.strip() for n in listed.split(",") if n.strip()]
        unknown = [n for n in names if n not in PLANNED_SCHEDULES]
        if unknown or not names:
            raise InputError("-", "--schedules", f"unknown schedule {unknown[0] if unknown else listed!r}; valid: "
                                                 f"{', '.join(PLANNED_SCHEDULES)} or all")
        return list(dict.fromkeys(names))
    return list(PLANNED_SCHEDULES) if args.schedule == "auto" else [args.schedule]


def _problems(args: argparse.Namespace, schedules: list[str]) -> list[PlanningProblem]:
    """One problem per schedule; a schedule the options rule out is left out, said on stderr."""
    problems = []
    for schedule in schedules:
        try:
            problems.append(problem_from_args(args, schedule))
        except InputError as exc:
            if exc.where != "arguments":
                raise
            warn(f"skipped schedule {schedule}: {exc.what}")
    if not problems:
        raise InputError("-", "--schedules", f"no schedule of {', '.join(schedules)} can be planned with these "
                                             f"options (see the lines above)")
    return problems


def _plan_each_schedule(args: argparse.Namespace, schedules: list[str]) -> int:
    """``plan --schedule auto``: the solver on every schedule, a table, the fastest fitting plan written."""
    if args.warm_start:
        raise InputError("-", "--warm-start", "starts one schedule's search; give --schedule NAME with it")
    problems = _problems(args, schedules)
    pairs = [(problem, result) for problem in problems
             for result in _solve(problem, [args.solver], args, skip_refusals=True)]
    if not any(r.plan is not None for _, r in pairs):
        return no_plan(problems[0], [r for _, r in pairs])
    rows = schedule_rows(pairs)
    _print_table(rows, f"{problems[0].graph.name} on {problems[0].cluster.name}: batch {problems[0].global_batch}, "
                       f"M={problems[0].microbatches}, {args.solver} on each schedule")
    problem, result = min(((p, r) for p, r in pairs if r.plan is not None), key=lambda pr: pr[1].iteration_time)
    _write_plan(problem, result, args)
    return 0


def schedule_rows(pairs: list[tuple[PlanningProblem, SolverResult]]) -> list[dict[str, Any]]:
    """:func:`comparison_rows` over results of several schedules, each row saying its schedule (ratios to the best of all)."""
    rows = comparison_rows(pairs[0][0], [r for _, r in pairs]) if pairs else []
    for row, (problem, _) in zip(rows, pairs):
        row["schedule"] = problem.schedule
    return rows


def _throughput(problem: PlanningProblem, seconds: float) -> str:
    """Samples per second as the plan line prints it (a zero-cost plan has no finite throughput)."""
    return f"{problem.global_batch / seconds:.2f}" if seconds > 0 else "unbounded"


def comparison_rows(problem: PlanningProblem, results: list[SolverResult]) -> list[dict[str, Any]]:
    """One row per solver: status, time, throughput, ratio to the best, bound, gap, wall time."""
    times = [r.iteration_time for r in results if r.iteration_time is not None]
    best = min(times) if times else None
    rows = []
    for r in results:
        t = r.iteration_time
        rows.append({"solver": r.name, "status": r.status, "iteration_time": t,
                     "throughput": problem.global_batch / t if t else None,
                     "ratio_to_best": t / best if t and best else None,
                     "lower_bound": r.lower_bound, "gap": r.gap, "wall_time": r.wall_time,
                     "stages": len(r.plan.stages) if r.plan else None, "stopped_by": r.stopped_by,
                     "message": r.message})
    for row in rows:
        _check_finite_row(row)
    return rows


def _check_finite_row(row: dict[str, Any]) -> None:
    """Refuse a row with a number beyond the float range: JSON, CSV and the table have no infinity.

    The iteration times are finite (the problem's ceiling sees to that); the ratios
    computed from them are not when a time is near 0 (``B / 5e-324``).
    """
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError("-", f"{row['solver']}: {key}", f"is {value} from the iteration time "
                                                             f"{row['iteration_time']:g} s: a cost near 1e-308 in "
                                                             f"the graph or a speed near 1e308 in the cluster "
                                                             f"makes it overflow; use realistic costs and speeds")


def _fmt(value: Any, scale: float = 1.0, digits: int = 4) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    several = len({row.get("schedule") for row in rows}) > 1
    for col in (("schedule",) if several else ()) + ("solver", "status", "iteration (ms)", "throughput (samples/s)",
                                                     "ratio to best", "lower bound (ms)", "gap", "wall (s)"):
        table.add_column(col, justify="left" if col in ("schedule", "solver", "status") else "right")
    for row in rows:
        table.add_row(*((row["schedule"],) if several else ()), row["solver"], row["status"],
                      _fmt(row["iteration_time"], 1e3),
                      _fmt(row["throughput"], 1, 2), _fmt(row["ratio_to_best"], 1, 3),
                      _fmt(row["lower_bound"], 1e3), "-" if row["gap"] is None else f"{100 * row['gap']:.2f}%",
                      _fmt(row["wall_time"], 1, 2))
    Console(width=160).print(table)


def _write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


TITLE_CHARS_PER_INCH = 12
"""Characters of a 10-point title per inch of figure width (wider titles are wrapped, not clipped)."""


def _write_plot(path: str, rows: list[dict[str, Any]], title: str) -> None:
    plt = pyplot()
    solved = [r for r in rows if r["iteration_time"] is not None]
    width = min(max(4.5, 0.7 * len(solved) + 2), 14)
    fig, ax = plt.subplots(figsize=(width, 4.5))
    # one bar per row: a solver's rows under several schedules each get their own (labels name both)
    several = len({r.get("schedule") for r in solved}) > 1
    labels = [f"{r['solver']} ({r['schedule']})" if several else r["solver"] for r in solved]
    ax.bar(range(len(solved)), [r["iteration_time"] * 1e3 for r in solved], color="tab:blue")
    ax.set_xticks(range(len(solved)), labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("\n".join(textwrap.wrap(title, int(TITLE_CHARS_PER_INCH * width))), fontsize=10)
    fig.tight_layout()
    save_png(fig, path)


def compare_title(problems: list[PlanningProblem]) -> str:
    """The graph, cluster, batch, microbatch choice and schedules of a comparison.

    Examples
    --------
    >>> from pipeplan.models.graph import load_graph
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> p = PlanningProblem(load_graph("examples/chain8.graph.json"), load_cluster("examples/two-servers.cluster.json"),
    ...                     global_batch=64, microbatches=8, auto_microbatches=True, max_microbatches=16)
    >>> compare_title([p])
    'chain8 on two-servers: batch 64, microbatches auto (up to 16), 1f1b'
    """
    first = problems[0]
    if first.auto_microbatches:
        split = f"microbatches auto (up to {max(first.split_counts)})"
    else:
        split = f"{first.microbatches} microbatches"
    if first.per_stage:
        split += ", per stage"
    return (f"{first.graph.name} on {first.cluster.name}: batch {first.global_batch}, {split}, "
            f"{', '.join(p.schedule for p in problems)}")


def run_compare(args: argparse.Namespace) -> int:
    """``pipeplan compare``: run every (or the chosen) solver and report side by side.

    With ``--schedules`` (or ``--schedule auto``) every solver runs on every schedule; the
    table has a row per schedule and solver, and the best plan is the fastest of all.
    """
    check_outputs(args, args.csv, args.plot, args.best, args.gantt, inputs={"graph": args.graph, "cluster": args.cluster})
    schedules = schedules_from_args(args)
    problems = _problems(args, schedules) if len(schedules) > 1 else [problem_from_args(args)]
    valid = solver_names()
    names = valid if args.solvers is None else [n.strip() for n in args.solvers.split(",") if n.strip()]
    if not names:
        raise InputError("-", "--solvers", f"names no solver (got {args.solvers!r}); valid: {', '.join(valid)}")
    unknown = [name for name in names if name not in valid]
    if unknown:  # here, not in get_solver, so that the error names the option given
        raise InputError("-", "--solvers", f"unknown solver {unknown[0]!r}; valid: {', '.join(valid)}")
    pairs = [(problem, result) for problem in problems
             for result in _solve(problem, names, args, skip_refusals=len(problems) > 1)]
    if all(r.plan is None for _, r in pairs):
        return no_plan(problems[0], [r for _, r in pairs])
    rows = schedule_rows(pairs)
    title = compare_title(problems)
    if args.json:
        print(json.dumps(rows))
    else:
        _print_table(rows, title)
    if args.csv:
        _write_csv(args.csv, rows)
    if args.plot:
        _write_plot(args.plot, rows, title)
    _write_best(pairs, args)
    return 0


def _write_best(pairs: list[tuple[PlanningProblem, SolverResult]], args: argparse.Namespace) -> None:
    """Write the fastest plan (``--best``) and its Gantt chart (``--gantt``), if asked."""
    if not (args.best or args.gantt):
        return
    problem, best = min(((p, r) for p, r in pairs if r.plan is not None), key=lambda pr: pr[1].iteration_time)
    if args.best:
        atomic_write_text(args.best, dumps(best.plan_with_record().to_dict()))
    if args.gantt:
        write_gantt(problem.evaluate(best.plan), args.gantt, f"{problem.graph.name} on {problem.cluster.name}, "
                                                             f"best: {best.name}")
    named = f"{best.plan.schedule}, " if len({p.schedule for p, _ in pairs}) > 1 else ""
    print(f"best: {best.name}, {named}{best.iteration_time * 1e3:.4f} ms"
          + (f" -> {args.best}" if args.best else "") + (f", {args.gantt}" if args.gantt else ""),
          file=sys.stderr if args.json else sys.stdout)  # --json keeps stdout one JSON value
