"""A simulated timeline as a Chrome trace (open it in Perfetto or chrome://tracing).

One process row per device group (named by its stage when every group holds one,
else by its stages and devices) and one per link between groups (named by what it
carries when that is one direction only); times in microseconds.  ``I`` and ``W`` are
events of their own, as are the all-reduce and the optimizer step.
"""

from __future__ import annotations

from typing import Any

import math

from pipeplan.models.errors import InputError
from pipeplan.solver.evaluation.simulator import Simulation

_US = 1e6


def check_traceable(result: Simulation, file: str = "-") -> None:
    """Refuse a timeline whose times in microseconds overflow floating point.

    Raises
    ------
    InputError
        When the iteration time times 1e6 is not finite (the trace's times would be infinite).
    """
    if not math.isfinite(result.iteration_time * _US):
        raise InputError(file, "--trace", f"the iteration time {result.iteration_time:g} s is beyond the float "
                                          f"range in microseconds, the trace's unit; drop --trace or use "
                                          f"realistic costs")


_CATEGORIES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}
_SYNC_NAMES = {"allreduce": "all-reduce", "step": "optimizer step"}


def _row(events: list[dict[str, Any]], pid: int, name: str, order: int) -> None:
    events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
    events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": order}})


def one_stage_per_group(result: Simulation) -> bool:
    """Whether every group holds one stage: rows are then named by their stage (a group's index is its stage's)."""
    return all(len(g.stages) == 1 for g in result.groups)


def link_order(result: Simulation) -> list[tuple[int, int]]:
    """The links the transfers used, each after the lower of its two groups: ``0->1``, ``1->0``, ``1->2`` ..."""
    return sorted({tx.link for tx in result.transfers}, key=lambda l: (min(l), max(l), l[0] > l[1]))


def link_carries(result: Simulation, link: tuple[int, int]) -> str:
    """``"activations"`` or ``"gradients"`` when the link carries one of them only, else ``""``."""
    directions = {tx.direction for tx in result.transfers if tx.link == link}
    return {frozenset({"fwd"}): "activations", frozenset({"bwd"}): "gradients"}.get(frozenset(directions), "")


def chrome_trace(result: Simulation, title: str = "pipeplan") -> dict[str, Any]:
    """The ``{"traceEvents": [...]}`` object for ``result``.

    Rows (``pid``): group ``g`` is ``g``; the links between groups follow from ``1000``,
    in :func:`link_order`.  Each group is shown above the links to and from the next groups.
    """
    events: list[dict[str, Any]] = []
    by_stage = one_stage_per_group(result)
    links = link_order(result)
    rows = []  # (pid, name) top to bottom: each group, then the links to and from the next groups
    for g, cost in enumerate(result.groups):
        rows.append((g, f"stage {cost.stages[0]}" if by_stage else
                     f"group {g} (stages {', '.join(map(str, cost.stages))}; {', '.join(cost.devices)})"))
        for i, (x, y) in enumerate(links):
            if min(x, y) == g:
                carries = link_carries(result, (x, y))
                rows.append((1000 + i, f"link {'' if by_stage else 'group '}{x}->{y}"
                             + (f" ({carries})" if carries else "")))
    for order, (pid, name) in enumerate(rows):
        _row(events, pid, name, order)
    for op in result.ops:
        events.append(_span(op.group, op.label, _CATEGORIES[op.kind], op.start,
                            op.end, {"stage": op.stage, "samples_per_replica": op.samples}))
        if op.recompute > 0:
            events.append(_span(op.group, f"{op.stage}R{op.microbatch}", "recompute", op.start,
                                op.start + op.recompute, {"part_of": op.label}, tid=1))
    pids = {link: 1000 + i for i, link in enumerate(links)}
    for tx in result.transfers:
        events.append(_span(pids[tx.link], tx.label, "transfer", tx.start, tx.end,
                            {"samples": tx.samples, "cut": tx.cut}))
    for sync in result.syncs:
        events.append(_span(sync.group, _SYNC_NAMES[sync.kind], sync.kind, sync.start, sync.end, {}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "iteration_time_s": result.iteration_time,
                          "bubble_fraction": result.bubble_fraction}}


def _span(pid: int, name: str, cat: str, start: float, end: float, args: dict, tid: int = 0) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
            "ts": start * _US, "dur": (end - start) * _US, "args": args}
