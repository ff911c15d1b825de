"""A 70B-class transformer on the tutorial's 48-device cluster: the best plan with tensor parallelism and ZeRO
against the best plan without them (docs/model.md, section 8.6).

The graph (:func:`llama70b_graph`) is Llama-2-70B's shape (80 blocks, hidden 8192, MLP
28672, 64 heads and 8 key-value heads, vocabulary 32000) at sequence length 4096, from
FLOPs and shapes: the A100-80GB is the reference device (the cluster's speed 1), running
matrix products at half its 312 TFLOP/s bf16 peak and element-wise work at its 2,039
GB/s.  Its version-3 fields come from Megatron-LM's tensor-parallel plan: the attention
and MLP matrix products column- then row-parallel, so a block splits its matrix-product
time, all its weight matrices and 24 of the ``34 s h`` bytes per sample it saves (the
LayerNorm and residual tensors stay whole: no sequence parallelism), and all-reduces its
``s h`` bf16 activations twice in the forward and twice in the backward.  Training state
is bf16 weights and gradients with fp32 master weights and Adam moments: 16 bytes per
parameter, ``state_factor`` 8 of the 2-byte parameters (weights 1, gradients 1,
optimizer 6).

The cluster is the README tutorial's: two servers of 8 A100-80GB on NVLink and four of
8 V100-32GB on PCIe, joined by 200 Gb/s InfiniBand.

Each configuration is one ``pipeplan.plan`` call with ``--solver`` (group-search by
default), ``--schedule 1f1b``, the batch and microbatches given; the table shows the
simulator's iteration time, the pipeline depth, the degrees and ZeRO levels chosen and
the largest memory per device.

Usage::

    python -m pipeplan.experiments.tp_70b [--solver group-search] [--batch 64] [--microbatches 16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.cluster_spec import build_cluster, parse_server_group
from pipeplan.solver.planning import plan

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, BLOCKS, SEQ = 8192, 28672, 64, 8, 32000, 80, 4096
"""Llama-2-70B's shape and the sequence length."""

MATMUL_RATE = 0.5 * 312e12
"""FLOP/s of the A100's matrix products: half its bf16 peak."""

MEMORY_RATE = 2039e9
"""Bytes/s of the A100's element-wise work and optimizer step (its HBM bandwidth)."""

KERNEL = 10e-6
"""Seconds of launch overhead per kernel; a block runs about 20 kernels each way."""

CONFIGS = (("1", "0"), ("1", "auto"), ("uniform", "0"), ("uniform", "auto"), ("per-stage", "auto"))
"""``(--tensor-parallel, --zero)`` of each row."""

STATE_FACTOR = 8.0
"""bf16 weights and gradients, fp32 master weights and moments: 16 bytes per parameter of 2 bytes."""


def _layer(name: str, flops: float, split_flops: float, elementwise: float, weights: float, split_weights: float,
           act: float, split_act: float, out: float, comm: tuple[float, float], kernels: int) -> Layer:
    """One layer from per-sample forward FLOPs and element-wise bytes, its weights (elements) and bytes saved."""
    fwd_b = flops / MATMUL_RATE + elementwise / MEMORY_RATE
    split_time = (split_flops / MATMUL_RATE) / fwd_b if fwd_b else 0.0
    params = 2.0 * weights
    return Layer(name, (kernels * KERNEL, fwd_b), (2 * kernels * KERNEL, 2 * fwd_b), params, act, out,
                 step=2 * STATE_FACTOR * params / MEMORY_RATE,
                 tp_share=(split_time, split_weights / weights if weights else 0.0, split_act / act if act else 0.0),
                 tp_comm=comm)


def llama70b_graph(seq: int = SEQ) -> LayerGraph:
    """The 70B-class graph: embedding, 80 blocks, the final norm with the output layer and loss."""
    h, s = HIDDEN, seq
    kv = h * KV_HEADS // HEADS
    matrices = 2 * h * h + 2 * h * kv + 3 * h * FFN
    block_flops = 2 * matrices * s + 2 * s * s * h  # the matrix products, causal attention (half of 4 s^2 h)
    block = _layer("block", block_flops, block_flops, 10 * s * h * 2 * 2, matrices + 2 * h, matrices,
                   34 * s * h, 24 * s * h, 2 * s * h, (2 * 2 * s * h, 2 * 2 * s * h), 20)
    embed = _layer("embed", 0.0, 0.0, 2 * s * h * 2, VOCAB * h, VOCAB * h, 8 * s, 0.0, 2 * s * h,
                   (2 * s * h, 0.0), 2)
    logits = 4 * s * VOCAB  # fp32 logits for the loss, split by the vocabulary-parallel output layer
    head = _layer("head", 2 * VOCAB * h * s, 2 * VOCAB * h * s, 2 * s * h * 2, VOCAB * h + h, VOCAB * h,
                  2 * s * h + logits, logits, 4, (3 * 4 * s, 2 * s * h), 6)
    layers = [embed] + [Layer(f"block.{i}", block.fwd, block.bwd, block.params, block.act, block.out,
                              step=block.step, tp_share=block.tp_share, tp_comm=block.tp_comm)
                        for i in range(BLOCKS)] + [head]
    return LayerGraph(f"llama-70b-s{s}", layers, input_bytes=8 * s)


