"""The documentation stands on its own: every link resolves inside the repository, nothing points
outside it, and the cost model's example files are the ones the page shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"shared/(spec|reference)/|/work/")


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return anchors


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(page.read_text()) if not re.match(r"[a-z]+:", m.group(1))]


class TestLinks:
    @pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
    def test_every_link_resolves_inside_the_repository(self, page):
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists() and dest.is_relative_to(ROOT.resolve()), f"{page.name}: {target}"
            if anchor and dest.suffix == ".md":
                assert anchor in heading_anchors(dest), f"{page.name}: {target}: no such heading"

    @pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
    def test_nothing_points_outside_the_repository(self, page):
        assert not OUTSIDE.findall(page.read_text()), page.name


class TestModelPage:
    def test_its_example_files_are_the_worked_examples(self):
        # sections 1 to 3 show the graph, cluster and plan of the worked example
        shown = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", (ROOT / "docs" / "model.md").read_text(),
                                                            re.S)[:3]]
        assert shown == [json.loads((EXAMPLES / f"tiny.{kind}.json").read_text()) for kind in ("graph", "cluster", "plan")]

    def test_defines_every_section_of_the_model(self):
        anchors = heading_anchors(ROOT / "docs" / "model.md")
        for number in ("1", "2", "3", "4", "5", "6", "7", "71", "72", "73", "74"):
            assert any(a.startswith(f"{number}-") for a in anchors), number
