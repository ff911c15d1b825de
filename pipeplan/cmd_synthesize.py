"""``pipeplan synthesize GRAPH CLUSTER PLAN -o OUT``: programs built for a plan's own partition.

Keeps the plan's stages, device groups, splits and recompute, and writes a ``custom``
plan whose programs (each group's order of F, I, W actions) are built from that
partition's own costs, links and memory: by a list scheduler (fast), or with --exact
by a CP-SAT model of the order that proves the best order or gives a bound.  The plan's
own programs are a candidate, so the result is never slower than the plan given.  The
written plan's "synthesis" field says what ran: algorithm, status (optimal only when
proved, over the orders of this partition), lower bound, gap, wall time, seed.
Exit status 3 when no program fits the memory caps (nothing is written).
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.outputs import add_force_option, check_outputs

NO_PROGRAM = 3
"""Exit status when no program fits the memory caps."""

MAX_SEED = 2 ** 31 - 1
"""Largest ``--seed``: CP-SAT's ``random_seed`` is a 32-bit signed integer."""

MAX_WORKERS = 64
"""Most CP-SAT workers accepted."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synthesize", help="build each group's program for a plan's partition",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument("plan", metavar="PLAN", help="a plan of any schedule; its partition is kept")
    p.add_argument("-o", "--output", required=True, metavar="OUT.json", help="the synthesized custom plan")
    p.add_argument("--exact", action="store_true",
                   help="also run the CP-SAT order model from the list scheduler's programs (proof or bound)")
    p.add_argument("--budget", type=float, default=None, metavar="W",
                   help="--exact: CP-SAT deterministic seconds, what decides the result (default 30)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="--exact: wall-clock cap in seconds (default none); a solve it cuts short says so and "
                        "may differ on another machine")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="--exact: CP-SAT workers (default 1)")
    p.add_argument("--seed", type=int, default=0, metavar="K", help="--exact: CP-SAT's seed (default 0)")
    p.add_argument("--memory-fraction", type=float, default=1.0, metavar="F",
                   help="cap each group's memory at this share of its device memory, in (0, 1] (default 1)")
    p.add_argument("--whole-backward", action="store_true",
                   help="run every backward as one B (no I/W split), for runtimes without split backwards")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    add_force_option(p)
    p.set_defaults(func=run)


def check_options(args: argparse.Namespace) -> None:
    """Refuse option values no run could use (``InputError``: one line, exit 2).

    Examples
    --------
    >>> check_options(argparse.Namespace(time_limit=None, budget=None, workers=0, seed=0, memory_fraction=1.0,
    ...                                  exact=True))
    Traceback (most recent call last):
    ...
    pipeplan.models.errors.InputError: -: --workers: must be 1 to 64, got 0
    """
    for flag, value in (("--time-limit", args.time_limit), ("--budget", args.budget)):
        if value is not None and not 0 < value < float("inf"):
            raise InputError("-", flag, f"must be positive and finite, got {value}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise InputError("-", "--workers", f"must be 1 to {MAX_WORKERS}, got {args.workers}")
    if not 0 <= args.seed <= MAX_SEED:
        raise InputError("-", "--seed", f"must be 0 to 2**31-1 = {MAX_SEED}, got {args.seed}")
    if not 0 < args.memory_fraction <= 1:
        raise InputError("-", "--memory-fraction", f"must be in (0, 1] (a share of each device's memory), got "
                                                   f"{args.memory_fraction}")
    if not args.exact:
        given = [flag for flag, value, default in (("--budget", args.budget, None), ("--time-limit", args.time_limit,
                                                   None), ("--workers", args.workers, 1), ("--seed", args.seed, 0))
                 if value != default]
        if given:
            raise InputError("-", given[0], "only applies with --exact (the list scheduler is deterministic and "
                                            "takes no limit); add --exact or drop it")


def run(args: argparse.Namespace) -> int:
    check_options(args)
    check_outputs(args, args.output, inputs={"graph": args.graph, "cluster": args.cluster, "plan": args.plan})
    from pipeplan.solver.core.schedule_synthesis import DEFAULT_WORK, synthesize_plan
    from pipeplan.solver.formats.cluster import load_cluster
    from pipeplan.solver.formats.plan import load_plan

    graph = load_graph(args.graph)
    cluster = load_cluster(args.cluster)
    plan = load_plan(args.plan, graph, cluster)
    made = synthesize_plan(plan, graph, cluster, exact=args.exact,
                           work=DEFAULT_WORK if args.budget is None else args.budget, time_limit=args.time_limit,
                           workers=args.workers, seed=args.seed, memory_fraction=args.memory_fraction,
                           split_backward=not args.whole_backward)
    if not made.fits:
        sys.stderr.write(f"no program fits ({made.record['status']}): {made.reason}\n")
        return NO_PROGRAM
    made.after.check_finite(args.output)
    atomic_write_text(args.output, dumps(made.plan.to_dict()))
    summary = {"before": {"schedule": plan.schedule, "iteration_time": made.before.iteration_time,
                          "fits": made.before.fits},
               "after": {"schedule": made.plan.schedule, "iteration_time": made.after.iteration_time,
                         "fits": made.after.fits},
               "synthesis": made.record, "output": args.output}
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    else:
        print(_summary_text(summary))
    return 0


def _summary_text(summary: dict) -> str:
    """Three lines: the times before and after, and what ran."""
    before, after, rec = summary["before"], summary["after"], summary["synthesis"]
    change = after["iteration_time"] / before["iteration_time"] - 1 if before["iteration_time"] > 0 else 0.0
    fit = "" if before["fits"] else " (does not fit in memory)"
    bound = "-" if rec["lower_bound"] is None else f"{rec['lower_bound'] * 1e3:.4f} ms"
    gap = "-" if rec["gap"] is None else f"{100 * rec['gap']:.2g} %"
    algorithm = rec["algorithm"] + (f", {rec['work']:.2f} of {rec['budget']:g} det. s, stopped by {rec['stopped_by']}"
                                    if rec["algorithm"] == "cpsat-order" else "")
    return (f"before: {before['schedule']} {before['iteration_time'] * 1e3:.4f} ms{fit}\n"
            f"after:  custom {after['iteration_time'] * 1e3:.4f} ms ({100 * change:+.1f} %), written to "
            f"{summary['output']}\n"
            f"{algorithm}: {rec['status']}, bound {bound}, gap {gap}, {rec['wall_time']:.2f} s, seed {rec['seed']}, "
            f"programs from {rec['source']}")
