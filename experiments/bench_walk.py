"""One exact solver on ``bench_solvers``' instance (64 layers x 16 devices by default): wall and CPU time, details.

The configuration walk is most of ``ilp``'s proof there; this runs just that solve, so two
revisions can be compared side by side (each worktree's own environment, interleaved runs).
The counted work (``enumeration_prefixes``, ``enumeration_table_cells`` and, under
``--profile``, cProfile's call counts) is the same on any machine; the times are not.

Usage::

    python -m pipeplan.experiments.bench_walk [--solver ilp] [--layers 64 --devices 16]
        [--time-limit 300] [--after] [--profile OUT.prof]

``--after`` first runs, in the same process, the solvers ``bench_solvers`` runs before this
one (as its table does); ``--profile`` writes cProfile's statistics of the solve.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import resource
import time

from pipeplan.experiments import bench_solvers as bs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solver", default="ilp")
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--devices", type=int, default=16, choices=sorted(bs.SERVERS))
    parser.add_argument("--time-limit", type=float, default=300.0,
                        help="large enough that counted work, not the clock, ends the solve")
    parser.add_argument("--after", action="store_true", help="run the solvers bench_solvers runs before it first")
    parser.add_argument("--profile", metavar="FILE", help="write cProfile's statistics of the solve")
    args = parser.parse_args(argv)
    problem = bs.PlanningProblem(bs.chain_graph(args.layers), bs.two_type_cluster(args.devices), global_batch=64,
                                 microbatches=8, schedule="1f1b")
    if args.after:
        for name in bs.solver_names()[:bs.solver_names().index(args.solver)]:
            bs.solve_row(name, problem, args.time_limit if name in bs.FULL_LIMIT else 5.0)
    profile = cProfile.Profile() if args.profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profile:
        profile.enable()
    result = bs.get_solver(args.solver).solve(problem, time_limit=args.time_limit, seed=0)
    if profile:
        profile.disable()
        profile.dump_stats(args.profile)
    print(json.dumps({"wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(time.process_time() - cpu, 3),
                      "status": result.status, "iteration_time": result.iteration_time,
                      "lower_bound": result.lower_bound,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                      "details": {k: v for k, v in result.details.items() if isinstance(v, (int, float, str))}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
