"""The layer graph: a model as a DAG of layers with per-layer costs (``pipeplan.graph/1``, ``/2`` and ``/3``).

Version 2 (spec section 7.1) adds three optional layer fields: ``bwd_w`` (the
weight-gradient part of ``bwd``), ``act_w`` (saved bytes the weight gradient still
needs) and ``step`` (optimizer-step seconds).  A graph is written as ``/1`` when no
layer carries them, and a ``/1`` file is read without them even if it has fields of
those names (they are kept as unknown fields).  Version 3 (docs/model.md section 8)
adds ``tp_share`` and ``tp_comm``: what tensor parallelism divides of a layer and what
it all-reduces; an earlier version's file is read without them.

Layers are kept in the file's topological order; plans refer to them by index and a
stage is a contiguous index range.  The DAG itself is a :class:`networkx.DiGraph`
whose nodes are the layer indices, so graph algorithms come from networkx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import MAX_EXACT_INT, Reader, check_integer, load_json, number_list

GRAPH_FORMAT = "pipeplan.graph/1"
GRAPH_FORMAT_V2 = "pipeplan.graph/2"
GRAPH_FORMAT_V3 = "pipeplan.graph/3"

_LAYER_FIELDS = frozenset({"name", "fwd", "bwd", "params", "act", "out", "tied_to"})
_LAYER_FIELDS_V2 = _LAYER_FIELDS | {"bwd_w", "act_w", "step"}
_LAYER_FIELDS_V3 = _LAYER_FIELDS_V2 | {"tp_share", "tp_comm"}
_GRAPH_FIELDS = frozenset({"format", "name", "input_bytes", "layers", "edges"})


@dataclass(frozen=True)
class Layer:
    """One layer of the model and its costs on the reference device."""

    name: str
    """Unique, human-readable name (``block.11``)."""
    fwd: tuple[float, float]
    """Forward time ``a + b*n`` seconds for ``n`` samples, as ``(a, b)``."""
    bwd: tuple[float, float]
    """Backward time (input and weight gradients) ``a + b*n`` seconds, as ``(a, b)``."""
    params: float
    """Bytes of parameters (shared bytes included for a tied layer)."""
    act: float
    """Bytes per sample kept alive from the forward pass to the backward pass."""
    out: float
    """Bytes per sample of the layer's output tensor."""
    tied_to: int | None = None
    """Index of the layer whose weights this one shares, or ``None``."""
    bwd_w: tuple[float, float] | None = None
    """Weight-gradient part ``(a, b)`` of ``bwd`` (version 2); ``None``: absent, read as ``bwd / 2``."""
    act_w: float | None = None
    """Bytes per sample the weight gradient still needs after the input gradient (version 2); ``None``: ``act``."""
    step: float | None = None
    """Optimizer-step seconds for this layer's parameters on the reference device (version 2); ``None``: 0."""
    tp_share: tuple[float, float, float] | None = None
    """Shares ``(time, params, act)`` that tensor parallelism divides by ``t`` (version 3); ``None``: nothing."""
    tp_comm: tuple[float, float] | None = None
    """Bytes per sample all-reduced among a replica's ``t`` devices in the forward and backward (version 3)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Fields of the file this version does not know; written back unchanged."""

    def fwd_time(self, samples: float) -> float:
        """Forward seconds on the reference device for ``samples`` samples."""
        return self.fwd[0] + self.fwd[1] * samples

    def bwd_time(self, samples: float) -> float:
        """Backward seconds on the reference device for ``samples`` samples."""
        return self.bwd[0] + self.bwd[1] * samples

    @property
    def weight_bwd(self) -> tuple[float, float]:
        """``(a_w, b_w)``: the weight-gradient backward, ``bwd / 2`` when ``bwd_w`` is absent."""
        return self.bwd_w if self.bwd_w is not None else (self.bwd[0] / 2, self.bwd[1] / 2)

    @property
    def input_bwd(self) -> tuple[float, float]:
        """``(a_b - a_w, b_b - b_w)``: the input-gradient backward."""
        a_w, b_w = self.weight_bwd
        return self.bwd[0] - a_w, self.bwd[1] - b_w

    @property
    def act_weight(self) -> float:
        """Bytes per sample kept from the input gradient to the weight gradient (``act`` when absent)."""
        return self.act if self.act_w is None else self.act_w

    @property
    def step_time(self) -> float:
        """Optimizer-step seconds on the reference device (0 when absent)."""
        return 0.0 if self.step is None else self.step

    @property
    def uses_v2(self) -> bool:
        """Whether the layer carries a version-2 field."""
        return self.bwd_w is not None or self.act_w is not None or self.step is not None

    @property
    def uses_v3(self) -> bool:
        """Whether the layer carries a version-3 field (``tp_share``, ``tp_comm``)."""
        return self.tp_share is not None or self.tp_comm is not None

    def tp_factors(self, t: int) -> tuple[float, float, float]:
        """``(tau, pi, alpha)``: ``h(x) = (1 - x) + x / t`` of each share (docs/model.md 8.1); all 1 when ``t == 1``.

        Examples
        --------
        >>> Layer("a", (0, 1), (0, 2), 4, 8, 16, tp_share=(0.8, 1.0, 0.5)).tp_factors(2)
        (0.6, 0.5, 0.75)
        """
        if t == 1:
            return 1.0, 1.0, 1.0
        shares = self.tp_share or (0.0, 0.0, 0.0)
        return tuple((1.0 - x) + x / t for x in shares)  # type: ignore[return-value]

    @property
    def tp_bytes(self) -> tuple[float, float]:
        """``(c_f, c_b)``: bytes per sample all-reduced in the forward and backward (0 when absent)."""
        return self.tp_comm if self.tp_comm is not None else (0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.extra)
        data.update(name=self.name, fwd=list(self.fwd), bwd=list(self.bwd),
                    params=self.params, act=self.act, out=self.out)
        if self.tied_to is not None:
            data["tied_to"] = self.tied_to
        if self.bwd_w is not None:
            data["bwd_w"] = list(self.bwd_w)
        if self.act_w is not None:
            data["act_w"] = self.act_w
        if self.step is not None:
            data["step"] = self.step
        if self.tp_share is not None:
            data["tp_share"] = list(self.tp_share)
        if self.tp_comm is not None:
            data["tp_comm"] = list(self.tp_comm)
        return data


