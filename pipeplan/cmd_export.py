"""``pipeplan export PLAN --to TARGET --graph GRAPH -o OUT``: the files another runtime trains the plan with.

Targets: ``torch`` (a folder with ``train.py`` for torch.distributed.pipelining),
``torchtitan`` (a TOML fragment), ``deepspeed`` (``PipelineModule`` arguments and a
subclass with the exact boundaries), ``megatron`` (the layout string and flags).  A
plan the target cannot run is refused with one ``error:`` line naming the stage and
the reason, and nothing is written; ``--allow-approximate`` exports the nearest plan
it runs instead, with one warning per change and both plans' simulated times.
Version-2 plans (several stages per device group, split backwards) export as the
target's own multi-stage schedule or are refused (docs/export.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import load_plan
from pipeplan.solver.evaluation.simulator import simulate


EXPORT_TARGETS = ("deepspeed", "megatron", "torch", "torchtitan")
"""``--to`` choices: the names of :data:`pipeplan.runtime.export.TARGETS` (that package imports torch, which
building the parser must not; a test holds the two equal)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write the files another runtime trains a plan with",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("plan", metavar="PLAN", help="plan to export")
    p.add_argument("--to", required=True, choices=EXPORT_TARGETS, help="target runtime")
    p.add_argument("--graph", required=True, metavar="GRAPH", help="the plan's layer graph")
    p.add_argument("--model", metavar="SPEC", help="model train.py builds by default (torch; default: the model "
                                                   "the graph was profiled from)")
    p.add_argument("--allow-approximate", action="store_true",
                   help="export the nearest plan the target runs instead of refusing (needs --cluster)")
    p.add_argument("--cluster", metavar="CLUSTER", help="cluster, for the simulated times of both plans")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="folder to write (created if missing)")
    add_force_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeplan.runtime.export import export_plan  # torch: imported where an export runs, not for --help

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(args.output, "output", "is a file; name a folder (it is created if missing)")
    if not out.parent.is_dir():
        raise InputError(args.output, "output", f"folder {str(out.parent)!r} does not exist")
    graph = load_graph(args.graph)
    cluster = load_cluster(args.cluster) if args.cluster else None
    plan = load_plan(args.plan, graph, cluster)
    if plan.graph != graph.name:
        warn(f"warning: {args.plan}: graph: plan was made for graph {plan.graph!r}, exporting it on "
             f"{graph.name!r}")
    model = args.model or _profiled_model(graph) or graph.name
    result = export_plan(plan, graph, args.to, model=model, plan_file=args.plan, graph_file=args.graph,
                         approximate=args.allow_approximate)
    if result.changes:
        if cluster is None:
            raise InputError("-", "--cluster", f"{args.plan} needs {len(result.changes)} change(s) for "
                                               f"{args.to}; name the cluster so both plans' times can be simulated")
        for change in result.changes:
            warn(f"warning: {args.plan}: {change.where}: {change.what}")
        before = simulate(plan, graph, cluster, file=args.plan).iteration_time
        after = simulate(result.plan, graph, cluster, file=args.plan).iteration_time
        warn(f"warning: {args.plan}: simulated iteration time {before * 1e3:.3f} ms as planned, "
             f"{after * 1e3:.3f} ms as exported ({after / before:.3f}x)")
    for name in result.files:
        if (out / name).is_dir():
            raise InputError(str(out / name), "output", "is a folder, not a file name")
    check_outputs(args, *((out / name for name in result.files) if out.is_dir() else (out,)),
                  inputs={"plan": args.plan, "graph": args.graph, "cluster": args.cluster})
    out.mkdir(exist_ok=True)
    for name, text in result.files.items():
        atomic_write_text(out / name, text)
    print(f"wrote {', '.join(str(out / name) for name in result.files)}")
    return 0


def _profiled_model(graph) -> str | None:
    profile = graph.extra.get("profile")
    model = profile.get("model") if isinstance(profile, dict) else None
    return model if isinstance(model, str) else None
