"""The golden set: every plan of ``tests/data/golden`` simulates to the same numbers, bit for bit.

``tests/golden.py`` says what the set holds and writes it; a change that moves any
number by one bit fails here, naming the plan's kind and the first field that differs.
"""

import json

import pytest

from golden import GOLDEN, check_solvers, record
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan

CASES = json.loads(GOLDEN.read_text())["cases"]


class TestSimulate:
    def test_the_set_covers_every_schedule(self):
        assert {c["kind"] for c in CASES} == {"gpipe", "1f1b", "custom-ops", "interleaved-1f1b", "interleaved-zb",
                                              "looped-bfs", "zbv", "custom-programs"}

    @pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c['kind']}-{i}" for i, c in enumerate(CASES)])
    def test_every_number_is_unchanged(self, index):
        case = CASES[index]
        got = record(Plan.from_dict(case["plan"]), LayerGraph.from_dict(case["graph"]),
                     Cluster.from_dict(case["cluster"]))
        for field, want in case["expected"].items():
            assert got[field] == want, f"{case['kind']} case {index}: {field} differs"


class TestSolve:
    def test_the_quick_solvers_return_the_same_plans_and_bounds(self):
        assert check_solvers(quick_only=True) == []
