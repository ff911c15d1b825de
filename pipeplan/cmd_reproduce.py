"""``pipeplan reproduce``: measure the seed papers' headline claims and write a report.

Writes ``DIR/report.md`` (one section per claim, figures as PNG files next to it) and
``DIR/results.json`` (every number); see ``docs/reproduce.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeplan.models.errors import InputError
from pipeplan.outputs import add_force_option, check_outputs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reproduce", help="measure the seed papers' claims; write report.md and results.json",
                       description=__doc__)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the report (created if missing)")
    add_force_option(p)
    p.add_argument("--quick", action="store_true", help="smaller instances and limits (under 2 minutes)")
    p.add_argument("--only", metavar="NAME,...", help="run only these claims (comma-separated)")
    p.add_argument("--seed", type=int, default=0, help="seed of every solver and synthetic network (default 0)")
    p.set_defaults(func=run_reproduce)


def run_reproduce(args: argparse.Namespace) -> int:
    """``pipeplan reproduce``: run the selected claims and write the report."""
    from pipeplan.experiments.reproduce import reproduce, select

    names = select(args.only)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "--output", "is a file, not a folder: name a folder")
    check_outputs(args, *((out / "report.md", out / "results.json") if out.is_dir() else (out,)))
    out.mkdir(exist_ok=True)
    start = time.perf_counter()
    reproduce(out, names, args.quick, args.seed, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"{len(names)} claims in {time.perf_counter() - start:.0f} s -> {out / 'report.md'}, "
          f"{out / 'results.json'}")
    return 0
