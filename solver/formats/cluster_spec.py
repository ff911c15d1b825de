"""A cluster from a few words: ``2x8:a100-80g:nvlink3`` per group of servers, a network and
a reference kind, with every figure taken from the catalog.

Device ``j`` of server ``i`` (servers numbered over the whole cluster) is
``<short>-<i>-<j>`` (``a100-0-3``), its server ``<short>-<i>``.  A device's ``speed`` is
its kind's peak dense FLOP/s over the reference kind's, its ``memory`` the kind's memory
less the reserve; the file records both derivations in its ``derived`` field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.catalog import Accelerator, Catalog, load_catalog
from pipeplan.solver.formats.cluster import Cluster, Device, Link

MAX_DEVICES = 1_000_000
"""Most devices one cluster may get (a typo like ``2x80000000`` stops here)."""

DEFAULT_MEMORY_RESERVE = 0.1
"""Share of each device's memory left to the framework (CUDA context, allocator, workspaces)."""

_SERVER = re.compile(r"^(?:(?P<servers>[+-]?\d+)x)?(?P<devices>[+-]?\d+):(?P<kind>[A-Za-z][^:]*)(?::(?P<link>[^:]+))?$")


@dataclass(frozen=True)
class ServerGroup:
    """Identical servers: ``servers`` of them with ``devices`` accelerators of ``kind`` each."""

    servers: int
    """How many servers (>= 1)."""
    devices: int
    """Accelerators per server (>= 1)."""
    kind: str
    """Catalog id of the accelerator."""
    link: str | None
    """Catalog id of the link inside each server; ``None``: the kind's usual one."""
    text: str
    """The words it was read from."""


def parse_server_group(text: str, where: str = "--server") -> ServerGroup:
    """Read ``[SERVERSx]DEVICES:KIND[:LINK]`` (``2x8:a100-80g:nvlink3``, ``8:h100-sxm``).

    Raises
    ------
    InputError
        If the text has another shape or a count is below 1.

    Examples
    --------
    >>> parse_server_group("2x8:a100-80g:nvlink3")
    ServerGroup(servers=2, devices=8, kind='a100-80g', link='nvlink3', text='2x8:a100-80g:nvlink3')
    """
    match = _SERVER.match(text.strip())
    if match is None:
        raise InputError("-", where, f"expected [SERVERSx]DEVICES:KIND[:LINK] such as 2x8:a100-80g:nvlink3, "
                                     f"got {text!r}")
    servers = int(match["servers"]) if match["servers"] is not None else 1
    devices = int(match["devices"])
    for count, what in ((servers, "servers"), (devices, "devices per server")):
        if count < 1:
            raise InputError("-", where, f"{what} must be at least 1, got {count} in {text!r}")
    if servers * devices > MAX_DEVICES:
        raise InputError("-", where, f"{servers} x {devices} devices is more than {MAX_DEVICES:,}")
    return ServerGroup(servers, devices, match["kind"], match["link"], text)


def build_cluster(groups: list[ServerGroup], network: str | None, *, reference: str | None = None,
                  memory_reserve: float = DEFAULT_MEMORY_RESERVE, name: str | None = None,
                  catalog: Catalog | None = None) -> Cluster:
    """The cluster of the server groups joined by the ``network`` link, figures from the catalog.

    Parameters
    ----------
    groups : list of ServerGroup
        The servers, in order (their numbering is the devices' order).
    network : str or None
        Catalog id of the link between servers; ``None`` only for a single server, whose
        cluster never uses one (its own link then stands in).
    reference : str, optional
        Catalog id of the device the graph's times are for (speed 1); default the kind of
        the first group.
    memory_reserve : float
        Share of each device's memory not given to the training process, ``0 <= r < 1``.
    name : str, optional
        The cluster's name; default from the groups (``2x8-a100-80g+4x8-v100-32g``).
    catalog : Catalog, optional
        Default :func:`load_catalog`.

    Returns
    -------
    Cluster

    Raises
    ------
    InputError
        For an unknown kind or link (naming the closest ones), a link of the wrong scope,
        no groups, too many devices, no network for several servers, or a reserve outside
        ``[0, 1)``.

    Examples
    --------
    >>> c = build_cluster([parse_server_group("1x2:a100-80g"), parse_server_group("1x2:v100-32g:pcie3")],
    ...                   "ib-hdr")
    >>> [(d.id, round(d.speed, 3)) for d in c.devices]
    [('a100-0-0', 1.0), ('a100-0-1', 1.0), ('v100-1-0', 0.401), ('v100-1-1', 0.401)]
    """
    catalog = catalog or load_catalog()
    if not groups:
        raise InputError("-", "--server", "give at least one group of servers, e.g. --server 2x8:a100-80g:nvlink3")
    if not 0 <= memory_reserve < 1:
        raise InputError("-", "--memory-reserve", f"must be at least 0 and below 1, got {memory_reserve}")
    if sum(g.servers * g.devices for g in groups) > MAX_DEVICES:
        raise InputError("-", "--server", f"more than {MAX_DEVICES:,} devices in all")
    kinds = [catalog.accelerator(g.kind, f"--server {g.text}") for g in groups]
    ref = catalog.accelerator(reference or groups[0].kind, "--reference")
    if network is None and sum(g.servers for g in groups) > 1:
        raise InputError("-", "--network", f"{sum(g.servers for g in groups)} servers need the link between them, "
                                           "e.g. --network ib-hdr")
    net = catalog.link(network, "network", "--network") if network is not None else None
    servers: list[Link] = []
    devices: list[Device] = []
    for group, kind in zip(groups, kinds):
        link = catalog.link(group.link or kind.link, "server", f"--server {group.text}")
        for _ in range(group.servers):
            server_id = f"{kind.short}-{len(servers)}"
            servers.append(Link(link.bandwidth, link.latency, server_id, {"link": link.id}))
            devices.extend(Device(f"{server_id}-{j}", server_id, kind.flops / ref.flops,
                                  math.floor(kind.memory * (1 - memory_reserve)), {"kind": kind.id})
                           for j in range(group.devices))
    derived = {"catalog": "pipeplan catalog (pipeplan cluster --list)", "reference": ref.id,
               "speed": f"peak dense FLOP/s of the device's kind / {ref.flops / 1e12:g} TFLOPS "
                        f"({ref.flops_dtype}) of {ref.id}" + _dtype_note(kinds, ref),
               "memory": f"the kind's memory x (1 - {memory_reserve:g}) left to the framework",
               "servers": [g.text for g in groups],
               "network": net.id if net else "one server: its own link stands in, and no plan uses it"}
    network_link = Link(net.bandwidth, net.latency, None, {"link": net.id}) if net else \
        Link(servers[0].bandwidth, servers[0].latency, None, dict(servers[0].extra))
    cluster = Cluster(name or "+".join(f"{g.servers}x{g.devices}-{g.kind}" for g in groups), tuple(servers),
                      network_link, tuple(devices), {"derived": derived})
    cluster.validate()
    return cluster


def _dtype_note(kinds: list[Accelerator], ref: Accelerator) -> str:
    # V100 and T4 have no bf16: their fp16 peak stands in, which the ratio should say.
    others = sorted({k.id for k in kinds if k.flops_dtype != ref.flops_dtype})
    if not others:
        return ""
    return f"; {', '.join(others)} use their {'fp16' if ref.flops_dtype == 'bf16' else 'bf16'} peak"
