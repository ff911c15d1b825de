"""Tests of the version-2 profile fields: ``bwd_w``, ``act_w`` and ``step`` (spec section 7.1).

Timings are compared by structure and bounds only (what is zero, what is within what),
never by speed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import pipeplan.models.profile_measured as measured
from pipeplan.cli import main
from pipeplan.models.fit import LinearFit, clamp_part
from pipeplan.models.graph import GRAPH_FORMAT, GRAPH_FORMAT_V2, load_graph
from pipeplan.models.profile_analytic import DeviceModel, analyse_units, profile_analytic
from pipeplan.models.profile_measured import MeasureConfig, leaf_args, measure_units, profile_measured
from pipeplan.models.profile_split import SavedTensorLog, input_backward, split_backward
from pipeplan.models.profile_step import STEP_BYTES, estimated_step, median_step, time_step
from pipeplan.models.zoo import build_model

FAST = MeasureConfig(batch_sizes=(1, 2), warmup=0, repeats=1)
F32 = 4  # bytes per float32


@pytest.fixture(autouse=True)
def temp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPEPLAN_CACHE", str(cache))
    return cache


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _leaf(n: int, width: int) -> torch.Tensor:
    return torch.randn(n, width, requires_grad=True)


def _counter() -> FlopCounterMode:
    return FlopCounterMode(display=False)


class TestSavedTensorLog:
    def test_parameters_left_out_and_reads_recorded(self) -> None:
        layer = nn.Linear(8, 16)
        log = SavedTensorLog(layer)
        with log.hooks():
            out = layer(_leaf(5, 8))
        assert log.saved_bytes() == 5 * 8 * F32  # the input; the weight is a parameter
        assert log.read_bytes() == 0
        out.sum().backward()
        assert log.read_bytes() == 5 * 8 * F32
        log.forget_reads()
        assert log.read_bytes() == 0

    def test_views_of_one_storage_counted_once(self) -> None:
        module = nn.Identity()
        log = SavedTensorLog(module)
        x = _leaf(4, 6)
        with log.hooks():
            (x * x.view(6, 4).t().t().reshape(4, 6)).sum()  # mul saves both operands: one storage
        assert log.saved_bytes() == 4 * 6 * F32


class TestInputBackward:
    def test_no_weight_gradient_computed(self) -> None:
        layer = nn.Linear(8, 16)
        x = _leaf(3, 8)
        out = layer(x)
        with _counter() as counter:
            input_backward(out, [x])
        # only the input gradient's matmul: 2 * 3 * 16 * 8
        assert counter.get_total_flops() == 2 * 3 * 16 * 8
        assert layer.weight.grad is None and layer.bias.grad is None

    def test_nothing_to_do_without_float_inputs(self) -> None:
        emb = nn.Embedding(10, 4)
        ids = torch.tensor([[1, 2]])
        out = emb(ids)
        with _counter() as counter:
            input_backward(out, leaf_args([ids]))
        assert counter.get_total_flops() == 0 and emb.weight.grad is None


class TestSplitBackward:
    def test_single_linear_needs_its_input(self) -> None:
        split = split_backward(nn.Linear(8, 16), [_leaf(5, 8)], _counter)
        assert split.act == split.act_w == 5 * 8 * F32
        assert split.out == 5 * 16 * F32
        assert split.input_flops == split.weight_flops == 2 * 5 * 8 * 16

    def test_activation_input_not_kept_for_weights(self) -> None:
        # saved: x (8), the GELU's input (16), the second Linear's input (16); W reads x and the latter
        split = split_backward(_mlp(), [_leaf(5, 8)], _counter)
        assert split.act == 5 * (8 + 16 + 16) * F32
        assert split.act_w == 5 * (8 + 16) * F32
        assert split.weight_flops == 2 * 5 * (8 * 16 + 16 * 4)

    def test_unit_without_float_input_runs_all_at_w(self) -> None:
        emb = nn.Embedding(10, 4)
        split = split_backward(emb, leaf_args([torch.tensor([[1, 2, 3]])]))
        assert split.act_w == split.act and split.input_flops == 0.0
        assert emb.weight.grad is None  # the gradients it computed are dropped

    def test_output_without_backward(self) -> None:
        class Table(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("table", torch.ones(3, 4))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.table * 2

        split = split_backward(Table(), [_leaf(2, 2)])
        assert (split.act_w, split.out) == (0, 3 * 4 * F32)


class TestClampPart:
    def test_each_coefficient_within_whole_and_non_negative(self) -> None:
        whole = LinearFit(2.0, 4.0, 0.0, 0.0)
        assert clamp_part(LinearFit(3.0, 1.0, 0.5, 0.1), whole) == LinearFit(2.0, 1.0, 0.5, 0.1)
        assert clamp_part(LinearFit(-1.0, 5.0, 0.0, 0.0), whole).as_pair() == (0.0, 4.0)


class TestTimeStep:
    @pytest.mark.parametrize("optimizer", ["adam", "sgd"])
    def test_times_steps_and_restores_the_module(self, optimizer: str) -> None:
        layer = nn.Linear(8, 16)
        before = [p.detach().clone() for p in layer.parameters()]
        samples = time_step(layer, optimizer, warmup=1, repeats=3)
        assert len(samples) == 3 and all(s > 0 for s in samples)
        assert all(torch.equal(p, b) and p.grad is None for p, b in zip(layer.parameters(), before))

    def test_no_parameters_no_step(self) -> None:
        assert time_step(nn.GELU(), "adam", 0, 3) == []
        assert median_step(nn.GELU(), "adam", 0, 3) == 0.0

    def test_frozen_parameters_not_stepped(self) -> None:
        layer = nn.Linear(2, 2).requires_grad_(False)
        assert time_step(layer, "adam", 0, 2) == []


class TestEstimatedStep:
    def test_bytes_over_bandwidth(self) -> None:
        assert estimated_step(1e9, "adam", 1e12) == pytest.approx(7e-3)
        assert estimated_step(1e9, "sgd", 1e12) == pytest.approx(3e-3)
        assert STEP_BYTES["adam"] == 7  # p, g, m, v read; p, m, v written


def _mlp_units() -> tuple[list[str], list[nn.Module]]:
    torch.manual_seed(0)
    return (["embed", "fc", "act", "mlp"],
            [nn.Embedding(10, 8), nn.Linear(8, 16), nn.GELU(), nn.Sequential(nn.Linear(16, 32), nn.GELU(),
                                                                             nn.Linear(32, 4))])


def _mlp_work(modules: Sequence[nn.Module]):
    def work(n: int) -> list[tuple[nn.Module, list[torch.Tensor], nn.Module]]:
        ids = torch.randint(0, 10, (n,))
        with torch.no_grad():
            h0 = modules[0](ids)
            h1 = modules[1](h0)
            h2 = modules[2](h1)
        return [(m, [a], m) for m, a in zip(modules, [ids, h0, h1, h2])]
    return work


@pytest.fixture(scope="module")
def profiles() -> list[measured.UnitProfile]:
    names, modules = _mlp_units()
    return measure_units(names, modules, _mlp_work(modules), MeasureConfig((1, 2, 4), warmup=1, repeats=3))


class TestMeasureUnits:

    def test_bwd_w_within_bwd(self, profiles: list[measured.UnitProfile]) -> None:
        for prof in profiles:
            assert 0 <= prof.bwd_w.a <= prof.bwd.a and 0 <= prof.bwd_w.b <= prof.bwd.b

    def test_input_gradient_half_timed_for_float_inputs(self, profiles: list[measured.UnitProfile]) -> None:
        for prof in profiles[1:]:
            assert len(prof.samples["bwd_i"]) == 3 and all(t > 0 for t in prof.samples["bwd_i"])

    def test_embedding_backward_is_all_weight_gradient(self, profiles: list[measured.UnitProfile]) -> None:
        embed = profiles[0]
        assert embed.samples["bwd_i"] == [0.0, 0.0, 0.0]
        assert embed.bwd_w.as_pair() == embed.bwd.as_pair()

    def test_act_w_by_hand(self, profiles: list[measured.UnitProfile]) -> None:
        assert profiles[1].act == profiles[1].act_w == 8 * F32  # a Linear keeps its input for the weights
        assert profiles[2].act_w == 0.0 and profiles[2].act == 16 * F32  # a GELU has no weights
        assert profiles[3].act == (16 + 32 + 32) * F32 and profiles[3].act_w == (16 + 32) * F32
        assert all(p.act_w <= p.act for p in profiles)

    def test_step_only_with_parameters(self, profiles: list[measured.UnitProfile]) -> None:
        assert [p.step > 0 for p in profiles] == [True, True, False, True]
        assert profiles[2].step == 0.0


class TestProfileMeasured:
    def test_writes_graph_v2(self) -> None:
        graph = profile_measured("gpt-tiny", config=FAST)
        assert graph.format == GRAPH_FORMAT_V2
        assert all(layer.bwd_w is not None and layer.act_w is not None and layer.step > 0 for layer in graph.layers)
        assert "bwd_w_residual" in graph.layers[1].extra["fit"]
        assert graph.extra["profile"]["measure"]["optimizer"] == "adam"

    def test_stale_version_1_entry_not_served(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # What a version-3 profiler cached: a graph without the version-2 fields.
        def without_v2(model, profiles, source):
            for prof in profiles:
                prof.bwd_w = prof.act_w = prof.step = None
            return to_graph(model, profiles, source)

        to_graph = measured.to_graph
        with monkeypatch.context() as patch:
            patch.setattr(measured, "PROFILE_VERSION", 3)
            patch.setattr(measured, "to_graph", without_v2)
            assert profile_measured("gpt-tiny", config=FAST).format == GRAPH_FORMAT
            assert profile_measured("gpt-tiny", config=FAST).format == GRAPH_FORMAT  # served from the cache
        assert profile_measured("gpt-tiny", config=FAST).format == GRAPH_FORMAT_V2

    def test_optimizer_is_part_of_the_key(self) -> None:
        adam = profile_measured("gpt-tiny", config=FAST)
        sgd = profile_measured("gpt-tiny", config=MeasureConfig((1, 2), 0, 1, optimizer="sgd"))
        assert sgd.extra["profile"]["measure"]["optimizer"] == "sgd" != adam.extra["profile"]["measure"]["optimizer"]

    def test_unknown_optimizer_refused(self) -> None:
        with pytest.raises(measured.InputError, match="unknown optimizer 'lion'"):
            MeasureConfig(optimizer="lion")


DEVICE = DeviceModel(flops=1e12, efficiency=0.5, overhead=1e-3, bandwidth=1e11)
RATE = 1e12 * 0.5


def _analyse(module: nn.Module, make_args) -> measured.UnitProfile:
    profiles, _ = analyse_units([module], lambda n: [(module, make_args(n))], (1, 2), DEVICE)
    return profiles[0]


class TestAnalyseUnits:
    def test_linear_by_hand(self) -> None:
        layer = nn.Linear(8, 16, device="meta")
        prof = _analyse(layer, lambda n: [torch.empty(n, 8, device="meta")])
        # weight gradient: 2 * 8 * 16 FLOPs per sample, half the backward; half the call overhead
        assert prof.bwd.as_pair() == pytest.approx((1e-3, 4 * 8 * 16 / RATE))
        assert prof.bwd_w.as_pair() == pytest.approx((0.5e-3, 2 * 8 * 16 / RATE))
        assert prof.act_w == prof.act == 8 * F32
        assert prof.step == pytest.approx(7 * (8 * 16 + 16) * F32 / 1e11)

    def test_no_parameters(self) -> None:
        prof = _analyse(nn.GELU(), lambda n: [torch.empty(n, 8, device="meta")])
        assert prof.step == 0.0 and prof.act_w == 0.0 and prof.bwd_w.as_pair() == (0.0, 0.0)

    def test_embedding_backward_is_all_weight_gradient(self) -> None:
        emb = nn.Embedding(10, 8, device="meta")
        prof = _analyse(emb, lambda n: [torch.zeros(n, 3, dtype=torch.long, device="meta")])
        assert prof.bwd_w.as_pair() == prof.bwd.as_pair() and prof.act_w == prof.act

    def test_zoo_transformer_block_by_hand(self) -> None:
        model = build_model("gpt-tiny", device="meta")
        d, t = model.config["d_model"], model.config["seq_len"]
        graph = profile_analytic("gpt-tiny", device=DEVICE)
        block = graph.layers[1]
        # weights: qkv d x 3d, proj d x d, fc1 d x 4d, fc2 4d x d; 2 FLOPs per weight and token
        assert block.extra["flops"]["bwd_w_per_sample"] == 2 * t * 12 * d * d
        assert block.bwd_w == pytest.approx((0.5e-3, 2 * t * 12 * d * d / RATE))
        # W reads, per token: ln1's input, mean, rstd; qkv's, proj's, fc1's inputs (d each);
        # ln2's input, mean, rstd; fc2's input (4d)
        assert block.act_w == F32 * t * ((d + 2) + 3 * d + (d + 2) + 4 * d)
        params = 12 * d * d + 13 * d  # four weight matrices, their biases, two LayerNorms
        assert block.params == params * F32
        assert block.step == pytest.approx(7 * params * F32 / 1e11)

    def test_graph_is_version_2_and_round_trips(self, tmp_path: Path) -> None:
        graph = profile_analytic("vgg-tiny")
        assert graph.format == GRAPH_FORMAT_V2 and graph.extra["profile"]["optimizer"] == "adam"
        path = tmp_path / "g.json"
        path.write_text(json.dumps(graph.to_dict()))
        again = load_graph(str(path))
        assert [layer.bwd_w for layer in again.layers] == [layer.bwd_w for layer in graph.layers]
        assert [layer.step for layer in again.layers] == [layer.step for layer in graph.layers]


class TestProfileCommand:
    def test_analytic_sgd_step_is_three_sevenths_of_adam(self, tmp_path: Path) -> None:
        steps = {}
        for optimizer in ("adam", "sgd"):
            out = tmp_path / f"{optimizer}.json"
            assert main(["profile", "gpt-tiny", "--analytic", "--optimizer", optimizer, "--bandwidth", "1e12",
                         "-o", str(out)]) == 0
            data = json.loads(out.read_text())
            assert data["format"] == GRAPH_FORMAT_V2
            steps[optimizer] = [layer["step"] for layer in data["layers"]]
        assert steps["sgd"] == pytest.approx([s * 3 / 7 for s in steps["adam"]])
        assert steps["adam"][0] == pytest.approx(7 * 64 * 32 * F32 / 1e12 + 7 * 16 * 32 * F32 / 1e12)

    @pytest.mark.parametrize("argv, where", [
        (["--optimizer", "lion"], "--optimizer: unknown optimizer 'lion'; valid: adam, sgd"),
        (["--bandwidth", "1e12"], "--bandwidth: describes the device of --analytic"),
        (["--analytic", "--bandwidth", "0"], "--bandwidth: must be a positive number"),
    ])
    def test_bad_options(self, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                         where: str) -> None:
        out = tmp_path / "g.json"
        assert main(["profile", "gpt-tiny", *argv, "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and where in err and not out.exists()
