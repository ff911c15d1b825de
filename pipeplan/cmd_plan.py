"""``pipeplan plan`` and ``pipeplan compare``: solve a planning problem with one solver, or all.

``plan`` writes the best plan with a ``"solver"`` record; ``compare`` runs every
solver and prints a table (or JSON, CSV, a bar chart).  Exit status 3 when no plan
fits, with the tightest memory constraint named on stderr; 2 on bad input.  The
planning itself (which problems, which solvers, the fastest plan, why none came back)
is :mod:`pipeplan.solver.planning`'s; this module reads the options and writes the outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
import textwrap
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph, load_graph
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.solver.core.problem import (PLANNED_SCHEDULES, TENSOR_PARALLEL_MODES, ZERO_CHOICES, Overflow,
                                          PlanningProblem, TooLarge)
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import interruptible
from pipeplan.solver.core.warm_start import load_warm_start
from pipeplan.solver.formats.cluster import Cluster, load_cluster
from pipeplan.solver.formats.plan import MAX_SAMPLES
from pipeplan.solver.views.figures import pyplot, save_png
from pipeplan.solver.views.gantt import write_gantt

if TYPE_CHECKING:  # the solvers import pymoo and OR-Tools: imported where planning runs, not while the parser is built
    from pipeplan.solver.planning import NoPlan, Planned, Skipped

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
    p.add_argument("--schedule", choices=PLANNED_SCHEDULES + ("adaptive", "auto"), default="1f1b", metavar="NAME",
                   help=f"pipeline schedule: {', '.join(PLANNED_SCHEDULES)}; adaptive (partitions searched with "
                        f"programs synthesized for each, written as a custom plan); or auto (plan: each one, "
                        f"adaptive included, the fastest that fits is written; default 1f1b)")
    p.add_argument("--memory-fraction", type=float, default=1.0, metavar="F",
                   help="plan within F x each device's memory, 0 < F <= 1, for headroom (default 1)")
    p.add_argument("--adaptive-evaluations", type=int, default=None, metavar="N",
                   help="adaptive: most partitions the list scheduler builds programs for (default 120)")
    p.add_argument("--order-work", type=float, default=None, metavar="S",
                   help="adaptive: CP-SAT deterministic seconds of the exact order model on the final partition "
                        "(default 30)")
    p.add_argument("--virtual-stages", type=_virtual, default=None, metavar="V|auto",
                   help="stages per device group for interleaved-1f1b, interleaved-zb and looped-bfs "
                        "(default auto: every V that fits); zbv has 2")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds per solver, a cap (default 60); a solve it cuts short may differ on another machine")
    p.add_argument("--budget", type=float, default=None, metavar="N",
                   help="work per solver, in the unit of the algorithm it runs (nsga: generations; cpsat, "
                        "cpsat-split: CP-SAT deterministic seconds; ilp: HiGHS nodes; group-search: patterns; "
                        "virtual-bnb, and group-search on interleaved, looped or zbv: simulations); for ilp and cpsat it "
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


def _tensor_options(p: argparse.ArgumentParser) -> None:
    """``--tensor-parallel``, ``--max-tensor-parallel``, ``--zero`` and ``--max-zero`` (plan and compare)."""
    p.add_argument("--tensor-parallel", choices=TENSOR_PARALLEL_MODES, default="1",
                   help="tensor-parallel degrees the solver chooses: 1 (none, default), uniform (one degree for "
                        "every stage, as the Megatron-LM and torchtitan exports need) or per-stage (each device "
                        "group its own); a replica's devices sit in one server (docs/model.md 8); the solver runs "
                        "once per degree and state hint, each run with the whole --budget (docs/solvers.md)")
    p.add_argument("--max-tensor-parallel", type=int, default=8, metavar="T",
                   help="largest degree tried; degrees divide a server's device count (default 8)")
    p.add_argument("--zero", choices=ZERO_CHOICES, default="0",
                   help="ZeRO level of every stage (0 default, 1: optimizer state sharded, 2: gradients too), or "
                        "auto: per stage, 1 where it has several replicas and 2 where a group fits only so "
                        "(docs/solvers.md)")
    p.add_argument("--max-zero", type=int, choices=(1, 2), default=2,
                   help="highest level --zero auto may choose (1 for DeepSpeed's pipeline engine; default 2)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan with one solver and write the plan", description=__doc__)
    _common(p)
    _tensor_options(p)
    p.add_argument("--solver", required=True, metavar="NAME",
                   help="a registered solver: cpsat, ilp, group-search, nsga, cpsat-split, virtual-bnb, a "
                        "baseline (even, pipedream, alpa, ...); an unknown name lists them all (docs/solvers.md: "
                        "the algorithm each runs per schedule)")
    p.add_argument("-o", "--output", required=True, metavar="PLAN.json")
    add_force_option(p)
    p.add_argument("--warm-start", metavar="PLAN.json",
                   help="start from this earlier plan (checked against the problem); the result is never slower")
    p.set_defaults(func=run_plan)
    c = sub.add_parser("compare", help="run every solver and compare", description=__doc__)
    _common(c)
    _tensor_options(c)
    c.add_argument("--solvers", metavar="A,B,...",
                   help="only these solvers (default: every one that plans one of the schedules)")
    c.add_argument("--schedules", metavar="A,B,...",
                   help=f"compare these schedules (or 'all': {', '.join(PLANNED_SCHEDULES)}, adaptive) instead of "
                        f"--schedule; "
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
    fraction = getattr(args, "memory_fraction", None)
    if fraction is not None and not 0 < fraction <= 1:
        raise InputError("-", "--memory-fraction", f"must be in (0, 1] (the share of each device's memory plans may "
                                                   f"use), got {fraction}")
    evaluations = getattr(args, "adaptive_evaluations", None)
    if evaluations is not None and evaluations < 1:
        raise InputError("-", "--adaptive-evaluations", f"must be at least 1 partition, got {evaluations}")
    work = getattr(args, "order_work", None)
    if work is not None and not 0 < work < float("inf"):
        raise InputError("-", "--order-work", f"must be positive finite deterministic seconds, got {work}")
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
    from pipeplan.solver.planning import problem_for, with_memory_fraction

    graph, cluster = _inputs(args)
    with _as_input_errors(args):
        cluster = with_memory_fraction(cluster, getattr(args, "memory_fraction", 1.0))
        return problem_for(graph, cluster, schedule=schedule or args.schedule,
                           virtual_stages=getattr(args, "virtual_stages", None), **_problem_options(args))


def _inputs(args: argparse.Namespace) -> tuple[LayerGraph, Cluster]:
    """The graph and the cluster, loaded and checked, and the options checked."""
    graph, cluster = load_graph(args.graph), load_cluster(args.cluster)
    check_options(args)
    return graph, cluster


def _problem_options(args: argparse.Namespace) -> dict[str, Any]:
    """The problem fields the common options give (all but the schedule and ``--virtual-stages``)."""
    return {"batch": args.batch, "microbatches": args.microbatches, "state_factor": args.state_factor,
            "allow_replication": not args.no_replication, "allow_recompute": not args.no_recompute,
            "max_stages": args.max_stages, "max_microbatches": getattr(args, "max_microbatches", None),
            "per_stage": getattr(args, "per_stage", False),
            **{key: getattr(args, key) for key in ("tensor_parallel", "max_tensor_parallel", "zero", "max_zero")
               if hasattr(args, key)}}


def adaptive_from_args(args: argparse.Namespace) -> Any:
    """How ``adaptive`` searches (:class:`pipeplan.solver.planning.AdaptiveOptions`), from the options."""
    from pipeplan.solver.planning import AdaptiveOptions

    given = {key: value for key, value in (("evaluations", getattr(args, "adaptive_evaluations", None)),
                                           ("work", getattr(args, "order_work", None))) if value is not None}
    return AdaptiveOptions(memory_fraction=getattr(args, "memory_fraction", 1.0), **given)


def _solver_options(args: argparse.Namespace) -> dict[str, Any]:
    """The solvers' own settings the options give (``--generations``, ``--population``, ``--backend``)."""
    return {key: getattr(args, key, None) for key in ("generations", "population", "backend")}


