"""Benchmark: scalar simulator speed on 8 stages x 64 microbatches under 1F1B.

Times ``simulate`` (validation, per-stage costs and the timeline) and the timeline
alone, on one core, and prints plans per second as the median of several rounds.
Target (issue 2): >= 500 plans/s.

Usage: ``python experiments/bench_simulator.py [--stages 8] [--microbatches 64] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage, equal_split
from pipeplan.solver.evaluation.simulator import run_timeline, simulate, stage_costs


def instance(stages: int, microbatches: int, layers_per_stage: int = 4):
    """A chain graph on a two-server cluster, one replicated stage, one recomputing."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    plan, graph, cluster = instance(args.stages, args.microbatches)
    costs = stage_costs(plan, graph, cluster)
    full = [rate(lambda: simulate(plan, graph, cluster)) for _ in range(args.rounds)]
    timeline = [rate(lambda: run_timeline(costs, plan.global_batch)) for _ in range(args.rounds)]
    result = {
        "case": f"{args.stages} stages x {args.microbatches} microbatches, 1f1b",
        "simulate_plans_per_s_median": statistics.median(full),
        "timeline_only_plans_per_s_median": statistics.median(timeline),
        "rounds": args.rounds,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
