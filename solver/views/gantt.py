"""A Gantt chart of a timeline (PNG via matplotlib).

Forward, backward (whole, input-gradient and weight-gradient apart), recompute,
transfers, all-reduce and optimizer step get distinct colours; the title gives the
iteration time and the bubble fraction.  A timeline has a row per device group (named
by its stage when every group holds one, else by its stages), each followed by the
links to and from the next groups; each bar is labelled with its action as torch
writes it (``"2I3"``; a transfer with the action that sent it, ``"A2:0"`` for
activations, ``"G"`` for gradients).  The runtime draws measured timelines with the
same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeplan.solver.views.figures import pyplot, save_png
from pipeplan.solver.evaluation.simulator import Simulation
from pipeplan.solver.views.trace import link_carries, link_order, one_stage_per_group

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "input-grad": "#64B5CD",
    "weight-grad": "#CCB974",
    "recompute": "#DD8452",
    "transfer": "#8172B3",
    "allreduce": "#C44E52",
    "step": "#937860",
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


KIND_BARS = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}
"""The bar kind of each action kind."""


def bars_of(result: Simulation) -> tuple[list[str], list[Bar]]:
    """Rows (top to bottom) and bars of a simulated timeline: a row per group, each link after the lower of its groups."""
    by_stage = one_stage_per_group(result)
    names = [f"stage {c.stages[0]}" if by_stage else
             f"group {g} (stage{'s' if len(c.stages) > 1 else ''} {','.join(map(str, c.stages))})"
             for g, c in enumerate(result.groups)]
    link_rows = {}
    for x, y in link_order(result):
        carries = {"activations": " act", "gradients": " grad"}.get(link_carries(result, (x, y)), "")
        link_rows[(x, y)] = f"{x}->{y}{carries}" if by_stage else f"group {x}->{y}"
    rows = []
    for g, name in enumerate(names):
        rows += [name] + [row for link, row in link_rows.items() if min(link) == g]
    bars: list[Bar] = []
    for op in result.ops:
        row, label = names[op.group], op.label
        if op.recompute > 0:
            bars.append(Bar(row, "recompute", op.start, op.start + op.recompute, label))
        bars.append(Bar(row, KIND_BARS[op.kind], op.start + op.recompute, op.end, label))
    for tx in result.transfers:
        bars.append(Bar(link_rows[tx.link], "transfer", tx.start, tx.end, tx.label))
    for sync in result.syncs:
        bars.append(Bar(names[sync.group], sync.kind, sync.start, sync.end, _SYNC_LABELS[sync.kind]))
    return rows, bars


_SYNC_LABELS = {"allreduce": "AR", "step": "step"}


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
    shown = [k for k in COLOURS if any(b.kind == k for b in bars)]
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in shown], loc="upper center",
              bbox_to_anchor=(0.5, -0.18), ncol=max(1, len(shown)), fontsize=8, frameon=False)
    fig = fig or ax.figure
    fig.tight_layout()
    if path is not None:
        save_png(fig, path, dpi=120)
    return fig


def gantt_title(result: Simulation, name: str) -> str:
    return (f"{name}: iteration {result.iteration_time * 1e3:.3f} ms, "
            f"bubble {100 * result.bubble_fraction:.1f}%, {result.throughput:.1f} samples/s")


def write_gantt(result: Simulation, path: str, name: str = "plan") -> None:
    """Write the Gantt chart PNG of a simulated plan to ``path`` (atomically)."""
    rows, bars = bars_of(result)
    draw_gantt(rows, bars, gantt_title(result, name), path)
