"""Models a user brings that the zoo does not have, small enough for the test suite.

- ``cnn``: convolutions, ``nn.Flatten`` (its output is a view of its input) and a
  classifier, in an ``nn.Sequential``;
- ``mlp``: a plain ``nn.Sequential`` returned alone (``--input-shape``);
- ``residual``: an embedding, residual blocks ``x + tanh(b(relu(a(x))))`` in an
  ``nn.Sequential`` (``body``) and a ``Linear`` head with a bias on 3-D tokens (its
  output is a view too); automatic units see ``embed, body, head``, the hand-chosen
  ``--units embed,body.0,...,head`` one block per unit;
- ``t5``: a T5 encoder-decoder fed ``input_ids`` and ``decoder_input_ids`` (two
  tensors: it profiles and plans, the runtime takes one input tensor);
- ``branchy_batch``: an ``if`` on a batch-wide mean;
- ``twice_dropout``: a dropout module the forward calls twice (as T5's stacks do);
- ``fails_backward``: a unit whose backward raises (profiling it must say which unit).
"""

import torch
from torch import nn


def cnn(channels: int = 4, classes: int = 5, size: int = 6):
    model = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(channels * size * size, classes))
    return model, lambda n: torch.randn(n, 3, size, size)


def mlp(width: int = 16, depth: int = 3, inputs: int = 8):
    layers = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


class Residual(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.b(torch.relu(self.a(x))))


class ResidualLM(nn.Module):
    def __init__(self, vocab: int, dim: int, blocks: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(*(Residual(dim) for _ in range(blocks)))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def residual(vocab: int = 32, dim: int = 8, blocks: int = 4, seq: int = 5):
    return ResidualLM(vocab, dim, blocks), lambda n: torch.randint(0, vocab, (n, seq))


def t5(vocab: int = 32, seq: int = 5):
    import transformers

    config = transformers.T5Config(num_layers=1, num_decoder_layers=1, d_model=8, d_kv=4, num_heads=2, d_ff=16,
                                   vocab_size=vocab, dropout_rate=0.0, use_cache=False)
    model = transformers.T5ForConditionalGeneration(config)

    def example(n: int):
        return (torch.randint(0, vocab, (n, seq)),), {"decoder_input_ids": torch.randint(0, vocab, (n, seq))}

    return model, example


class BatchIf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.mean() > 0:  # a branch on a statistic of the whole batch
            h = h - h.mean(0)
        return self.c(torch.tanh(self.b(h)))


def branchy_batch():
    model = BatchIf()
    with torch.no_grad():
        model.a.bias.fill_(1.0)  # the branch is taken
    return model, lambda n: torch.randn(n, 4)


class TwiceDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.0)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.drop(self.a(self.drop(x))))


def twice_dropout():
    return TwiceDropout(), lambda n: torch.randn(n, 4)


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("no backward here")


class FailsBackward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


def fails_backward():
    model = FailsBackward()
    inner = model.b.forward
    model.b.forward = lambda x: _NoBackward.apply(inner(x))
    return model, lambda n: torch.randn(n, 4)