class LayerGraph:
    """A model as layers in topological order plus the edges between them.

    Parameters
    ----------
    name : str
        The graph's name (plans name it in their ``graph`` field).
    layers : sequence of Layer
        The layers in a topological order.
    edges : sequence of (int, int), optional
        ``(u, v)``: layer ``v`` consumes the output of layer ``u``; ``u < v``.
        ``None`` means the chain ``0 -> 1 -> ... -> L-1``.
    input_bytes : float
        Bytes per sample of the model's input batch.
    extra : dict, optional
        Unknown top-level fields, preserved on save.

    Raises
    ------
    InputError
        If an edge is not ``u < v`` between existing layers, or names repeat.

    Examples
    --------
    >>> g = LayerGraph.chain("toy", [Layer("a", (0, 1), (0, 2), 4, 8, 16),
    ...                              Layer("b", (0, 1), (0, 2), 4, 8, 32)], input_bytes=4)
    >>> g.cut_bytes(0)
    16.0
    """

    def __init__(self, name: str, layers: list[Layer] | tuple[Layer, ...],
                 edges: list[tuple[int, int]] | tuple[tuple[int, int], ...] | None = None,
                 input_bytes: float = 0.0, extra: dict[str, Any] | None = None,
                 file: str = "-") -> None:
        self.name = name
        self.layers: tuple[Layer, ...] = tuple(layers)
        self.input_bytes = float(input_bytes)
        self.extra = dict(extra or {})
        self.explicit_edges = edges is not None
        n = len(self.layers)
        if n == 0:
            raise InputError(file, "layers", "a graph needs at least one layer")
        if edges is None:
            edges = [(i, i + 1) for i in range(n - 1)]
        self.edges: tuple[tuple[int, int], ...] = tuple((int(u), int(v)) for u, v in edges)
        for i, (u, v) in enumerate(self.edges):
            _check_edge(u, v, n, file, f"edges[{i}]")
        seen: dict[str, int] = {}
        for i, layer in enumerate(self.layers):
            if layer.name in seen:
                raise InputError(file, f"layers[{i}].name",
                                 f"name {layer.name!r} is also used by layer {seen[layer.name]}; names must be unique")
            seen[layer.name] = i
            if layer.tied_to is not None and not (0 <= layer.tied_to < n and layer.tied_to != i):
                raise InputError(file, f"layers[{i}].tied_to",
                                 f"must be the index of another layer (0..{n - 1}), got {layer.tied_to}")

    # ----------------------------------------------------------------- building
    @classmethod
    def chain(cls, name: str, layers: list[Layer], input_bytes: float = 0.0) -> "LayerGraph":
        """A chain graph ``0 -> 1 -> ... -> L-1``."""
        return cls(name, layers, None, input_bytes)

    @classmethod
    def from_dict(cls, data: Any, file: str = "-") -> "LayerGraph":
        """Read a ``pipeplan.graph/1`` object; see :func:`load_graph`."""
        top = Reader(data, file, "")
        version = top.format(GRAPH_FORMAT, GRAPH_FORMAT_V2, GRAPH_FORMAT_V3)
        version2, version3 = version != GRAPH_FORMAT, version == GRAPH_FORMAT_V3
        name = top.string("name")
        input_bytes = top.number("input_bytes")
        raw_layers = top.array("layers", nonempty=True)
        layers = [_read_layer(item, file, f"layers[{i}]", version2, version3)
                  for i, item in enumerate(raw_layers)]
        edges = None
        if top.has("edges"):
            edges = [_read_edge(item, len(layers), file, f"edges[{i}]")
                     for i, item in enumerate(top.array("edges"))]
        return cls(name, layers, edges, input_bytes, top.extras(_GRAPH_FIELDS), file)

    def to_dict(self) -> dict[str, Any]:
        """The graph's object in the lowest version whose fields it uses (:attr:`format`; unknown fields kept)."""
        data: dict[str, Any] = dict(self.extra)
        data.update({"format": self.format, "name": self.name, "input_bytes": self.input_bytes,
                     "layers": [layer.to_dict() for layer in self.layers]})
        if self.explicit_edges:
            data["edges"] = [list(e) for e in self.edges]
        return data

    # ----------------------------------------------------------------- queries
    @property
    def format(self) -> str:
        """``pipeplan.graph/3`` when a layer carries ``tp_share`` or ``tp_comm``; else ``/2`` when one carries
        ``bwd_w``, ``act_w`` or ``step``; else ``/1``."""
        if any(layer.uses_v3 for layer in self.layers):
            return GRAPH_FORMAT_V3
        return GRAPH_FORMAT_V2 if any(layer.uses_v2 for layer in self.layers) else GRAPH_FORMAT

    def __len__(self) -> int:
        return len(self.layers)

    @cached_property
    def dag(self) -> nx.DiGraph:
        """The graph as a networkx DiGraph over layer indices, with layer attributes."""
        g = nx.DiGraph(name=self.name)
        for i, layer in enumerate(self.layers):
            g.add_node(i, name=layer.name, fwd=layer.fwd, bwd=layer.bwd,
                       params=layer.params, act=layer.act, out=layer.out)
        g.add_edges_from(self.edges)
        return g

    @cached_property
    def _cut_bytes(self) -> tuple[float, ...]:
        # Layer u crosses every cut c with u <= c < (its last consumer).  Each cut is
        # summed afresh with fsum: a running sum would leave rounding residue (a cut
        # that should carry 0 bytes showing -1e-7) after large values enter and leave.
        last = {u: max(self.dag.successors(u)) for u in self.dag.nodes if self.dag.out_degree(u)}
        return tuple(
            math.fsum(self.layers[u].out for u, v in last.items() if u <= c < v)
            for c in range(len(self.layers) - 1)
        )

    def cut_bytes(self, c: int) -> float:
        """Bytes per sample crossing the cut after layer ``c``.

        The sum of ``out`` over the distinct layers ``u <= c`` with a consumer
        ``v > c``; a tensor skipping several stages is relayed across every cut.

        Raises
        ------
        IndexError
            If ``c`` is not in ``0 .. L-2``.
        """
        if not 0 <= c < len(self.layers) - 1:
            raise IndexError(f"cut after layer {c} does not exist in a graph of {len(self.layers)} layers")
        return self._cut_bytes[c]

    def stage_input_bytes(self, lo: int) -> float:
        """Input bytes per sample of a stage starting at layer ``lo``."""
        return self.input_bytes if lo == 0 else self._cut_bytes[lo - 1]

    def range_sum(self, attribute: str, lo: int, hi: int) -> float:
        """Sum of ``attribute`` (``params``, ``act``, ``out``) over layers ``lo <= i < hi``."""
        return float(sum(getattr(layer, attribute) for layer in self.layers[lo:hi]))

    def range_time(self, lo: int, hi: int) -> tuple[float, float, float, float]:
        """Summed ``(a_f, b_f, a_b, b_b)`` over layers ``lo <= i < hi``."""
        af = bf = ab = bb = 0.0
        for layer in self.layers[lo:hi]:
            af += layer.fwd[0]
            bf += layer.fwd[1]
            ab += layer.bwd[0]
            bb += layer.bwd[1]
        return af, bf, ab, bb

    def range_weight_time(self, lo: int, hi: int) -> tuple[float, float]:
        """Summed weight-gradient ``(a_w, b_w)`` over layers ``lo <= i < hi`` (spec 7.1 defaults applied)."""
        a_w = b_w = 0.0
        for layer in self.layers[lo:hi]:
            a, b = layer.weight_bwd
            a_w += a
            b_w += b
        return a_w, b_w

    def range_act_weight(self, lo: int, hi: int) -> float:
        """``Aw``: summed ``act_w`` (``act`` where absent) over layers ``lo <= i < hi``."""
        return float(sum(layer.act_weight for layer in self.layers[lo:hi]))

    def range_step(self, lo: int, hi: int) -> float:
        """Summed optimizer-step seconds (reference device) over layers ``lo <= i < hi``."""
        return float(sum(layer.step_time for layer in self.layers[lo:hi]))

    def tensor_parallel_sums(self, lo: int, hi: int, t: int) -> "TensorParallelSums":
        """What one device of a degree-``t`` replica holds and runs of layers ``lo <= i < hi`` (docs/model.md 8.3, 8.4).

        Every coefficient and size is scaled by its layer's factor (:meth:`Layer.tp_factors`)
        before it is summed; the collectives are counted and their bytes summed.
        """
        sums = [0.0] * 10
        fwd_bytes = bwd_bytes = 0.0
        fwd_calls = bwd_calls = 0
        for layer in self.layers[lo:hi]:
            tau, pi, alpha = layer.tp_factors(t)
            a_w, b_w = layer.weight_bwd
            for i, (x, f) in enumerate(((layer.fwd[0], tau), (layer.fwd[1], tau), (layer.bwd[0], tau),
                                        (layer.bwd[1], tau), (a_w, tau), (b_w, tau), (layer.params, pi),
                                        (layer.act, alpha), (layer.act_weight, alpha), (layer.step_time, pi))):
                sums[i] += x * f
            c_f, c_b = layer.tp_bytes
            fwd_bytes += c_f
            bwd_bytes += c_b
            fwd_calls += c_f > 0
            bwd_calls += c_b > 0
        return TensorParallelSums(*sums, fwd_bytes, fwd_calls, bwd_bytes, bwd_calls)

    def unique_params(self) -> float:
        """Parameter bytes counting tied weights once."""
        return float(sum(layer.params for layer in self.layers if layer.tied_to is None))


