"""``pipeplan pareto``: the time / memory Pareto front of the ``nsga`` planner.

With ``--schedule adaptive`` each partition of nsga's 1F1B front also gets synthesized
programs at falling memory caps, and the front holds the non-dominated plans of both
(``custom`` plans among them).

Runs NSGA-II (``solver/heuristics/nsga.py``) and writes every non-dominated fitting plan with its
iteration time and peak memory as one JSON file (``pipeplan.pareto/1``), and with
``--plot`` a scatter plot of the front.  Exit status 3 when no plan comes back (the
message says "no plan fits" only when that is proved, as ``pipeplan plan`` does).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.solver.views.figures import pyplot, save_png
from pipeplan.cmd_plan import INTERRUPTED, _common, no_plan, problem_from_args
from pipeplan.solver.bounds.infeasibility import format_bytes, heuristic_no_plan
from pipeplan.solver.core.algorithm import ONE_STAGE_PER_GROUP
from pipeplan.solver.core.problem import PIPELINES
from pipeplan.solver.core.termination import TimeLimit, interruptible
from pipeplan.solver.schedules.schedule import SCHEDULE_CLASSES

if TYPE_CHECKING:  # pymoo: imported where the search runs, not while the parser is built
    from pipeplan.solver.heuristics.nsga import NsgaRun

PARETO_FORMAT = "pipeplan.pareto/1"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pareto", help="NSGA-II time/memory Pareto front of plans", description=__doc__)
    _common(p)
    p.add_argument("-o", "--output", required=True, metavar="FRONT.json")
    p.add_argument("--plot", metavar="FRONT.png", help="also write a plot of the front")
    add_force_option(p)
    p.set_defaults(func=run_pareto)


def front_document(run: NsgaRun, args: argparse.Namespace, stopped_by: str = "budget") -> dict:
    """The JSON object: the problem's names, run facts, and the points fastest first.

    ``stopped_by`` is why the run ended (see :mod:`pipeplan.solver.core.termination`);
    ``stopped_by_time_limit`` says whether the clock cut anything short, and ``time_cut`` what:
    the seeding (a seeding solver's cap) or the generations.
    """
    return {
        "format": PARETO_FORMAT,
        "objectives": ["iteration_time", "peak_memory"],
        "generations": run.generations, "evaluations": run.evaluations,
        "stopped_by_time_limit": bool(run.time_cut), "time_cut": list(run.time_cut), "stopped_by": stopped_by,
        "seed": args.seed,
        "seeds": list(run.seeds),
        "points": [{"iteration_time": pt.iteration_time, "peak_memory": pt.peak_memory, "plan": pt.plan.to_dict()}
                   for pt in run.front],
    }


def _plot(path: str, run: NsgaRun, title: str) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 4))
    xs = [pt.iteration_time * 1e3 for pt in run.front]
    ys = [pt.peak_memory / 1e9 for pt in run.front]
    ax.step(xs, ys, where="post", color="tab:gray", linewidth=0.8)
    ax.scatter(xs, ys, color="tab:blue", zorder=3)
    ax.set_xlabel("iteration time (ms)")
    ax.set_ylabel("peak memory per device (GB)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, path)


def synthesized_front(run: NsgaRun, problem) -> NsgaRun:
    """``run`` with its front replaced by synthesized schedules (``pareto --schedule adaptive``).

    Each partition of nsga's front gets list-scheduled programs at falling memory caps
    (:func:`pipeplan.solver.core.schedule_synthesis.memory_front`); the non-dominated
    ``custom`` plans of them all, with nsga's own plans, make the front.
    """
    from dataclasses import replace

    from pipeplan.solver.core.schedule_synthesis import memory_front, non_dominated
    from pipeplan.solver.heuristics.nsga import FrontPoint

    points = [(pt.iteration_time, pt.peak_memory, pt.plan) for pt in run.front]
    for pt in run.front:
        points += memory_front(pt.plan, problem.graph, problem.cluster)
    return replace(run, front=tuple(FrontPoint(plan, t, m) for t, m, plan in non_dominated(points)))


def run_pareto(args: argparse.Namespace) -> int:
    """``pipeplan pareto``: run NSGA-II and write the front."""
    # pymoo and OR-Tools: imported where the search runs, not while the parser is built
    from pipeplan.solver.heuristics.nsga import time_cut_message
    from pipeplan.solver.planning import why_no_plan
    from pipeplan.solver.solvers import get_solver

    check_outputs(args, args.output, args.plot, inputs={"graph": args.graph, "cluster": args.cluster})
    if args.backend is not None:
        raise InputError("-", "--backend", "chooses the MILP solver of ilp; pareto runs nsga only: drop it")
    synthesized = args.schedule == "adaptive"  # nsga's 1F1B front, each partition's programs synthesized
    named = SCHEDULE_CLASSES.get(args.schedule)  # None for "auto", which may pick a several-stage schedule
    if not synthesized and (named is None or named.several_stages):
        raise InputError("-", "--schedule", f"pareto writes the front of nsga's search over "
                                            f"{' and '.join(ONE_STAGE_PER_GROUP)} plans only; plan {args.schedule} "
                                            f"with pipeplan plan --solver nsga (or cpsat, ilp, group-search)")
    problem = problem_from_args(args, "1f1b" if synthesized else None)
    nsga = get_solver("nsga", population=args.population).algorithms[PIPELINES]
    generations = int(args.budget) if args.budget is not None else args.generations or nsga.generations
    clock = TimeLimit(args.time_limit)
    with interruptible():
        run = nsga.front(problem, clock, generations=generations, seed=args.seed)
    if synthesized:
        run = synthesized_front(run, problem)
    seen = clock.stops
    # every clock check of the run is its seeding's or its generations' (run.time_cut says which)
    stopped_by = seen.stopped_by() if seen.interrupted or seen.time_cut or run.time_cut else "budget"
    if not run.front and seen.interrupted:
        sys.stderr.write("interrupted: no plan found before the interrupt\n")
        return INTERRUPTED
    if not run.front:
        why = ("time limit reached before any evaluated plan fitted" if run.stopped_by_time
               else "no evaluated plan fits in memory")
        result = heuristic_no_plan(problem, "nsga", why, clock.elapsed(), args.seed,
                                   details={"stopped_by_time_limit": bool(run.time_cut), "time_cut": list(run.time_cut)})
        return no_plan(why_no_plan(problem, [result]))  # "no plan fits" only when proved
    atomic_write_text(args.output, dumps(front_document(run, args, stopped_by)))
    if args.plot:
        _plot(args.plot, run, f"{problem.graph.name} on {problem.cluster.name}: batch {problem.global_batch}")
    best = run.front[0]
    why = f" ({time_cut_message(run)})" if stopped_by == "time" and run.time_cut else ""
    print(f"nsga{', programs synthesized' if synthesized else ''}: {len(run.front)} non-dominated plans, fastest {best.iteration_time * 1e3:.4f} ms "
          f"(peak {format_bytes(best.peak_memory, 2)}), {run.generations} of {generations} generations, "
          f"stopped by {stopped_by}{why} -> {args.output}")
    return 0
