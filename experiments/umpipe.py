"""UMPIPE's comparison: unequal vs equal microbatches (GPipe-style and 1F1B).

For each network (``gpt1`` = GPT1-14, ``vgg16``, two synthetic "simulation networks")
on a homogeneous cluster (4 equal GPUs, one server) and a heterogeneous one
(``examples/two-servers.cluster.json``), and each schedule:

- *equal*: the best equal-split baseline plan with ``M`` microbatches;
- *unequal, same pipeline*: that plan's stages and devices kept, its split re-chosen
  by the CP-SAT split model (up to ``2M`` microbatches of free sizes): UMPIPE's own
  comparison, which changes only the data partition;
- *unequal, re-planned*: the best of that and of ``umpipe-local``, ``umpipe-dp``,
  ``autopipe-slicing``, ``cpsat-split`` and ``nsga``, which may also change the
  stages, the devices and the microbatch count.

Splits are shared by the stages (``--per-stage`` for UMPIPE's per-stage partitions).
The gain is the throughput gain ``T_equal / T_unequal - 1``; "vs GPipe" compares with
the equal GPipe plan, as the paper does.  Writes a markdown table and a PNG bar chart.

Usage: ``python experiments/umpipe.py [--out experiments/out] [--quick]`` (default run:
a few minutes on two cores).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from pipeplan.models.graph import LayerGraph, load_graph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.models.synthetic import synthetic_graph
from pipeplan.solver.baselines import best_baseline
from pipeplan.solver.formats.cluster import Cluster, Device, Link, load_cluster
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.splits.cpsat_split import optimize_splits
from pipeplan.solver.views.figures import pyplot, save_png
from pipeplan.solver.solvers import get_solver

ROOT = Path(__file__).resolve().parents[1]
UNEQUAL = ("umpipe-local", "umpipe-dp", "autopipe-slicing", "cpsat-split", "nsga")
"""Split-aware solvers whose best plan is the 'unequal' one."""


def homogeneous() -> Cluster:
    """Four A100-like GPUs on one NVLink server."""
    return Cluster("homog-4", (Link(1.5e11, 5e-6, "s0"),), Link(1.25e10, 2e-5),
                   tuple(Device(f"g{i}", "s0", 1.0, 4e10) for i in range(4)))


def networks(quick: bool) -> dict[str, LayerGraph]:
    """GPT1-14 (example file), VGG16 (analytic profile), synthetic networks."""
    from pipeplan.models.profile_analytic import profile_analytic

    nets = {"gpt1-14": load_graph(str(ROOT / "examples" / "gpt1.graph.json")), "vgg16": profile_analytic("vgg16")}
    nets["synthetic-16"] = synthetic_graph(16, 1, compute_spread=1.0, fixed_cost=2e-3, per_sample_time=2e-4)
    if not quick:
        nets["synthetic-24"] = synthetic_graph(24, 2, compute_spread=1.5, fixed_cost=5e-3, per_sample_time=1e-4)
    return nets


def compare(graph: LayerGraph, cluster: Cluster, schedule: str, batch: int, m: int, per_stage: bool,
            budget: float) -> dict:
    """Equal and unequal iteration times for one configuration.

    ``same``: UMPIPE's own comparison, the best equal-split pipeline kept and only its
    split re-chosen (CP-SAT over splits); ``unequal``: the best of every split-aware
    solver, free to re-plan stages and devices too, and never worse than ``same``
    (that plan is in its search space).
    """
    equal_problem = PlanningProblem(graph, cluster, global_batch=batch, microbatches=m, schedule=schedule)
    equal = best_baseline(equal_problem, time_limit=budget / 4)
    problem = PlanningProblem(graph, cluster, global_batch=batch, microbatches=m, schedule=schedule,
                              auto_microbatches=True, max_microbatches=2 * m, per_stage=per_stage)
    same = optimize_splits(problem, equal.plan, time_limit=budget / 4) if equal else None
    best, by, plan = (same.iteration_time, "same pipeline", same.plan) if same else (None, None, None)
    for name in UNEQUAL:
        solver = get_solver(name)
        if name == "nsga":
            solver.generations, solver.population = 25, 32
        r = solver.solve(problem, time_limit=budget / 4, seed=0)
        if r.iteration_time is not None and (best is None or r.iteration_time < best):
            best, by, plan = r.iteration_time, name, r.plan
    return {"equal": equal.iteration_time if equal else None, "same": same.iteration_time if same else None,
            "unequal": best, "by": by, "split": list(plan.stages[0].microbatches) if plan else None,
            "stages": len(plan.stages) if plan else None}


def run(out: Path, quick: bool, per_stage: bool, batch: int, m: int, budget: float) -> str:
    rows = []
    clusters = {"homogeneous": homogeneous(), "heterogeneous": load_cluster(str(ROOT / "examples" / "two-servers.cluster.json"))}
    for net, graph in networks(quick).items():
        for cname, cluster in clusters.items():
            res = {s: compare(graph, cluster, s, batch, m, per_stage, budget) for s in ("gpipe", "1f1b")}
            gpipe_eq = res["gpipe"]["equal"]
            for sched, r in res.items():
                gain = r["equal"] / r["unequal"] - 1 if r["equal"] and r["unequal"] else None
                r["gain_same"] = r["equal"] / r["same"] - 1 if r["equal"] and r["same"] else None
                vs_gpipe = gpipe_eq / r["unequal"] - 1 if gpipe_eq and r["unequal"] else None
                rows.append({"net": net, "cluster": cname, "schedule": sched, **r, "gain": gain, "vs_gpipe": vs_gpipe})
                print(f"{net:13s} {cname:13s} {sched:5s} equal {1e3 * r['equal']:9.3f} ms  unequal "
                      f"{1e3 * r['unequal']:9.3f} ms ({r['by']})  gain {100 * gain:6.2f} %", flush=True)
    table = _table(rows, batch, m, per_stage)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "umpipe.md", table)
    _plot(out / "umpipe.png", rows)
    return table


def _table(rows: list[dict], batch: int, m: int, per_stage: bool) -> str:
    lines = [f"Batch {batch}, equal M = {m}, unequal: up to {2 * m} microbatches"
             f"{' per stage' if per_stage else ' (one split for all stages)'}.", "",
             "| network | cluster | schedule | equal (ms) | unequal, same pipeline (ms) | gain | "
             "unequal, re-planned (ms) | by | first split | gain | vs equal GPipe |",
             "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        split = r["split"] or []
        shown = ",".join(map(str, split[:8])) + (",…" if len(split) > 8 else "")
        lines.append(f"| {r['net']} | {r['cluster']} | {r['schedule']} | {1e3 * r['equal']:.3f} | "
                     f"{1e3 * r['same']:.3f} | {100 * r['gain_same']:.2f} % | "
                     f"{1e3 * r['unequal']:.3f} | {r['by']} | {shown} | {100 * r['gain']:.2f} % | "
                     f"{100 * r['vs_gpipe']:.2f} % |")
    return "\n".join(lines) + "\n"


def _plot(path: Path, rows: list[dict]) -> None:
    plt = pyplot()

    labels = [f"{r['net']}\n{r['cluster'][:6]} {r['schedule']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [100 * (r["gain_same"] or 0) for r in rows], 0.4, label="same pipeline, split re-chosen")
    ax.bar(x + 0.2, [100 * (r["gain"] or 0) for r in rows], 0.4, label="re-planned (stages, devices, split)")
    ax.set_xticks(x, labels, rotation=90, fontsize=7)
    ax.set_ylabel("throughput gain over equal microbatches (%)")
    ax.set_title("Unequal microbatches vs equal, per network, cluster and schedule")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "experiments" / "out"))
    parser.add_argument("--quick", action="store_true", help="fewer networks and a smaller budget")
    parser.add_argument("--per-stage", action="store_true", help="let every stage split on its own")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--budget", type=float, default=None, help="seconds per configuration and schedule")
    args = parser.parse_args()
    start = time.perf_counter()
    budget = args.budget or (4.0 if args.quick else 8.0)
    print(run(Path(args.out), args.quick, args.per_stage, args.batch, args.microbatches, budget))
    print(f"{time.perf_counter() - start:.0f} s; table and plot in {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
