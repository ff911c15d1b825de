"""BERT encoder: embedding unit, one unit per encoder layer, pooler-plus-classifier head.

BERT-large (24 x 1024, 16 heads, vocab 30522, 512 positions, 2 token types, with
pooler) has 335,141,888 parameters; the two-class classifier on the pooled output
(as for next-sentence prediction) adds 2,050.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pipeplan.models.errors import InputError
from pipeplan.models.zoo.base import Unit, ZooModel, class_loss, generator, seeded_build

VOCAB, POSITIONS, TYPES, D_MODEL, HEADS, LAYERS, CLASSES = 30522, 512, 2, 1024, 16, 24, 2


class Embeddings(nn.Module):
    """Word, position and token-type embeddings, summed, then LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.word = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Embedding(POSITIONS, D_MODEL)
        self.token_type = nn.Embedding(TYPES, D_MODEL)
        self.norm = nn.LayerNorm(D_MODEL, eps=1e-12)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        # One segment per sample: every token has type 0.
        types = torch.zeros_like(positions)
        return self.norm(self.word(ids) + self.position(positions) + self.token_type(types))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer: bidirectional attention and a 4x GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(D_MODEL, D_MODEL)
        self.key = nn.Linear(D_MODEL, D_MODEL)
        self.value = nn.Linear(D_MODEL, D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.norm1 = nn.LayerNorm(D_MODEL, eps=1e-12)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))
        self.norm2 = nn.LayerNorm(D_MODEL, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, d = x.shape
        split = (n, s, HEADS, d // HEADS)
        q, k, v = (f(x).view(split).transpose(1, 2) for f in (self.query, self.key, self.value))
        weights = ((q @ k.transpose(-2, -1)) / math.sqrt(d // HEADS)).softmax(dim=-1)
        x = self.norm1(x + self.out((weights @ v).transpose(1, 2).reshape(n, s, d)))
        return self.norm2(x + self.mlp(x))


class PoolerHead(nn.Module):
    """The pooler (dense + tanh on the first token) and a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.pooler = nn.Linear(D_MODEL, D_MODEL)
        self.classifier = nn.Linear(D_MODEL, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def build_bert(name: str = "bert-large", *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build BERT-large as 26 units: ``embed``, ``layer.0`` ... ``layer.23``, ``pooler``.

    Parameters
    ----------
    name : str
        The zoo name (``bert-large``).
    seq_len : int, optional
        Tokens per sample (1 .. 512; 512 by default).
    dtype, device, seed
        Parameter dtype, device (``meta``: no memory) and initialisation seed.

    Returns
    -------
    ZooModel
        Inputs are token ids ``(n, seq_len)``, targets class labels ``(n,)``.

    Raises
    ------
    InputError
        If ``seq_len`` is out of range.

    Examples
    --------
    >>> build_bert(device="meta").num_parameters()
    335143938
    """
    seq = POSITIONS if seq_len is None else seq_len
    if not 1 <= seq <= POSITIONS:
        raise InputError("-", "seq_len", f"model {name!r} takes 1 to {POSITIONS} tokens per sample, got {seq}")
    device = torch.device(device)
    with seeded_build(seed, device):
        modules = [Embeddings(), *(EncoderLayer() for _ in range(LAYERS)), PoolerHead()]
        for module in modules:
            module.to(dtype)
    names = ["embed", *(f"layer.{i}" for i in range(LAYERS)), "pooler"]
    units = [Unit(nm, module, (i - 1,)) for i, (nm, module) in enumerate(zip(names, modules))]

    def batch(n: int, seed: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if dev.type == "meta":
            return (torch.empty(n, seq, dtype=torch.long, device=dev),
                    torch.empty(n, dtype=torch.long, device=dev))
        gen = generator(seed)
        return (torch.randint(0, VOCAB, (n, seq), generator=gen).to(dev),
                torch.randint(0, CLASSES, (n,), generator=gen).to(dev))

    config = {"layers": LAYERS, "d_model": D_MODEL, "heads": HEADS, "vocab": VOCAB,
              "seq_len": seq, "dtype": str(dtype).removeprefix("torch.")}
    return ZooModel(name, units, batch, class_loss, input_bytes_per_sample=8 * seq,
                    device=device, config=config)
