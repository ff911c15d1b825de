"""Synthesized programs against the fixed schedules, and the exact order model's proof times.

Part 1, the six instance shapes of issue 36 (:func:`instances`): a transformer-like chain
(:func:`chain`) on a cluster per shape.  For each placement (one stage per group ``one``,
V-shaped ``v``, looped with two stages per group ``looped``), every fixed schedule that
applies gets its own partition: from a split of the layers in proportion to the
groups' speeds, layer boundaries move by one while the schedule's simulated time falls
(and every group fits its memory).  On each such partition the synthesizer
(:func:`pipeplan.solver.schedules.synthesis.synthesize`) builds programs for the same
stages, and the exact model (:func:`pipeplan.solver.schedules.order_model.solve_order`,
started from them) polishes them within a work limit.  Reported per instance: the best
fixed schedule over placements and its partition, the synthesized and exact times on
that partition, and the best synthesized time over the partitions of a search that
moves boundaries while the synthesized time falls (a preview of planning partition and
schedule jointly), from each placement's proportional split.

Part 2, proof time: the exact model on 4 groups x 8 microbatches (one stage per group,
V and looped placement), on three instances of part 1, with identical and with unequal
microbatches, in both spaces (every order; in-order per stage; see
:func:`bench_proofs`).  Reported: status, CP-SAT deterministic seconds (the
counted work), this process's CPU seconds (the wall time on an idle core: one CP-SAT
worker) and wall seconds (which depend on the machine's load).

Part 3 (``--rules N``), the list scheduler's rule sets: every rule of the full set on N
random partitions (2-4 groups, 2-8 microbatches, the three placements, a quarter of
them under tight caps) and on the six shapes' proportional partitions; reported, how
far the best of the ``fast`` set and of the fixed schedules alone are from the best of
everything (``synthesis_rules.json``).

Part 4 (``--plan SOLVER``), planning: ``pipeplan.plan(..., schedule="auto")`` with one
solver on the six shapes (batch 32 in 8 microbatches), each named schedule's plan against
the ``adaptive`` plan (partitions searched with synthesized programs, the exact order
model polishing the last one with ``--work`` deterministic seconds); reported per
instance: every schedule's time, the adaptive time, where its partition came from, the
order's status and the wall time (``synthesis_plan.json`` and ``.md``).

Usage::

    python -m pipeplan.experiments.bench_synthesis [--quick] [--work 60] [--out experiments/results]
    python -m pipeplan.experiments.bench_synthesis --plan even [--time-limit 20] [--work 5]
    python -m pipeplan.experiments.bench_synthesis --proofs [--work 60]
    python -m pipeplan.experiments.bench_synthesis --rules 60

writes ``synthesis.json`` and ``synthesis.md``.  Every time is the simulator's, checked
by ``simulate`` on the custom plan.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeplan.models.graph import Layer, LayerGraph  # noqa: E402
from pipeplan.models.jsonio import atomic_write_text  # noqa: E402
from pipeplan.solver.evaluation.simulator import simulate  # noqa: E402
from pipeplan.solver.formats.cluster import Cluster, Device, Link  # noqa: E402
from pipeplan.solver.formats.plan import Plan, Stage, equal_split  # noqa: E402
from pipeplan.solver.schedules.order_model import OrderLimits, OrderProblem, solve_order  # noqa: E402
from pipeplan.solver.schedules.synthesis import (ProgramDeadlock, custom_plan, evaluate,  # noqa: E402
                                                 fixed_programs, list_rules, list_schedule, schedule_instance,
                                                 sequential_programs, synthesize)

BATCH = 32
MICROBATCHES = 8
STATE_FACTOR = 4.0


def chain(layers: int, head: float = 1.0) -> LayerGraph:
    """A chain of transformer blocks of 4 samples per microbatch scale (the last one ``head`` times heavier).

    Per block and sample: forward 0.15 ms (+0.02 ms per call), backward 0.30 ms of which
    the weight gradient 0.14 ms, 30 MB saved (15 MB still needed by the weight
    gradient), 4 MB of output; 200 MB of parameters, 0.2 ms of optimizer step.
    """
    blocks = []
    for i in range(layers):
        x = head if i == layers - 1 else 1.0
        blocks.append(Layer(f"block.{i}", (2e-5 * x, 1.5e-4 * x), (4e-5 * x, 3.0e-4 * x), params=2.0e8 * x,
                            act=3.0e7 * x, out=4.0e6, bwd_w=(1.5e-5 * x, 1.4e-4 * x), act_w=1.5e7 * x,
                            step=2e-4 * x))
    return LayerGraph.chain(f"chain{layers}", blocks, input_bytes=4.0e6)


def cluster(name: str, speeds: list[float], memory: float | list[float], *, servers: list[int] | None = None,
            server_links: list[tuple[float, float]] | None = None,
            network: tuple[float, float] = (1.25e10, 2e-5)) -> Cluster:
    """Devices ``d0..`` with the given speeds and memories, on servers (``servers[i]``: device i's server)."""
    n = len(speeds)
    servers = servers or [0] * n
    count = max(servers) + 1
    links = server_links or [(1.5e11, 5e-6)] * count
    memories = memory if isinstance(memory, list) else [memory] * n
    return Cluster(name, tuple(Link(bw, lat, f"s{j}") for j, (bw, lat) in enumerate(links)), Link(*network),
                   tuple(Device(f"d{i}", f"s{servers[i]}", speeds[i], memories[i]) for i in range(n)))


@dataclass(frozen=True)
class Instance:
    """One benchmark instance: a graph and a cluster whose devices are the groups (one device each)."""

    name: str
    graph: LayerGraph
    cluster: Cluster


def instances() -> list[Instance]:
    """The six shapes of issue 36.

    The tight memories are set where 1F1B on the proportional split of one stage per
    group just fits (its peak is 5.12 GB per device of ``tight4``; 9.12, 8.40, 5.12,
    4.64, 2.08 and 2.76 GB on ``tight6``), while the fastest free programs would need
    up to 7.04 and 10.56 GB.
    """
    nv = [(1.5e11, 5e-6)]
    return [
        Instance("4 equal stages, NVLink", chain(16), cluster("nvlink4", [1.0] * 4, 8e10, server_links=nv)),
        Instance("4 equal stages, tight memory", chain(16),
                 cluster("tight4", [1.0] * 4, 5.2e9, server_links=nv)),
        Instance("6 equal stages, PCIe (transfer ~70 % of a forward)", chain(24),
                 cluster("pcie6", [1.0] * 6, 8e10, server_links=[(9.2e9, 1e-5)])),
        Instance("3 unequal stages, speeds 1.0/0.5/0.3", chain(18, head=2.0),
                 cluster("speeds3", [1.0, 0.5, 0.3], 8e10, server_links=nv)),
        Instance("4 unequal stages on two servers", chain(16, head=2.0),
                 cluster("two-servers4", [1.0, 1.0, 0.45, 0.45], [8.5e10, 8.5e10, 2.4e10, 2.4e10], servers=[0, 0, 1, 1],
                         server_links=[(1.5e11, 5e-6), (1.6e10, 1e-5)])),
        Instance("6 unequal stages, tight memory", chain(24, head=2.0),
                 cluster("tight6", [1.0, 1.0, 0.7, 0.7, 0.45, 0.45], [9.5e9, 9.5e9, 6e9, 6e9, 4e9, 4e9],
                         servers=[0, 0, 0, 1, 1, 1],
                         server_links=[(1.5e11, 5e-6), (1.6e10, 1e-5)])),
    ]


PLACEMENTS = ("one", "v", "looped")


def placement_groups(placement: str, groups: int) -> list[int]:
    """The group of each stage: ``one`` stage per group, ``v`` (stages g and 2R-1-g), ``looped`` (s mod R, two each)."""
    if placement == "one":
        return list(range(groups))
    if placement == "v":
        return list(range(groups)) + list(range(groups - 1, -1, -1))
    return [s % groups for s in range(2 * groups)]


def proportional_cuts(graph: LayerGraph, weights: list[float]) -> list[int]:
    """Stage boundaries (layer indices) splitting the forward+backward cost in proportion to ``weights``."""
    cost = [layer.fwd[0] + layer.fwd[1] + layer.bwd[0] + layer.bwd[1] for layer in graph.layers]
    prefix = [0.0] + list(accumulate(cost))
    total, share, stages = prefix[-1], sum(weights), len(weights)
    bounds, target = [0], 0.0
    for s in range(stages - 1):
        target += total * weights[s] / share
        candidates = range(bounds[-1] + 1, len(cost) - (stages - 1 - s) + 1)
        bounds.append(min(candidates, key=lambda i: (abs(prefix[i] - target), i)))
    return bounds + [len(cost)]


def make_plan(inst: Instance, placement: str, bounds: list[int], batch: int = BATCH) -> Plan:
    """The partition's plan: stage ``s`` holds layers ``bounds[s]..bounds[s+1]``, the batch in 8 microbatches."""
    groups = len(inst.cluster.devices)
    owner = placement_groups(placement, groups)
    split = equal_split(batch, MICROBATCHES)
    stages = tuple(Stage((bounds[s], bounds[s + 1]), (inst.cluster.devices[owner[s]].id,), split)
                   for s in range(len(owner)))
    return Plan(inst.graph.name, inst.cluster.name, batch, STATE_FACTOR, "custom", stages)


def fixed_times(inst: Instance, plan: Plan) -> dict[str, float]:
    """Each applicable fixed schedule's time on the plan's partition (``inf`` if it does not fit or deadlocks)."""
    instance = schedule_instance(plan, inst.graph, inst.cluster)
    out = {}
    for name, programs in fixed_programs(instance).items():
        try:
            t = evaluate(instance, programs)
        except ProgramDeadlock:
            continue
        out[name] = t.iteration_time if t.fits else float("inf")
    return out


def local_search(inst: Instance, placement: str, cost) -> tuple[list[int], float]:
    """Boundaries from the proportional split, each moved by one layer while ``cost(plan)`` falls."""
    groups = len(inst.cluster.devices)
    owner = placement_groups(placement, groups)
    per_group = [owner.count(g) for g in range(groups)]
    weights = [inst.cluster.devices[g].speed / per_group[g] for g in owner]
    bounds = proportional_cuts(inst.graph, weights)
    best = cost(make_plan(inst, placement, bounds))
    improved = True
    while improved:
        improved = False
        for c in range(1, len(bounds) - 1):
            for step in (-1, 1):
                moved = list(bounds)
                moved[c] += step
                if not moved[c - 1] < moved[c] < moved[c + 1]:
                    continue
                value = cost(make_plan(inst, placement, moved))
                if value < best:
                    bounds, best, improved = moved, value, True
    return bounds, best


def bench_instance(inst: Instance, work: float, quick: bool) -> dict:
    rows = []
    for placement in PLACEMENTS:
        plan = make_plan(inst, placement, proportional_cuts(inst.graph, [1.0] * len(
            placement_groups(placement, len(inst.cluster.devices)))))
        for name in fixed_times(inst, plan):
            bounds, best = local_search(inst, placement, lambda p, n=name: fixed_times(inst, p).get(n, float("inf")))
            rows.append({"placement": placement, "schedule": name, "bounds": bounds, "time": best})
    fits = [r for r in rows if r["time"] < float("inf")]
    best_fixed = min(fits, key=lambda r: r["time"]) if fits else None
    if best_fixed is not None:  # the named schedule's own plan, timed by simulate, is the time reported
        named = replace(make_plan(inst, best_fixed["placement"], best_fixed["bounds"]), schedule=best_fixed["schedule"])
        assert simulate(named, inst.graph, inst.cluster).iteration_time == best_fixed["time"]
    tried = {}
    for r in rows:  # the synthesizer on every partition a fixed schedule chose
        key = (r["placement"], tuple(r["bounds"]))
        if key in tried:
            continue
        plan = make_plan(inst, r["placement"], r["bounds"])
        instance = schedule_instance(plan, inst.graph, inst.cluster)
        start = time.perf_counter()
        syn = synthesize(instance)
        wall = time.perf_counter() - start
        check = simulate(custom_plan(plan, syn.programs), inst.graph, inst.cluster)
        assert check.iteration_time == syn.iteration_time
        tried[key] = {"placement": r["placement"], "bounds": r["bounds"], "synthesized": syn.iteration_time
                      if syn.fits else None, "source": syn.source, "synthesis_wall": wall,
                      "fixed": fixed_times(inst, plan)}
    out = {"instance": inst.name, "fixed_rows": rows, "best_fixed": best_fixed, "partitions": list(tried.values())}
    synthesized = [p for p in tried.values() if p["synthesized"] is not None]
    out["best_synthesized"] = min(synthesized, key=lambda p: p["synthesized"]) if synthesized else None
    joint = []
    for placement in PLACEMENTS:
        def cost(plan: Plan) -> float:
            syn = synthesize(schedule_instance(plan, inst.graph, inst.cluster))
            return syn.iteration_time if syn.fits else float("inf")
        start = time.perf_counter()
        bounds, best = local_search(inst, placement, cost)
        joint.append({"placement": placement, "bounds": bounds, "synthesized": best,
                      "search_wall": time.perf_counter() - start})
    out["joint"] = joint
    fits_joint = [j for j in joint if j["synthesized"] < float("inf")]
    out["best_joint"] = min(fits_joint, key=lambda j: j["synthesized"]) if fits_joint else None
    if best_fixed is not None:
        plan = make_plan(inst, best_fixed["placement"], best_fixed["bounds"])
        instance = schedule_instance(plan, inst.graph, inst.cluster)
        syn = synthesize(instance)
        exact = solve_order(OrderProblem(instance), OrderLimits(work=work if not quick else min(work, 5.0)),
                            hint=syn.programs)
        if exact.programs is not None:
            assert simulate(custom_plan(plan, exact.programs), inst.graph, inst.cluster).iteration_time == \
                exact.iteration_time
        out["on_best_fixed_partition"] = {
            "synthesized": syn.iteration_time if syn.fits else None, "source": syn.source,
            "exact": exact.iteration_time, "lower_bound": exact.lower_bound, "status": exact.status,
            "work": exact.work, "cpu": exact.cpu_time, "wall": exact.wall_time, "stopped_by": exact.stopped_by}
    return out


def bench_proofs(work: float, spaces: tuple[bool, ...] = (True, False)) -> list[dict]:
    """The exact model on 4 groups x 8 microbatches.

    Instances 1, 2 and 5 of part 1 (equal stages, the same under tight memory, unequal
    stages on two servers), one stage per group, V and looped placement, proportional splits:
    with a batch of 32 (eight identical microbatches of 4 samples) in both spaces, and,
    for instances 1 and 5, with a batch of 36 (microbatches of 5, 5, 5, 5, 4, 4, 4, 4
    samples), where in-order programs are no longer as good as any.  ``spaces``: the
    values of ``in_order`` solved (``True``: in microbatch order per stage; ``False``: any order).
    """
    rows = []
    cases = [(0, 32), (1, 32), (4, 32), (0, 36), (4, 36)]
    for index, batch in cases:
        inst = instances()[index]
        for placement in PLACEMENTS:
            owner = placement_groups(placement, len(inst.cluster.devices))
            per_group = [owner.count(g) for g in range(len(inst.cluster.devices))]
            weights = [inst.cluster.devices[g].speed / per_group[g] for g in owner]
            plan = make_plan(inst, placement, proportional_cuts(inst.graph, weights), batch)
            instance = schedule_instance(plan, inst.graph, inst.cluster)
            syn = synthesize(instance)
            for in_order in spaces:
                result = solve_order(OrderProblem(instance, in_order=in_order), OrderLimits(work=work),
                                     hint=syn.programs)
                rows.append({"instance": inst.name, "batch": batch, "split": list(plan.stages[0].microbatches),
                             "placement": placement, "space": result.space, "synthesized": syn.iteration_time,
                             "exact": result.iteration_time, "lower_bound": result.lower_bound,
                             "status": result.status, "work": result.work, "cpu": result.cpu_time,
                             "wall": result.wall_time, "stopped_by": result.stopped_by,
                             "load": os.getloadavg()[0]})  # the 1-minute load average as the solve ends
                print(json.dumps(rows[-1]), flush=True)
    return rows


def random_partition(rng: random.Random, groups: int, microbatches: int, placement: str
                     ) -> tuple[Plan, LayerGraph, Cluster]:
    """A random partition for the rule coverage: 1-2 random layers per stage, devices of four speeds."""
    owner = placement_groups(placement, groups)
    sizes = [rng.randint(1, 2) for _ in owner]
    layers = []
    for i in range(sum(sizes)):
        fwd, bwd = (rng.uniform(0, 2e-4), rng.uniform(1e-4, 1e-3)), (rng.uniform(0, 4e-4), rng.uniform(2e-4, 2e-3))
        share, act = rng.uniform(0.2, 0.7), rng.uniform(1e5, 1e7)
        layers.append(Layer(f"l{i}", fwd, bwd, rng.uniform(1e6, 1e8), act, rng.uniform(1e4, 1e6),
                            bwd_w=(bwd[0] * share, bwd[1] * share), act_w=act * rng.uniform(0.2, 1.0),
                            step=rng.uniform(0, 5e-4)))
    graph = LayerGraph.chain("g", layers, input_bytes=rng.uniform(1e4, 1e6))
    devices = tuple(Device(f"d{i}", f"s{i * 2 // groups}", rng.choice([0.3, 0.45, 0.7, 1.0]), 1e13)
                    for i in range(groups))
    cl = Cluster("c", (Link(rng.uniform(1e9, 2e11), 5e-6, "s0"), Link(rng.uniform(1e9, 2e11), 1e-5, "s1")),
                 Link(rng.uniform(1e8, 2e10), 2e-5), devices)
    bounds = [0] + [sum(sizes[:s + 1]) for s in range(len(owner))]
    split = (2,) * microbatches
    stages = tuple(Stage((bounds[s], bounds[s + 1]), (f"d{owner[s]}",), split, rng.random() < 0.2)
                   for s in range(len(owner)))
    return Plan("g", "c", 2 * microbatches, STATE_FACTOR, "custom", stages), graph, cl


def rule_coverage(count: int, seed: int) -> dict:
    """Every rule of ``list_rules(effort="full")`` on ``count`` random partitions and the six shapes' proportional
    ones: how far the best of each subset is from the best of all rules and fixed schedules."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        placement = PLACEMENTS[i % 3]
        plan, graph, cl = random_partition(rng, rng.randint(2, 4), rng.randint(2, 8), placement)
        instance = schedule_instance(plan, graph, cl)
        if i % 4 == 3:  # a quarter under caps between the memory-minimal peak and a free schedule's
            least = evaluate(instance, sequential_programs(instance)).peak_memory
            most = evaluate(instance, synthesize(instance).programs).peak_memory
            instance = schedule_instance(plan, graph, cl, memory_caps=[
                a + rng.uniform(0.1, 0.6) * (b - a) for a, b in zip(least, most)])
        cases.append((f"random {i} ({placement})", instance))
    for inst in instances():
        for placement in PLACEMENTS:
            owner = placement_groups(placement, len(inst.cluster.devices))
            per = [owner.count(g) for g in range(len(inst.cluster.devices))]
            plan = make_plan(inst, placement, proportional_cuts(
                inst.graph, [inst.cluster.devices[g].speed / per[g] for g in owner]))
            cases.append((f"{inst.name} ({placement})", schedule_instance(plan, inst.graph, inst.cluster)))
    table = []
    for label, instance in cases:
        times = {}
        for rule in list_rules(instance, effort="full"):
            programs = list_schedule(instance, rule)
            timeline = None if programs is None else evaluate(instance, programs)
            times[rule.name] = timeline.iteration_time if timeline is not None and timeline.fits else None
        fixed = []
        for programs in fixed_programs(instance).values():
            try:
                timeline = evaluate(instance, programs)
            except ProgramDeadlock:
                continue
            if timeline.fits:
                fixed.append(timeline.iteration_time)
        fast = {rule.name for rule in list_rules(instance)}
        everything = [t for t in times.values() if t is not None] + fixed
        fast_times = [t for n, t in times.items() if n in fast and t is not None]
        best = min(everything) if everything else None
        table.append({"case": label, "best": best, "best_fast": min(fast_times + fixed) if fast_times + fixed else None,
                      "best_fixed": min(fixed) if fixed else None,
                      "best_rules": sorted(n for n, t in times.items() if t is not None and t == best)})

    def excess(row: dict, key: str) -> float:
        return 1.0 if row[key] is None else row[key] / row["best"] - 1

    rows = [r for r in table if r["best"] is not None]
    summary = {"cases": len(table), "cases_with_a_fitting_program": len(rows),
               "fast_worst": max(excess(r, "best_fast") for r in rows),
               "fast_mean": sum(excess(r, "best_fast") for r in rows) / len(rows),
               "fixed_only_mean": sum(excess(r, "best_fixed") for r in rows) / len(rows),
               "fixed_only_worst": max(excess(r, "best_fixed") for r in rows)}
    return {"summary": summary, "table": table}


def bench_plan(solver: str, time_limit: float, work: float, only: list[int] | None) -> list[dict]:
    """Part 4: every named schedule's plan and the adaptive plan of ``solver`` on the six shapes (``auto``)."""
    from pipeplan.solver.planning import ADAPTIVE, AdaptiveOptions, plan

    rows = []
    for i, inst in enumerate(instances(), 1):
        if only and i not in only:
            continue
        start = time.perf_counter()
        done = plan(inst.graph, inst.cluster, batch=BATCH, microbatches=MICROBATCHES, solver=solver, schedule="auto",
                    time_limit=time_limit, adaptive=AdaptiveOptions(work=work))
        wall = time.perf_counter() - start
        named = {o.schedule: o.result.iteration_time for o in done.outcomes if o.schedule != ADAPTIVE}
        adaptive = next((o.result for o in done.outcomes if o.schedule == ADAPTIVE), None)
        if adaptive is not None and adaptive.plan is not None:  # the simulator is the judge
            assert simulate(adaptive.plan, inst.graph, inst.cluster).iteration_time == adaptive.iteration_time
        synthesis = adaptive.details.get("synthesis", {}) if adaptive is not None else {}
        rows.append({"instance": inst.name, "solver": solver, "named": named,
                     "adaptive": adaptive.iteration_time if adaptive is not None else None,
                     "origin": adaptive.details.get("partitions", {}).get("origin") if adaptive is not None else None,
                     "evaluations": adaptive.details.get("partitions", {}).get("evaluations")
                     if adaptive is not None else None,
                     "order": synthesis.get("algorithm"), "order_status": synthesis.get("status"),
                     "order_gap": synthesis.get("gap"), "order_stopped_by": synthesis.get("stopped_by"),
                     "stopped_by": adaptive.stopped_by if adaptive is not None else None,
                     "phases": adaptive.details.get("phases") if adaptive is not None else None,
                     "best": done.best.schedule if done.best is not None else None, "wall": wall})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def plan_markdown(rows: list[dict]) -> str:
    lines = ["| instance | best named schedule | adaptive | vs best named | partition from (partitions synthesized) | "
             "order (status) | wall (s) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        fits = {k: v for k, v in r["named"].items() if v is not None}
        name = min(fits, key=fits.get) if fits else None
        best = f"{_ms(fits[name])} ms ({name})" if name else "none fits"
        ratio = f"{100 * (r['adaptive'] / fits[name] - 1):+.1f} %" if name and r["adaptive"] else "-"
        lines.append(f"| {r['instance']} | {best} | {_ms(r['adaptive'])} ms | {ratio} | {r['origin']} "
                     f"({r['evaluations']}) | {r['order']} ({r['order_status']}) | {r['wall']:.1f} |")
    return "\n".join(lines) + "\n"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def markdown(results: list[dict], proofs: list[dict]) -> str:
    lines = ["| instance | best fixed (schedule, placement) | synthesized, same partition | exact, same partition "
             "(status, bound) | synthesized, its own partition search |", "|---|---|---|---|---|"]
    for r in results:
        bf, on, bj = r["best_fixed"], r.get("on_best_fixed_partition"), r.get("best_joint")
        fixed = "none fits" if bf is None else f"{_ms(bf['time'])} ms ({bf['schedule']}, {bf['placement']})"
        same = "-" if on is None else f"{_ms(on['synthesized'])} ms"
        exact = "-" if on is None else f"{_ms(on['exact'])} ms ({on['status']}, >= {_ms(on['lower_bound'])})"
        joint = "-" if bj is None else f"{_ms(bj['synthesized'])} ms ({bj['placement']})"
        lines.append(f"| {r['instance']} | {fixed} | {same} | {exact} | {joint} |")
    lines += ["", "| instance | microbatches | placement | space | synthesized (ms) | exact (ms) | status | "
              "bound (ms) | work (det. s) | CPU (s) | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in proofs:
        sizes = "8 x 4" if len(set(p["split"])) == 1 else "4 x 5, 4 x 4"
        lines.append(f"| {p['instance']} | {sizes} | {p['placement']} | {p['space']} | {_ms(p['synthesized'])} | "
                     f"{_ms(p['exact'])} | {p['status']} | {_ms(p['lower_bound'])} | {p['work']:.2f} | "
                     f"{p['cpu']:.1f} | {p['wall']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="part 1 only, exact model at 5 deterministic s")
    parser.add_argument("--work", type=float, default=60.0, help="CP-SAT deterministic seconds per exact solve")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--only", type=int, nargs="*", help="instance numbers (1-6) of part 1")
    parser.add_argument("--proofs", action="store_true",
                        help="part 2 only, in the space pipeplan synthesize --exact searches (any order); writes "
                             "synthesis_proofs.json and .md")
    parser.add_argument("--rules", type=int, metavar="N",
                        help="part 3 only: the list scheduler's rules on N random partitions and the six shapes")
    parser.add_argument("--plan", metavar="SOLVER",
                        help="part 4 only: pipeplan.plan with SOLVER, schedule auto (adaptive included)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="part 4: seconds per solve, a cap")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plan:
        rows = bench_plan(args.plan, args.time_limit, args.work, args.only)
        atomic_write_text(out / "synthesis_plan.json", json.dumps(rows, indent=1) + "\n")
        atomic_write_text(out / "synthesis_plan.md", plan_markdown(rows))
        print(plan_markdown(rows))
        return 0
    if args.rules:
        coverage = rule_coverage(args.rules, seed=0)
        atomic_write_text(out / "synthesis_rules.json", json.dumps(coverage, indent=1) + "\n")
        print(json.dumps(coverage["summary"], indent=1))
        return 0
    if args.proofs:
        proofs = bench_proofs(args.work, spaces=(False,))
        atomic_write_text(out / "synthesis_proofs.json", json.dumps(proofs, indent=1) + "\n")
        atomic_write_text(out / "synthesis_proofs.md", markdown([], proofs))
        print(markdown([], proofs))
        return 0
    results = []
    for i, inst in enumerate(instances(), 1):
        if args.only and i not in args.only:
            continue
        results.append(bench_instance(inst, args.work, args.quick))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "fixed_rows"}), flush=True)
    proofs = [] if args.quick else bench_proofs(args.work)
    atomic_write_text(out / "synthesis.json", json.dumps({"instances": results, "proofs": proofs}, indent=1) + "\n")
    atomic_write_text(out / "synthesis.md", markdown(results, proofs))
    print(markdown(results, proofs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
