"""Tensor-parallel stages and ZeRO in the runtime: the pure parts (which layers split, how, who talks to whom).

The runs themselves (``pipeplan run --verify`` on version-3 plans of the zoo GPT and an HF
Llama, 1e-10 against one process in float64) are in tests/test_runtime.py's shared launch
(``TP_PLANS``); the exported ``train.py`` of a tensor-parallel ZeRO plan trains under
torchrun in tests/test_export.py (``TORCHRUN_PLANS``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeplan.models.zoo import build_model
from pipeplan.runtime.gradsync import group_members, links
from pipeplan.runtime.routing import cut_messages, leader_ranks, pieces
from pipeplan.runtime.sharding import fused_row_order, replica_ranks, tensor_parallel_plan
from pipeplan.solver.formats.plan import Plan, Stage


def _plan() -> Plan:
    """TP 2 (one replica), then 2 replicas of TP 2, then one device; gpt-tiny's 6 units."""
    return Plan("gpt-tiny-6", "c", 6, 4.0, "gpipe", (
        Stage((0, 2), ("a0", "a1"), (3, 3), tensor_parallel=2),
        Stage((2, 5), ("b0", "b1", "b2", "b3"), (3, 3), tensor_parallel=2),
        Stage((5, 6), ("c0",), (6,))), zero=1)


def _style_names(plan: dict) -> dict[str, str]:
    return {name: type(style).__name__ for name, style in plan.items()}


class TestTensorParallelPlan:
    def test_zoo_gpt_block_splits_attention_and_mlp_as_megatron(self):
        block = build_model("gpt-tiny").units[1].module
        assert _style_names(tensor_parallel_plan(block, 2)) == {
            "attn.qkv": "FusedColwise", "attn.proj": "RowwiseParallel",
            "mlp.0": "ColwiseParallel", "mlp.2": "RowwiseParallel"}

    def test_layers_without_a_plan_stay_whole(self):
        model = build_model("gpt-tiny")
        assert tensor_parallel_plan(model.units[0].module, 2) == {}  # embedding
        assert tensor_parallel_plan(model.units[-1].module, 2) == {}  # LayerNorm and the tied head

    def test_a_degree_that_does_not_divide_the_heads_leaves_them_whole(self):
        block = build_model("gpt-tiny").units[1].module  # 4 heads, hidden 128
        assert tensor_parallel_plan(block, 3) == {}
        assert set(tensor_parallel_plan(block, 4)) == {"attn.qkv", "attn.proj", "mlp.0", "mlp.2"}

    def test_hugging_face_attention_and_gated_mlp(self):
        class Attention(nn.Module):
            def __init__(self, kv_heads: int) -> None:
                super().__init__()
                self.head_dim = 4
                self.q_proj, self.k_proj = nn.Linear(16, 16), nn.Linear(16, 4 * kv_heads)
                self.v_proj, self.o_proj = nn.Linear(16, 4 * kv_heads), nn.Linear(16, 16)

        class MLP(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.gate_proj, self.up_proj, self.down_proj = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 16)

        layer = nn.Module()
        layer.self_attn, layer.mlp = Attention(kv_heads=2), MLP()
        assert _style_names(tensor_parallel_plan(layer, 2)) == {
            "self_attn.q_proj": "ColwiseParallel", "self_attn.k_proj": "ColwiseParallel",
            "self_attn.v_proj": "ColwiseParallel", "self_attn.o_proj": "RowwiseParallel",
            "mlp.gate_proj": "ColwiseParallel", "mlp.up_proj": "ColwiseParallel", "mlp.down_proj": "RowwiseParallel"}
        layer.self_attn = Attention(kv_heads=1)  # one key/value head cannot be split in two
        assert set(tensor_parallel_plan(layer, 2)) == {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}

    def test_an_mlp_with_dropout_between_its_linears_is_not_split(self):
        # the ranks would draw their masks apart from the one-process reference
        mlp = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 8))
        assert tensor_parallel_plan(mlp, 2) == {}
        assert set(tensor_parallel_plan(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)), 2)) == {"0", "2"}


