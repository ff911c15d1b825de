"""``pipeplan export --to deepspeed``: ``PipelineModule`` with the plan's exact boundaries, and a script that trains it.

DeepSpeed has no public argument for explicit stage boundaries: ``partition_method``
takes only ``uniform``, ``parameters`` or ``type:REGEX``, and the boundaries end up in
``self.parts``, set by the private ``PipelineModule._partition_layers``.  The
``pipeline_module.py`` written here is a subclass that overrides it to set the plan's
``parts``; the rest (``num_stages``, ``activation_checkpoint_interval``) and the
config's ``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps`` are
public settings.  ``train.py`` (``deepspeed_train.py`` next to this module) builds
one layer per unit of the model, the units that share weights (a GPT head and its
embedding) as ``TiedLayerSpec`` of one key, and trains under ``deepspeed.initialize``'s
pipeline engine.

Recompute: pipeplan's recomputing stage keeps only its input and recomputes its whole
forward (spec section 3); ``activation_checkpoint_interval`` set to the largest stage's
layer count makes every stage one checkpointed block, and ``"pipeline": {"use_reentrant":
false}`` picks DeepSpeed's non-reentrant checkpoint: its default reentrant one passes no
gradient into a block whose inputs need none, so the first stage's embedding would never
train (DeepSpeed's ``PipelineModule._is_checkpointable`` says so).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.plan import Plan

TRAIN_SCRIPT = Path(__file__).with_name("deepspeed_train.py")
"""The source of the exported ``train.py`` (read as text: it imports DeepSpeed, which pipeplan does not need)."""

_MODULE = '''"""The plan's pipeline for DeepSpeed, written by ``pipeplan export --to deepspeed``.

Graph {graph!r}: {stages} stages x {replicas} data-parallel replica(s) = {world} processes
(torchrun --nproc-per-node={world} train.py, or deepspeed --num_gpus={world} train.py).
``layers`` holds one layer per unit of the model, in the graph's order (``UNITS``).
Units that share weights (``TIED``) must be ``TiedLayerSpec`` of one key: DeepSpeed then
builds the shared module on every stage holding one of them, broadcasts its weights from
the first such stage and sums their gradients over those stages after every backward;
plain layers sharing a Parameter across stages would train two diverging copies.
"""

from deepspeed.pipe import PipelineModule

UNITS = {units}
"""The graph's layers, in order: layer i of ``layers`` runs unit UNITS[i]."""

PARTS = {parts}
"""Stage s holds layers PARTS[s] <= i < PARTS[s + 1] (the plan's stages)."""

TIED = {tied}
"""[unit, owner]: unit shares the owner's weights (one TiedLayerSpec key per owner)."""

REPLICAS = {replicas}
"""Data-parallel replicas of every stage (DeepSpeed: world size / num_stages)."""

MODEL = {model!r}
"""The model ``train.py`` builds by default (pipeplan's ``--model``)."""

SEQ_LEN = {seq_len!r}
"""Tokens per sample the graph was profiled with (None: the model's default)."""

PIPELINE_MODULE_ARGS = {{"num_stages": {stages}, "activation_checkpoint_interval": {interval}}}
"""{interval_doc}"""


class PlanPipelineModule(PipelineModule):
    """``PipelineModule`` cut at the plan's boundaries.

    DeepSpeed has no public argument for explicit boundaries (``partition_method`` is
    ``uniform``, ``parameters`` or ``type:REGEX``); this overrides the private
    ``_partition_layers``, which sets ``self.parts`` and this rank's layer range.
    """

    def _partition_layers(self, method=""):
        if len(self._layer_specs) != PARTS[-1]:
            raise ValueError(f"the plan has {{PARTS[-1]}} layers ({{UNITS}}), got {{len(self._layer_specs)}}")
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


def checkpoint_interval(plan: Plan) -> int:
    """``activation_checkpoint_interval``: 0 without recompute, else the largest stage's layer count,
    so that each stage is one checkpointed block that keeps only its input (pipeplan's recompute).

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> checkpoint_interval(Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 3), ("a",), (2,), True),
    ...                                                     Stage((3, 5), ("b",), (2,), True))))
    3
    """
    if not plan.stages[0].recompute:
        return 0
    return max(hi - lo for lo, hi in (st.layers for st in plan.stages))


def deepspeed_config(plan: Plan) -> dict:
    """The DeepSpeed config: the batch keys (per replica: one microbatch's part),
    ``gradient_clipping`` 0 (DeepSpeed 0.19 clips to norm 1.0 unless told, ``pipeplan run``
    does not clip), the non-reentrant checkpoint when the stages recompute (see the
    module docs), and for a ZeRO-1 plan ``zero_optimization.stage`` 1 with
    ``zero_allow_untested_optimizer`` (``train.py`` steps a ``torch.optim.SGD``, which
    DeepSpeed's ZeRO wraps only when allowed so).

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> p = Plan("g", "c", 8, 4.0, "1f1b", (Stage((0, 1), ("a", "b"), (4, 4)), Stage((1, 2), ("c", "d"), (4, 4))),
    ...          zero=1)
    >>> deepspeed_config(p)["zero_optimization"]
    {'stage': 1}
    """
    st = plan.stages[0]
    config: dict = {"train_batch_size": plan.global_batch,
                    "train_micro_batch_size_per_gpu": st.microbatches[0] // st.replicas,
                    "gradient_accumulation_steps": len(st.microbatches),
                    "gradient_clipping": 0.0}
    if st.recompute:
        config["pipeline"] = {"use_reentrant": False}
    if plan.stage_zero(0) == 1:  # the optimizer state sharded across the replicas (the target refuses 2)
        config["zero_optimization"] = {"stage": 1}
        config["zero_allow_untested_optimizer"] = True
    return config


def export_deepspeed(plan: Plan, graph: LayerGraph, model: str = "") -> dict[str, str]:
    """``pipeline_module.py``, ``deepspeed_config.json`` and ``train.py`` for a plan the target runs.

    ``model`` is the model ``train.py`` builds by default (``--model``).
    """
    st = plan.stages[0]
    interval = checkpoint_interval(plan)
    profile = graph.extra.get("profile") if isinstance(graph.extra.get("profile"), dict) else {}
    seq_len = (profile.get("config") or {}).get("seq_len")
    interval_doc = ("0: no stage recomputes." if not interval else
                    f"{interval} (the largest stage's layer count): every stage is one checkpointed block that "
                    f"keeps only its input, as pipeplan's recompute does; deepspeed_config.json's "
                    f"pipeline.use_reentrant false picks the checkpoint that also trains the embedding.")
    module = _MODULE.format(graph=graph.name, stages=len(plan.stages), replicas=st.replicas,
                            world=len(plan.stages) * st.replicas, units=[layer.name for layer in graph.layers],
                            parts=parts(plan), interval=interval, interval_doc=interval_doc,
                            tied=[[i, layer.tied_to] for i, layer in enumerate(graph.layers)
                                  if layer.tied_to is not None],
                            model=model or graph.name, seq_len=seq_len if isinstance(seq_len, int) else None)
    return {"pipeline_module.py": module,
            "deepspeed_config.json": json.dumps(deepspeed_config(plan), indent=2) + "\n",
            "train.py": TRAIN_SCRIPT.read_text()}
