"""One model measured on two kinds of device: the speed of the second relative to the first,
layer by layer, and how far one scalar ``speed`` (the spec's simplification) is from them.

For layer ``i`` at ``n`` samples, with ``t(i) = fwd(n) + bwd(n)``, the ratio is
``t_ref(i) / t_other(i)`` (above 1: the other device is faster).  The ``total`` ratio,
``sum t_ref / sum t_other``, is the one scalar that gives the whole model's time exactly;
a stage holding only some layers sees the ratio of its own layers instead.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.cluster import Cluster

STATISTICS = ("total", "median")
"""Scalars a cluster may take as a kind's speed."""

WIDE_SPREAD = 0.2
"""A coefficient of variation of the per-layer ratios above this makes one speed misleading."""


@dataclass(frozen=True)
class SpeedComparison:
    """Per-layer and summary speed ratios of one graph against another."""

    samples: int
    """Samples per replica the layer times are taken at."""
    names: tuple[str, ...]
    """Layer names."""
    reference_times: tuple[float, ...]
    """Seconds of forward plus backward per layer on the reference device."""
    other_times: tuple[float, ...]
    """The same on the other device."""
    ratios: tuple[float | None, ...]
    """``reference / other`` per layer; ``None`` where either time is zero (no ratio)."""
    total: float
    """``sum reference / sum other``: the whole model's speed ratio."""
    median: float
    """Median of the per-layer ratios."""
    minimum: float
    """Smallest per-layer ratio."""
    maximum: float
    """Largest per-layer ratio."""
    cv: float
    """Coefficient of variation (population standard deviation / mean) of the per-layer ratios."""
    weighted_cv: float
    """The same with each layer weighted by its share of the reference time: a layer that
    takes no time hardly matters to a plan, whatever its ratio."""

    @property
    def wide(self) -> bool:
        """Whether the time-weighted ratios spread too widely for one speed (:data:`WIDE_SPREAD`)."""
        return self.weighted_cv > WIDE_SPREAD

    def speed(self, statistic: str) -> float:
        """The scalar named ``statistic`` (one of :data:`STATISTICS`)."""
        if statistic not in STATISTICS:
            raise InputError("-", "--statistic", f"unknown statistic {statistic!r}; valid: {', '.join(STATISTICS)}")
        return self.total if statistic == "total" else self.median

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready summary with the per-layer rows."""
        return {"samples": self.samples, "total": self.total, "median": self.median, "min": self.minimum,
                "max": self.maximum, "cv": self.cv, "weighted_cv": self.weighted_cv, "wide_spread": self.wide,
                "layers": [{"name": n, "reference": r, "other": o, "ratio": q}
                           for n, r, o, q in zip(self.names, self.reference_times, self.other_times, self.ratios)]}


def compare_speeds(reference: LayerGraph, other: LayerGraph, samples: int, *, reference_file: str = "-",
                   other_file: str = "-") -> SpeedComparison:
    """The speed of the device ``other`` was measured on, relative to ``reference``'s.

    Parameters
    ----------
    reference, other : LayerGraph
        The same model (same layers, same names, in order) measured on two devices.
    samples : int
        Samples per replica the times are compared at (``a + b*n``, ``n = samples``).
    reference_file, other_file : str
        Their files, for error messages.

    Returns
    -------
    SpeedComparison

    Raises
    ------
    InputError
        If the graphs' layers differ in number or name, ``samples < 1``, or no layer takes
        time on both devices.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer
    >>> ref = LayerGraph.chain("m", [Layer("a", (0, 1), (0, 2), 0, 0, 0), Layer("b", (0, 1), (0, 1), 0, 0, 0)])
    >>> slow = LayerGraph.chain("m", [Layer("a", (0, 2), (0, 4), 0, 0, 0), Layer("b", (0, 1), (0, 1), 0, 0, 0)])
    >>> c = compare_speeds(ref, slow, 1)
    >>> c.ratios, c.total, c.median
    ((0.5, 1.0), 0.625, 0.75)
    """
    if samples < 1:
        raise InputError("-", "--samples", f"must be at least 1, got {samples}")
    if len(reference) != len(other):
        raise InputError(other_file, "layers", f"has {len(other)} layers, {reference_file} has {len(reference)}: "
                                               "compare graphs of the same model, profiled the same way")
    for i, (a, b) in enumerate(zip(reference.layers, other.layers)):
        if a.name != b.name:
            raise InputError(other_file, f"layers[{i}].name", f"is {b.name!r}, {reference_file} has {a.name!r} "
                                                              "there: compare graphs of the same model")
    ref_t = tuple(layer.fwd_time(samples) + layer.bwd_time(samples) for layer in reference.layers)
    oth_t = tuple(layer.fwd_time(samples) + layer.bwd_time(samples) for layer in other.layers)
    ratios = tuple(r / o if r > 0 and o > 0 else None for r, o in zip(ref_t, oth_t))
    known = [q for q in ratios if q is not None]
    if not known:
        raise InputError(other_file, "layers", f"no layer takes time on both devices at {samples} samples: "
                                               "no ratio to take")
    mean = statistics.fmean(known)
    return SpeedComparison(samples, tuple(layer.name for layer in reference.layers), ref_t, oth_t, ratios,
                           sum(ref_t) / sum(oth_t), statistics.median(known), min(known), max(known),
                           statistics.pstdev(known) / mean, _weighted_cv(ratios, ref_t))


def _weighted_cv(ratios: tuple[float | None, ...], weights: tuple[float, ...]) -> float:
    pairs = [(q, w) for q, w in zip(ratios, weights) if q is not None]
    total = sum(w for _, w in pairs)
    mean = sum(q * w for q, w in pairs) / total
    return math.sqrt(sum(w * (q - mean) ** 2 for q, w in pairs) / total) / mean


def set_kind_speed(cluster: Cluster, kind: str, ratio: float, reference_kind: str | None, *,
                   file: str = "-", note: str = "") -> Cluster:
    """``cluster`` with every device of ``kind`` at ``ratio`` times the speed of ``reference_kind``.

    Devices carry their kind in a ``kind`` field (``pipeplan cluster`` writes it).  The
    reference kind's speed is that of its devices in the cluster, or 1 when it has none
    there and the cluster was derived from it (its ``derived.reference``).

    Parameters
    ----------
    cluster : Cluster
    kind : str
        The kind the other graph was measured on.
    ratio : float
        Its speed relative to ``reference_kind`` (:meth:`SpeedComparison.speed`).
    reference_kind : str or None
        The kind the reference graph was measured on; ``None``: the cluster's
        ``derived.reference``.
    file : str
        The cluster's file, for error messages.
    note : str
        Stored in each changed device's ``speed_source`` field.

    Returns
    -------
    Cluster

    Raises
    ------
    InputError
        If no device has ``kind``, the reference kind is unknown or its devices disagree
        on their speed.
    """
    kinds = sorted({str(d.extra.get("kind")) for d in cluster.devices if "kind" in d.extra})
    if not any(d.extra.get("kind") == kind for d in cluster.devices):
        raise InputError(file, "devices", f"no device of kind {kind!r}; kinds here: {', '.join(kinds) or 'none'} "
                                          "(a device's kind is its 'kind' field)")
    derived = cluster.extra.get("derived")
    cluster_reference = derived.get("reference") if isinstance(derived, dict) else None
    reference_kind = reference_kind or cluster_reference
    if reference_kind is None:
        raise InputError(file, "derived.reference", "the cluster does not say which kind has speed 1: "
                                                    "name the reference graph's kind with --reference-kind")
    speeds = {d.speed for d in cluster.devices if d.extra.get("kind") == reference_kind}
    if len(speeds) > 1:
        raise InputError(file, "devices", f"devices of kind {reference_kind!r} have different speeds "
                                          f"({', '.join(f'{s:g}' for s in sorted(speeds))}): no one reference")
    if not speeds and reference_kind != cluster_reference:
        raise InputError(file, "devices", f"no device of kind {reference_kind!r} and it is not the cluster's "
                                          f"reference ({cluster_reference!r}); kinds here: {', '.join(kinds)}")
    base = speeds.pop() if speeds else 1.0
    devices = tuple(replace(d, speed=base * ratio, extra={**d.extra, "speed_source": note})
                    if d.extra.get("kind") == kind else d for d in cluster.devices)
    return Cluster(cluster.name, cluster.servers, cluster.network, devices, cluster.extra)