@contextlib.contextmanager
def _as_input_errors(args: argparse.Namespace) -> Iterator[None]:
    """A problem's refusal as the one-line error of the input at fault."""
    auto = args.microbatches == "auto"
    try:
        yield
    except Overflow as exc:  # the file at fault: the cluster's speeds and links, or the graph's bytes
        file, where = (args.cluster, "devices and links") if exc.what == "time" else (args.graph, "layers")
        raise InputError(file, where, str(exc)) from None
    except TooLarge as exc:
        file, where = {"graph": (args.graph, "layers"), "cluster": (args.cluster, "devices")}.get(
            exc.role, ("-", "--max-microbatches" if auto else "--microbatches"))
        raise InputError(file, where, str(exc)) from None
    except InputError:
        raise
    except ValueError as exc:
        several = len(schedules_from_args(args)) > 1
        raise InputError("-", "--schedules" if several else "arguments", str(exc)) from None


def schedules_from_args(args: argparse.Namespace) -> list[str]:
    """The schedules to plan for: ``--schedules`` (``all`` for every one), every one for ``--schedule auto``,
    else ``--schedule``.

    Raises
    ------
    InputError
        For an unknown name in ``--schedules``, naming the valid ones.
    """
    from pipeplan.solver.planning import schedules_for

    listed = getattr(args, "schedules", None)
    if listed is None:
        return schedules_for(args.schedule)
    names = "all" if listed.strip() == "all" else [n.strip() for n in listed.split(",") if n.strip()]
    try:
        return schedules_for(names)
    except ValueError as exc:
        raise InputError("-", "--schedules", f"{str(exc).replace(repr(''), repr(listed))} or all") from None


