"""Fuzzing the CLI: mutated example files and options must keep the error contract.

Hypothesis mutates the graphs, clusters and plans in ``examples/`` (types, keys,
extreme numbers, sizes, names), swaps files for special paths (FIFOs, devices,
folders, dangling symlinks, broken bytes), draws options, and runs
:func:`pipeplan.cli.main` in-process.  Whatever it draws:

* the exit status is 0, 2 or 3;
* on 2, stderr is exactly one line, starting ``error:``;
* on failure (2 or 3) no file is written and special outputs are left as they were;
* on success with ``--json``, stdout is strict JSON (no ``NaN`` or ``Infinity``);
* no ``RuntimeWarning`` (numpy's overflow warnings) reaches the user;
* a solving command ends within its time limit plus 10 % (and a fixed allowance for
  loading and simulating on a loaded machine).

``make test`` runs a fixed, derandomised budget (:data:`FAST_EXAMPLES`); ``make fuzz``
sets ``PIPEPLAN_FUZZ_EXAMPLES`` (and a random seed) for a long run.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES, cpu_past
from pipeplan.cli import main

FAST_EXAMPLES = 250
"""Examples per test in ``make test`` (derandomised: the same ones every run)."""

LONG_EXAMPLES = int(os.environ.get("PIPEPLAN_FUZZ_EXAMPLES", "0"))
"""Examples per test in ``make fuzz`` (0: the fast, derandomised budget)."""

TIME_LIMIT = 1.0
"""``--time-limit`` of the solving commands: small, so a limit ignored shows."""

ALLOWANCE = 2.0
"""CPU seconds beyond 10 % of the limit for loading, checking and simulating, counted in this process's CPU
time past the limit (which a busy machine does not stretch as it stretches the wall clock)."""

SETTINGS = settings(
    max_examples=LONG_EXAMPLES or FAST_EXAMPLES, derandomize=not LONG_EXAMPLES, deadline=None,
    database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

SOURCES = {
    "chain8": ("chain8.graph.json", "two-servers.cluster.json", "hetero.plan.json"),
    "custom": ("chain8.graph.json", "two-servers.cluster.json", "custom.plan.json"),
    "skip8": ("skip8.graph.json", "two-servers.cluster.json", "skip8.plan.json"),
    "pair": ("chain8.graph.json", "cpu-pair.cluster.json", "hetero.plan.json"),
}

EXTREME_NUMBERS = [0, -1, 1, 2, 0.5, -0.0, 5e-324, 2.2e-308, 1e-300, 1e-9, 1e9, 1e300, 1.6e307,
                   1.7976931348623157e308, 2 ** 31, 2 ** 53, 2 ** 53 + 1, 2 ** 63, 10 ** 400, 10 ** 6]
ODD_VALUES = [None, True, False, "", "x", "\ud800", "é\n\x1b[31m", "a" * 300, [], {}, [0], [[]],
              [1e308, 1e308], {"a": 1}]
FILE_SWAPS = ["fifo", "dev-zero", "folder", "missing", "dangling", "empty", "bom", "latin1", "truncated",
              "nan-literal", "deep"]


def _load(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text())


# ----------------------------------------------------------------- mutation
def _places(doc: Any, path: tuple = ()) -> list[tuple]:
    """Every path (a tuple of keys and indices) to a value inside ``doc``."""
    found = [path]
    if isinstance(doc, dict):
        for key, child in doc.items():
            found.extend(_places(child, path + (key,)))
    elif isinstance(doc, list):
        for i, child in enumerate(doc):
            found.extend(_places(child, path + (i,)))
    return found


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw, doc: Any) -> Any:
    """``doc`` with up to three mutations at places hypothesis picks."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(0, 3))):
        places = _places(doc)
        path = places[draw(st.integers(0, len(places) - 1))]
        if not path:
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        action = draw(st.sampled_from(["number", "odd", "scale", "delete", "extra", "grow", "shrink", "rename"]))
        if action == "number":
            parent[key] = draw(st.sampled_from(EXTREME_NUMBERS) | st.floats(allow_nan=False, allow_infinity=False)
                               | st.integers(-2 ** 70, 2 ** 70))
        elif action == "odd":  # a copy: a later mutation inside it must not change ODD_VALUES
            parent[key] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        elif action == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * draw(st.sampled_from([0, -1, 1e-300, 1e-30, 1e30, 1e300, 10 ** 300]))
        elif action == "delete":
            del parent[key]
        elif action == "extra" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["zz", "comment", "name", "\ud800"]))] = copy.deepcopy(
                draw(st.sampled_from(ODD_VALUES)))
        elif action == "grow" and isinstance(parent[key], list) and parent[key]:
            # copies, not the same items many times: a mutation inside one must leave the others
            parent[key] = [copy.deepcopy(item) for item in parent[key] * draw(st.sampled_from([2, 3, 50]))]
        elif action == "shrink" and isinstance(parent[key], list):
            parent[key] = parent[key][:draw(st.integers(0, max(0, len(parent[key]) - 1)))]
        elif action == "rename" and isinstance(parent[key], str):
            parent[key] = draw(st.sampled_from(["other", "d0", "g0", "local", "s0", "chain8", ""]))
    return doc


