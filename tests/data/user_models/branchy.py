"""A model whose blocks take a value-dependent branch (torch.export cannot trace it).

The branch depends on each block's own weights, not on the batch, so any split of
the batch into microbatches computes the same function.
"""

import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        y = self.lin(h)
        if self.lin.bias.sum() > 0:
            return torch.relu(y)
        return -y


class Branchy(nn.Module):
    def __init__(self, dim: int = 8, layers: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, dim)
        self.layers = nn.ModuleList(Gate(dim) for _ in range(layers))
        self.out = nn.Linear(dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def build(dim: int = 8, layers: int = 3):
    torch.manual_seed(0)
    return Branchy(dim, layers)
