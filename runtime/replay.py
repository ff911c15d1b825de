"""Replay a run: the simulator's timeline fed with the op times the run measured.

A prediction can miss for two reasons: the op costs (the profile, measured per unit
in isolation) are off, or the timeline (the spec's dependencies, links and
schedule) is.  Replaying splits the two: every action's time is replaced by what the
run measured for it, and :func:`pipeplan.solver.evaluation.simulator.run_programs`
recomputes the iteration with everything else as predicted (transfer times from the
cluster's links, all-reduce times, the programs).  ``measured / replayed`` is then the
timeline's error alone; ``replayed / predicted`` the op costs'.

An op's measured time is its compute (the recompute included) plus the CPU time
the rank spends on the messages next to it, which the spec does not charge: posting
the op's sends (their median span) and taking in its receives (their CPU part,
see :func:`op_seconds`).  Replicas of a stage run the same op: the slowest one counts,
as in the spec.  A split backward's halves are timed apart: ``I`` with the messages
next to it, ``W`` alone (:func:`program_durations` gives every action of a group's
program its measured time).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace

from pipeplan.solver.evaluation.simulator import Simulation, run_programs


FORWARD_LABELS = ("recv A", "F", "send A")
"""What a microbatch's forward costs a rank: taking in its activations, the forward, posting them on."""

BACKWARD_LABELS = ("recv G", "R", "B", "send G")
"""What its backward costs: taking in the gradients, the recompute, the backward, posting them on."""

ACTION_LABELS = {"F": FORWARD_LABELS, "B": BACKWARD_LABELS, "I": ("recv G", "R", "I", "send G"), "W": ("W",)}
"""What each kind of action costs a rank: an input-gradient ``I`` takes in and sends on
the gradients as ``B`` does; a weight-gradient ``W`` is compute alone."""

MICROBATCH_LABELS = tuple(dict.fromkeys(label for labels in ACTION_LABELS.values() for label in labels))
"""Every label of a microbatch's work on a rank, each once."""


def op_seconds(rank: dict, steps: list[int]) -> dict[str, float]:
    """``label -> seconds`` of one rank: medians over ``steps``; receives by their CPU part.

    A receive's span holds the wait for its data.  Its CPU part is what the run
    recorded under ``receive_cpu`` (the tcp transport times the system calls that
    moved the message, and the executor the unpacking); without it (``--transport
    dist``), the shortest span of the same direction (any microbatch, any step: one
    the data had beaten) stands for it, which overcounts where every receive waits.
    Labels keep their stage prefix (``3:recv G2`` on a rank holding several stages).
    """
    spans: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    for i in steps:
        record = rank["steps"][i]
        for kind, label, a, b in record["events"]:
            spans[label].append(b - a)
        for label, seconds in record.get("receive_cpu", {}).items():
            cpu[label].append(seconds)

    def direction(label: str) -> str:
        return label.rsplit(":", 1)[-1][:6]

    shortest = {d: min((min(t) for label, t in spans.items() if direction(label) == d), default=0.0)
                for d in ("recv A", "recv G")}

    def seconds(label: str, times: list[float]) -> float:
        if not direction(label).startswith("recv "):
            return statistics.median(times)
        return statistics.median(cpu[label]) if cpu.get(label) else shortest[direction(label)]

    return {label: seconds(label, times) for label, times in spans.items()}


def rank_stages(rank: dict) -> list[int]:
    """The stages a rank record holds (a record without ``stages`` holds its ``stage``)."""
    return list(rank.get("stages", [rank["stage"]]))


def stage_prefix(rank: dict) -> str:
    """What a rank's labels of stage ``s`` start with: ``"s:"`` where it holds several stages (see the executor)."""
    return "{}:" if len(rank_stages(rank)) > 1 else ""


def action_seconds(seen: dict[str, float], prefix: str, stage: int, kind: str, k: int) -> float:
    """Measured seconds of one action in one rank's :func:`op_seconds` (0 for what it did not run)."""
    head = prefix.format(stage)
    return sum(seen.get(f"{head}{label}{k}", 0.0) for label in ACTION_LABELS[kind])


def program_durations(ranks: list[dict], steps: list[int], group: int,
                      program: list[tuple[int, str, int]]) -> tuple[float, ...]:
    """Measured seconds of every action of group ``group``'s program: the slowest replica's.

    Parameters
    ----------
    ranks : list of dict
        The run's per-rank records (``group``, ``stages`` and ``steps``).
    steps : list of int
        The measured steps.
    group : int
        The group.
    program : list of (stage, kind, microbatch)
        Its program.

    Returns
    -------
    tuple of float
        One duration per action, in program order.

    Examples
    --------
    See ``tests/test_runtime.py``.
    """
    replicas = [(op_seconds(r, steps), stage_prefix(r)) for r in ranks if r.get("group", r["stage"]) == group]
    return tuple(max(action_seconds(seen, prefix, s, kind, k) for seen, prefix in replicas)
                 for s, kind, k in program)


def program_recompute(ranks: list[dict], steps: list[int], group: int,
                      program: list[tuple[int, str, int]]) -> tuple[float, ...]:
    """Measured recompute seconds of every action of group ``group``'s program (the slowest replica's; 0 for ``F``, ``W``)."""
    replicas = [(op_seconds(r, steps), stage_prefix(r)) for r in ranks if r.get("group", r["stage"]) == group]
    return tuple(max(seen.get(f"{prefix.format(s)}R{k}", 0.0) for seen, prefix in replicas)
                 if kind in ("B", "I") else 0.0 for s, kind, k in program)


def replay(ranks: list[dict], steps: list[int], prediction: Simulation) -> Simulation:
    """The timeline of ``prediction`` with every action taking its measured time.

    Parameters
    ----------
    ranks : list of dict
        The run's per-rank records (``group`` or ``stage``, and ``steps`` with their events).
    steps : list of int
        The measured steps (after warm-up).
    prediction : Simulation
        The simulator's result for the same plan, graph and cluster.

    Returns
    -------
    Simulation
        Its ``iteration_time`` is the replayed iteration time.

    Examples
    --------
    See ``tests/test_replay.py`` and ``tests/test_runtime.py``.
    """
    groups = tuple(replace(cost, durations=program_durations(ranks, steps, g, list(cost.program)),
                           recompute=program_recompute(ranks, steps, g, list(cost.program)))
                   for g, cost in enumerate(prediction.groups))
    return run_programs(replace(prediction.costs, groups=groups))
