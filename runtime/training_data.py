"""What a training run is made of besides the plan: the model named on the command line
and the batch of each step.

``pipeplan run`` (every rank and ``--verify``'s reference) and the scripts that
``pipeplan export --to torch`` writes build their model and draw their batches here, so
the same ``--model`` and ``--seed`` train the same weights on the same data in all of
them and their losses can be compared number for number.
"""

from __future__ import annotations

import torch

from pipeplan.models.errors import InputError
from pipeplan.models.zoo import ZooModel, build_model, model_names


def build_run_model(spec: str, *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """The model that ``--model SPEC`` names, its weights drawn from ``seed``.

    ``spec`` is a zoo name (:func:`pipeplan.models.zoo.model_names`); the other
    arguments and the ``InputError`` for an unknown name or a ``seq_len`` the model
    does not take are those of :func:`pipeplan.models.zoo.build_model`.

    Examples
    --------
    >>> len(build_run_model("gpt-tiny").units)
    6
    """
    if spec not in model_names():
        raise InputError("-", "--model", f"unknown model {spec!r}; valid: {', '.join(model_names())}")
    return build_model(spec, seq_len=seq_len, dtype=dtype, seed=seed, device=device)


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
