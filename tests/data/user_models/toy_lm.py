"""A small language model: an embedding, a ModuleList of blocks, a skip from the
embedding to the head, and a head tied to the embedding."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.ff(self.norm(h)))


class ToyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embed(ids)
        h = e
        for block in self.blocks:
            h = block(h)
        return self.head(h + e)


def build(vocab: int = 40, dim: int = 16, layers: int = 3, seq: int = 6):
    torch.manual_seed(0)
    model = ToyLM(vocab, dim, layers)

    def example(n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (n, seq))

    return model, example


def module_only(vocab: int = 40, dim: int = 16, layers: int = 2):
    return ToyLM(vocab, dim, layers)


class HeadFromWeight(ToyLM):
    """Glue code reading a Parameter: the head written in the root forward."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return h @ self.embed.weight.T


def glue_with_weight():
    model = HeadFromWeight(40, 16, 2)
    return model, lambda n: torch.randint(0, 40, (n, 6))


def raises(**kwargs):
    raise ValueError("dim must be even")


def not_a_model():
    return 42
