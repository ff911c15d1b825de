"""``pipeplan export --to deepspeed``: ``PipelineModule`` arguments with the plan's exact boundaries.

DeepSpeed has no public argument for explicit stage boundaries: ``partition_method``
takes only ``uniform``, ``parameters`` or ``type:REGEX``, and the boundaries end up in
``self.parts``, set by the private ``PipelineModule._partition_layers``.  The
``pipeline_module.py`` written here is a subclass that overrides it to set the plan's
``parts``; the rest (``num_stages``, ``activation_checkpoint_interval``) and the
config's ``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps`` are
public settings.
"""

from __future__ import annotations

import json

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.plan import Plan

_MODULE = '''"""The plan's pipeline for DeepSpeed, written by ``pipeplan export --to deepspeed``.

Graph {graph!r}: {stages} stages x {replicas} data-parallel replica(s) = {world} processes
(deepspeed --num_gpus={world} your_train.py --deepspeed_config deepspeed_config.json).
``layers`` must hold the graph's {num_layers} layers in its order:
{names}
"""

from deepspeed.pipe import PipelineModule

PARTS = {parts}
"""Stage s holds layers PARTS[s] <= i < PARTS[s + 1] (the plan's stages)."""

PIPELINE_MODULE_ARGS = {{"num_stages": {stages}, "activation_checkpoint_interval": {interval}}}


class PlanPipelineModule(PipelineModule):
    """``PipelineModule`` cut at the plan's boundaries.

    DeepSpeed has no public argument for explicit boundaries (``partition_method`` is
    ``uniform``, ``parameters`` or ``type:REGEX``); this overrides the private
    ``_partition_layers``, which sets ``self.parts`` and this rank's layer range.
    """

    def _partition_layers(self, method=""):
        if len(self._layer_specs) != PARTS[-1]:
            raise ValueError(f"the plan has {{PARTS[-1]}} layers, got {{len(self._layer_specs)}}")
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self.parts = list(PARTS)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])


def pipeline_module(layers, loss_fn, **kwargs):
    """The plan's ``PipelineModule`` over ``layers`` (one entry per graph layer)."""
    return PlanPipelineModule(layers=layers, loss_fn=loss_fn, **PIPELINE_MODULE_ARGS, **kwargs)
'''


def parts(plan: Plan) -> list[int]:
    """DeepSpeed's ``parts``: the first layer of every stage, then the layer count.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> parts(Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 3), ("a",), (2,)), Stage((3, 5), ("b",), (2,)))))
    [0, 3, 5]
    """
    return [st.layers[0] for st in plan.stages] + [plan.stages[-1].layers[1]]


def deepspeed_config(plan: Plan) -> dict:
    """The batch keys of the DeepSpeed config (per replica: one microbatch's part)."""
    st = plan.stages[0]
    return {"train_batch_size": plan.global_batch,
            "train_micro_batch_size_per_gpu": st.microbatches[0] // st.replicas,
            "gradient_accumulation_steps": len(st.microbatches)}


def export_deepspeed(plan: Plan, graph: LayerGraph) -> dict[str, str]:
    """``{"pipeline_module.py": ..., "deepspeed_config.json": ...}`` for a plan the target runs.

    ``activation_checkpoint_interval`` is 1 (every layer) when the stages recompute, else 0.
    """
    st = plan.stages[0]
    names = ", ".join(f"{i} {layer.name}" for i, layer in enumerate(graph.layers))
    module = _MODULE.format(graph=graph.name, stages=len(plan.stages), replicas=st.replicas,
                            world=len(plan.stages) * st.replicas, num_layers=len(graph.layers),
                            names=names, parts=parts(plan), interval=1 if st.recompute else 0)
    return {"pipeline_module.py": module, "deepspeed_config.json": json.dumps(deepspeed_config(plan), indent=2) + "\n"}
