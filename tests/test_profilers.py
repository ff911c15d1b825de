"""Tests of the fit, the measuring and analytic profilers (with the fields of graph version 2: ``bwd_w``,
``act_w`` and ``step``, spec section 7.1) and ``pipeplan profile``.

Timings are compared by structure and bounds only (what is zero, what is within what),
never by speed.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import pipeplan.models.profile_measured as measured
from pipeplan.cli import main
from pipeplan.models.errors import InputError
from pipeplan.models.fit import LinearFit, clamp_part, fit_linear
from pipeplan.models.graph import GRAPH_FORMAT, GRAPH_FORMAT_V2, GRAPH_FORMAT_V3, load_graph
from pipeplan.models.profile_analytic import DeviceModel, analyse_units, profile_analytic
from pipeplan.models.profile_measured import (MeasureConfig, leaf_args, measure_units, per_sample, profile_measured,
                                              saved_bytes)
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


class TestFitLinear:
    def test_recovers_exact_line(self) -> None:
        sizes = [1, 2, 4, 8]
        fit = fit_linear(sizes, [2e-4 + 3e-5 * n for n in sizes])
        assert fit.a == pytest.approx(2e-4) and fit.b == pytest.approx(3e-5)
        assert fit.residual == pytest.approx(0.0, abs=1e-15)

    def test_recovers_line_under_noise(self) -> None:
        rng = np.random.default_rng(0)
        sizes = np.repeat([1, 2, 4, 8, 16], 20)
        times = 1e-3 + 5e-4 * sizes + rng.normal(0, 1e-5, sizes.size)
        fit = fit_linear(sizes, times)
        assert fit.a == pytest.approx(1e-3, rel=0.02) and fit.b == pytest.approx(5e-4, rel=0.01)
        assert fit.residual == pytest.approx(1e-5, rel=0.2)

    def test_negative_slope_clamped(self) -> None:
        # Falling times: best flat line is the mean 4; residual sqrt(2/3).
        fit = fit_linear([1, 2, 4], [5.0, 4.0, 3.0])
        assert (fit.a, fit.b) == (4.0, 0.0)
        assert fit.residual == pytest.approx((2 / 3) ** 0.5)

    def test_negative_intercept_clamped(self) -> None:
        # Unconstrained a < 0: fit through the origin, b = sum(n t) / sum(n^2) = 32/21.
        fit = fit_linear([1, 2, 4], [0.0, 2.0, 7.0])
        assert fit.a == 0.0 and fit.b == pytest.approx(32 / 21)

    def test_single_size_is_all_slope(self) -> None:
        fit = fit_linear([4, 4], [2.0, 2.0])
        assert (fit.a, fit.b) == (0.0, 0.5)

    def test_bad_input(self) -> None:
        with pytest.raises(ValueError):
            fit_linear([], [])
        with pytest.raises(ValueError):
            fit_linear([0, 1], [1.0, 2.0])


class TestSavedBytes:
    def test_linear_saves_its_input_only(self) -> None:
        # addmm saves the input (4 x 16 float32) and the weight, which is a parameter.
        layer = nn.Linear(16, 32)
        _, nbytes = saved_bytes(layer, [torch.randn(4, 16, requires_grad=True)])
        assert nbytes == 4 * 16 * 4

    def test_conv2d_saves_its_input_only(self) -> None:
        conv = nn.Conv2d(3, 8, 3)
        _, nbytes = saved_bytes(conv, [torch.randn(2, 3, 10, 10, requires_grad=True)])
        assert nbytes == 2 * 3 * 10 * 10 * 4

    def test_linear_relu_adds_the_relu_output(self) -> None:
        unit = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        _, nbytes = saved_bytes(unit, [torch.randn(4, 16, requires_grad=True)])
        assert nbytes == 4 * 16 * 4 + 4 * 32 * 4

    def test_same_storage_counted_once(self) -> None:
        class Square(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * x  # saves x twice

        _, nbytes = saved_bytes(Square(), [torch.randn(5, requires_grad=True)])
        assert nbytes == 5 * 4

    def test_meta_tensors(self) -> None:
        with torch.device("meta"):
            layer = nn.Linear(16, 32)
        _, nbytes = saved_bytes(layer, [torch.empty(4, 16, device="meta", requires_grad=True)])
        assert nbytes == 4 * 16 * 4


class TestPerSample:
    def test_constant_part_drops_out(self) -> None:
        assert per_sample([1, 2, 8], [164.0, 228.0, 612.0]) == 64.0

    def test_single_size(self) -> None:
        assert per_sample([4], [256.0]) == 64.0


class TestProfileMeasured:
    def test_gpt_tiny_end_to_end(self) -> None:
        graph = profile_measured("gpt-tiny", config=FAST)
        assert graph.name == "gpt-tiny-6"
        assert [layer.name for layer in graph.layers] == ["embed", "block.0", "block.1", "block.2", "block.3", "head"]
        embed, block, head = graph.layers[0], graph.layers[1], graph.layers[-1]
        assert embed.params == (64 * 32 + 16 * 32) * 4      # token + position tables
        assert head.params == (64 * 32 + 2 * 32) * 4        # tied table + final LayerNorm
        assert head.tied_to == 0 and embed.tied_to is None
        assert embed.act == 16 * 8                           # the int64 token ids
        assert block.out == 16 * 32 * 4 and head.out == 16 * 64 * 4
        assert graph.input_bytes == 16 * 8
        assert block.fwd[0] + block.fwd[1] > 0 and block.bwd[0] + block.bwd[1] > 0
        assert all(min(layer.fwd + layer.bwd) >= 0 for layer in graph.layers)
        assert "fwd_residual" in block.extra["fit"]
        assert graph.format == GRAPH_FORMAT_V3  # its blocks, embedding and head have a tensor-parallel plan
        assert all(layer.bwd_w is not None and layer.act_w is not None and layer.step > 0 for layer in graph.layers)
        assert "bwd_w_residual" in graph.layers[1].extra["fit"]
        assert graph.extra["profile"]["measure"]["optimizer"] == "adam"

    def test_cache_reused(self, temp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        first = profile_measured("gpt-tiny", config=FAST)
        assert len(list(temp_cache.glob("measured-*.json"))) == 1

        def fail(*args: object, **kwargs: object) -> None:
            raise AssertionError("measured again despite the cache")

        monkeypatch.setattr(measured, "measure_model", fail)
        assert profile_measured("gpt-tiny", config=FAST).to_dict() == first.to_dict()

    def test_bad_config(self) -> None:
        with pytest.raises(InputError):
            MeasureConfig(batch_sizes=(0, 2))
        with pytest.raises(InputError):
            MeasureConfig(repeats=0)
        with pytest.raises(InputError):
            MeasureConfig(rounds=0)

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
            assert profile_measured("gpt-tiny", config=FAST, tensor_parallel=False).format == GRAPH_FORMAT
            # served from the cache
            assert profile_measured("gpt-tiny", config=FAST, tensor_parallel=False).format == GRAPH_FORMAT
        assert profile_measured("gpt-tiny", config=FAST, tensor_parallel=False).format == GRAPH_FORMAT_V2

    def test_optimizer_is_part_of_the_key(self) -> None:
        adam = profile_measured("gpt-tiny", config=FAST)
        sgd = profile_measured("gpt-tiny", config=MeasureConfig((1, 2), 0, 1, optimizer="sgd"))
        assert sgd.extra["profile"]["measure"]["optimizer"] == "sgd" != adam.extra["profile"]["measure"]["optimizer"]

    def test_unknown_optimizer_refused(self) -> None:
        with pytest.raises(measured.InputError, match="unknown optimizer 'lion'"):
            MeasureConfig(optimizer="lion")


class TestMeasureRounds:
    def test_median_over_every_round(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Three rounds of one repeat each: the kept time is the median of the three rounds' samples."""
        calls: list[int] = []

        def fake(module, args, warmup, repeats, pause=None, sync=None):
            calls.append(repeats)
            value = float(len(calls))  # call number: rises round after round
            return [value] * repeats, [2 * value] * repeats

        monkeypatch.setattr(measured, "time_unit_samples", fake)
        model = measured.build_model("gpt-tiny", seed=0)
        units, sizes = len(model.units), (1, 2)
        profiles = measured.measure_model(model, MeasureConfig(batch_sizes=sizes, warmup=0, repeats=1, rounds=3))
        stride = units * len(sizes)  # calls per round, every (size, unit) once
        assert calls == [1] * 3 * stride
        for i, profile in enumerate(profiles):
            for k in range(len(sizes)):
                first = k * units + i + 1  # its call in round 1; rounds 2 and 3 follow a stride apart
                assert profile.samples["fwd"][k] == first + stride  # the median of first, +stride, +2 stride
                assert profile.samples["bwd"][k] == 2 * (first + stride)


