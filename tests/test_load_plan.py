"""pipeplan.load_plan and the Plan it returns: groups, programs, the documented example."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import pipeplan
from conftest import EXAMPLES, ROOT, plan
from pipeplan.models.errors import InputError


class TestLoadPlan:
    def test_reads_stages_and_split_per_stage(self):
        p = pipeplan.load_plan(str(EXAMPLES / "hetero.plan.json"))
        assert [st.layers for st in p.stages] == [(0, 3), (3, 6), (6, 8)]
        assert [st.microbatches for st in p.stages][1] == (8, 8, 16, 16, 16)
        assert [st.recompute for st in p.stages] == [False, False, True]

    def test_custom_op_lists_become_programs(self):
        p = pipeplan.load_plan(str(EXAMPLES / "custom.plan.json"))
        assert p.programs()[0] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]

    def test_bad_file_is_an_input_error(self, tmp_path):
        path = tmp_path / "p.json"
        path.write_text('{"format": "pipeplan.plan/1"}')
        with pytest.raises(InputError):
            pipeplan.load_plan(str(path))

    def test_import_stays_light(self):
        code = "import sys, pipeplan; print('torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        assert out.strip() == "False"

    def test_the_documented_example_prints_what_the_docs_say(self):
        text = (ROOT / "docs" / "formats.md").read_text()
        code, printed = re.search(r"<!-- load_plan example.*?```python\n(.*?)```\n\nprints\n\n```\n(.*?)```",
                                  text, re.S).groups()
        assert len(code.strip().splitlines()) == 3
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == printed


class TestGroups:
    def test_one_group_per_stage_in_stage_order(self):
        p = plan([(0, 1, ["b", "a"], [2]), (1, 2, ["c"], [2])], batch=2)
        assert p.groups == [("b", "a"), ("c",)]


class TestPrograms:
    def test_1f1b_by_hand(self):
        p = plan([(0, 1, ["a"], [1, 1, 1]), (1, 2, ["b"], [1, 1, 1])], batch=3, schedule="1f1b")
        assert p.programs() == [["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
                                ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]]
