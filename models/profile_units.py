"""Helpers the profilers share: a unit's leaf arguments and its per-sample quantities.

Kept apart from :mod:`pipeplan.models.profile_measured` so that the counting of
:mod:`pipeplan.models.profile_tp`, which the measured profiler calls, does not import it back.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from pipeplan.models.zoo import ZooModel


def leaf_args(args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of a unit's inputs; floating ones require grad as in a pipeline stage."""
    leaves = []
    for tensor in args:
        leaf = tensor.detach()
        if leaf.is_floating_point():
            leaf.requires_grad_(True)
        leaves.append(leaf)
    return leaves


def unit_args(model: ZooModel, inputs: torch.Tensor) -> list[list[torch.Tensor]]:
    """Each unit's argument tensors for one batch (one gradient-free forward pass)."""
    with torch.no_grad():
        outputs = model.forward(inputs)
    return [[outputs[j] for j in unit.inputs] for unit in model.units]


def per_sample(sizes: Sequence[int], values: Sequence[float]) -> float:
    """Per-sample part of a quantity measured at several sizes: the slope between the
    smallest and largest size (so per-call constants like a mask drop out), or
    ``value / n`` when only one size was measured."""
    lo, hi = min(range(len(sizes)), key=sizes.__getitem__), max(range(len(sizes)), key=sizes.__getitem__)
    if sizes[lo] == sizes[hi]:
        return max(values[hi] / sizes[hi], 0.0)
    return max((values[hi] - values[lo]) / (sizes[hi] - sizes[lo]), 0.0)


def param_bytes(module: nn.Module) -> int:
    """Bytes of the module's (unique) parameters."""
    return sum(p.numel() * p.element_size() for p in module.parameters())
