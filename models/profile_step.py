"""The optimizer step of one unit's parameters, timed (measured profiles) or estimated from bytes (analytic).

The step does not depend on the batch: it reads and writes each parameter and its
optimizer state once.  :data:`STEP_BYTES` says how many bytes per parameter byte a
step moves, which bounds it by memory bandwidth on any device:

- Adam (``torch.optim.Adam``, states in the parameters' dtype): reads the parameter,
  its gradient and the two moments, writes the parameter and the two moments: 7.
- SGD (``torch.optim.SGD`` without momentum, what ``pipeplan run`` trains with): reads
  the parameter and its gradient, writes the parameter: 3.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch import nn

OPTIMIZERS = ("adam", "sgd")
"""Optimizers a profile can time the step of."""

STEP_BYTES = {"adam": 7, "sgd": 3}
"""Bytes read and written per parameter byte by one step of each optimizer."""


def make_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """A ``torch.optim`` optimizer over ``params``: ``adam`` (defaults) or ``sgd`` (learning rate 0.05).

    Raises
    ------
    ValueError
        For a name not in :data:`OPTIMIZERS`.
    """
    if name == "adam":
        return torch.optim.Adam(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05)
    raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The distinct parameters of ``module`` that require grad (a tied weight once)."""
    return [p for p in module.parameters() if p.requires_grad]


def time_step(module: nn.Module, optimizer: str, warmup: int, repeats: int,
              sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds of ``repeats`` optimizer steps over ``module``'s parameters, one per step.

    Every parameter gets a gradient of ones; one untimed step more than ``warmup`` runs
    first, since Adam allocates its moments in its first step.  The parameters are
    restored afterwards and their gradients dropped, so the module is as before.

    Parameters
    ----------
    module : nn.Module
        The unit.
    optimizer : str
        One of :data:`OPTIMIZERS`.
    warmup, repeats : int
        Untimed steps (besides the first) and timed steps.
    sync : callable, optional
        Called before each clock reading (``torch.cuda.synchronize`` on a GPU).

    Returns
    -------
    list of float
        Empty when the module has no trainable parameter.

    Examples
    --------
    >>> len(time_step(nn.Linear(4, 2), "adam", 0, 3)), time_step(nn.GELU(), "adam", 0, 3)
    (3, [])
    """
    params = trainable(module)
    if not params:
        return []
    sync = sync or (lambda: None)
    with torch.no_grad():
        before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    step = make_optimizer(optimizer, params).step
    samples = []
    for i in range(1 + warmup + repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        if i > warmup:
            samples.append(time.perf_counter() - start)
    with torch.no_grad():
        for p, saved in zip(params, before):
            p.copy_(saved)
            p.grad = None
    return samples


def median_step(module: nn.Module, optimizer: str, warmup: int, repeats: int,
                sync: Callable[[], None] | None = None) -> float:
    """Median of :func:`time_step`'s samples; 0 for a module without trainable parameters."""
    samples = time_step(module, optimizer, warmup, repeats, sync)
    return statistics.median(samples) if samples else 0.0


def estimated_step(param_bytes: float, optimizer: str, bandwidth: float) -> float:
    """Seconds of a memory-bound step: ``STEP_BYTES[optimizer] * param_bytes / bandwidth``.

    Examples
    --------
    >>> estimated_step(4e9, "adam", 2e12)
    0.014
    """
    return STEP_BYTES[optimizer] * param_bytes / bandwidth
