"""``pipeplan export --to megatron``: the ``--pipeline-model-parallel-layout`` string and its flags.

A plan's one tensor-parallel degree above 1 is ``--tensor-model-parallel-size`` (Megatron
then takes its data-parallel size as world / (tp x pp), the plan's replicas), and ZeRO 1
is ``--use-distributed-optimizer`` (the optimizer state and master weights sharded across
the replicas, the gradients reduce-scattered into a whole buffer); Megatron's own
``--sequence-parallel`` stays off, so that it runs the plan's all-reduces.

Megatron-LM's layout grammar (``core/transformer/pipeline_parallel_layer_layout.py``):
``E`` embedding, ``t`` decoder layer, ``L`` loss / output head, ``|`` between
stages, ``t*n`` a repeat.  Stage ``i`` goes to pipeline rank ``i``.

An ``interleaved-1f1b`` plan (``S = v*R`` stages, stage ``s`` on group ``s mod R``)
is the same layout with ``S`` segments and ``--pipeline-model-parallel-size R``:
Megatron puts virtual stage ``i`` on rank ``i mod pp`` as chunk ``i // pp`` and takes
``v = S / pp`` from the layout (``megatron/training/arguments.py``), which excludes
``--num-layers-per-virtual-pipeline-stage`` and ``--num-virtual-stages-per-pipeline-rank``
(those give every virtual stage the same number of layers; the layout gives the plan's
boundaries).  Its interleaved schedule (``forward_backward_pipelining_with_interleaving``)
groups ``microbatch_group_size_per_vp_stage`` microbatches per chunk, ``pp`` by default,
and refuses ``m`` below it or a remainder of ``m`` by it between 1 and ``pp-1``: so
``m`` must be a multiple of ``R``; and ``pp`` must be above 1 (above 2 with
``--no-overlap-p2p-communication``).  Under those rules its warm-up,
``2(R-1-g) + (v-1)R`` forwards, and its chunk order equal torch's
``ScheduleInterleaved1F1B``, so the plan's programs are the ones Megatron runs.
"""

from __future__ import annotations

import math
import shlex

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export.layer_roles import transformer_roles
from pipeplan.solver.formats.plan import Plan


def stage_layout(roles: list[str]) -> str:
    """One stage's part of the layout, repeats of ``t`` written ``t*n``.

    Examples
    --------
    >>> stage_layout(["E", "t", "t"]), stage_layout(["t"]), stage_layout(["t", "L"])
    ('Et*2', 't', 'tL')
    """
    out, k = "", 0
    for role in roles + [""]:
        if role == "t":
            k += 1
            continue
        if k:
            out += "t" if k == 1 else f"t*{k}"
            k = 0
        out += role
    return out


def layout(plan: Plan, roles: list[str]) -> str:
    """The whole ``--pipeline-model-parallel-layout`` string of the plan's stages."""
    return "|".join(stage_layout(roles[lo:hi]) for lo, hi in (st.layers for st in plan.stages))


