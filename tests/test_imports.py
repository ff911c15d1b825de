"""The direction of imports: no circle inside a folder, and the layers only import downwards.

The graph is read from the source with :mod:`ast`: every ``import`` and ``from ...
import`` statement, at the top of a module or inside a function (an import moved into
a function to dodge a circle is still an edge).  Layers, lowest first: ``models``,
``solver``, ``runtime``, ``experiments``; the CLI (``pipeplan/``) may import them all.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

FOLDERS = {"models": "pipeplan.models", "solver": "pipeplan.solver", "runtime": "pipeplan.runtime",
           "experiments": "pipeplan.experiments", "pipeplan": "pipeplan"}
"""Source folder -> the package it installs as (pyproject.toml's package-dir)."""

FORBIDDEN = {"models": ("solver", "runtime", "experiments", "pipeplan"),
             "solver": ("runtime", "experiments", "pipeplan"),
             "runtime": ("experiments", "pipeplan")}
"""Folder -> the folders it must not import."""


def module_files(root: Path, folders: dict[str, str]) -> dict[str, tuple[str, Path]]:
    """Every module of the project: dotted name -> (its folder, its file).

    Parameters
    ----------
    root : Path
        The checkout.
    folders : dict of str to str
        Source folder -> installed package name.

    Returns
    -------
    dict
        ``pipeplan.solver.exact.solve -> ("solver", root / "solver/exact/solve.py")``; a package's
        ``__init__.py`` is named by the package.
    """
    found = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package] + parts)] = (folder, path)
    return found


def imported_modules(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (whose file is ``path``) imports anywhere in its file.

    ``from pkg import name`` imports ``pkg.name`` when that is a module of ``known``, else
    ``pkg``.  Relative imports are resolved against ``module`` (a package's
    ``__init__`` is named by the package, so ``from . import x`` in it means ``package.x``).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name in known and name != module}


def import_graph(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> nx.DiGraph:
    """Modules of the project, with an edge ``a -> b`` when ``a`` imports ``b``; each node carries its ``folder``."""
    files = module_files(root, folders)
    graph = nx.DiGraph()
    for module, (folder, _) in files.items():
        graph.add_node(module, folder=folder)
    for module, (_, path) in files.items():
        graph.add_edges_from((module, target) for target in imported_modules(path, module, set(files)))
    return graph


@functools.cache
def project_graph() -> nx.DiGraph:
    """:func:`import_graph` of the checkout, parsed once for the tests that only read it."""
    return import_graph()


def folder_cycle(graph: nx.DiGraph, folder: str) -> list[tuple[str, str]]:
    """An import circle among the modules of ``folder``, as edges, or ``[]`` if there is none."""
    inside = graph.subgraph(n for n, data in graph.nodes(data=True) if data["folder"] == folder)
    if nx.is_directed_acyclic_graph(inside):
        return []
    return list(nx.find_cycle(inside))


def layer_violations(graph: nx.DiGraph, forbidden: dict[str, tuple[str, ...]] = FORBIDDEN) -> list[tuple[str, str]]:
    """Edges from a folder to one it must not import."""
    folder = nx.get_node_attributes(graph, "folder")
    return sorted((a, b) for a, b in graph.edges if folder[b] in forbidden.get(folder[a], ()))


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


SOLVER = {"solver": "pipeplan.solver"}


class TestModuleFiles:
    def test_a_package_is_named_by_its_folder(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "", "solver/base/__init__.py": "", "solver/base/even.py": ""})
        assert {name: folder for name, (folder, _) in module_files(root, SOLVER).items()} == {
            "pipeplan.solver": "solver", "pipeplan.solver.base": "solver", "pipeplan.solver.base.even": "solver"}

    def test_the_project_modules_install_under_pipeplan(self):
        names = module_files(ROOT, FOLDERS)
        assert names["pipeplan.solver.exact.solve"] == ("solver", ROOT / "solver" / "exact" / "solve.py")
        assert names["pipeplan.cli"] == ("pipeplan", ROOT / "pipeplan" / "cli.py")


