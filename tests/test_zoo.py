"""Tests of the model zoo (models/zoo) and the ``pipeplan models`` command."""

from __future__ import annotations

import json

import pytest
import torch

from pipeplan.models.errors import InputError
from pipeplan.models.zoo import ZOO, build_model, model_names
from pipeplan.cli import main


def gpt_params(blocks: int, d: int, vocab: int, ctx: int, final_norm: bool) -> int:
    """Hand count: embeddings, 12 d^2 + 13 d per block (qkv, proj, 4x MLP, 2 LayerNorms)."""
    return vocab * d + ctx * d + blocks * (12 * d * d + 13 * d) + (2 * d if final_norm else 0)


class TestBuildModel:
    @pytest.mark.parametrize(("name", "expected"), [
        ("vgg16", 138_357_544),
        ("resnet50", 25_557_032),
        ("gpt1", 116_534_784),  # = gpt_params(12, 768, 40478, 512, False), the published ~116.5 M
        ("bert-large", 335_141_888 + 1024 * 2 + 2),  # published BertModel count + 2-class classifier
        ("gpt2-medium", 354_823_168),
        ("gpt3-1.3b", 1_315_723_264),
        ("llama3-70b", 70_553_706_496),  # Meta-Llama-3-70B's published count
    ])
    def test_published_parameter_counts(self, name: str, expected: int) -> None:
        assert build_model(name, device="meta").num_parameters() == expected

    def test_gpt_counts_match_hand_formula(self) -> None:
        assert build_model("gpt1", device="meta").num_parameters() == gpt_params(12, 768, 40478, 512, False)
        assert build_model("gpt3-1.3b", device="meta").num_parameters() == gpt_params(24, 2048, 50257, 2048, True)
        assert build_model("gpt-tiny", device="meta").num_parameters() == gpt_params(4, 32, 64, 16, True)
        assert build_model("gpt-tiny-16", device="meta").num_parameters() == gpt_params(14, 32, 64, 16, True)

    @pytest.mark.parametrize(("name", "units"), [("gpt1", 14), ("gpt-tiny", 6), ("gpt-tiny-16", 16), ("gpt2-medium", 26),
                                                 ("gpt3-1.3b", 26), ("bert-large", 26), ("vgg16", 16),
                                                 ("resnet50", 18), ("unet", 8), ("vgg-tiny", 6),
                                                 ("llama-tiny", 4), ("llama3-70b", 82)])
    def test_unit_counts(self, name: str, units: int) -> None:
        assert len(build_model(name, device="meta").units) == units

    def test_vgg_tiny_count_by_hand(self) -> None:
        # conv (9 in*out + out) + BatchNorm (2 out) per conv unit; fc1 from 32 channels x 2 x 2
        convs = sum(9 * i * o + o + 2 * o for i, o in ((3, 8), (8, 16), (16, 32), (32, 32)))
        assert build_model("vgg-tiny", device="meta").num_parameters() == convs + (128 * 64 + 64) + (64 * 10 + 10)

    def test_gpt_head_shares_the_embedding_parameter(self) -> None:
        model = build_model("gpt-tiny")
        head, embed = model.units[-1], model.units[0]
        assert head.tied_to == 0
        assert head.module.wte.weight is embed.module.wte.weight
        # Counted once in the model, but listed by both units.
        shared = embed.module.wte.weight.numel()
        assert sum(p.numel() for u in model.units for p in u.module.parameters()) == model.num_parameters() + shared

    def test_tie_survives_bfloat16(self) -> None:
        model = build_model("gpt-tiny", dtype=torch.bfloat16)
        assert model.units[-1].module.wte.weight is model.units[0].module.wte.weight
        assert model.units[0].module.wte.weight.dtype == torch.bfloat16

    def test_meta_device_allocates_nothing(self) -> None:
        model = build_model("gpt3-1.3b", device="meta")
        assert all(p.device.type == "meta" for p in model.parameters())

    def test_same_seed_same_weights(self) -> None:
        a, b = build_model("gpt-tiny", seed=3), build_model("gpt-tiny", seed=3)
        c = build_model("gpt-tiny", seed=4)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))

    def test_unknown_model_lists_valid_names(self) -> None:
        with pytest.raises(InputError) as info:
            build_model("gpt5")
        assert info.value.where == "model"
        assert info.value.what == f"unknown model 'gpt5'; valid: {', '.join(model_names())}"

    def test_bad_seq_len(self) -> None:
        with pytest.raises(InputError, match="1 to 16 tokens"):
            build_model("gpt-tiny", seq_len=17)
        with pytest.raises(InputError, match="takes images"):
            build_model("vgg16", seq_len=8, device="meta")

    def test_seq_len_sets_batch_and_input_bytes(self) -> None:
        model = build_model("gpt-tiny", seq_len=8)
        inputs, targets = model.example_batch(3, seed=0)
        assert inputs.shape == targets.shape == (3, 8)
        assert model.input_bytes_per_sample == 8 * 8  # int64 token ids

    @pytest.mark.parametrize("name", ["gpt-tiny", "unet", "llama-tiny"])
    def test_units_run_one_by_one(self, name: str) -> None:
        model = build_model(name)
        inputs, targets = model.example_batch(2, seed=1)
        outputs = {-1: inputs}
        for unit in model.units:
            out = unit.module(*[outputs[i] for i in unit.inputs])
            assert isinstance(out, torch.Tensor)
            outputs[len(outputs) - 1] = out
        assert model.loss(outputs[len(model.units) - 1], targets).ndim == 0


