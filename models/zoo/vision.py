"""Batches, dtype handling and the classifier wrapper shared by the image models (VGG, ResNet, U-Net)."""

from __future__ import annotations

import torch

from pipeplan.models.errors import InputError
from pipeplan.models.zoo.base import Unit, ZooModel, class_loss, generator


def no_seq_len(name: str, seq_len: int | None) -> None:
    """Image models have a fixed input size: refuse a sequence length."""
    if seq_len is not None:
        raise InputError("-", "seq_len", f"model {name!r} takes images; a sequence length does not apply")


def image_batch(n: int, seed: int, device: torch.device, *, shape: tuple[int, ...], dtype: torch.dtype,
                classes: int, target_shape: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Normal images ``(n, *shape)`` and random labels ``(n, *target_shape)``."""
    if device.type == "meta":
        return (torch.empty(n, *shape, dtype=dtype, device=device),
                torch.empty(n, *target_shape, dtype=torch.long, device=device))
    gen = generator(seed)
    images = torch.randn(n, *shape, generator=gen).to(device=device, dtype=dtype)
    labels = torch.randint(0, classes, (n, *target_shape), generator=gen).to(device)
    return images, labels


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


def image_classifier(name: str, units: list[Unit], *, image: int, classes: int, dtype: torch.dtype,
                     device: torch.device) -> ZooModel:
    """A zoo model over ``units`` that classifies ``(n, 3, image, image)`` images into ``classes``."""

    def batch(n: int, seed: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return image_batch(n, seed, dev, shape=(3, image, image), dtype=dtype, classes=classes)

    elem = torch.empty((), dtype=dtype).element_size()
    return ZooModel(name, units, batch, class_loss, input_bytes_per_sample=3 * image * image * elem,
                    device=device, config={"image": image, "classes": classes, "dtype": dtype_name(dtype)})