INTERRUPTED = 130
"""Exit status when an interrupt came before any plan was found (128 + SIGINT, as shells use)."""


def no_plan(verdict: NoPlan) -> int:
    """Say why no plan came back (:class:`pipeplan.solver.planning.NoPlan`): a proof that none fits, or only
    that none was found; the exit status."""
    if verdict.kind == "interrupted":
        sys.stderr.write("interrupted: no plan found before the interrupt\n")
        return INTERRUPTED
    if verdict.kind == "proved":
        sys.stderr.write(f"no plan fits: {verdict.constraint}\n")
    else:
        sys.stderr.write(f"no plan found: {', '.join(verdict.solvers)} found no fitting plan"
                         f"{' in the time given' if verdict.timed_out else ''}, which does not prove that none fits "
                         f"(ilp and cpsat decide it, given time)\n")
    if verdict.reasons:  # the records' own words follow the first line
        sys.stderr.write(f"  ({'; '.join(verdict.reasons)})\n")
    return NO_PLAN


@contextlib.contextmanager
def _progress(count: int) -> Iterator[Callable[[str, str], None]]:
    """A progress display on stderr while ``count`` solves run; the first SIGINT or SIGTERM stops the running
    solver, which returns its best plan so far (``stopped_by: interrupt``); the solvers after it are not run."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)
    with interruptible(), Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                   TimeElapsedColumn(), console=console, transient=True,
                                   disable=not console.is_terminal) as progress:
        task = progress.add_task("solving", total=count)
        started = [False]

        def on_solve(solver: str, schedule: str) -> None:
            if started[0]:
                progress.advance(task)
            started[0] = True
            progress.update(task, description=f"solving with {solver} ({schedule})")

        yield on_solve


def _report(done: Planned) -> None:
    """What was skipped and what an interrupt left unrun, on stderr (held until the command succeeds)."""
    for skipped in done.skipped:
        warn(f"skipped {skipped.solver}: {skipped.reason}" if skipped.solver
             else f"skipped schedule {skipped.schedule}: {skipped.reason}")
    if done.not_run:
        sys.stderr.write(f"interrupted: {done.not_run} and the solvers after it not run\n")


def _problems(args: argparse.Namespace, schedules: list[str]) -> tuple[list[PlanningProblem], list[Skipped]]:
    """One problem per schedule (:func:`pipeplan.solver.planning.problems_for`), refusals as one-line errors."""
    from pipeplan.solver.planning import problems_for

    graph, cluster = _inputs(args)
    with _as_input_errors(args):
        return problems_for(graph, cluster, schedules, virtual_stages=getattr(args, "virtual_stages", None),
                            memory_fraction=getattr(args, "memory_fraction", 1.0), **_problem_options(args))


def run_plan(args: argparse.Namespace) -> int:
    """``pipeplan plan``: solve with one solver and write the plan atomically (:func:`pipeplan.solver.planning.plan`).

    With ``--schedule auto`` the solver plans for every schedule and the fastest fitting
    plan is written, after a table of the schedules.
    """
    from pipeplan.solver.planning import finite_rows, plan_problems

    check_outputs(args, args.output, inputs={"graph": args.graph, "cluster": args.cluster})
    schedules = schedules_from_args(args)
    if args.warm_start and len(schedules) > 1:
        raise InputError("-", "--warm-start", "starts one schedule's search; give --schedule NAME with it")
    problems, skipped = _problems(args, schedules)
    warm = load_warm_start(args.warm_start, problems[0]) if args.warm_start else None
    with _progress(len(problems)) as on_solve:
        done = plan_problems(problems, args.solver, time_limit=args.time_limit, seed=args.seed, budget=args.budget,
                             warm_start=warm, solver_options=_solver_options(args), skipped=skipped,
                             on_solve=on_solve, schedules=schedules, adaptive=adaptive_from_args(args))
    _report(done)
    if done.best is None:
        return no_plan(done.no_plan)
    several = len(schedules) > 1
    if several:
        first = problems[0]
        _print_table(finite_rows(done.rows(with_schedule=True)),
                     f"{first.graph.name} on {first.cluster.name}: batch {first.global_batch}, M={first.microbatches}, "
                     f"{args.solver} on each schedule")
    _write_plan(done.best.problem, done.best.result, args, named=several or done.best.schedule == "adaptive")
    return 0


def _write_plan(problem: PlanningProblem, result: SolverResult, args: argparse.Namespace, named: bool) -> None:
    """Write ``result``'s plan with its record and print one line: the solver (and the algorithm it ran, when
    another), the status, the schedule (with several, or when its groups hold several stages), the stages,
    the time, the throughput, the gap."""
    from pipeplan.solver.planning import Outcome, Planned, finite_rows

    finite_rows(Planned((problem,), (Outcome(problem, result),)).rows())  # refuses a throughput beyond the float range
    atomic_write_text(args.output, dumps(result.plan_with_record().to_dict()))
    gap = "-" if result.gap is None else f"{100 * result.gap:.2f}%"
    schedule = f"{result.plan.schedule}, " if named or problem.needs.several_stages else ""
    via = f" via {result.algorithm}" if result.algorithm != result.name else ""
    print(f"{result.name}{via}: {result.status}, {schedule}{len(result.plan.stages)} stages, iteration "
          f"time {result.iteration_time * 1e3:.4f} ms, throughput {_throughput(problem, result.iteration_time)} "
          f"samples/s, gap {gap}, {result.wall_time:.2f} s, stopped by {result.stopped_by} -> {args.output}")


def _throughput(problem: PlanningProblem, seconds: float) -> str:
    """Samples per second as the plan line prints it (a zero-cost plan has no finite throughput)."""
    return f"{problem.global_batch / seconds:.2f}" if seconds > 0 else "unbounded"


def _fmt(value: Any, scale: float = 1.0, digits: int = 4) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    several = len({row.get("schedule") for row in rows}) > 1
    via = any(row["algorithm"] != row["solver"] for row in rows)  # a solver that runs another algorithm here
    for col in (("schedule",) if several else ()) + ("solver",) + (("algorithm",) if via else ()) + (
            "status", "iteration (ms)", "throughput (samples/s)", "ratio to best", "lower bound (ms)", "gap",
            "wall (s)"):
        table.add_column(col, justify="left" if col in ("schedule", "solver", "algorithm", "status") else "right")
    for row in rows:
        table.add_row(*((row["schedule"],) if several else ()), row["solver"],
                      *((row["algorithm"],) if via else ()), row["status"],
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


def compare_title(problems: list[PlanningProblem], schedules: list[str] | None = None) -> str:
    """The graph, cluster, batch, microbatch choice and schedules of a comparison (``schedules``: the names
    requested, when not the problems' own, as with ``adaptive``).

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
            f"{', '.join(schedules or [p.schedule for p in problems])}")


