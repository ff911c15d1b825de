"""Record which unit's output feeds which unit by running the model once, eagerly.

Forward pre- and post-hooks on the units see each unit's arguments and output; a
:class:`~torch.overrides.TorchFunctionMode` sees every operation the glue code (the
model's own ``forward`` between units) runs, and tags each tensor it computes with
the set of *sources* it came from: unit indices and model inputs (``"input:0"``,
``"input:attention_mask"``).  A unit's inputs are the sources of the arguments it
computes with (an argument read only for its ``dtype`` or shape is no dataflow).  So
a skip connection, a model input read by a later unit (an attention mask) and a
tensor that glue code derives from an earlier output (``h + e``) are all edges,
whatever Python the model runs, value-dependent ``if`` included.  A tensor made from
nothing tagged (``torch.arange`` positions) carries no edge.

[Note: glue]  Glue code must be cheap and parameter-free, since it belongs to no
unit and so to no stage: an operation of glue that computes with a Parameter (a head
written as ``h @ self.embed.weight.T``) is refused (reading its ``dtype``, ``device``
or ``shape`` computes nothing and is allowed), and so is glue doing more than
:data:`MAX_GLUE_SHARE` of the forward FLOPs (counted with ``FlopCounterMode``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from pipeplan.models.errors import InputError
from pipeplan.models.spec import Call

MAX_GLUE_SHARE = 0.01
"""Largest share of the forward FLOPs the glue code may do (see [Note: glue])."""


@dataclass
class Recording:
    """What one forward pass of the whole model showed."""

    order: list[int]
    """Indices (into the selected names) of the units in the order they first ran."""
    sources: dict[int, set[Any]]
    """Per selected unit index: the sources of its arguments (unit indices, ``"input:..."``)."""
    calls: dict[int, Call]
    """Per selected unit index: its ``(args, kwargs)``, tensors detached."""
    outputs: dict[int, Any]
    """Per selected unit index: its output, tensors detached."""
    output_sources: set[Any]
    """Sources of the model's output."""
    glue_params: list[str]
    """Qualified names of Parameters read by glue code."""
    flops: dict[str, float]
    """Forward FLOPs: ``"total"`` and per unit name."""
    glue_ops: dict[str, float] = field(default_factory=dict)
    """FLOPs of glue code per operation."""


class _Tagger(TorchFunctionMode):
    """Tags tensors computed by glue code with the sources they derive from."""

    def __init__(self, tags: dict[int, set[Any]], keep: list[Any], param_names: dict[int, str]) -> None:
        super().__init__()
        self.tags = tags
        self.keep = keep
        self.param_names = param_names
        self.in_unit = 0
        self.glue_params: list[str] = []
        self.unit_args: dict[int, set[Any]] = {}
        """The running unit's argument tensors (by id) and their sources."""
        self.used: set[int] = set()
        """Which of them an operation producing a tensor read (``x.dtype`` alone is no dataflow)."""

    def sources(self, tree: Any) -> set[Any]:
        found: set[Any] = set()
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                found |= self.tags.get(id(leaf), set())
        return found

    def tag(self, tree: Any, sources: set[Any]) -> None:
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                self.tags[id(leaf)] = set(sources)
                self.keep.append(leaf)  # alive, so its id is not reused by another tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.in_unit and self.unit_args and any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(out)):
            self.used.update(id(t) for t in pytree.tree_leaves((args, kwargs))
                             if isinstance(t, torch.Tensor) and id(t) in self.unit_args)
        if self.in_unit == 0:
            leaves = pytree.tree_leaves((args, kwargs))
            # Reading a Parameter's dtype, device or shape computes no tensor and is no
            # computation on it (transformers' ViT asks its projection for the dtype).
            computes = any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(out))
            for leaf in leaves if computes else ():
                if isinstance(leaf, nn.Parameter) and id(leaf) in self.param_names:
                    name = self.param_names[id(leaf)]
                    if name not in self.glue_params:
                        self.glue_params.append(name)
            found = self.sources((args, kwargs))
            if found:
                self.tag(out, found)
        return out


class _CalledTwice(Exception):
    pass