class TestImportedModules:
    KNOWN = {"pipeplan.solver", "pipeplan.solver.a", "pipeplan.solver.b", "pipeplan.solver.base"}

    def test_function_level_imports_count(self, tmp_path):
        path = _write(tmp_path, {"a.py": "def f():\n    from pipeplan.solver.b import g\n"}) / "a.py"
        assert imported_modules(path, "pipeplan.solver.a", self.KNOWN) == {"pipeplan.solver.b"}

    def test_a_name_from_a_package_is_the_package_and_a_submodule_is_itself(self, tmp_path):
        source = "from pipeplan.solver.base import best\nfrom pipeplan.solver import b\n"
        path = _write(tmp_path, {"a.py": source}) / "a.py"
        assert imported_modules(path, "pipeplan.solver.a", self.KNOWN) == {"pipeplan.solver.base", "pipeplan.solver.b"}

    def test_relative_imports_are_resolved(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "from . import a\n", "solver/a.py": "from .b import g\n"})
        assert imported_modules(root / "solver/__init__.py", "pipeplan.solver", self.KNOWN) == {"pipeplan.solver.a"}
        assert imported_modules(root / "solver/a.py", "pipeplan.solver.a", self.KNOWN) == {"pipeplan.solver.b"}

    def test_outside_modules_are_left_out(self, tmp_path):
        path = _write(tmp_path, {"a.py": "import math\nimport numpy as np\nfrom pipeplan.solver.a import x\n"}) / "a.py"
        assert imported_modules(path, "pipeplan.solver.a", self.KNOWN) == set()


class TestImportGraph:
    def test_edges_point_from_importer_to_imported(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "", "solver/a.py": "from pipeplan.solver.b import f\n",
                                 "solver/b.py": "def f():\n    from pipeplan.solver import c\n",
                                 "solver/c.py": "import math\n"})
        assert set(import_graph(root, SOLVER).edges) == {("pipeplan.solver.a", "pipeplan.solver.b"),
                                                         ("pipeplan.solver.b", "pipeplan.solver.c")}

    def test_the_exact_solver_imports_its_parts_and_none_of_them_reaches_it(self):
        graph = project_graph()
        parts = [f"pipeplan.solver.{part}" for part in
                 ("exact.enumeration", "exact.phases", "exact.search", "exact.bound_model", "exact.data")]
        assert all(graph.has_edge("pipeplan.solver.exact.solve", part) for part in parts)
        assert not any(nx.has_path(graph, part, "pipeplan.solver.exact.solve") for part in parts)


class TestFolderCycle:
    def test_a_circle_through_a_function_level_import_is_found(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "", "solver/a.py": "from pipeplan.solver.b import f\n",
                                 "solver/b.py": "def f():\n    from pipeplan.solver.a import g\n"})
        cycle = folder_cycle(import_graph(root, SOLVER), "solver")
        assert sorted(cycle) == [("pipeplan.solver.a", "pipeplan.solver.b"), ("pipeplan.solver.b", "pipeplan.solver.a")]

    def test_a_package_and_a_module_importing_each_other_is_a_circle(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "",
                                 "solver/base/__init__.py": "from . import dp\ndef best(): pass\n",
                                 "solver/base/dp.py": "def f():\n    from pipeplan.solver.base import best\n"})
        assert len(folder_cycle(import_graph(root, SOLVER), "solver")) == 2

    def test_a_chain_is_no_circle(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "", "solver/a.py": "from pipeplan.solver.b import f\n",
                                 "solver/b.py": "def f(): pass\n"})
        assert folder_cycle(import_graph(root, SOLVER), "solver") == []

    @pytest.mark.parametrize("folder", ["solver", "models", "runtime", "pipeplan", "experiments"])
    def test_the_project_has_none(self, folder):
        assert folder_cycle(project_graph(), folder) == []

    def test_the_project_as_a_whole_has_none(self):
        graph = project_graph()
        assert nx.is_directed_acyclic_graph(graph), nx.find_cycle(graph)


