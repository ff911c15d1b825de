"""Estimate a zoo model's layer graph for a device we do not have, from FLOPs and shapes.

The model is built on the ``meta`` device, so no weights are allocated (a 1.3B model
costs nothing).  Per unit, :class:`torch.utils.flop_counter.FlopCounterMode` counts
the forward FLOPs at two microbatch sizes (their difference is the per-sample part)
and the backward FLOPs (``2 x`` forward when they cannot be counted).  Times are
``overhead + flops / (peak * efficiency)``.  Bytes come from shapes and dtypes;
saved activations from ``saved_tensors_hooks`` on the meta tensors.

The version-2 fields (spec section 7.1) come from the same counts.  Each unit's
backward is run once more split as torch.distributed.pipelining runs an ``I`` and a
``W`` action (:func:`pipeplan.models.profile_split.split_backward`:
``stage_backward_input``, then ``stage_backward_weight``), each half under its own
``FlopCounterMode``:

- ``bwd_w = (s * overhead + F_w,fixed / rate, F_w,sample / rate)`` with
  ``rate = peak * efficiency`` and ``F_w`` the FLOPs of the weight-gradient half
  (split into its per-call and per-sample part like the others), clamped to ``bwd``.
  ``F_w`` counts the matmuls and convolutions that compute weight gradients: for a
  Linear of ``i`` inputs and ``o`` outputs, ``2*i*o`` per row, half of the backward's
  ``4*i*o``.  The backward's per-call ``overhead`` goes to the halves that do work:
  ``s = 1/2``; ``s = 1`` when no input needs a gradient (the embedding: its input
  half is empty); ``s = 0`` when the unit has no trainable parameter (its weight
  half is empty).  When the backward cannot be counted (the ``2 x`` forward rule),
  ``bwd_w = bwd / 2``.
- ``act_w``: bytes per sample of the saved tensors the weight-gradient half reads
  back (the inputs of the weight-bearing ops: a Linear's or convolution's input, a
  LayerNorm's input and statistics), clamped to ``act``; ``act`` when the backward
  cannot be run on the meta device.
- ``step = STEP_BYTES[optimizer] * params / bandwidth``: an optimizer step is bound
  by memory bandwidth, reading and writing each parameter byte and its state a fixed
  number of times (Adam: 7; see :mod:`pipeplan.models.profile_step`); 0 without
  parameters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeplan.models.errors import InputError
from pipeplan.models.fit import LinearFit, clamp_part
from pipeplan.models.graph import LayerGraph
from pipeplan.models.profile_measured import (UnitProfile, leaf_args, out_bytes, param_bytes, per_sample,
                                              saved_bytes, to_graph, unit_args, unit_errors)
from pipeplan.models.profile_split import grad_inputs, split_backward
from pipeplan.models.profile_step import OPTIMIZERS, estimated_step, trainable
from pipeplan.models.profile_tp import with_tensor_parallel, zoo_work
from pipeplan.models.zoo import ZooModel, build_model

#: The two microbatch sizes counted; FLOPs are affine in the batch size.
SIZES = (1, 2)


MIN_RATE = 1.0
"""Slowest achieved FLOP/s accepted (a rate far below any device; it keeps every time finite)."""

MAX_OVERHEAD = 1e6
"""Longest per-call overhead accepted, in seconds (days, far above any device; it keeps every time finite)."""


@dataclass(frozen=True)
class DeviceModel:
    """The device the times are estimated for."""

    flops: float = 312e12
    """Peak FLOP/s (default: A100 dense bf16)."""
    efficiency: float = 0.4
    """Fraction of the peak a layer achieves (model FLOP utilisation)."""
    overhead: float = 2e-5
    """Seconds per call of a unit's forward or backward (kernel launches and the like)."""
    bandwidth: float = 2.0e12
    """Memory bandwidth in bytes/s that bounds the optimizer step (default: A100 80 GB HBM2e)."""

    def __post_init__(self) -> None:
        for label, value in (("--flops", self.flops), ("--efficiency", self.efficiency),
                             ("--bandwidth", self.bandwidth)):
            if not (math.isfinite(value) and value > 0):
                raise InputError("-", label, f"must be a positive number, got {value!r}")
        if self.efficiency > 1:
            raise InputError("-", "--efficiency", f"is a fraction of the peak, at most 1, got {self.efficiency!r}")
        if not 0 <= self.overhead <= MAX_OVERHEAD:
            raise InputError("-", "--overhead", f"must be seconds from 0 to {MAX_OVERHEAD:g} per call (beyond, layer "
                                                f"times would overflow floating point), got {self.overhead!r}")
        if not self.flops * self.efficiency >= MIN_RATE:
            raise InputError("-", "--flops", f"times --efficiency is {self.flops * self.efficiency:g} FLOP/s, below "
                                             f"{MIN_RATE:g}: layer times would overflow floating point")

    def seconds(self, flops: float) -> float:
        """Seconds for ``flops`` floating-point operations at the achieved rate."""
        return flops / (self.flops * self.efficiency)


