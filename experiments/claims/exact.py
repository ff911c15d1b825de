"""pipeplan's own claim: the exact solvers prove their gap, and how fast, as instances grow.

For synthetic chains of growing length on a two-speed cluster, ``ilp`` and ``cpsat``
with a fixed time limit: their status, proved gap (``(T - bound) / T``) and wall time.
"""

from __future__ import annotations

from pipeplan.experiments.claims.common import Row, Section, Settings, mixed
from pipeplan.models.synthetic import synthetic_graph
from pipeplan.solver.views.figures import pyplot
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.solvers import get_solver

SOLVERS = ("ilp", "cpsat")
DEVICES, BATCH, MICROBATCHES = 8, 32, 8


def run(settings: Settings) -> Section:
    sec = Section("exact", "pipeplan: proved gap and solve time of ilp and cpsat as instances grow")
    limit = settings.limit(60.0, 5.0)
    sizes = [8, 16] if settings.quick else [8, 16, 32, 64, 128, 256]
    data = {n: {"status": [], "gap": [], "wall": []} for n in SOLVERS}
    table = []
    for layers in sizes:
        graph = synthetic_graph(layers, settings.seed + layers, compute_spread=1.0)
        problem = PlanningProblem(graph, mixed(DEVICES // 2, DEVICES), global_batch=BATCH, microbatches=MICROBATCHES)
        row = [sec.num(layers, 0)]
        for n in SOLVERS:
            r = get_solver(n).solve(problem, time_limit=limit, seed=settings.seed)
            data[n]["status"].append(r.status)
            data[n]["gap"].append(r.gap)
            data[n]["wall"].append(r.wall_time)
            row += [r.status, sec.num(100 * r.gap if r.gap is not None else None, 3, "%"), sec.num(r.wall_time, 2)]
        table.append(row)
    sec.data = {"layers": sizes, **data}
    sec.method = (f"Synthetic chains (models/synthetic.py, seed {sec.num(settings.seed, 0)} + layers) on "
                  f"{sec.num(DEVICES, 0)} GPUs, half at speed {sec.num(0.4, 1)}; batch {sec.num(BATCH, 0)}, "
                  f"{sec.num(MICROBATCHES, 0)} microbatches, 1F1B; {sec.num(limit, 0)} s per solve.")
    sec.tables.append(("Status, proved gap and wall time (s)",
                       ["layers", *(f"{n} {c}" for n in SOLVERS for c in ("status", "gap", "s"))], table))
    proved = [sizes[i] for i in range(len(sizes)) if any(data[n]["status"][i] == "optimal" for n in SOLVERS)]
    sec.rows.append(Row("exact planning with a proved gap", "(pipeplan's own claim)",
                        f"optimal proved up to {sec.num(max(proved), 0) if proved else 'none'} layers; largest gap "
                        f"{sec.num(100 * max((g for n in SOLVERS for g in data[n]['gap'] if g is not None), default=0), 3, '%')}",
                        f"synthetic chains, {sec.num(DEVICES, 0)} GPUs, {sec.num(limit, 0)} s limit",
                        "Time-limited: a slower machine proves less within the same limit."))
    sec.save_figure(figure(sec.data), settings, "exact-gap-time.png")
    return sec


def figure(data: dict):
    """Solve time and proved gap against the number of layers, from the section's ``data``."""
    sizes = data["layers"]
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    gaps = [100 * g for n in SOLVERS for g in data[n]["gap"] if g is not None]
    for n, marker in zip(SOLVERS, ("o", "s")):
        a1.plot(sizes, data[n]["wall"], marker=marker, label=n)
        a2.plot(sizes, [100 * g if g is not None else None for g in data[n]["gap"]], marker=marker, label=n,
                clip_on=False)  # markers at 0 gap drawn whole on the axis
    a1.set_xlabel("layers")
    a1.set_ylabel("solve time (s)")
    a2.set_xlabel("layers")
    a2.set_ylabel("proved gap (%)")
    # a plain axis from 0: gaps of 1e-10 % (optimal up to rounding) would otherwise sit on an offset
    # axis ("1e-15 + 1e-10") that reads as negative gaps; at least 1 % tall so round-off shows as 0
    a2.ticklabel_format(axis="y", style="plain", useOffset=False)
    a2.set_ylim(0, max([1.0, *(1.1 * g for g in gaps)]))
    a1.legend()
    a2.legend()
    return fig
