"""A Gantt chart of a timeline (PNG via matplotlib).

Forward, backward, recompute, transfers and all-reduce get distinct colours;
microbatch numbers sit on the bars; the title gives the iteration time and the
bubble fraction.  The runtime draws measured timelines with the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeplan.solver.figures import pyplot, save_png
from pipeplan.solver.simulator import SimulationResult

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "recompute": "#DD8452",
    "transfer": "#8172B3",
    "allreduce": "#C44E52",
}
"""Bar colour of each kind of work."""


@dataclass(frozen=True)
class Bar:
    """One bar of a Gantt chart."""

    row: str
    """Row label (``"stage 0"``, ``"0->1 act"``)."""
    kind: str
    """A key of :data:`COLOURS`."""
    start: float
    """Start, seconds."""
    end: float
    """End, seconds."""
    label: str = ""
    """Text on the bar (the microbatch number)."""


def bars_of(result: SimulationResult) -> tuple[list[str], list[Bar]]:
    """Rows (top to bottom) and bars of a simulated timeline."""
    count = len(result.stages)
    rows: list[str] = []
    for s in range(count):
        rows.append(f"stage {s}")
        if s < count - 1:
            rows += [f"{s}->{s + 1} act", f"{s + 1}->{s} grad"]
    bars: list[Bar] = []
    for op in result.ops:
        row = f"stage {op.stage}"
        if op.recompute > 0:
            bars.append(Bar(row, "recompute", op.start, op.start + op.recompute, str(op.microbatch)))
            bars.append(Bar(row, "backward", op.start + op.recompute, op.end, str(op.microbatch)))
        else:
            bars.append(Bar(row, "forward" if op.kind == "F" else "backward", op.start, op.end, str(op.microbatch)))
    for tx in result.transfers:
        row = f"{tx.cut}->{tx.cut + 1} act" if tx.direction == "fwd" else f"{tx.cut + 1}->{tx.cut} grad"
        bars.append(Bar(row, "transfer", tx.start, tx.end, str(tx.microbatch)))
    for ar in result.allreduces:
        bars.append(Bar(f"stage {ar.stage}", "allreduce", ar.start, ar.end, "AR"))
    return rows, bars


def draw_gantt(rows: Sequence[str], bars: Sequence[Bar], title: str, path: str | None = None,
               ax=None):
    """Draw ``bars`` on ``rows``; write a PNG to ``path`` (atomically) if given.

    Returns the matplotlib figure.
    """
    from matplotlib.patches import Patch

    plt = pyplot()

    index = {r: i for i, r in enumerate(rows)}
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6))
    span = max((b.end for b in bars), default=1.0) or 1.0
    for b in bars:
        y = index[b.row]
        # Keep very short work (a transfer on NVLink) visible: at least 1/800 of the span.
        width = max(b.end - b.start, span / 800)
        ax.barh(y, width, left=b.start, height=0.8, color=COLOURS[b.kind], edgecolor="white",
                linewidth=0.4 if width > span / 200 else 0)
        if b.label and (b.end - b.start) > span / 120:
            ax.text((b.start + b.end) / 2, y, b.label, ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.18), ncol=len(COLOURS), fontsize=8, frameon=False)
    fig = fig or ax.figure
    fig.tight_layout()
    if path is not None:
        save_png(fig, path, dpi=120)
    return fig


def gantt_title(result: SimulationResult, name: str) -> str:
    return (f"{name}: iteration {result.iteration_time * 1e3:.3f} ms, "
            f"bubble {100 * result.bubble_fraction:.1f}%, {result.throughput:.1f} samples/s")


def write_gantt(result: SimulationResult, path: str, name: str = "plan") -> None:
    """Write the Gantt chart PNG of a simulated plan to ``path`` (atomically)."""
    rows, bars = bars_of(result)
    draw_gantt(rows, bars, gantt_title(result, name), path)
