"""GPT decoder-only transformers: embedding unit, one unit per block, head unit.

The head's output projection *is* the embedding's weight (one shared Parameter), so
the head unit is marked ``tied_to`` the embedding unit.  GPT-1 is post-norm with no
final LayerNorm; GPT-2 and GPT-3 are pre-norm with a final LayerNorm in the head.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from pipeplan.models.errors import InputError
from pipeplan.models.zoo.base import Unit, ZooModel, seeded_build, token_batch, token_loss


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT model."""

    blocks: int
    """Number of transformer blocks."""
    d_model: int
    """Hidden size."""
    heads: int
    """Attention heads (``d_model`` must be a multiple)."""
    vocab: int
    """Vocabulary size."""
    ctx: int
    """Context length: number of learned positions."""
    prenorm: bool = True
    """LayerNorm before each sub-layer (GPT-2/3) rather than after (GPT-1)."""


CONFIGS: dict[str, GPTConfig] = {
    "gpt1": GPTConfig(blocks=12, d_model=768, heads=12, vocab=40478, ctx=512, prenorm=False),
    "gpt2-medium": GPTConfig(blocks=24, d_model=1024, heads=16, vocab=50257, ctx=1024),
    # GPT-3 XL ("1.3B"): 24 x 2048; 16 heads of 128 dimensions.
    "gpt3-1.3b": GPTConfig(blocks=24, d_model=2048, heads=16, vocab=50257, ctx=2048),
    "gpt-tiny": GPTConfig(blocks=4, d_model=32, heads=4, vocab=64, ctx=16),
}


class Embedding(nn.Module):
    """Token plus learned position embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.ctx, cfg.d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.wte(ids) + self.wpe(positions)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention, written out with matmuls so FLOP counting sees it."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.d_model // cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The head count and the width come from qkv's output, not from the model's sizes: a
        # tensor-parallel rank holds the q, k and v rows of its own heads only (its qkv output is
        # [q_i, k_i, v_i]) and computes those heads (pipeplan.runtime.sharding).
        n, s, _ = x.shape
        q, k, v = self.qkv(x).view(n, s, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(n, s, -1))


class Block(nn.Module):
    """A transformer block: attention and a 4x MLP, each with a residual."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.prenorm = cfg.prenorm
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prenorm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Head(nn.Module):
    """Optional final LayerNorm, then logits through the (tied) token embedding."""

    def __init__(self, cfg: GPTConfig, wte: nn.Embedding) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model) if cfg.prenorm else nn.Identity()
        # Registered as a submodule so the head unit owns (shares) the Parameter.
        self.wte = wte

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.ln_f(x), self.wte.weight)


def _init_weights(module: nn.Module) -> None:
    # GPT initialisation: N(0, 0.02); a unit-variance embedding would give huge tied logits.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_gpt(name: str, *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build the GPT called ``name`` (a key of :data:`CONFIGS`).

    Parameters
    ----------
    name : str
        ``gpt1``, ``gpt2-medium``, ``gpt3-1.3b`` or ``gpt-tiny``.
    seq_len : int, optional
        Tokens per sample of :meth:`ZooModel.example_batch`; the context length by default.
    dtype, device
        Parameter dtype and device (``meta``: shapes only, no memory).
    seed : int
        Seed of the weight initialisation.

    Returns
    -------
    ZooModel
        ``blocks + 2`` units: ``embed``, ``block.0`` ... , ``head`` (tied to ``embed``).

    Raises
    ------
    InputError
        If ``seq_len`` is not in ``1 .. ctx``.

    Examples
    --------
    >>> len(build_gpt("gpt1", device="meta").units)
    14
    """
    cfg = CONFIGS[name]
    seq = cfg.ctx if seq_len is None else seq_len
    if not 1 <= seq <= cfg.ctx:
        raise InputError("-", "seq_len", f"model {name!r} takes 1 to {cfg.ctx} tokens per sample, got {seq}")
    device = torch.device(device)
    with seeded_build(seed, device):
        embed = Embedding(cfg)
        blocks = [Block(cfg) for _ in range(cfg.blocks)]
        head = Head(cfg, embed.wte)
        for module in (embed, *blocks, head):
            module.apply(_init_weights)
            module.to(dtype)
    units = [Unit("embed", embed, (-1,))]
    units += [Unit(f"block.{i}", block, (i,)) for i, block in enumerate(blocks)]
    units.append(Unit("head", head, (len(units) - 1,), tied_to=0))

    def batch(n: int, seed: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return token_batch(n, seed, dev, seq_len=seq, vocab=cfg.vocab)

    config = {**asdict(cfg), "seq_len": seq, "dtype": str(dtype).removeprefix("torch.")}
    return ZooModel(name, units, batch, token_loss, input_bytes_per_sample=8 * seq,
                    device=device, config=config)
