"""Benchmark: batched simulator throughput on 8 stages x 16 microbatches (issue 5).

Populations of plans with random stage ranges and random unequal splits (one programs
structure each, a replicated and a recomputing stage) are evaluated three ways on one
core: the scalar simulator plan by plan, :meth:`BatchSimulator.evaluate` on candidates
(array building included: what the NSGA-II planner calls), and :func:`timeline_arrays`
on prebuilt arrays.  One stage per device (1F1B with one split per plan, GPipe with one
per stage) and device groups running version-2 programs (``interleaved-1f1b`` and
``zbv``: 8 stages on 4 groups, one split per plan, as those schedules require).
Prints plan evaluations per second (median of several rounds) and checks the batched
times against the scalar ones (they must be equal: the largest difference is 0).
Target: >= 20,000 plan evaluations/s.

``--baseline REV`` times the same populations on git revision ``REV``'s simulators in the
same run, round by round in alternating order (:mod:`pipeplan.experiments.revisions`).

Usage: ``python experiments/bench_batched.py [--stages 8] [--microbatches 16] [--batch 2048] [--rounds 5] [--baseline REV]``
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
from pipeplan.solver.schedules.schedule import schedule_for, stage_group


def instance(stages: int, layers_per_stage: int = 4) -> tuple[LayerGraph, Cluster]:
    """A chain graph on a two-server heterogeneous cluster (as ``bench_simulator``)."""
    layers = [Layer(f"l{i}", (1e-4, 2e-5 * (1 + i % 3)), (2e-4, 4e-5 * (1 + i % 3)), 5e7, 4e6, 2e5)
              for i in range(stages * layers_per_stage)]
    graph = LayerGraph.chain("bench", layers, input_bytes=1e4)
    devices = tuple(Device(f"g{i}", f"s{i % 2}", 1.0 if i % 2 == 0 else 0.5, 8e10) for i in range(stages + 1))
    cluster = Cluster("bench", (Link(1.5e11, 5e-6, "s0"), Link(1.6e10, 1e-5, "s1")), Link(1.25e10, 2e-5), devices)
    return graph, cluster


def population(graph: LayerGraph, stages: int, microbatches: int, size: int, seed: int,
               per_stage: bool = False, schedule: str = "1f1b") -> list[Candidate]:
    """``size`` candidates: random cuts, random unequal splits of ``4 * microbatches`` samples.

    One split per plan shared by its stages, or (``per_stage``) one per stage: under
    1F1B most random per-stage splits deadlock, so that population is for GPipe.  Under
    a version-2 schedule the stages share ``stages // 2`` device groups as it lays them out.
    """
    rng = np.random.default_rng(seed)
    layers, batch = len(graph), 4 * microbatches
    if schedule_for(schedule).one_stage_per_group:
        groups = tuple((f"g{s}",) for s in range(stages))
        groups = ((groups[0][0], f"g{stages}"),) + groups[1:]
    else:
        devices = [(f"g0", f"g{stages}")] + [(f"g{g}",) for g in range(1, stages // 2)]
        groups = tuple(devices[stage_group(schedule, s, stages // 2)] for s in range(stages))
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


SCHEDULES = (("1f1b", False), ("gpipe", True), ("interleaved-1f1b", False), ("zbv", False))
"""The populations: schedule, and whether each stage has a split of its own."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2048, help="plans per batched call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", metavar="REV", help="also time git revision REV's simulators, side by side")
    args = parser.parse_args()
    report = {"stages": args.stages, "microbatches": args.microbatches, "batch": args.batch, "rounds": args.rounds}
    for schedule, per_stage in SCHEDULES:
        key = f"{schedule}{'_per_stage' if per_stage else '_shared'}"
        sizes = (args.stages, args.microbatches, args.batch)
        if args.baseline:
            from pipeplan.experiments import revisions

            runs = revisions.side_by_side(args.baseline, __file__, "measure_population", args.rounds, *sizes, 1,
                                          schedule, per_stage)
            report.update(this_revision=runs["this_revision"], baseline_revision=runs["baseline_revision"])
            report[key] = {side: _summary(runs[side]) for side in ("this", "baseline")}
            report[key]["evaluate_ratio_this_over_baseline"] = (report[key]["this"]["batched_evaluate_plans_per_s"]
                                                                / report[key]["baseline"]["batched_evaluate_plans_per_s"])
        else:
            report[key] = _summary(measure_population(*sizes, args.rounds, schedule, per_stage))
    report.update(target_plans_per_s=20000, python=platform.python_version(), numpy=np.__version__,
                  load_average=os.getloadavg())
    print(json.dumps(report, indent=2))


def _summary(runs: dict[str, list]) -> dict:
    """Medians of the rates over the rounds, and what every round found."""
    def median(name: str) -> int | None:
        values = [v for v in runs[name] if v is not None]
        return round(statistics.median(values)) if values else None

    return {"scalar_plans_per_s": median("scalar"), "batched_evaluate_plans_per_s": median("evaluate"),
            "batched_timeline_plans_per_s": median("timeline"), "meets_target": (median("evaluate") or 0) >= 20000,
            "all_batched": all(runs["batched"]), "max_relative_difference_vs_scalar": max(runs["difference"]),
            "times_and_peaks_equal_to_scalar": all(runs["equal"])}


def measure_population(stages: int, microbatches: int, batch: int, rounds: int, schedule: str,
                       per_stage: bool) -> dict[str, list]:
    """Rates of the three paths on one population (one number per round), and the disagreement with the scalar one.

    What each side of ``--baseline`` runs, with its own revision's code, on one core.
    A simulator that does not batch the population (it goes plan by plan) is timed on
    its first 200 plans, and has no timeline of its own (``None``).
    """
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    graph, cluster = instance(stages)
    sim = BatchSimulator(graph, cluster, schedule)
    cands = population(graph, stages, microbatches, batch, seed=0, per_stage=per_stage, schedule=schedule)
    result = sim.evaluate(cands[:200])
    batched = bool(result.batched.all())
    plans = [Plan("bench", "bench", sum(c.splits[0]), 4.0, schedule,
                  tuple(Stage(b, g, sp, rc) for b, g, sp, rc in zip(c.bounds, c.groups, c.splits, c.recompute)))
             for c in cands[:200]]
    scalar_results = [simulate(p, graph, cluster) for p in plans]
    scalar_times = np.array([r.iteration_time for r in scalar_results])
    worst = float(np.max(np.abs(scalar_times - result.iteration_time) / scalar_times))
    equal = (scalar_times.tolist() == result.iteration_time.tolist()
             and [max(r.peak_memory) for r in scalar_results] == result.peak_memory.tolist())
    timed = cands if batched else cands[:200]
    arrays = sim.arrays(timed) if batched else None
    out: dict[str, list] = {"batched": [batched], "difference": [worst], "equal": [equal]}
    out["scalar"] = [median_rate(lambda: [simulate(p, graph, cluster, validate=False) for p in plans], len(plans),
                                 rounds)]
    out["evaluate"] = [median_rate(lambda: sim.evaluate(timed), len(timed), rounds)]
    out["timeline"] = [median_rate(lambda: timeline_arrays(arrays), len(timed), rounds) if batched else None]
    return out


if __name__ == "__main__":
    main()
