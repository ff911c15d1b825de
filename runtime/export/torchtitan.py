"""``pipeplan export --to torchtitan``: the ``[parallelism]`` TOML fragment of the plan.

Written for torchtitan 0.3.0's config (``torchtitan/config/configs.py``):
``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` (``GPipe``, ``1F1B``) or
``pipeline_parallel_schedule_csv``, ``module_fqns_per_model_part`` (one model part
per stage), ``data_parallel_replicate_degree``, ``pipeline_parallel_microbatch_size``
and ``[training] local_batch_size``.  The module names are torchtitan's for its
transformer models (``tok_embeddings``, ``layers.N``, ``norm`` and ``output``).
"""

from __future__ import annotations

import json

from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export.layer_roles import block_index, transformer_roles
from pipeplan.runtime.export.torch_target import schedule_csv
from pipeplan.solver.plan import Plan

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}
"""torchtitan's names (``get_schedule_class``) of the plan schedules it runs by name."""


def module_fqns(plan: Plan, graph: LayerGraph, file: str = "-") -> list[list[str]]:
    """torchtitan's module names of every stage's layers.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer
    >>> from pipeplan.solver.plan import Stage
    >>> g = LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in ("embed", "block.0", "head")])
    >>> p = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 2), ("a",), (2,)), Stage((2, 3), ("b",), (2,))))
    >>> module_fqns(p, g)
    [['tok_embeddings', 'layers.0'], ['norm', 'output']]
    """
    roles = transformer_roles(graph, file, "torchtitan")
    names = {"E": lambda i: ["tok_embeddings"], "L": lambda i: ["norm", "output"],
             "t": lambda i: [f"layers.{block_index(graph.layers[i].name)}"]}
    return [[fqn for i in range(*st.layers) for fqn in names[roles[i]](i)] for st in plan.stages]


def toml_fragment(plan: Plan, graph: LayerGraph, file: str = "-") -> str:
    """The TOML text (JSON strings and arrays are valid TOML values)."""
    st = plan.stages[0]
    replicas = f"{st.replicas} {'replica' if st.replicas == 1 else 'replicas'}"
    lines = [f"# torchtitan config for plan on graph {json.dumps(graph.name)}: {len(plan.stages)} stages x {replicas} "
             f"= {len(plan.stages) * st.replicas} processes", "[parallelism]",
             f"pipeline_parallel_degree = {len(plan.stages)}"]
    if plan.schedule in SCHEDULE_NAMES:
        lines.append(f"pipeline_parallel_schedule = {json.dumps(SCHEDULE_NAMES[plan.schedule])}")
    else:
        lines.append('pipeline_parallel_schedule_csv = "schedule.csv"')
    lines += [f"module_fqns_per_model_part = {json.dumps(module_fqns(plan, graph, file))}",
              f"pipeline_parallel_microbatch_size = {st.microbatches[0] // st.replicas}",
              f"data_parallel_replicate_degree = {st.replicas}", "data_parallel_shard_degree = 1", "",
              "[training]", f"local_batch_size = {plan.global_batch // st.replicas}", "",
              "[activation_checkpoint]", f"mode = {json.dumps('full' if st.recompute else 'none')}"]
    return "\n".join(lines) + "\n"


def export_torchtitan(plan: Plan, graph: LayerGraph, file: str = "-") -> dict[str, str]:
    """``{"torchtitan.toml": ...}``, plus ``schedule.csv`` for a custom op list."""
    files = {"torchtitan.toml": toml_fragment(plan, graph, file)}
    if plan.schedule not in SCHEDULE_NAMES:
        files["schedule.csv"] = schedule_csv(plan)
    return files
