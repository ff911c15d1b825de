"""What every claim module shares: its section of the report, the clusters and the models.

A claim module's ``run(settings)`` returns a :class:`Section`.  Every number a section
shows goes through :meth:`Section.num`, which formats it and records it, so that
``results.json`` holds each number of ``report.md`` (the test checks that).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeplan.models.graph import LayerGraph, load_graph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.views.figures import save_png
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.result import SolverResult

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
"""The checkout's example graphs and clusters."""


@dataclass(frozen=True)
class Settings:
    """How large and how long a reproduction runs."""

    quick: bool
    """Fewer and smaller instances and shorter limits (``--quick``)."""
    out: Path
    """The output folder (figures are written there)."""
    seed: int = 0
    """Seed of every solver and synthetic network."""

    def limit(self, full: float, quick: float) -> float:
        """Seconds of a time limit: ``quick`` under ``--quick``, else ``full``."""
        return quick if self.quick else full


@dataclass
class Row:
    """One line of a claim's summary table."""

    claim: str
    """What the paper claims, in a few words."""
    paper: str
    """The paper's figure."""
    pipeplan: str
    """pipeplan's figure, measured as the section describes."""
    conditions: str
    """The model, cluster and settings it was measured under."""
    difference: str
    """One sentence on why the two may differ."""


@dataclass
class Section:
    """One claim's part of the report and of ``results.json``."""

    name: str
    """The claim's ``--only`` name."""
    title: str
    """Section heading."""
    method: str = ""
    """How pipeplan measures the claim (a paragraph)."""
    measured_method: str = ""
    """How the runtime measured the section's plans on this machine (a paragraph; empty when it did not)."""
    rows: list[Row] = field(default_factory=list)
    """The summary rows: paper vs pipeplan."""
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    """Detail tables: ``(caption, header, rows of cells)``."""
    figures: list[str] = field(default_factory=list)
    """PNG file names in the output folder."""
    data: dict[str, Any] = field(default_factory=dict)
    """Every measured number, raw (seconds, bytes, ratios)."""
    shown: list[float] = field(default_factory=list)
    """Every number the section's text shows, as shown."""
    wall_time: float = 0.0
    """Seconds the claim took."""

    def num(self, value: float | int | None, digits: int = 2, unit: str = "") -> str:
        """``value`` rounded to ``digits`` decimals (and ``unit``), recorded in :attr:`shown`."""
        if value is None:
            return "n/a"
        shown = round(float(value), digits) if digits else int(round(value))
        self.shown.append(shown)
        text = f"{shown:.{digits}f}" if digits else str(shown)
        return f"{text} {unit}".strip() if unit not in ("%", "×") else f"{text}{' %' if unit == '%' else '×'}"

    def save_figure(self, fig, settings: Settings, name: str) -> None:
        """Write ``fig`` as ``settings.out / name`` (tight layout, PNG) and list it in :attr:`figures`."""
        fig.tight_layout()
        save_png(fig, str(settings.out / name))
        self.figures.append(name)

    def to_json(self) -> dict[str, Any]:
        """The section as stored in ``results.json``."""
        return {"title": self.title, "wall_time": self.wall_time, "figures": self.figures,
                "measured_method": self.measured_method,
                "rows": [vars(r) for r in self.rows],
                "tables": [{"caption": c, "header": h, "rows": rs} for c, h, rs in self.tables],
                "data": self.data, "shown": self.shown}


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


# --------------------------------------------------------------------------- clusters
def one_server(count: int, speed: float = 1.0, memory: float = 4e10, bandwidth: float = 1.5e11) -> Cluster:
    """``count`` equal GPUs on one NVLink server (A100-like: 40 GB, 150 GB/s)."""
    return Cluster(f"homog-{count}", (Link(bandwidth, 5e-6, "s0"),), Link(1.25e10, 2e-5),
                   tuple(Device(f"g{i}", "s0", speed, memory) for i in range(count)))


def servers(count: int, per_server: int) -> Cluster:
    """``count`` equal NVLink servers of ``per_server`` GPUs, 100 Gb/s between them."""
    return Cluster(f"homog-{count}x{per_server}", tuple(Link(1.5e11, 5e-6, f"s{k}") for k in range(count)),
                   Link(1.25e10, 2e-5),
                   tuple(Device(f"s{k}g{i}", f"s{k}", 1.0, 4e10) for k in range(count) for i in range(per_server)))


def nvlink_pcie(per_server: int = 4) -> Cluster:
    """AutoPipe-H's commodity setting: a new-generation NVLink server and an old PCIe one.

    ``nv*``: speed 1, 40 GB, 150 GB/s NVLink; ``pc*``: speed 0.5, 16 GB, 16 GB/s PCIe;
    100 Gb/s between the servers.  The PCIe server comes first in the file, as a
    rank-ordered launcher would see it.
    """
    return Cluster("nvlink-pcie", (Link(1.6e10, 1e-5, "pcie"), Link(1.5e11, 5e-6, "nvlink")), Link(1.25e10, 2e-5),
                   tuple(Device(f"pc{i}", "pcie", 0.5, 1.6e10) for i in range(per_server))
                   + tuple(Device(f"nv{i}", "nvlink", 1.0, 4e10) for i in range(per_server)))


def mixed(fast: int, total: int, slow_speed: float = 0.4) -> Cluster:
    """``total`` GPUs in servers of 4: the first ``fast`` at speed 1 (40 GB), the rest ``slow_speed`` (16 GB)."""
    devices = tuple(Device(f"g{i}", f"s{i // 4}", 1.0 if i < fast else slow_speed, 4e10 if i < fast else 1.6e10)
                    for i in range(total))
    return Cluster(f"mix-{fast}of{total}", tuple(Link(1.5e11, 5e-6, f"s{k}") for k in range((total + 3) // 4)),
                   Link(1.25e10, 2e-5), devices)


# --------------------------------------------------------------------------- models
def gpt1() -> LayerGraph:
    """GPT1-14 (``examples/gpt1.graph.json``): embedding, 12 blocks, head."""
    return load_graph(str(EXAMPLES / "gpt1.graph.json"))


def vgg16() -> LayerGraph:
    """VGG16's analytic profile (the zoo)."""
    from pipeplan.models.profile_analytic import profile_analytic

    return profile_analytic("vgg16")


# --------------------------------------------------------------------------- plans
def mapping(plan: Plan | None) -> str:
    """``layers@devices`` per stage, e.g. ``0-3@g0 | 4-13@g1+g2``."""
    if plan is None:
        return "none"
    return " | ".join(f"{st.layers[0]}-{st.layers[1] - 1}@{'+'.join(st.devices)}" for st in plan.stages)


def ms(result: SolverResult | None) -> float | None:
    """The result's iteration time in milliseconds, or ``None`` without a plan."""
    return None if result is None or result.iteration_time is None else 1e3 * result.iteration_time


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` when both exist."""
    return a / b if a is not None and b else None
