"""AutoPipe-H (IEEE TC 2025): heterogeneous servers, vs DAPPLE and Piper.

Paper (abstract): up to 1.26× faster than DAPPLE and Piper on commodity GPU servers
whose heterogeneity prior planners ignore.  pipeplan: an old PCIe server (listed first)
and a new NVLink server (:func:`~pipeplan.experiments.claims.common.nvlink_pcie`); each
planner's plan, its simulated iteration time and the device mapping it chose.
pipeplan's ``autopipe`` has no device mapper of its own: it runs a pure pipeline on the
fastest devices (``solver/baselines/autopipe.py``).
"""

from __future__ import annotations

from pipeplan.experiments.claims.common import Row, Section, Settings, gpt1, mapping, nvlink_pcie, vgg16
from pipeplan.solver.problem import PlanningProblem
from pipeplan.solver.registry import get_solver

PLANNERS = ("autopipe", "dapple", "piper")
BATCH, MICROBATCHES = 32, 8


def run(settings: Settings) -> Section:
    sec = Section("autopipe-h", "AutoPipe-H: heterogeneous servers vs DAPPLE and Piper")
    limit = settings.limit(60.0, 10.0)
    cluster = nvlink_pcie(4)
    graphs = {"gpt1-14": gpt1()} if settings.quick else {"gpt1-14": gpt1(), "vgg16": vgg16()}
    table, speedups = [], []
    for net, graph in graphs.items():
        problem = PlanningProblem(graph, cluster, global_batch=BATCH, microbatches=MICROBATCHES)
        times = {}
        for name in PLANNERS:
            r = get_solver(name).solve(problem, time_limit=limit, seed=settings.seed)
            times[name] = r.iteration_time
            sec.data[f"{net}/{name}"] = {"status": r.status, "iteration_time": r.iteration_time,
                                         "mapping": mapping(r.plan)}
            table.append([net, name, r.status, sec.num(1e3 * r.iteration_time if r.plan else None, 3),
                          mapping(r.plan)])
        for other in ("dapple", "piper"):
            if times["autopipe"] and times[other]:
                speedups.append(times[other] / times["autopipe"])
                sec.data[f"{net}/speedup_over_{other}"] = speedups[-1]
    sec.method = (f"{sec.num(4, 0)} PCIe GPUs (speed {sec.num(0.5, 1)}, {sec.num(16, 0)} GB, listed first) and "
                  f"{sec.num(4, 0)} NVLink GPUs (speed {sec.num(1, 0)}, {sec.num(40, 0)} GB); batch "
                  f"{sec.num(BATCH, 0)}, {sec.num(MICROBATCHES, 0)} microbatches, 1F1B; "
                  f"{sec.num(limit, 0)} s per planner.  Mapping: first-last layer @ devices, per stage.")
    sec.tables.append(("Plans and iteration times", ["network", "planner", "status", "T (ms)", "mapping"], table))
    best = max(speedups) if speedups else None
    sec.rows.append(Row("iteration time vs DAPPLE and Piper", "up to 1.26×",
                        f"up to {sec.num(best, 2, '×')} (min {sec.num(min(speedups) if speedups else None, 2, '×')})",
                        f"{', '.join(graphs)} on NVLink + PCIe servers",
                        "Piper sees one device type and DAPPLE's placement ranks servers but balances by "
                        "block time; the paper's hardware, models and mapper are not public."))
    sec.shown.append(1.26)
    return sec
