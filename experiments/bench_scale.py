"""Benchmark every solver on cluster sizes people plan for: 64 to 4,096 devices.

The instance (:func:`scale_problem`): a transformer-like chain of ``--layers`` blocks
(128 by default, :func:`pipeplan.experiments.bench_solvers.chain_graph`), 8 devices per
server, four device generations in equal shares of the servers (speed 1.0 / 0.6 / 0.3 /
0.12, memory 80 / 40 / 32 / 16 GB; NVLink inside the servers of the two fast
generations, PCIe inside the others), a 25 GB/s network, and the batch of
:data:`BATCHES`.

Each solver runs in a fresh child process (so its peak resident memory is its own),
with ``--time-limit`` seconds.  The child imports the modules first; its wall time
covers building the instance and the solve (the first import of modules is excepted).
Prints a markdown table (plan time relative to the best plan of the row, wall time,
peak RSS, status and proved gap) and ``--out FILE`` writes every result as JSON.

Usage::

    python -m pipeplan.experiments.bench_scale [--devices 256,1024] [--time-limit 60] [--out scale.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from pipeplan.experiments.bench_solvers import chain_graph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.core.problem import PlanningProblem

PER_SERVER = 8
"""Devices per server."""

GENERATIONS = ((1.0, 80e9, "nvlink"), (0.6, 40e9, "nvlink"), (0.3, 32e9, "pcie"), (0.12, 16e9, "pcie"))
"""``(speed, memory bytes, server link)`` of the four device generations, fastest first."""

LINKS = {"nvlink": (3.0e11, 5e-6), "pcie": (3.2e10, 1e-5)}
"""``(bandwidth B/s, latency s)`` inside a server."""

NETWORK = Link(2.5e10, 2e-5)
"""The network between servers: 25 GB/s."""

BATCHES = {64: (128, 8), 256: (512, 16), 1024: (2048, 32), 4096: (8192, 64)}
"""``devices: (global batch, microbatches)``: 2 samples per device, a few microbatches per pipeline."""

DEVICES = (64, 256, 1024, 4096)

CHILD_GRACE = 3.0
"""A child still running at this many times its limit (plus a minute) is killed and reported as such."""


def scale_cluster(devices: int) -> Cluster:
    """``devices / 8`` servers, a quarter of them of each generation (fastest first)."""
    servers = devices // PER_SERVER
    if servers < len(GENERATIONS) or servers % len(GENERATIONS):
        raise ValueError(f"{devices} devices: need a multiple of {PER_SERVER * len(GENERATIONS)}")
    links, devs = [], []
    for s in range(servers):
        speed, memory, kind = GENERATIONS[s * len(GENERATIONS) // servers]
        links.append(Link(*LINKS[kind], f"s{s}"))
        devs.extend(Device(f"s{s}g{k}", f"s{s}", speed, memory) for k in range(PER_SERVER))
    return Cluster(f"scale-{devices}", tuple(links), NETWORK, tuple(devs))


def scale_problem(devices: int, layers: int = 128) -> PlanningProblem:
    """The benchmark's instance on ``devices`` devices (see the module docstring)."""
    batch, microbatches = BATCHES[devices]
    return PlanningProblem(chain_graph(layers), scale_cluster(devices), global_batch=batch,
                           microbatches=microbatches, schedule="1f1b")


def run_child(devices: int, layers: int, solver: str, time_limit: float) -> dict:
    """Solve once in this process and describe the result (the child's side)."""
    from pipeplan.solver.core.native_output import quiet_stdout
    from pipeplan.solver.solvers import get_solver, solver_names
    solver_names()  # import every solver module before the clock starts
    start = time.perf_counter()
    problem = scale_problem(devices, layers)
    with quiet_stdout():
        result = get_solver(solver).solve(problem, time_limit=time_limit, seed=0)
    wall = time.perf_counter() - start
    plan = result.plan
    return {"solver": solver, "status": result.status, "iteration_time": result.iteration_time,
            "lower_bound": result.lower_bound, "gap": result.gap, "wall_time": wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "stages": len(plan.stages) if plan else None,
            "devices_used": sum(len(st.devices) for st in plan.stages) if plan else None,
            "message": result.message,
            "details": {k: v for k, v in result.details.items() if isinstance(v, (int, float, str, bool))}}


