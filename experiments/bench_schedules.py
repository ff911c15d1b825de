"""Compare the pipeline schedules on the solver benchmark's clusters, by simulation.

For each cluster of ``experiments/bench_solvers.py`` (a chain graph of ``L`` layers on
the two-type cluster of ``D`` devices, batch 64 in 8 microbatches) and each schedule
of :data:`CASES`, one plan of the same *layer-balanced family* is simulated:

- ``R`` device groups of ``D / R`` consecutive devices each (``--groups``; ``D`` means
  one device per group);
- ``S = num_stages(schedule, R, v)`` stages, the layers split as evenly as possible
  (the first ``L mod S`` stages take one layer more);
- stage ``s`` on group ``stage_group(schedule, s, R)``, every stage with the same
  equal microbatches, no recompute.

The chain graph carries the version-2 fields (spec 7.1) in the shares an analytic
profile gives a transformer block (:func:`block_shares`, from
:func:`pipeplan.models.profile_analytic.profile_analytic` of ``gpt-tiny``'s blocks):
``bwd_w`` is that share of ``bwd`` (per-call and per-sample parts apart), ``act_w``
that share of ``act``, and ``step`` is the analytic Adam step,
``7 * params / bandwidth`` on the analytic device's memory bandwidth.

Reported per plan: the iteration time ``T``, the bubble fraction
``1 - sum of busy action time / (T * groups)`` and the largest per-device peak memory
over the groups, with whether every group fits.  A schedule that cannot build a plan
(more stages than layers, a microbatch count torch refuses) is reported with the
reason.  The results hold no clock reading, so a rerun writes the same files.

Usage::

    python -m pipeplan.experiments.bench_schedules [--quick] [--pairs 16x4,32x8] [--groups 4,D]
        [--out-dir experiments/results]

writes ``schedules.json``, ``schedules.md`` and ``schedules.png`` in ``--out-dir``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeplan.experiments.bench_solvers import (PAIRS, QUICK, SCHEDULE_CASES, SERVERS, case_name,  # noqa: E402
                                               chain_graph, two_type_cluster, usage_error)
from pipeplan.models.errors import InputError  # noqa: E402
from pipeplan.models.graph import LayerGraph  # noqa: E402
from pipeplan.models.jsonio import atomic_write_text  # noqa: E402
from pipeplan.solver.formats.cluster import Cluster  # noqa: E402
from pipeplan.solver.formats.plan import Plan, Stage, equal_split  # noqa: E402
from pipeplan.solver.schedules.schedule import num_stages, stage_group  # noqa: E402
from pipeplan.solver.evaluation.simulator import simulate  # noqa: E402

CASES = SCHEDULE_CASES
"""``(schedule, v)`` pairs compared, the solver benchmark's schedule columns."""

GLOBAL_BATCH = 64
MICROBATCHES = 8
STATE_FACTOR = 4.0
PROFILE_MODEL = "gpt-tiny"
"""Zoo model whose analytic profile gives the version-2 shares of a transformer block."""

GROUPS = ("4", "D")
"""Default ``--groups``: four groups, and one group per device."""


@dataclass(frozen=True)
class BlockShares:
    """The version-2 fields of a transformer block as shares of its version-1 fields."""

    bwd_w_fixed: float
    """``a_w / a_b``: the weight-gradient share of the backward's per-call time."""
    bwd_w_sample: float
    """``b_w / b_b``: the weight-gradient share of the backward's per-sample time."""
    act_w: float
    """``act_w / act``: the share of the saved bytes the weight gradient still reads."""
    step_bandwidth: float
    """Memory bandwidth (bytes/s) the analytic optimizer step is bound by."""


@functools.lru_cache(maxsize=None)
def block_shares(model: str = PROFILE_MODEL) -> BlockShares:
    """The shares an analytic profile gives the ``block.*`` layers of zoo ``model``, summed over them.

    Parameters
    ----------
    model : str
        A zoo model with layers named ``block.<i>``.

    Returns
    -------
    BlockShares

    Raises
    ------
    ValueError
        If the model has no ``block.*`` layer.

    Examples
    --------
    >>> s = block_shares()
    >>> 0 < s.bwd_w_sample <= 1 and 0 < s.act_w <= 1
    True
    """
    from pipeplan.models.profile_analytic import DeviceModel, profile_analytic

    blocks = [layer for layer in profile_analytic(model).layers if layer.name.startswith("block.")]
    if not blocks:
        raise ValueError(f"zoo model {model!r} has no layer named block.<i>; give a transformer")
    return BlockShares(sum(b.weight_bwd[0] for b in blocks) / sum(b.bwd[0] for b in blocks),
                       sum(b.weight_bwd[1] for b in blocks) / sum(b.bwd[1] for b in blocks),
                       sum(b.act_weight for b in blocks) / sum(b.act for b in blocks),
                       DeviceModel().bandwidth)


