"""Replay a run: the simulator's timeline fed with the op times the run measured.

A prediction can miss for two reasons: the op costs (the profile, measured per unit
in isolation) are off, or the timeline (the spec's dependencies, links and
schedule) is.  Replaying splits the two: every stage's forward and backward time is
replaced by what the run measured for that op, and :func:`pipeplan.solver.simulator.run_timeline`
recomputes the iteration with everything else as predicted (transfer times from the
cluster's links, all-reduce times, the op order).  ``measured / replayed`` is then the
timeline's error alone; ``replayed / predicted`` the op costs'.

An op's measured time is its compute (the recompute included) plus the CPU time
the rank spends on the messages next to it, which the spec does not charge: posting
the op's sends (their median span) and taking in its receives (their CPU part,
see :func:`op_seconds`).  Replicas of a stage run the same op: the slowest one counts,
as in the spec.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace

from pipeplan.solver.simulator import SimulationResult, run_timeline


FORWARD_LABELS = ("recv A", "F", "send A")
"""What a microbatch's forward costs a rank: taking in its activations, the forward, posting them on."""

BACKWARD_LABELS = ("recv G", "R", "B", "send G")
"""What its backward costs: taking in the gradients, the recompute, the backward, posting them on."""


def op_seconds(rank: dict, steps: list[int]) -> dict[str, float]:
    """``label -> seconds`` of one rank: medians over ``steps``; receives by their CPU part.

    A receive's span holds the wait for its data.  Its CPU part is what the run
    recorded under ``receive_cpu`` (the tcp transport times the system calls that
    moved the message, and the executor the unpacking); without it (``--transport
    dist``), the shortest span of the same direction (any microbatch, any step: one
    the data had beaten) stands for it, which overcounts where every receive waits.
    """
    spans: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    for i in steps:
        record = rank["steps"][i]
        for kind, label, a, b in record["events"]:
            spans[label].append(b - a)
        for label, seconds in record.get("receive_cpu", {}).items():
            cpu[label].append(seconds)
    shortest = {direction: min((min(t) for label, t in spans.items() if label.startswith(direction)), default=0.0)
                for direction in ("recv A", "recv G")}

    def seconds(label: str, times: list[float]) -> float:
        if not label.startswith("recv "):
            return statistics.median(times)
        return statistics.median(cpu[label]) if cpu.get(label) else shortest[label[:6]]

    return {label: seconds(label, times) for label, times in spans.items()}


def replayed_durations(ranks: list[dict], steps: list[int], prediction: SimulationResult) -> list[dict]:
    """Per stage, ``{"fwd", "bwd", "recompute"}`` tuples of measured seconds by microbatch."""
    per_stage: list[list[dict[str, float]]] = [[] for _ in prediction.stages]
    for r in ranks:
        per_stage[r["stage"]].append(op_seconds(r, steps))
    out = []
    for cost, replicas in zip(prediction.stages, per_stage):
        count = len(cost.sizes)

        def slowest(*labels: str, k: int) -> float:
            return max(sum(seen.get(f"{label}{k}", 0.0) for label in labels) for seen in replicas)

        out.append({"fwd": tuple(slowest(*FORWARD_LABELS, k=k) for k in range(count)),
                    "bwd": tuple(slowest(*BACKWARD_LABELS, k=k) for k in range(count)),
                    "recompute": tuple(slowest("R", k=k) for k in range(count))})
    return out


def replay(ranks: list[dict], steps: list[int], prediction: SimulationResult) -> SimulationResult:
    """The timeline of ``prediction`` with every op taking its measured time.

    Parameters
    ----------
    ranks : list of dict
        The run's per-rank records (``stage``, and ``steps`` with their events).
    steps : list of int
        The measured steps (after warm-up).
    prediction : SimulationResult
        The simulator's result for the same plan, graph and cluster.

    Returns
    -------
    SimulationResult
        Its ``iteration_time`` is the replayed iteration time.

    Examples
    --------
    See ``tests/test_replay.py``.
    """
    durations = replayed_durations(ranks, steps, prediction)
    costs = tuple(replace(cost, **d) for cost, d in zip(prediction.stages, durations))
    return run_timeline(costs, prediction.global_batch)

