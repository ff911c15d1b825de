"""Bring your own model: specs, units, dataflow, costs, the Python API and ``run --verify``.

The models live in ``tests/data/user_models``: a language model with an embedding,
a ModuleList of blocks, a skip from the embedding to the head and a head tied to the
embedding (``toy_lm``); a U-Net with skips (``unet_small``); blocks with a
value-dependent ``if`` (``branchy``); and ``hf:gpt2`` / ``hf:llama`` from small
configurations.  Expected units, edges and ties are read off the model code by hand.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import pipeplan
from pipeplan.models.errors import InputError
from pipeplan.models.imported import describe, trace_model
from pipeplan.models.profile_imported import analyse_imported, profile_imported, unit_work
from pipeplan.models.profile_measured import MeasureConfig, leaf_args
from pipeplan.models.profile_split import split_backward
from pipeplan.models.replay import replay_model
from pipeplan.models.spec import InputSpec, UserModel, parse_model_args, resolve_user_model, synthetic_loss
from pipeplan.models.model_options import ModelRequest
from pipeplan.models.units import select_units
from pipeplan.runtime.verify import forward_dependence, reference_parameters

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "user_models"
TOY = f"{DATA}/toy_lm.py"
OWN = f"{DATA}/own_models.py"
CLUSTER = DATA / "cpu-four.cluster.json"
LIMIT = 240
"""Hard timeout of one multi-process run (seconds)."""

GPT2_ARGS = ["n_layer=2", "n_embd=32", "n_head=2", "vocab_size=64", "n_positions=16"]
LLAMA_ARGS = ["num_hidden_layers=2", "hidden_size=32", "num_attention_heads=2", "num_key_value_heads=2",
              "intermediate_size=64", "vocab_size=64"]
TOKENS = ["--input-shape", "8", "--input-dtype", "int64", "--input-high", "64"]
BART_ARGS = ["encoder_layers=1", "decoder_layers=1", "d_model=8", "encoder_attention_heads=2",
             "decoder_attention_heads=2", "encoder_ffn_dim=16", "decoder_ffn_dim=16", "vocab_size=64",
             "max_position_embeddings=8"]


def hf_model(name: str, args: list[str]) -> UserModel:
    pytest.importorskip("transformers")
    return resolve_user_model(f"hf:{name}", parse_model_args(args), InputSpec((8,), torch.int64, 64))


def names(model) -> list[str]:
    return [u.name for u in model.units]


def layer_param_identity(graph, model: nn.Module) -> tuple[float, int]:
    """(sum over layers minus tied copies, the module's unique parameter bytes)."""
    summed = sum(layer.params for layer in graph.layers) - sum(layer.extra.get("tied_bytes", 0.0)
                                                               for layer in graph.layers)
    return summed, sum(p.numel() * p.element_size() for p in model.parameters())


class EncoderDecoder(nn.Module):
    """Two stacks of equal weight, each block holding a list of its own sublayers."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sub = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            for layer in self.sub:
                x = x + layer(x)
            return x

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([EncoderDecoder.Block(), EncoderDecoder.Block()])
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.encoder = EncoderDecoder.Stack()
        self.decoder = EncoderDecoder.Stack()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.decoder(self.encoder(self.embed(x))))


class SharedLinear(nn.Module):
    """A Linear held by two blocks (and by the root)."""

    class Block(nn.Module):
        def __init__(self, proj: nn.Linear) -> None:
            super().__init__()
            self.proj = proj
            self.ff = nn.Linear(4, 4)

        def forward(self, x):
            return self.ff(torch.relu(self.proj(x)))

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([SharedLinear.Block(self.proj), SharedLinear.Block(self.proj)])
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# ---------------------------------------------------------------------------------------- specs
class TestParseModelArgs:
    def test_values_are_json(self):
        assert parse_model_args(["a=1", "b=2.5", 'c="x"', "d=[1,2]", "e=true", "f=null"]) == \
            {"a": 1, "b": 2.5, "c": "x", "d": [1, 2], "e": True, "f": None}

    @pytest.mark.parametrize("item, fragment", [("noequals", "KEY=VALUE"), ("1a=2", "KEY=VALUE"),
                                                ("name=foo", "needs quotes")])
    def test_bad_items(self, item, fragment):
        with pytest.raises(InputError, match=fragment):
            parse_model_args([item])


class TestResolveUserModel:
    def test_file_factory_with_example(self):
        user = resolve_user_model(f"{TOY}:build", {"layers": 2})
        (ids,), kwargs = user.example(3)
        assert ids.shape == (3, 6) and ids.dtype == torch.int64 and kwargs == {}
        assert len(user.module.blocks) == 2 and user.loss_fn is None

    def test_module_factory_on_the_path(self, monkeypatch):
        monkeypatch.syspath_prepend(str(DATA))
        user = resolve_user_model("unet_small:build", {"ch": 2})
        assert user.module.enc1[0].out_channels == 2 and user.loss_fn is not None

    def test_same_seed_same_example_and_weights(self):
        a, b = resolve_user_model(f"{TOY}:module_only", {}, InputSpec((5,), torch.int64, 40), seed=3), \
            resolve_user_model(f"{TOY}:module_only", {}, InputSpec((5,), torch.int64, 40), seed=3)
        assert torch.equal(a.example(4, 7)[0][0], b.example(4, 7)[0][0])
        assert torch.equal(a.module.blocks[0].ff.weight, b.module.blocks[0].ff.weight)

    def test_hf_from_config(self):
        user = hf_model("gpt2", GPT2_ARGS)
        assert type(user.module).__name__ == "GPT2LMHeadModel"
        assert user.module.config.use_cache is False and user.module.config.n_layer == 2
        assert user.built == "GPT2LMHeadModel (heads: hf:gpt2:causal, hf:gpt2:base)"

    def test_hf_head_picks_the_class(self):
        pytest.importorskip("transformers")
        small = {"encoder_layers": 1, "decoder_layers": 1, "d_model": 8, "encoder_attention_heads": 2,
                 "decoder_attention_heads": 2, "encoder_ffn_dim": 8, "decoder_ffn_dim": 8, "vocab_size": 16}
        tokens = InputSpec((4,), torch.int64, 16)
        assert type(resolve_user_model("hf:bart", small, tokens).module).__name__ == "BartForCausalLM"
        seq2seq = resolve_user_model("hf:bart:seq2seq", small, tokens)
        assert type(seq2seq.module).__name__ == "BartForConditionalGeneration"
        assert "hf:bart:seq2seq" in seq2seq.built and seq2seq.name == "bart-seq2seq"
        with pytest.raises(InputError, match="gpt2 has no head 'seq2seq' in transformers; it has hf:gpt2:causal"):
            resolve_user_model("hf:gpt2:seq2seq", {}, tokens)

    @pytest.mark.parametrize("spec, args, fragment", [
        ("hf:gtp2", {}, "no model type 'gtp2'; closest: gpt2"),
        ("hf:gpt2", {"nlayer": 2}, "nlayer: not a field of GPT2Config; closest: n_layer"),
    ])
    def test_bad_hf_specs(self, spec, args, fragment):
        pytest.importorskip("transformers")
        with pytest.raises(InputError) as info:
            resolve_user_model(spec, args, InputSpec((4,), torch.int64, 10))
        assert fragment in str(info.value)

    @pytest.mark.parametrize("spec, args, inputs, fragment", [
        (f"{DATA}/missing.py:build", {}, None, "missing.py: file: no such file"),
        (f"{TOY}:nope", {}, None, "has no attribute 'nope'"),
        (f"{TOY}:raises", {}, None, "raises() raised ValueError: dim must be even"),
        (f"{TOY}:not_a_model", {}, None, "returned int; expected an nn.Module"),
        (f"{TOY}:module_only", {}, None, "--input-shape"),
        (f"{TOY}:build", {}, InputSpec((3,)), "makes its own example"),
        (f"{TOY}:build", {"bogus": 1}, None, "unexpected keyword argument 'bogus'"),
        ("no_such_package_xyz:build", {}, None, "no module named 'no_such_package_xyz'"),
    ])
    def test_bad_specs(self, spec, args, inputs, fragment):
        with pytest.raises(InputError) as info:
            resolve_user_model(spec, args, inputs)
        assert fragment in str(info.value)

    def test_factory_exception_is_chained_for_debug(self):
        with pytest.raises(InputError) as info:
            resolve_user_model(f"{TOY}:raises")
        assert isinstance(info.value.__cause__, ValueError)


class TestSyntheticLoss:
    def test_mean_of_squares_of_first_float(self):
        out = {"ids": torch.tensor([1, 2]), "logits": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
        assert synthetic_loss(out, 2).item() == pytest.approx((1 + 4 + 9 + 16) / 4)

    def test_split_batch_sums_to_whole(self):
        x = torch.randn(5, 3)
        whole = synthetic_loss(x, 5)
        parts = synthetic_loss(x[:2], 2) * 2 / 5 + synthetic_loss(x[2:], 3) * 3 / 5
        assert parts.item() == pytest.approx(whole.item())


# ---------------------------------------------------------------------------------------- units
class TestSelectUnits:
    def test_auto_takes_the_longest_modulelist_and_its_siblings(self):
        model = resolve_user_model(f"{TOY}:build").module
        assert select_units(model) == ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]

    def test_auto_without_modulelist_takes_children(self):
        model = resolve_user_model(f"{DATA}/unet_small.py:build").module
        assert select_units(model) == ["enc1", "enc2", "mid", "dec2", "dec1", "out"]

    def test_explicit_modulelist_name_means_its_items(self):
        model = resolve_user_model(f"{TOY}:build").module
        assert select_units(model, "embed,blocks,head") == ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]

    def test_unknown_name_lists_closest(self):
        model = resolve_user_model(f"{TOY}:build").module
        with pytest.raises(InputError, match="'blockz' is not a submodule of ToyLM; closest: blocks"):
            select_units(model, "embed,blockz")

    def test_overlap_refused(self):
        model = resolve_user_model(f"{TOY}:build").module
        with pytest.raises(InputError, match="units overlap: 'blocks.0' contains 'blocks.0.ff'"):
            select_units(model, "embed,blocks.0,blocks.0.ff")

    def test_auto_takes_both_trunks_of_an_encoder_decoder(self):
        model = EncoderDecoder()
        # encoder.layers and decoder.layers are both trunks; a list inside a block is none
        assert select_units(model) == ["embed", "encoder.layers.0", "encoder.layers.1", "encoder.norm",
                                       "decoder.layers.0", "decoder.layers.1", "decoder.norm", "head"]

    def test_auto_leaves_a_module_two_units_hold_to_them(self):
        model = SharedLinear()
        assert select_units(model) == ["blocks.0", "blocks.1", "head"]  # proj is inside both blocks
        m = trace_model(UserModel("shared", "shared", model, lambda n: torch.randn(n, 4)))
        assert [u.tied_to for u in m.units] == [None, 0, None]


# ---------------------------------------------------------------------------------------- dataflow
class TestTraceModel:
    def test_toy_lm_skip_and_tie(self):
        m = trace_model(resolve_user_model(f"{TOY}:build"), trace="both")
        assert names(m) == ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]
        assert m.edges() == [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4)]  # the skip embed -> head
        assert [u.tied_to for u in m.units] == [None, None, None, None, 0]
        assert m.units[4].tied_bytes == 40 * 16 * 4
        assert m.warnings == []

    def test_unet_skips(self):
        m = trace_model(resolve_user_model(f"{DATA}/unet_small.py:build"), trace="both")
        # dec2 reads cat(mid, enc2), dec1 reads cat(dec2, enc1)
        assert m.edges() == [(0, 1), (0, 4), (1, 2), (1, 3), (2, 3), (3, 4), (4, 5)]
        assert m.warnings == []

    def test_value_dependent_if(self):
        user = resolve_user_model(f"{DATA}/branchy.py:build", {}, InputSpec((4,)))
        m = trace_model(user, trace="both")
        assert m.edges() == [(0, 1), (1, 2), (2, 3), (3, 4)]
        assert len(m.warnings) == 1 and "torch.export cannot trace" in m.warnings[0]
        with pytest.raises(InputError, match="torch.export cannot trace the model"):
            trace_model(user, trace="export")

    def test_gpt2(self):
        m = trace_model(hf_model("gpt2", GPT2_ARGS), trace="both")
        assert names(m) == ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0",
                            "transformer.h.1", "transformer.ln_f", "lm_head"]
        # drop reads wte + wpe (glue adds them); the head is tied to wte
        assert m.edges() == [(0, 2), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
        assert m.units[6].tied_to == 0 and m.units[1].out_fixed and not m.units[0].out_fixed
        assert m.warnings == []

    def test_llama_rotary_table(self):
        m = trace_model(hf_model("llama", LLAMA_ARGS), trace="both")
        assert names(m) == ["model.embed_tokens", "model.rotary_emb", "model.layers.0", "model.layers.1",
                            "model.norm", "lm_head"]
        # every layer reads the rotary table; rotary_emb reads its input for the dtype only
        assert m.edges() == [(0, 2), (1, 2), (1, 3), (2, 3), (3, 4), (4, 5)]
        assert m.units[1].out_fixed and m.units[1].inputs == ()

    def test_glue_reading_a_parameter_refused(self):
        with pytest.raises(InputError, match="reads embed.weight; no stage would hold"):
            trace_model(resolve_user_model(f"{TOY}:glue_with_weight"))

    def test_parameters_outside_units_refused(self):
        with pytest.raises(InputError, match="parameters outside every unit: head.weight|outside every unit"):
            trace_model(resolve_user_model(f"{TOY}:build"), units="embed,blocks")

    def test_unit_called_twice_refused(self):
        class Twice(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(2, 2)
                self.b = nn.Linear(2, 2)

            def forward(self, x):
                return self.b(self.a(self.a(x)))

        user = UserModel("twice", "twice", Twice(), lambda n: torch.randn(n, 2))
        with pytest.raises(InputError, match="'a' runs more than once"):
            trace_model(user)

    def test_auto_unit_without_parameters_running_twice_runs_as_glue(self):
        user = resolve_user_model(f"{OWN}:twice_dropout")
        m = trace_model(user)
        assert names(m) == ["a", "b"] and m.edges() == [(0, 1)]
        assert m.warnings == ["left out of the units: drop (runs more than once per forward pass and holds no "
                              "parameters, so it runs as glue code)"]
        with pytest.raises(InputError, match="unit 'drop' runs more than once"):
            trace_model(user, units="a,drop,b")  # named by hand: refused

    def test_glue_may_read_a_parameters_dtype_and_shape(self):
        class Casts(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(3, 3)
                self.b = nn.Linear(3, 2)

            def forward(self, x):  # transformers' ViT asks its projection for the dtype
                x = x.to(self.a.weight.dtype).reshape(-1, self.a.weight.shape[1])
                return self.b(self.a(x))

        m = trace_model(UserModel("casts", "casts", Casts(), lambda n: torch.randn(n, 3)))
        assert m.edges() == [(0, 1)]

    def test_failing_forward_names_the_batch(self):
        user = resolve_user_model(f"{DATA}/branchy.py:build", {}, InputSpec((5,)))
        with pytest.raises(InputError, match="forward on a batch of 2 samples raised RuntimeError"):
            trace_model(user)

    def test_model_input_read_by_a_later_unit(self):
        class Masked(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(3, 3)
                self.b = nn.Linear(3, 3)

            def forward(self, x):
                return self.b(self.a(x) * (x > 0))

        m = trace_model(UserModel("masked", "masked", Masked(), lambda n: torch.randn(n, 3)), trace="both")
        assert m.edges() == [(0, 1)] and m.units[1].reads_input == ("0",)

    def test_dry_run_description(self):
        text = describe(trace_model(resolve_user_model(f"{TOY}:build")))
        assert "head" in text and "tied to embed (2,560 bytes)" in text and "edges: 0->1 0->4 1->2 2->3 3->4" in text


# ---------------------------------------------------------------------------------------- costs
QUICK = MeasureConfig(batch_sizes=(1, 2), warmup=0, repeats=1)


class TestProfileImported:
    @pytest.mark.parametrize("spec, inputs", [(f"{TOY}:build", None), (f"{DATA}/unet_small.py:build", None),
                                              (f"{DATA}/branchy.py:build", InputSpec((4,)))])
    def test_param_bytes_identity(self, spec, inputs):
        user = resolve_user_model(spec, {}, inputs)
        graph = profile_imported(trace_model(user), QUICK)
        summed, unique = layer_param_identity(graph, user.module)
        assert summed == unique and graph.unique_params() <= unique

    def test_toy_lm_bytes_by_hand(self):
        graph = profile_imported(trace_model(resolve_user_model(f"{TOY}:build")), QUICK)
        # embed out: 6 tokens x 16 floats x 4 bytes per sample; head: 6 x 40 x 4; input 6 int64
        assert [layer.out for layer in graph.layers] == [384, 384, 384, 384, 960]
        assert graph.input_bytes == 48 and graph.layers[4].tied_to == 0
        assert graph.edges == ((0, 1), (0, 4), (1, 2), (2, 3), (3, 4))
        assert all(layer.fwd[0] >= 0 and layer.fwd[1] >= 0 for layer in graph.layers)

    def test_hf_param_bytes_identity(self):
        for user in (hf_model("gpt2", GPT2_ARGS), hf_model("llama", LLAMA_ARGS)):
            graph = profile_imported(trace_model(user), QUICK)
            summed, unique = layer_param_identity(graph, user.module)
            assert summed == unique

    def test_fixed_output_recorded(self):
        graph = analyse_imported(trace_model(hf_model("llama", LLAMA_ARGS)))
        rotary = graph.layers[1]
        # cos and sin of shape (1, 8, 16) in float32, whatever the batch
        assert rotary.out == 0 and rotary.extra["out_fixed"] == 2 * 8 * 16 * 4

    def test_analytic_counts_matmul_flops(self):
        user = resolve_user_model(f"{TOY}:build")
        graph = analyse_imported(trace_model(user))
        # block: Linear 16x16 on 6 tokens = 2*6*16*16 FLOPs per sample; head: 2*6*16*40
        assert graph.layers[1].extra["flops"]["fwd_per_sample"] == 2 * 6 * 16 * 16
        assert graph.layers[4].extra["flops"]["fwd_per_sample"] == 2 * 6 * 16 * 40
        assert graph.layers[0].extra["flops"]["fwd_per_sample"] == 0


class TestSplitBackwardOfUserUnits:
    """torch's split backward on units it refuses as they are (see profile_split's notes)."""

    @pytest.mark.parametrize("module, x", [
        (nn.Sequential(nn.Conv2d(2, 2, 3), nn.Flatten()), torch.randn(2, 2, 4, 4)),  # Flatten: a view
        (nn.Linear(4, 3), torch.randn(2, 5, 4)),  # a Linear with a bias on 3-D input: a view too
    ])
    def test_view_outputs_split(self, module, x):
        split = split_backward(module, [x.requires_grad_()])
        assert split.split and 0 < split.act_w <= split.act

    def test_groups_sharing_intermediates_split(self):
        # BART's whole decoder as one unit: torch's weight half frees a graph another group needs
        user = hf_model("bart:seq2seq", BART_ARGS)
        m = trace_model(user, units="model.encoder.embed_tokens,model.encoder.embed_positions,"
                                    "model.encoder.layernorm_embedding,model.encoder.layers,model.decoder,lm_head")
        (module, args, _), = [w for u, w in zip(m.units, unit_work(m, 2, 0)) if u.name == "model.decoder"]
        assert split_backward(module, leaf_args(args)).split

    def test_other_failures_fall_back_to_the_whole_backward(self, monkeypatch):
        import pipeplan.models.profile_split as profile_split

        def refuse(*_args, **_kwargs):
            raise RuntimeError("no split")

        monkeypatch.setattr(profile_split, "stage_backward_input", refuse)
        layer = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
        split = profile_split.split_backward(layer, [torch.ones(5, 3, requires_grad=True)])
        assert not split.split and split.act == split.act_w == 220  # every saved tensor counted for W
        assert all(p.grad is None for p in layer.parameters())


class TestProfilingFailures:
    def test_a_unit_failing_in_its_backward_is_one_error_line(self, run_cli, tmp_path):
        out = tmp_path / "g.json"
        status, _, err = run_cli("profile", f"{OWN}:fails_backward", "-o", str(out), "--batch-sizes", "1",
                                 "--repeats", "1", "--warmup", "0")
        assert status == 2 and err.count("\n") == 1 and not out.exists()
        assert err.startswith(f"error: {OWN}:fails_backward: unit b: profiling it on 1 samples raised "
                              "RuntimeError: no backward here; ")
        assert "--units" in err and "--analytic" in err


# ---------------------------------------------------------------------------------------- replay
class TestReplayModel:
    @pytest.mark.parametrize("spec, inputs", [(f"{TOY}:build", None), (f"{DATA}/unet_small.py:build", None),
                                              (f"{DATA}/branchy.py:build", InputSpec((4,)))])
    def test_stage_by_stage_equals_whole(self, spec, inputs):
        model = replay_model(trace_model(resolve_user_model(spec, {}, inputs)), dtype=torch.float64)
        x, _ = model.example_batch(3, 1)
        whole = model(x)
        done: dict = {}
        for i in range(len(model.units)):  # every unit its own stage, fed only the crossing tensors
            done[i] = model.forward(x, i, i + 1, dict(done))[i]
        assert torch.equal(done[len(model.units) - 1], whole)

    def test_integer_output_refused(self):
        class ArgMax(nn.Module):
            def forward(self, x):
                return x.argmax(-1)

        class Picks(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(2, 4)
                self.pick = ArgMax()
                self.emb = nn.Embedding(4, 2)

            def forward(self, x):
                return self.emb(self.pick(self.a(x)))

        user = UserModel("picks", "picks", Picks(), lambda n: torch.randn(n, 2))
        with pytest.raises(InputError, match="unit pick outputs a torch.int64 tensor"):
            replay_model(trace_model(user))


# ---------------------------------------------------------------------------------------- CLI
class TestProfileCommand:
    """``pipeplan profile`` and ``plan`` in this process (``run`` below is the multi-process one)."""

    def test_dry_run_writes_nothing(self, tmp_path, run_cli):
        out = tmp_path / "g.json"
        status, stdout, err = run_cli("profile", f"{TOY}:build", "--dry-run", "--trace", "both")
        assert status == 0, err
        assert "tied to embed" in stdout and not out.exists()

    @pytest.mark.parametrize("argv, fragment", [
        ([f"{TOY}:raises"], "raises() raised ValueError: dim must be even"),
        ([f"{TOY}:build", "--units", "embed,blockz"], "closest: blocks"),
        ([f"{TOY}:glue_with_weight"], "reads embed.weight; no stage would hold"),
        (["gpt-tiny", "--units", "embed"], "--units: applies to an imported model"),
        ([f"{TOY}:build", "--seq-len", "4"], "--seq-len: applies to zoo models"),
    ])
    def test_bad_input_one_line_exit_2(self, tmp_path, run_cli, argv, fragment):
        out = tmp_path / "g.json"
        status, _, err = run_cli("profile", *argv, "-o", str(out))
        assert status == 2 and not out.exists()
        assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err

    @pytest.mark.parametrize("spec, counted_on", [([f"{TOY}:build"], "meta"),
                                                  ([f"{DATA}/branchy.py:build", "--input-shape", "4"], "cpu")])
    def test_analytic_on_meta_where_the_forward_runs_there(self, tmp_path, run_cli, spec, counted_on):
        out = tmp_path / "g.json"
        status, _, err = run_cli("profile", *spec, "--analytic", "-o", str(out))
        assert status == 0, err
        graph = json.loads(out.read_text())
        assert graph["profile"]["counted_on"] == counted_on  # branchy's `if` reads weight values
        if counted_on == "meta":  # the same counts as on the CPU: block Linear 2*6*16*16 per sample
            assert graph["layers"][1]["flops"]["fwd_per_sample"] == 2 * 6 * 16 * 16

    def test_debug_shows_the_traceback(self, run_cli):
        status, _, err = run_cli("profile", f"{TOY}:raises", "--dry-run", "--debug")
        assert status == 2 and "Traceback" in err and 'raise ValueError("dim must be even")' in err

    def test_profile_then_plan(self, tmp_path, run_cli):
        graph, plan = tmp_path / "g.json", tmp_path / "p.json"
        status, _, err = run_cli("profile", f"{DATA}/unet_small.py:build", "-o", str(graph), "--batch-sizes", "1,2",
                                 "--repeats", "1", "--warmup", "0")
        assert status == 0, err
        data = json.loads(graph.read_text())
        assert [layer["name"] for layer in data["layers"]] == ["enc1", "enc2", "mid", "dec2", "dec1", "out"]
        status, _, err = run_cli("plan", str(graph), str(CLUSTER), "--batch", "8", "--microbatches", "4",
                                 "--solver", "cpsat", "--time-limit", "20", "-o", str(plan))
        assert status == 0, err
        assert json.loads(plan.read_text())["solver"]["status"] in ("optimal", "feasible")


# ---------------------------------------------------------------------------------------- run
def _plan(graph_file: Path, out: Path, cuts: list[int], replicated: int) -> None:
    """A plan over cpu0..cpu3: stages cut after ``cuts``, stage ``replicated`` on two devices with recompute,
    unequal microbatches."""
    graph = json.loads(graph_file.read_text())
    bounds = [0, *cuts, len(graph["layers"])]
    devices = iter(["cpu0", "cpu1", "cpu2", "cpu3"])
    stages = [{"layers": [bounds[s], bounds[s + 1]],
               "devices": [next(devices)] + ([next(devices)] if s == replicated else []),
               "microbatches": [3, 2, 3], "recompute": s == replicated} for s in range(len(bounds) - 1)]
    out.write_text(json.dumps({"format": "pipeplan.plan/1", "graph": graph["name"], "cluster": "cpu-four",
                               "global_batch": 8, "state_factor": 4, "schedule": "1f1b", "stages": stages}))


RUNS = {
    # name: (spec and options, cuts, replicated stage); cuts put skips across stages.  A tied
    # head, GPT-2 and a Llama-type model run in tests/test_own_models.py (planned, exported).
    "unet": ([f"{DATA}/unet_small.py:build"], [1, 4], 1),
    "branchy": ([f"{DATA}/branchy.py:build", "--input-shape", "4"], [2, 4], 0),
}


@pytest.fixture(scope="module")
def imported_runs(tmp_path_factory) -> dict[str, dict]:
    """Every model of :data:`RUNS` profiled, planned and run with ``--verify`` on 4 processes, in one launch."""
    import contextlib
    import io

    from helpers import shared_launch
    from pipeplan.cli import main

    folder = tmp_path_factory.mktemp("imported")
    runs = {}
    for name, (model, cuts, replicated) in RUNS.items():
        graph, plan = folder / f"{name}.graph.json", folder / f"{name}.plan.json"
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status = main(["profile", *model, "-o", str(graph), "--batch-sizes", "1,2", "--repeats", "1",
                           "--warmup", "0"])
        assert status == 0, err.getvalue()
        _plan(graph, plan, cuts, replicated)
        runs[name] = [str(graph), str(CLUSTER), str(plan), "--model", *model, "--verify", "--steps", "2"]
    return shared_launch(runs, folder)


class TestRunImported:
    @pytest.mark.parametrize("name", list(RUNS))
    def test_verify_on_four_processes(self, imported_runs, run_cli, monkeypatch, name):
        from helpers import run_shared

        status, out, err = run_shared(imported_runs[name], run_cli, monkeypatch, "--json")
        assert status == 0, err
        result = json.loads(out)
        assert result["processes"] == 4 and result["verified"] and result["max_param_diff"] <= 1e-6

    def test_example_of_several_tensors_refused(self, tmp_path, run_cli):
        graph, plan = tmp_path / "g.json", tmp_path / "p.json"
        spec = f"{DATA}/two_inputs.py:build"
        status, _, err = run_cli("profile", spec, "-o", str(graph), "--batch-sizes", "1", "--repeats", "1",
                                 "--warmup", "0")
        assert status == 0, err
        _plan(graph, plan, [1], 0)
        status, _, err = run_cli("run", str(graph), str(CLUSTER), str(plan), "--model", spec, "--steps", "1")
        assert status == 2 and err.count("\n") == 1
        assert "the runtime feeds the model one input tensor" in err


class TestForwardDependence:
    """What ``--verify`` finds about a forward beyond each sample alone."""

    def test_an_if_on_a_batch_statistic(self):
        model = replay_model(trace_model(resolve_user_model(f"{OWN}:branchy_batch")), dtype=torch.float64)
        assert forward_dependence(model, model.example_batch(8, 0)[0]) == {"batch"}

    def test_functional_dropout(self):
        class Drops(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 2)

            def forward(self, x):
                return self.b(nn.functional.dropout(self.a(x), 0.5, training=True))

        model = replay_model(trace_model(UserModel("drops", "drops", Drops(), lambda n: torch.randn(n, 4))),
                             dtype=torch.float64)
        assert forward_dependence(model, model.example_batch(8, 0)[0]) == {"random"}

    def test_per_sample_models(self):
        model = replay_model(trace_model(resolve_user_model(f"{TOY}:build")), dtype=torch.float64)
        assert forward_dependence(model, model.example_batch(8, 0)[0]) == set()

    def test_the_reference_runs_the_plans_microbatches_and_says_so(self):
        from pipeplan.solver.formats.plan import Plan, Stage

        plan = Plan("g", "c", 8, 4.0, "gpipe", (Stage((0, 2), ("a",), (4, 4)), Stage((2, 3), ("b",), (4, 4))))
        kw = dict(steps=1, global_batch=8, lr=0.1, seed=0, dtype=torch.float64, seq_len=None)
        request = ModelRequest(f"{OWN}:branchy_batch")
        notes: list[str] = []
        pieced = reference_parameters(request, plan=plan, notes=notes, **kw)
        whole = reference_parameters(request, **kw)
        assert len(notes) == 1 and "depends on the other samples of its batch" in notes[0]
        assert max((pieced[n] - whole[n]).abs().max().item() for n in whole) > 1e-6


class TestImportFromTheCloneParent:
    def test_a_clone_named_pipeplan_imports_as_the_package(self, tmp_path):
        (tmp_path / "pipeplan").symlink_to(ROOT, target_is_directory=True)
        code = "import pipeplan, pipeplan.models.errors; print(callable(pipeplan.profile_model))"
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                              timeout=LIMIT)
        assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


# ---------------------------------------------------------------------------------------- API
class TestProfileModelApi:
    def test_sequential(self):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        graph = pipeplan.profile_model(model, lambda n: torch.randn(n, 4), batch_sizes=(1, 2))
        assert [layer.name for layer in graph.layers] == ["0", "1", "2"]
        assert graph.edges == ((0, 1), (1, 2)) and graph.layers[0].params == (4 * 8 + 8) * 4


class TestPlanApi:
    def test_plans_a_profiled_model(self):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        graph = pipeplan.profile_model(model, lambda n: torch.randn(n, 4), analytic=True)
        plan, result = pipeplan.plan(graph, str(CLUSTER), batch=8, microbatches=4, time_limit=20)
        assert result.status == "optimal" and plan is not None and plan.stages[-1].layers[1] == 3


class TestDocsExample:
    def test_user_models_doc_example_runs(self, tmp_path, monkeypatch):
        text = (ROOT / "docs" / "user-models.md").read_text()
        blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
        assert blocks, "docs/user-models.md has no python example"
        monkeypatch.chdir(ROOT)
        namespace: dict = {}
        exec(compile(blocks[0], "docs/user-models.md", "exec"), namespace)
        assert namespace["record"].status == "optimal"
