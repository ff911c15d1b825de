"""Tensor-parallel stages and sharded training state (plan version 3, spec section 8).

A stage of degree ``t`` runs each of its replicas on ``t`` processes.  Those processes
form a :class:`Replica`: a process group and a ``DeviceMesh`` over it, on which torch's
own tensor-parallel API (``parallelize_module``) splits the stage's units as Megatron-LM
and torchtitan split a transformer block: the attention's query, key and value
projections and the MLP's first linear are column-parallel (``ColwiseParallel``: each
rank computes its own heads, its own slice of the hidden layer), the attention's output
projection and the MLP's second linear row-parallel (``RowwiseParallel``: each rank's
partial product is all-reduced).  :func:`tensor_parallel_plan` finds these layers by
their structure; every other layer (embeddings, LayerNorms, the head, and any layer
with no known plan) runs whole and replicated on the replica's ``t`` processes, as the
spec's ``tp_share`` marks it.  Between the two all-reduces of a block every rank holds
the whole activation, so the stage's inputs and outputs are whole on every rank of the
replica (spec section 8.3): the replica's *leader* (its lowest rank) exchanges them
with the neighbouring stages and broadcasts what it receives to the others.

[Note: fused qkv]  The zoo's GPT projects queries, keys and values with one ``Linear``
of ``3 d`` rows, ``[q; k; v]``.  Sharding its rows in order would give rank 0 all the
queries and half the keys; :class:`FusedColwiseParallel` instead hands rank ``i`` the
rows ``[q_i; k_i; v_i]`` of its own heads (the weight's rows reordered before torch
shards them, Megatron's layout for a fused qkv), so the model's own code, which reads
the head count from the width it gets, computes rank ``i``'s heads.  The reordering is
kept with the parameter (:data:`ROW_ORDER`) and undone when the whole parameter is
gathered (:func:`whole`).

[Note: ZeRO]  A stage with ``zero`` 1 or 2 and ``r > 1`` replicas steps its parameters
with ``torch.distributed.optim.ZeroRedundancyOptimizer`` over the processes of the same
tensor-parallel rank in its ``r`` replicas (the ``t`` rings of section 8.3): each
process steps the parameters the optimizer assigns it and broadcasts them to the
others (together, the all-gather of the updated weights).  Under ``zero`` 1 the
gradients are summed over the ring as without ZeRO (every process holds all of them);
under ``zero`` 2 each parameter's gradient is summed onto its owner only
(``dist.reduce``, the reduce-scatter of section 8.3 cut at parameter boundaries, as
ZeroRedundancyOptimizer cuts its partition) and dropped elsewhere.  The runtime trains
with SGD, which keeps no optimizer state: ZeRO then saves no optimizer memory on these
runs, but the sharded step and the exchanges run exactly as with Adam.  A Parameter
tied across stages (GPT's embedding and head) is summed over all its holders (see
[Note: tied weights] in :mod:`pipeplan.runtime.gradsync`) and stepped whole on each of
them, outside the sharded optimizer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from pipeplan.models.errors import InputError
from pipeplan.runtime.routing import device_ranks
from pipeplan.solver.formats.plan import Plan

ROW_ORDER = "_pipeplan_row_order"
"""Attribute of a Parameter whose rows :class:`FusedColwiseParallel` reordered: the order (see [Note: fused qkv])."""

ELEMENTWISE = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Mish, nn.Identity)
"""Activations a column-parallel and a row-parallel linear may enclose: each output element on its own."""


# ----------------------------------------------------------------- who is where
def replica_ranks(plan: Plan, stage: int) -> list[list[int]]:
    """Global ranks of each replica of ``stage``, lowest first within each (the first is its leader).

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Plan, Stage
    >>> plan = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 1), ("a", "b", "c", "d"), (4,), tensor_parallel=2),
    ...                                        Stage((1, 2), ("e",), (4,))))
    >>> replica_ranks(plan, 0), replica_ranks(plan, 1)
    ([[0, 1], [2, 3]], [[4]])
    """
    ranks = device_ranks(plan)
    return [sorted(ranks[d] for d in replica) for replica in plan.stages[stage].replica_devices]


@dataclass
class Replica:
    """The ``t`` processes of one replica of a tensor-parallel stage, as one rank sees them."""

    ranks: list[int]
    """Their global ranks, lowest (the leader) first."""
    group: dist.ProcessGroup
    """Their process group (the broadcasts of stage inputs)."""
    mesh: object
    """The ``DeviceMesh`` over ``group`` that ``parallelize_module`` shards on."""

    @property
    def leader(self) -> int:
        """The rank that exchanges the replica's inputs and outputs with the neighbouring stages."""
        return self.ranks[0]

    @property
    def size(self) -> int:
        """``t``."""
        return len(self.ranks)

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Give every rank of the replica the leader's ``buffer`` (contiguous, in place)."""
        dist.broadcast(buffer, src=self.leader, group=self.group)


def make_replica(group: dist.ProcessGroup, ranks: list[int], device: torch.device) -> Replica:
    """The :class:`Replica` over ``group`` (this rank among ``ranks``)."""
    from torch.distributed.device_mesh import DeviceMesh

    return Replica(ranks, group, DeviceMesh.from_group(group, device.type))


