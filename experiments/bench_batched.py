"""Benchmark: batched simulator throughput on 8 stages x 16 microbatches (issue 5).

A population of plans with random stage ranges and random per-stage unequal splits
(one op structure, 1F1B, a replicated and a recomputing stage) is evaluated three
ways on one core: the scalar simulator plan by plan, :meth:`BatchSimulator.evaluate`
on candidates (array building included: what the NSGA-II planner calls), and
:func:`timeline_arrays` on prebuilt arrays.  Prints plan evaluations per second
(median of several rounds) and checks the batched times against the scalar ones.
Target: >= 20,000 plan evaluations/s.

Usage: ``python experiments/bench_batched.py [--stages 8] [--microbatches 16] [--batch 2048] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.evaluation.batched import BatchSimulator, Candidate, timeline_arrays
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.evaluation.simulator import simulate


def instance(stages: int, layers_per_stage: int = 4) -> tuple[LayerGraph, Cluster]:
    """A chain graph on a two-server heterogeneous cluster (as ``bench_simulator``)."""
    layers = [Layer(f"l{i}", (1e-4, 2e-5 * (1 + i % 3)), (2e-4, 4e-5 * (1 + i % 3)), 5e7, 4e6, 2e5)
              for i in range(stages * layers_per_stage)]
    graph = LayerGraph.chain("bench", layers, input_bytes=1e4)
    devices = tuple(Device(f"g{i}", f"s{i % 2}", 1.0 if i % 2 == 0 else 0.5, 8e10) for i in range(stages + 1))
    cluster = Cluster("bench", (Link(1.5e11, 5e-6, "s0"), Link(1.6e10, 1e-5, "s1")), Link(1.25e10, 2e-5), devices)
    return graph, cluster


def population(graph: LayerGraph, stages: int, microbatches: int, size: int, seed: int,
               per_stage: bool = False) -> list[Candidate]:
    """``size`` candidates: random cuts, random unequal splits of ``4 * microbatches`` samples.

    One split per plan shared by its stages, or (``per_stage``) one per stage: under
    1F1B most random per-stage splits deadlock, so that population is for GPipe.
    """
    rng = np.random.default_rng(seed)
    layers, batch = len(graph), 4 * microbatches
    groups = tuple((f"g{s}",) for s in range(stages))
    groups = ((groups[0][0], f"g{stages}"),) + groups[1:]
    out = []
    for _ in range(size):
        cuts = [0, *sorted(rng.choice(np.arange(1, layers), stages - 1, replace=False).tolist()), layers]
        splits: list[tuple[int, ...]] = []
        for _ in range(stages if per_stage else 1):
            marks = sorted(rng.choice(np.arange(1, batch), microbatches - 1, replace=False).tolist())
            ends = [0, *marks, batch]
            splits.append(tuple(int(b - a) for a, b in zip(ends[:-1], ends[1:])))
        out.append(Candidate(tuple((int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])), groups,
                             tuple(s == stages - 1 for s in range(stages)),
                             tuple(splits) if per_stage else tuple(splits) * stages))
    return out


def median_rate(fn, count: int, rounds: int) -> float:
    """Median over ``rounds`` of ``count`` evaluations per second of ``fn``."""
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2048, help="plans per batched call")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    graph, cluster = instance(args.stages)
    report = {"stages": args.stages, "microbatches": args.microbatches, "batch": args.batch}
    for schedule, per_stage in (("1f1b", False), ("gpipe", True)):
        key = f"{schedule}{'_per_stage' if per_stage else '_shared'}"
        report[key] = measure(graph, cluster, schedule, per_stage, args)
    report.update(target_plans_per_s=20000, python=platform.python_version(), numpy=np.__version__)
    print(json.dumps(report, indent=2))


def measure(graph: LayerGraph, cluster: Cluster, schedule: str, per_stage: bool, args: argparse.Namespace) -> dict:
    """Rates of the three paths on one population, and the worst disagreement with the scalar one."""
    sim = BatchSimulator(graph, cluster, schedule)
    cands = population(graph, args.stages, args.microbatches, args.batch, seed=0, per_stage=per_stage)
    arrays = sim.arrays(cands)
    result = sim.evaluate(cands)
    assert result.batched.all(), "the benchmark population should batch as one structure"
    plans = [Plan("bench", "bench", sum(c.splits[0]), 4.0, schedule,
                  tuple(Stage(b, g, sp, rc) for b, g, sp, rc in zip(c.bounds, c.groups, c.splits, c.recompute)))
             for c in cands[:200]]
    scalar_times = np.array([simulate(p, graph, cluster).iteration_time for p in plans])
    worst = float(np.max(np.abs(scalar_times - result.iteration_time[:200]) / scalar_times))
    scalar = median_rate(lambda: [simulate(p, graph, cluster, validate=False) for p in plans], len(plans),
                         args.rounds)
    evaluate = median_rate(lambda: sim.evaluate(cands), len(cands), args.rounds)
    timeline = median_rate(lambda: timeline_arrays(arrays), len(cands), args.rounds)
    return {"scalar_plans_per_s": round(scalar), "batched_evaluate_plans_per_s": round(evaluate),
            "batched_timeline_plans_per_s": round(timeline), "meets_target": evaluate >= 20000,
            "max_relative_difference_vs_scalar": worst}


if __name__ == "__main__":
    main()
