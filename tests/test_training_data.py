"""The run's model and batches (shared by pipeplan run and the exported torch script) and its step losses."""

from __future__ import annotations

import pytest
import torch

from pipeplan.models.errors import InputError
from pipeplan.runtime.report import step_losses
from pipeplan.runtime.training_data import batch_seed, build_run_model, step_batch


class TestBuildRunModel:
    def test_same_seed_same_weights(self):
        a, b = build_run_model("gpt-tiny", seed=3), build_run_model("gpt-tiny", seed=3)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert not torch.equal(next(a.parameters()), next(build_run_model("gpt-tiny", seed=4).parameters()))

    def test_unknown_spec(self):
        with pytest.raises(InputError, match="unknown model 'nope'; valid: gpt-tiny"):
            build_run_model("nope")


class TestBatchSeed:
    def test_hand_computed(self):
        assert batch_seed(0, 5) == 5 and batch_seed(2, 1) == 200_007


class TestStepBatch:
    def test_is_the_models_batch_of_that_seed(self):
        model = build_run_model("gpt-tiny", seq_len=4)
        x, y = step_batch(model, 3, 1, 2)
        want_x, want_y = model.example_batch(3, batch_seed(1, 2))
        assert torch.equal(x, want_x) and torch.equal(y, want_y) and tuple(x.shape) == (3, 4)


class TestStepLosses:
    def test_sums_the_last_stages_ranks(self):
        ranks = [{"stage": 0, "steps": [{"loss": None}, {"loss": None}]},
                 {"stage": 1, "steps": [{"loss": 1.5}, {"loss": 1.0}]},
                 {"stage": 1, "steps": [{"loss": 0.5}, {"loss": 0.25}]}]
        assert step_losses(ranks) == [2.0, 1.25]
