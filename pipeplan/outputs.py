"""The ``--force`` option of the commands that write files, and their up-front output check."""

from __future__ import annotations

import argparse
import os

from pipeplan.models.jsonio import check_writable


def add_force_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--force``: replace output files that are read-only."""
    parser.add_argument("--force", action="store_true",
                        help="replace output files even when they are read-only")


def check_outputs(args: argparse.Namespace, *paths: str | os.PathLike | None,
                  inputs: dict[str, str | None] | None = None) -> None:
    """:func:`~pipeplan.models.jsonio.check_writable` for ``paths``, honouring ``args.force``."""
    check_writable(*paths, inputs=inputs, force=getattr(args, "force", False))