def run_solver(devices: int, layers: int, solver: str, time_limit: float) -> dict:
    """Run :func:`run_child` in a fresh interpreter; a child past its grace is killed."""
    cmd = [sys.executable, "-m", "pipeplan.experiments.bench_scale", "--child", solver,
           "--devices", str(devices), "--layers", str(layers), "--time-limit", str(time_limit)]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_GRACE * time_limit + 60)
    except subprocess.TimeoutExpired:
        return {"solver": solver, "status": "killed", "iteration_time": None, "lower_bound": None, "gap": None,
                "wall_time": time.perf_counter() - start, "peak_rss_mb": None, "message": "killed past its grace"}
    if done.returncode != 0:
        return {"solver": solver, "status": "error", "iteration_time": None, "lower_bound": None, "gap": None,
                "wall_time": time.perf_counter() - start, "peak_rss_mb": None,
                "message": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_size(devices: int, layers: int, solvers: list[str], time_limit: float) -> dict:
    """Every solver on one instance; each row's ``ratio`` is its plan time over the row's best."""
    rows = {}
    for name in solvers:
        rows[name] = run_solver(devices, layers, name, time_limit)
        print(f"  {devices} devices, {name}: {rows[name]['status']} in {rows[name]['wall_time']:.1f} s",
              file=sys.stderr, flush=True)
    best = min((r["iteration_time"] for r in rows.values() if r["iteration_time"]), default=None)
    for r in rows.values():
        r["ratio"] = r["iteration_time"] / best if best and r["iteration_time"] else None
    batch, microbatches = BATCHES[devices]
    return {"devices": devices, "servers": devices // PER_SERVER, "layers": layers, "global_batch": batch,
            "microbatches": microbatches, "time_limit": time_limit, "best": best, "solvers": rows}


def _cell(r: dict) -> str:
    if r["iteration_time"] is None:
        return f"{r['status']}, {r['wall_time']:.1f} s"
    gap = f", gap {100 * r['gap']:.1f} %" if r.get("gap") is not None else ""
    rss = f", {r['peak_rss_mb']:.0f} MB" if r.get("peak_rss_mb") else ""
    return f"{r['ratio']:.3f} ({1e3 * r['iteration_time']:.1f} ms) in {r['wall_time']:.1f} s{rss}{gap}"


def markdown(results: list[dict]) -> str:
    """One row per size, one column per solver: ratio (plan time) in wall time, peak RSS, gap."""
    names = list(results[0]["solvers"]) if results else []
    lines = ["| devices (servers), batch / microbatches | " + " | ".join(f"`{n}`" for n in names) + " |",
             "|" + "---|" * (len(names) + 1)]
    for res in results:
        head = f"{res['devices']} ({res['servers']}), {res['global_batch']} / {res['microbatches']}"
        lines.append("| " + head + " | " + " | ".join(_cell(res["solvers"][n]) for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)),
                        help=f"comma-separated sizes among {', '.join(map(str, BATCHES))}")
    parser.add_argument("--layers", type=int, default=128, help="blocks in the chain (default 128)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver (default 60)")
    parser.add_argument("--solvers", help="comma-separated solver names (default: every registered solver)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", metavar="SOLVER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(int(args.devices), args.layers, args.child, args.time_limit)))
        return 0
    from pipeplan.solver.solvers import solver_names
    solvers = args.solvers.split(",") if args.solvers else solver_names()
    results = []
    for devices in (int(d) for d in args.devices.split(",")):
        results.append(bench_size(devices, args.layers, solvers, args.time_limit))
        if args.out:  # keep partial results of a long run
            atomic_write_text(args.out, json.dumps(results, indent=1))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
