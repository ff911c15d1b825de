"""Tests of the fit, the measuring and analytic profilers and ``pipeplan profile``."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pipeplan.models.profile_measured as measured
from pipeplan.models.errors import InputError
from pipeplan.models.fit import fit_linear
from pipeplan.models.graph import load_graph
from pipeplan.models.profile_analytic import DeviceModel, profile_analytic
from pipeplan.models.profile_measured import MeasureConfig, per_sample, profile_measured, saved_bytes
from pipeplan.cli import main

FAST = MeasureConfig(batch_sizes=(1, 2), warmup=0, repeats=1)


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
        graph = profile_analytic("gpt3-1.3b", dtype=torch.bfloat16)
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
        assert err.startswith("error: -: model: unknown model 'gpt5'; valid: gpt-tiny, gpt1,")
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
