"""Heterogeneous clusters (the WASET paper's setting): pipeplan's best plan vs each baseline.

The WASET abstract was not found (``papers.md`` §4), so there is no figure to compare
with: the claim measured is the setting's premise, that a planner aware of device
speeds beats the published baselines as a cluster mixes fast and slow devices.  For
each count of fast devices among eight, ``ilp`` (exact over pipeplan's equal-split
search space, warm-started by the baselines) against every baseline.
"""

from __future__ import annotations

from pipeplan.experiments.claims.common import Row, Section, Settings, gpt1, mapping, mixed
from pipeplan.solver.baselines import BASELINES, run_baselines
from pipeplan.solver.views.figures import pyplot
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.solvers import get_solver

TOTAL, BATCH, MICROBATCHES, SLOW = 8, 32, 8, 0.4


def run(settings: Settings) -> Section:
    sec = Section("hetero-mix", "Heterogeneous clusters: pipeplan's best plan vs each baseline")
    limit = settings.limit(60.0, 5.0)
    mixes = [2, 6] if settings.quick else [0, 2, 4, 6, 8]
    names = [cls.name for cls in BASELINES]
    ratios: dict[str, list[float | None]] = {n: [] for n in names}
    table, worst = [], []
    for fast in mixes:
        problem = PlanningProblem(gpt1(), mixed(fast, TOTAL, SLOW), global_batch=BATCH, microbatches=MICROBATCHES)
        best = get_solver("ilp").solve(problem, time_limit=limit, seed=settings.seed)
        base = {r.name: r for r in run_baselines(problem, seed=settings.seed, time_limit=limit)}
        row = [sec.num(fast, 0), best.status, sec.num(100 * best.gap if best.gap is not None else None, 2, "%"),
               sec.num(1e3 * best.iteration_time, 3)]
        for n in names:
            t = base[n].iteration_time
            ratios[n].append(t / best.iteration_time if t else None)
            row.append(sec.num(ratios[n][-1], 3, "×"))
        worst.append(max(r[-1] for r in ratios.values() if r[-1]))
        table.append(row)
        sec.data[f"fast={fast}"] = {"ilp": {"status": best.status, "iteration_time": best.iteration_time,
                                            "gap": best.gap, "mapping": mapping(best.plan)},
                                    "baselines": {n: base[n].iteration_time for n in names}}
    sec.method = (f"gpt1-14 on {sec.num(TOTAL, 0)} GPUs in servers of {sec.num(4, 0)}: the fast ones speed "
                  f"{sec.num(1, 0)} with {sec.num(40, 0)} GB, the slow ones speed {sec.num(SLOW, 1)} with "
                  f"{sec.num(16, 0)} GB; batch {sec.num(BATCH, 0)}, {sec.num(MICROBATCHES, 0)} microbatches, "
                  f"1F1B; {sec.num(limit, 0)} s for ilp and for all baselines together.  Each cell: the "
                  f"baseline's iteration time over pipeplan's.")
    sec.tables.append(("Baseline time / pipeplan time, by number of fast GPUs",
                       ["fast GPUs", "ilp status", "ilp gap", "ilp T (ms)", *names], table))
    sec.data["ratios"] = ratios
    sec.rows.append(Row("a speed-aware plan beats the baselines on mixed clusters", "not found (abstract unavailable)",
                        f"the slowest baseline is up to {sec.num(max(worst), 2, '×')} slower",
                        f"gpt1-14, {sec.num(TOTAL, 0)} GPUs, {sec.num(min(mixes), 0)} to {sec.num(max(mixes), 0)} fast",
                        "No paper figure to compare with; the baselines are pipeplan's reimplementations."))
    sec.save_figure(figure(sec.data), settings, "hetero-mix.png")
    return sec


def figure(data: dict):
    """Each baseline's time over pipeplan's against the number of fast GPUs, from the section's ``data``."""
    ratios = data["ratios"]
    names = list(ratios)
    mixes = [int(key.split("=")[1]) for key in data if key.startswith("fast=")]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4))
    for n, marker in zip(names, "os^vD<>ph*Xd"):
        ax.plot(mixes, ratios[n], marker=marker, label=n)
    ax.set_xlabel(f"fast GPUs out of {TOTAL}")
    ax.set_ylabel("baseline time / pipeplan's best time")
    ax.set_xticks(mixes)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)  # beside, not over, the lines
    return fig
