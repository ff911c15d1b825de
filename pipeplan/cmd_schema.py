"""``pipeplan schema NAME``: print the JSON Schema of a pipeplan file (graph, cluster, plan, result)."""

from __future__ import annotations

import argparse
import sys

from pipeplan.schema_files import SCHEMA_NAMES, schema_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a file kind", description=__doc__)
    p.add_argument("name", choices=SCHEMA_NAMES, help="graph, cluster, plan (its solver record: result) or result")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text(args.name))
    return 0
