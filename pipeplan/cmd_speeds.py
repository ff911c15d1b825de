"""``pipeplan speeds REFERENCE OTHER``: the speed of a device kind from one model profiled on two.

Prints the per-layer ratio of times (reference / other), its median and spread, and the
whole-model ratio; with ``--cluster C --kind K -o OUT`` writes ``C`` with the devices of
kind ``K`` at that speed.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.speeds import STATISTICS, WIDE_SPREAD, SpeedComparison, compare_speeds, set_kind_speed

DEFAULT_SAMPLES = 8
"""Samples per replica the layer times are compared at."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("speeds", help="a device kind's speed from one model profiled on two kinds",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("reference", metavar="REFERENCE", help="graph profiled on the reference device (speed 1)")
    p.add_argument("other", metavar="OTHER", help="the same model profiled on the other device")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, metavar="N",
                   help=f"samples per replica the layer times are compared at (default {DEFAULT_SAMPLES})")
    p.add_argument("--cluster", metavar="CLUSTER", help="cluster to write the speed into")
    p.add_argument("--kind", metavar="KIND", help="with --cluster: the kind OTHER was profiled on")
    p.add_argument("--reference-kind", metavar="KIND",
                   help="with --cluster: the kind REFERENCE was profiled on (default the cluster's reference)")
    p.add_argument("--statistic", default="total", choices=STATISTICS,
                   help="the scalar written: total (whole-model ratio, default) or median (of the layers)")
    p.add_argument("-o", "--output", metavar="OUT.json", help="with --cluster: the cluster to write")
    add_force_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compare, print, and write the cluster when asked."""
    writing = [name for name in ("cluster", "kind", "output") if getattr(args, name) is not None]
    if writing and len(writing) < 3:
        missing = sorted({"cluster", "kind", "output"} - set(writing))
        raise InputError("-", f"--{missing[0]}", "--cluster, --kind and -o go together: give all three or none")
    if args.reference_kind is not None and not writing:
        raise InputError("-", "--reference-kind", "names a kind of --cluster: add --cluster, --kind and -o")
    check_outputs(args, args.output, inputs={"reference graph": args.reference, "other graph": args.other})
    reference, other = load_graph(args.reference), load_graph(args.other)
    comparison = compare_speeds(reference, other, args.samples, reference_file=args.reference,
                                other_file=args.other)
    if writing:
        cluster = load_cluster(args.cluster)
        speed = comparison.speed(args.statistic)
        note = (f"measured: {args.statistic} ratio {speed:.4g} of {args.reference} / {args.other} at "
                f"{args.samples} samples (layers: median {comparison.median:.4g}, min {comparison.minimum:.4g}, "
                f"max {comparison.maximum:.4g}, time-weighted cv {comparison.weighted_cv:.3f})")
        cluster = set_kind_speed(cluster, args.kind, speed, args.reference_kind, file=args.cluster, note=note)
        atomic_write_text(args.output, dumps(cluster.to_dict()))
    if args.json:
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=2) + "\n")
    else:
        _print(comparison, args.reference, args.other)
    if comparison.wide:
        warn(f"warning: the per-layer ratio spreads from {comparison.minimum:.3f} to {comparison.maximum:.3f} "
             f"(time-weighted cv {comparison.weighted_cv:.2f} > {WIDE_SPREAD}): one speed per device misstates "
             "some stages' times; see docs/clusters.md")
    if writing:
        changed = sum(d.extra.get("kind") == args.kind for d in cluster.devices)
        print(f"wrote {args.output}: {changed} devices of kind {args.kind} at speed {speed:.4g}", file=sys.stderr)
    return 0


def _print(c: SpeedComparison, reference: str, other: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"time per layer at {c.samples} samples: {reference} vs {other}")
    for col in ("layer", "reference (ms)", "other (ms)", "ratio ref/other"):
        table.add_column(col, justify="left" if col == "layer" else "right")
    for name, r, o, q in zip(c.names, c.reference_times, c.other_times, c.ratios):
        table.add_row(name, f"{r * 1e3:.4f}", f"{o * 1e3:.4f}", "-" if q is None else f"{q:.3f}")
    console = Console(width=120)
    console.print(table)
    console.print(f"speed of the other device: total {c.total:.4f} (whole model), median {c.median:.4f}, "
                  f"min {c.minimum:.4f}, max {c.maximum:.4f}, cv {c.cv:.3f} (time-weighted {c.weighted_cv:.3f})")
