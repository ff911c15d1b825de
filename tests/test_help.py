"""Every ``--help`` ends with one example invocation that the parser accepts."""

from __future__ import annotations

import shlex

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
