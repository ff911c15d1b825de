"""The local machine as a ``pipeplan.cluster/1``: what ``profile``, ``calibrate`` and ``run``
start from.

With CUDA: one device per GPU (``torch.cuda`` names and memory), linked by NVLink when
``nvidia-smi topo -m`` shows every pair of them joined by ``NV<N>`` (N links of 25 GB/s
each way), else by the PCIe generation the catalog gives their kind.  Without CUDA:
one CPU device per process over TCP loopback, each with an equal share of the RAM.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass

import torch

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.catalog import Accelerator, Catalog, LinkKind, load_catalog
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.cluster_spec import DEFAULT_MEMORY_RESERVE

CPU_PROCESSES = 2
"""CPU devices a CPU-only machine gets when no process count is given."""

SERVER = "local"
"""The one server's id."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as ``torch.cuda`` reports it."""

    index: int
    """CUDA ordinal."""
    name: str
    """``torch.cuda.get_device_name``."""
    memory: int
    """Total bytes of device memory."""


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """The GPU-to-GPU entries of ``nvidia-smi topo -m``: ``{(i, j): "NV12" | "PIX" | ...}`` for ``i != j``.

    Rows and columns that are not GPUs (NICs, affinities) and the legend are left out.

    Examples
    --------
    >>> text = "\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV4\\t0-7\\nGPU1\\tNV4\\t X \\t0-7\\n"
    >>> parse_topology(text)
    {(0, 1): 'NV4', (1, 0): 'NV4'}
    """
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    # The header names the GPU columns; unlike a row, it has no "X" (the diagonal)
    header = next((line.split() for line in lines
                   if "X" not in line.split() and any(_GPU.match(t) for t in line.split())), None)
    if header is None:
        return {}
    columns = [int(_GPU.match(t)[1]) for t in header if _GPU.match(t)]
    pairs = {}
    for line in lines:
        tokens = line.split()
        row = _GPU.match(tokens[0]) if tokens else None
        if row is None:
            continue
        for column, entry in zip(columns, tokens[1:1 + len(columns)]):
            if column != int(row[1]):
                pairs[(int(row[1]), column)] = entry
    return pairs


def nvlink_lanes(pairs: dict[tuple[int, int], str], gpus: list[int]) -> int | None:
    """The fewest NVLink links between any two of ``gpus``, or ``None`` if some pair has none
    (or is missing from the matrix)."""
    lanes = []
    for i in gpus:
        for j in gpus:
            if i != j:
                match = _NVLINK.match(pairs.get((i, j), ""))
                if match is None:
                    return None
                lanes.append(int(match[1]))
    return min(lanes) if lanes else None