def megatron_flags(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-") -> list[str]:
    """The command-line flags, each flag and its value as separate words (``file`` and ``plan_file``
    name the graph and the plan in errors).

    Raises
    ------
    InputError
        If the graph is not embedding, decoder blocks and head
        (:func:`pipeplan.runtime.export.layer_roles.transformer_roles`), or an
        interleaved plan breaks Megatron's rules (:func:`check_interleaved`).
    """
    roles = transformer_roles(graph, file, "Megatron-LM")
    check_interleaved(plan, plan_file)
    st = plan.stages[0]
    flags = ["--pipeline-model-parallel-size", str(len(plan.groups)),
             "--pipeline-model-parallel-layout", layout(plan, roles),
             "--num-layers", str(roles.count("t")),
             "--micro-batch-size", str(st.microbatches[0] // st.replicas),
             "--global-batch-size", str(plan.global_batch)]
    if st.tensor_parallel > 1:  # Megatron's data-parallel size is then world / (tp * pp): the replicas
        flags += ["--tensor-model-parallel-size", str(st.tensor_parallel)]
    if plan.stage_zero(0) == 1:  # the optimizer state (and fp32 master weights) sharded across the replicas
        flags.append("--use-distributed-optimizer")
    if graph.layers[-1].tied_to != 0:
        # Megatron's GPT shares the output layer's weight with the embedding unless told not to
        flags.append("--untie-embeddings-and-output-weights")
    if st.recompute:
        flags += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", str(recompute_chunk(plan, roles))]
    return flags


def recompute_chunk(plan: Plan, roles: list[str]) -> int:
    """``--recompute-num-layers`` under ``--recompute-method uniform``: the largest chunk that
    divides every (virtual) stage's decoder layers.

    pipeplan's recomputing stage keeps only its input (spec section 3).  Megatron's uniform
    method checkpoints each run of ``--recompute-num-layers`` decoder layers of a stage and
    keeps the run's input (``TransformerBlock._checkpointed_forward``), and a run may not
    reach past the stage's last layer; so with equal stages one run is the whole stage, as
    in the plan, and with unequal ones each stage keeps the inputs of a few runs.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> p = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 3), ("a",), (2,), True), Stage((3, 6), ("b",), (2,), True)))
    >>> recompute_chunk(p, ["E", "t", "t", "t", "t", "L"])
    2
    """
    counts = [roles[lo:hi].count("t") for lo, hi in (st.layers for st in plan.stages)]
    return math.gcd(*[c for c in counts if c]) or 1


def check_interleaved(plan: Plan, file: str = "-") -> None:
    """Megatron's rules for virtual stages, for an ``interleaved-1f1b`` plan (nothing for ``1f1b``).

    Raises
    ------
    InputError
        If every group holds one stage (Megatron would run its plain 1F1B), the plan
        has one device group (Megatron's interleaving needs
        ``--pipeline-model-parallel-size`` above 1) or ``m`` is not a multiple of the
        group count (its microbatch groups of ``pp``).

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> a, b = ("a",), ("b",)
    >>> p = Plan("g", "c", 6, 4.0, "interleaved-1f1b", tuple(Stage((i, i + 1), d, (2, 2, 2)) for i, d in
    ...          enumerate([a, b, a, b])))
    >>> check_interleaved(p, "p.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeplan.models.errors.InputError: p.json: stages[0].microbatches: 3 microbatches on 2 pipeline ranks: ...
    """
    if plan.schedule != "interleaved-1f1b":  # Megatron-LM's own interleaved schedule is this one (its table)
        return
    groups, m = len(plan.groups), len(plan.stages[0].microbatches)
    if groups == len(plan.stages):
        raise InputError(file, "stages", f"{groups} stages on {groups} device groups: with one stage per rank "
                                         f"Megatron-LM runs its plain 1F1B (virtual size 1 is none), whose warm-up "
                                         f"is R-1-g forwards, not interleaving's 2(R-1-g); export the plan with "
                                         f"schedule 1f1b, or with v >= 2 stages per group")
    if groups < 2:
        raise InputError(file, "stages", f"{len(plan.stages)} stages on 1 device group: Megatron-LM interleaves "
                                         f"virtual stages only with --pipeline-model-parallel-size above 1 "
                                         f"(arguments.py); plan for 2 or more groups, or export with --to torch")
    if m % groups:
        raise InputError(file, "stages[0].microbatches",
                         f"{m} microbatches on {groups} pipeline ranks: Megatron-LM's interleaved schedule runs "
                         f"microbatch groups of microbatch_group_size_per_vp_stage = pp = {groups} and refuses "
                         f"fewer than {groups} microbatches or a remainder of 1 to {groups - 1} "
                         f"(forward_backward_pipelining_with_interleaving); split the batch into a multiple of "
                         f"{groups} microbatches")


def export_megatron(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-") -> dict[str, str]:
    """``{"megatron.args": ...}``: the flags as one shell line, with how many processes to start.

    The data-parallel degree is Megatron's world size / (tensor-parallel size x pipeline
    size), so the run takes ``stages x replicas x t`` processes.
    """
    flags = megatron_flags(plan, graph, file, plan_file)
    r, t = plan.stages[0].replicas, plan.stages[0].tensor_parallel
    ranks = len(plan.groups)
    world = ranks * r * t
    virtual = f" ({len(plan.stages)} virtual stages, {len(plan.stages) // ranks} per rank)" if ranks < len(
        plan.stages) else ""
    tie = ("# Tied weights: the head shares the embedding's weight, as Megatron's GPTModel does by default "
           "(the first and last pipeline stage each hold it and sum its gradient)\n"
           if graph.layers[-1].tied_to == 0 else
           "# Untied weights: the head has a weight of its own (--untie-embeddings-and-output-weights)\n")
    head = (f"# Megatron-LM flags for plan on graph {graph.name!r}: {ranks} pipeline stages{virtual} x "
            f"{r} data-parallel {'replica' if r == 1 else 'replicas'}"
            f"{f' x tensor-parallel size {t}' if t > 1 else ''} = {world} processes "
            f"(torchrun --nproc-per-node={world} pretrain_gpt.py ...)\n{tie}")
    return {"megatron.args": head + " ".join(shlex.quote(f) for f in flags) + "\n"}
