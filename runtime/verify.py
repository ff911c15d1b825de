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
Dropout draws a random mask per forward call.  A model's own code can make a sample's
output depend on the other samples of its batch too (a batch-wide mean, an ``if`` on
one): :func:`forward_dependence` finds it by running the batch whole and in two
halves.  For a model holding or doing any of these, the
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
Random numbers drawn outside ``nn.Dropout`` modules (``F.dropout`` in the model's
code) are drawn unseeded on the ranks: a model doing so is named in a note, since
its training differs from the reference (set its dropout probabilities to 0 to verify).

[Note: the tolerance]  Each parameter is compared as a whole: its largest difference
``max|got - want|`` must be at most ``TOLERANCE * max|want|`` (relative) or
``ABSOLUTE`` (absolute, for a parameter whose values are all near zero), the form of
``torch.testing.assert_close``'s ``atol + rtol * |want|``.  float64 runs agree to
~1e-15 relative; a parameter whose exact gradient is zero (an attention's key bias:
softmax ignores a shift of the scores) moves by round-off alone, ~1e-24 from a zero
start, where a relative measure would divide round-off by round-off.  The reported
difference is ``max|got - want| / max(max|want|, ABSOLUTE / TOLERANCE)``, accepted up
to ``TOLERANCE``.
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
ABSOLUTE = 1e-12
"""Largest accepted absolute difference of a parameter whose values are all near zero (see [Note: the tolerance]):
float64 round-off on values of order 1 is ~1e-16, and a few SGD steps keep it far below."""


def reference_parameters(model_name: str | ModelRequest, *, steps: int, global_batch: int, lr: float, seed: int,
                         dtype: torch.dtype, seq_len: int | None, plan: Plan | None = None,
                         device: torch.device | str = "cpu",
                         beat: Callable[[int], None] = lambda step: None,
                         on_loss: Callable[[float], None] = lambda loss: None,
                         notes: list[str] | None = None) -> dict[str, torch.Tensor]:
    """``"unit.param" -> tensor`` (on the CPU) after ``steps`` SGD steps on one process.

    With ``plan`` given and a model that holds BatchNorm or dropout, or whose forward
    depends on the whole batch, each step runs the plan's pieces (see [Note: pieces in
    the reference]); otherwise the whole batch at once.  ``device``: where the reference
    trains (the ranks' device type); ``on_loss`` is called with every step's loss;
    ``notes`` receives what the user should know about the comparison.
    """
    model = build_run_model(model_name, dtype=dtype, seq_len=seq_len, seed=seed, device=device)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=lr)
    found: set[str] = set()
    for step in range(steps if plan is not None else 0):  # an `if` on a batch statistic may flip at any step
        found |= forward_dependence(model, step_batch(model, global_batch, seed, step)[0], seed + step)
    if notes is not None:
        notes.extend(DEPENDENCE_NOTES[kind] for kind in sorted(found))
    pieced = plan if plan is not None and (needs_pieces(model) or "batch" in found) else None
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


DEPENDENCE_NOTES = {
    "batch": "the model's output for a sample depends on the other samples of its batch (a batch-wide statistic "
             "or an if on one, in its code): the pipeline computes it on each microbatch, so the reference ran "
             "the plan's microbatches too, and 'ok' means the ranks computed what the plan defines, not what "
             "whole-batch training computes",
    "random": "the model draws random numbers in its forward outside nn.Dropout modules (functional dropout, "
              "say): the ranks and the reference draw different ones, so their training differs; set the "
              "model's dropout probabilities to 0 to verify",
}
"""The note on each kind of :func:`forward_dependence`."""


def forward_dependence(model: ZooModel, inputs: torch.Tensor, seed: int = 0) -> set[str]:
    """What the model's output depends on besides each sample alone: ``"random"``, ``"batch"``.

    ``"random"``: two forward passes seeded alike agree but seeded apart differ, and
    the model holds no ``nn.Dropout`` (whose masks the ranks seed, see
    :func:`pipeplan.runtime.pieces.piece_seed`).  ``"batch"``: a forward pass of the
    whole batch and of its two halves, seeded alike, differ (a model holding
    BatchNorm is handled by :func:`needs_pieces` and not tested).  Runs without
    gradients; the RNG state is restored.

    Examples
    --------
    >>> from pipeplan.runtime.training_data import build_run_model
    >>> forward_dependence(build_run_model("gpt-tiny"), torch.zeros(4, 16, dtype=torch.long))
    set()
    """
    if len(inputs) < 2 or batch_norms(unit.module for unit in model.units):
        return set()
    found: set[str] = set()

    def run(x: torch.Tensor, s: int) -> torch.Tensor:
        torch.manual_seed(s)
        return model(x)

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        whole = run(inputs, seed)
        if not has_dropout(unit.module for unit in model.units) and not _same(whole, run(inputs, seed + 1)):
            if _same(whole, run(inputs, seed)):
                found.add("random")
        if not found and not has_dropout(unit.module for unit in model.units):
            half = len(inputs) // 2
            if not _same(whole, torch.cat([run(inputs[:half], seed), run(inputs[half:], seed)])):
                found.add("batch")
    return found


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to round-off (a different summation order within a sample's computation)."""
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-9, atol=1e-12))


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
    """``max |got - want| / max(max |want|, ABSOLUTE / TOLERANCE)`` (see [Note: the tolerance]); ``inf`` if
    either holds NaN or inf.

    A NaN must not compare as "no larger" than anything: it would pass the check.

    Examples
    --------
    >>> relative_difference(torch.tensor([2.0, 4.5]), torch.tensor([2.0, 4.0]))
    0.125
    >>> relative_difference(torch.tensor([3e-24]), torch.tensor([1e-24])) <= TOLERANCE  # round-off near zero
    True
    """
    scale = want.abs().max().item() if want.numel() else 0.0
    diff = (got.to(want.dtype) - want).abs().max().item() if want.numel() else 0.0
    if not (math.isfinite(scale) and math.isfinite(diff)):
        return math.inf
    return diff / max(scale, ABSOLUTE / TOLERANCE)


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
