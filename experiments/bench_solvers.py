"""Benchmark the exact solvers and the baselines on chain graphs and two-type clusters.

For each (layers, devices) pair: solve time, status and gap of ``ilp`` and ``cpsat``,
and the ratio of each baseline's iteration time to the best plan found by anyone.
Prints a markdown table; ``--out FILE`` also writes every result as JSON.

The grid pairs layers with devices as the issue asks: (16, 4), (32, 8), (64, 16),
(96, 32), (96, 64), (128, 64); ``--all`` runs the full cross product.  Baselines get
``--baseline-limit`` seconds each; pipeplan's own time-limited heuristics
(``cpsat-split``, ``nsga``) get the exact solvers' ``--time-limit``; the pure-Python DPs (``dapple``, ``alpa``,
``pipedream``) give up on the large instances, and the table shows ``-`` for a
baseline that returned no plan.  HiGHS's banner is silenced at the fd level.

Usage::

    python -m pipeplan.experiments.bench_solvers [--quick] [--time-limit 60] [--out bench.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeplan.models.graph import Layer, LayerGraph  # noqa: E402
from pipeplan.solver.cluster import Cluster, Device, Link  # noqa: E402
from pipeplan.solver.problem import PlanningProblem  # noqa: E402
from pipeplan.solver.ilp import quiet_stdout  # noqa: E402
from pipeplan.solver.registry import get_solver, solver_names  # noqa: E402

LAYERS = (16, 32, 64, 96, 128)
DEVICES = (4, 8, 16, 32, 64)
SERVERS = {4: 2, 8: 2, 16: 4, 32: 4, 64: 8}
QUICK = [(16, 4), (32, 8), (64, 16)]
PAIRS = [(16, 4), (32, 8), (64, 16), (96, 32), (96, 64), (128, 64)]
EXACT = ("ilp", "cpsat")
FULL_LIMIT = (*EXACT, "cpsat-split", "nsga")
"""Solvers given ``--time-limit`` (the others ``--baseline-limit``)."""


def chain_graph(layers: int, seed: int = 0) -> LayerGraph:
    """A transformer-like chain: similar blocks with +-20 % noise, a heavier head."""
    rng = random.Random(seed)
    blocks = []
    for i in range(layers):
        scale = rng.uniform(0.8, 1.2) * (2.0 if i == layers - 1 else 1.0)
        blocks.append(Layer(f"block.{i}", (2e-5, 1.5e-4 * scale), (4e-5, 3.0e-4 * scale),
                            params=2.0e8 * scale, act=3.0e7 * scale, out=4.0e6))
    return LayerGraph.chain(f"chain{layers}", blocks, input_bytes=4.0e6)


def two_type_cluster(devices: int) -> Cluster:
    """Half the servers hold fast 80 GB devices on NVLink, half slow 24 GB devices on PCIe."""
    servers = SERVERS[devices]
    per = devices // servers
    links, devs = [], []
    for s in range(servers):
        fast = s < servers // 2
        links.append(Link(3.0e11 if fast else 3.2e10, 5e-6 if fast else 1e-5, f"s{s}"))
        for k in range(per):
            devs.append(Device(f"s{s}g{k}", f"s{s}", 1.0 if fast else 0.45, 80e9 if fast else 24e9))
    return Cluster(f"two-type-{devices}", tuple(links), Link(1.25e10, 2e-5), tuple(devs))


def bench_one(layers: int, devices: int, time_limit: float, baseline_limit: float) -> dict:
    problem = PlanningProblem(chain_graph(layers), two_type_cluster(devices), global_batch=64,
                              microbatches=8, schedule="1f1b")
    rows = {}
    for name in solver_names():
        limit = time_limit if name in FULL_LIMIT else baseline_limit
        start = time.perf_counter()
        with quiet_stdout():
            result = get_solver(name).solve(problem, time_limit=limit, seed=0)
        rows[name] = {"status": result.status, "iteration_time": result.iteration_time,
                      "lower_bound": result.lower_bound, "gap": result.gap,
                      "wall_time": time.perf_counter() - start,
                      "stages": len(result.plan.stages) if result.plan else None,
                      "details": {k: v for k, v in result.details.items() if isinstance(v, (int, float, str))}}
    best = min((r["iteration_time"] for r in rows.values() if r["iteration_time"]), default=None)
    for r in rows.values():
        r["ratio"] = r["iteration_time"] / best if best and r["iteration_time"] else None
    return {"layers": layers, "devices": devices, "servers": SERVERS[devices], "best": best, "solvers": rows}


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def markdown(results: list[dict]) -> str:
    baselines = [n for n in results[0]["solvers"] if n not in EXACT] if results else []
    head = ["L x D (servers)", *(f"{n} time / status / gap / ratio" for n in EXACT if n in results[0]["solvers"]),
            *(f"{n} ratio" for n in baselines)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        cells = [f"{res['layers']} x {res['devices']} ({res['servers']})"]
        for n in EXACT:
            r = res["solvers"].get(n)
            if r is not None:
                gap = f"{100 * r['gap']:.2f} %" if r["gap"] is not None else "-"
                cells.append(f"{r['wall_time']:.2f} s / {r['status']} / {gap} / {_fmt(r['ratio'], '.3f')}")
        cells += [_fmt(res["solvers"][n]["ratio"], ".3f") for n in baselines]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset: " + ", ".join(f"{l}x{d}" for l, d in QUICK))
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact solve (default 60)")
    parser.add_argument("--baseline-limit", type=float, default=10.0, help="seconds per baseline (default 10)")
    parser.add_argument("--all", action="store_true", help="every (layers, devices) pair, not the paired grid")
    parser.add_argument("--pairs", help="explicit pairs, e.g. 16x4,32x8")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.pairs:
        pairs = [tuple(int(v) for v in p.split("x")) for p in args.pairs.split(",")]
    else:
        pairs = QUICK if args.quick else [(l, d) for l in LAYERS for d in DEVICES] if args.all else PAIRS
    results = []
    for layers, devices in pairs:
        results.append(bench_one(layers, devices, args.time_limit, args.baseline_limit))
        print(f"done {layers} x {devices}", file=sys.stderr, flush=True)
        if args.out:  # keep partial results of a long run
            args.out.write_text(json.dumps(results, indent=1))
    print(markdown(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
