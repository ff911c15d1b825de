"""The ``pipeplan`` command line: one sub-command per module under ``pipeplan/``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a handler ``(args) -> int``.  Bad input raises
:class:`pipeplan.models.errors.InputError`; :func:`main` prints it as one ``error:`` line and
returns 2, so no traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import signal
import sys
import traceback

import numpy as np

from pipeplan import notices
from pipeplan.models.errors import InputError, one_line

#: Command modules, in the order ``pipeplan --help`` lists them.
COMMAND_MODULES = (
    "pipeplan.cmd_cluster",
    "pipeplan.cmd_validate",
    "pipeplan.cmd_simulate",
    "pipeplan.cmd_plan",
    "pipeplan.cmd_models",
    "pipeplan.cmd_run",
    "pipeplan.cmd_calibrate",
    "pipeplan.cmd_speeds",
    "pipeplan.cmd_pareto",
    "pipeplan.cmd_reproduce",
    "pipeplan.cmd_export",
    "pipeplan.cmd_schema",
)


#: One example invocation per command, printed at the end of its ``--help``; the
#: files named are the ones in ``examples/`` or what the tutorial writes.
EXAMPLES = {
    "pipeplan": "pipeplan plan examples/chain8.graph.json examples/two-servers.cluster.json "
                "--batch 64 --microbatches 8 --solver cpsat -o plan.json",
    "cluster": "pipeplan cluster --server 2x8:a100-80g:nvlink3 --server 4x8:v100-32g:pcie3 "
               "--network ib-hdr -o cluster.json",
    "speeds": "pipeplan speeds a100.graph.json v100.graph.json --cluster cluster.json --kind v100-32g "
              "-o measured.cluster.json",
    "validate": "pipeplan validate examples/chain8.graph.json examples/two-servers.cluster.json "
                "examples/hetero.plan.json",
    "simulate": "pipeplan simulate examples/chain8.graph.json examples/two-servers.cluster.json "
                "examples/hetero.plan.json --gantt hetero.png",
    "plan": "pipeplan plan examples/chain8.graph.json examples/two-servers.cluster.json "
            "--batch 64 --microbatches 8 --solver cpsat --time-limit 20 -o plan.json",
    "compare": "pipeplan compare examples/chain8.graph.json examples/two-servers.cluster.json "
               "--batch 64 --microbatches 8 --time-limit 10 --plot compare.png",
    "pareto": "pipeplan pareto examples/chain8.graph.json examples/two-servers.cluster.json "
              "--batch 64 --microbatches 8 --time-limit 10 -o front.json --plot front.png",
    "models": "pipeplan models --json",
    "export": "pipeplan export plan.json --to torch --graph gpt-tiny.graph.json -o export-torch",
    "schema": "pipeplan schema plan",
    "reproduce": "pipeplan reproduce --quick -o out/reproduce",
    "profile": "pipeplan profile gpt-tiny --batch-sizes 1,2,4,8 -o gpt-tiny.graph.json",
    "run": "pipeplan run gpt-tiny.graph.json examples/cpu-pair.cluster.json plan.json "
           "--model gpt-tiny --steps 4 --verify",
    "calibrate": "pipeplan calibrate gpt-tiny.graph.json examples/cpu-pair.cluster.json plan.json "
                 "--model gpt-tiny -o calibrated.cluster.json",
}


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in pipeplan's one-line form (exit 2), and ``--help``
    ending with the command's example from :data:`EXAMPLES`."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(one_line(f"error: {self.prog}: arguments: {message}") + "\n")
        raise SystemExit(2)

    def format_help(self) -> str:
        # Appended after formatting, so argparse does not re-wrap the command line.
        example = EXAMPLES.get(self.prog.split()[-1])
        text = super().format_help()
        return f"{text}\nexample:\n  {example}\n" if example else text


#: Commands whose module is not ``pipeplan.cmd_<command>``.
COMMAND_HOMES = {"compare": "pipeplan.cmd_plan", "profile": "pipeplan.cmd_models"}


def command_module(command: str) -> str | None:
    """The module of :data:`COMMAND_MODULES` that registers ``command``, or None if unknown.

    Parameters
    ----------
    command : str
        A sub-command name, e.g. ``"plan"``.

    Returns
    -------
    str or None
        The module's import name.

    Examples
    --------
    >>> command_module("compare"), command_module("nope")
    ('pipeplan.cmd_plan', None)
    """
    home = COMMAND_HOMES.get(command, f"pipeplan.cmd_{command}")
    return home if home in COMMAND_MODULES else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``pipeplan`` parser.  Given the ``command`` about to run, only its module is
    imported (the runtime and export modules import torch, seconds at each start); without
    one, or for a name no module registers, every command is (``--help``, "invalid choice")."""
    home = command_module(command) if command else None
    if home is not None:
        parser, sub = _empty_parser()
        _register(sub, home)
        if command in sub.choices:
            return parser
    parser, sub = _empty_parser()
    for name in COMMAND_MODULES:
        _register(sub, name)
    return parser


def _empty_parser():
    parser = _Parser(prog="pipeplan", description="Plan, prove and run pipeline-parallel training.")
    parser.add_argument("--version", action="version", version=f"pipeplan {version()}")
    return parser, parser.add_subparsers(dest="command", required=True, parser_class=_Parser)


def version() -> str:
    """The installed package's version (``pyproject.toml``), or ``unknown`` when pipeplan is not installed.

    Examples
    --------
    >>> version() == importlib.metadata.version("pipeplan")
    True
    """
    try:
        return importlib.metadata.version("pipeplan")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: run from a source tree)"


def _register(sub, name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:  # a command not built yet
            return
        raise
    module.register(sub)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input, 3 no feasible plan)."""
    notices.discard()
    previous = _on_sigterm(_terminated)
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        command = argv[0] if argv and not argv[0].startswith("-") else None
        args = build_parser(command).parse_args(argv)  # inside: a Ctrl-C while the commands import is one line too
        # an overflow is caught where it reaches an output (an error line), not as a numpy warning
        with np.errstate(all="ignore"):
            status = int(args.func(args) or 0)
        if status == 0:  # warnings only after a success: a failure prints its one error line alone
            notices.flush(sys.stderr)
        return status
    except InputError as exc:
        if getattr(args, "debug", False) and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        sys.stderr.write(exc.line() + "\n")
        return 2
    except OSError as exc:  # a file that vanished or a full disk mid-run: still one line
        sys.stderr.write(one_line(f"error: {exc.filename or '-'}: io: {exc.strerror or exc}") + "\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: -: interrupted: stopped by the user\n")
        return 130
    except Terminated:
        sys.stderr.write("error: -: interrupted: terminated (SIGTERM)\n")
        return 128 + signal.SIGTERM
    finally:
        notices.discard()
        _on_sigterm(previous)


class Terminated(Exception):
    """SIGTERM arrived: unwind like Ctrl-C, so temporary files go and workers are killed."""


def _terminated(signum, frame) -> None:
    raise Terminated()


def _on_sigterm(handler):
    """Install ``handler`` for SIGTERM; returns the previous one (None outside the main thread)."""
    if handler is None:
        return None
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return None


if __name__ == "__main__":
    raise SystemExit(main())
