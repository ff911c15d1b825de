"""Estimate a zoo model's layer graph for a device we do not have, from FLOPs and shapes.

The model is built on the ``meta`` device, so no weights are allocated (a 1.3B model
costs nothing).  Per unit, :class:`torch.utils.flop_counter.FlopCounterMode` counts
the forward FLOPs at two microbatch sizes (their difference is the per-sample part)
and the backward FLOPs (``2 x`` forward when they cannot be counted).  Times are
``overhead + flops / (peak * efficiency)``.  Bytes come from shapes and dtypes;
saved activations from ``saved_tensors_hooks`` on the meta tensors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeplan.models.errors import InputError
from pipeplan.models.fit import LinearFit
from pipeplan.models.graph import LayerGraph
from pipeplan.models.profile_measured import (UnitProfile, leaf_args, out_bytes, param_bytes, per_sample,
                                     saved_bytes, to_graph, unit_args)
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

    def __post_init__(self) -> None:
        for label, value in (("--flops", self.flops), ("--efficiency", self.efficiency)):
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


def count_unit(module: torch.nn.Module, args: Sequence[torch.Tensor]) -> tuple[UnitFlops, int, int]:
    """FLOPs, saved bytes and output bytes of one unit call on (meta) ``args``.

    Returns
    -------
    (UnitFlops, saved bytes, output bytes)
    """
    with FlopCounterMode(display=False) as counter:
        output, nbytes = saved_bytes(module, leaf_args(args))
    fwd = float(counter.get_total_flops())
    if not output.requires_grad:  # computed from buffers alone: no backward
        return UnitFlops(fwd, 0.0, True), nbytes, out_bytes(output)
    try:
        with FlopCounterMode(display=False) as counter:
            output.backward(torch.empty_like(output))
        bwd, measured = float(counter.get_total_flops()), True
    except RuntimeError:  # an op without a meta backward: the usual 2x rule
        bwd, measured = 2.0 * fwd, False
    return UnitFlops(fwd, bwd, measured), nbytes, out_bytes(output)


def _affine(sizes: Sequence[int], values: Sequence[float], device: DeviceModel) -> LinearFit:
    # A quantity measured at two sizes, split into a per-call and a per-sample part.
    slope = per_sample(sizes, values)
    fixed = max(values[0] - slope * sizes[0], 0.0)
    return LinearFit(device.overhead + device.seconds(fixed), device.seconds(slope), 0.0, 0.0)


def analyse_model(model: ZooModel, device: DeviceModel) -> tuple[list[UnitProfile], list[dict[str, Any]]]:
    """Per-unit profiles of a ``meta`` model, plus the FLOP counts behind them."""
    def work(n: int) -> list[tuple[torch.nn.Module, list[torch.Tensor]]]:
        inputs, _ = model.example_batch(n, 0)
        return [(unit.module, args) for unit, args in zip(model.units, unit_args(model, inputs))]

    return analyse_units([u.module for u in model.units], work, SIZES, device)


def analyse_units(modules: Sequence[torch.nn.Module],
                  work: Callable[[int], list[tuple[torch.nn.Module, Sequence[torch.Tensor]]]],
                  sizes: Sequence[int], device: DeviceModel) -> tuple[list[UnitProfile], list[dict[str, Any]]]:
    """Per-unit profiles from FLOP counts: ``work(n)`` gives each unit's ``(module, args)`` at ``n`` samples."""
    counts: list[list[tuple[UnitFlops, int, int]]] = [[] for _ in modules]
    for n in sizes:
        for i, (module, args) in enumerate(work(n)):
            counts[i].append(count_unit(module, args))
    profiles, flops = [], []
    for module, per_n in zip(modules, counts):
        fwd = [c[0].fwd for c in per_n]
        bwd = [c[0].bwd for c in per_n]
        profiles.append(UnitProfile(_affine(sizes, fwd, device), _affine(sizes, bwd, device),
                                    param_bytes(module), per_sample(sizes, [c[1] for c in per_n]),
                                    per_n[-1][2] / sizes[-1]))
        flops.append({"fwd_per_sample": per_sample(sizes, fwd), "bwd_per_sample": per_sample(sizes, bwd),
                      "bwd_measured": all(c[0].measured_bwd for c in per_n)})
    return profiles, flops


def profile_analytic(name: str, *, device: DeviceModel | None = None, seq_len: int | None = None,
                     dtype: torch.dtype = torch.float32) -> LayerGraph:
    """Estimate the layer graph of zoo model ``name`` on a device of given speed.

    Parameters
    ----------
    name : str
        A zoo model name.
    device : DeviceModel, optional
        Peak FLOP/s, efficiency and per-call overhead (default: A100 bf16 at 40 %).
    seq_len : int, optional
        Tokens per sample for sequence models.
    dtype : torch.dtype
        Dtype of parameters and activations (sets every byte count).

    Returns
    -------
    LayerGraph
        Each layer carries its FLOPs per sample in an extra ``flops`` field.

    Raises
    ------
    InputError
        For an unknown model, a bad ``seq_len`` or a bad device.

    Examples
    --------
    >>> g = profile_analytic("gpt-tiny")
    >>> g.layers[1].fwd[1] > 0 and g.layers[1].fwd[0] == 2e-5
    True
    """
    device = device or DeviceModel()
    model = build_model(name, seq_len=seq_len, dtype=dtype, device="meta")
    profiles, flops = analyse_model(model, device)
    source = {"method": "analytic", "model": name, "config": model.config, "device": asdict(device),
              "torch": torch.__version__}
    graph = to_graph(model, profiles, source)
    for layer, counted in zip(graph.layers, flops):
        layer.extra.pop("fit", None)  # nothing was fitted
        layer.extra["flops"] = counted
    return graph
