"""ResNet-50 (v1.5: stride on the 3x3 conv): stem, one unit per bottleneck block, head.

With BatchNorm affine parameters, 224x224 inputs and 1000 classes it has exactly
25,557,032 parameters (BatchNorm running statistics are buffers, not parameters).
"""

from __future__ import annotations

import torch
from torch import nn

from pipeplan.models.zoo.base import Unit, ZooModel, seeded_build
from pipeplan.models.zoo.vision import image_classifier, no_seq_len

#: (blocks, bottleneck width) of the four stages.
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
EXPANSION, IMAGE, CLASSES = 4, 224, 1000


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand, plus a projection shortcut when shapes change."""

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * EXPANSION
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def _stem() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))


def _head() -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512 * EXPANSION, CLASSES))


def build_resnet50(name: str = "resnet50", *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build ResNet-50 as 18 units: ``stem``, ``layer1.0`` ... ``layer4.2``, ``head``.

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
        Inputs ``(n, 3, 224, 224)``, targets class labels ``(n,)``.

    Raises
    ------
    InputError
        If ``seq_len`` is given.

    Examples
    --------
    >>> build_resnet50(device="meta").num_parameters()
    25557032
    """
    no_seq_len(name, seq_len)
    device = torch.device(device)
    with seeded_build(seed, device):
        units = [Unit("stem", _stem(), (-1,))]
        in_ch = 64
        for s, (blocks, width) in enumerate(STAGES):
            for b in range(blocks):
                stride = 2 if b == 0 and s > 0 else 1
                units.append(Unit(f"layer{s + 1}.{b}", Bottleneck(in_ch, width, stride), (len(units) - 1,)))
                in_ch = width * EXPANSION
        units.append(Unit("head", _head(), (len(units) - 1,)))
        for unit in units:
            unit.module.to(dtype)

    return image_classifier(name, units, image=IMAGE, classes=CLASSES, dtype=dtype, device=device)
