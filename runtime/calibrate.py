"""Calibrate a cluster's device speeds from measured runs of a probe plan.

A graph profiled here times each unit alone, back to back.  Inside a pipeline the
same ops run slower (a rank that waited computes slower for a while, a message costs
its sender and receiver CPU time the spec does not charge; see the runtime
benchmark in the README), by an amount that is steady for one machine and model over
minutes, not hours.  Calibration measures it: run a probe plan, and for each device
compare what its ops took (compute plus the CPU of the messages next to them, as
:mod:`pipeplan.runtime.replay` counts them) with what the spec charges those ops at the
device's own speed for the samples it held.  The device gets ``speed / factor``,
where ``factor = measured / charged`` (the median over the probe's runs): the speed
it actually ran at, so that the spec's ``t / speed`` of an op becomes what the probe
measured.  Devices the probe plan does not use, or gives no samples, keep their speed.

The calibrated cluster holds for the graph it was measured with: another model's
ops meet other slowdowns.  Its ``calibration`` field says where it came from.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.replay import MICROBATCH_LABELS, op_seconds, rank_stages, stage_prefix
from pipeplan.runtime.routing import replica_split
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan


def charged_seconds(plan: Plan, graph: LayerGraph, stage: int, replica: int) -> float:
    """Seconds the spec charges one replica's ops in an iteration, on a speed-1 device.

    Only microbatches that give the replica samples count (a replica with none runs
    nothing); each at the replica's own share of samples, not the stage's largest.

    Parameters
    ----------
    plan : Plan
        The probe plan.
    graph : LayerGraph
        Its graph (the ``a + b * n`` fits of forward and backward).
    stage, replica : int
        Which replica: the stage's index and the device's position in it.

    Returns
    -------
    float
        Forward, backward and (with recompute) the forward again, summed over the
        microbatches that give the replica samples.

    Examples
    --------
    See ``tests/test_calibrate.py``.
    """
    st = plan.stages[stage]
    af, bf, ab, bb = graph.range_time(*st.layers)
    total = 0.0
    for n in st.microbatches:
        q = replica_split(n, len(st.devices))[replica]
        if q:
            forward = af + bf * q
            total += forward + ab + bb * q + (forward if st.recompute else 0.0)
    return total


def run_factors(ranks: list[dict], steps: list[int], plan: Plan, graph: LayerGraph,
                cluster: Cluster) -> dict[str, float]:
    """Per device, measured / charged seconds of its ops in one iteration of a run.

    Parameters
    ----------
    ranks : list of dict
        The run's per-rank records (``stage`` or ``stages``, ``device`` or ``replica``, and
        ``steps`` with their events).  A rank of a group with several stages counts
        all of them; a split backward's ``I`` and ``W`` together are charged as the
        spec charges ``B`` (``TI + TW = TB``).
    steps : list of int
        The measured steps (after warm-up); each op counts with its median.
    plan, graph, cluster
        What the run executed; the charge is at each device's speed in ``cluster``.

    Returns
    -------
    dict
        ``device -> factor``; a device whose ops were charged or measured no time
        (no samples) is left out.

    Examples
    --------
    See ``tests/test_calibrate.py``.
    """
    out: dict[str, float] = {}
    for r in ranks:
        device = r["device"] if "device" in r else plan.stages[r["stage"]].devices[r["replica"]]
        seen, prefix = op_seconds(r, steps), stage_prefix(r)
        took = charged = 0.0
        for s in rank_stages(r):  # every stage of the rank's group, its own replica of each
            count = len(plan.stages[s].microbatches)
            head = prefix.format(s)
            took += sum(seen.get(f"{head}{label}{k}", 0.0) for k in range(count) for label in MICROBATCH_LABELS)
            charged += charged_seconds(plan, graph, s, plan.stages[s].devices.index(device))
        charged /= cluster.device_index[device].speed
        if charged > 0 and took > 0:
            out[device] = took / charged
    return out


def device_factors(runs: list[dict[str, float]]) -> dict[str, float]:
    """``device -> median factor`` over the runs that measured it.

    Parameters
    ----------
    runs : list of dict
        Each run's :func:`run_factors`.

    Returns
    -------
    dict
        Devices in the order they first appear.

    Examples
    --------
    >>> device_factors([{"g0": 1.0, "g1": 2.0}, {"g0": 1.2}, {"g0": 5.0}])
    {'g0': 1.2, 'g1': 2.0}
    """
    devices = dict.fromkeys(d for run in runs for d in run)
    return {d: statistics.median(run[d] for run in runs if d in run) for d in devices}


def calibrated_cluster(cluster: Cluster, factors: dict[str, float], note: dict[str, Any]) -> Cluster:
    """``cluster`` with each device in ``factors`` at ``speed / factor``.

    Parameters
    ----------
    cluster : Cluster
        The cluster the probe ran on.  An already calibrated one calibrates further
        (the factors are measured against its own speeds); its earlier records are
        kept in the list ``previous``, oldest first.
    factors : dict
        ``device -> measured / charged`` (see :func:`device_factors`).
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
        If a factor, or a speed it gives, is not a finite positive number.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster import Device, Link
    >>> c = Cluster("c", (Link(1e11, 1e-6, "s0"),), Link(1e10, 1e-5),
    ...             (Device("g0", "s0", 1.0, 8e9), Device("g1", "s0", 0.5, 8e9)))
    >>> [d.speed for d in calibrated_cluster(c, {"g0": 1.25}, {}).devices]
    [0.8, 0.5]
    """
    speeds: dict[str, float] = {}
    for device, factor in factors.items():
        if device not in cluster.device_index:
            raise ValueError(f"device {device!r} has a calibration factor but is not in cluster {cluster.name!r}")
        speed = cluster.device_index[device].speed / factor if 0 < factor < math.inf else math.nan
        if not 0 < speed < math.inf:
            raise ValueError(f"device {device!r}: calibration factor {factor!r} gives speed {speed!r}; both must be "
                             f"finite and > 0 (a device of the cluster whose ops took measurable time)")
        speeds[device] = speed
    devices = tuple(replace(d, speed=speeds[d.id]) if d.id in speeds else d for d in cluster.devices)
    history = _history(cluster.extra.get("calibration"))
    done = factors.keys() | {d for record in history for d in _calibrated_in(record)}
    record = {**note, "factors": dict(factors),
              "speeds_before": {d.id: d.speed for d in cluster.devices if d.id in factors},
              "not_calibrated": [d.id for d in cluster.devices if d.id not in done]}
    if history:
        record["previous"] = history
    return replace(cluster, devices=devices, extra={**cluster.extra, "calibration": record})


def _history(earlier: Any) -> list:
    """The records of an earlier ``calibration`` field, oldest first, as one flat list.

    Flat, because nesting each record in the next would deepen the file with every
    calibration, until the loader refuses it as nested too deeply.  Nothing is dropped:
    a field that is not one of our records (a string, a list, a ``previous`` that is
    not a list) is kept as it was, as one more entry.
    """
    if earlier is None:
        return []
    if not isinstance(earlier, dict):
        return [earlier]
    older = earlier.get("previous", [])
    return [*(older if isinstance(older, list) else [older]), {k: v for k, v in earlier.items() if k != "previous"}]


def _calibrated_in(record: Any) -> list[str]:
    """Devices an earlier record calibrated (a device calibrated in part of the cluster keeps its speed)."""
    factors = record.get("factors") if isinstance(record, dict) else None
    return list(factors) if isinstance(factors, dict) else []
