"""Calibrate a cluster's device speeds from measured runs of a probe plan.

A graph profiled here times each unit alone, back to back.  Inside a pipeline the
same ops run slower (a rank that waited computes slower for a while, a message costs
its sender and receiver CPU time the spec does not charge; see the runtime
benchmark in the README), by an amount that is steady for one machine and model.
Calibration measures it: run a probe plan, and for each stage compare what its ops
took (as :mod:`runtime.replay` counts them: compute plus the CPU of the messages
next to it, the slowest replica) with what the simulator predicted for them.  Each
device of the stage gets ``speed / factor``, where ``factor = measured / predicted``
(the median over the probe's runs), so the spec's ``t / speed`` of an op becomes what
the probe measured.  Devices of one stage keep their ratios from the cluster file;
devices the probe plan does not use keep their speed.

The calibrated cluster holds for the graph it was measured with: another model's
ops meet other slowdowns.  Its ``calibration`` field says where it came from.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from runtime.replay import replayed_durations
from solver.cluster import Cluster
from solver.plan import Plan
from solver.simulator import SimulationResult


def stage_factors(ranks: list[dict], steps: list[int], prediction: SimulationResult) -> list[float | None]:
    """Per stage, measured / predicted seconds of all its ops in one iteration.

    Parameters
    ----------
    ranks : list of dict
        The run's per-rank records (``stage``, and ``steps`` with their events).
    steps : list of int
        The measured steps (after warm-up); each op counts with its median.
    prediction : SimulationResult
        The simulator's result for the plan the run executed.

    Returns
    -------
    list of float or None
        ``None`` for a stage whose ops were predicted or measured to take no time
        (nothing to scale).

    Examples
    --------
    See ``tests/test_calibrate.py``.
    """
    factors: list[float | None] = []
    for cost, measured in zip(prediction.stages, replayed_durations(ranks, steps, prediction)):
        predicted = sum(cost.fwd) + sum(cost.bwd)
        took = sum(measured["fwd"]) + sum(measured["bwd"])
        factors.append(took / predicted if predicted > 0 and took > 0 else None)
    return factors


def device_factors(plan: Plan, runs: list[list[float | None]]) -> dict[str, float]:
    """``device -> median factor`` of its stage over the runs (devices of unmeasured stages left out)."""
    out: dict[str, float] = {}
    for s, stage in enumerate(plan.stages):
        seen = [run[s] for run in runs if run[s] is not None]
        if seen:
            out.update({device: statistics.median(seen) for device in stage.devices})
    return out


def calibrated_cluster(cluster: Cluster, factors: dict[str, float], note: dict[str, Any]) -> Cluster:
    """``cluster`` with each device in ``factors`` at ``speed / factor``.

    Parameters
    ----------
    cluster : Cluster
        The cluster the probe ran on (already calibrated ones calibrate further:
        the factors are measured against its own speeds).
    factors : dict
        ``device -> measured / predicted`` (see :func:`device_factors`).
    note : dict
        What the calibration measured (graph, model, plan, runs), stored with the
        factors and the speeds before in the cluster's ``calibration`` field.

    Returns
    -------
    Cluster
        Same name, servers and links; only speeds change.

    Raises
    ------
    ValueError
        If a factor is not a finite positive number.

    Examples
    --------
    >>> from solver.cluster import Device, Link
    >>> c = Cluster("c", (Link(1e11, 1e-6, "s0"),), Link(1e10, 1e-5),
    ...             (Device("g0", "s0", 1.0, 8e9), Device("g1", "s0", 0.5, 8e9)))
    >>> [d.speed for d in calibrated_cluster(c, {"g0": 1.25}, {}).devices]
    [0.8, 0.5]
    """
    for device, factor in factors.items():
        if not 0 < factor < float("inf"):
            raise ValueError(f"device {device!r}: calibration factor must be finite and > 0, got {factor!r}")
    devices = tuple(replace(d, speed=d.speed / factors[d.id]) if d.id in factors else d for d in cluster.devices)
    record = {**note, "factors": dict(factors),
              "speeds_before": {d.id: d.speed for d in cluster.devices if d.id in factors},
              "not_calibrated": [d.id for d in cluster.devices if d.id not in factors]}
    return replace(cluster, devices=devices, extra={**cluster.extra, "calibration": record})
