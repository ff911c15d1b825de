"""The four runtimes ``pipeplan export`` writes for, and what each can run
(``shared/reference/runtimes.md``)."""

from __future__ import annotations

from pipeplan.runtime.export.rules import Target

TORCH = Target("torch", "torch.distributed.pipelining", ("gpipe", "1f1b", "custom"), "", True)
"""Schedule1F1B, ScheduleGPipe or a compute-only CSV; a checkpoint wrapper per stage."""

TORCHTITAN = Target("torchtitan", "torchtitan", ("gpipe", "1f1b", "custom"), "", False,
                    "has one [activation_checkpoint] mode for every block")
"""``[parallelism]`` keys; one activation-checkpoint policy."""

DEEPSPEED = Target("deepspeed", "DeepSpeed", ("1f1b",),
                   "runs only its own 1F1B-like TrainSchedule (no GPipe, no custom op lists)", False,
                   "has one activation_checkpoint_interval for every stage")
"""``PipelineModule``: its TrainSchedule, one checkpoint interval."""

MEGATRON = Target("megatron", "Megatron-LM", ("1f1b",),
                  "chooses its schedule itself (1F1B, or interleaved with virtual stages): no GPipe, no custom "
                  "op lists", False, "applies its --recompute-* flags to every stage")
"""The layout string; one recompute setting."""
