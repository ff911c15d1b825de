"""AutoPipe (CLUSTER'22) vs Megatron-LM: up to 1.30× faster (``papers.md`` §2.1).

Megatron-LM has no planner: it splits the transformer blocks evenly over the stages
(``solver/baselines/megatron.py``).  AutoPipe balances the stages by their cost.  The
speedup is Megatron's iteration time over AutoPipe's, both pure pipelines on the same
model and cluster, simulated on the claim's models and, where the runtime can run
them here, measured on small zoo models on two CPU processes.
"""

from __future__ import annotations

from pipeplan.experiments.claims.common import Row, Section, Settings, gpt1, mapping, one_server, vgg16
from pipeplan.experiments.claims.runs import FULL_RUNS, cpu_cluster, measure_plans, profiled, ratios, record
from pipeplan.models.synthetic import synthetic_graph
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.solvers import get_solver

PLANNERS = ("autopipe", "megatron")
PAPER = 1.30
"""AutoPipe's speedup over Megatron-LM, from the abstract ("up to")."""
MEASURED = {"gpt-tiny": (32, 8, (1, 2, 4, 8)), "unet": (16, 4, (1, 2, 4, 8))}
"""Measured models: global batch, microbatches, the batch sizes profiled."""


def plans_for(problem: PlanningProblem, limit: float, seed: int) -> dict:
    """``{planner: SolverResult}`` of autopipe and megatron on ``problem``."""
    return {name: get_solver(name).solve(problem, time_limit=limit, seed=seed) for name in PLANNERS}


def megatron_rows(sec: Section, settings: Settings, limit: float, batch: int, microbatches: int, stages: int
                  ) -> None:
    """Add the simulated comparison (and, in the full run, the measured one) to ``sec``."""
    graphs = {"gpt1-14": gpt1(), "vgg16": vgg16(),
              "synthetic-32": synthetic_graph(32, settings.seed + 3, compute_spread=1.0)}
    table, speedups = [], {}
    for net, graph in graphs.items():
        problem = PlanningProblem(graph, one_server(stages), global_batch=batch, microbatches=microbatches,
                                  allow_replication=False, max_stages=stages)
        found = plans_for(problem, limit, settings.seed)
        for name, r in found.items():
            table.append([net, name, r.status, sec.num(1e3 * r.iteration_time if r.plan else None, 3),
                          mapping(r.plan)])
        a, m = found["autopipe"].iteration_time, found["megatron"].iteration_time
        speedups[net] = m / a if a and m else None
    sec.data["megatron"] = {"speedups": speedups}
    sec.tables.append((f"AutoPipe vs Megatron-LM, simulated ({sec.num(stages, 0)} GPUs at most, pure pipelines)",
                       ["network", "planner", "status", "T (ms)", "mapping"], table))
    found = [s for s in speedups.values() if s is not None]
    sec.rows.append(Row("iteration time vs Megatron-LM", f"up to {sec.num(PAPER, 2, '×')}",
                        f"up to {sec.num(max(found) if found else None, 2, '×')} "
                        f"(min {sec.num(min(found) if found else None, 2, '×')})",
                        f"{', '.join(graphs)} on {sec.num(stages, 0)} equal GPUs, no replication",
                        "Megatron splits blocks by count and puts the embedding and the head on the end "
                        "stages, so the gain is what that imbalance costs on each model (see the table); "
                        "AutoPipe's sub-layer partitioning is not modelled."))
    if not settings.quick:
        _measured(sec, settings, limit)


def _measured(sec: Section, settings: Settings, limit: float) -> None:
    runs = FULL_RUNS
    cluster = cpu_cluster("cpu-2", [1.0, 1.0])
    shown = []
    for model, (batch, microbatches, sizes) in MEASURED.items():
        graph = profiled(model, sizes)
        problem = PlanningProblem(graph, cluster, global_batch=batch, microbatches=microbatches,
                                  allow_replication=False)
        plans = {n: r.plan for n, r in plans_for(problem, limit, settings.seed).items() if r.plan is not None}
        measured = measure_plans(plans, graph, cluster, model, runs)
        conditions = (f"{model} profiled on this machine, {sec.num(2, 0)} CPU processes on loopback, batch "
                      f"{sec.num(batch, 0)}, {sec.num(microbatches, 0)} microbatches, 1F1B, {runs.describe(sec)}")
        record(sec, f"megatron/measured/{model}", plans, measured, runs, conditions)
        sim, meas = ratios(measured, "megatron", "autopipe")
        sec.data[f"megatron/measured/{model}"]["speedup"] = {"simulated": sim, "measured": meas}
        shown.append(f"{model}: simulated {sec.num(sim, 2, '×')}, measured {sec.num(meas, 2, '×')}")
    sec.rows.append(Row("measured: iteration time vs Megatron-LM", f"up to {sec.num(PAPER, 2, '×')}",
                        "; ".join(shown),
                        f"{', '.join(MEASURED)} on {sec.num(2, 0)} CPU processes, {runs.describe(sec)}",
                        "gpt-tiny's blocks are equal, so both planners may cut it alike; unet's units are not."))
