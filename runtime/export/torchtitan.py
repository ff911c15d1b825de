"""``pipeplan export --to torchtitan``: the ``[parallelism]`` TOML fragment of the plan.

Written for torchtitan 0.3.0's config (``torchtitan/config/configs.py``):
``pipeline_parallel_degree`` (the plan's device groups), ``pipeline_parallel_schedule``
(``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``LoopedBFS``,
``ZBVZeroBubble``) or ``pipeline_parallel_schedule_csv``, ``module_fqns_per_model_part``
(one model part per stage), ``data_parallel_replicate_degree``,
``pipeline_parallel_microbatch_size`` and ``[training] local_batch_size``.  The module
names are torchtitan's for its transformer models (``tok_embeddings``, ``layers.N``,
``norm`` and ``output``).

torchtitan places the model parts itself (``_get_pp_rank_to_stage_indices_mapping`` in
``torchtitan/distributed/pipeline_parallel.py``): part ``s`` on rank ``s mod pp``
(``loop`` style), or in V pairs ``(g, 2pp-1-g)`` when the schedule is ``ZBVZeroBubble``
or ``DualPipeV``, every rank the same number of parts.  With a CSV the schedule name
still chooses that style, so custom programs whose groups hold several stages name
``Interleaved1F1B`` (loop) or ``ZBVZeroBubble`` (V) as well; other placements are
refused.  ``pipeline_parallel_layers_per_stage`` is not written: it only generates an
even split (ceiling division) when ``module_fqns_per_model_part`` is absent, and the
explicit parts give the plan's exact boundaries.
"""

from __future__ import annotations

import json

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export.layer_roles import block_index, transformer_roles
from pipeplan.runtime.export.rules import placement
from pipeplan.runtime.export.torch_target import schedule_csv
from pipeplan.solver.formats.plan import Plan

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                  "interleaved-zb": "InterleavedZeroBubble", "looped-bfs": "LoopedBFS", "zbv": "ZBVZeroBubble"}
"""torchtitan's names (torch's ``get_schedule_class``) of the plan schedules it runs by name."""

CSV_PLACEMENT_NAMES = {"loop": "Interleaved1F1B", "v": "ZBVZeroBubble"}
"""The schedule name that makes torchtitan place a CSV's stages as the plan does (``loop`` or ``v`` style)."""


def csv_schedule_name(plan: Plan, file: str = "-") -> str | None:
    """The ``pipeline_parallel_schedule`` a custom plan's CSV needs for torchtitan to place its stages
    (``None``: one stage per rank, the default ``1F1B`` places them).

    Raises
    ------
    InputError
        If the groups hold their stages in neither torchtitan style.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> def custom(*devices):
    ...     return Plan("g", "c", 1, 4.0, "custom", tuple(Stage((i, i + 1), d, (1,)) for i, d in enumerate(devices)))
    >>> csv_schedule_name(custom(("a",), ("b",), ("b",), ("a",)))
    'ZBVZeroBubble'
    """
    style = placement(plan)
    if style == "one":
        return None
    if style in CSV_PLACEMENT_NAMES:
        return CSV_PLACEMENT_NAMES[style]
    where = next((s for s, g in enumerate(plan.stage_groups) if g != s % len(plan.groups)), len(plan.stages) - 1)
    raise InputError(file, f"stages[{where}].devices",
                     f"stage {where} is on device group {plan.stage_groups[where]}: torchtitan places model part s "
                     f"on rank s mod pp, or in V pairs (g, 2pp-1-g), every rank the same number of parts "
                     f"(_get_pp_rank_to_stage_indices_mapping); put stage s on group s mod "
                     f"{len(plan.groups)} or in the V, or export with --to torch, which runs any placement")


def module_fqns(plan: Plan, graph: LayerGraph, file: str = "-") -> list[list[str]]:
    """torchtitan's module names of every stage's layers.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer
    >>> from pipeplan.solver.formats.plan import Stage
    >>> g = LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in ("embed", "block.0", "head")])
    >>> p = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 2), ("a",), (2,)), Stage((2, 3), ("b",), (2,))))
    >>> module_fqns(p, g)
    [['tok_embeddings', 'layers.0'], ['norm', 'output']]
    """
    roles = transformer_roles(graph, file, "torchtitan")
    names = {"E": lambda i: ["tok_embeddings"], "L": lambda i: ["norm", "output"],
             "t": lambda i: [f"layers.{block_index(graph.layers[i].name)}"]}
    return [[fqn for i in range(*st.layers) for fqn in names[roles[i]](i)] for st in plan.stages]


def toml_fragment(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-") -> str:
    """The TOML text (JSON strings and arrays are valid TOML values); ``file`` and ``plan_file``
    name the graph and the plan in errors."""
    st = plan.stages[0]
    groups = len(plan.groups)
    replicas = f"{st.replicas} {'replica' if st.replicas == 1 else 'replicas'}"
    lines = [f"# torchtitan config for plan on graph {json.dumps(graph.name)}: {len(plan.stages)} stages on {groups} "
             f"pipeline ranks x {replicas} = {groups * st.replicas} processes", "[parallelism]",
             f"pipeline_parallel_degree = {groups}"]
    name = SCHEDULE_NAMES.get(plan.schedule) or csv_schedule_name(plan, plan_file)
    if name is not None:
        lines.append(f"pipeline_parallel_schedule = {json.dumps(name)}")
    if plan.schedule not in SCHEDULE_NAMES:
        lines.append('pipeline_parallel_schedule_csv = "schedule.csv"')
    lines += [f"module_fqns_per_model_part = {json.dumps(module_fqns(plan, graph, file))}",
              f"pipeline_parallel_microbatch_size = {st.microbatches[0] // st.replicas}",
              f"data_parallel_replicate_degree = {st.replicas}", "data_parallel_shard_degree = 1", "",
              "[training]", f"local_batch_size = {plan.global_batch // st.replicas}", "",
              "[activation_checkpoint]", f"mode = {json.dumps('full' if st.recompute else 'none')}"]
    return "\n".join(lines) + "\n"


def export_torchtitan(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-") -> dict[str, str]:
    """``{"torchtitan.toml": ...}``, plus ``schedule.csv`` for a custom op list."""
    files = {"torchtitan.toml": toml_fragment(plan, graph, file, plan_file)}
    if plan.schedule not in SCHEDULE_NAMES:
        files["schedule.csv"] = schedule_csv(plan)
    return files
