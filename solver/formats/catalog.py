"""The catalog of accelerators and links (``catalog.json`` in this package), in the cluster
format's units.

Each entry keeps its figures as the data sheet prints them and a ``source`` saying where
they come from; :func:`load_catalog` converts them once, through
:func:`pipeplan.solver.formats.units.parse_figure`.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.units import parse_figure

CATALOG_FORMAT = "pipeplan.catalog/1"
LINK_SCOPES = ("server", "network", "any")
"""Where a link may serve: inside a server, between servers, or both."""


@dataclass(frozen=True)
class Accelerator:
    """One kind of accelerator, as its data sheet describes it."""

    id: str
    """Catalog name (``a100-80g``)."""
    short: str
    """Prefix of the device and server ids a cluster gives it (``a100``)."""
    name: str
    """The product name."""
    memory: float
    """Bytes of device memory."""
    flops: float
    """Peak dense FLOP/s in ``flops_dtype`` (tensor cores, no sparsity)."""
    flops_dtype: str
    """``bf16``, or ``fp16`` for devices without bf16."""
    memory_bandwidth: float
    """Peak device-memory bytes per second."""
    link: str
    """Catalog id of the link its servers usually have (``nvlink3``)."""
    pcie: str
    """Catalog id of its host interface (what a server without NVLink joins it by)."""
    device_names: tuple[str, ...]
    """What ``torch.cuda.get_device_name`` reports for it."""
    source: str
    """Where the figures come from, as printed there."""


@dataclass(frozen=True)
class LinkKind:
    """One kind of link between two devices."""

    id: str
    """Catalog name (``ib-hdr``)."""
    name: str
    """What it is."""
    scope: str
    """One of :data:`LINK_SCOPES`."""
    bandwidth: float
    """Bytes per second one way between two devices."""
    latency: float
    """Seconds of fixed cost per message (a typical figure, not a data-sheet one)."""
    source: str
    """Where the figures come from."""


@dataclass(frozen=True)
class Catalog:
    """All accelerators and links, by id."""

    accelerators: dict[str, Accelerator]
    """Accelerators by catalog id, in file order."""
    links: dict[str, LinkKind]
    """Links by catalog id, in file order."""

    def accelerator(self, kind: str, where: str = "kind") -> Accelerator:
        """The accelerator ``kind``.

        Raises
        ------
        InputError
            For an unknown kind, naming the closest ones.
        """
        if kind not in self.accelerators:
            raise InputError("-", where, f"unknown accelerator {kind!r}{_closest(kind, self.accelerators)}; "
                                         "`pipeplan cluster --list` shows them all")
        return self.accelerators[kind]

    def link(self, kind: str, scope: str, where: str = "link") -> LinkKind:
        """The link ``kind``, checked to serve ``scope`` (``server`` or ``network``).

        Raises
        ------
        InputError
            For an unknown kind (naming the closest ones) or one of another scope.
        """
        if kind not in self.links:
            raise InputError("-", where, f"unknown link {kind!r}{_closest(kind, self.links)}; "
                                         "`pipeplan cluster --list` shows them all")
        link = self.links[kind]
        if link.scope not in (scope, "any"):
            fitting = [k for k, v in self.links.items() if v.scope in (scope, "any")]
            raise InputError("-", where, f"{kind!r} ({link.name}) is a {link.scope} link, not a {scope} one; "
                                         f"{scope} links are {', '.join(fitting)}")
        return link

    def match_device_name(self, name: str) -> Accelerator | None:
        """The accelerator whose ``device_names`` hold ``name`` (case and spacing ignored), or ``None``."""
        wanted = " ".join(name.lower().split())
        for accelerator in self.accelerators.values():
            if any(" ".join(n.lower().split()) == wanted for n in accelerator.device_names):
                return accelerator
        return None


def _closest(word: str, names: Any) -> str:
    close = difflib.get_close_matches(word, list(names), n=3, cutoff=0.4)
    return f"; closest: {', '.join(close)}" if close else ""


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The catalog shipped with pipeplan, figures converted to the cluster format's units.

    Returns
    -------
    Catalog

    Examples
    --------
    >>> load_catalog().links["ib-hdr"].bandwidth
    25000000000.0
    >>> load_catalog().accelerators["a100-80g"].flops
    312000000000000.0
    """
    text = resources.files("pipeplan.solver.formats").joinpath("catalog.json").read_text(encoding="utf-8")
    return catalog_from_dict(json.loads(text))


def catalog_from_dict(data: dict[str, Any]) -> Catalog:
    """A :class:`Catalog` from the decoded ``catalog.json`` (a mistake in it raises ``InputError``)."""
    if data.get("format") != CATALOG_FORMAT:
        raise InputError("catalog.json", "format", f"expected {CATALOG_FORMAT!r}, got {data.get('format')!r}")
    accelerators = {}
    for i, a in enumerate(data["accelerators"]):
        where = f"accelerators[{i}]"
        accelerators[a["id"]] = Accelerator(
            a["id"], a["short"], a["name"], parse_figure(a["memory"], "bytes", f"{where}.memory"),
            parse_figure(a["flops"], "flops", f"{where}.flops"), a["flops_dtype"],
            parse_figure(a["memory_bandwidth"], "memory-bandwidth", f"{where}.memory_bandwidth"),
            a["link"], a["pcie"], tuple(a["device_names"]), a["source"])
    links = {}
    for i, k in enumerate(data["links"]):
        where = f"links[{i}]"
        if k["scope"] not in LINK_SCOPES:
            raise InputError("catalog.json", f"{where}.scope", f"expected one of {LINK_SCOPES}, got {k['scope']!r}")
        links[k["id"]] = LinkKind(k["id"], k["name"], k["scope"],
                                  parse_figure(k["bandwidth"], "link", f"{where}.bandwidth"),
                                  parse_figure(k["latency"], "seconds", f"{where}.latency"), k["source"])
    for a in accelerators.values():
        for field_name in ("link", "pcie"):
            if getattr(a, field_name) not in links:
                raise InputError("catalog.json", f"accelerators.{a.id}.{field_name}",
                                 f"names no link of the catalog: {getattr(a, field_name)!r}")
    return Catalog(accelerators, links)