def v2_chain_graph(layers: int, shares: BlockShares) -> LayerGraph:
    """The solver benchmark's chain graph with ``bwd_w``, ``act_w`` and ``step`` in the given shares.

    Examples
    --------
    >>> g = v2_chain_graph(4, BlockShares(0.5, 0.25, 0.5, 1e12))
    >>> g.format, g.layers[0].bwd_w[1] == g.layers[0].bwd[1] / 4
    ('pipeplan.graph/2', True)
    """
    from pipeplan.models.profile_step import estimated_step

    base = chain_graph(layers)
    blocks = [replace(layer, bwd_w=(layer.bwd[0] * shares.bwd_w_fixed, layer.bwd[1] * shares.bwd_w_sample),
                      act_w=layer.act * shares.act_w,
                      step=estimated_step(layer.params, "adam", shares.step_bandwidth))
              for layer in base.layers]
    return LayerGraph.chain(base.name, blocks, input_bytes=base.input_bytes)


def balanced_split(layers: int, stages: int) -> list[tuple[int, int]]:
    """``stages`` contiguous layer ranges whose sizes differ by at most one, larger ones first.

    Raises
    ------
    ValueError
        If there are more stages than layers.

    Examples
    --------
    >>> balanced_split(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if not 1 <= stages <= layers:
        raise ValueError(f"{stages} stages need at least {stages} layers, the graph has {layers}")
    size, extra = divmod(layers, stages)
    bounds, lo = [], 0
    for s in range(stages):
        hi = lo + size + (s < extra)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def device_groups(cluster: Cluster, groups: int) -> list[tuple[str, ...]]:
    """``groups`` groups of consecutive devices of ``cluster``, equal in size.

    Raises
    ------
    ValueError
        If the devices do not divide into ``groups`` equal groups.

    Examples
    --------
    >>> [len(g) for g in device_groups(two_type_cluster(8), 4)]
    [2, 2, 2, 2]
    """
    ids = [d.id for d in cluster.devices]
    if groups < 1 or len(ids) % groups:
        raise ValueError(f"{len(ids)} devices do not divide into {groups} equal groups")
    per = len(ids) // groups
    return [tuple(ids[g * per:(g + 1) * per]) for g in range(groups)]


def build_plan(schedule: str, virtual: int, graph: LayerGraph, cluster: Cluster, groups: int,
               microbatches: int = MICROBATCHES, global_batch: int = GLOBAL_BATCH) -> Plan:
    """The layer-balanced plan of ``schedule`` with ``v = virtual`` on ``groups`` device groups.

    Raises
    ------
    ValueError
        If the schedule cannot have that many stages or groups, or the layers are too few.

    Examples
    --------
    >>> p = build_plan("zbv", 2, v2_chain_graph(8, BlockShares(.5, .5, .5, 1e12)), two_type_cluster(4), 2)
    >>> p.stage_groups, [st.layers for st in p.stages]
    ([0, 1, 1, 0], [(0, 2), (2, 4), (4, 6), (6, 8)])
    """
    devices = device_groups(cluster, groups)
    split = tuple(equal_split(global_batch, microbatches))
    stages = tuple(Stage(bounds, devices[stage_group(schedule, s, groups)], split)
                   for s, bounds in enumerate(balanced_split(len(graph), num_stages(schedule, groups, virtual))))
    return Plan(graph.name, cluster.name, global_batch, STATE_FACTOR, schedule, stages)


def measure(plan: Plan, graph: LayerGraph, cluster: Cluster) -> dict:
    """What :func:`~pipeplan.solver.evaluation.simulator.simulate` gives ``plan``: time, bubble, largest peak, fit."""
    result = simulate(plan, graph, cluster)
    return {"iteration_time": result.iteration_time, "bubble_fraction": result.bubble_fraction,
            "peak_memory": max(result.peak_memory), "fits": result.fits,
            "stages": plan.num_stages, "groups": len(plan.groups)}


def bench_case(schedule: str, virtual: int, graph: LayerGraph, cluster: Cluster, groups: int) -> dict:
    """One schedule on one cluster: :func:`measure` of its plan, or the reason there is none."""
    row = {"schedule": schedule, "virtual": virtual, "name": case_name(schedule, virtual)}
    try:
        plan = build_plan(schedule, virtual, graph, cluster, groups)
        row.update(measure(plan, graph, cluster))
    except (ValueError, InputError) as err:
        row["refused"] = str(err)
    return row


def bench_cluster(layers: int, devices: int, groups: int, shares: BlockShares) -> dict:
    """Every case of :data:`CASES` on the chain of ``layers`` on the two-type cluster of ``devices``."""
    graph, cluster = v2_chain_graph(layers, shares), two_type_cluster(devices)
    rows = [bench_case(schedule, v, graph, cluster, groups) for schedule, v in CASES]
    fitting = [r for r in rows if r.get("fits")]
    best = min(fitting, key=lambda r: r["iteration_time"])["name"] if fitting else None
    return {"layers": layers, "devices": devices, "servers": SERVERS[devices], "groups": groups,
            "microbatches": MICROBATCHES, "global_batch": GLOBAL_BATCH, "best": best, "cases": rows}


def _cell(row: dict) -> str:
    if "refused" in row:
        return "-"
    fits = "" if row["fits"] else " (does not fit)"
    return (f"{1e3 * row['iteration_time']:.1f} ms / {100 * row['bubble_fraction']:.1f} % / "
            f"{row['peak_memory'] / 1e9:.2f} GB{fits}")


def cluster_label(res: dict) -> str:
    """``64 x 16, R=4``: layers, devices and groups of one result."""
    return f"{res['layers']} x {res['devices']}, R={res['groups']}"


def markdown(results: list[dict]) -> str:
    """One row per schedule, one column per cluster: ``T / bubble / peak``; then the fastest per cluster."""
    head = ["schedule", *(cluster_label(res) for res in results)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, (schedule, v) in enumerate(CASES):
        lines.append("| " + " | ".join([case_name(schedule, v), *(_cell(res["cases"][i]) for res in results)]) + " |")
    lines += ["", "| cluster | fastest schedule that fits | vs 1f1b |", "|---|---|---:|"]
    for res in results:
        by_name = {r["name"]: r for r in res["cases"]}
        best, base = by_name.get(res["best"]), by_name["1f1b"]
        ratio = f"{best['iteration_time'] / base['iteration_time']:.3f}" if best and base.get("fits") else "-"
        lines.append(f"| {cluster_label(res)} | {res['best'] or '-'} | {ratio} |")
    refusals = [(cluster_label(res), r) for res in results for r in res["cases"] if "refused" in r]
    if refusals:
        lines += ["", "Not built (`-`):", ""]
        lines += [f"- {label}, {r['name']}: {r['refused']}" for label, r in refusals]
    return "\n".join(lines) + "\n"


def bar_chart(results: list[dict], path: Path) -> None:
    """Iteration time of each schedule relative to 1F1B, grouped by cluster, as a PNG."""
    from pipeplan.solver.views.figures import pyplot, save_png

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(results) + 2), 4.0))
    width = 0.8 / len(CASES)
    for i, (schedule, v) in enumerate(CASES):
        values = []
        for res in results:
            row, base = res["cases"][i], res["cases"][CASES.index(("1f1b", 1))]
            built = "refused" not in row and "refused" not in base
            values.append(row["iteration_time"] / base["iteration_time"] if built else 0.0)
        ax.bar([c + (i - len(CASES) / 2 + 0.5) * width for c in range(len(results))], values, width,
               label=case_name(schedule, v))
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(results)), [cluster_label(res) for res in results])
    ax.set_ylabel("iteration time / 1F1B's (simulated)")
    ax.set_title(f"layer-balanced plans, batch {GLOBAL_BATCH} in {MICROBATCHES} microbatches")
    ax.set_ylim(0.0, 1.3)  # room above the 1F1B line for the legend
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    fig.tight_layout()
    save_png(fig, str(path))


def group_counts(spec: str, devices: int) -> list[int]:
    """The ``--groups`` values for a cluster of ``devices``: ``D`` is ``devices``; duplicates dropped."""
    counts = []
    for item in spec.split(","):
        count = devices if item.strip() == "D" else int(item)
        if count not in counts and count <= devices and devices % count == 0:
            counts.append(count)
    return counts


def run(pairs: list[tuple[int, int]], groups: str, shares: BlockShares | None = None) -> list[dict]:
    """:func:`bench_cluster` for every pair and every group count of ``groups``."""
    shares = shares or block_shares()
    return [bench_cluster(layers, devices, r, shares)
            for layers, devices in pairs for r in group_counts(groups, devices)]


def write_results(results: list[dict], shares: BlockShares, out_dir: Path) -> None:
    """``schedules.json``, ``schedules.md`` and ``schedules.png`` in ``out_dir``, each atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"shares": asdict(shares), "profile_model": PROFILE_MODEL, "results": results}
    atomic_write_text(out_dir / "schedules.json", json.dumps(record, indent=1) + "\n")
    atomic_write_text(out_dir / "schedules.md", markdown(results))
    bar_chart(results, out_dir / "schedules.png")


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """``"16x4,32x8"`` as ``[(16, 4), (32, 8)]``; devices must be a cluster size of the solver benchmark."""
    pairs = []
    for item in text.split(","):
        layers, _, devices = item.partition("x")
        pair = (int(layers), int(devices))
        if pair[1] not in SERVERS:
            usage_error(f"error: --pairs: {item}: devices must be one of {', '.join(map(str, SERVERS))}")
        pairs.append(pair)
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the solver benchmark's quick pairs: " + ", ".join(f"{l}x{d}" for l, d in QUICK))
    parser.add_argument("--pairs", help="explicit layers x devices pairs, e.g. 16x4,32x8")
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help="device-group counts R per cluster, D for one device per group (default 4,D)")
    parser.add_argument("--out-dir", type=Path, default=Path("experiments/results"),
                        help="where schedules.json, .md and .png go (default experiments/results)")
    args = parser.parse_args(argv)
    pairs = parse_pairs(args.pairs) if args.pairs else QUICK if args.quick else PAIRS
    shares = block_shares()
    results = run(pairs, args.groups, shares)
    write_results(results, shares, args.out_dir)
    print(markdown(results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
