"""An imported model under the zoo's unit contract, so the runtime can cut and run it.

The runtime runs a stage as "units ``lo..hi-1`` on the tensors that crossed the cut"
(:class:`pipeplan.models.zoo.base.ZooModel`).  An imported model's units are tied
together by its own ``forward``: glue code computes their arguments (masks,
positions, ``h + e``, concatenations).  :class:`ReplayModel` runs a stage by
*replaying* the model's ``forward`` on the stage's rows of the model input:

- a unit before the stage does not compute: it returns the tensor that crossed the
  cut (or zeros of its shape when no unit of the stage reads it, which the dataflow
  guarantees);
- the stage's units compute, and their outputs are recorded;
- the first unit after the stage stops the replay (the last stage runs to the end,
  and its output is the model's output).

So each stage carries exactly the glue code that feeds it, recomputed from the model
input (every rank draws the batch itself) and the crossing tensors, whatever Python
the model runs; glue is cheap and parameter-free (see
:mod:`pipeplan.models.dataflow`).  A unit's output crosses a cut as one tensor: its
only tensor, or its tensors flattened side by side; a tensor that does not grow with
the batch (a position table) is expanded along the batch to cross, and the receiving
stage reads one row of it back, so gradients reach it once.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree
from torch import nn

from pipeplan.models.errors import InputError
from pipeplan.models.imported import ImportedModel
from pipeplan.models.spec import first_float
from pipeplan.models.zoo.base import Unit, ZooModel


@dataclass(frozen=True)
class LeafLayout:
    """One tensor leaf of a unit's output."""

    shape: tuple[int, ...]
    """Per-sample shape (growing leaf) or the whole shape (fixed leaf)."""
    grows: bool
    """Whether its first dimension is the batch."""


@dataclass(frozen=True)
class OutputLayout:
    """How a unit's output is rebuilt from the one tensor that crosses a cut."""

    spec: pytree.TreeSpec
    """Structure of the output."""
    constants: tuple[Any, ...]
    """Its leaves, ``None`` where a tensor goes."""
    tensors: tuple[LeafLayout, ...]
    """Its tensor leaves, in order."""
    dtype: torch.dtype
    """Dtype of the tensor leaves."""

    def widths(self) -> list[int]:
        return [int(torch.Size(t.shape).numel()) for t in self.tensors]

    def pack(self, output: Any, n: int) -> torch.Tensor:
        """The crossing tensor ``(n, ...)`` of an output."""
        leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
        if len(leaves) == 1 and self.tensors[0].grows:
            return leaves[0]
        parts = [t.reshape(n, -1) if lay.grows else t.reshape(1, -1).expand(n, -1)
                 for t, lay in zip(leaves, self.tensors)]
        return torch.cat(parts, dim=1)

    def unpack(self, crossing: torch.Tensor | None, n: int) -> Any:
        """The output rebuilt from its crossing tensor (zeros of its shape for ``None``)."""
        if crossing is None:
            tensors = [torch.zeros((n, *t.shape) if t.grows else t.shape, dtype=self.dtype) for t in self.tensors]
        elif len(self.tensors) == 1 and self.tensors[0].grows:
            tensors = [crossing]
        else:
            parts = crossing.reshape(n, -1).split(self.widths(), dim=1)
            tensors = [p.reshape(n, *t.shape) if t.grows else p[0].reshape(t.shape)
                       for p, t in zip(parts, self.tensors)]
        it = iter(tensors)
        leaves = [next(it) if c is None else c for c in self.constants]
        return pytree.tree_unflatten(leaves, self.spec)


class _Stop(Exception):
    """The replay reached a unit after the stage."""