@dataclass(frozen=True)
class UnitFlops:
    """FLOPs of one unit at one microbatch size."""

    fwd: float
    """Forward FLOPs."""
    bwd: float
    """Backward FLOPs (input and weight gradients)."""
    measured_bwd: bool
    """Whether ``bwd`` was counted (else it is ``2 * fwd``)."""
    weight: float = 0.0
    """FLOPs of the weight-gradient half of the backward (``fwd``, half of ``bwd``, when it could not be counted)."""


def count_unit(module: torch.nn.Module, args: Sequence[torch.Tensor]) -> tuple[UnitFlops, int, int, int]:
    """FLOPs, saved bytes, ``act_w`` bytes and output bytes of one unit call on (meta) ``args``.

    Returns
    -------
    (UnitFlops, saved bytes, bytes the weight gradient reads, output bytes)
    """
    with FlopCounterMode(display=False) as counter:
        output, nbytes = saved_bytes(module, leaf_args(args))
    fwd = float(counter.get_total_flops())
    if not output.requires_grad:  # computed from buffers alone: no backward
        return UnitFlops(fwd, 0.0, True), nbytes, 0, out_bytes(output)
    try:
        with FlopCounterMode(display=False) as counter:
            output.backward(torch.empty_like(output))
        bwd = float(counter.get_total_flops())
    except RuntimeError:  # an op without a meta backward: the usual 2x rule, half of it for weights
        return UnitFlops(fwd, 2.0 * fwd, False, fwd), nbytes, nbytes, out_bytes(output)
    split = split_backward(module, leaf_args(args), lambda: FlopCounterMode(display=False))
    weight = split.weight_flops if split.split else bwd / 2  # a whole backward's FLOPs are not split
    return UnitFlops(fwd, bwd, True, min(weight, bwd)), nbytes, split.act_w, out_bytes(output)


def _affine(sizes: Sequence[int], values: Sequence[float], device: DeviceModel, overhead: float = 1.0) -> LinearFit:
    # A quantity measured at two sizes, split into a per-call and a per-sample part;
    # ``overhead`` is the share of the device's per-call overhead it carries.
    slope = per_sample(sizes, values)
    fixed = max(values[0] - slope * sizes[0], 0.0)
    return LinearFit(overhead * device.overhead + device.seconds(fixed), device.seconds(slope), 0.0, 0.0)


def weight_overhead_share(module: torch.nn.Module, args: Sequence[torch.Tensor]) -> float:
    """The share of the backward's per-call overhead charged to its weight-gradient half (module docstring)."""
    if not trainable(module):
        return 0.0
    return 0.5 if grad_inputs(leaf_args(args)) else 1.0


def analyse_model(model: ZooModel, device: DeviceModel, optimizer: str = "adam"
                  ) -> tuple[list[UnitProfile], list[dict[str, Any]]]:
    """Per-unit profiles of a ``meta`` model, plus the FLOP counts behind them."""
    def work(n: int) -> list[tuple[torch.nn.Module, list[torch.Tensor]]]:
        inputs, _ = model.example_batch(n, 0)
        return [(unit.module, args) for unit, args in zip(model.units, unit_args(model, inputs))]

    return analyse_units([u.module for u in model.units], work, SIZES, device, optimizer)


