"""The backward split into its input-gradient and weight-gradient halves, as zero-bubble schedules run it.

:func:`split_backward` runs one unit call's backward the way torch.distributed.pipelining
runs an ``I`` and then a ``W`` action (``stage_backward_input``, then
``stage_backward_weight``; a unit none of whose inputs needs a gradient, the first
stage's case, gets an empty ``I`` and the whole backward as its ``W``, as torch does
for stage 0).  A saved-tensor log (``saved_tensors_hooks``) sees every tensor autograd
saves in the forward pass and every one the ``W`` half unpacks: the bytes of the
latter are ``act_w``, what the weight gradient still needs after the input gradient
(for a Linear or a convolution, the layer's input; an activation function's input, read
only by the input gradient, is not among them).  Storages are de-duplicated and
those of the module's parameters and buffers left out, as for ``act``.

:func:`input_backward` is the input-gradient-only backward that the measuring profiler
times (``torch.autograd.grad`` with respect to the unit's inputs: autograd then skips
every weight-gradient kernel).

[Note: when torch's split fails]  torch's ``stage_backward_input`` ends by detaching
the stage output in place, which autograd refuses for a view (an ``nn.Flatten``, a
``Linear`` with a bias on a 3-D input); the output is then cloned first (a clone
saves nothing and counts no FLOPs, so the measurement is the same).  Its weight half
runs one ``torch.autograd.grad`` per group of parameters, and groups that share
intermediate nodes (BART's and T5's attention) would free each other's graph: the
weight half keeps the graph.  Any other failure of the split falls back to the whole
backward, with ``act_w = act`` (every saved tensor counted as still needed by the
weight gradient: the bound that cannot under-count memory) and no FLOP split
(``SplitBackward.split`` is false; the analytic profiler then gives half of the
backward to each half, as for a backward it cannot count).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils import flop_counter

_aten = torch.ops.aten
if _aten._scaled_dot_product_flash_attention_for_cpu.default not in flop_counter.flop_registry:
    # torch's fused attention on the CPU (what scaled_dot_product_attention runs there, and what the zoo's Llama
    # runs on the meta device) has no FLOP formula in FlopCounterMode; it computes what the CUDA flash kernel does
    flop_counter.register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)(
        flop_counter.sdpa_flop)  # already shape-wrapped
    flop_counter.register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)(
        flop_counter.sdpa_backward_flop)


def storage_key(tensor: torch.Tensor) -> tuple[Any, int]:
    """``(identity, bytes)`` of the storage behind ``tensor``; views of one storage share it."""
    # The storage object's C pointer identifies a storage on every device, meta
    # included (where data_ptr() is 0 for all).
    try:
        storage = tensor.untyped_storage()
        return storage._cdata, storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(tensor), tensor.numel() * tensor.element_size()


class SavedTensorLog:
    """Saved-tensor hooks that record what autograd saves and, later, what it reads back.

    Parameters
    ----------
    module : nn.Module
        Storages of its parameters and buffers are not activations and are not counted.

    Examples
    --------
    >>> layer = nn.Linear(3, 2)
    >>> log = SavedTensorLog(layer)
    >>> with log.hooks():
    ...     out = layer(torch.ones(5, 3, requires_grad=True))
    >>> log.saved_bytes()  # the input, 5 x 3 float32; the weight is a parameter
    60
    """

    def __init__(self, module: nn.Module) -> None:
        self.owned = {storage_key(t)[0] for t in (*module.parameters(), *module.buffers())}
        self.tensors: list[torch.Tensor] = []  # holding them keeps storage pointers unique
        self.read: set[int] = set()

    def hooks(self) -> Any:
        """The ``saved_tensors_hooks`` context to run the forward pass in."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> int:
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def _unpack(self, index: int) -> torch.Tensor:
        self.read.add(index)
        return self.tensors[index]

    def _bytes(self, indices: Any) -> int:
        storages = dict(storage_key(self.tensors[i]) for i in indices)
        return sum(nbytes for key, nbytes in storages.items() if key not in self.owned)

    def saved_bytes(self) -> int:
        """Bytes of the distinct non-parameter storages saved so far."""
        return self._bytes(range(len(self.tensors)))

    def read_bytes(self) -> int:
        """Bytes of the distinct non-parameter storages unpacked since :meth:`forget_reads`."""
        return self._bytes(self.read)

    def forget_reads(self) -> None:
        """Start a new record of unpacked tensors."""
        self.read.clear()


