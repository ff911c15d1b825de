"""VGG-16 (configuration D, no batch norm): one unit per conv or fully connected layer.

Each max-pool is folded into the conv unit before it, the flatten into ``fc1``.  With
224x224 inputs and 1000 classes it has exactly 138,357,544 parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeplan.models.zoo.base import Unit, ZooModel, seeded_build
from pipeplan.models.zoo.vision import image_classifier, no_seq_len

#: Output channels of the 13 convs; ``"M"`` marks a 2x2 max-pool after the previous conv.
LAYOUT: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                 512, 512, 512, "M", 512, 512, 512, "M")
IMAGE, CLASSES = 224, 1000


def _conv_units() -> list[Unit]:
    units: list[Unit] = []
    channels = 3
    for item in LAYOUT:
        if item == "M":
            units[-1].module.append(nn.MaxPool2d(2))
            continue
        module = nn.Sequential(nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU(inplace=True))
        units.append(Unit(f"conv{len(units) + 1}", module, (len(units) - 1,)))
        channels = int(item)
    return units


def build_vgg16(name: str = "vgg16", *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build VGG-16 as 16 units: ``conv1`` ... ``conv13``, ``fc1``, ``fc2``, ``fc3``.

    Parameters
    ----------
    name : str
        The zoo name.
    seq_len : None
        Must be ``None``: the input is a 3x224x224 image.
    dtype, device, seed
        Parameter dtype, device (``meta``: no memory) and initialisation seed.

    Returns
    -------
    ZooModel
        Inputs ``(n, 3, 224, 224)``, targets class labels ``(n,)`` in ``0 .. 999``.

    Raises
    ------
    InputError
        If ``seq_len`` is given.

    Examples
    --------
    >>> build_vgg16(device="meta").num_parameters()
    138357544
    """
    no_seq_len(name, seq_len)
    device = torch.device(device)
    with seeded_build(seed, device):
        units = _conv_units()
        fcs = [nn.Sequential(nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout()),
               nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout()),
               nn.Linear(4096, CLASSES)]
        for i, fc in enumerate(fcs):
            units.append(Unit(f"fc{i + 1}", fc, (len(units) - 1,)))
        for unit in units:
            unit.module.to(dtype)

    return image_classifier(name, units, image=IMAGE, classes=CLASSES, dtype=dtype, device=device)
