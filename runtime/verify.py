"""``--verify``: the same training on one process, and the distance to it.

The reference builds the whole model with the same seed, draws the same batch at
every step, takes the mean loss over the whole batch and the same SGD step.  Every
copy of every parameter on every rank (replicas and tied copies included) must
match it.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

from models.zoo import build_model

TOLERANCE = 1e-6
"""Largest accepted relative difference (float64 runs agree to ~1e-15)."""


def batch_seed(seed: int, step: int) -> int:
    """Seed of the batch drawn at ``step`` (the same on every rank and in the reference)."""
    return seed * 100_003 + step


def reference_parameters(model_name: str, *, steps: int, global_batch: int, lr: float, seed: int,
                         dtype: torch.dtype, seq_len: int | None,
                         beat: Callable[[int], None] = lambda step: None) -> dict[str, torch.Tensor]:
    """``"unit.param" -> tensor`` after ``steps`` SGD steps on one process."""
    model = build_model(model_name, dtype=dtype, seq_len=seq_len, seed=seed)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=lr)
    for step in range(steps):
        beat(step)
        inputs, targets = model.example_batch(global_batch, batch_seed(seed, step))
        model.loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {f"{unit.name}.{name}": p.detach().clone() for unit in model.units
            for name, p in unit.module.named_parameters(remove_duplicate=False)}


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|`` (absolute when ``want`` is all zeros); ``inf`` if either holds NaN or inf.

    A NaN must not compare as "no larger" than anything: it would pass the check.
    """
    scale = want.abs().max().item()
    diff = (got.to(want.dtype) - want).abs().max().item()
    if not (math.isfinite(scale) and math.isfinite(diff)):
        return math.inf
    return diff / scale if scale > 0 else diff


def max_difference(copies: Iterable[tuple[int, dict[str, torch.Tensor]]],
                   reference: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest :func:`relative_difference` over every rank's copies, and where it is.

    ``copies`` holds ``(rank, {"unit.param": tensor})`` for every rank.  A parameter
    missing on every rank is an error of the runtime, not a difference.  A copy (or
    reference) holding NaN or inf counts as ``inf``.
    """
    worst, where, seen = 0.0, "-", set()
    for rank, params in copies:
        for name, tensor in params.items():
            seen.add(name)
            d = relative_difference(tensor, reference[name])
            if d > worst or where == "-":
                worst, where = d, f"{name} on rank {rank}"
    missing = sorted(set(reference) - seen)
    if missing:
        raise RuntimeError(f"parameters held by no rank: {', '.join(missing[:5])}")
    return worst, where