class TestProfileAnalytic:
    def test_gpt_tiny_hand_flops(self) -> None:
        # Block forward FLOPs per sample, s=16 tokens, d=32: matmuls 2*s*12*d^2 plus
        # attention scores and weighted sum 2*2*s^2*d; backward counted as twice that.
        flops = 2 * 16 * 12 * 32 ** 2 + 4 * 16 ** 2 * 32
        device = DeviceModel(flops=1e9, efficiency=0.5, overhead=1e-3)
        graph = profile_analytic("gpt-tiny", device=device)
        block = graph.layers[1]
        assert block.extra["flops"]["fwd_per_sample"] == flops
        assert block.fwd == pytest.approx((1e-3, flops / 5e8))
        assert block.bwd == pytest.approx((1e-3, 2 * flops / 5e8))
        assert block.out == 16 * 32 * 4 and block.params == (12 * 32 ** 2 + 13 * 32) * 4

    def test_gpt3_without_allocating_weights(self) -> None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        graph = profile_analytic("gpt3-1.3b", dtype=torch.bfloat16, tensor_parallel=False)  # weights only here
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown < 500 * 1024  # the bf16 weights alone would be 2.6 GB
        assert len(graph) == 26 and graph.layers[-1].tied_to == 0
        assert graph.layers[0].params == (50257 + 2048) * 2048 * 2
        assert graph.layers[1].params == (12 * 2048 ** 2 + 13 * 2048) * 2
        assert graph.layers[1].out == 2048 * 2048 * 2

    def test_bad_device(self) -> None:
        for kwargs in ({"flops": 0}, {"efficiency": 1.5}, {"overhead": -1.0}, {"overhead": 1e7}):
            with pytest.raises(InputError):
                DeviceModel(**kwargs)


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


