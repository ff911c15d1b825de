"""What tensor parallelism splits of a layer, and what it all-reduces: the ``tp_share`` and ``tp_comm`` fields.

A unit whose module has a known tensor-parallel plan gets the two version-3 layer
fields of docs/model.md section 8.1; every other unit has none (tensor parallelism
splits nothing of it) and is profiled as before.  The plans are those Megatron-LM and
torchtitan apply (torch's ``parallelize_module`` styles):

- a transformer block: the attention's query, key and value projections column-parallel
  and its output projection row-parallel; the MLP's first projections (``fc``, or a
  gated MLP's ``gate`` and ``up``) column-parallel and its last row-parallel.  The
  attention core between them runs on the device's own heads, the MLP's activation on its
  own shard of the hidden units; the LayerNorms, residual additions and the dropouts
  after the row-parallel projections see whole activations on every device;
- a token embedding: vocab-parallel (torch's ``RowwiseParallel`` on an ``nn.Embedding``,
  Megatron's ``VocabParallelEmbedding``): each device holds a slice of the vocabulary
  and the output is all-reduced in the forward;
- a language-model head: the output projection column-parallel over the vocabulary
  (torchtitan's ``ColwiseParallel`` output with loss parallelism, Megatron's parallel
  output layer with its vocab-parallel cross entropy): the input gradient is all-reduced
  in the backward.

The zoo's GPT and Llama blocks, embeddings and heads and BERT's encoder layers and word
embedding have such plans, and so have the Hugging Face GPT-2, Llama (and Llama-shaped: Mistral,
Qwen2) and BERT blocks, embeddings and heads, recognised by their submodules' names.

How the fields are found (:func:`count_tensor_parallel`, one forward pass of the unit,
on the meta device for the analytic profiler and on the CPU for the measured one; the
numbers are counts, so both give the same):

- ``x_time``: the share of the unit's forward FLOPs (``FlopCounterMode``) computed from
  a column-parallel projection's start to the end of the next row-parallel one (for a
  head: from its column-parallel projection on), per sample;
- ``x_params``: the share of the unit's parameter bytes in the split weights (the
  column-parallel projections' weights and biases, the row-parallel ones' weights, a
  vocab-parallel embedding's table);
- ``x_act``: the share of the saved-activation bytes (``saved_tensors_hooks``, storages
  de-duplicated as for ``act``) saved between a column-parallel projection's output and
  a row-parallel one's end, per sample; the projections' inputs, which every device
  holds whole, are not among them;
- ``c_f``: the bytes per sample of the row-parallel projections' outputs and of a
  vocab-parallel embedding's output (each all-reduced in the forward); ``c_b``: those of
  the column-parallel projections' distinct inputs (their gradient is all-reduced in the
  backward).  A block: ``c_f = c_b = 2 * s * h`` elements, two all-reduces each way.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipeplan.models.graph import LayerGraph
from pipeplan.models.profile_units import leaf_args, param_bytes, per_sample, unit_args
from pipeplan.models.profile_split import storage_key

COLWISE = "colwise"
"""A projection whose output features are split (torch's ``ColwiseParallel``)."""
ROWWISE = "rowwise"
"""A projection whose input features are split; its output is all-reduced (``RowwiseParallel``)."""
EMBEDDING = "embedding"
"""A vocab-parallel embedding: its table split by rows, its output all-reduced (``RowwiseParallel`` on an
``nn.Embedding``)."""
VOCAB_OUT = "vocab_out"
"""A module whose output feeds a vocab-parallel output projection that is not a module of its own (the zoo GPT
head's tied ``F.linear``): what follows it is split."""

STYLES = (COLWISE, ROWWISE, EMBEDDING, VOCAB_OUT)

_ATTENTION_MLP_PLANS: tuple[dict[str, str], ...] = (
    # Hugging Face GPT-2 (Conv1D projections)
    {"attn.c_attn": COLWISE, "attn.c_proj": ROWWISE, "mlp.c_fc": COLWISE, "mlp.c_proj": ROWWISE},
    # Hugging Face Llama, Mistral, Qwen2 (gated MLP)
    {"self_attn.q_proj": COLWISE, "self_attn.k_proj": COLWISE, "self_attn.v_proj": COLWISE,
     "self_attn.o_proj": ROWWISE, "mlp.gate_proj": COLWISE, "mlp.up_proj": COLWISE, "mlp.down_proj": ROWWISE},
    # Hugging Face BERT, RoBERTa
    {"attention.self.query": COLWISE, "attention.self.key": COLWISE, "attention.self.value": COLWISE,
     "attention.output.dense": ROWWISE, "intermediate.dense": COLWISE, "output.dense": ROWWISE},
)
"""Transformer blocks recognised by their submodules' names (every name must be there)."""

_EMBEDDING_NAMES = ("wte", "embed_tokens", "word_embeddings", "tok_embeddings", "embed")
"""Token embeddings (the unit itself, or a child of it): Hugging Face's names, torchtitan's, the zoo Llama's."""
_HEAD_PLANS: tuple[dict[str, str], ...] = ({"predictions.decoder": COLWISE},)
"""Heads with a vocab-parallel projection inside (BERT's masked-LM head)."""


def tensor_parallel_plan(module: nn.Module, name: str = "") -> dict[str, str]:
    """The tensor-parallel plan of a unit: its submodules' qualified names -> a style of :data:`STYLES`.

    Parameters
    ----------
    module : nn.Module
        The unit's module.
    name : str
        The unit's qualified name in its model (``transformer.wte``, ``lm_head``); it tells an
        imported model's token embedding and head from other embeddings and projections.

    Returns
    -------
    dict
        Empty when the unit has no known plan (tensor parallelism splits nothing of it).
        ``""`` names the unit's module itself.

    Examples
    --------
    >>> from pipeplan.models.zoo import build_model
    >>> tensor_parallel_plan(build_model("gpt-tiny", device="meta").units[1].module)
    {'attn.qkv': 'colwise', 'attn.proj': 'rowwise', 'mlp.0': 'colwise', 'mlp.2': 'rowwise'}
    """
    zoo = _zoo_plan(module)
    if zoo is not None:
        return zoo
    names = dict(module.named_modules())
    for plan in (*_ATTENTION_MLP_PLANS, *_HEAD_PLANS):
        if all(key in names for key in plan):
            return dict(plan)
    last = name.rsplit(".", 1)[-1]
    if isinstance(module, nn.Embedding) and last in _EMBEDDING_NAMES:
        return {"": EMBEDDING}
    if isinstance(module, nn.Linear) and last == "lm_head":
        return {"": COLWISE}
    children = dict(module.named_children())
    for child in _EMBEDDING_NAMES:
        if isinstance(children.get(child), nn.Embedding) and not any(isinstance(m, nn.Linear)
                                                                      for m in module.modules()):
            return {child: EMBEDDING}
    return {}


def _zoo_plan(module: nn.Module) -> dict[str, str] | None:
    """The plan of a zoo unit (``None``: not a zoo transformer's unit)."""
    from pipeplan.models.zoo import bert, gpt, llama

    if isinstance(module, llama.DecoderLayer):  # torchtitan's Llama plan, module for module
        return {"attention.wq": COLWISE, "attention.wk": COLWISE, "attention.wv": COLWISE, "attention.wo": ROWWISE,
                "feed_forward.w1": COLWISE, "feed_forward.w3": COLWISE, "feed_forward.w2": ROWWISE}
    if isinstance(module, llama.Output):
        return {"output": COLWISE}
    if isinstance(module, gpt.Block):
        return {"attn.qkv": COLWISE, "attn.proj": ROWWISE, "mlp.0": COLWISE, "mlp.2": ROWWISE}
    if isinstance(module, gpt.Embedding):
        return {"wte": EMBEDDING}
    if isinstance(module, gpt.Head):
        return {"ln_f": VOCAB_OUT}
    if isinstance(module, bert.EncoderLayer):
        return {"query": COLWISE, "key": COLWISE, "value": COLWISE, "out": ROWWISE, "mlp.0": COLWISE,
                "mlp.2": ROWWISE}
    if isinstance(module, bert.Embeddings):
        return {"word": EMBEDDING}
    return None


def split_param_bytes(module: nn.Module, plan: dict[str, str]) -> int:
    """Bytes of the parameters tensor parallelism splits: column-parallel weights and biases, row-parallel
    weights, vocab-parallel tables (the zoo head's tied table: the embedding it holds)."""
    names = dict(module.named_modules())
    total = 0
    for key, style in plan.items():
        sub = names[key]
        if style == VOCAB_OUT:  # the zoo GPT head: its tied token table is the split projection
            sub = getattr(module, "wte", None)
            params = [sub.weight] if sub is not None else []
        elif style == ROWWISE:
            params = [sub.weight] if hasattr(sub, "weight") else []
        else:
            params = list(sub.parameters(recurse=False))
        total += sum(p.numel() * p.element_size() for p in params)
    return total


@dataclass(frozen=True)
class TensorParallelCount:
    """What one forward call of a unit does under its plan (:func:`count_tensor_parallel`)."""

    flops: float
    """Forward FLOPs of the call."""
    split_flops: float
    """Of those, the FLOPs on split features (divided among the ``t`` devices)."""
    saved: int
    """Saved-activation bytes (distinct storages, parameters and buffers left out)."""
    split_saved: int
    """Of those, the bytes of activations split among the devices."""
    fwd_bytes: int
    """Bytes all-reduced in the forward (row-parallel and vocab-parallel outputs)."""
    bwd_bytes: int
    """Bytes all-reduced in the backward (gradients of the column-parallel projections' distinct inputs)."""


class _Tracker:
    """Forward hooks on a plan's modules: where the split region is, what is whole, what is all-reduced."""

    def __init__(self, owner: nn.Module, plan: dict[str, str], counter: FlopCounterMode) -> None:
        self.owned = {storage_key(t)[0] for t in (*owner.parameters(), *owner.buffers())}
        self.counter = counter
        self.compute_open = False   # FLOPs on split features: from a column-parallel start to a row-parallel end
        self.saved_open = False     # saved tensors split: from a column-parallel output to a row-parallel end
        self.opened_at = 0.0
        self.split_flops = 0.0
        self.whole: set[Any] = set()  # storages every device holds whole (the column-parallel inputs)
        self.fwd: dict[Any, int] = {}
        self.bwd: dict[Any, int] = {}
        self.held: list[torch.Tensor] = []  # alive until counted, so no storage's identity is reused
        self.packed: list[tuple[torch.Tensor, bool]] = []
        names = dict(owner.named_modules())
        self.handles = []
        for key, style in plan.items():
            module = names[key]
            self.handles.append(module.register_forward_pre_hook(self._pre(style)))
            self.handles.append(module.register_forward_hook(self._post(style)))

    def _open(self) -> None:
        if not self.compute_open:
            self.compute_open = True
            self.opened_at = float(self.counter.get_total_flops())

    def close(self) -> None:
        if self.compute_open:
            self.split_flops += float(self.counter.get_total_flops()) - self.opened_at
        self.compute_open = self.saved_open = False

    def _pre(self, style: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if style == COLWISE:
                for tensor in _tensors(args):
                    self.held.append(tensor)
                    key = storage_key(tensor)[0]
                    self.whole.add(key)
                    self.bwd[key] = tensor.numel() * tensor.element_size()
                self._open()
        return hook

    def _post(self, style: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            out = _tensors(output)
            self.held.extend(out)
            if style == ROWWISE:
                self.close()
            if style in (ROWWISE, EMBEDDING):
                for tensor in out:
                    self.fwd[storage_key(tensor)[0]] = tensor.numel() * tensor.element_size()
            if style == COLWISE:
                self.saved_open = True
            if style == VOCAB_OUT:  # its output is the projection's whole input
                for tensor in out:
                    key = storage_key(tensor)[0]
                    self.whole.add(key)
                    self.bwd[key] = tensor.numel() * tensor.element_size()
                self._open()
                self.saved_open = True
        return hook

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.packed.append((tensor, self.saved_open))
        return tensor

    def saved_bytes(self) -> tuple[int, int]:
        """``(all, split)`` bytes of the distinct non-parameter storages saved (first save decides)."""
        first: dict[Any, tuple[int, bool]] = {}
        for tensor, split in self.packed:
            key, nbytes = storage_key(tensor)
            if key not in self.owned and key not in first:
                first[key] = (nbytes, split and key not in self.whole)
        return sum(n for n, _ in first.values()), sum(n for n, split in first.values() if split)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _tensors(value: Any) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def count_tensor_parallel(run: nn.Module, args: Sequence[torch.Tensor], unit: nn.Module,
                          plan: dict[str, str]) -> TensorParallelCount:
    """Run ``run(*args)`` once (its output's backward is not run) and count what ``plan`` splits of ``unit``.

    Parameters
    ----------
    run : nn.Module
        What calls the unit (the unit itself, or a wrapper passing an imported unit its captured arguments).
    args : sequence of Tensor
        Leaf inputs, as a pipeline stage gets them.
    unit : nn.Module
        The unit whose submodules ``plan`` names.
    plan : dict
        From :func:`tensor_parallel_plan` (not empty).

    Examples
    --------
    >>> mlp = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 4))
    >>> c = count_tensor_parallel(mlp, [torch.ones(2, 4, requires_grad=True)], mlp, {"0": "colwise", "2": "rowwise"})
    >>> c.flops == c.split_flops, c.saved, c.split_saved, c.fwd_bytes, c.bwd_bytes
    (True, 288, 256, 32, 32)
    """
    with ExitStack() as stack:
        counter = stack.enter_context(FlopCounterMode(display=False))
        tracker = _Tracker(unit, plan, counter)
        stack.callback(tracker.remove)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t))
        run(*args)
        tracker.close()
        flops = float(counter.get_total_flops())
    saved, split_saved = tracker.saved_bytes()
    return TensorParallelCount(flops, min(tracker.split_flops, flops), saved, split_saved,
                               sum(tracker.fwd.values()), sum(tracker.bwd.values()))


def tensor_parallel_fields(sizes: Sequence[int], counts: Sequence[TensorParallelCount], params: float,
                           split_params: float) -> tuple[tuple[float, float, float], tuple[float, float]]:
    """``(tp_share, tp_comm)`` of a layer from its counts at each of ``sizes`` samples (per-sample parts).

    Each share is the per-sample part of the split quantity over the per-sample part of
    the whole (0 when the whole has none: an embedding computes no FLOPs); the bytes are
    per sample.
    """
    def share(part: str, whole: str) -> float:
        total = per_sample(sizes, [getattr(c, whole) for c in counts])
        if total <= 0:
            return 0.0
        return min(max(per_sample(sizes, [getattr(c, part) for c in counts]) / total, 0.0), 1.0)

    x_params = min(split_params / params, 1.0) if params > 0 else 0.0
    comm = (per_sample(sizes, [c.fwd_bytes for c in counts]), per_sample(sizes, [c.bwd_bytes for c in counts]))
    return (share("split_flops", "flops"), x_params, share("split_saved", "saved")), comm


UnitCall = tuple[nn.Module, Sequence[torch.Tensor]]
"""What runs one unit on one batch: ``(module, leaf args)``, the module being the unit or a wrapper calling it."""

SIZES = (1, 2)
"""The batch sizes counted: the counts are affine in the batch size, two sizes give the per-sample parts."""


def with_tensor_parallel(graph: LayerGraph, units: Sequence[tuple[str, nn.Module]],
                         work: Callable[[int], Sequence[UnitCall]]) -> LayerGraph:
    """``graph`` with ``tp_share`` and ``tp_comm`` on the layers whose unit has a known plan.

    Parameters
    ----------
    graph : LayerGraph
        A profiled graph, one layer per unit, in the units' order.
    units : sequence of (name, module)
        The units (qualified name, module).
    work : callable
        ``work(n)`` gives each unit's :data:`UnitCall` for a batch of ``n`` samples.

    Returns
    -------
    LayerGraph
        ``graph`` itself when no unit has a plan (the graph's version does not change).
    """
    plans = [tensor_parallel_plan(module, name) for name, module in units]
    if not any(plans):
        return graph
    counts: list[list[TensorParallelCount]] = [[] for _ in units]
    for n in SIZES:
        for i, (run, args) in enumerate(work(n)):
            if plans[i]:
                counts[i].append(count_tensor_parallel(run, leaf_args(args), units[i][1], plans[i]))
    layers = []
    for layer, (name, module), plan, count in zip(graph.layers, units, plans, counts):
        if plan:
            share, comm = tensor_parallel_fields(SIZES, count, param_bytes(module), split_param_bytes(module, plan))
            layer = replace(layer, tp_share=share, tp_comm=comm)
        layers.append(layer)
    return LayerGraph(graph.name, layers, list(graph.edges) if graph.explicit_edges else None, graph.input_bytes,
                      graph.extra)


def zoo_work(model: Any, seed: int = 0) -> Callable[[int], list[UnitCall]]:
    """``work(n)`` for :func:`with_tensor_parallel` on a zoo model: each unit and its arguments for ``n`` samples."""
    def work(n: int) -> list[UnitCall]:
        inputs, _ = model.example_batch(n, seed)
        return [(unit.module, args) for unit, args in zip(model.units, unit_args(model, inputs))]

    return work