class UnitRunsTwice(InputError):
    """A unit ran more than once in one forward pass (:attr:`unit` is its index among the names)."""

    def __init__(self, spec: str, names: list[str], index: int) -> None:
        super().__init__(spec, "--units", f"unit {names[index]!r} runs more than once per forward pass; a unit "
                                          "must run once (choose its parent, or units inside it)")
        self.unit = index


def record(model: nn.Module, names: list[str], call: Call, spec: str = "-") -> Recording:
    """Run ``model`` on ``call`` once and record the dataflow between the units ``names``.

    Raises
    ------
    InputError
        If the forward pass fails (with the batch size and the message) or a unit
        runs more than once.
    """
    modules = dict(model.named_modules())
    units = [modules[n] for n in names]
    param_names = {id(p): n for n, p in model.named_parameters()}
    tags: dict[int, set[Any]] = {}
    keep: list[Any] = []
    tagger = _Tagger(tags, keep, param_names)
    args, kwargs = call
    _tag_inputs(tagger, args, kwargs)
    rec = Recording([], {}, {}, {}, set(), [], {})
    handles = [_hooks(i, m, tagger, rec) for i, m in enumerate(units)]
    batch = _batch_size(call)
    try:
        with FlopCounterMode(display=False) as counter, tagger:
            output = model(*args, **kwargs)
    except _CalledTwice as exc:
        raise UnitRunsTwice(spec, names, int(str(exc))) from None
    except InputError:
        raise
    except Exception as exc:
        raise InputError(spec, "forward", f"the model's forward on a batch of {batch} samples raised "
                                          f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                         ) from exc
    finally:
        for pair in handles:
            for handle in pair:
                handle.remove()
    rec.output_sources = tagger.sources(output)
    rec.glue_params = tagger.glue_params
    _count_flops(counter, model, names, rec)
    return rec


def _tag_inputs(tagger: _Tagger, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for i, arg in enumerate(args):
        tagger.tag(arg, {f"input:{i}"})
    for key, value in kwargs.items():
        tagger.tag(value, {f"input:{key}"})


def _hooks(index: int, module: nn.Module, tagger: _Tagger, rec: Recording) -> tuple[Any, Any]:
    def pre(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if index in rec.calls:
            raise _CalledTwice(str(index))
        rec.order.append(index)
        rec.calls[index] = (_detached(args), _detached(kwargs))
        tagger.unit_args = {id(t): tagger.sources(t) for t in pytree.tree_leaves((args, kwargs))
                            if isinstance(t, torch.Tensor)}
        tagger.used = set()
        tagger.in_unit += 1

    def post(_module: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
        tagger.in_unit -= 1
        # an argument passed straight through (an identity unit) is read too
        tagger.used.update(id(t) for t in pytree.tree_leaves(output) if id(t) in tagger.unit_args)
        rec.sources[index] = set().union(*(s for i, s in tagger.unit_args.items() if i in tagger.used))
        tagger.unit_args = {}
        tagger.tag(output, {index})
        rec.outputs[index] = _detached(output)

    return (module.register_forward_pre_hook(pre, with_kwargs=True),
            module.register_forward_hook(post, with_kwargs=True))


def _detached(tree: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, tree)


def _batch_size(call: Call) -> int | str:
    for leaf in pytree.tree_leaves(call):
        if isinstance(leaf, torch.Tensor) and leaf.dim():
            return int(leaf.shape[0])
    return "?"


def _count_flops(counter: FlopCounterMode, model: nn.Module, names: list[str], rec: Recording) -> None:
    counts = counter.get_flop_counts()
    root = type(model).__name__
    total = counts.get("Global", {})
    rec.flops["total"] = float(sum(total.values()))
    glue = {str(op): float(v) for op, v in total.items()}
    for name in names:
        per_op = counts.get(f"{root}.{name}", {})
        rec.flops[name] = float(sum(per_op.values()))
        for op, v in per_op.items():
            glue[str(op)] = glue.get(str(op), 0.0) - float(v)
    rec.glue_ops = {op: v for op, v in glue.items() if v > 0}
