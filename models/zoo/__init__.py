"""The model zoo: real ``torch.nn.Module`` models split into named partition units.

Every model is a :class:`~pipeplan.models.zoo.base.ZooModel`: an ordered list of
:class:`~pipeplan.models.zoo.base.Unit` (a pipeline stage is a contiguous slice), an example
batch, a loss and the input size.  Build one with :func:`build_model`.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from pipeplan.models.errors import InputError
from pipeplan.models.zoo.base import Unit, ZooModel
from pipeplan.models.zoo.bert import build_bert
from pipeplan.models.zoo.gpt import build_gpt
from pipeplan.models.zoo.resnet import build_resnet50
from pipeplan.models.zoo.unet import build_unet
from pipeplan.models.zoo.vgg import build_vgg16
from pipeplan.models.zoo.vgg_tiny import build_vgg_tiny

__all__ = ["ZOO", "Unit", "ZooModel", "build_model", "model_names"]

#: Zoo name -> builder ``(name, *, seq_len, dtype, device, seed) -> ZooModel``.
ZOO: dict[str, Callable[..., ZooModel]] = {
    "gpt-tiny": partial(build_gpt, "gpt-tiny"),
    "gpt1": partial(build_gpt, "gpt1"),
    "gpt2-medium": partial(build_gpt, "gpt2-medium"),
    "gpt3-1.3b": partial(build_gpt, "gpt3-1.3b"),
    "bert-large": partial(build_bert, "bert-large"),
    "vgg16": partial(build_vgg16, "vgg16"),
    "vgg-tiny": partial(build_vgg_tiny, "vgg-tiny"),
    "resnet50": partial(build_resnet50, "resnet50"),
    "unet": partial(build_unet, "unet"),
}


def model_names() -> list[str]:
    """The zoo's model names, in listing order."""
    return list(ZOO)


def build_model(name: str, *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build the zoo model ``name``.

    Parameters
    ----------
    name : str
        One of :func:`model_names`.
    seq_len : int, optional
        Tokens per sample for the sequence models (their context length by default);
        must be ``None`` for the image models.
    dtype : torch.dtype
        Dtype of the parameters (and of image inputs).
    device : str or torch.device
        ``"cpu"``, or ``"meta"`` for shapes only (no memory: a 1.3B model is free).
    seed : int
        Seed of the weight initialisation: the same seed gives the same weights.

    Returns
    -------
    ZooModel

    Raises
    ------
    InputError
        If ``name`` is not in the zoo, or ``seq_len`` does not fit the model.

    Examples
    --------
    >>> [u.name for u in build_model("gpt-tiny").units]
    ['embed', 'block.0', 'block.1', 'block.2', 'block.3', 'head']
    """
    if name not in ZOO:
        raise InputError("-", "model", f"unknown model {name!r}; valid: {', '.join(model_names())}")
    return ZOO[name](seq_len=seq_len, dtype=dtype, device=device, seed=seed)
