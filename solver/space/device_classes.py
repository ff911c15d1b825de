"""Device classes: devices of the same speed and memory, on any server, are interchangeable.

A stage's timing and memory depend on its devices only through how many of each class
it holds (its *composition*, see :mod:`pipeplan.solver.space.arcs`); only transfers and
all-reduces depend on which servers hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.solver.formats.cluster import Cluster


@dataclass(frozen=True)
class DeviceClass:
    """Interchangeable devices: same speed and memory (on any server)."""

    speed: float
    memory: float
    ids_by_server: tuple[tuple[str, tuple[str, ...]], ...]
    """``(server id, device ids)`` for every server holding devices of this class."""

    @property
    def count(self) -> int:
        return sum(len(ids) for _, ids in self.ids_by_server)



def device_classes(cluster: Cluster) -> tuple[DeviceClass, ...]:
    """Devices grouped by ``(speed, memory)``, fastest class first."""
    groups: dict[tuple[float, float], dict[str, list[str]]] = {}
    for d in cluster.devices:
        groups.setdefault((d.speed, d.memory), {}).setdefault(d.server, []).append(d.id)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
    return tuple(DeviceClass(speed, memory, tuple((s, tuple(ids)) for s, ids in by_server.items()))
                 for (speed, memory), by_server in ordered)


def fastest_first(cluster: Cluster) -> list[str]:
    """Device ids, fastest first (then most memory), keeping a server's devices together.

    Plans that take devices from the front of this list put a smaller pipeline on the
    fastest devices, and equal devices of one server sit next to each other (their
    stages then talk over the fast intra-server link).
    """
    devices = cluster.devices
    server_rank = {s.id: i for i, s in enumerate(cluster.servers)}
    order = sorted(range(len(devices)), key=lambda i: (-devices[i].speed, -devices[i].memory,
                                                        server_rank.get(devices[i].server, 0), i))
    return [devices[i].id for i in order]