class TestLayerViolations:
    TWO = {"models": "pipeplan.models", "solver": "pipeplan.solver"}

    def test_a_model_importing_the_solver_is_reported(self, tmp_path):
        root = _write(tmp_path, {"models/__init__.py": "",
                                 "models/g.py": "def f():\n    from pipeplan.solver.formats.plan import P\n",
                                 "solver/__init__.py": "", "solver/formats/plan.py": "class P: pass\n"})
        assert layer_violations(import_graph(root, self.TWO)) == [("pipeplan.models.g", "pipeplan.solver.formats.plan")]

    def test_the_solver_importing_models_is_allowed(self, tmp_path):
        root = _write(tmp_path, {"models/__init__.py": "", "models/g.py": "class G: pass\n",
                                 "solver/__init__.py": "", "solver/formats/plan.py": "from pipeplan.models.g import G\n"})
        assert layer_violations(import_graph(root, self.TWO)) == []

    def test_the_project_has_none(self):
        assert layer_violations(project_graph()) == []


SOLVER_LAYERS = ("schedules", "formats", "evaluation", "views", "core", "space", "bounds", "exact", "baselines",
                 "heuristics", "splits", "portfolio", "solvers", "planning")
"""The sub-packages of ``solver/``, lowest first: a module imports only from its own layer or lower ones.

Schedules are data; formats (clusters, plans) use them; the simulator judges plans; the
core contract (problem, result, stopping rules, the ``Solver`` base class) asks the
simulator; the search spaces, bounds and exact models build on the contract; baselines
and heuristics may use the exact models; the portfolio lists what the composite solvers
run; ``solvers`` is the table of registered solvers; ``planning`` runs them for the API
and the command line.  ``solver/__init__.py`` sits above all.
"""


def solver_layer(module: str) -> int:
    """The index of ``module``'s layer in :data:`SOLVER_LAYERS` (the top for ``pipeplan.solver`` itself)."""
    parts = module.split(".")
    if parts[:2] != ["pipeplan", "solver"]:
        raise ValueError(f"{module} is not in solver/")
    if len(parts) == 2:
        return len(SOLVER_LAYERS)
    return SOLVER_LAYERS.index(parts[2])


def solver_violations(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges inside ``solver/`` from a lower sub-package to a higher one."""
    inside = [(a, b) for a, b in graph.edges if a.startswith("pipeplan.solver") and b.startswith("pipeplan.solver")]
    return sorted((a, b) for a, b in inside if solver_layer(a) < solver_layer(b))


class TestSolverLayer:
    def test_every_sub_package_has_a_layer(self):
        packages = {p.name for p in (ROOT / "solver").iterdir() if (p / "__init__.py").exists()}
        modules = {p.stem for p in (ROOT / "solver").glob("*.py") if p.stem != "__init__"}
        assert packages | modules == set(SOLVER_LAYERS)

    def test_the_package_itself_is_on_top(self):
        assert solver_layer("pipeplan.solver") == len(SOLVER_LAYERS)
        assert solver_layer("pipeplan.solver.schedules.programs") == 0

    def test_an_upward_edge_is_reported(self, tmp_path):
        root = _write(tmp_path, {"solver/__init__.py": "", "solver/formats/__init__.py": "",
                                 "solver/formats/plan.py": "from pipeplan.solver.exact.ilp import f\n",
                                 "solver/exact/__init__.py": "", "solver/exact/ilp.py": "def f(): pass\n"})
        assert solver_violations(import_graph(root, SOLVER)) == [("pipeplan.solver.formats.plan",
                                                                  "pipeplan.solver.exact.ilp")]

    def test_the_project_has_none(self):
        assert solver_violations(project_graph()) == []

    def test_no_module_is_named_after_a_spec_version(self):
        named = [p for p in (ROOT / "solver").rglob("*.py") if p.stem.startswith(("v1_", "v2_"))]
        assert named == []