@dataclass(eq=False)
class ReplayModel(ZooModel):
    """An :class:`~pipeplan.models.imported.ImportedModel` as a ``ZooModel`` (see the module docs).

    Every unit lists the model input (``-1``) among its inputs, since its glue may read
    it; the model's edges are the imported ones.
    """

    imported: ImportedModel | None = None
    """The traced model."""
    layouts: list[OutputLayout] = field(default_factory=list)
    """Per unit: how its output crosses a cut."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the model's call that are no tensors (fixed by the example)."""

    def __post_init__(self) -> None:  # the imported checks stand; consumption is not required
        pass

    @property
    def user(self) -> Any:
        assert self.imported is not None
        return self.imported.user

    def edges(self) -> list[tuple[int, int]]:
        assert self.imported is not None
        return self.imported.edges()

    def example_batch(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        if n < 1:
            raise InputError("-", "batch", f"a batch needs at least 1 sample, got {n}")
        (x,), _ = self.user.example(n, seed)
        if x.is_floating_point():
            x = x.to(self.layouts[0].dtype)
        return x, torch.zeros(n)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.user.loss(output, int(targets.shape[0]))

    def forward(self, inputs: torch.Tensor, lo: int = 0, hi: int | None = None,
                outputs: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
        last = len(self.units)
        hi = last if hi is None else hi
        done: dict[int, Any] = dict(outputs or {})
        done[-1] = inputs
        n = int(inputs.shape[0])
        output = None
        with self._replaying(done, lo, hi, n):
            try:
                output = self.user.module(inputs, **self.kwargs)
            except _Stop:
                pass
        if hi == last:
            done[last - 1] = output if isinstance(output, torch.Tensor) else first_float(output)
        return done

    @contextmanager
    def _replaying(self, done: dict[int, Any], lo: int, hi: int, n: int) -> Iterator[None]:
        handles = []
        replaced = []
        for i, unit in enumerate(self.units):
            module = unit.module
            if i < lo:
                module.forward = _received(self.layouts[i], done, i, n)  # type: ignore[method-assign]
                replaced.append(module)
            elif i < hi:
                handles.append(module.register_forward_hook(_keep(self.layouts[i], done, i, n)))
            else:
                handles.append(module.register_forward_pre_hook(_stop))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for module in replaced:
                del module.forward


def _received(layout: OutputLayout, done: dict[int, Any], i: int, n: int) -> Any:
    def forward(*_args: Any, **_kwargs: Any) -> Any:
        return layout.unpack(done.get(i), n)
    return forward


def _keep(layout: OutputLayout, done: dict[int, Any], i: int, n: int) -> Any:
    def hook(_module: nn.Module, _args: Any, output: Any) -> None:
        done[i] = layout.pack(output, n)
    return hook


def _stop(_module: nn.Module, _args: Any) -> None:
    raise _Stop()


def replay_model(imported: ImportedModel, *, dtype: torch.dtype = torch.float32) -> ReplayModel:
    """The runnable form of ``imported``, its floating-point parameters and buffers in ``dtype``.

    Raises
    ------
    InputError
        When the model cannot be cut into runnable stages: an example that is not one
        tensor, or a unit output holding integer tensors or tensors of several dtypes.
    """
    spec = imported.user.spec
    call = imported.user.example(2)
    tensors = [t for t in pytree.tree_leaves(call) if isinstance(t, torch.Tensor)]
    if len(call[0]) != 1 or not isinstance(call[0][0], torch.Tensor) or len(tensors) != 1:
        raise InputError(spec, "run", "the runtime feeds the model one input tensor, and example(n) gives "
                                      f"{len(tensors)} tensors in {len(call[0])} arguments and {len(call[1])} "
                                      "keywords; return one tensor from example(n) (build the rest in forward)")
    kwargs = dict(call[1])
    layouts = _layouts(imported, dtype, spec)
    imported.user.module.to(dtype)
    units = [Unit(u.name, u.module, (-1, *u.inputs), u.tied_to) for u in imported.units]
    return ReplayModel(imported.user.name, units, _no_batch, _no_loss, 0, config={"spec": spec},
                       imported=imported, layouts=layouts, kwargs=kwargs)  # type: ignore[call-arg]


def _no_batch(n: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError  # ReplayModel.example_batch draws from the factory's example


def _no_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError  # ReplayModel.loss applies the factory's loss


def _layouts(imported: ImportedModel, dtype: torch.dtype, spec: str) -> list[OutputLayout]:
    _, small, _ = imported.unit_calls(2)
    _, large, _ = imported.unit_calls(3)
    layouts = []
    for unit, a, b in zip(imported.units, small, large):
        leaves, tree = pytree.tree_flatten(b)
        small_leaves = pytree.tree_leaves(a)
        tensors, constants = [], []
        for x, y in zip(small_leaves, leaves):
            if not isinstance(y, torch.Tensor):
                constants.append(y)
                continue
            if not y.is_floating_point():
                raise InputError(spec, "run", f"unit {unit.name} outputs a {y.dtype} tensor, which cannot carry "
                                              "a gradient across a cut; make it part of a larger unit (--units)")
            constants.append(None)
            grows = x.shape != y.shape
            tensors.append(LeafLayout(tuple(y.shape[1:]) if grows else tuple(y.shape), grows))
        if not tensors:
            raise InputError(spec, "run", f"unit {unit.name} outputs no tensor; make it part of a larger unit")
        dtypes = {t.dtype for t in leaves if isinstance(t, torch.Tensor)}
        if len(dtypes) > 1:
            raise InputError(spec, "run", f"unit {unit.name} outputs tensors of dtypes {sorted(map(str, dtypes))}; "
                                          "one crossing tensor needs one dtype")
        layouts.append(OutputLayout(tree, tuple(constants), tuple(tensors), dtype))
    return layouts