def tutorial_cluster() -> Cluster:
    """Two servers of 8 A100-80GB on NVLink, four of 8 V100-32GB on PCIe, 200 Gb/s InfiniBand (README tutorial)."""
    return build_cluster([parse_server_group("2x8:a100-80g:nvlink3"), parse_server_group("4x8:v100-32g:pcie3")],
                         "ib-hdr")


def row(graph: LayerGraph, cluster: Cluster, mode: str, zero: str, *, solver: str, batch: int, microbatches: int,
        time_limit: float) -> dict[str, Any]:
    """One configuration's best plan, in numbers."""
    started = time.perf_counter()
    done = plan(graph, cluster, batch=batch, microbatches=microbatches, solver=solver, schedule="1f1b",
                state_factor=STATE_FACTOR, tensor_parallel=mode, zero=zero, time_limit=time_limit)
    wall = time.perf_counter() - started
    result = done.record
    phases = [{k: ph.get(k) for k in ("degree", "state", "state_factor", "model_time", "iteration_time", "fits")}
              for ph in result.details.get("tensor_parallel", {}).get("phases", [])]
    out: dict[str, Any] = {"tensor_parallel": mode, "zero": zero, "solver": solver, "status": result.status,
                           "wall_time": wall, "message": result.message, "phases": phases,
                           "moves": result.details.get("tensor_parallel", {}).get("moves")}
    if result.plan is None:
        return out
    p = result.plan
    sim = simulate(p, graph, cluster)
    kinds = {d.id: d.extra.get("kind", "?") for d in cluster.devices}
    peaks = [g.peak_memory for g in sim.groups]
    out.update(iteration_time=sim.iteration_time, throughput=batch / sim.iteration_time, stages=len(p.stages),
               degrees=[st.tensor_parallel for st in p.stages], replicas=[st.replicas for st in p.stages],
               zero_levels=[p.stage_zero(s) for s in range(len(p.stages))],
               layers=[list(st.layers) for st in p.stages],
               kinds=[dict(Counter(kinds[d] for d in st.devices)) for st in p.stages],
               devices_used=sum(len(st.devices) for st in p.stages),
               max_memory=max(peaks), max_memory_share=max(g.peak_memory / g.capacity for g in sim.groups),
               recompute=[st.recompute for st in p.stages],
               busy=[sum(g.durations) for g in sim.groups], allreduce=[g.allreduce for g in sim.groups],
               step=[g.step for g in sim.groups])
    return out


def runs_text(values: list[Any]) -> str:
    """``values`` as runs: ``[1, 1, 2] -> "1x2, 2"``."""
    runs: list[list[Any]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return ", ".join(f"{v}x{n}" if n > 1 else f"{v}" for v, n in runs)


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| --tensor-parallel | --zero | iteration (s) | samples/s | stages | degrees | replicas | ZeRO | "
             "devices | recompute | max memory/device (GB) | highest share of a device |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "iteration_time" not in r:
            lines.append(f"| {r['tensor_parallel']} | {r['zero']} | no plan ({r['status']}) | | | | | | | | | |")
            continue
        lines.append(f"| {r['tensor_parallel']} | {r['zero']} | {r['iteration_time']:.3f} | {r['throughput']:.2f} | "
                     f"{r['stages']} | {runs_text(r['degrees'])} | {runs_text(r['replicas'])} | "
                     f"{runs_text(r['zero_levels'])} | {r['devices_used']} | "
                     f"{sum(r['recompute'])} of {r['stages']} | {r['max_memory'] / 1e9:.1f} | "
                     f"{100 * r['max_memory_share']:.0f}% |")
    return "\n".join(lines)


def _phase_table(rows: list[dict[str, Any]]) -> str:
    """The phases of the ``uniform`` rows: each degree's best plan (docs/solvers.md, tensor parallelism)."""
    lines = ["| --tensor-parallel | --zero | degree t | state hint | iteration (s) | fits |", "|---|---|---|---|---|---|"]
    for r in rows:
        for ph in r.get("phases", []) if r["tensor_parallel"] == "uniform" else []:
            t = ph.get("iteration_time")
            lines.append(f"| {r['tensor_parallel']} | {r['zero']} | {ph['degree']} | {ph['state']} | "
                         f"{'no plan' if t is None else f'{t:.3f}'} | "
                         f"{'-' if ph.get('fits') is None else 'yes' if ph['fits'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--solver", default="group-search")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--configs", default=",".join(f"{m}/{z}" for m, z in CONFIGS),
                    help="MODE/ZERO pairs, comma-separated")
    ap.add_argument("--json", metavar="OUT.json", help="also write every row as JSON")
    args = ap.parse_args(argv)
    graph, cluster = llama70b_graph(), tutorial_cluster()
    rows = []
    for pair in args.configs.split(","):
        mode, zero = pair.split("/")
        rows.append(row(graph, cluster, mode, zero, solver=args.solver, batch=args.batch,
                        microbatches=args.microbatches, time_limit=args.time_limit))
        print(json.dumps({k: v for k, v in rows[-1].items() if k in ("tensor_parallel", "zero", "status",
                                                                       "iteration_time", "wall_time")}), flush=True)
    print(_table(rows))
    print()
    print(_phase_table(rows))
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
