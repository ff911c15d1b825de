"""A small U-Net: two encoder levels, a bottleneck, two decoder levels with skips."""

import torch
from torch import nn


def conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())


class SmallUNet(nn.Module):
    def __init__(self, ch: int = 4) -> None:
        super().__init__()
        self.enc1 = conv(1, ch)
        self.enc2 = nn.Sequential(nn.MaxPool2d(2), conv(ch, 2 * ch))
        self.mid = nn.Sequential(nn.MaxPool2d(2), conv(2 * ch, 2 * ch), nn.Upsample(scale_factor=2))
        self.dec2 = nn.Sequential(conv(4 * ch, ch), nn.Upsample(scale_factor=2))
        self.dec1 = conv(2 * ch, ch)
        self.out = nn.Conv2d(ch, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        m = self.mid(e2)
        d2 = self.dec2(torch.cat([m, e2], dim=1))
        d1 = self.dec1(torch.cat([d2, e1], dim=1))
        return self.out(d1)


def build(ch: int = 4, size: int = 8):
    torch.manual_seed(0)
    model = SmallUNet(ch)

    def loss(output: torch.Tensor, n: int) -> torch.Tensor:
        return output.square().sum() / n

    return model, (lambda n: torch.randn(n, 1, size, size)), loss