class TestFusedRowOrder:
    def test_each_rank_gets_its_heads_q_k_and_v(self):
        order = fused_row_order(12, 3, 2).tolist()  # q, k, v of 4 rows each
        assert order[:6] == [0, 1, 4, 5, 8, 9] and order[6:] == [2, 3, 6, 7, 10, 11]

    @pytest.mark.parametrize("t", [1, 2, 4])
    def test_the_shards_compute_the_zoo_attention(self, t):
        # column-parallel qkv with the fused order, each rank's heads by the model's own code, then the
        # row-parallel projection's partial sums: the whole block's attention, as one process computes it
        torch.manual_seed(0)
        attn = build_model("gpt-tiny", dtype=torch.float64).units[1].module.attn
        x = torch.randn(2, 5, 32, dtype=torch.float64)
        want = attn(x)
        order = fused_row_order(96, 3, t)
        w, b = attn.qkv.weight.detach()[order], attn.qkv.bias.detach()[order]
        total = torch.zeros_like(want)
        for i in range(t):
            part = type(attn).__new__(type(attn))
            nn.Module.__init__(part)
            part.heads, part.head_dim = attn.heads // t, attn.head_dim
            rows = slice(i * 96 // t, (i + 1) * 96 // t)
            part.qkv = nn.Linear(32, 96 // t).double()
            part.qkv.weight.data, part.qkv.bias.data = w[rows].clone(), b[rows].clone()
            cols = slice(i * 32 // t, (i + 1) * 32 // t)
            part.proj = nn.Linear(32 // t, 32, bias=False).double()
            part.proj.weight.data = attn.proj.weight.detach()[:, cols].clone()
            total += part(x)
        torch.testing.assert_close(total + attn.proj.bias, want, rtol=1e-12, atol=1e-12)


class TestRouting:
    def test_a_replica_of_a_tensor_parallel_stage_is_one_piece_sent_by_its_leader(self):
        plan = _plan()
        assert replica_ranks(plan, 1) == [[2, 3], [4, 5]] and leader_ranks(plan, 1) == [2, 4]
        assert [(p.replica, p.rank, p.start, p.stop) for p in pieces(plan, 1)] == [
            (0, 2, 0, 2), (1, 4, 2, 3), (0, 2, 3, 5), (1, 4, 5, 6)]
        for cut in range(2):
            for m in cut_messages(plan, cut, plan.stage_actions()):
                assert m.src in leader_ranks(plan, cut) and m.dst in leader_ranks(plan, cut + 1)

    def test_groups_rings_per_tensor_parallel_rank_and_replicas(self):
        members = group_members(_plan(), build_model("gpt-tiny", device="meta"))
        assert members[(0, "fwd")] == [0, 2, 4] and members[(1, "bwd")] == [2, 4, 6]
        assert members[("group", 1, 0)] == [2, 4] and members[("group", 1, 1)] == [3, 5]
        assert ("group", 0) not in members and ("group", 1) not in members  # t rings instead of one
        assert members[("tp", 0, 0)] == [0, 1] and members[("tp", 1, 1)] == [4, 5]
        assert members[("tied", (0, 2))] == [0, 1, 6]  # every holder of the embedding, each adding its share
        tcp = {(key, a, b) for key, a, b in links(members, _plan())}
        assert not any(key[0] == "tp" for key, _, _ in tcp)  # a replica broadcasts through torch.distributed
        assert ((1, "fwd"), 2, 6) in tcp and not any(key == (1, "fwd") and 3 in (a, b) for key, a, b in tcp)


class TestRefusals:
    def test_emulate_refuses_a_tensor_parallel_stage(self, tmp_path, run_cli):
        import json

        from helpers import RUN_CLUSTER

        plan = tmp_path / "p.json"
        plan.write_text(json.dumps({
            "format": "pipeplan.plan/3", "graph": "gpt-tiny-6", "cluster": "two-servers", "global_batch": 2,
            "state_factor": 4, "schedule": "gpipe",
            "stages": [{"layers": [0, 6], "devices": ["g0", "g1"], "tensor_parallel": 2, "microbatches": [2],
                        "recompute": False}]}))
        status, _, err = run_cli("run", "examples/gpt-tiny.graph.json", RUN_CLUSTER, str(plan), "--model",
                                 "gpt-tiny", "--emulate")
        assert status == 2 and err.count("\n") == 1
        assert "stages[0].tensor_parallel: stage 0 has tensor_parallel 2, but --emulate" in err