# ----------------------------------------------------------------- the tensor-parallel plan
def tensor_parallel_plan(module: nn.Module, t: int) -> dict[str, object]:
    """The ``parallelize_module`` plan of a unit's module for degree ``t``: ``{"sub.module": style}``.

    Known layers (see the module docstring): the zoo GPT's attention (fused ``qkv``
    and ``proj``), Hugging Face style attention (``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``, as Llama, Mistral and Qwen name them), gated MLPs (``gate_proj``,
    ``up_proj``, ``down_proj``) and ``nn.Sequential(Linear, activation, Linear)`` MLPs.
    A layer whose heads or hidden width ``t`` does not divide is left whole
    (replicated), like every layer of no known plan.

    Examples
    --------
    >>> from pipeplan.models.zoo import build_model
    >>> sorted(tensor_parallel_plan(build_model("gpt-tiny").units[1].module, 2))
    ['attn.proj', 'attn.qkv', 'mlp.0', 'mlp.2']
    >>> tensor_parallel_plan(build_model("gpt-tiny").units[0].module, 2)
    {}
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from pipeplan.models.zoo.gpt import CausalSelfAttention

    plan: dict[str, object] = {}

    def at(prefix: str, name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    for prefix, sub in module.named_modules():
        if isinstance(sub, CausalSelfAttention) and sub.heads % t == 0 and _linears(sub, "qkv", "proj"):
            plan[at(prefix, "qkv")] = FusedColwiseParallel(3)
            plan[at(prefix, "proj")] = RowwiseParallel()
        elif _linears(sub, "q_proj", "k_proj", "v_proj", "o_proj") and _heads_divide(sub, t):
            for name in ("q_proj", "k_proj", "v_proj"):
                plan[at(prefix, name)] = ColwiseParallel()
            plan[at(prefix, "o_proj")] = RowwiseParallel()
        elif _linears(sub, "gate_proj", "up_proj", "down_proj") and sub.down_proj.in_features % t == 0:
            plan[at(prefix, "gate_proj")] = ColwiseParallel()
            plan[at(prefix, "up_proj")] = ColwiseParallel()
            plan[at(prefix, "down_proj")] = RowwiseParallel()
        elif _sequential_mlp(sub, t):
            plan[at(prefix, "0")] = ColwiseParallel()
            plan[at(prefix, "2")] = RowwiseParallel()
    return plan


def _linears(module: nn.Module, *names: str) -> bool:
    return all(isinstance(getattr(module, name, None), nn.Linear) for name in names)


def _heads_divide(attention: nn.Module, t: int) -> bool:
    """Whether ``t`` divides the query and the key/value heads (a rank computes whole heads)."""
    head_dim = getattr(attention, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim <= 0:
        return False
    widths = (attention.q_proj.out_features, attention.k_proj.out_features, attention.v_proj.out_features)
    return all(w % head_dim == 0 and (w // head_dim) % t == 0 for w in widths)


def _sequential_mlp(module: nn.Module, t: int) -> bool:
    if not isinstance(module, nn.Sequential) or len(module) != 3:
        return False
    first, act, second = module
    return (isinstance(first, nn.Linear) and isinstance(second, nn.Linear) and isinstance(act, ELEMENTWISE)
            and first.out_features == second.in_features and first.out_features % t == 0)


def fused_row_order(rows: int, parts: int, t: int) -> torch.Tensor:
    """The order of a fused projection's rows that gives rank ``i`` the ``i``-th slice of every part.

    Examples
    --------
    >>> fused_row_order(6, 3, 2).tolist()  # [q0 q1 k0 k1 v0 v1] -> rank 0: q0 k0 v0, rank 1: q1 k1 v1
    [0, 2, 4, 1, 3, 5]
    """
    width = rows // parts
    chunk = width // t
    return torch.tensor([p * width + i * chunk + j for i in range(t) for p in range(parts) for j in range(chunk)])


@functools.cache
def _fused_style():
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel

    class FusedColwise(ColwiseParallel):
        """``ColwiseParallel`` for a fused projection of ``parts`` equal parts; see [Note: fused qkv]."""

        def __init__(self, parts: int) -> None:
            super().__init__()
            self.parts = parts

        def _partition_linear_fn(self, name, module, device_mesh):
            t = device_mesh.size()
            for pname, param in module.named_parameters():
                order = fused_row_order(param.shape[0], self.parts, t)
                sharded = nn.Parameter(distribute_tensor(param.detach()[order], device_mesh, [Shard(0)],
                                                         src_data_rank=self.src_data_rank),
                                       requires_grad=param.requires_grad)
                setattr(sharded, ROW_ORDER, order)
                module.register_parameter(pname, sharded)

    return FusedColwise


def FusedColwiseParallel(parts: int):  # noqa: N802 (its class is made on first use: runs without TP skip torch's TP API)
    """A ``ColwiseParallel`` that gives each rank its slice of every part of a fused projection."""
    return _fused_style()(parts)


def parallelize_units(modules: Iterable[nn.Module], replica: Replica) -> int:
    """Apply :func:`tensor_parallel_plan` to each unit module on the replica's mesh; the layers split.

    Every rank built the same weights from the same seed, so each keeps its own shard
    without any communication (``src_data_rank=None``).
    """
    from torch.distributed.tensor.parallel import parallelize_module

    split = 0
    for module in modules:
        plan = tensor_parallel_plan(module, replica.size)
        if plan:
            parallelize_module(module, replica.mesh, plan, src_data_rank=None)
            split += len(plan)
    return split


# ----------------------------------------------------------------- local and whole tensors
def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor (a parameter or gradient of a tensor-parallel layer)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local tensor (sharing its storage), else ``t``."""
    return t._local_tensor if is_sharded(t) else t  # type: ignore[attr-defined]


