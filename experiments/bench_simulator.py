"""Benchmark: scalar simulator speed on 8 stages x 64 microbatches under 1F1B, optionally against an earlier revision.

Times ``simulate`` (validation, costs and the timeline), ``simulate`` of a plan whose
structure (programs and splits) the simulator has not seen yet, and the timeline alone
(costs precomputed), on one core, and prints plans per second as the median of several
rounds.  Target (issue 2): >= 500 plans/s.

``--baseline REV`` times the same instance on the simulator of git revision ``REV`` in
the same run (:mod:`pipeplan.experiments.revisions`): every round times both, each in a
fresh subprocess pinned to the same core, the two in alternating order.  The instance
travels as plan, graph and cluster files, and each side times it with
:func:`measure_files` through whichever simulator API its revision has (the timeline
alone: ``run_programs(plan_costs(...))``, or an older revision's
``run_timeline(stage_costs(...))``).  The report gives both medians and their ratio
(this checkout over the baseline: above 1 is faster).

Usage: ``python experiments/bench_simulator.py [--stages 8] [--microbatches 64] [--rounds 7] [--seconds 0.5] [--baseline REV]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time


def instance(stages: int, microbatches: int, layers_per_stage: int = 4):
    """A chain graph on a two-server cluster, one replicated stage, one recomputing."""
    from pipeplan.models.graph import Layer, LayerGraph
    from pipeplan.solver.formats.cluster import Cluster, Device, Link
    from pipeplan.solver.formats.plan import Plan, Stage, equal_split

    layers = [Layer(f"l{i}", (1e-4, 2e-5 * (1 + i % 3)), (2e-4, 4e-5 * (1 + i % 3)), 5e7, 4e6, 2e5)
              for i in range(stages * layers_per_stage)]
    graph = LayerGraph.chain("bench", layers, input_bytes=1e4)
    devices = tuple(Device(f"g{i}", f"s{i % 2}", 1.0 if i % 2 == 0 else 0.5, 8e10) for i in range(stages + 1))
    cluster = Cluster("bench", (Link(1.5e11, 5e-6, "s0"), Link(1.6e10, 1e-5, "s1")), Link(1.25e10, 2e-5), devices)
    split = equal_split(4 * microbatches, microbatches)
    groups = [[f"g{s}"] for s in range(stages)]
    groups[0].append(f"g{stages}")
    plan = Plan("bench", "bench", sum(split), 4.0, "1f1b", tuple(
        Stage((s * layers_per_stage, (s + 1) * layers_per_stage), tuple(groups[s]), split, s == stages - 1)
        for s in range(stages)))
    return plan, graph, cluster


def rate(fn, seconds: float = 0.5) -> float:
    """Calls per second of ``fn`` over about ``seconds``."""
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        count += 1
    return count / elapsed


def timers(plan, graph, cluster) -> dict:
    """``name -> callable`` of what is timed, through this revision's simulator API (or an older one's)."""
    try:
        from pipeplan.solver.evaluation import simulator
    except ImportError:  # a revision before solver/ had sub-packages
        from pipeplan.solver import simulator  # type: ignore[no-redef]
    if hasattr(simulator, "plan_costs"):
        costs = simulator.plan_costs(plan, graph, cluster)
        timeline = lambda: simulator.run_programs(costs)  # noqa: E731
    else:
        costs = simulator.stage_costs(plan, graph, cluster)
        timeline = lambda: simulator.run_timeline(costs, plan.global_batch)  # noqa: E731
    out = {"simulate": lambda: simulator.simulate(plan, graph, cluster), "timeline_only": timeline}
    if hasattr(simulator, "_WIRINGS"):  # a revision that keeps plans' structures: also the first plan of one
        def unseen():
            simulator._WIRINGS.clear()
            simulator.simulate(plan, graph, cluster)
        out["simulate_unseen_structure"] = unseen
    return out


def measure(plan, graph, cluster, rounds: int, seconds: float = 0.5) -> dict[str, list[float]]:
    """Plans per second of every timer, one number per round (each timer called once first, to warm up)."""
    found = timers(plan, graph, cluster)
    for fn in found.values():
        fn()
    return {name: [rate(fn, seconds) for _ in range(rounds)] for name, fn in found.items()}


def _pin() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core


def measure_files(folder: str, rounds: int, seconds: float = 0.5) -> dict[str, list[float]]:
    """:func:`measure` of the plan, graph and cluster files in ``folder``, on one core (what each side of
    ``--baseline`` runs, with its own revision's code)."""
    from pipeplan.models.graph import load_graph
    from pipeplan.solver.formats.cluster import load_cluster
    try:
        from pipeplan.solver.formats.plan import load_plan
    except ImportError:  # a revision before solver/ had sub-packages
        from pipeplan.solver.plan import load_plan  # type: ignore[no-redef]

    _pin()
    graph, cluster = load_graph(f"{folder}/graph.json"), load_cluster(f"{folder}/cluster.json")
    return measure(load_plan(f"{folder}/plan.json", graph, cluster), graph, cluster, rounds, seconds)


def side_by_side(baseline: str, plan, graph, cluster, rounds: int, seconds: float = 0.5) -> dict:
    """Medians of this checkout and of revision ``baseline`` (:mod:`pipeplan.experiments.revisions`), and their ratios."""
    from pipeplan.experiments import revisions
    from pipeplan.models.jsonio import atomic_write_text

    with tempfile.TemporaryDirectory(prefix="bench-sim-") as folder:
        for name, obj in (("plan", plan), ("graph", graph), ("cluster", cluster)):
            atomic_write_text(f"{folder}/{name}.json", json.dumps(obj.to_dict()))
        runs = revisions.side_by_side(baseline, __file__, "measure_files", rounds, folder, 1, seconds)
    report = {key: runs[key] for key in ("this_revision", "baseline_revision")}
    for side in ("this", "baseline"):
        report[side] = {f"{name}_plans_per_s_median": statistics.median(values) for name, values in runs[side].items()}
    this, base = report["this"], report["baseline"]
    report["ratio_this_over_baseline"] = {name: this[f"{name}_plans_per_s_median"] / base[f"{name}_plans_per_s_median"]
                                          for name in ("simulate", "timeline_only")}
    if "simulate_unseen_structure_plans_per_s_median" in this:
        report["ratio_this_over_baseline"]["simulate_unseen_structure_over_baseline_simulate"] = (
            this["simulate_unseen_structure_plans_per_s_median"] / base["simulate_plans_per_s_median"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds each rate is measured over")
    parser.add_argument("--baseline", metavar="REV", help="also time git revision REV's simulator, side by side")
    args = parser.parse_args()
    plan, graph, cluster = instance(args.stages, args.microbatches)
    result = {"case": f"{args.stages} stages x {args.microbatches} microbatches, 1f1b", "rounds": args.rounds}
    if args.baseline:
        result.update(side_by_side(args.baseline, plan, graph, cluster, args.rounds, args.seconds))
    else:
        _pin()
        result.update({f"{name}_plans_per_s_median": statistics.median(values)
                       for name, values in measure(plan, graph, cluster, args.rounds, args.seconds).items()})
    result.update(python=platform.python_version(), machine=platform.machine(), load_average=os.getloadavg())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
