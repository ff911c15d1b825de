"""What a training run is made of besides the plan: the model named on the command line
and the batch of each step.

``pipeplan run`` (every rank and ``--verify``'s reference) and the scripts that
``pipeplan export --to torch`` writes build their model and draw their batches here, so
the same ``--model`` and ``--seed`` train the same weights on the same data in all of
them and their losses can be compared number for number.
"""

from __future__ import annotations

import torch

from pipeplan.models.model_options import ModelRequest
from pipeplan.models.replay import replay_model
from pipeplan.models.zoo import ZooModel, build_model


def build_run_model(request: ModelRequest | str, *, seq_len: int | None = None,
                    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                    seed: int = 0) -> ZooModel:
    """The model that ``--model SPEC`` names, its weights drawn from ``seed``.

    A zoo name builds the zoo model (:func:`pipeplan.models.zoo.build_model`); any other
    spec (``file.py:factory``, ``package.module:factory``, ``hf:NAME``) is resolved,
    traced and wrapped as a :class:`~pipeplan.models.replay.ReplayModel`, which runs
    each stage by replaying the model's ``forward`` (see :mod:`pipeplan.models.replay`).

    Raises
    ------
    InputError
        For an unknown zoo name, a spec that cannot be resolved or traced, a
        ``seq_len`` the model does not take, or an imported model that cannot be cut
        into runnable stages.

    Examples
    --------
    >>> len(build_run_model("gpt-tiny").units)
    6
    """
    if isinstance(request, str):
        request = ModelRequest(request)
    if request.is_zoo:
        return build_model(request.spec, seq_len=seq_len, dtype=dtype, seed=seed, device=device)
    model = replay_model(request.trace(seed=seed), dtype=dtype)
    for unit in model.units:
        unit.module.to(device)
    return model


def batch_seed(seed: int, step: int) -> int:
    """Seed of the batch drawn at ``step`` (the same on every rank and in the reference)."""
    return seed * 100_003 + step


def step_batch(model: ZooModel, global_batch: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of the whole global batch of training step ``step``.

    Examples
    --------
    >>> m = build_run_model("gpt-tiny")
    >>> x, _ = step_batch(m, 4, 0, 1)
    >>> bool((x == step_batch(m, 4, 0, 1)[0]).all()), tuple(x.shape)
    (True, (4, 16))
    """
    return model.example_batch(global_batch, batch_seed(seed, step))
