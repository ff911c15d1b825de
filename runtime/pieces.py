"""What makes one piece's forward pass reproducible: its dropout seed and BatchNorm's statistics.

A *piece* is the samples one rank handles in one microbatch of its stage
(:class:`pipeplan.runtime.routing.Piece`).  Most layers treat each sample on its own; two kinds
do not, and they need care when a stage recomputes its forward and when ``--verify``
rebuilds the training on one process:

- dropout draws a random mask on every call: each piece's forward is seeded by
  :func:`piece_seed`, so the recomputed forward draws the same masks and the
  reference can draw them too;
- BatchNorm normalises with the statistics of the samples it is given and keeps
  running averages of them: a recomputed forward must not count its samples twice
  (:func:`frozen_statistics`).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Iterable, Iterator

from torch import nn


def batch_norms(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """The BatchNorm layers among ``modules``.

    In training they normalise with the statistics of the samples they are given, so
    their output for one sample depends on the other samples of the same piece, and a
    pipeline that runs a microbatch (or a replica's part of it) trains differently from
    one process running the whole batch, whatever the executor does.
    """
    return [m for module in modules for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def has_dropout(modules: Iterable[nn.Module]) -> bool:
    """Whether any of ``modules`` holds a dropout layer (it draws a random mask on every forward)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for module in modules for m in module.modules())


def piece_seed(seed: int, step: int, stage: int, microbatch: int, replica: int) -> int:
    """The RNG seed of one piece's forward pass (and of its recomputation).

    A function of the run's seed and of the piece alone, so the recomputed forward draws
    the same dropout masks as the first one, every run of a plan draws the same masks,
    and ``--verify``'s one-process reference can draw them too.

    Examples
    --------
    >>> piece_seed(0, 1, 2, 3, 0) == piece_seed(0, 1, 2, 3, 0) != piece_seed(0, 1, 2, 3, 1)
    True
    """
    digest = hashlib.blake2b(f"{seed}:{step}:{stage}:{microbatch}:{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextmanager
def frozen_statistics(norms: list[nn.Module]) -> Iterator[None]:
    """Restore the running statistics of ``norms`` on exit.

    A recomputed forward must not count its samples twice in BatchNorm's running mean
    and variance (what torch's activation checkpointing also leaves to the user).
    """
    saved = [{name: b.detach().clone() for name, b in m.named_buffers(recurse=False)} for m in norms]
    try:
        yield
    finally:
        for m, buffers in zip(norms, saved):
            for name, b in m.named_buffers(recurse=False):
                # through .data: autograd saved these tensors for the backward (which ignores
                # them in training) and would refuse a version bump as a modified input
                b.data.copy_(buffers[name])