# ----------------------------------------------------------------- files
def _special(kind: str, path: Path) -> str:
    """Make ``path`` the special input ``kind``; returns the argument to pass."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        return "/dev/zero"
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(path.with_name("gone"))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + (EXAMPLES / "chain8.graph.json").read_bytes())
    elif kind == "latin1":
        path.write_bytes(b'{"format": "pipeplan.graph/1", "name": "\xe9"}')
    elif kind == "truncated":
        path.write_bytes((EXAMPLES / "hetero.plan.json").read_bytes()[:150])
    elif kind == "nan-literal":
        path.write_bytes(b'{"format": "pipeplan.cluster/1", "x": NaN}')
    elif kind == "deep":
        path.write_bytes(b"[" * 100000 + b"]" * 100000)
    return str(path)


def _write_inputs(draw, folder: Path, source: str) -> list[str]:
    """The graph, cluster and plan files of ``source``, mutated or swapped for special paths."""
    names = SOURCES[source]
    paths = []
    for role, name in zip(("graph", "cluster", "plan"), names):
        path = folder / f"{role}.json"
        if draw(st.integers(0, 24)) == 0:
            paths.append(_special(draw(st.sampled_from(FILE_SWAPS)), path))
            continue
        doc = _load(name)
        if draw(st.integers(0, 2)) == 0:  # most runs keep a file valid, so that the command gets further
            doc = draw(mutated(doc))
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    return paths


def _output(draw, folder: Path, name: str) -> str:
    """An output path: usually new, sometimes a FIFO, a dangling symlink, a read-only file or a folder."""
    path = folder / "out" / name
    kind = draw(st.sampled_from(["new"] * 12 + ["fifo", "dangling", "read-only", "folder", "existing"]))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to(folder / "out" / "gone")
    elif kind in ("read-only", "existing"):
        path.write_text("{}")
        if kind == "read-only":
            path.chmod(stat.S_IRUSR)
    elif kind == "folder":
        path.mkdir()
    return str(path)


# ----------------------------------------------------------------- commands
SANE_BATCHES, BATCHES = [8, 64], [1, 2, 1000, 10 ** 6, 2 ** 53, 2 ** 53 + 1, 0, -1]
SANE_MICROBATCHES, MICROBATCHES = ["2", "8", "auto"], ["1", "64", "256", "257", "1000", "1000000", "0"]
SOLVERS = ["even", "greedy-speed", "cpsat", "cpsat-split", "group-search", "nsga", "nonsense"]


def _problem_options(draw) -> list[str]:
    batch = draw(st.sampled_from(SANE_BATCHES * 3 + BATCHES))
    options = ["--batch", str(batch), "--microbatches", draw(st.sampled_from(SANE_MICROBATCHES * 4 + MICROBATCHES)),
               "--time-limit", str(TIME_LIMIT)]
    if options[3] == "auto" and draw(st.booleans()):
        options += ["--max-microbatches", str(draw(st.sampled_from([1, 8, 64, 1000, 10 ** 9])))]
    if draw(st.booleans()):
        options += ["--schedule", draw(st.sampled_from(["gpipe", "1f1b"]))]
    if draw(st.integers(0, 7)) == 0:
        options += ["--state-factor", str(draw(st.sampled_from([0, 1e300, 1e-300, -1])))]
    if draw(st.integers(0, 7)) == 0:
        options += ["--max-stages", str(draw(st.sampled_from([1, 2, 0, 10 ** 6])))]
    return options


@st.composite
def command(draw, folder: Path) -> tuple[list[str], float | None]:
    """``(argv, time limit of the whole command or None)`` for a command on files in ``folder``."""
    graph, cluster, plan = _write_inputs(draw, folder, draw(st.sampled_from(sorted(SOURCES))))
    which = draw(st.sampled_from(["validate", "simulate", "plan", "compare", "pareto"]))
    if which == "validate":
        files = draw(st.permutations([graph, cluster, plan]))
        return ["validate", *files[:draw(st.integers(1, 3))]], None
    if which == "simulate":
        argv = ["simulate", graph, cluster, plan, "--json"]
        if draw(st.booleans()):
            argv += ["--trace", _output(draw, folder, "trace.json")]
        return argv, None
    options = _problem_options(draw)
    if which == "plan":
        solver = draw(st.sampled_from(SOLVERS))
        return ["plan", graph, cluster, *options, "--solver", solver, "-o", _output(draw, folder, "plan.json"),
                *(["--force"] if draw(st.booleans()) else [])], TIME_LIMIT
    if which == "compare":
        solvers = draw(st.lists(st.sampled_from(SOLVERS[:4]), min_size=1, max_size=3, unique=True))
        argv = ["compare", graph, cluster, *options, "--solvers", ",".join(solvers), "--json"]
        if draw(st.booleans()):
            argv += ["--best", _output(draw, folder, "best.json")]
        return argv, TIME_LIMIT * len(solvers)
    return ["pareto", graph, cluster, *options, "--generations", "3", "--population", "8",
            "-o", _output(draw, folder, "front.json")], TIME_LIMIT


# ----------------------------------------------------------------- the contract
def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder``: its kind, size and content (files), link target (symlinks)."""
    entries = {}
    for path in sorted(folder.rglob("*")):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            entries[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            entries[str(path)] = ("file", info.st_mode, path.read_bytes())
        else:
            entries[str(path)] = ("other", stat.S_IFMT(info.st_mode))
    return entries


def _run(argv: list[str], limit: float | None = None) -> tuple[int, str, str, float]:
    """Status, stdout, stderr and the CPU seconds spent past ``limit`` (0 without one)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as seen, \
            cpu_past(limit) as over:
        warnings.simplefilter("always", RuntimeWarning)  # what a user's terminal would show
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse usage errors
            status = exc.code
    runtime = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert not runtime, f"RuntimeWarning reached the user: {runtime[0]}"
    return status, out.getvalue(), err.getvalue(), over.seconds


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} in the JSON output")
    return json.loads(text, parse_constant=refuse)


def check_contract(argv: list[str], limit: float | None, outputs: Path) -> None:
    """Run ``argv`` and assert the error contract (see the module docstring)."""
    before = _snapshot(outputs)
    status, out, err, past = _run(argv, limit)
    event(f"{argv[0]} exit {status}")  # make fuzz --hypothesis-show-statistics: how many got how far
    assert status in (0, 2, 3), f"exit {status}: {err[-2000:]}"
    if status == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    if status != 0:
        assert _snapshot(outputs) == before, f"exit {status} changed the outputs: {err}"
    elif "--json" in argv:
        _strict_json(out)
    if limit is not None:
        assert past <= 0.1 * limit + ALLOWANCE, f"{past:.2f} CPU s past a time limit of {limit} s"


class TestMain:
    """:func:`pipeplan.cli.main` under mutated inputs and options."""

    @SETTINGS
    @given(st.data())
    def test_the_error_contract_holds(self, data):
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            (folder / "out").mkdir()
            argv, limit = data.draw(command(folder), label="command")
            check_contract(argv, limit, folder / "out")