@dataclass(frozen=True)
class TensorParallelSums:
    """Per-device sums over a layer range of a degree-``t`` stage (:meth:`LayerGraph.tensor_parallel_sums`)."""

    af: float
    """Sum of ``fwd[0] * tau``."""
    bf: float
    """Sum of ``fwd[1] * tau``."""
    ab: float
    """Sum of ``bwd[0] * tau``."""
    bb: float
    """Sum of ``bwd[1] * tau``."""
    aw: float
    """Sum of ``bwd_w[0] * tau`` (``bwd / 2`` where absent)."""
    bw: float
    """Sum of ``bwd_w[1] * tau``."""
    params: float
    """``P'``: sum of ``params * pi``."""
    act: float
    """``A``: sum of ``act * alpha``."""
    act_w: float
    """``Aw``: sum of ``act_w * alpha``."""
    step: float
    """Sum of ``step * pi``."""
    fwd_bytes: float
    """Sum of ``c_f``: bytes per sample all-reduced in the forward."""
    fwd_calls: int
    """Layers with ``c_f > 0`` (each pays one collective's latency)."""
    bwd_bytes: float
    """Sum of ``c_b``."""
    bwd_calls: int
    """Layers with ``c_b > 0``."""


def _check_edge(u: int, v: int, n: int, file: str, where: str) -> None:
    if not (0 <= u < n and 0 <= v < n):
        raise InputError(file, where, f"edge [{u}, {v}] names a layer that does not exist (layers are 0..{n - 1})")
    if u >= v:
        raise InputError(file, where, f"edge [{u}, {v}] must go forward (u < v): layers are listed in topological order")


