"""Costs of an imported model's units, with the zoo's profilers, and its layer graph.

Each unit is timed on the arguments it received in a real forward pass of the whole
model (captured by :func:`pipeplan.models.imported.ImportedModel.unit_calls`), with
the measured profiler's rounds, medians and fit
(:func:`pipeplan.models.profile_measured.measure_units`), or counted with
``FlopCounterMode`` (``analytic``); both write the version-2 fields ``bwd_w``,
``act_w`` and ``step`` as for zoo models (a ``pipeplan.graph/2`` graph).  Output bytes are split into the part that
grows with the batch (``out``, per sample) and the part that does not (the layer's
``out_fixed``, bytes per microbatch: a rotary table); see docs/formats-user-models.md.
Imported models are not cached: their code may change between runs.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn

from pipeplan.models.cache import machine
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.imported import RECORD_SIZES, ImportedModel
from pipeplan.models.profile_measured import (PROFILE_VERSION, MeasureConfig, UnitProfile, UnitWork, fit_residuals,
                                              measure_units, version2_fields)
from pipeplan.models.spec import Call, first_float


class CallUnit(nn.Module):
    """A unit called with one captured call's arguments, its tensors as positional inputs.

    The output is one tensor, as the profilers time it: the unit's only
    floating-point output, or the sum of the sums of several (so one backward
    reaches them all).
    """

    def __init__(self, unit: nn.Module, call: Call) -> None:
        super().__init__()
        self.unit = unit
        leaves, self.spec = pytree.tree_flatten(call)
        self.constants = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def tensors(self, call: Call) -> list[torch.Tensor]:
        """The tensor arguments of ``call``, in this wrapper's positional order."""
        leaves = pytree.tree_leaves(call)
        return [leaves[i] for i in self.slots]

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return combined(self.call_unit(*tensors))

    def call_unit(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.constants)
        for slot, tensor in zip(self.slots, tensors):
            leaves[slot] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.unit(*args, **kwargs)


class _UnitThenLoss(nn.Module):
    """The last unit followed by the training loss, as the last stage runs it."""

    def __init__(self, wrapped: CallUnit, model: ImportedModel, n: int) -> None:
        super().__init__()
        self.wrapped = wrapped
        self.model = model
        self.n = n

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model.user.loss(self.wrapped.call_unit(*tensors), self.n)


def combined(output: Any) -> torch.Tensor:
    """One tensor standing for a unit's output (see :class:`CallUnit`)."""
    floats = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    grads = [t for t in floats if t.requires_grad]
    if len(grads) == 1:
        return grads[0]
    if grads:
        return torch.stack([t.sum() for t in grads]).sum()
    return floats[0] if floats else torch.zeros(())


def unit_work(model: ImportedModel, n: int, seed: int) -> list[UnitWork]:
    """Each unit's :data:`~pipeplan.models.profile_measured.UnitWork` at batch size ``n``."""
    calls, outputs, model_output = model.unit_calls(n, seed)
    last = len(model.units) - 1
    work = []
    for i, (unit, call) in enumerate(zip(model.units, calls)):
        wrapped = CallUnit(unit.module, call)
        timed: nn.Module = wrapped
        if i == last and _is_model_output(outputs[i], model_output):
            timed = _UnitThenLoss(wrapped, model, n)
        work.append((wrapped, wrapped.tensors(call), timed))
    return work


def _is_model_output(unit_output: Any, model_output: Any) -> bool:
    # The loss reads the model's output: the last unit is timed with it only when that
    # output is the unit's own (no glue code in between).
    a, b = first_float(unit_output), first_float(model_output)
    if a is None or b is None or a.shape != b.shape:
        return False
    return a.device.type == "meta" or bool(torch.equal(a, b))  # meta tensors hold no values to compare


def output_sizes(model: ImportedModel, sizes: Sequence[int] = RECORD_SIZES, seed: int = 0
                 ) -> tuple[list[float], list[float], float]:
    """Per unit: output bytes per sample and bytes that do not grow with the batch; model-input bytes per sample."""
    measured = []
    for n in sizes:
        call = model.user.example(n, seed)
        _, outputs, _ = model.unit_calls(n, seed)
        measured.append(([_bytes(o) for o in outputs], _bytes(call)))
    (small, small_in), (large, large_in) = measured
    gap = sizes[1] - sizes[0]
    per_sample = [max(b - a, 0) / gap for a, b in zip(small, large)]
    fixed = [max(a - p * sizes[0], 0.0) for a, p in zip(small, per_sample)]
    return per_sample, fixed, max(large_in - small_in, 0) / gap


def _bytes(tree: Any) -> float:
    return float(sum(t.numel() * t.element_size() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)))


