"""pipeplan installs under the one name ``pipeplan`` (pyproject's package-dir)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUB_PACKAGES = ("models", "solver", "runtime", "experiments")


def _fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter started outside the checkout."""
    return subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


class TestInstalledNames:
    def test_the_distribution_declares_one_top_level_name(self):
        top_level = importlib.metadata.distribution("pipeplan").read_text("top_level.txt")
        assert top_level.split() == ["pipeplan"]

    def test_the_wheel_holds_nothing_outside_pipeplan(self, tmp_path):
        # Build from a copy: setuptools would otherwise leave (and later reuse) a build/
        # folder in the checkout.
        source = tmp_path / "source"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, source / name)
        for folder in ("pipeplan", "schemas", *SUB_PACKAGES):
            shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "-w", str(tmp_path), str(source)],
            check=True, capture_output=True, timeout=300,
        )
        (wheel,) = tmp_path.glob("pipeplan-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            tops = {name.split("/")[0] for name in archive.namelist()}
        assert {top for top in tops if not top.endswith(".dist-info")} == {"pipeplan"}
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
        for sub in SUB_PACKAGES:
            assert f"pipeplan/{sub}/__init__.py" in names
        assert "pipeplan/schemas/plan.schema.json" in names and "pipeplan/solver/formats/catalog.json" in names

    def test_the_layout_folders_do_not_import_by_their_own_names(self, tmp_path):
        for sub in SUB_PACKAGES:
            result = _fresh_python(f"import {sub}", tmp_path)
            assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, sub

    def test_the_sub_packages_import_under_pipeplan(self, tmp_path):
        code = "; ".join(f"import pipeplan.{sub}" for sub in SUB_PACKAGES)
        result = _fresh_python(code + "; import pipeplan.models.zoo, pipeplan.solver.baselines", tmp_path)
        assert result.returncode == 0, result.stderr
