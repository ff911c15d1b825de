"""A simulated timeline as a Chrome trace (open it in Perfetto or chrome://tracing).

One process row per stage and one per link direction (version 2: per device group,
its stages named, and per link between groups); times in microseconds.  ``I`` and
``W`` are events of their own, as are the all-reduce and the optimizer step.
"""

from __future__ import annotations

from typing import Any

import math

from pipeplan.models.errors import InputError
from pipeplan.solver.evaluation.simulator import GroupSimulationResult, SimulationResult

_US = 1e6


def check_traceable(result: "SimulationResult | GroupSimulationResult", file: str = "-") -> None:
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


def chrome_trace(result: "SimulationResult | GroupSimulationResult", title: str = "pipeplan") -> dict[str, Any]:
    """The ``{"traceEvents": [...]}`` object for ``result``.

    Rows (``pid``): stage ``s`` is ``s``; the forward link after stage ``c`` is
    ``1000 + c`` and its backward link ``2000 + c``.  For a version-2 timeline group
    ``g`` is ``g`` and the links between groups follow from ``1000``, in order.
    """
    if isinstance(result, GroupSimulationResult):
        return _group_trace(result, title)
    events: list[dict[str, Any]] = []
    count = len(result.stages)

    for s in range(count):
        _row(events, s, f"stage {s}", 3 * s)
    for c in range(count - 1):
        _row(events, 1000 + c, f"link {c}->{c + 1} (activations)", 3 * c + 1)
        _row(events, 2000 + c, f"link {c + 1}->{c} (gradients)", 3 * c + 2)
    for op in result.ops:
        events.append(_span(op.stage, f"{op.kind}{op.microbatch}", "backward" if op.kind == "B" else "forward",
                            op.start, op.end, {"samples_per_replica": op.samples}))
        if op.recompute > 0:
            events.append(_span(op.stage, f"R{op.microbatch}", "recompute", op.start, op.start + op.recompute,
                                {"part_of": f"B{op.microbatch}"}, tid=1))
    for tx in result.transfers:
        pid = (1000 if tx.direction == "fwd" else 2000) + tx.cut
        events.append(_span(pid, f"{'A' if tx.direction == 'fwd' else 'G'}{tx.microbatch}", "transfer",
                            tx.start, tx.end, {"samples": tx.samples}))
    for sync in result.syncs:
        events.append(_span(sync.group, _SYNC_NAMES[sync.kind], sync.kind, sync.start, sync.end, {}))
    return _trace(events, result, title)


def _group_trace(result: GroupSimulationResult, title: str) -> dict[str, Any]:
    """:func:`chrome_trace` of a version-2 timeline: a row per group, a row per link between groups."""
    events: list[dict[str, Any]] = []
    links = sorted({tx.link for tx in result.transfers})
    order = len(result.groups)
    for g, cost in enumerate(result.groups):
        _row(events, g, f"group {g} (stages {', '.join(map(str, cost.stages))}; {', '.join(cost.devices)})", g)
    for i, (x, y) in enumerate(links):
        _row(events, 1000 + i, f"link group {x}->{y}", order + i)
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
    return _trace(events, result, title)


def _trace(events: list[dict[str, Any]], result: "SimulationResult | GroupSimulationResult", title: str
           ) -> dict[str, Any]:
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "iteration_time_s": result.iteration_time,
                          "bubble_fraction": result.bubble_fraction}}


def _span(pid: int, name: str, cat: str, start: float, end: float, args: dict, tid: int = 0) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
            "ts": start * _US, "dur": (end - start) * _US, "args": args}
