"""The cluster: devices of different speed and memory on servers with different links
(``pipeplan.cluster/1``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import Reader, load_json

CLUSTER_FORMAT = "pipeplan.cluster/1"

_LINK_FIELDS = frozenset({"id", "bandwidth", "latency"})
_DEVICE_FIELDS = frozenset({"id", "server", "speed", "memory"})
_CLUSTER_FIELDS = frozenset({"format", "name", "servers", "network", "devices"})


@dataclass(frozen=True)
class Link:
    """A class of connection: inside one server, or the network between servers."""

    bandwidth: float
    """Bytes per second between two devices using this link (> 0)."""
    latency: float
    """Seconds of fixed cost per message (>= 0)."""
    id: str | None = None
    """The server's id; ``None`` for the inter-server network."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Unknown fields, preserved on save."""

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        if self.id is not None:
            data["id"] = self.id
        data.update(bandwidth=self.bandwidth, latency=self.latency)
        return data


@dataclass(frozen=True)
class Device:
    """One accelerator."""

    id: str
    """Unique id that plans use."""
    server: str
    """Id of the server it sits in."""
    speed: float
    """Runs every layer ``speed`` times as fast as the reference device (> 0)."""
    memory: float
    """Bytes available to the training process."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Unknown fields, preserved on save."""

    def __post_init__(self) -> None:
        # The file loader reports these as input errors first; this guards the Python API,
        # where a non-positive speed would make every time negative or infinite.
        if not self.speed > 0 or not self.memory >= 0:
            raise ValueError(f"device {self.id!r}: speed must be > 0 and memory >= 0, got speed {self.speed} and "
                             f"memory {self.memory}")

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        data.update(id=self.id, server=self.server, speed=self.speed, memory=self.memory)
        return data


LINK_CACHE_SIZE = 100_000
"""Pairs of device groups whose worst link a cluster remembers (a few tens of MB at 4,096 devices)."""