class TestRunProfile:
    def test_measured_gpt_tiny(self, tmp_path: Path) -> None:
        out = tmp_path / "tiny.json"
        assert main(["profile", "gpt-tiny", "--batch-sizes", "1,2", "--repeats", "1", "--warmup", "0",
                     "-o", str(out)]) == 0
        graph = load_graph(str(out))
        assert graph.name == "gpt-tiny-6" and graph.extra["profile"]["measure"]["batch_sizes"] == [1, 2]

    def test_analytic_options(self, tmp_path: Path) -> None:
        out = tmp_path / "unet.json"
        assert main(["profile", "unet", "--analytic", "--flops", "1e12", "--efficiency", "0.5",
                     "-o", str(out)]) == 0
        graph = load_graph(str(out))
        assert graph.edges[1] == (0, 6)
        assert graph.extra["profile"]["device"]["flops"] == 1e12

    def test_unknown_model_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["profile", "gpt5", "-o", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: -: model: unknown model 'gpt5'; valid: gpt-tiny, gpt-tiny-16, gpt1,")
        assert not (tmp_path / "x.json").exists()

    @pytest.mark.parametrize("args", [["--batch-sizes", "0,x"], ["--batch-sizes", "1,x"], ["--dtype", "int8"],
                                      ["--seq-len", "0"], ["--flops", "1e12"],
                                      ["--analytic", "--efficiency", "two"], ["--batch-sizes", "1,1000000"],
                                      ["--analytic", "--flops", "1e-320"], ["--threads", "100000"],
                                      ["--analytic", "--overhead", "1e308"], ["--analytic", "--overhead", "nan"],
                                      ["--analytic", "--batch-sizes", "1,2"], ["--analytic", "--no-cache"],
                                      ["--batch-sizes", ""]])
    def test_bad_arguments_exit_2(self, args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["profile", "gpt-tiny", *args, "-o", str(tmp_path / "x.json")]) == 2
        assert capsys.readouterr().err.startswith("error: -: ")

    @pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
    def test_an_unwritable_cache_still_writes_the_graph(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        # /proc/self exists (so the folder is "there") but no file can be made in it, even by root
        monkeypatch.setenv("PIPEPLAN_CACHE", "/proc/self")
        out = tmp_path / "tiny.json"
        assert main(["profile", "gpt-tiny", "--batch-sizes", "1,2", "--repeats", "1", "--warmup", "0",
                     "-o", str(out)]) == 0
        assert load_graph(str(out)).name == "gpt-tiny-6"

    def test_analytic_sgd_step_is_three_sevenths_of_adam(self, tmp_path: Path) -> None:
        steps = {}
        for optimizer in ("adam", "sgd"):
            out = tmp_path / f"{optimizer}.json"
            assert main(["profile", "gpt-tiny", "--analytic", "--optimizer", optimizer, "--bandwidth", "1e12",
                         "--no-tensor-parallel", "-o", str(out)]) == 0
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


class TestCacheKey:
    def test_stable_and_sensitive(self, temp_cache: Path) -> None:
        from pipeplan.models.cache import cache_dir, cache_key

        assert cache_dir() == temp_cache
        assert cache_key("measured", {"model": "a", "sizes": [1, 2]}) == cache_key("measured", {"sizes": [1, 2], "model": "a"})
        assert cache_key("measured", {"model": "a", "sizes": [1, 2]}) != cache_key("measured", {"model": "a", "sizes": [1, 4]})

    def test_damaged_entry_is_measured_again(self, temp_cache: Path) -> None:
        profile_measured("gpt-tiny", config=FAST)
        (entry,) = temp_cache.glob("measured-*.json")
        entry.write_text("{not json")
        assert profile_measured("gpt-tiny", config=FAST).name == "gpt-tiny-6"
        assert load_graph(str(entry)).name == "gpt-tiny-6"
