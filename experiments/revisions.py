"""Timing a benchmark on an earlier git revision, side by side with the checkout, in one run.

The revision is checked out in a temporary ``git worktree``.  Each round runs one
timing function of a benchmark file twice, once on the checkout's code and once on the
revision's, each in a fresh subprocess (pinned to one core by the function itself), the
two in alternating order, so that both see the same machine load.  The subprocess
imports ``pipeplan`` from a folder that links the chosen tree's folders in as the
installed package lays them out (``pyproject.toml``'s package-dir), not from the
environment's editable install.  The timing function is the benchmark file's own, run
against whichever simulator API the revision has; its arguments and its result travel
as JSON.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "solver", "runtime", "experiments", "schemas")
"""The folders installed as ``pipeplan.<folder>`` (pyproject.toml's package-dir)."""

_CHILD = """
import json, runpy, sys
view, bench, function, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]  # not the installed pipeplan
sys.path.insert(0, view)
import pipeplan
result = runpy.run_path(bench)[function](*args)
print(json.dumps({"pipeplan": pipeplan.__file__, "result": result}))
"""


def commit(rev: str) -> str:
    """The full commit id of ``rev`` in the checkout's repository."""
    return _git("rev-parse", "--verify", f"{rev}^{{commit}}")


def head() -> str:
    """The checkout's commit id, marked when the working tree differs from it."""
    found = _git("rev-parse", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no"):
        found += " with uncommitted changes"
    return found


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A temporary checkout of ``rev`` (a detached ``git worktree``), removed on leaving."""
    with tempfile.TemporaryDirectory(prefix="bench-rev-") as tmp:
        path = Path(tmp) / "tree"
        _git("worktree", "add", "--detach", str(path), commit(rev))
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           capture_output=True, text=True)


def package_view(tree: Path, view: Path) -> Path:
    """``view``, a folder from which ``import pipeplan`` imports ``tree``'s code (its folders linked in)."""
    (view / "pipeplan").mkdir(parents=True, exist_ok=True)
    for entry in (tree / "pipeplan").iterdir():
        (view / "pipeplan" / entry.name).symlink_to(entry)
    for folder in PACKAGES:
        if (tree / folder).is_dir():
            (view / "pipeplan" / folder).symlink_to(tree / folder)
    return view


def run(view: Path, bench: str, function: str, *args) -> dict:
    """``function(*args)`` of the benchmark file ``bench`` in a subprocess that imports ``pipeplan`` from ``view``."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(view), bench, function, json.dumps(args)],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{function} on {view} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def side_by_side(rev: str, bench: str, function: str, rounds: int, *args) -> dict:
    """``function(*args)`` on the checkout and on revision ``rev``, ``rounds`` times each, alternating.

    Every call returns ``{name: [numbers]}``; the result holds, per side, every
    number of every round under its name, and which revisions ran.
    """
    runs: dict[str, dict[str, list]] = {"this": {}, "baseline": {}}
    with worktree(rev) as tree, tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        views = [("this", package_view(ROOT, Path(tmp) / "this")), ("baseline", package_view(tree, Path(tmp) / "base"))]
        for r in range(rounds):
            for side, view in (views if r % 2 == 0 else views[::-1]):
                got = run(view, bench, function, *args)
                for name, values in got["result"].items():
                    runs[side].setdefault(name, []).extend(values)
    return {"this_revision": head(), "baseline_revision": commit(rev), "this": runs["this"],
            "baseline": runs["baseline"]}