@dataclass(frozen=True)
class Cluster:
    """Devices on servers, with intra-server links and one network between servers.

    Examples
    --------
    >>> c = Cluster("c", (Link(1e11, 1e-6, "s0"),), Link(1e10, 1e-5),
    ...             (Device("g0", "s0", 1.0, 8e9), Device("g1", "s0", 1.0, 8e9)))
    >>> c.bw(["g0"], ["g1"])
    100000000000.0
    """

    name: str
    """The cluster's name (plans name it in their ``cluster`` field)."""
    servers: tuple[Link, ...]
    """Each server's internal link (NVLink, PCIe), with the server id."""
    network: Link
    """The link between devices on different servers."""
    devices: tuple[Device, ...]
    """Every device, in file order."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Unknown top-level fields, preserved on save."""

    @cached_property
    def device_index(self) -> dict[str, Device]:
        """Devices by id."""
        return {d.id: d for d in self.devices}

    @cached_property
    def _server_link(self) -> dict[str, Link]:
        return {s.id: s for s in self.servers}  # type: ignore[misc]

    def pair_link(self, x: str, y: str) -> Link:
        """The link two distinct devices talk over."""
        dx, dy = self.device_index[x], self.device_index[y]
        return self._server_link[dx.server] if dx.server == dy.server else self.network

    def _pairs(self, xs: Iterable[str], ys: Iterable[str]) -> list[Link]:
        """The links the pairs of distinct devices ``x`` in ``xs``, ``y`` in ``ys`` talk over, each once.

        Found server by server rather than pair by pair: a group of a thousand devices
        has a million pairs but one or two links.
        """
        by_server_x, by_server_y = self._by_server(xs), self._by_server(ys)
        links = [self._server_link[s] for s, here in by_server_x.items()
                 if _distinct_pair(here, by_server_y.get(s, set()))]
        if _distinct_pair(set(by_server_x), set(by_server_y)):  # a pair on two servers
            links.append(self.network)
        if not links:
            raise ValueError("bw/lat need at least one pair of distinct devices")
        return links

    def _by_server(self, ids: Iterable[str]) -> dict[str, set[str]]:
        groups: dict[str, set[str]] = {}
        for device in ids:
            groups.setdefault(self.device_index[device].server, set()).add(device)
        return groups

    @cached_property
    def _link_cache(self) -> dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[float, float]]:
        return {}  # type: ignore[misc]

    def _worst_link(self, xs: Iterable[str], ys: Iterable[str] | None) -> tuple[float, float]:
        """``(smallest bandwidth, largest latency)`` over the pairs, remembered per pair of groups.

        Solvers ask about the same few replica groups thousands of times (every simulated
        plan's cuts and all-reduces); the cache holds one entry per distinct pair of groups
        and is cleared when it grows past :data:`LINK_CACHE_SIZE`.
        """
        xs = tuple(xs)
        ys = xs if ys is None else tuple(ys)
        key = (xs, ys)
        found = self._link_cache.get(key)
        if found is None:
            links = self._pairs(xs, ys)
            found = (min(link.bandwidth for link in links), max(link.latency for link in links))
            if len(self._link_cache) >= LINK_CACHE_SIZE:
                self._link_cache.clear()
            self._link_cache[key] = found
        return found

    def bw(self, xs: Iterable[str], ys: Iterable[str] | None = None) -> float:
        """Smallest pair bandwidth between ``xs`` and ``ys`` (within ``xs`` if ``ys`` is None)."""
        return self._worst_link(xs, ys)[0]

    def lat(self, xs: Iterable[str], ys: Iterable[str] | None = None) -> float:
        """Largest pair latency between ``xs`` and ``ys`` (within ``xs`` if ``ys`` is None)."""
        return self._worst_link(xs, ys)[1]

    # ----------------------------------------------------------------- JSON
    @classmethod
    def from_dict(cls, data: Any, file: str = "-") -> "Cluster":
        """Read and check a ``pipeplan.cluster/1`` object; see :func:`load_cluster`."""
        top = Reader(data, file, "")
        top.format(CLUSTER_FORMAT)
        servers = tuple(_read_server(s, file, f"servers[{i}]")
                        for i, s in enumerate(top.array("servers", nonempty=True)))
        net = Reader(top.raw("network"), file, "network")
        network = Link(net.number("bandwidth", positive=True), net.number("latency"),
                       None, net.extras(_LINK_FIELDS - {"id"}))
        devices = tuple(_read_device(d, file, f"devices[{i}]")
                        for i, d in enumerate(top.array("devices", nonempty=True)))
        cluster = cls(top.string("name"), servers, network, devices, top.extras(_CLUSTER_FIELDS))
        cluster.validate(file)
        return cluster

    def validate(self, file: str = "-") -> None:
        """Check ids are unique and every device's server exists.

        Raises
        ------
        InputError
            Naming the first offending entry.
        """
        server_ids: dict[str, int] = {}
        for i, s in enumerate(self.servers):
            if s.id in server_ids:
                raise InputError(file, f"servers[{i}].id", f"server id {s.id!r} is also used by servers[{server_ids[s.id]}]")
            server_ids[s.id] = i  # type: ignore[index]
        device_ids: dict[str, int] = {}
        for i, d in enumerate(self.devices):
            if d.id in device_ids:
                raise InputError(file, f"devices[{i}].id", f"device id {d.id!r} is also used by devices[{device_ids[d.id]}]")
            device_ids[d.id] = i
            if d.server not in server_ids:
                raise InputError(file, f"devices[{i}].server",
                                 f"unknown server {d.server!r}; servers are {sorted(server_ids)}")

    def to_dict(self) -> dict[str, Any]:
        """The ``pipeplan.cluster/1`` object (unknown fields kept)."""
        data = {"format": CLUSTER_FORMAT, "name": self.name, **self.extra}  # format first, as files are read
        data.update({"format": CLUSTER_FORMAT, "name": self.name,
                     "servers": [s.to_dict() for s in self.servers],
                     "network": self.network.to_dict(),
                     "devices": [d.to_dict() for d in self.devices]})
        return data


def _read_server(item: Any, file: str, where: str) -> Link:
    r = Reader(item, file, where)
    return Link(r.number("bandwidth", positive=True), r.number("latency"), r.string("id"),
                r.extras(_LINK_FIELDS))


def _read_device(item: Any, file: str, where: str) -> Device:
    r = Reader(item, file, where)
    return Device(r.string("id"), r.string("server"), r.number("speed", positive=True),
                  r.number("memory"), r.extras(_DEVICE_FIELDS))


def load_cluster(path: str) -> Cluster:
    """Load and check a ``pipeplan.cluster/1`` file.

    Raises
    ------
    InputError
        On a missing file, invalid JSON, a missing or mistyped field, an unknown format
        version, a non-positive bandwidth or speed, a negative latency or memory, a
        repeated id or a device on an unknown server.
    """
    return Cluster.from_dict(load_json(path), str(path))


def _distinct_pair(xs: set, ys: set) -> bool:
    """Whether some ``x`` in ``xs`` and ``y`` in ``ys`` differ."""
    return bool(xs) and bool(ys) and not (len(xs) == 1 and xs == ys)
