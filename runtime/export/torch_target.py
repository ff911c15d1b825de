"""``pipeplan export --to torch``: a folder that trains the plan with torch.distributed.pipelining.

Three files: ``schedule.csv`` (every pipeline rank's actions in torch's compute-only
CSV format, the one ``_PipelineScheduleRuntime._load_csv`` reads), ``stages.json``
(each rank's stage, the units / module names each stage holds, the tensors crossing
its cuts, its data-parallel group) and ``train.py`` (:mod:`pipeplan.runtime.export.torch_train`).
"""

from __future__ import annotations

import inspect
import json

from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export import torch_train
from pipeplan.solver.plan import Plan
from pipeplan.solver.schedule import format_op

EXPORT_FORMAT = "pipeplan.torch-export/1"


def crossing(graph: LayerGraph, cut_after: int) -> list[int]:
    """Layers ``u <= cut_after`` whose output a layer after the cut consumes (relayed ones too).

    Examples
    --------
    >>> from pipeplan.models.synthetic import synthetic_graph
    >>> crossing(synthetic_graph(4, 0), 1)
    [1]
    """
    return sorted({u for u, v in graph.edges if u <= cut_after < v})


def torch_schedule(plan: Plan) -> str:
    """The torch schedule class that runs the plan's op lists, or ``"csv"``.

    ``Schedule1F1B`` needs at least as many microbatches as stages; with fewer, the
    plan's own 1F1B op lists go through the CSV.
    """
    m = len(plan.stages[0].microbatches)
    if plan.schedule == "gpipe":
        return "ScheduleGPipe"
    if plan.schedule == "1f1b" and m >= len(plan.stages):
        return "Schedule1F1B"
    return "csv"


def schedule_csv(plan: Plan) -> str:
    """One row per pipeline rank, one ``<stage><F|B><microbatch>`` action per cell.

    Examples
    --------
    >>> from pipeplan.solver.plan import Stage
    >>> p = Plan("g", "c", 2, 4.0, "gpipe", (Stage((0, 1), ("a",), (1, 1)), Stage((1, 2), ("b",), (1, 1))))
    >>> print(schedule_csv(p), end="")
    0F0,0F1,0B0,0B1
    1F0,1F1,1B0,1B1
    """
    rows = [",".join(f"{s}{format_op(op)}" for op in ops) for s, ops in enumerate(plan.op_lists())]
    return "\n".join(rows) + "\n"


def stages_config(plan: Plan, graph: LayerGraph, model: str) -> dict:
    """The ``stages.json`` object ``train.py`` reads."""
    names = [layer.name for layer in graph.layers]
    stage_of_unit = [s for s, st in enumerate(plan.stages) for _ in range(*st.layers)]
    r = plan.stages[0].replicas
    profile = graph.extra.get("profile") if isinstance(graph.extra.get("profile"), dict) else {}
    seq_len = (profile.get("config") or {}).get("seq_len")
    stages = []
    for s, st in enumerate(plan.stages):
        lo, hi = st.layers
        stages.append({"index": s, "layers": [lo, hi], "units": names[lo:hi],
                       "inputs": crossing(graph, lo - 1) if s > 0 else [-1],
                       "outputs": crossing(graph, hi - 1) if s < len(plan.stages) - 1 else [hi - 1],
                       "recompute": st.recompute, "ranks": [s * r + j for j in range(r)],
                       "devices": list(st.devices)})
    return {"format": EXPORT_FORMAT, "graph": graph.name, "model": model,
            "seq_len": seq_len if isinstance(seq_len, int) else None,
            "plan_schedule": plan.schedule, "torch_schedule": torch_schedule(plan), "schedule_csv": "schedule.csv",
            "global_batch": plan.global_batch, "microbatches": len(plan.stages[0].microbatches),
            "microbatch_size": plan.stages[0].microbatches[0], "replicas": r,
            "mesh": {"shape": [len(plan.stages), r], "dims": ["pp", "dp"]},
            "ranks": [{"rank": s * r + j, "stage": s, "replica": j, "device": dev}
                      for s, st in enumerate(plan.stages) for j, dev in enumerate(st.devices)],
            "stages": stages, "stage_of_unit": stage_of_unit,
            "tied": [[i, layer.tied_to] for i, layer in enumerate(graph.layers) if layer.tied_to is not None]}


def export_torch(plan: Plan, graph: LayerGraph, model: str) -> dict[str, str]:
    """``{relative path: text}`` of the torch folder for a plan the target runs
    (see :func:`pipeplan.runtime.export.rules.check_plan`).

    Parameters
    ----------
    plan : Plan
        A plan with one microbatch split and one replica count for all stages.
    graph : LayerGraph
        Its graph (unit names, crossing tensors, ties).
    model : str
        The default ``--model`` of ``train.py``.

    Returns
    -------
    dict
        ``schedule.csv``, ``stages.json`` and ``train.py``.
    """
    return {"schedule.csv": schedule_csv(plan),
            "stages.json": json.dumps(stages_config(plan, graph, model), indent=2) + "\n",
            "train.py": inspect.getsource(torch_train)}
