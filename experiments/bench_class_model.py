"""The class-level model at 64 to 4,096 devices: the bound it proves, the plan it builds, its size and memory.

Instances: the issue's first row (96 layers x 64 devices, two device types: the
``bench_solvers`` chain and two-type cluster, batch 64 in 8 microbatches; ``--devices 64``)
and ``bench_scale``'s 256, 1,024 and 4,096 devices (128 layers).  Each size runs in a
fresh child process, so the peak resident memory (``getrusage``) is the model's own:
the class bound (``solver/bounds/class_bound.py``) for comparison, then the position
model with ``--time-limit`` seconds for HiGHS, cut at ``--upper`` (the best plan known,
from ``--best FILE``, a ``bench_scale`` JSON; without it the model is uncut; at 64
devices, whose instance is in no such file, group-search's plan with the same limit in
the same child, so its memory counts too).  The gap is ``(best plan - bound) / best
plan`` with the best plan the fastest of the model's, the file's and group-search's,
and the bound the larger of the class bound and the model's.

``--paths`` reports instead, per size, group-search's plan and the largest path term of
:mod:`pipeplan.solver.bounds.class_paths` over that plan's own durations: how much of the
gap a relaxation that knew the configuration would close.

Usage::

    python -m pipeplan.experiments.bench_class_model [--devices 64,256,1024,4096] [--time-limit 60]
        [--best experiments/results/scale60.json,experiments/results/scale60_ends.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

from pipeplan.models.jsonio import atomic_write_text

DEVICES = (64, 256, 1024, 4096)


def problem_of(devices: int):
    """The instance of each size (module docstring)."""
    from pipeplan.experiments.bench_scale import scale_problem
    from pipeplan.experiments.bench_solvers import chain_graph, two_type_cluster
    from pipeplan.solver.core.problem import PlanningProblem
    if devices == 64:
        return PlanningProblem(chain_graph(96), two_type_cluster(64), global_batch=64, microbatches=8,
                               schedule="1f1b")
    return scale_problem(devices)


def run_child(devices: int, time_limit: float, upper: float) -> dict:
    """Class bound and position model on one size, in this process."""
    from pipeplan.solver.bounds.class_bound import class_bound
    from pipeplan.solver.exact.class_model import solve_class_model
    problem = problem_of(devices)
    gs_plan = None
    if devices == 64:  # the instance is in no bench_scale file: group-search gives its incumbent
        from pipeplan.solver.solvers import get_solver
        gs_plan = get_solver("group-search").solve(problem, time_limit=time_limit, seed=0).iteration_time
        upper = min(upper, gs_plan) if gs_plan else upper
    start = time.perf_counter()
    cb = class_bound(problem)
    cb_seconds = time.perf_counter() - start
    result = solve_class_model(problem, time_limit, upper=upper)
    return {"devices": devices, "layers": len(problem.graph), "class_bound": cb, "class_bound_seconds": cb_seconds,
            "model_bound": result.bound, "model_plan": result.iteration_time if math.isfinite(result.iteration_time)
            else None, "status": result.status, "nodes": result.nodes, "model_size": list(result.model_size),
            "model_seconds": result.seconds, "upper": upper if math.isfinite(upper) else None,
            "group_search": gs_plan,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def path_tightness(devices: int, time_limit: float) -> dict:
    """How close the path terms come to a good plan's time: group-search's plan, simulated and bounded by
    :func:`pipeplan.solver.bounds.class_paths.path_bound` over its own durations (``--paths``)."""
    from pipeplan.solver.bounds.class_paths import path_bound, stage_durations
    from pipeplan.solver.solvers import get_solver
    from pipeplan.solver.evaluation.simulator import plan_costs
    problem = problem_of(devices)
    plan = get_solver("group-search").solve(problem, time_limit=time_limit, seed=0).plan
    speed = problem.cluster.device_index
    bound = path_bound(problem.schedule, *stage_durations(plan_costs(plan, problem.graph, problem.cluster)),
                       [len(st.devices) * min(speed[d].speed for d in st.devices) for st in plan.stages],
                       sum(d.speed for d in problem.cluster.devices))
    time_ = problem.evaluate(plan).iteration_time
    return {"devices": devices, "stages": len(plan.stages), "plan": time_, "path_bound": bound,
            "ratio": bound / time_}


def best_known(files: list[str]) -> dict[int, float]:
    """The best plan time per device count in ``bench_scale`` JSON files."""
    best: dict[int, float] = {}
    for name in files:
        for row in json.loads(Path(name).read_text()):
            if row.get("best"):
                best[row["devices"]] = min(best.get(row["devices"], math.inf), row["best"])
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)))
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--best", default="", help="comma-separated bench_scale JSON files with the best plans known")
    parser.add_argument("--out")
    parser.add_argument("--paths", action="store_true",
                        help="only report how close the path terms come to group-search's plan, per size")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upper", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args.time_limit, args.upper)))
        return 0
    if args.paths:
        for devices in (int(d) for d in args.devices.split(",")):
            print(json.dumps(path_tightness(devices, args.time_limit)), flush=True)
        return 0
    best = {d: t for d, t in best_known([f for f in args.best.split(",") if f]).items() if d != 64}
    rows = []
    for devices in (int(d) for d in args.devices.split(",")):
        upper = best.get(devices, math.inf)
        cmd = [sys.executable, "-m", "pipeplan.experiments.bench_class_model", "--child", str(devices),
               "--time-limit", str(args.time_limit), "--upper", repr(upper)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=5 * args.time_limit + 600)
        if done.returncode:
            rows.append({"devices": devices, "error": done.stderr.strip().splitlines()[-1:]})
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        plans = [t for t in (row["model_plan"], best.get(devices), row.get("group_search")) if t]
        row["best_plan"] = min(plans) if plans else None
        bound = max(row["class_bound"], row["model_bound"])
        row["gap"] = (row["best_plan"] - bound) / row["best_plan"] if row["best_plan"] else None
        rows.append(row)
        print(f"  {devices} devices done", file=sys.stderr, flush=True)
        if args.out:
            atomic_write_text(args.out, json.dumps(rows, indent=1))
    print("| devices | class bound | model bound (status, nodes, size) | model plan | best plan | gap | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['devices']} | error: {r['error']} | | | | | |")
            continue
        plan = f"{1e3 * r['model_plan']:.1f} ms" if r["model_plan"] else "-"
        gap = f"{100 * r['gap']:.1f} %" if r["gap"] is not None else "-"
        print(f"| {r['devices']} | {1e3 * r['class_bound']:.1f} ms | {1e3 * r['model_bound']:.1f} ms ({r['status']}, "
              f"{r['nodes']}, {r['model_size'][0]} x {r['model_size'][1]}) | {plan} | "
              f"{1e3 * r['best_plan']:.1f} ms | {gap} | {r['peak_rss_mb']:.0f} MB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
