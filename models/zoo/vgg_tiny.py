"""vgg-tiny: VGG with batch norm (torchvision's ``vgg*_bn`` layout) scaled down to 32x32 images.

The zoo's small model with the two layers whose training depends on how the batch is
cut: BatchNorm (statistics over the samples a piece holds) and Dropout (a random mask
per forward).  It runs ``--verify`` on every plan feature in seconds, as ``gpt-tiny``
does for transformers.  Four conv units (conv, BatchNorm, ReLU, max-pool) and two
classifier units; 10 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeplan.models.zoo.base import Unit, ZooModel, seeded_build
from pipeplan.models.zoo.vision import image_classifier, no_seq_len

#: Output channels of the four conv units (each halves the image).
CHANNELS = (8, 16, 32, 32)
IMAGE, CLASSES, HIDDEN = 32, 10, 64


def _conv(in_ch: int, out_ch: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2))


def build_vgg_tiny(name: str = "vgg-tiny", *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build vgg-tiny as 6 units: ``conv1`` ... ``conv4``, ``fc1`` (with dropout), ``fc2``.

    Parameters, result and errors as :func:`pipeplan.models.zoo.vgg.build_vgg16`, but the inputs
    are ``(n, 3, 32, 32)`` images and the labels lie in ``0 .. 9``.

    Examples
    --------
    >>> [u.name for u in build_vgg_tiny(device="meta").units]
    ['conv1', 'conv2', 'conv3', 'conv4', 'fc1', 'fc2']
    >>> build_vgg_tiny(device="meta").num_parameters()
    24362
    """
    no_seq_len(name, seq_len)
    device = torch.device(device)
    with seeded_build(seed, device):
        units = [Unit(f"conv{i + 1}", _conv(in_ch, out_ch), (i - 1,))
                 for i, (in_ch, out_ch) in enumerate(zip((3, *CHANNELS), CHANNELS))]
        side = IMAGE // 2 ** len(CHANNELS)
        units.append(Unit("fc1", nn.Sequential(nn.Flatten(), nn.Linear(CHANNELS[-1] * side * side, HIDDEN),
                                               nn.ReLU(inplace=True), nn.Dropout()), (len(units) - 1,)))
        units.append(Unit("fc2", nn.Linear(HIDDEN, CLASSES), (len(units) - 1,)))
        for unit in units:
            unit.module.to(dtype)

    return image_classifier(name, units, image=IMAGE, classes=CLASSES, dtype=dtype, device=device)