def imported_graph(model: ImportedModel, profiles: Sequence[UnitProfile], source: dict[str, Any]) -> LayerGraph:
    """The layer graph of ``model`` from per-unit profiles (``out`` replaced by the recorded sizes)."""
    per_sample, fixed, input_bytes = output_sizes(model)
    layers = []
    for i, (unit, prof) in enumerate(zip(model.units, profiles)):
        extra: dict[str, Any] = {}
        if prof.samples:
            extra["fit"] = fit_residuals(prof)
        if unit.tied_to is not None:
            extra["tied_bytes"] = float(unit.tied_bytes)
        if fixed[i] > 0:
            extra["out_fixed"] = fixed[i]
        layers.append(Layer(unit.name, prof.fwd.as_pair(), prof.bwd.as_pair(), float(prof.params),
                            float(prof.act), per_sample[i], unit.tied_to, *version2_fields(prof), extra=extra))
    readers: dict[str, list[int]] = {}
    for i, unit in enumerate(model.units):
        for name in unit.reads_input:
            readers.setdefault(name, []).append(i)
    extra_top: dict[str, Any] = {"profile": source}
    if any(r != [0] for r in readers.values()):
        extra_top["input_readers"] = readers
    return LayerGraph(f"{model.name}-{len(model.units)}", layers, model.edges(), input_bytes, extra=extra_top)


def _source(model: ImportedModel, method: str) -> dict[str, Any]:
    source = {"method": method, "model": model.user.spec, "units": [u.name for u in model.units],
              "flops": model.flops, "torch": torch.__version__}
    if model.user.built:
        source["class"] = model.user.built.split(" ")[0]
    if model.request is not None:  # how to build it again: `pipeplan export` writes it for train.py
        source["request"] = model.request.to_dict()
    return source


def profile_imported(model: ImportedModel, config: MeasureConfig | None = None, *,
                     progress: bool = False, tensor_parallel: bool = True) -> LayerGraph:
    """Measure an imported model's units on this machine; its layer graph.

    Parameters
    ----------
    model : ImportedModel
        From :func:`pipeplan.models.imported.trace_model`.
    config : MeasureConfig, optional
        Batch sizes, warm-up, repeats, rounds, threads, seed (the zoo's defaults).
    progress : bool
        Show a progress bar on stderr.
    tensor_parallel : bool
        Give the units with a known tensor-parallel plan (Hugging Face GPT-2, Llama and
        BERT blocks, token embeddings and heads) ``tp_share`` and ``tp_comm``
        (:mod:`pipeplan.models.profile_tp`).

    Returns
    -------
    LayerGraph
    """
    config = config or MeasureConfig()
    profiles = measure_units([u.name for u in model.units], [u.module for u in model.units],
                             lambda n: unit_work(model, n, config.seed), config, progress=progress,
                             user_spec=model.user.spec)
    source = _source(model, "measured")
    source.update(version=PROFILE_VERSION, measure={**asdict(config), "batch_sizes": list(config.batch_sizes)},
                  machine=machine())
    graph = imported_graph(model, profiles, source)
    return _with_tensor_parallel(model, graph, config.seed) if tensor_parallel else graph


def _with_tensor_parallel(model: ImportedModel, graph: LayerGraph, seed: int) -> LayerGraph:
    """``graph`` with the version-3 fields of the units that have a tensor-parallel plan."""
    from pipeplan.models.profile_tp import with_tensor_parallel

    return with_tensor_parallel(graph, [(u.name, u.module) for u in model.units],
                                lambda n: [(w[0], w[1]) for w in unit_work(model, n, seed)])


def analyse_imported(model: ImportedModel, device: Any = None, optimizer: str = "adam", *,
                     tensor_parallel: bool = True) -> LayerGraph:
    """Estimate an imported model's layer graph from FLOPs (see :mod:`pipeplan.models.profile_analytic`).

    The units are counted on the arguments of a real forward pass at 1 and 2 samples,
    on the device the model is on (``meta``: no weights allocated); with
    ``tensor_parallel``, the units with a known tensor-parallel plan get ``tp_share``
    and ``tp_comm`` (:mod:`pipeplan.models.profile_tp`).
    """
    from pipeplan.models.profile_analytic import SIZES, DeviceModel, analyse_units

    device = device or DeviceModel()
    profiles, flops = analyse_units([u.module for u in model.units],
                                    lambda n: [(w[0], w[1]) for w in unit_work(model, n, 0)], SIZES, device,
                                    optimizer, names=[u.name for u in model.units], user_spec=model.user.spec)
    source = _source(model, "analytic")
    source.update(device=asdict(device), optimizer=optimizer)
    source["counted_on"] = model.device
    graph = imported_graph(model, profiles, source)
    for layer, counted in zip(graph.layers, flops):
        layer.extra["flops"] = counted
    return _with_tensor_parallel(model, graph, 0) if tensor_parallel else graph
