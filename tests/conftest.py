"""Small builders shared by the tests: graphs, clusters and plans in a few words."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
FAST = 1e30  # a bandwidth at which transfers take no measurable time


def make_layer(i: int, fwd=(0.0, 1.0), bwd=(0.0, 2.0), params=0.0, act=0.0, out=0.0, **kw) -> Layer:
    return Layer(f"l{i}", tuple(fwd), tuple(bwd), params, act, out, **kw)


def chain(n: int, **kw) -> LayerGraph:
    """A chain of ``n`` identical layers (fwd a+b*n = 0+1*n, bwd 0+2*n by default)."""
    input_bytes = kw.pop("input_bytes", 0.0)
    return LayerGraph.chain("g", [make_layer(i, **kw) for i in range(n)], input_bytes=input_bytes)


def cluster(n: int, *, speed=1.0, memory=1e12, bandwidth=FAST, latency=0.0, servers=1,
            network_bw=FAST, network_lat=0.0) -> Cluster:
    """``n`` devices ``d0..`` spread round-robin... in blocks over ``servers`` servers."""
    speeds = speed if isinstance(speed, (list, tuple)) else [speed] * n
    per_server = -(-n // servers)
    return Cluster(
        "c",
        tuple(Link(bandwidth, latency, f"s{j}") for j in range(servers)),
        Link(network_bw, network_lat),
        tuple(Device(f"d{i}", f"s{i // per_server}", speeds[i], memory) for i in range(n)),
    )


def plan(stages, *, batch, schedule="gpipe", state_factor=4.0) -> Plan:
    """``stages``: list of ``(lo, hi, devices, microbatches[, recompute[, ops]])``."""
    built = []
    for st in stages:
        lo, hi, devices, split = st[:4]
        recompute = st[4] if len(st) > 4 else False
        ops = tuple(st[5]) if len(st) > 5 else None
        built.append(Stage((lo, hi), tuple(devices), tuple(split), recompute, ops))
    return Plan("g", "c", batch, state_factor, schedule, tuple(built))


@pytest.fixture
def run_cli(capsys):
    """Run ``pipeplan`` in-process; returns (status, stdout, stderr)."""
    from pipeplan.cli import main

    def run(*argv: str):
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            status = exc.code
        out, err = capsys.readouterr()
        return status, out, err

    return run


@dataclass
class Overrun:
    """CPU seconds spent past a time limit (see :func:`cpu_past`)."""

    seconds: float = 0.0


@contextlib.contextmanager
def cpu_past(limit: float | None) -> Iterator[Overrun]:
    """Measure the CPU seconds this process spends in the block after ``limit`` wall seconds from its start (``None``: 0).

    How a test checks that work stops at its time limit on a busy machine: the wall clock
    past the limit also counts the time the machine gave other processes (a loaded 2-core
    machine stretches a 0.1 s overrun to seconds), while the CPU this process spends past
    the limit is the work it did there, about the same idle or loaded.  (A sample taken
    late, when the block holds the interpreter, only shortens the overrun.)
    """
    overrun, taken = Overrun(), {}
    timer = threading.Timer(limit or 0.0, lambda: taken.setdefault("at", time.process_time()))
    if limit is not None:
        timer.start()
    try:
        yield overrun
    finally:
        end = time.process_time()
        timer.cancel()
        overrun.seconds = end - taken.get("at", end)  # the block ended before the limit: none


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) that process ``pid`` has used so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


sys.path.insert(0, str(ROOT / "tests"))
