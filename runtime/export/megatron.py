"""``pipeplan export --to megatron``: the ``--pipeline-model-parallel-layout`` string and its flags.

Megatron-LM's layout grammar (``core/transformer/pipeline_parallel_layer_layout.py``):
``E`` embedding, ``t`` decoder layer, ``L`` loss / output head, ``|`` between
stages, ``t*n`` a repeat.  Stage ``i`` goes to pipeline rank ``i``.
"""

from __future__ import annotations

import shlex

from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export.layer_roles import transformer_roles
from pipeplan.solver.plan import Plan


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


def megatron_flags(plan: Plan, graph: LayerGraph, file: str = "-") -> list[str]:
    """The command-line flags, each flag and its value as separate words.

    Raises
    ------
    InputError
        If the graph is not embedding, decoder blocks and head
        (:func:`pipeplan.runtime.export.layer_roles.transformer_roles`).
    """
    roles = transformer_roles(graph, file, "Megatron-LM")
    st = plan.stages[0]
    flags = ["--pipeline-model-parallel-size", str(len(plan.stages)),
             "--pipeline-model-parallel-layout", layout(plan, roles),
             "--num-layers", str(roles.count("t")),
             "--micro-batch-size", str(st.microbatches[0] // st.replicas),
             "--global-batch-size", str(plan.global_batch)]
    if st.recompute:
        flags += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return flags


def export_megatron(plan: Plan, graph: LayerGraph, file: str = "-") -> dict[str, str]:
    """``{"megatron.args": ...}``: the flags as one shell line, with how many processes to start.

    The data-parallel degree is Megatron's world size / pipeline size, so the run takes
    ``stages x replicas`` processes.
    """
    flags = megatron_flags(plan, graph, file)
    r = plan.stages[0].replicas
    world = len(plan.stages) * r
    head = (f"# Megatron-LM flags for plan on graph {graph.name!r}: {len(plan.stages)} pipeline stages x "
            f"{r} data-parallel {'replica' if r == 1 else 'replicas'} = {world} processes "
            f"(torchrun --nproc-per-node={world} pretrain_gpt.py ...)\n")
    return {"megatron.args": head + " ".join(shlex.quote(f) for f in flags) + "\n"}
