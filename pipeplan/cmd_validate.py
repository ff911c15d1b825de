"""``pipeplan validate FILE...``: check graphs, clusters and plans against the spec."""

from __future__ import annotations

import argparse
from typing import Any

from pipeplan.solver.evaluation.simulator import check_deadlock_free, simulate
from pipeplan.loading import load_any
from pipeplan.notices import warn


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check graph, cluster and plan files",
                       description="Check each file against the spec. Plans are also checked for "
                                   "deadlocks and against the graph and cluster given with them (the one "
                                   "given, or among several the one the plan names).")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = [(path, *load_any(path)) for path in args.files]
    graphs = [obj for _, kind, obj in loaded if kind == "graph"]
    clusters = [obj for _, kind, obj in loaded if kind == "cluster"]
    lines = []  # printed once every file passed: a failing run prints its one error line alone
    for path, kind, obj in loaded:
        detail = ""
        if kind == "plan":
            graphs_for = _partners(graphs, obj.graph, "graph", path)
            clusters_for = _partners(clusters, obj.cluster, "cluster", path)
            for graph in graphs_for:
                for cluster in clusters_for:
                    obj.validate(graph, cluster, path)
            check_deadlock_free(obj, path)
            for graph in graphs_for:
                for cluster in clusters_for:
                    if graph is not None and cluster is not None:  # what simulate would refuse, refused here
                        simulate(obj, graph, cluster, file=path, validate=False).check_finite(path)
            checked = [name for name, xs in (("graph", graphs_for), ("cluster", clusters_for)) if xs != [None]]
            groups = f" on {_count(len(obj.groups), 'device group')}" if len(obj.groups) < len(obj.stages) else ""
            detail = f", {len(obj.stages)} stages{groups}, no deadlock" + (f", checked against the {' and '.join(checked)}"
                                                                  if checked else "")
        elif kind == "graph":
            detail = f", {len(obj)} layers, {len(obj.edges)} edges"
        else:
            detail = f", {_count(len(obj.devices), 'device')} on {_count(len(obj.servers), 'server')}"
        lines.append(f"ok: {path}: {kind} {obj.name if kind != 'plan' else ''}".rstrip() + detail)
    print("\n".join(lines))
    return 0


def _partners(candidates: list[Any], name: str, kind: str, plan_file: str) -> list[Any]:
    """The graphs (or clusters) to check a plan against: the one given, or those of the plan's name.

    One file given: that one, with a warning on stderr when its name is not the plan's.
    Several: every one named as in the plan (copies of one file, say); when none is, the
    plan is checked on its own, with a warning.  None given: ``[None]`` (checked on its
    own, as ``validate PLAN`` alone asks).
    """
    if len(candidates) == 1:
        if candidates[0].name != name:
            warn(f"warning: {plan_file}: {kind}: plan was made for {kind} {name!r}, checking against "
                 f"{candidates[0].name!r}")
        return candidates
    named = [c for c in candidates if c.name == name]
    if candidates and not named:
        given = ", ".join(repr(n) for n in dict.fromkeys(c.name for c in candidates))
        warn(f"warning: {plan_file}: {kind}: the plan names {kind} {name!r}, which none of the {kind}s "
             f"given ({given}) is; checked without a {kind}")
    return named or [None]


def _count(n: int, noun: str) -> str:
    """``"1 server"``, ``"2 servers"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
