"""A simulated timeline as a Chrome trace (open it in Perfetto or chrome://tracing).

One process row per stage and one per link direction; times in microseconds.
"""

from __future__ import annotations

from typing import Any

import math

from pipeplan.models.errors import InputError
from pipeplan.solver.simulator import SimulationResult

_US = 1e6


def check_traceable(result: SimulationResult, file: str = "-") -> None:
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


def chrome_trace(result: SimulationResult, title: str = "pipeplan") -> dict[str, Any]:
    """The ``{"traceEvents": [...]}`` object for ``result``.

    Rows (``pid``): stage ``s`` is ``s``; the forward link after stage ``c`` is
    ``1000 + c`` and its backward link ``2000 + c``.
    """
    events: list[dict[str, Any]] = []
    count = len(result.stages)

    def row(pid: int, name: str, order: int) -> None:
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": order}})

    for s in range(count):
        row(s, f"stage {s}", 3 * s)
    for c in range(count - 1):
        row(1000 + c, f"link {c}->{c + 1} (activations)", 3 * c + 1)
        row(2000 + c, f"link {c + 1}->{c} (gradients)", 3 * c + 2)
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
    for ar in result.allreduces:
        events.append(_span(ar.stage, "all-reduce", "allreduce", ar.start, ar.end, {}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "iteration_time_s": result.iteration_time,
                          "bubble_fraction": result.bubble_fraction}}


def _span(pid: int, name: str, cat: str, start: float, end: float, args: dict, tid: int = 0) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
            "ts": start * _US, "dur": (end - start) * _US, "args": args}
