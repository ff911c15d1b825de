"""Op lists: the generated schedules, custom list checks, CSV round trip."""

import pytest

from conftest import ROOT
from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.schedule import (check_ops, format_op, from_csv, gpipe_ops, one_f_one_b_ops, parse_op, to_csv)


def text(ops):
    return [format_op(op) for op in ops]


class TestGpipeOps:
    def test_all_forwards_then_all_backwards(self):
        assert text(gpipe_ops(3)) == ["F0", "F1", "F2", "B0", "B1", "B2"]


class TestOneFOneBOps:
    def test_first_stage_of_four(self):
        assert text(one_f_one_b_ops(5, 0, 4)) == ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "B2", "B3", "B4"]

    def test_last_stage_alternates(self):
        assert text(one_f_one_b_ops(3, 3, 4)) == ["F0", "B0", "F1", "B1", "F2", "B2"]

    def test_fewer_microbatches_than_warmup(self):
        # w = min(S-1-s, m) = 2: all forwards, then all backwards
        assert text(one_f_one_b_ops(2, 0, 4)) == ["F0", "F1", "B0", "B1"]

    @pytest.mark.parametrize("m, s, S", [(1, 0, 1), (4, 1, 3), (7, 0, 8), (8, 2, 3)])
    def test_every_op_once_forward_first(self, m, s, S):
        assert check_ops(text(one_f_one_b_ops(m, s, S)), m, "-", "ops") == one_f_one_b_ops(m, s, S)


class TestParseOp:
    def test_round_trip(self):
        assert parse_op("B12") == ("B", 12) and format_op(("B", 12)) == "B12"

    @pytest.mark.parametrize("bad", ["F", "X0", "F-1", "f0", "F01", "B 1", 3])
    def test_rejects(self, bad):
        with pytest.raises(ValueError):
            parse_op(bad)


class TestCheckOps:
    @pytest.mark.parametrize("ops, where, what", [
        (["F0", "B0", "F1"], "ops", "missing ops B1"),
        (["F0", "B1", "F1", "B0"], "ops[1]", "B1 comes before F1"),
        (["F0", "F0", "B0"], "ops[1]", "appears twice"),
        (["F0", "F2", "B0"], "ops[1]", "names microbatch 2"),
        (["F0", "Q1"], "ops[1]", "not of the form"),
    ])
    def test_bad_lists(self, ops, where, what):
        with pytest.raises(InputError) as info:
            check_ops(ops, 2, "p.json", "ops")
        assert info.value.where == where and what in info.value.what


class TestCsv:
    def test_golden_file(self):
        golden = (ROOT / "tests" / "data" / "1f1b_3stages_4mb.csv").read_text()
        pipeline = [one_f_one_b_ops(4, s, 3) for s in range(3)]
        assert to_csv(pipeline) == golden
        assert from_csv(golden, [4, 4, 4]) == pipeline

    def test_row_count_checked(self):
        with pytest.raises(InputError, match="expected 2 stage rows"):
            from_csv("F0,B0\n", [1, 1])
