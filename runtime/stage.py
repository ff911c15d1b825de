"""One pipeline stage built from the zoo model's units ``lo <= i < hi``.

A stage takes the tensors crossing the cut before it (its *inputs*, keyed by the unit
that produced them), runs its units and hands over the tensors crossing the cut after
it (its *outputs*; a skip tensor that only passes through is relayed unchanged).
Across a cut the tensors travel as one 2-D buffer ``(samples, features)``: each
sample's parts flattened side by side, so regrouping samples is slicing rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from pipeplan.models.zoo import ZooModel
from pipeplan.runtime.pieces import batch_norms, frozen_statistics, has_dropout
from pipeplan.runtime.routing import boundary


@dataclass(frozen=True)
class CutLayout:
    """How the tensors crossing one cut are laid out in a ``(samples, features)`` buffer."""

    units: tuple[int, ...]
    """Producing units of the crossing tensors, in column order."""
    shapes: tuple[tuple[int, ...], ...]
    """Per-sample shape of each tensor."""
    dtype: torch.dtype
    """Dtype of the buffer (all crossing tensors share it)."""

    @property
    def widths(self) -> list[int]:
        """Features of each tensor."""
        return [math.prod(shape) for shape in self.shapes]

    @property
    def features(self) -> int:
        """Columns of the buffer."""
        return sum(self.widths)

    def pack(self, tensors: dict[int, torch.Tensor]) -> torch.Tensor:
        """``{unit: (n, *shape)}`` -> ``(n, features)``, detached and contiguous."""
        parts = [tensors[u].detach().reshape(tensors[u].shape[0], -1) for u in self.units]
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].contiguous()

    def unpack(self, buffer: torch.Tensor, requires_grad: bool = False) -> dict[int, torch.Tensor]:
        """``(n, features)`` -> ``{unit: (n, *shape)}``; leaves needing grad if asked."""
        n = buffer.shape[0]
        out = {}
        for u, shape, part in zip(self.units, self.shapes, buffer.split(self.widths, dim=1)):
            tensor = part.reshape(n, *shape).detach()
            out[u] = tensor.requires_grad_() if requires_grad else tensor
        return out


def unit_shapes(model: ZooModel) -> dict[int, tuple[tuple[int, ...], torch.dtype]]:
    """Per-sample output shape and dtype of every unit, from a one-sample forward pass.

    Shapes come from the model alone (no communication), which is what lets every
    receive buffer be sized from the plan.
    """
    x, _ = model.example_batch(1)
    with torch.no_grad():
        outputs = model.forward(x.to(next(model.units[0].module.parameters()).device))
    return {u: (tuple(t.shape[1:]), t.dtype) for u, t in outputs.items()}


def cut_layout(model: ZooModel, cut_after: int, shapes: dict[int, tuple[tuple[int, ...], torch.dtype]]) -> CutLayout:
    """Layout of the tensors crossing the cut after unit ``cut_after``."""
    units = tuple(boundary([u.inputs for u in model.units], cut_after))
    dtypes = {shapes[u][1] for u in units}
    if len(dtypes) != 1:
        raise ValueError(f"tensors crossing the cut after unit {cut_after} have dtypes {sorted(map(str, dtypes))}; "
                         f"one buffer per cut needs a single dtype")
    return CutLayout(units, tuple(shapes[u][0] for u in units), dtypes.pop())


@dataclass
class Stage:
    """The units of one stage, run forward and backward on pieces of the batch."""

    model: ZooModel
    """The whole zoo model (this process only ever touches units ``lo..hi-1``)."""
    lo: int
    """First unit."""
    hi: int
    """One past the last unit."""
    recompute: bool
    """Keep only inputs in the forward pass and re-run it for the backward."""
    input_layout: CutLayout | None
    """Tensors arriving from the previous stage (``None`` on the first)."""
    output_layout: CutLayout | None
    """Tensors leaving for the next stage (``None`` on the last)."""
    modules: nn.ModuleList = field(init=False)
    """The stage's unit modules (a Parameter shared by two of them appears once)."""
    has_dropout: bool = field(init=False)
    """Whether a forward draws random masks: each piece then gets its own seed."""
    norms: list[nn.Module] = field(init=False)
    """The stage's BatchNorm layers (their running statistics are kept out of recomputation)."""

    def __post_init__(self) -> None:
        self.modules = nn.ModuleList(u.module for u in self.model.units[self.lo:self.hi])
        self.has_dropout = has_dropout(self.modules)
        self.norms = batch_norms(self.modules)

    @property
    def is_last(self) -> bool:
        return self.output_layout is None

    def parameters(self) -> list[nn.Parameter]:
        """Unique parameters of the stage, in a fixed order."""
        return list(self.modules.parameters())

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """``"unit.param" -> Parameter`` over the stage's units (a tied one under each name)."""
        return {f"{unit.name}.{name}": p for unit in self.model.units[self.lo:self.hi]
                for name, p in unit.module.named_parameters(remove_duplicate=False)}

    def run(self, inputs: dict[int, torch.Tensor], seed: int | None = None) -> dict[int, torch.Tensor]:
        """Run the stage's units; returns every tensor by unit (inputs included).

        ``seed`` (see :func:`pipeplan.runtime.pieces.piece_seed`) seeds the RNG first when the stage has dropout.
        """
        if self.has_dropout and seed is not None:
            torch.manual_seed(seed)
        first = inputs[-1] if -1 in inputs else None
        return self.model.forward(first, self.lo, self.hi, inputs)  # type: ignore[arg-type]

    def rerun(self, inputs: dict[int, torch.Tensor], seed: int | None = None) -> dict[int, torch.Tensor]:
        """:meth:`run` again for a recomputing backward: the same masks, running statistics untouched."""
        with frozen_statistics(self.norms):
            return self.run(inputs, seed)

    def outputs(self, done: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """The tensors to send on (relayed skips included)."""
        assert self.output_layout is not None
        return {u: done[u] for u in self.output_layout.units}

    def loss(self, done: dict[int, torch.Tensor], targets: torch.Tensor, share: float) -> torch.Tensor:
        """The piece's loss scaled by its share of the global batch (last stage only).

        ``model.loss`` is a mean over the piece, so ``share = n_piece / global_batch``
        makes the pieces' losses sum to the loss of the whole batch, and their
        gradients to its gradient, whatever the split.
        """
        return self.model.loss(done[self.hi - 1], targets) * share

    def backward(self, done: dict[int, torch.Tensor], grads: dict[int, torch.Tensor] | None,
                 loss: torch.Tensor | None) -> None:
        """Accumulate parameter and input gradients from the output gradients (or the loss)."""
        if loss is not None:
            loss.backward()
            return
        assert grads is not None and self.output_layout is not None
        tensors = [done[u] for u in self.output_layout.units]
        keep = [i for i, t in enumerate(tensors) if t.requires_grad]
        torch.autograd.backward([tensors[i] for i in keep], [grads[self.output_layout.units[i]] for i in keep])
