"""The model zoo: real ``torch.nn.Module`` models split into named partition units.

Every model is a :class:`~pipeplan.models.zoo.base.ZooModel`: an ordered list of
:class:`~pipeplan.models.zoo.base.Unit` (a pipeline stage is a contiguous slice), an example
batch, a loss and the input size.  Build one with :func:`build_model`.
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from pipeplan.models.errors import InputError

if TYPE_CHECKING:
    import torch

    from pipeplan.models.zoo.base import Unit, ZooModel

__all__ = ["ZOO", "Unit", "ZooModel", "build_model", "model_names"]

_BUILDERS: dict[str, tuple[str, str]] = {
    "gpt-tiny": ("gpt", "build_gpt"),
    "gpt-tiny-16": ("gpt", "build_gpt"),
    "gpt1": ("gpt", "build_gpt"),
    "gpt2-medium": ("gpt", "build_gpt"),
    "gpt3-1.3b": ("gpt", "build_gpt"),
    "llama-tiny": ("llama", "build_llama"),
    "llama3-70b": ("llama", "build_llama"),
    "bert-large": ("bert", "build_bert"),
    "vgg16": ("vgg", "build_vgg16"),
    "vgg-tiny": ("vgg_tiny", "build_vgg_tiny"),
    "resnet50": ("resnet", "build_resnet50"),
    "unet": ("unet", "build_unet"),
}
"""Zoo name -> (module of this package, builder function).  The builders import torch, so they
are imported on first use: listing the names (``pipeplan profile --help``) costs no torch import."""


def model_names() -> list[str]:
    """The zoo's model names, in listing order."""
    return list(_BUILDERS)


def _builder(name: str) -> Callable[..., "ZooModel"]:
    """The builder ``(*, seq_len, dtype, device, seed) -> ZooModel`` of zoo model ``name``."""
    module, function = _BUILDERS[name]
    return partial(getattr(importlib.import_module(f"{__name__}.{module}"), function), name)


def __getattr__(attr: str) -> Any:
    """``ZOO``, ``Unit`` and ``ZooModel``, imported with torch when first asked for (PEP 562)."""
    if attr in ("Unit", "ZooModel"):
        from pipeplan.models.zoo import base

        return getattr(base, attr)
    if attr == "ZOO":  # zoo name -> builder ``(name, *, seq_len, dtype, device, seed) -> ZooModel``
        return {name: _builder(name) for name in _BUILDERS}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def build_model(name: str, *, seq_len: int | None = None, dtype: "torch.dtype | None" = None,
                device: "str | torch.device" = "cpu", seed: int = 0) -> "ZooModel":
    """Build the zoo model ``name``.

    Parameters
    ----------
    name : str
        One of :func:`model_names`.
    seq_len : int, optional
        Tokens per sample for the sequence models (their context length by default);
        must be ``None`` for the image models.
    dtype : torch.dtype, optional
        Dtype of the parameters (and of image inputs); default ``torch.float32``.
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
    import torch

    if name not in _BUILDERS:
        raise InputError("-", "model", f"unknown model {name!r}; valid: {', '.join(model_names())}")
    return _builder(name)(seq_len=seq_len, dtype=torch.float32 if dtype is None else dtype, device=device, seed=seed)
