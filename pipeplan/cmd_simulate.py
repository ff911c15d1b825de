"""``pipeplan simulate GRAPH CLUSTER PLAN``: what a plan costs, as a table, JSON and pictures."""

from __future__ import annotations

import argparse
import json

from pipeplan.models.graph import load_graph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.views.gantt import write_gantt
from pipeplan.solver.bounds.infeasibility import format_bytes
from pipeplan.solver.formats.plan import Plan, load_plan
from pipeplan.solver.evaluation.simulator import Simulation, simulate
from pipeplan.solver.views.trace import check_traceable, chrome_trace
from pipeplan.loading import warn_names
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="time and memory of a plan", description=__doc__)
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument("plan", metavar="PLAN")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (Perfetto)")
    p.add_argument("--gantt", metavar="OUT.png", help="write a Gantt chart")
    add_force_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, args.trace, args.gantt, inputs={"graph": args.graph, "cluster": args.cluster, "plan": args.plan})
    graph = load_graph(args.graph)
    cluster = load_cluster(args.cluster)
    plan = load_plan(args.plan, graph, cluster)
    result = simulate(plan, graph, cluster, file=args.plan, validate=False)
    result.check_finite(args.plan)
    if args.trace:
        check_traceable(result, args.plan)
    for note in warn_names(plan, graph, cluster, args.plan):
        warn(note)
    if args.trace:
        atomic_write_text(args.trace, json.dumps(chrome_trace(result, plan.graph), allow_nan=False))
    if args.gantt:
        write_gantt(result, args.gantt, f"{plan.graph} on {plan.cluster} ({plan.schedule})")
    if args.json:
        print(json.dumps(json_summary(plan, result), allow_nan=False))
    else:
        print_table(plan, result)
    return 0


def json_summary(plan: Plan, result: Simulation) -> dict:
    """The result's summary with each group's program and its devices and stages (lists per group)."""
    summary = result.summary()
    held: list[list[int]] = [[] for _ in plan.groups]
    for s, g in enumerate(plan.stage_groups):
        held[g].append(s)
    summary["groups"] = [{"devices": list(devices), "stages": stages} for devices, stages in zip(plan.groups, held)]
    summary["programs"] = plan.programs()
    return summary


def _split(sizes: tuple[int, ...]) -> str:
    if len(set(sizes)) == 1:
        return f"{len(sizes)} x {sizes[0]}"
    text = ",".join(map(str, sizes))
    return text if len(text) <= 24 else text[:21] + "..."


def _joined(values: list[str]) -> str:
    """One cell for a group's stages: the value they share, else each stage's, comma-separated."""
    return values[0] if len(set(values)) == 1 else ",".join(values)


def print_table(plan: Plan, result: Simulation) -> None:
    """One row per device group: its stages, layers, devices, split, busy time, bubble, all-reduce, step, memory."""
    from rich.table import Table

    groups = len(result.groups)
    title = f"{plan.graph} on {plan.cluster}: {plan.schedule}, batch {plan.global_batch}"
    table = Table(title=title + (f", {groups} groups" if groups < len(plan.stages) else ""))
    for col in ("group", "stages", "layers", "devices", "microbatches", "recompute", "busy (ms)", "bubble",
                "all-reduce (ms)", "step (ms)", "peak memory", "capacity", "fits"):
        table.add_column(col, justify="left" if col in ("stages", "layers", "devices") else "right")
    T = result.iteration_time
    for gi, (group, busy) in enumerate(zip(result.groups, result.busy)):
        held = [plan.stages[s] for s in group.stages]
        bubble = T - busy - group.allreduce - group.step
        table.add_row(str(gi), ",".join(map(str, group.stages)),
                      ",".join(f"{st.layers[0]}..{st.layers[1] - 1}" for st in held), ",".join(group.devices),
                      _joined([_split(st.microbatches) for st in held]),
                      _joined(["yes" if st.recompute else "no" for st in held]), f"{busy * 1e3:.3f}",
                      f"{bubble * 1e3:.3f} ms ({100 * bubble / T:.0f}%)" if T > 0 else "-",
                      f"{group.allreduce * 1e3:.3f}", f"{group.step * 1e3:.3f}", format_bytes(group.peak_memory, 2),
                      format_bytes(group.capacity, 2), "yes" if group.peak_memory <= group.capacity else "NO")
    from rich.console import Console

    console = Console(width=160)
    console.print(table)
    console.print(f"iteration time {result.iteration_time * 1e3:.4f} ms  throughput {result.throughput:.2f} "
                  f"samples/s  bubble {100 * result.bubble_fraction:.1f}%  fits: {'yes' if result.fits else 'NO'}")