def run_compare(args: argparse.Namespace) -> int:
    """``pipeplan compare``: run every (or the chosen) solver and report side by side
    (:func:`pipeplan.solver.planning.compare`).

    With ``--schedules`` (or ``--schedule auto``) every solver runs on every schedule; the
    table has a row per schedule and solver, and the best plan is the fastest of all.
    """
    from pipeplan.solver.planning import compare_problems, finite_rows
    from pipeplan.solver.solvers import solver_names

    check_outputs(args, args.csv, args.plot, args.best, args.gantt, inputs={"graph": args.graph, "cluster": args.cluster})
    schedules = schedules_from_args(args)
    valid = solver_names()
    names = None if args.solvers is None else [n.strip() for n in args.solvers.split(",") if n.strip()]
    if names is not None and not names:
        raise InputError("-", "--solvers", f"names no solver (got {args.solvers!r}); valid: {', '.join(valid)}")
    unknown = [name for name in names or () if name not in valid]
    if unknown:  # here, not in get_solver, so that the error names the option given
        raise InputError("-", "--solvers", f"unknown solver {unknown[0]!r}; valid: {', '.join(valid)}")
    problems, skipped = _problems(args, schedules)
    with _progress(len(problems) * len(names or valid)) as on_solve:
        done = compare_problems(problems, names, time_limit=args.time_limit, seed=args.seed, budget=args.budget,
                                solver_options=_solver_options(args), skipped=skipped, on_solve=on_solve,
                                schedules=schedules, adaptive=adaptive_from_args(args))
    _report(done)
    if done.best is None:
        return no_plan(done.no_plan)
    rows = finite_rows(done.rows())
    title = compare_title(problems, schedules)
    if args.json:
        print(json.dumps(rows))
    else:
        _print_table(rows, title)
    if args.csv:
        _write_csv(args.csv, rows)
    if args.plot:
        _write_plot(args.plot, rows, title)
    _write_best(done, args)
    return 0


def _write_best(done: Planned, args: argparse.Namespace) -> None:
    """Write the fastest plan (``--best``) and its Gantt chart (``--gantt``), if asked."""
    if not (args.best or args.gantt):
        return
    problem, best = done.best.problem, done.best.result
    if args.best:
        atomic_write_text(args.best, dumps(best.plan_with_record().to_dict()))
    if args.gantt:
        write_gantt(problem.evaluate(best.plan), args.gantt, f"{problem.graph.name} on {problem.cluster.name}, "
                                                             f"best: {best.name}")
    named = f"{best.plan.schedule}, " if len(done.problems) > 1 else ""
    print(f"best: {best.name}, {named}{best.iteration_time * 1e3:.4f} ms"
          + (f" -> {args.best}" if args.best else "") + (f", {args.gantt}" if args.gantt else ""),
          file=sys.stderr if args.json else sys.stdout)  # --json keeps stdout one JSON value
