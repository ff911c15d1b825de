"""The ``pipeplan`` command line: one sub-command per module under ``pipeplan/``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a handler ``(args) -> int``.  Bad input raises
:class:`pipeplan.models.errors.InputError`; :func:`main` prints it as one ``error:`` line and
returns 2, so no traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from pipeplan.models.errors import InputError, one_line

#: Command modules, in the order ``pipeplan --help`` lists them.
COMMAND_MODULES = (
    "pipeplan.cmd_validate",
    "pipeplan.cmd_simulate",
    "pipeplan.cmd_plan",
    "pipeplan.cmd_models",
    "pipeplan.cmd_run",
    "pipeplan.cmd_calibrate",
    "pipeplan.cmd_pareto",
)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in pipeplan's one-line form (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(one_line(f"error: {self.prog}: arguments: {message}") + "\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pipeplan", description="Plan, prove and run pipeline-parallel training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input, 3 no feasible plan)."""
    previous = _on_sigterm(_terminated)
    try:
        args = build_parser().parse_args(argv)  # inside: a Ctrl-C while the commands import is one line too
        return int(args.func(args) or 0)
    except InputError as exc:
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