def whole(p: torch.Tensor) -> torch.Tensor:
    """The whole value of a parameter (a collective over its mesh for a DTensor), rows in the model's order."""
    if not is_sharded(p):
        return p.detach().cpu()
    full = p.detach().full_tensor().cpu()
    order = getattr(p, ROW_ORDER, None)
    if order is not None:
        restored = torch.empty_like(full)
        restored[order] = full
        full = restored
    return full


# ----------------------------------------------------------------- the optimizer
class RankOptimizer:
    """SGD over a rank's parameters; ``ZeroRedundancyOptimizer`` over those of its ZeRO stages.

    Both step the parameters' local tensors (a DTensor parameter through a plain
    Parameter sharing its storage), so ZeroRedundancyOptimizer's broadcasts move
    plain tensors.  See [Note: ZeRO].

    Parameters
    ----------
    params : list of Parameter
        The rank's parameters, each once.
    lr : float
        SGD's learning rate.
    sharded : list of Parameter
        Those stepped by ZeroRedundancyOptimizer (a subset of ``params``).
    group : ProcessGroup, optional
        The ring they are sharded over (required when ``sharded`` is not empty).
    """

    def __init__(self, params: list[nn.Parameter], lr: float, sharded: list[nn.Parameter] | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        sharded = sharded or []
        self.params = params
        self._steps = {id(p): p if not is_sharded(p) else nn.Parameter(local(p.detach()), p.requires_grad)
                       for p in params}
        ids = {id(p) for p in sharded}
        plain = [self._steps[id(p)] for p in params if id(p) not in ids]
        self.plain = torch.optim.SGD(plain, lr=lr) if plain else None
        self.zero = None
        self.owners: dict[int, int] = {}
        """``id(parameter) -> global rank`` that steps it, for the sharded parameters."""
        if sharded:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            steps = [self._steps[id(p)] for p in sharded]
            self.zero = ZeroRedundancyOptimizer(steps, optimizer_class=torch.optim.SGD, process_group=group, lr=lr)
            to_rank = self.zero._param_to_rank  # the partition it steps by (its own rule: largest first)
            self.owners = {id(p): dist.get_global_rank(group, to_rank[s]) for p, s in zip(sharded, steps)}

    def stepped_here(self) -> list[int] | None:
        """``[stepped here, sharded]``: how many of the sharded parameters this rank steps; ``None`` if none is."""
        if self.zero is None:
            return None
        me = dist.get_rank()
        return [sum(owner == me for owner in self.owners.values()), len(self.owners)]

    def step(self) -> None:
        """One SGD step (the sharded parameters: each on its owner, then broadcast)."""
        for p in self.params:
            stepped = self._steps[id(p)]
            if stepped is not p:
                stepped.grad = None if p.grad is None else local(p.grad)
        if self.plain is not None:
            self.plain.step()
        if self.zero is not None:
            self.zero.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (``set_to_none``: always, as ``torch.optim``'s default does)."""
        for p in self.params:
            p.grad = None
            self._steps[id(p)].grad = None


def forget_meshes() -> None:
    """Clear DTensor's sharding-propagation caches (after ``destroy_process_group``).

    They key their entries on ``DeviceMesh`` objects that compare equal by ranks and
    shape alone, and the entries hold the mesh they were made with: a process that
    makes new process groups over the same ranks (the next run of a shared launch)
    would otherwise be handed the old mesh, whose process group no longer exists.
    """
    import sys

    if "torch.distributed.tensor" not in sys.modules:
        return  # no DTensor was made
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        cache = getattr(propagator, name, None)
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # the C++ dispatch fast path's
    if native is not None:
        native()


def check_runnable(plan: Plan, file: str, emulate: bool) -> None:
    """Refuse what the runtime does not run of a version-3 plan, before any process starts.

    Raises
    ------
    InputError
        ``--emulate`` with a tensor-parallel stage (the emulator models no collective
        inside a replica).
    """
    degrees = [st.tensor_parallel for st in plan.stages]
    if emulate and max(degrees) > 1:
        s = next(s for s, t in enumerate(degrees) if t > 1)
        raise InputError(file, f"stages[{s}].tensor_parallel",
                         f"stage {s} has tensor_parallel {degrees[s]}, but --emulate models no collective inside a "
                         "replica; run it without --emulate")
