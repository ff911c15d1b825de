"""The parser: every ``--help`` ends with one example invocation that the parser accepts, and a
parser built for one command (what ``main`` runs) is that command's part of the full one."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pipeplan.cli import EXAMPLES, build_parser, main


def _commands() -> list[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sorted(sub.choices)


class TestHelpExamples:
    @pytest.mark.parametrize("command", ["", *_commands()])
    def test_help_ends_with_the_example(self, command, capsys):
        with pytest.raises(SystemExit) as stop:
            main([command, "--help"] if command else ["--help"])
        assert stop.value.code == 0
        lines = capsys.readouterr().out.rstrip("\n").split("\n")
        assert lines[-2] == "example:"
        assert lines[-1].startswith(f"  pipeplan {command}".rstrip())

    @pytest.mark.parametrize("command", _commands())
    def test_every_command_has_an_example(self, command):
        assert command in EXAMPLES

    @pytest.mark.parametrize("name", sorted(EXAMPLES))
    def test_the_example_parses(self, name):
        argv = shlex.split(EXAMPLES[name])
        assert argv[0] == "pipeplan"
        args = build_parser().parse_args(argv[1:])
        assert name == "pipeplan" or args.command == name


def _command_help(parser, command: str) -> str:
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices[command].format_help()


class TestCommandModule:
    @pytest.mark.parametrize("command", _commands())
    def test_names_the_module_that_registers_the_command(self, command):
        import importlib

        from pipeplan.cli import COMMAND_MODULES, _empty_parser, command_module

        home = command_module(command)
        assert home in COMMAND_MODULES
        parser, sub = _empty_parser()
        importlib.import_module(home).register(sub)
        assert command in sub.choices

    @pytest.mark.parametrize("name", ["", "nope", "cmd_plan", "plan.x", "../plan"])
    def test_none_for_names_no_module_registers(self, name):
        from pipeplan.cli import command_module

        assert command_module(name) is None


class TestBuildParser:
    @pytest.mark.parametrize("command", _commands())
    def test_one_command_parses_and_helps_as_in_the_full_parser(self, command):
        full, alone = build_parser(), build_parser(command)
        assert _command_help(alone, command) == _command_help(full, command)
        argv = shlex.split(EXAMPLES[command])[1:]
        assert vars(alone.parse_args(argv)) == vars(full.parse_args(argv))

    def test_an_unknown_command_gets_the_full_list(self, capsys):
        with pytest.raises(SystemExit) as stop:
            build_parser("nope").parse_args(["nope"])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "invalid choice: 'nope'" in err and all(c in err for c in _commands())

    def test_a_solver_command_does_not_import_torch(self):
        # pipeplan simulate/plan start without torch (seconds at every start of a CLI process)
        import subprocess
        import sys

        code = ("import sys; from pipeplan.cli import main; "
                "status = main(['simulate', 'examples/chain8.graph.json', 'examples/two-servers.cluster.json', "
                "'examples/hetero.plan.json', '--json']); print(status, 'torch' in sys.modules)")
        root = Path(__file__).resolve().parents[1]
        done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
        assert done.stdout.split()[-2:] == ["0", "False"], done.stderr


class TestHelpIsLight:
    """``--help`` and ``--version`` import neither torch nor pymoo (seconds at every start, more on a busy machine)."""

    def test_no_torch_or_pymoo_in_a_fresh_interpreter(self):
        import subprocess
        import sys

        code = ("import contextlib, io, sys; from pipeplan.cli import main\n"
                "def run(argv):\n"
                "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit): main(argv)\n"
                f"for argv in [['--help'], ['--version'], *[[c, '--help'] for c in {_commands()!r}]]: run(argv)\n"
                "print(sorted(m for m in ('torch', 'pymoo') if m in sys.modules))")
        root = Path(__file__).resolve().parents[1]
        done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
        assert done.stdout.strip().splitlines()[-1:] == ["[]"], done.stdout + done.stderr

    def test_version(self, capsys):
        import importlib.metadata

        with pytest.raises(SystemExit) as stop:
            main(["--version"])
        assert stop.value.code == 0
        assert capsys.readouterr().out == f"pipeplan {importlib.metadata.version('pipeplan')}\n"


class TestChoicesNamedWithoutTheirModules:
    """The choices a parser lists without importing the torch modules that define them agree with those modules."""

    def test_export_targets(self):
        from pipeplan.cmd_export import EXPORT_TARGETS
        from pipeplan.runtime.export import TARGETS

        assert EXPORT_TARGETS == tuple(sorted(TARGETS))

    def test_profile_optimizers(self):
        from pipeplan.cmd_models import OPTIMIZER_NAMES
        from pipeplan.models.profile_step import OPTIMIZERS

        assert OPTIMIZER_NAMES == tuple(OPTIMIZERS)

    def test_trace_modes(self):
        from pipeplan.models.imported import TRACES
        from pipeplan.models.model_options import TRACE_CHOICES

        assert TRACE_CHOICES == TRACES