def _read_layer(item: Any, file: str, where: str, version2: bool = False, version3: bool = False) -> Layer:
    r = Reader(item, file, where)
    tied = None
    if r.has("tied_to") and r.raw("tied_to") is not None:
        tied = r.integer("tied_to", minimum=0, maximum=MAX_EXACT_INT)
    bwd = number_list(r.raw("bwd"), file, r.path("bwd"), 2)
    act = r.number("act")
    bwd_w = act_w = step = None
    if version2:
        bwd_w, act_w, step = _read_v2_fields(r, bwd, act)
    tp_share = tp_comm = None
    if version3:
        tp_share, tp_comm = _read_v3_fields(r)
    known = _LAYER_FIELDS_V3 if version3 else _LAYER_FIELDS_V2 if version2 else _LAYER_FIELDS
    return Layer(
        name=r.string("name"),
        fwd=number_list(r.raw("fwd"), file, r.path("fwd"), 2),  # type: ignore[arg-type]
        bwd=bwd,  # type: ignore[arg-type]
        params=r.number("params"),
        act=act,
        out=r.number("out"),
        tied_to=tied,
        bwd_w=bwd_w,
        act_w=act_w,
        step=step,
        tp_share=tp_share,  # type: ignore[arg-type]
        tp_comm=tp_comm,  # type: ignore[arg-type]
        extra=r.extras(known),
    )


