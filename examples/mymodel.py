"""A small language model with a tied head and a skip connection: the README's own-model example."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Linear(dim, dim)

    def forward(self, h):
        return h + torch.tanh(self.ff(self.norm(h)))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight          # tied to the embedding

    def forward(self, ids):
        e = self.embed(ids)
        h = e
        for block in self.blocks:
            h = block(h)
        return self.head(h + e)                       # a skip from the embedding


def build(vocab=1000, dim=64, layers=4, seq=32):
    model = TinyLM(vocab, dim, layers)
    return model, lambda n: torch.randint(0, vocab, (n, seq))