class TestModelNames:
    def test_all_models_listed(self) -> None:
        assert model_names() == list(ZOO)
        assert set(model_names()) == {"gpt-tiny", "gpt-tiny-16", "gpt1", "gpt2-medium", "gpt3-1.3b", "llama-tiny", "llama3-70b",
                                      "bert-large", "vgg16", "vgg-tiny", "resnet50", "unet"}


class TestZooModel:
    def test_example_batch_is_seeded(self) -> None:
        model = build_model("gpt-tiny")
        x1, y1 = model.example_batch(4, seed=7)
        x2, y2 = model.example_batch(4, seed=7)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
        assert torch.equal(x1[:, 1:], y1[:, :-1])  # next-token targets

    def test_example_batch_on_meta(self) -> None:
        inputs, targets = build_model("resnet50", device="meta").example_batch(2, seed=0)
        assert inputs.device.type == "meta" and inputs.shape == (2, 3, 224, 224) and targets.shape == (2,)

    def test_split_batch_gives_the_same_gradient(self) -> None:
        # loss(batch) = sum_k (n_k / n) * loss(part_k): parts of 1 and 3 samples out of 4.
        model = build_model("gpt-tiny")
        inputs, targets = model.example_batch(4, seed=2)
        model.loss(model(inputs), targets).backward()
        whole = [p.grad.clone() for p in model.parameters()]
        model.module().zero_grad()
        for lo, hi in ((0, 1), (1, 4)):
            share = (hi - lo) / 4
            (share * model.loss(model(inputs[lo:hi]), targets[lo:hi])).backward()
        for full, parts in zip(whole, model.parameters()):
            torch.testing.assert_close(parts.grad, full, rtol=1e-4, atol=1e-6)

    @pytest.mark.parametrize("name", ["gpt-tiny", "unet"])
    def test_loss_keeps_float64_and_lifts_half_precision(self, name) -> None:
        model = build_model(name, dtype=torch.float64)
        inputs, targets = model.example_batch(2, seed=0)
        assert model.loss(model(inputs), targets).dtype == torch.float64  # --verify compares in float64
        half = build_model(name, dtype=torch.bfloat16)
        inputs, targets = half.example_batch(2, seed=0)
        assert half.loss(half(inputs), targets).dtype == torch.float32

    def test_stage_slices_compose(self) -> None:
        model = build_model("unet")
        inputs, _ = model.example_batch(1, seed=0)
        with torch.no_grad():
            full = model.forward(inputs)
            first = model.forward(inputs, 0, 5)
            # The second stage needs unit 4's output plus the skips from units 0 and 1.
            rest = model.forward(inputs, 5, 8, outputs={i: first[i] for i in (0, 1, 4)})
        torch.testing.assert_close(rest[7], full[7])

    def test_unet_skip_edges(self) -> None:
        model = build_model("unet", device="meta")
        assert [u.name for u in model.units] == ["enc1", "enc2", "enc3", "bottom", "dec3", "dec2", "dec1", "head"]
        assert model.edges() == [(0, 1), (0, 6), (1, 2), (1, 5), (2, 3), (2, 4), (3, 4), (4, 5), (5, 6), (6, 7)]
        assert model.units[6].inputs == (5, 0)  # deep path first, then the skip

    def test_chain_models_have_chain_edges(self) -> None:
        model = build_model("resnet50", device="meta")
        assert model.edges() == [(i, i + 1) for i in range(17)]


class TestRunModels:
    def test_json_listing(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["models", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        by_name = {row["name"]: row for row in rows}
        assert [row["name"] for row in rows] == model_names()
        assert by_name["vgg16"] == {"name": "vgg16", "units": 16, "parameters": 138_357_544}
        assert by_name["resnet50"]["parameters"] == 25_557_032
        assert by_name["gpt1"]["units"] == 14

    def test_table_listing(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["models"]) == 0
        assert "138,357,544" in capsys.readouterr().out
