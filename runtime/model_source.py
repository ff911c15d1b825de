"""The one place the runtime turns a model request into a model it can cut and run.

A zoo name builds the zoo model; any other spec is resolved, traced and wrapped as
a :class:`~pipeplan.models.replay.ReplayModel`, which runs each stage by replaying
the model's ``forward`` (see :mod:`pipeplan.models.replay`).
"""

from __future__ import annotations

import torch

from pipeplan.models.model_options import ModelRequest
from pipeplan.models.replay import replay_model
from pipeplan.models.zoo import ZooModel, build_model


def build_run_model(request: ModelRequest | str, *, dtype: torch.dtype, seed: int, seq_len: int | None = None,
                    device: torch.device | str = "cpu") -> ZooModel:
    """The model ``request`` names, its weights drawn from ``seed``, parameters in ``dtype`` on ``device``.

    Raises
    ------
    InputError
        For an unknown zoo name, a spec that cannot be resolved or traced, or an
        imported model that cannot be cut into runnable stages.
    """
    if isinstance(request, str):
        request = ModelRequest(request)
    if request.is_zoo:
        return build_model(request.spec, seq_len=seq_len, dtype=dtype, seed=seed, device=device)
    model = replay_model(request.trace(seed=seed), dtype=dtype)
    for unit in model.units:
        unit.module.to(device)
    return model
