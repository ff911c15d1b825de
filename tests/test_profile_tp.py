"""Tests of the tensor-parallel layer fields the profilers write (``tp_share``, ``tp_comm``; docs/model.md 8.1).

The expected numbers are worked out by hand from the layers' shapes (bytes of the split
weights, of the all-reduced activations), not read back from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeplan.cli import main
from pipeplan.models.graph import GRAPH_FORMAT_V2, GRAPH_FORMAT_V3, LayerGraph, load_graph
from pipeplan.models.profile_analytic import profile_analytic
from pipeplan.models.profile_measured import MeasureConfig, profile_measured
from pipeplan.models.profile_tp import (COLWISE, ROWWISE, count_tensor_parallel, tensor_parallel_fields,
                                        tensor_parallel_plan)
from pipeplan.models.zoo import build_model

F32 = 4
S, D, V, CTX = 16, 32, 64, 16  # gpt-tiny: tokens per sample, hidden size, vocabulary, positions


@pytest.fixture(scope="module")
def gpt_tiny() -> LayerGraph:
    return profile_analytic("gpt-tiny")


class TestTensorParallelPlan:
    def test_zoo_units(self):
        gpt = build_model("gpt-tiny", device="meta")
        assert tensor_parallel_plan(gpt.units[1].module) == {"attn.qkv": COLWISE, "attn.proj": ROWWISE,
                                                             "mlp.0": COLWISE, "mlp.2": ROWWISE}
        llama = build_model("llama-tiny", device="meta")
        assert set(tensor_parallel_plan(llama.units[1].module).values()) == {COLWISE, ROWWISE}
        assert tensor_parallel_plan(llama.units[-1].module) == {"output": COLWISE}

    def test_no_plan_for_other_layers(self):
        vgg = build_model("vgg-tiny", device="meta")
        assert all(tensor_parallel_plan(u.module, u.name) == {} for u in vgg.units)
        assert tensor_parallel_plan(nn.Linear(4, 4), "proj") == {}
        assert tensor_parallel_plan(nn.Embedding(4, 4), "wpe") == {}  # a position table is not split


class TestCountTensorParallel:
    def test_mlp_by_hand(self):
        mlp = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 4))
        c = count_tensor_parallel(mlp, [torch.ones(2, 4, requires_grad=True)], mlp, {"0": COLWISE, "2": ROWWISE})
        assert c.flops == c.split_flops == 2 * 2 * (4 * 16 + 16 * 4)
        # saved: the first Linear's input (whole, 2 x 4), the GELU's input and the second Linear's input (2 x 16 each)
        assert (c.saved, c.split_saved) == (F32 * (8 + 32 + 32), F32 * (32 + 32))
        assert (c.fwd_bytes, c.bwd_bytes) == (F32 * 8, F32 * 8)  # the output all-reduced; the input's gradient

    def test_fields_are_per_sample_shares(self):
        mlp = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 4))
        counts = [count_tensor_parallel(mlp, [torch.ones(n, 4, requires_grad=True)], mlp, {"0": COLWISE, "2": ROWWISE})
                  for n in (1, 2)]
        share, comm = tensor_parallel_fields((1, 2), counts, 100.0, 75.0)
        assert share == (1.0, 0.75, pytest.approx(32 / 36))
        assert comm == (F32 * 4, F32 * 4)


class TestProfiledFields:
    def test_gpt_tiny_block(self, gpt_tiny: LayerGraph):
        assert gpt_tiny.format == GRAPH_FORMAT_V3
        block = gpt_tiny.layers[1]
        x_time, x_params, x_act = block.tp_share
        # split: qkv's weight and bias, proj's weight, fc's weight and bias, fc2's weight
        split = 3 * D * D + 3 * D + D * D + 4 * D * D + 4 * D + 4 * D * D
        assert x_params == pytest.approx(split / (12 * D * D + 13 * D))
        assert x_time == 1.0  # every FLOP FlopCounterMode counts in a block is a split matmul or the core
        assert 0.5 < x_act < 1.0  # LayerNorm and projection inputs stay whole
        assert block.tp_comm == (2 * S * D * F32, 2 * S * D * F32)  # two all-reduces of s x h each way

    def test_gpt_tiny_embedding_and_head(self, gpt_tiny: LayerGraph):
        embed, head = gpt_tiny.layers[0], gpt_tiny.layers[-1]
        assert embed.tp_share == (0.0, V / (V + CTX), 0.0)  # the token table is split, the position table not
        assert embed.tp_comm == (S * D * F32, 0.0)
        assert head.tp_share[0] == 1.0 and head.tp_share[2] == 0.0
        assert head.tp_share[1] == pytest.approx(V * D / (V * D + 2 * D))  # the final LayerNorm stays whole
        assert head.tp_comm == (0.0, S * D * F32)

    def test_round_trip(self, gpt_tiny: LayerGraph, tmp_path: Path):
        path = tmp_path / "g.json"
        path.write_text(json.dumps(gpt_tiny.to_dict()))
        again = load_graph(str(path))
        assert again.format == GRAPH_FORMAT_V3
        assert [(l.tp_share, l.tp_comm) for l in again.layers] == [(l.tp_share, l.tp_comm) for l in gpt_tiny.layers]

    def test_schema_takes_it(self, gpt_tiny: LayerGraph):
        jsonschema = pytest.importorskip("jsonschema")
        from pipeplan.schema_files import schema

        jsonschema.Draft202012Validator(schema("graph")).validate(json.loads(json.dumps(gpt_tiny.to_dict())))

    def test_measured_counts_agree_with_analytic(self, gpt_tiny: LayerGraph, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setenv("PIPEPLAN_CACHE", str(tmp_path))
        measured = profile_measured("gpt-tiny", config=MeasureConfig((1, 2), 0, 1), use_cache=False)
        for a, m in zip(gpt_tiny.layers, measured.layers):
            assert m.tp_share == pytest.approx(a.tp_share) and m.tp_comm == a.tp_comm

    def test_llama_gated_mlp(self):
        graph = profile_analytic("llama-tiny")
        layer = graph.layers[1]  # wq, wk, wv, wo, w1, w3, w2 split; the two RMSNorm weights whole
        head_dim, kv = 32 // 4, 2
        split = D * D + 2 * D * kv * head_dim + D * D + 3 * D * 64
        assert layer.tp_share[1] == pytest.approx(split / (split + 2 * D))
        assert layer.tp_comm == (2 * S * D * F32, 2 * S * D * F32)

    def test_other_models_unchanged(self):
        graph = profile_analytic("vgg-tiny")
        assert graph.format == GRAPH_FORMAT_V2
        assert graph.to_dict() == profile_analytic("vgg-tiny", tensor_parallel=False).to_dict()

    def test_option_off(self, tmp_path: Path):
        out = tmp_path / "g.json"
        assert main(["profile", "gpt-tiny", "--analytic", "--no-tensor-parallel", "-o", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["format"] == GRAPH_FORMAT_V2
        assert not any("tp_share" in layer or "tp_comm" in layer for layer in data["layers"])


class TestImported:
    def test_hugging_face_plans(self):
        transformers = pytest.importorskip("transformers")
        gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
        bert = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=64, max_position_embeddings=16)
        from transformers.models.bert.modeling_bert import BertLayer
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        assert tensor_parallel_plan(GPT2Block(gpt2)) == {"attn.c_attn": COLWISE, "attn.c_proj": ROWWISE,
                                                         "mlp.c_fc": COLWISE, "mlp.c_proj": ROWWISE}
        assert tensor_parallel_plan(BertLayer(bert)) == {
            "attention.self.query": COLWISE, "attention.self.key": COLWISE, "attention.self.value": COLWISE,
            "attention.output.dense": ROWWISE, "intermediate.dense": COLWISE, "output.dense": ROWWISE}
        assert tensor_parallel_plan(nn.Embedding(64, 32), "transformer.wte") == {"": "embedding"}
        assert tensor_parallel_plan(nn.Linear(32, 64), "lm_head") == {"": COLWISE}

    def test_hugging_face_llama(self):
        pytest.importorskip("transformers")
        from pipeplan.models.imported import trace_model
        from pipeplan.models.profile_imported import analyse_imported
        from pipeplan.models.spec import InputSpec, parse_model_args, resolve_user_model

        args = ["num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "num_key_value_heads=1",
                "intermediate_size=64", "vocab_size=64"]
        user = resolve_user_model("hf:llama", parse_model_args(args), InputSpec((8,), torch.int64, 64))
        graph = analyse_imported(trace_model(user))
        tokens = 8 * 32 * F32  # one sample: 8 tokens of 32 float32 features
        split = [layer for layer in graph.layers if layer.tp_share is not None]
        assert [layer.name for layer in split] == ["model.embed_tokens", "model.layers.0", "lm_head"]
        assert split[1].tp_comm == (2 * tokens, 2 * tokens)
        # q and o: 32 x 32; k and v: 32 x 16 (one key/value head of 16); gate, up, down: 32 x 64
        weights = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64
        assert split[1].tp_share[1] == pytest.approx(weights / (weights + 2 * 32))  # two RMSNorm weights whole
        assert split[0].tp_comm == (tokens, 0.0) and split[-1].tp_comm == (0.0, tokens)
        assert all(layer.tp_comm is None for layer in graph.layers if layer.tp_share is None)
