"""``pipeplan validate FILE...``: check graphs, clusters and plans against the spec."""

from __future__ import annotations

import argparse

from solver.simulator import check_deadlock_free
from pipeplan.loading import load_any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check graph, cluster and plan files",
                       description="Check each file against the spec. Plans are also checked against "
                                   "the graph and cluster given with them (when exactly one of each is given) "
                                   "and for deadlocks.")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = [(path, *load_any(path)) for path in args.files]
    graphs = [obj for _, kind, obj in loaded if kind == "graph"]
    clusters = [obj for _, kind, obj in loaded if kind == "cluster"]
    graph = graphs[0] if len(graphs) == 1 else None
    cluster = clusters[0] if len(clusters) == 1 else None
    for path, kind, obj in loaded:
        detail = ""
        if kind == "plan":
            obj.validate(graph, cluster, path)
            check_deadlock_free(obj, path)
            checked = [name for name, x in (("graph", graph), ("cluster", cluster)) if x is not None]
            detail = f", {len(obj.stages)} stages, no deadlock" + (f", checked against the {' and '.join(checked)}"
                                                                  if checked else "")
        elif kind == "graph":
            detail = f", {len(obj)} layers, {len(obj.edges)} edges"
        else:
            detail = f", {len(obj.devices)} devices on {len(obj.servers)} servers"
        print(f"ok: {path}: {kind} {obj.name if kind != 'plan' else ''}".rstrip() + detail)
    return 0

