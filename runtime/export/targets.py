"""The four runtimes ``pipeplan export`` writes for, and what each can run
(``shared/reference/runtimes.md``; the version-2 reasons read from each runtime's code)."""

from __future__ import annotations

from pipeplan.runtime.export.rules import GLOBAL_DEGREE, NO_DEGREE, Parallelism, Target
from pipeplan.solver.schedules.schedule import NAMED_V2, SCHEDULES

_TORCH_PARALLELISM = Parallelism(
    GLOBAL_DEGREE, "runs the plan on one pp x dp x tp device mesh (train.py; torch.distributed.pipelining sends from "
                   "each rank to the rank at the same dp and tp coordinates of the next stage), so every stage needs "
                   "the same degree", "stages.json's mesh (parallelize_module over tp)",
    zero_levels=(0, 1, 2), zero_keys={1: "stages.json's zero (ZeroRedundancyOptimizer over dp)",
                                      2: "stages.json's zero (ZeroRedundancyOptimizer over dp, gradients sharded)"},
    zero_per_stage=True)
"""What ``train.py`` runs: one degree on its ``pp x dp x tp`` mesh, each stage's own ZeRO level."""

TORCHTITAN_PARALLELISM = Parallelism(
    GLOBAL_DEGREE, "runs one tensor_parallel_degree for the whole model (its device mesh has one tp dimension)",
    "[parallelism] tensor_parallel_degree",
    zero_levels=(0, 1),
    zero_reasons={2: "shards gradients only between steps under pipeline parallelism: its FSDP "
                     "(data_parallel_shard_degree) runs under torch's PipelineStage, which turns gradient sync off "
                     "for every microbatch (set_requires_gradient_sync(False)) and reduce-scatters once after the "
                     "last backward (perform_reduce_grad), so every replica holds whole gradients through the step: "
                     "ZeRO-1's memory, which is how the export writes zero 1"},
    zero_keys={0: "data_parallel_replicate_degree = replicas, data_parallel_shard_degree = 1",
               1: "data_parallel_shard_degree = replicas, data_parallel_replicate_degree = 1, "
                  "fsdp_reshard_after_forward = never"},
    zero_per_stage_reason="has one data-parallel setting ([parallelism]) for every model part")
"""torchtitan's ``[parallelism]``: one TP degree; DDP (ZeRO 0), or FSDP under pipeline parallelism (ZeRO 1:
whole weights and gradients through the step, sharded between steps, the optimizer state sharded)."""

MEGATRON_PARALLELISM = Parallelism(
    GLOBAL_DEGREE, "runs one --tensor-model-parallel-size for every pipeline stage",
    "--tensor-model-parallel-size",
    zero_levels=(0, 1),
    zero_reasons={2: "shards gradients only under Megatron-FSDP (--use-megatron-fsdp with "
                     "--data-parallel-sharding-strategy optim_grads), which this export does not write: its "
                     "documentation pairs it with data, tensor and context parallelism, not pipeline stages; "
                     "--use-distributed-optimizer shards the optimizer state and master weights but keeps a whole "
                     "gradient buffer on every replica (ZeRO-1)"},
    zero_keys={1: "--use-distributed-optimizer"},
    zero_per_stage_reason="has one --use-distributed-optimizer setting for every stage")
"""Megatron-LM's flags: ``--tensor-model-parallel-size``, ``--use-distributed-optimizer`` (ZeRO-1)."""

DEEPSPEED_PARALLELISM = Parallelism(
    NO_DEGREE, "has no tensor parallelism of its own: PipelineModule's model-parallel axis "
               "(PipeModelDataParallelTopology) needs layers written as tensor-parallel ones with Megatron's mpu "
               "(Megatron-DeepSpeed), and train.py builds each unit as one whole torch module",
    zero_levels=(0, 1),
    zero_reasons={2: "refuses ZeRO-2 and ZeRO-3 under its pipeline engine (PipelineEngine asserts "
                     "zero_optimization_stage < 2: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism')"},
    zero_keys={1: '"zero_optimization": {"stage": 1}'},
    zero_per_stage_reason="has one zero_optimization.stage for every stage")
"""DeepSpeed's config: ``zero_optimization.stage`` 1 under its pipeline engine; no tensor parallelism."""

# Each target's schedules are its own list, keyed by our names: what that runtime runs is a fact of its code,
# not an attribute of the schedule (torch and torchtitan run every one, Megatron-LM and DeepSpeed a few).
TORCH = Target("torch", "torch.distributed.pipelining", SCHEDULES, "", True, parallelism=_TORCH_PARALLELISM)
"""Schedule1F1B, ScheduleGPipe, the four multi-stage classes, or a compute-only CSV; a
checkpoint wrapper per stage."""

TORCHTITAN = Target("torchtitan", "torchtitan", SCHEDULES, "", False,
                    "has one [activation_checkpoint] mode for every block", parallelism=TORCHTITAN_PARALLELISM)
"""``[parallelism]`` keys; one activation-checkpoint policy."""

_MEGATRON_SCHEDULES = ("megatron.core.pipeline_parallel.schedules.get_forward_backward_func runs no pipelining, "
                       "1F1B, or interleaved 1F1B when a rank holds several virtual stages, and nothing else")

MEGATRON = Target(
    "megatron", "Megatron-LM", ("1f1b", "interleaved-1f1b"),
    "chooses its schedule itself (1F1B, or interleaved with virtual stages): no GPipe, no custom op lists", False,
    "applies its --recompute-* flags to every stage",
    schedule_reasons={
        "looped-bfs": f"has no looped-BFS schedule: {_MEGATRON_SCHEDULES}",
        "interleaved-zb": f"has no zero-bubble schedule in core: {_MEGATRON_SCHEDULES} (its delay_wgrad_compute "
                          f"defers weight gradients only to overlap MoE expert-parallel communication)",
        "zbv": f"has no zero-bubble schedule in core and no V placement (virtual stage i is on rank i mod pp): "
               f"{_MEGATRON_SCHEDULES} (its delay_wgrad_compute defers weight gradients only to overlap MoE "
               f"expert-parallel communication)"},
    parallelism=MEGATRON_PARALLELISM)
"""The layout string (virtual stages for interleaved 1F1B); one recompute setting."""

DEEPSPEED = Target(
    "deepspeed", "DeepSpeed", ("1f1b",),
    "runs only its own 1F1B-like TrainSchedule (no GPipe, no custom op lists)", False,
    "has one activation_checkpoint_interval for every stage",
    schedule_reasons={name: "runs only its own 1F1B-like TrainSchedule, one stage per rank, with no split "
                            "backward (no interleaved, looped or zero-bubble schedule)" for name in NAMED_V2},
    multi_stage_reason="runs one stage per rank: PipelineModule's stage is the rank's pipe coordinate "
                       "(num_stages = world size / data-parallel degree), under its own 1F1B-like TrainSchedule",
    parallelism=DEEPSPEED_PARALLELISM)
"""``PipelineModule``: its TrainSchedule, one stage per rank, one checkpoint interval."""
