"""A model called with two tensors (features and a mask): profiled, but not run."""

import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * mask)


def build():
    return Masked(), lambda n: (torch.randn(n, 3), torch.ones(n, 3))
