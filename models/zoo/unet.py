"""A small U-Net whose skip connections cross units.

Units: ``enc1`` .. ``enc3`` (each halves the image after the first), ``bottom``, then
``dec3`` .. ``dec1`` (each upsamples and concatenates the matching encoder output),
and ``head`` (1x1 conv to per-pixel class scores).  ``enc1`` feeds ``dec1`` six
units later, so a pipeline cut inside the U carries the skip tensors too.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeplan.models.zoo.base import Unit, ZooModel, class_loss, seeded_build
from pipeplan.models.zoo.vision import dtype_name, image_batch, no_seq_len

IMAGE, IN_CH, BASE, CLASSES, DEPTH = 64, 3, 16, 2, 3


def _double_conv(in_ch: int, out_ch: int) -> list[nn.Module]:
    return [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(out_ch, out_ch, 3, padding=1), nn.ReLU(inplace=True)]


class Down(nn.Module):
    """Optional 2x2 max-pool, then two 3x3 convs."""

    def __init__(self, in_ch: int, out_ch: int, pool: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(*([nn.MaxPool2d(2)] if pool else []), *_double_conv(in_ch, out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Up(nn.Module):
    """2x transposed conv of the deeper map, concatenated with the skip, then two convs."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_ch, out_ch, 2, stride=2)
        self.body = nn.Sequential(*_double_conv(2 * out_ch, out_ch))

    def forward(self, deep: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([self.up(deep), skip], dim=1))


def build_unet(name: str = "unet", *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build the U-Net as 8 units with skip edges ``enc3->dec3``, ``enc2->dec2``, ``enc1->dec1``.

    Parameters
    ----------
    name : str
        The zoo name.
    seq_len : None
        Must be ``None``: the input is a 3x64x64 image.
    dtype, device, seed
        Parameter dtype, device (``meta``: no memory) and initialisation seed.

    Returns
    -------
    ZooModel
        Inputs ``(n, 3, 64, 64)``, targets per-pixel labels ``(n, 64, 64)`` in ``{0, 1}``.

    Raises
    ------
    InputError
        If ``seq_len`` is given.

    Examples
    --------
    >>> build_unet(device="meta").edges()[:3]
    [(0, 1), (0, 6), (1, 2)]
    """
    no_seq_len(name, seq_len)
    device = torch.device(device)
    widths = [BASE * 2 ** i for i in range(DEPTH + 1)]  # 16, 32, 64, 128
    with seeded_build(seed, device):
        units = [Unit("enc1", Down(IN_CH, widths[0], pool=False), (-1,))]
        for i in range(1, DEPTH):
            units.append(Unit(f"enc{i + 1}", Down(widths[i - 1], widths[i], pool=True), (i - 1,)))
        units.append(Unit("bottom", Down(widths[DEPTH - 1], widths[DEPTH], pool=True), (DEPTH - 1,)))
        for level in range(DEPTH, 0, -1):  # dec3 consumes enc3 (index 2), ..., dec1 consumes enc1 (0)
            units.append(Unit(f"dec{level}", Up(widths[level], widths[level - 1]), (len(units) - 1, level - 1)))
        units.append(Unit("head", nn.Conv2d(widths[0], CLASSES, 1), (len(units) - 1,)))
        for unit in units:
            unit.module.to(dtype)

    def batch(n: int, seed: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return image_batch(n, seed, dev, shape=(IN_CH, IMAGE, IMAGE), dtype=dtype, classes=CLASSES,
                           target_shape=(IMAGE, IMAGE))

    elem = torch.empty((), dtype=dtype).element_size()
    return ZooModel(name, units, batch, class_loss, input_bytes_per_sample=IN_CH * IMAGE * IMAGE * elem,
                    device=device, config={"image": IMAGE, "base": BASE, "depth": DEPTH,
                                           "classes": CLASSES, "dtype": dtype_name(dtype)})
