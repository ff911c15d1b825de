"""``pipeplan export PLAN --to TARGET --graph GRAPH -o OUT``: the files another runtime trains the plan with.

Targets: ``torch`` (a folder with ``train.py`` for torch.distributed.pipelining),
``torchtitan`` (its config: a Python config module for 0.3, a TOML file for 0.2),
``deepspeed`` (a ``PipelineModule`` subclass with the exact boundaries, its config and a
``train.py``), ``megatron`` (the layout string and flags).  A
plan the target cannot run is refused with one ``error:`` line naming the stage and
the reason, and nothing is written; ``--allow-approximate`` exports the nearest plan
it runs instead, with one warning per change and both plans' simulated times.
Version-2 plans (several stages per device group, split backwards) export as the
target's own multi-stage schedule or are refused (docs/export.md).
"""

from __future__ import annotations

import argparse
import os
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
    p.add_argument("--torchtitan-version", metavar="X.Y",
                   help="torchtitan release to write for: 0.3 (a config module for --module) or 0.2 (a TOML "
                        "file); default the installed one, else 0.3")
    p.add_argument("--torchtitan-model", metavar="MODEL",
                   help="torchtitan's model the plan's module names must match: MODULE:CONFIG of its config "
                        "registry for 0.3 (default llama3:llama3_debugmodel), NAME:FLAVOR for 0.2 (default "
                        "llama3:debugmodel)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="folder to write (created if missing)")
    add_force_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeplan.runtime.export import export_plan  # torch: imported where an export runs, not for --help

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(args.output, "output", "is a file; name a folder (it is created if missing)")
    above = next((folder for folder in out.parents if folder.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(args.output, "output", f"{str(above)!r} is a file, not a folder")
    graph = load_graph(args.graph)
    cluster = load_cluster(args.cluster) if args.cluster else None
    plan = load_plan(args.plan, graph, cluster)
    if plan.graph != graph.name:
        warn(f"warning: {args.plan}: graph: plan was made for graph {plan.graph!r}, exporting it on "
             f"{graph.name!r}")
    if args.to != "torchtitan" and (args.torchtitan_version or args.torchtitan_model):
        raise InputError("-", "--torchtitan-version" if args.torchtitan_version else "--torchtitan-model",
                         f"applies to --to torchtitan, not --to {args.to}: drop it")
    result = export_plan(plan, graph, args.to, model=args.model, plan_file=args.plan, graph_file=args.graph,
                         approximate=args.allow_approximate, torchtitan_version=args.torchtitan_version,
                         torchtitan_model=args.torchtitan_model)
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
    if out.is_dir():
        check_outputs(args, *(out / name for name in result.files),
                      inputs={"plan": args.plan, "graph": args.graph, "cluster": args.cluster})
    elif not os.access(above or Path("."), os.W_OK):  # the folders are made below the nearest that exists
        raise InputError(args.output, "output", f"folder {str(above or Path('.'))!r} is not writable")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in result.files.items():
        atomic_write_text(out / name, text)
    print(f"wrote {', '.join(str(out / name) for name in result.files)}")
    return 0
