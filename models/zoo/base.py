"""The unit contract shared by every zoo model.

A zoo model is an ordered list of named *units*.  A pipeline stage is a contiguous
slice of them, so the runtime can build a stage from ``units[lo:hi]`` alone.  Unit
``i`` runs as ``unit.module(*[outputs[j] for j in unit.inputs])`` where
``outputs[-1]`` is the model input, and returns exactly one tensor.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

from pipeplan.models.errors import InputError

#: Builds ``(inputs, targets)`` for ``n`` samples from a seed, on a device.
BatchFn = Callable[[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]]
#: Per-sample losses, shape ``(n,)``, from ``(output, targets)``.
SampleLossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Unit:
    """One partition unit: the smallest piece a pipeline stage can hold."""

    name: str
    """Unique name, also the layer's name in the graph (``block.3``)."""
    module: nn.Module
    """The torch module; called with the outputs named by ``inputs``."""
    inputs: tuple[int, ...] = (-1,)
    """Indices of earlier units whose outputs it consumes, in argument order; ``-1`` is the model input."""
    tied_to: int | None = None
    """Index of the unit whose Parameter this one shares (a GPT head), or ``None``."""


@dataclass
class ZooModel:
    """A model of the zoo: units in topological order plus its data and loss.

    The loss is a mean over samples computed as ``sum(per_sample) / n``.  So when a
    batch of ``n`` samples is split into parts of ``n_k`` samples, the loss of the
    whole batch equals ``sum_k (n_k / n) * loss(part_k)``: scale each part's loss by
    its share ``n_k / n`` before ``backward`` and the accumulated gradient equals the
    gradient of the whole batch.
    """

    name: str
    """Zoo name (``gpt1``)."""
    units: list[Unit]
    """The partition units in topological order."""
    batch_fn: BatchFn
    """Makes ``(inputs, targets)``; use :meth:`example_batch`."""
    sample_loss_fn: SampleLossFn
    """Per-sample loss, shape ``(n,)``; use :meth:`loss`."""
    input_bytes_per_sample: int
    """Bytes per sample of the model input (what stage 0 receives)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the parameters live (``meta`` for shape-only models)."""
    config: dict[str, object] = field(default_factory=dict)
    """The hyper-parameters it was built with (sizes, ``seq_len``, ``dtype``)."""

    def __post_init__(self) -> None:
        _check_units(self.name, self.units)

    def example_batch(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of ``n`` samples, identical for the same ``seed``.

        On a ``meta`` model the tensors are meta tensors of the right shape and dtype.
        """
        if n < 1:
            raise InputError("-", "batch", f"a batch needs at least 1 sample, got {n}")
        return self.batch_fn(n, seed, self.device)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss over the samples, as ``sum(per-sample loss) / n``."""
        per_sample = self.sample_loss_fn(output, targets)
        return per_sample.sum() / per_sample.shape[0]

    def forward(self, inputs: torch.Tensor, lo: int = 0, hi: int | None = None,
                outputs: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
        """Run units ``lo <= i < hi``; returns every output by unit index (``-1``: input).

        ``outputs`` supplies the outputs of earlier units a slice needs.
        """
        hi = len(self.units) if hi is None else hi
        done: dict[int, torch.Tensor] = dict(outputs or {})
        done[-1] = inputs
        for i in range(lo, hi):
            unit = self.units[i]
            done[i] = unit.module(*[done[j] for j in unit.inputs])
        return done

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model output: the last unit's output."""
        return self.forward(inputs)[len(self.units) - 1]

    def module(self) -> nn.ModuleList:
        """All unit modules as one ``ModuleList`` (shared Parameters appear once)."""
        return nn.ModuleList(unit.module for unit in self.units)

    def parameters(self) -> Iterator[nn.Parameter]:
        """Unique Parameters over all units (a tied weight once)."""
        return self.module().parameters()

    def num_parameters(self) -> int:
        """Number of unique parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def edges(self) -> list[tuple[int, int]]:
        """Graph edges ``(u, v)``: unit ``v`` consumes unit ``u``'s output."""
        return sorted({(u, v) for v, unit in enumerate(self.units) for u in unit.inputs if u >= 0})


def _check_units(name: str, units: list[Unit]) -> None:
    # The runtime relies on these invariants; a model breaking them is a bug here.
    if not units:
        raise ValueError(f"model {name!r} has no units")
    consumed = {u for unit in units for u in unit.inputs}
    for i, unit in enumerate(units):
        if not unit.inputs or any(not -1 <= u < i for u in unit.inputs):
            raise ValueError(f"{name}: unit {i} ({unit.name}) has inputs {unit.inputs}; each must be -1 or < {i}")
        if i < len(units) - 1 and i not in consumed:
            raise ValueError(f"{name}: the output of unit {i} ({unit.name}) is never consumed")
        if unit.tied_to is not None and not 0 <= unit.tied_to < len(units):
            raise ValueError(f"{name}: unit {i} is tied to unit {unit.tied_to}, which does not exist")
    if len({u.name for u in units}) != len(units):
        raise ValueError(f"{name}: unit names repeat")


@contextmanager
def seeded_build(seed: int, device: torch.device | str) -> Iterator[None]:
    """Create modules directly on ``device`` with a fixed CPU RNG seed.

    The global RNG state is restored afterwards, so building a model does not change
    the random numbers of its caller.
    """
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        yield


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (batches are drawn on the CPU then moved)."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def token_batch(n: int, seed: int, device: torch.device, *, seq_len: int, vocab: int,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``(n, seq_len)`` and next-token targets of the same shape."""
    if device.type == "meta":
        ids = torch.empty(n, seq_len + 1, dtype=torch.long, device=device)
    else:
        ids = torch.randint(0, vocab, (n, seq_len + 1), generator=generator(seed)).to(device)
    return ids[:, :-1].clone(), ids[:, 1:].clone()


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 for a stable loss; float32 and float64 ones as they are.

    float64 stays float64: ``--verify`` compares pipelines with one process in float64,
    and a float32 loss left differences of up to 1.2e-7 between microbatch splits.
    """
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy averaged over positions: shape ``(n,)``."""
    n = logits.shape[0]
    flat = nn.functional.cross_entropy(_at_least_float32(logits.reshape(-1, logits.shape[-1])),
                                       targets.reshape(-1), reduction="none")
    return flat.reshape(n, -1).mean(dim=1)


def class_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy for classification (``targets`` of shape ``(n,)``),
    or per-pixel segmentation averaged per sample (``targets`` of shape ``(n, H, W)``)."""
    losses = nn.functional.cross_entropy(_at_least_float32(logits), targets, reduction="none")
    return losses.reshape(losses.shape[0], -1).mean(dim=1)
