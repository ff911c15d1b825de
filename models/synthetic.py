"""Seeded synthetic layer graphs ("simulation networks") with controlled costs.

Per layer ``i`` a uniform draw ``u_i`` in ``[-1, 1]`` sets its relative weight
``w_i = exp(compute_spread * u_i)``: ``compute_spread = 0`` makes all layers equal,
and in general the heaviest layer costs at most ``exp(2 * compute_spread)`` times the
lightest.  Forward time is ``fixed_cost + per_sample_time * w_i * n``; backward is
``backward_ratio`` times the per-sample part with the same fixed cost.  Parameters
scale with ``w_i`` (heavier layers have more weights, as in real networks).
"""

from __future__ import annotations

import math

import numpy as np

from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph


def synthetic_graph(layers: int, seed: int, *, compute_spread: float = 0.5, fixed_cost: float = 1e-4,
                    act_bytes: float = 1e6, per_sample_time: float = 1e-3, backward_ratio: float = 2.0,
                    act_spread: float = 0.0, out_bytes: float | None = None, param_bytes: float = 4e7,
                    skips: int = 0, name: str | None = None) -> LayerGraph:
    """A random layer graph; the same arguments give the same graph.

    Parameters
    ----------
    layers : int
        Number of layers (>= 1).
    seed : int
        Seed of the random draws.
    compute_spread : float
        ``>= 0``; per-sample forward time of layer ``i`` is
        ``per_sample_time * exp(compute_spread * u_i)``, ``u_i ~ U[-1, 1]``.
    fixed_cost : float
        Per-call seconds ``a`` of every forward and backward.
    act_bytes : float
        Saved-activation bytes per sample of a layer, times ``exp(act_spread * v_i)``
        with its own draw ``v_i ~ U[-1, 1]``.
    per_sample_time : float
        Per-sample forward seconds of a layer of weight 1.
    backward_ratio : float
        Backward per-sample time over forward per-sample time.
    act_spread : float
        ``>= 0``; spread of the activation bytes (0: all equal).
    out_bytes : float, optional
        Output bytes per sample of every layer (default ``act_bytes / 4``); also the
        graph's ``input_bytes``.
    param_bytes : float
        Parameter bytes of a layer of weight 1 (scaled by ``w_i``).
    skips : int
        Extra random edges ``u -> v`` with ``v >= u + 2`` on top of the chain.
    name : str, optional
        Graph name (default ``synthetic-<layers>-s<seed>``).

    Returns
    -------
    LayerGraph

    Raises
    ------
    InputError
        If a count is not a positive integer or a size is negative or not finite.

    Examples
    --------
    >>> g = synthetic_graph(4, seed=1, compute_spread=0.0, fixed_cost=1e-4, act_bytes=100)
    >>> g.layers[0].fwd, g.layers[0].bwd, g.layers[0].act, g.layers[0].out
    ((0.0001, 0.001), (0.0001, 0.002), 100.0, 25.0)
    """
    _check(layers, skips, compute_spread, fixed_cost, act_bytes, per_sample_time, backward_ratio,
           act_spread, param_bytes, out_bytes)
    rng = np.random.default_rng(seed)
    weights = np.exp(compute_spread * rng.uniform(-1.0, 1.0, layers))
    acts = act_bytes * np.exp(act_spread * rng.uniform(-1.0, 1.0, layers))
    out = act_bytes / 4 if out_bytes is None else out_bytes
    built = [Layer(f"layer.{i}", (fixed_cost, per_sample_time * float(w)),
                   (fixed_cost, backward_ratio * per_sample_time * float(w)),
                   param_bytes * float(w), float(a), float(out))
             for i, (w, a) in enumerate(zip(weights, acts))]
    edges = [(i, i + 1) for i in range(layers - 1)] + _skip_edges(rng, layers, skips)
    return LayerGraph(name or f"synthetic-{layers}-s{seed}", built, sorted(set(edges)), float(out))


def _skip_edges(rng: np.random.Generator, layers: int, skips: int) -> list[tuple[int, int]]:
    # Only layers two or more apart can skip; a graph too short for that has none.
    if skips == 0 or layers < 3:
        return []
    edges = []
    for _ in range(skips):
        u = int(rng.integers(0, layers - 2))
        v = int(rng.integers(u + 2, layers))
        edges.append((u, v))
    return edges


def _check(layers: int, skips: int, *sizes: float | None) -> None:
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise InputError("-", "layers", f"must be a positive integer, got {layers!r}")
    if isinstance(skips, bool) or not isinstance(skips, int) or skips < 0:
        raise InputError("-", "skips", f"must be an integer >= 0, got {skips!r}")
    for value in sizes:
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise InputError("-", "synthetic_graph", f"sizes and spreads must be finite and >= 0, got {value!r}")