def grad_inputs(leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The inputs an ``I`` action computes gradients for: those that require grad."""
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def input_backward(output: torch.Tensor, leaves: Sequence[torch.Tensor]) -> None:
    """The input-gradient-only backward of ``output`` (all-ones gradient): no parameter gradient is computed.

    Does nothing when no input requires grad or the output has no backward.
    """
    targets = grad_inputs(leaves)
    if targets and output.requires_grad:
        torch.autograd.grad(output, targets, torch.ones_like(output), allow_unused=True)


@dataclass(frozen=True)
class SplitBackward:
    """What one unit call's split backward saved, read and computed."""

    act: int
    """Bytes of the saved activations (distinct storages, parameters and buffers left out)."""
    act_w: int
    """Bytes of those the weight-gradient half unpacked."""
    out: int
    """Bytes of the output tensor."""
    input_flops: float
    """FLOPs of the input-gradient half (0 unless counted)."""
    weight_flops: float
    """FLOPs of the weight-gradient half (0 unless counted)."""
    split: bool = True
    """Whether torch's split ran; ``False``: the whole backward ran instead (see [Note: when torch's split fails])."""


def split_backward(module: nn.Module, args: Sequence[torch.Tensor],
                   count: Callable[[], Any] | None = None) -> SplitBackward:
    """Run ``module(*args)``, then its backward as an ``I`` and a ``W`` action; see the module docstring.

    Parameters
    ----------
    module : nn.Module
        The unit (its output is one tensor).
    args : sequence of Tensor
        Leaf inputs (floating ones requiring grad, as in a pipeline stage).
    count : callable, optional
        ``count()`` gives a fresh ``FlopCounterMode``; each half is then run inside one
        and its FLOPs reported.

    Returns
    -------
    SplitBackward
        The parameter gradients the call computed are dropped (``zero_grad(set_to_none=True)``).

    Examples
    --------
    >>> layer = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    >>> split = split_backward(layer, [torch.ones(5, 3, requires_grad=True)])
    >>> split.act, split.act_w  # saved: 5 x (3 + 4 + 4) floats; the GELU's input is not read by W
    (220, 140)
    """
    log = SavedTensorLog(module)
    with log.hooks():
        output = module(*args)
    act = log.saved_bytes()
    if not output.requires_grad:  # computed from buffers alone (a rotary table): no backward
        return SplitBackward(act, 0, _nbytes(output), 0.0, 0.0)
    params = [p for p in module.parameters() if p.requires_grad]
    has_inputs = bool(grad_inputs(args))
    flops: list[float] = []
    try:
        with _counting(count, flops):
            groups = _input_half(output, args, params) if has_inputs else []
        log.forget_reads()
        with _counting(count, flops):
            if has_inputs:
                stage_backward_weight(iter(params), groups, retain_graph=True)
            else:  # torch's first stage: an empty I, the whole backward at W
                output.backward(torch.ones_like(output))
    except RuntimeError:  # see [Note: when torch's split fails]
        module.zero_grad(set_to_none=True)
        return _whole_backward(module, args, count, _nbytes(output))
    module.zero_grad(set_to_none=True)
    input_flops, weight_flops = flops or (0.0, 0.0)
    return SplitBackward(act, min(log.read_bytes(), act), _nbytes(output), input_flops, weight_flops)


def _input_half(output: torch.Tensor, args: Sequence[torch.Tensor], params: list[nn.Parameter]) -> Any:
    """torch's ``stage_backward_input``; its parameter groups for the weight half."""
    if output._is_view():  # torch detaches the output in place, which a view refuses
        output = output.clone()
    return stage_backward_input([output], None, list(args), iter(params))[1]


def _whole_backward(module: nn.Module, args: Sequence[torch.Tensor], count: Callable[[], Any] | None,
                    out: int) -> SplitBackward:
    """The fallback of [Note: when torch's split fails]: a fresh forward and the whole backward."""
    leaves = [a.detach().requires_grad_(a.requires_grad) for a in args]
    log = SavedTensorLog(module)
    with log.hooks():
        output = module(*leaves)
    act = log.saved_bytes()
    flops: list[float] = []
    with _counting(count, flops):
        output.backward(torch.ones_like(output))
    module.zero_grad(set_to_none=True)
    total = flops[0] if flops else 0.0
    return SplitBackward(act, act, out, total / 2, total / 2, split=False)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@contextmanager
def _counting(count: Callable[[], Any] | None, totals: list[float]) -> Iterator[None]:
    """Run the block inside ``count()`` (when given) and append its total FLOPs to ``totals``."""
    if count is None:
        yield
        return
    with count() as mode:
        yield
    totals.append(float(mode.get_total_flops()))
