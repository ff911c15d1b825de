"""Which graph layers are the embedding, the decoder blocks and the head of a GPT-like model.

Megatron's layout and torchtitan's module names describe transformers only: an
embedding, a chain of decoder layers and an output head.  A graph whose layers are
named otherwise (or that has skip edges) has no such description.
"""

from __future__ import annotations

import re

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph

EMBEDDING_NAMES = ("embed", "embedding", "embeddings", "tok_embeddings", "wte")
HEAD_NAMES = ("head", "lm_head", "output")
BLOCK_NAME = re.compile(r"^(block|blocks|layer|layers|h|decoder)\.(\d+)$")


def transformer_roles(graph: LayerGraph, file: str, target: str) -> list[str]:
    """``"E"``, ``"t"`` ... ``"t"``, ``"L"``: the role of every layer (Megatron's letters).

    Raises
    ------
    InputError
        If the first layer is no embedding, the last no head, a middle layer no
        decoder block, or the layers are not a chain.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer
    >>> g = LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in ("embed", "block.0", "head")])
    >>> transformer_roles(g, "g.json", "megatron")
    ['E', 't', 'L']
    """
    names = [layer.name for layer in graph.layers]
    if len(names) < 2:
        raise InputError(file, "layers", f"{target} needs an embedding and a head layer; the graph has "
                                         f"{len(names)} layer")
    chain = {(i, i + 1) for i in range(len(names) - 1)}
    if set(graph.edges) != chain:
        extra = sorted(set(graph.edges) - chain)
        raise InputError(file, "edges", f"{target} describes a chain of decoder layers, but the graph has skip "
                                        f"edges {extra[:4]}: export with --to torch")
    if names[0] not in EMBEDDING_NAMES:
        raise InputError(file, "layers[0].name", f"layer 0 {names[0]!r} is not an embedding ({', '.join(EMBEDDING_NAMES)}): "
                                                 f"{target} places the embedding itself; export with --to torch")
    if names[-1] not in HEAD_NAMES:
        raise InputError(file, f"layers[{len(names) - 1}].name", f"the last layer {names[-1]!r} is not a head "
                                                                 f"({', '.join(HEAD_NAMES)}): {target} places the "
                                                                 f"output layer itself; export with --to torch")
    for i, name in enumerate(names[1:-1], start=1):
        if not BLOCK_NAME.match(name):
            raise InputError(file, f"layers[{i}].name", f"layer {i} {name!r} is not a decoder block (block.N): "
                                                        f"{target} cannot place it; export with --to torch")
    return ["E"] + ["t"] * (len(names) - 2) + ["L"]


def block_index(name: str) -> int:
    """``block.3`` -> 3."""
    match = BLOCK_NAME.match(name)
    assert match is not None
    return int(match.group(2))