def analyse_units(modules: Sequence[torch.nn.Module],
                  work: Callable[[int], list[tuple[torch.nn.Module, Sequence[torch.Tensor]]]],
                  sizes: Sequence[int], device: DeviceModel, optimizer: str = "adam", *,
                  names: Sequence[str] | None = None, user_spec: str | None = None
                  ) -> tuple[list[UnitProfile], list[dict[str, Any]]]:
    """Per-unit profiles from FLOP counts: ``work(n)`` gives each unit's ``(module, args)`` at ``n`` samples.

    With ``user_spec`` (a user's model), an exception of its code becomes an
    :class:`InputError` naming the unit (``names``; see :func:`pipeplan.models.profile_measured.unit_errors`).
    """
    if optimizer not in OPTIMIZERS:
        raise InputError("-", "optimizer", f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    counts: list[list[tuple[UnitFlops, int, int, int]]] = [[] for _ in modules]
    shares = [0.0] * len(modules)
    labels = list(names) if names is not None else [str(i) for i in range(len(modules))]
    for n in sizes:
        with unit_errors(user_spec, "the units' arguments", n):
            units_work = work(n)
        for i, (module, args) in enumerate(units_work):
            with unit_errors(user_spec, f"unit {labels[i]}", n):
                counts[i].append(count_unit(module, args))
                shares[i] = weight_overhead_share(module, args)
    profiles, flops = [], []
    for module, per_n, share in zip(modules, counts, shares):
        fwd = [c[0].fwd for c in per_n]
        bwd = [c[0].bwd for c in per_n]
        weight = [c[0].weight for c in per_n]
        bwd_fit = _affine(sizes, bwd, device)
        act = per_sample(sizes, [c[1] for c in per_n])
        params = param_bytes(module)
        profiles.append(UnitProfile(_affine(sizes, fwd, device), bwd_fit, params, act, per_n[-1][3] / sizes[-1],
                                    bwd_w=clamp_part(_affine(sizes, weight, device, share), bwd_fit),
                                    act_w=min(per_sample(sizes, [c[2] for c in per_n]), act),
                                    step=estimated_step(params, optimizer, device.bandwidth) if trainable(module)
                                    else 0.0))
        flops.append({"fwd_per_sample": per_sample(sizes, fwd), "bwd_per_sample": per_sample(sizes, bwd),
                      "bwd_w_per_sample": per_sample(sizes, weight),
                      "bwd_measured": all(c[0].measured_bwd for c in per_n)})
    return profiles, flops


def profile_analytic(name: str, *, device: DeviceModel | None = None, seq_len: int | None = None,
                     dtype: torch.dtype = torch.float32, optimizer: str = "adam",
                     tensor_parallel: bool = True) -> LayerGraph:
    """Estimate the layer graph of zoo model ``name`` on a device of given speed.

    Parameters
    ----------
    name : str
        A zoo model name.
    device : DeviceModel, optional
        Peak FLOP/s, efficiency, per-call overhead and memory bandwidth (default: A100
        bf16 at 40 %, 2 TB/s).
    seq_len : int, optional
        Tokens per sample for sequence models.
    dtype : torch.dtype
        Dtype of parameters and activations (sets every byte count).
    optimizer : str
        The optimizer whose step ``step`` estimates (``adam`` or ``sgd``).
    tensor_parallel : bool
        Give the layers with a known tensor-parallel plan (transformer blocks, token
        embeddings, language-model heads) their ``tp_share`` and ``tp_comm``
        (:mod:`pipeplan.models.profile_tp`).

    Returns
    -------
    LayerGraph
        A ``pipeplan.graph/2`` graph, ``/3`` when a layer has a tensor-parallel plan;
        each layer carries its FLOPs per sample in an extra ``flops`` field.

    Raises
    ------
    InputError
        For an unknown model, a bad ``seq_len``, a bad device or an unknown optimizer.

    Examples
    --------
    >>> g = profile_analytic("gpt-tiny")
    >>> g.layers[1].fwd[1] > 0 and g.layers[1].fwd[0] == 2e-5
    True
    """
    device = device or DeviceModel()
    model = build_model(name, seq_len=seq_len, dtype=dtype, device="meta")
    profiles, flops = analyse_model(model, device, optimizer)
    source = {"method": "analytic", "model": name, "config": model.config, "device": asdict(device),
              "optimizer": optimizer, "torch": torch.__version__}
    graph = to_graph(model, profiles, source)
    for layer, counted in zip(graph.layers, flops):
        layer.extra.pop("fit", None)  # nothing was fitted
        layer.extra["flops"] = counted
    return with_tensor_parallel(graph, [(u.name, u.module) for u in model.units], zoo_work(model)) \
        if tensor_parallel else graph