def _read_v3_fields(r: Reader) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``tp_share`` (three shares in [0, 1]) and ``tp_comm`` (two byte counts >= 0) of a version-3 layer."""
    share = None
    if r.has("tp_share"):
        share = number_list(r.raw("tp_share"), r.file, r.path("tp_share"), 3)
        for i, (x, what) in enumerate(zip(share, ("time", "params", "act"))):
            if x > 1:
                raise InputError(r.file, f"{r.path('tp_share')}[{i}]",
                                 f"the share of the layer's {what} that tensor parallelism divides is {x!r}; a share "
                                 f"is between 0 and 1 (tp_share = [time, params, act])")
    comm = number_list(r.raw("tp_comm"), r.file, r.path("tp_comm"), 2) if r.has("tp_comm") else None
    return share, comm


def _read_v2_fields(r: Reader, bwd: tuple[float, ...], act: float
                    ) -> tuple[tuple[float, float] | None, float | None, float | None]:
    """``bwd_w``, ``act_w`` and ``step`` of a version-2 layer, each checked against its bound."""
    bwd_w = None
    if r.has("bwd_w"):
        bwd_w = number_list(r.raw("bwd_w"), r.file, r.path("bwd_w"), 2)
        for i, (part, whole) in enumerate(zip(bwd_w, bwd)):
            if part > whole:
                raise InputError(r.file, f"{r.path('bwd_w')}[{i}]",
                                 f"the weight-gradient part {part!r} exceeds bwd[{i}] = {whole!r}; "
                                 f"bwd_w is the part of bwd spent on weight gradients, so it is at most bwd")
    act_w = r.number("act_w") if r.has("act_w") else None
    if act_w is not None and act_w > act:
        raise InputError(r.file, r.path("act_w"), f"{act_w!r} bytes exceed act = {act!r}; act_w is the part of "
                                                   f"the saved activations the weight gradient still needs")
    step = r.number("step") if r.has("step") else None
    return bwd_w, act_w, step  # type: ignore[return-value]


def _read_edge(item: Any, n: int, file: str, where: str) -> tuple[int, int]:
    if not isinstance(item, list) or len(item) != 2:
        raise InputError(file, where, "an edge is a list [u, v] of two layer indices")
    u = check_integer(item[0], file, f"{where}[0]", maximum=MAX_EXACT_INT)
    v = check_integer(item[1], file, f"{where}[1]", maximum=MAX_EXACT_INT)
    _check_edge(u, v, n, file, where)
    return u, v


def load_graph(path: str) -> LayerGraph:
    """Load a ``pipeplan.graph/1`` or ``/2`` file.

    Raises
    ------
    InputError
        On a missing file, invalid JSON, a missing or mistyped field, an unknown
        format version, a negative cost, or an edge that is not ``u < v``.
    """
    return LayerGraph.from_dict(load_json(path), str(path))
