"""Per-stage programs: the generated gpipe and 1f1b ones, and a custom plan's per-stage op lists read into actions."""

import pytest

from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.schedule import check_stage_ops, stage_actions


def text(actions):
    """A stage's actions as its op list writes them (``"F0"``)."""
    return [f"{a.kind}{a.microbatch}" for a in actions]


class TestStageActions:
    def test_gpipe_all_forwards_then_all_backwards(self):
        assert text(stage_actions("gpipe", 3, 1, 2)) == ["F0", "F1", "F2", "B0", "B1", "B2"]
        assert {a.stage for a in stage_actions("gpipe", 3, 1, 2)} == {1}

    def test_1f1b_first_stage_of_four(self):
        assert text(stage_actions("1f1b", 5, 0, 4)) == ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "B2", "B3", "B4"]

    def test_1f1b_last_stage_alternates(self):
        assert text(stage_actions("1f1b", 3, 3, 4)) == ["F0", "B0", "F1", "B1", "F2", "B2"]

    def test_1f1b_fewer_microbatches_than_warmup(self):
        # w = min(S-1-s, m) = 2: all forwards, then all backwards
        assert text(stage_actions("1f1b", 2, 0, 4)) == ["F0", "F1", "B0", "B1"]

    @pytest.mark.parametrize("m, s, S", [(1, 0, 1), (4, 1, 3), (7, 0, 8), (8, 2, 3)])
    def test_every_op_once_forward_first(self, m, s, S):
        assert check_stage_ops(text(stage_actions("1f1b", m, s, S)), s, m, "-", "ops") == list(stage_actions("1f1b", m, s, S))


class TestCheckStageOps:
    def test_split_backwards_are_read(self):
        assert text(check_stage_ops(["F0", "F1", "I0", "B1", "W0"], 3, 2, "-", "ops")) == ["F0", "F1", "I0", "B1", "W0"]

    @pytest.mark.parametrize("ops, where, what", [
        (["F0", "B0", "F1"], "ops", "missing ops B1"),
        (["F0", "I0", "F1", "B1"], "ops", "missing ops W0"),
        (["F0", "B1", "F1", "B0"], "ops[1]", "B1 comes before F1"),
        (["F0", "W0", "I0", "F1", "B1"], "ops[1]", "W0 comes before I0"),
        (["F0", "B0", "I0"], "ops[2]", "I0 splits the backward of microbatch 0, which already ran whole"),
        (["F0", "I0", "B0"], "ops[2]", "B0 is a whole backward, but microbatch 0 already split"),
        (["F0", "F0", "B0"], "ops[1]", "appears twice"),
        (["F0", "F2", "B0"], "ops[1]", "names microbatch 2"),
        (["F0", "Q1"], "ops[1]", "not of the form"),
        (["F0", "0B0"], "ops[1]", "not of the form"),
    ])
    def test_bad_lists(self, ops, where, what):
        with pytest.raises(InputError) as info:
            check_stage_ops(ops, 0, 2, "p.json", "ops")
        assert info.value.where == where and what in info.value.what

    @pytest.mark.parametrize("bad", ["F", "X0", "F-1", "f0", "F01", "B 1", 3])
    def test_rejects_what_is_no_op(self, bad):
        with pytest.raises(InputError, match="not of the form"):
            check_stage_ops([bad], 0, 1, "-", "ops")
