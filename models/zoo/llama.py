"""Llama-style decoder-only transformers: token embedding, one unit per decoder layer, norm plus output head.

The layers are Llama 2/3's: RMSNorm before each sub-layer, grouped-query attention with
rotary position embeddings, a SwiGLU MLP; the output projection is a weight of its own
(untied).  ``llama3-70b`` has Llama 3 70B's sizes (80 x 8192, 64 query heads, 8 key/value
heads, MLP 28672, vocabulary 128256: 70.6B parameters); build it on the ``meta`` device
(``pipeplan profile llama3-70b --analytic``), which allocates no weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from pipeplan.models.errors import InputError
from pipeplan.models.zoo.base import Unit, ZooModel, seeded_build, token_batch, token_loss


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a Llama model."""

    layers: int
    """Number of decoder layers."""
    d_model: int
    """Hidden size."""
    heads: int
    """Query heads (``d_model`` must be a multiple)."""
    kv_heads: int
    """Key/value heads (grouped-query attention; ``heads`` must be a multiple)."""
    ffn: int
    """Hidden units of the SwiGLU MLP."""
    vocab: int
    """Vocabulary size."""
    ctx: int
    """Longest sequence (the default tokens per sample)."""
    rope_theta: float = 500000.0
    """Base of the rotary embedding's frequencies."""


CONFIGS: dict[str, LlamaConfig] = {
    "llama3-70b": LlamaConfig(layers=80, d_model=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, ctx=4096),
    "llama-tiny": LlamaConfig(layers=2, d_model=32, heads=4, kv_heads=2, ffn=64, vocab=64, ctx=16),
}


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of ``x`` (``n, heads, s, head_dim``), computed from the positions."""
    s, half = x.shape[-2], x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention with rotary embeddings (``FlopCounterMode`` counts the fused attention)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.theta = cfg.heads, cfg.kv_heads, cfg.rope_theta
        head_dim = cfg.d_model // cfg.heads
        self.wq = nn.Linear(cfg.d_model, cfg.heads * head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, d = x.shape
        hd = d // self.heads
        q = _rotate(self.wq(x).view(n, s, -1, hd).transpose(1, 2), self.theta)
        k = _rotate(self.wk(x).view(n, s, -1, hd).transpose(1, 2), self.theta)
        v = self.wv(x).view(n, s, -1, hd).transpose(1, 2)
        # fused attention, as Llama trainers run it: no s x s scores are saved (flash attention on a GPU, its CPU
        # kernel on the CPU); on the meta device torch would pick its unfused math kernel, so the CPU one is named
        if x.device.type == "meta":
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)[0]
        else:
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(n, s, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: attention and SwiGLU MLP, each with a residual."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Output(nn.Module):
    """Final RMSNorm, then the output projection to the vocabulary."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.output = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


def build_llama(name: str, *, seq_len: int | None = None, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build the Llama called ``name`` (a key of :data:`CONFIGS`).

    Parameters
    ----------
    name : str
        ``llama3-70b`` or ``llama-tiny``.
    seq_len : int, optional
        Tokens per sample of :meth:`ZooModel.example_batch`; the config's ``ctx`` by default.
    dtype, device
        Parameter dtype and device (``meta``: shapes only, no memory).
    seed : int
        Seed of the weight initialisation.

    Returns
    -------
    ZooModel
        ``layers + 2`` units: ``embed``, ``layer.0`` ..., ``head``.

    Raises
    ------
    InputError
        If ``seq_len`` is not in ``1 .. ctx``.

    Examples
    --------
    >>> build_llama("llama3-70b", device="meta").num_parameters()
    70553706496
    """
    cfg = CONFIGS[name]
    seq = cfg.ctx if seq_len is None else seq_len
    if not 1 <= seq <= cfg.ctx:
        raise InputError("-", "seq_len", f"model {name!r} takes 1 to {cfg.ctx} tokens per sample, got {seq}")
    device = torch.device(device)
    with seeded_build(seed, device):
        embed = nn.Embedding(cfg.vocab, cfg.d_model)
        layers = [DecoderLayer(cfg) for _ in range(cfg.layers)]
        head = Output(cfg)
        for module in (embed, *layers, head):
            for sub in module.modules():
                if isinstance(sub, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(sub.weight, 0.0, 0.02)
            module.to(dtype)
    units = [Unit("embed", embed, (-1,))]
    units += [Unit(f"layer.{i}", layer, (i,)) for i, layer in enumerate(layers)]
    units.append(Unit("head", head, (len(units) - 1,)))

    def batch(n: int, seed: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return token_batch(n, seed, dev, seq_len=seq, vocab=cfg.vocab)

    config = {**asdict(cfg), "seq_len": seq, "dtype": str(dtype).removeprefix("torch.")}
    return ZooModel(name, units, batch, token_loss, input_bytes_per_sample=8 * seq, device=device, config=config)
