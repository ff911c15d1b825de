"""Measured timelines: iteration times, a Chrome trace and a Gantt chart.

Each rank times its work from its own iteration start (right after a start line
that every rank leaves together, see ``pipeplan.runtime.worker._start_together``), so the ranks' timelines line up without comparing
clocks across machines.  An iteration ends when the last rank has synchronised its
gradients, as the spec's ``T``; the optimizer step after it is not counted.
Gaps between a rank's timed work are its *idle* time.
"""

from __future__ import annotations

import statistics
from typing import Any

from pipeplan.solver.views.figures import pyplot, save_png
from pipeplan.solver.views.gantt import Bar, bars_of, draw_gantt, gantt_title
from pipeplan.solver.evaluation.simulator import Simulation

_US = 1e6
_COMPUTE = {"forward": "forward", "backward": "backward", "recompute": "recompute", "allreduce": "allreduce"}


def align(result: dict) -> dict:
    """Put every rank's times on one clock when all ranks ran on one machine.

    Ranks leave the start-of-iteration line a little apart (up to a message
    latency), so per-rank clocks are shifted to the earliest start, using
    ``time.perf_counter`` (system-wide on one machine).  Across machines each rank
    keeps its own start as time 0.  Idempotent.
    """
    ranks = result["ranks"]
    if result.get("aligned") or len({r.get("host") for r in ranks}) != 1 or "t0" not in ranks[0]["steps"][0]:
        return result
    for i in range(len(ranks[0]["steps"])):
        first = min(r["steps"][i]["t0"] for r in ranks)
        for r in ranks:
            record, shift = r["steps"][i], r["steps"][i]["t0"] - first
            record["end"] += shift
            record["events"] = [[kind, label, a + shift, b + shift] for kind, label, a, b in record["events"]]
            record["t0"] = first
    result["aligned"] = True
    return result


def iteration_times(result: dict) -> list[float]:
    """Seconds of each step: the latest end over the ranks."""
    steps = len(result["ranks"][0]["steps"])
    return [max(rank["steps"][i]["end"] for rank in result["ranks"]) for i in range(steps)]


def measured_steps(result: dict) -> list[int]:
    """The steps after warm-up (at least the last one)."""
    steps = len(result["ranks"][0]["steps"])
    return list(range(min(max(result.get("warmup", 0), 0), steps - 1), steps))


def median_step(result: dict) -> tuple[float, int]:
    """The median iteration time after warm-up, and a step that took it (the lower median)."""
    times = iteration_times(result)
    kept = sorted(measured_steps(result), key=lambda i: times[i])
    median = statistics.median(times[i] for i in kept)
    return median, kept[(len(kept) - 1) // 2]


def idle_spans(events: list[list], end: float) -> list[tuple[float, float]]:
    """Gaps in ``[0, end]`` covered by no event of a rank."""
    spans, clock = [], 0.0
    for _, _, start, stop in sorted(events, key=lambda e: e[2]):
        if start > clock:
            spans.append((clock, start))
        clock = max(clock, stop)
    if end > clock:
        spans.append((clock, end))
    return spans


def rank_label(rank: dict) -> str:
    stages = "+".join(str(s) for s in rank.get("stages", [rank["stage"]]))  # every stage of its group
    return f"rank {rank['rank']} s{stages}/{rank['replica']} {rank['device']}"


def chrome_trace(result: dict, step: int, title: str = "pipeplan run") -> dict[str, Any]:
    """The measured step ``step`` as ``{"traceEvents": [...]}``.

    One process row per rank: thread 0 is compute (forward, backward, recompute,
    all-reduce, idle), thread 1 communication (send, receive waits).
    """
    events: list[dict[str, Any]] = []
    for rank in result["ranks"]:
        pid = rank["rank"]
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": rank_label(rank)}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
        record = rank["steps"][step]
        for kind, label, start, stop in record["events"]:
            tid = 0 if kind in _COMPUTE else 1
            events.append(_span(pid, tid, label, kind, start, stop))
        for start, stop in idle_spans(record["events"], record["end"]):
            events.append(_span(pid, 0, "idle", "idle", start, stop))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "step": step, "iteration_time_s": iteration_times(result)[step]}}


def _span(pid: int, tid: int, name: str, cat: str, start: float, stop: float) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
            "ts": start * _US, "dur": (stop - start) * _US}


def measured_bars(result: dict, step: int) -> tuple[list[str], list[Bar]]:
    """Rows and bars of step ``step``: per rank, compute and communication rows."""
    rows: list[str] = []
    bars: list[Bar] = []
    for rank in result["ranks"]:
        main, comm = rank_label(rank), rank_label(rank) + " comm"
        rows += [main, comm]
        for kind, label, start, stop in rank["steps"][step]["events"]:
            if kind in _COMPUTE:
                bars.append(Bar(main, _COMPUTE[kind], start, stop, label.lstrip("FBR") if kind != "allreduce" else "AR"))
            elif stop - start > 0:
                bars.append(Bar(comm, "transfer", start, stop, label.split()[-1]))
    return rows, bars


def write_gantt(result: dict, step: int, path: str, title: str,
                prediction: Simulation | None = None, name: str = "simulated") -> None:
    """The measured Gantt chart of ``step``; the simulated one above it when ``prediction`` is given."""
    plt = pyplot()
    rows, bars = measured_bars(result, step)
    if prediction is None:
        draw_gantt(rows, bars, title, path)
        return
    sim_rows, sim_bars = bars_of(prediction)
    heights = [0.45 * len(sim_rows) + 1.6, 0.45 * len(rows) + 1.6]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, sum(heights) + 0.8), height_ratios=heights)
    draw_gantt(sim_rows, sim_bars, gantt_title(prediction, name), ax=top)
    draw_gantt(rows, bars, title, ax=bottom)
    span = max(prediction.iteration_time, max((b.end for b in bars), default=0.0))
    for ax in (top, bottom):  # one time axis for both, so lengths compare at a glance
        ax.set_xlim(0, span * 1.02)
    save_png(fig, path, dpi=120)
