"""Peak memory of a rank: CUDA's allocator peak, or tracked tensor bytes on CPU.

The CPU allocator keeps no statistics, and a process's RSS is dominated by the
Python and torch runtime, so on CPU the meter counts what the spec's memory model
counts: parameters and their gradients, plus, over time, the tensors autograd
saves for the backward pass (through ``saved_tensors_hooks``; parameters excluded,
each storage once) and the stashed stage inputs, each released when its
microbatch's backward ends.  It says which of the two it reports.

Counting saved tensors costs a Python call per tensor (it nearly doubles a small
forward pass), so the runtime counts only during the warm-up steps: every step
runs the same ops on the same shapes, so the peak is the same, and the measured
steps stay undisturbed.
"""

from __future__ import annotations

import resource
from contextlib import contextmanager
from typing import Hashable, Iterator

import torch


class MemoryMeter:
    """Live and peak bytes of one rank.

    Parameters
    ----------
    parameters : list of torch.nn.Parameter
        The rank's parameters (counted twice: values and gradients).
    device : torch.device
        On ``cuda`` the allocator's peak is reported instead of the tracked bytes.
    state_bytes : int, optional
        The bytes of training state the rank keeps (default: values and gradients of
        ``parameters``; less under ZeRO-2, which keeps only the gradients the rank steps).

    A tensor-parallel layer's parameters and saved tensors are DTensors: the meter
    counts their local shards, what the rank holds.
    """

    def __init__(self, parameters: list[torch.nn.Parameter], device: torch.device,
                 state_bytes: int | None = None) -> None:
        self.device = device
        self.base = 2 * sum(_local(p).numel() * p.element_size() for p in parameters) if state_bytes is None \
            else state_bytes
        self._param_storages = {_local(p).untyped_storage().data_ptr() for p in parameters}
        self._held: dict[Hashable, int] = {}
        self._seen: dict[Hashable, set[int]] = {}
        self.live = 0
        self.peak = 0
        self.enabled = True
        """Count saved tensors (switched off after the warm-up steps)."""
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    @property
    def kind(self) -> str:
        """What :attr:`peak_bytes` measures."""
        return "cuda-max-allocated" if self.device.type == "cuda" else "tracked-tensor-bytes"

    @property
    def peak_bytes(self) -> int:
        """The peak so far."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return self.base + self.peak

    def hold(self, key: Hashable, nbytes: int) -> None:
        """Count ``nbytes`` more under ``key`` until :meth:`release`."""
        self._held[key] = self._held.get(key, 0) + nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def release(self, key: Hashable) -> None:
        """Drop everything held under ``key``."""
        self.live -= self._held.pop(key, 0)
        self._seen.pop(key, None)

    @contextmanager
    def saving(self, key: Hashable) -> Iterator[None]:
        """Count the tensors autograd saves inside the block under ``key``."""
        if self.device.type == "cuda" or not self.enabled:
            yield
            return
        seen = self._seen.setdefault(key, set())

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = _local(tensor).untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._param_storages and ptr not in seen:
                seen.add(ptr)
                self.hold(key, storage.nbytes())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank stores), else the tensor."""
    return getattr(tensor, "_local_tensor", tensor)


def rss_peak_bytes() -> int:
    """The process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
