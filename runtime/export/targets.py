"""The four runtimes ``pipeplan export`` writes for, and what each can run
(``shared/reference/runtimes.md``; the version-2 reasons read from each runtime's code)."""

from __future__ import annotations

from pipeplan.runtime.export.rules import Target
from pipeplan.solver.schedules.schedule import NAMED_V2, SCHEDULES

# Each target's schedules are its own list, keyed by our names: what that runtime runs is a fact of its code,
# not an attribute of the schedule (torch and torchtitan run every one, Megatron-LM and DeepSpeed a few).
TORCH = Target("torch", "torch.distributed.pipelining", SCHEDULES, "", True)
"""Schedule1F1B, ScheduleGPipe, the four multi-stage classes, or a compute-only CSV; a
checkpoint wrapper per stage."""

TORCHTITAN = Target("torchtitan", "torchtitan", SCHEDULES, "", False,
                    "has one [activation_checkpoint] mode for every block")
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
               f"expert-parallel communication)"})
"""The layout string (virtual stages for interleaved 1F1B); one recompute setting."""

DEEPSPEED = Target(
    "deepspeed", "DeepSpeed", ("1f1b",),
    "runs only its own 1F1B-like TrainSchedule (no GPipe, no custom op lists)", False,
    "has one activation_checkpoint_interval for every stage",
    schedule_reasons={name: "runs only its own 1F1B-like TrainSchedule, one stage per rank, with no split "
                            "backward (no interleaved, looped or zero-bubble schedule)" for name in NAMED_V2},
    multi_stage_reason="runs one stage per rank: PipelineModule's stage is the rank's pipe coordinate "
                       "(num_stages = world size / data-parallel degree), under its own 1F1B-like TrainSchedule")
"""``PipelineModule``: its TrainSchedule, one stage per rank, one checkpoint interval."""
