"""``--verify``: the same training on one process, and the distance to it.

The reference builds the whole model with the same seed, draws the same batch at
every step, takes the mean loss over the whole batch and the same SGD step.  Every
copy of every parameter on every rank (replicas and tied copies included) must
match it.

[Note: pieces in the reference]  Most layers treat each sample on its own, and then
any split of the batch gives the whole batch's gradient: the reference runs the whole
batch at once.  Two kinds of layer do not.  BatchNorm normalises with the statistics
of the samples it is given, so a pipeline computes a different function from the one
whole-batch training computes (GPipe's and torchgpipe's caveat), on any executor.
Dropout draws a random mask per forward call.  For a model holding either, the
reference runs the plan's own pieces instead: stage by stage, each microbatch of
the stage, each replica's part of it, seeded like the rank that runs it
(:func:`pipeplan.runtime.pieces.piece_seed`), its outputs joined back in sample order.  That
is still one process and one SGD step on the mean loss over the batch, and it is
exactly the function the plan trains: for these models "verified" means the ranks
computed what the plan defines, not what whole-batch training computes.  The check
stays strict (a misrouted sample, a replica's lost gradient, a recompute that draws
another mask all fail it); the pieces themselves come from :func:`pipeplan.runtime.routing.pieces`,
the ranks' own rule (tested on its own).  The reference runs on the ranks' device
type: CUDA draws dropout masks from another generator than the CPU.  Only parameters
are compared: BatchNorm's running statistics are buffers (a recompute leaves them
alone, see :func:`pipeplan.runtime.pieces.frozen_statistics`, checked by a unit test, not by
``--verify``), and each replica keeps its own, as DDP without buffer broadcasting does.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

from pipeplan.models.model_options import ModelRequest
from pipeplan.models.zoo import ZooModel
from pipeplan.runtime.pieces import batch_norms, has_dropout, piece_seed
from pipeplan.runtime.routing import pieces
from pipeplan.runtime.training_data import build_run_model, step_batch
from pipeplan.solver.formats.plan import Plan

TOLERANCE = 1e-6
"""Largest accepted relative difference (float64 runs agree to ~1e-15)."""


def reference_parameters(model_name: str | ModelRequest, *, steps: int, global_batch: int, lr: float, seed: int,
                         dtype: torch.dtype, seq_len: int | None, plan: Plan | None = None,
                         device: torch.device | str = "cpu",
                         beat: Callable[[int], None] = lambda step: None,
                         on_loss: Callable[[float], None] = lambda loss: None) -> dict[str, torch.Tensor]:
    """``"unit.param" -> tensor`` (on the CPU) after ``steps`` SGD steps on one process.

    With ``plan`` given and a model that holds BatchNorm or dropout, each step runs the
    plan's pieces (see [Note: pieces in the reference]); otherwise the whole batch at once.
    ``device``: where the reference trains (the ranks' device type); ``on_loss`` is called
    with every step's loss.
    """
    model = build_run_model(model_name, dtype=dtype, seq_len=seq_len, seed=seed, device=device)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=lr)
    pieced = plan if plan is not None and needs_pieces(model) else None
    for step in range(steps):
        beat(step)
        inputs, targets = step_batch(model, global_batch, seed, step)
        output = forward_in_pieces(model, pieced, inputs, seed, step) if pieced else model(inputs)
        loss = model.loss(output, targets)
        on_loss(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {f"{unit.name}.{name}": p.detach().cpu().clone() for unit in model.units
            for name, p in unit.module.named_parameters(remove_duplicate=False)}


def needs_pieces(model: ZooModel) -> bool:
    """Whether the gradient depends on how the batch is cut (BatchNorm) or on per-call random masks (dropout)."""
    modules = [unit.module for unit in model.units]
    return bool(batch_norms(modules)) or has_dropout(modules)


def plan_pieces(plan: Plan, stage: int) -> list[tuple[int, int, int, int]]:
    """``(microbatch, replica, start, stop)`` of every non-empty piece of ``stage``, in sample order.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Plan, Stage
    >>> plan = Plan("g", "c", 5, 4.0, "gpipe", (Stage((0, 1), ("a", "b"), (3, 2), False),))
    >>> plan_pieces(plan, 0)
    [(0, 0, 0, 2), (0, 1, 2, 3), (1, 0, 3, 4), (1, 1, 4, 5)]
    """
    return [(p.microbatch, p.replica, p.start, p.stop) for p in pieces(plan, stage) if p.size]


def forward_in_pieces(model: ZooModel, plan: Plan, inputs: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """The model output when every stage runs the plan's pieces, as the ranks do.

    Each piece is seeded with :func:`pipeplan.runtime.pieces.piece_seed`; its outputs (and the
    relayed tensors it reads) are rows of whole-batch tensors, so autograd carries
    every gradient back through the joins.
    """
    done: dict[int, torch.Tensor] = {-1: inputs}
    for s, st in enumerate(plan.stages):
        lo, hi = st.layers
        parts: dict[int, list[torch.Tensor]] = {i: [] for i in range(lo, hi)}
        for k, j, start, stop in plan_pieces(plan, s):
            rows = {u: t[start:stop] for u, t in done.items()}
            torch.manual_seed(piece_seed(seed, step, s, k, j))
            out = model.forward(rows[-1], lo, hi, rows)
            for i in range(lo, hi):
                parts[i].append(out[i])
        done.update({i: torch.cat(parts[i]) for i in range(lo, hi)})
    return done[len(model.units) - 1]


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