def cuda_gpus() -> list[Gpu]:
    """The CUDA devices of this machine (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [Gpu(i, torch.cuda.get_device_name(i), int(torch.cuda.get_device_properties(i).total_memory))
            for i in range(torch.cuda.device_count())]


def topology_text() -> str | None:
    """What ``nvidia-smi topo -m`` prints, or ``None`` when it is missing or fails."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def physical_memory() -> int:
    """Bytes of RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def detect_cluster(processes: int | None = None, *, memory_reserve: float = DEFAULT_MEMORY_RESERVE,
                   reference: str | None = None, catalog: Catalog | None = None) -> tuple[Cluster, list[str]]:
    """This machine as a one-server cluster, and notes on what was assumed.

    Parameters
    ----------
    processes : int, optional
        Devices to describe: the first ``processes`` GPUs (default all), or that many CPU
        processes on a machine without CUDA (default :data:`CPU_PROCESSES`).
    memory_reserve : float
        Share of each device's memory left to the framework, ``0 <= r < 1``.
    reference : str, optional
        Catalog kind whose speed is 1; default the kind of the first GPU (the one a graph
        profiled here was measured on).  CPU devices have speed 1.
    catalog : Catalog, optional
        Default :func:`pipeplan.solver.formats.catalog.load_catalog`.

    Returns
    -------
    (Cluster, list of str)

    Raises
    ------
    InputError
        For fewer than one process, more GPUs asked for than there are, an unknown
        reference kind, a reference without GPUs, or a reserve outside ``[0, 1)``.
    """
    catalog = catalog or load_catalog()
    if processes is not None and processes < 1:
        raise InputError("-", "--processes", f"must be at least 1, got {processes}")
    if not 0 <= memory_reserve < 1:
        raise InputError("-", "--memory-reserve", f"must be at least 0 and below 1, got {memory_reserve}")
    gpus = cuda_gpus()
    if not gpus:
        if reference is not None:
            raise InputError("-", "--reference", "no CUDA device here: CPU processes all have speed 1; drop it")
        return _cpu_cluster(processes or CPU_PROCESSES, memory_reserve, catalog)
    if processes is not None and processes > len(gpus):
        raise InputError("-", "--processes", f"this machine has {len(gpus)} GPUs, {processes} asked for; "
                                             f"ask for at most {len(gpus)}")
    return _gpu_cluster(gpus[:processes], memory_reserve, reference, catalog)


def _cpu_cluster(processes: int, memory_reserve: float, catalog: Catalog) -> tuple[Cluster, list[str]]:
    loopback = catalog.links["loopback"]
    share = math.floor(physical_memory() * (1 - memory_reserve) / processes)
    devices = tuple(Device(f"cpu{i}", SERVER, 1.0, share, {"kind": "cpu"}) for i in range(processes))
    derived = {"detected": "no CUDA device: one CPU process per device",
               "speed": "1 for every process: a graph profiled here describes this machine",
               "memory": f"this machine's RAM x (1 - {memory_reserve:g}) / {processes} processes",
               "network": "loopback (one machine)"}
    cluster = Cluster(f"local-{processes}-cpu", (_link(loopback, SERVER),), _link(loopback, None), devices,
                      {"derived": derived})
    return cluster, [f"no CUDA device: {processes} CPU processes over loopback; the link figures are typical "
                     "ones, not measured here"]


def _gpu_cluster(gpus: list[Gpu], memory_reserve: float, reference: str | None,
                 catalog: Catalog) -> tuple[Cluster, list[str]]:
    notes: list[str] = []
    kinds = [catalog.match_device_name(g.name) for g in gpus]
    for gpu, kind in zip(gpus, kinds):
        if kind is None:
            notes.append(f"GPU {gpu.index} ({gpu.name}) is not in the catalog: speed 1 assumed; "
                         "measure it with `pipeplan speeds`")
    ref = catalog.accelerator(reference, "--reference") if reference else kinds[0]
    link, how = _server_link(gpus, kinds, catalog)
    notes.append(how)
    devices = []
    for gpu, kind in zip(gpus, kinds):
        speed = kind.flops / ref.flops if kind is not None and ref is not None else 1.0
        devices.append(Device(f"{kind.short if kind else 'gpu'}-0-{gpu.index}", SERVER, speed,
                              math.floor(gpu.memory * (1 - memory_reserve)),
                              {"kind": kind.id, "model": gpu.name} if kind else {"model": gpu.name}))
    derived = {"detected": "torch.cuda and nvidia-smi topo -m", "reference": ref.id if ref else None,
               "speed": "peak dense FLOP/s of the kind / the reference's (catalog)",
               "memory": f"torch.cuda total memory x (1 - {memory_reserve:g})", "server_link": how,
               "network": "the server's link (one machine: no network is used)"}
    name = f"local-{len(gpus)}-{kinds[0].id if kinds[0] else 'gpu'}"
    cluster = Cluster(name, (_link(link, SERVER),), _link(link, None), tuple(devices), {"derived": derived})
    return cluster, notes


def _server_link(gpus: list[Gpu], kinds: list[Accelerator | None], catalog: Catalog) -> tuple[LinkKind, str]:
    """The link between the GPUs, and a sentence saying how it was found."""
    text = topology_text()
    lanes = nvlink_lanes(parse_topology(text), [g.index for g in gpus]) if text is not None else None
    if lanes is not None:
        lane = catalog.links["nvlink-lane"]
        return (LinkKind(f"nvlink-x{lanes}", f"{lanes} NVLink links", "server", lane.bandwidth * lanes,
                         lane.latency, lane.source),
                f"nvidia-smi topo -m: every pair joined by at least {lanes} NVLink links "
                f"({lanes} x {lane.bandwidth / 1e9:g} GB/s each way)")
    known = [k for k in kinds if k is not None]
    pcie = catalog.links[known[0].pcie if known else "pcie4"]
    if len(gpus) == 1:
        why = "one GPU: no link between GPUs is used"
    elif text is None:
        why = "nvidia-smi topo -m unavailable: PCIe assumed"
    else:
        why = "nvidia-smi topo -m: some pair is not joined by NVLink"
    return pcie, f"{why}; {pcie.name} ({pcie.bandwidth / 1e9:g} GB/s each way)"


def _link(kind: LinkKind, server: str | None) -> Link:
    return Link(kind.bandwidth, kind.latency, server, {"link": kind.id})
