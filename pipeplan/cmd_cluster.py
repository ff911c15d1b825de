"""``pipeplan cluster``: write a ``pipeplan.cluster/1`` file from a few words, or from this machine.

``--server 2x8:a100-80g:nvlink3 --server 4x8:v100-32g:pcie3 --network ib-hdr`` takes every
figure from the catalog (``--list`` prints it); ``--detect`` describes the local machine.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.solver.formats.catalog import load_catalog
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.bounds.infeasibility import format_bytes
from pipeplan.solver.formats.cluster_spec import DEFAULT_MEMORY_RESERVE, build_cluster, parse_server_group


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="write a cluster file from the device catalog or this machine",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--server", action="append", default=[], metavar="[N x]M:KIND[:LINK]",
                   help="N servers (default 1) of M devices of KIND joined by LINK (default the kind's usual "
                        "one), e.g. 2x8:a100-80g:nvlink3; repeat for more groups")
    p.add_argument("--network", metavar="LINK", help="link between servers, e.g. ib-hdr (needed for 2+ servers)")
    p.add_argument("--reference", metavar="KIND",
                   help="kind the graph was profiled on, speed 1 (default the first --server's kind, or with "
                        "--detect the first GPU's)")
    p.add_argument("--memory-reserve", type=float, default=DEFAULT_MEMORY_RESERVE, metavar="R",
                   help=f"share of each device's memory left to the framework (default {DEFAULT_MEMORY_RESERVE})")
    p.add_argument("--name", help="the cluster's name (default from the servers)")
    p.add_argument("--detect", action="store_true", help="describe this machine (torch.cuda, nvidia-smi topo -m)")
    p.add_argument("--processes", type=int, metavar="N",
                   help="with --detect: the first N GPUs, or N CPU processes on a machine without CUDA (default 2)")
    p.add_argument("--list", action="store_true", help="print the catalog of accelerators and links")
    p.add_argument("--json", action="store_true", help="with --list: print the catalog as JSON")
    p.add_argument("-o", "--output", metavar="CLUSTER.json", help="file to write (default: print it)")
    add_force_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List the catalog, or build or detect a cluster and write it."""
    if args.list:
        _refuse_with(args, "--list", ("server", "detect", "output", "network", "reference", "name", "processes"))
        return _print_catalog(args.json)
    if args.json:
        raise InputError("-", "--json", "prints the catalog: add --list, or drop it")
    check_outputs(args, args.output)
    notes: list[str] = []
    if args.detect:
        _refuse_with(args, "--detect", ("server", "network"))
        from pipeplan.runtime.detect import detect_cluster

        cluster, notes = detect_cluster(args.processes, memory_reserve=args.memory_reserve,
                                        reference=args.reference)
        if args.name:
            cluster = Cluster(args.name, cluster.servers, cluster.network, cluster.devices, cluster.extra)
    else:
        if args.processes is not None:
            raise InputError("-", "--processes", "counts processes of --detect: add --detect, or drop it")
        if not args.server:
            raise InputError("-", "--server", "give servers (e.g. --server 2x8:a100-80g:nvlink3), --detect or --list")
        groups = [parse_server_group(text) for text in args.server]
        cluster = build_cluster(groups, args.network, reference=args.reference,
                                memory_reserve=args.memory_reserve, name=args.name)
    text = dumps(cluster.to_dict())
    if args.output is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{'wrote ' + args.output + ': ' if args.output else ''}{summary(cluster)}", file=sys.stderr)
    return 0


def _refuse_with(args: argparse.Namespace, mode: str, others: tuple[str, ...]) -> None:
    for key in others:
        if getattr(args, key) not in (None, [], False):
            raise InputError("-", "--" + key, f"does not go with {mode}: drop one of them")


def summary(cluster: Cluster) -> str:
    """One line per kind of device and link: how many, speed, memory, bandwidth.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster_spec import build_cluster, parse_server_group
    >>> print(summary(build_cluster([parse_server_group("1x2:a100-80g")], None)))
    1x2-a100-80g: 1 server, 2 devices
      2 x a100-80g  speed 1.000  memory 77.31 GB
      server link nvlink3  300 GB/s each way  latency 5 us
      network nvlink3  300 GB/s each way  latency 5 us
    """
    lines = [f"{cluster.name}: {_count(len(cluster.servers), 'server')}, {_count(len(cluster.devices), 'device')}"]
    kinds = Counter((d.extra.get("kind") or d.extra.get("model") or "?", d.speed, d.memory) for d in cluster.devices)
    for (kind, speed, memory), count in kinds.items():
        lines.append(f"  {count} x {kind}  speed {speed:.3f}  memory {format_bytes(memory, 2)}")
    links = Counter((s.extra.get("link", "?"), s.bandwidth, s.latency) for s in cluster.servers)
    for link, bandwidth, latency in links:
        lines.append(f"  server link {link}  {bandwidth / 1e9:g} GB/s each way  latency {latency * 1e6:g} us")
    net = cluster.network
    lines.append(f"  network {net.extra.get('link', '?')}  {net.bandwidth / 1e9:g} GB/s each way  "
                 f"latency {net.latency * 1e6:g} us")
    return "\n".join(lines)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _print_catalog(as_json: bool) -> int:
    catalog = load_catalog()
    if as_json:
        data: dict[str, Any] = {
            "accelerators": [{"id": a.id, "name": a.name, "memory": a.memory, "flops": a.flops,
                              "flops_dtype": a.flops_dtype, "memory_bandwidth": a.memory_bandwidth,
                              "link": a.link, "pcie": a.pcie, "source": a.source}
                             for a in catalog.accelerators.values()],
            "links": [{"id": k.id, "name": k.name, "scope": k.scope, "bandwidth": k.bandwidth,
                       "latency": k.latency, "source": k.source} for k in catalog.links.values()]}
        sys.stdout.write(dumps(data))
        return 0
    from rich.console import Console
    from rich.table import Table

    devices = Table(title="accelerators (peak dense FLOP/s; sources: --list --json)")
    for col in ("kind", "name", "TFLOP/s", "dtype", "memory", "memory GB/s", "usual link"):
        devices.add_column(col, justify="left" if col in ("kind", "name", "dtype", "usual link") else "right")
    for a in catalog.accelerators.values():
        devices.add_row(a.id, a.name, f"{a.flops / 1e12:g}", a.flops_dtype, format_bytes(a.memory),
                        f"{a.memory_bandwidth / 1e9:g}", a.link)
    links = Table(title="links (bandwidth one way between two devices)")
    for col in ("link", "name", "scope", "GB/s each way", "latency (us)"):
        links.add_column(col, justify="right" if col in ("GB/s each way", "latency (us)") else "left")
    for k in catalog.links.values():
        links.add_row(k.id, k.name, k.scope, f"{k.bandwidth / 1e9:g}", f"{k.latency * 1e6:g}")
    console = Console(width=140)
    console.print(devices)
    console.print(links)
    return 0
