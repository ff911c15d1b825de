"""pipeplan against the released Metis planner (SamsungLabs/Metis, ATC'24) with tensor parallelism on.

Metis searches data x tensor x pipeline degrees on heterogeneous clusters.  Its licence
(CC BY-NC 4.0) keeps its code out of pipeplan: this experiment runs a copy the user
gives (``--metis PATH``, the directory holding ``cost_het_cluster.py``) as a separate
program, on inputs written from pipeplan's own graph and cluster, and scores the plans
it prints with pipeplan's simulator.

**Metis's inputs** (:func:`write_metis_inputs`), so that both planners see the same costs:

- one profile ``DeviceType.{K}_tp{t}_bs{b}.json`` per device kind ``K``, tensor-parallel
  degree ``t`` (powers of two up to the smallest server) and microbatch size ``b`` per
  replica (powers of two up to the batch): per layer, ``layer_compute_total_ms`` is
  pipeplan's forward plus backward time of that layer on one replica of ``t`` devices of
  kind ``K`` with ``b`` samples, with the layer's tensor-parallel collectives on that
  kind's server link (docs/model.md 8.3: ``(fwd + bwd) * tau / speed + C(b c_f) + C(b c_b)``);
  ``layer_memory_total_mb`` is what one device holds of it with no ZeRO: the training state
  ``state_factor * params * pi`` plus one microbatch's saved activations ``b * act * alpha``
  (8.4); ``optimizer_time_ms`` is half the graph's optimizer step on the reference device
  (Metis doubles the figure it reads);
- ``hostfile`` (``IP slots=N``, one line per server, grouped by kind) and
  ``clusterfile.json`` (kind, memory in GiB, and the server link and network as MiB per
  millisecond, the unit in which Metis's transfer terms come out in milliseconds);
- the model arguments: Metis takes a stage boundary's activation as
  ``sequence_length * hidden_size`` values per sample, so it gets ``sequence_length`` 1
  and ``hidden_size`` = the largest bytes per sample crossing a boundary of the graph.

**Metis's plans** (:func:`parse_metis_lines`, :func:`translate`): its ranked list gives per
plan the device-kind order, the device-group size of each stage, each stage's
``(dp, tp)``, the number of microbatches and the layer partition.  Rank ``i`` is the
``i``-th device when the kinds are taken in Metis's order; a stage of ``dp * tp`` devices
becomes ``dp`` replicas of ``tp`` devices, each inside one server (pipeplan's rule,
docs/model.md 8.2); the plan runs ``1f1b`` with ``zero`` 0 and no recomputation (Metis
models neither).  A plan that pipeplan cannot express (a stage without layers, a partition
that leaves layers out, a replica that would span servers) is reported with the reason,
and a plan whose memory exceeds a device in pipeplan's model is scored and flagged.

**pipeplan** plans the same instance with ``--solver`` (group-search by default),
``--tensor-parallel per-stage`` and ``--zero auto``, and again with ``--zero 0`` (Metis has
no ZeRO), ``1f1b``, once for each of 8, 16 and 32 microbatches (those that divide the batch;
Metis chooses the count among the batch's divisors), keeping the fastest plan that fits.

The table shows Metis's first plan as it prints it; *Metis's choice*, its best-ranked plan
whose estimate covers all its stages (its log shows that the estimate of some plans leaves
the last stage out, :func:`parse_metis_lines`); and the fastest, by pipeplan's simulator,
of its first ``--top`` such plans.  The ratios are Metis's iteration time over pipeplan's,
both from pipeplan's simulator, so they are judged in pipeplan's cost model; Metis's own
estimates are in the JSON.

Usage::

    python -m pipeplan.experiments.metis_compare --metis /path/to/Metis
        [--instances gpt-1b,gpt-7b,llama-70b,llama-70b-32] [--solver group-search] [--time-limit 60] [--metis-timeout 600] [--keep DIR [--reuse]] [--json OUT.json]
        [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from pipeplan.experiments.tp_70b import STATE_FACTOR, _layer, llama70b_graph, runs_text, tutorial_cluster
from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, Device
from pipeplan.solver.formats.cluster_spec import build_cluster, parse_server_group
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.planning import plan

METIS_KINDS = ("A100", "V100", "P100", "T4")
"""The device names Metis's ``DeviceType`` enum accepts; each device kind of a cluster is given one of them."""

METIS_SCRIPT = "cost_het_cluster.py"
"""Metis's heterogeneous-cluster search, run as a program."""

MIB = 1024.0 * 1024.0

FB_SYNC_MS = 1e-3
"""Milliseconds of ``forward_backward_time_ms`` beyond the layers' sum: pipeplan has no such term, but Metis
rejects a profile whose difference is zero (it reads 0 as a missing key)."""


# --------------------------------------------------------------------------- instances
def gpt_graph(name: str, blocks: int, hidden: int, heads: int, vocab: int, seq: int) -> LayerGraph:
    """A GPT-style transformer (MLP ``4h``, two matrices) costed as :func:`~pipeplan.experiments.tp_70b.llama70b_graph`.

    Same rates, kernel overhead and Megatron split as the 70B graph: a block splits its
    matrix products, all its weight matrices and 24 of its ``34 s h`` saved bytes per sample,
    and all-reduces ``s h`` bf16 values twice in each direction.
    """
    h, s = hidden, seq
    matrices = 4 * h * h + 2 * h * 4 * h
    block_flops = 2 * matrices * s + 2 * s * s * h
    block = _layer("block", block_flops, block_flops, 10 * s * h * 2 * 2, matrices + 4 * h, matrices,
                   34 * s * h, 24 * s * h, 2 * s * h, (2 * 2 * s * h, 2 * 2 * s * h), 20)
    embed = _layer("embed", 0.0, 0.0, 2 * s * h * 2, vocab * h, vocab * h, 8 * s, 0.0, 2 * s * h, (2 * s * h, 0.0), 2)
    logits = 4 * s * vocab
    head = _layer("head", 2 * vocab * h * s, 2 * vocab * h * s, 2 * s * h * 2, vocab * h + h, vocab * h,
                  2 * s * h + logits, logits, 4, (3 * 4 * s, 2 * s * h), 6)
    layers = [embed] + [Layer(f"block.{i}", block.fwd, block.bwd, block.params, block.act, block.out,
                              step=block.step, tp_share=block.tp_share, tp_comm=block.tp_comm)
                        for i in range(blocks)] + [head]
    return LayerGraph(name, layers, input_bytes=8 * s)


@dataclass(frozen=True)
class Instance:
    """One row of the comparison."""

    name: str
    """Short name (``--instances``)."""
    graph: LayerGraph
    """The model."""
    cluster: Cluster
    """The devices."""
    batch: int
    """Global batch (samples per iteration); a power of two, as Metis's search needs."""


def instances() -> dict[str, Instance]:
    """The instances, by name: two GPT-like models on two device kinds, and the 70B-class model of tp_70b.

    The 70B model runs on the tutorial's 48 devices (2 servers of 8 A100-80GB, 4 of 8
    V100-32GB), where Metis's search cannot start (48 is not a power of two), and on 32 of
    them (2 servers of each kind).
    """
    gpt1b = gpt_graph("gpt-1.3b-s2048", 24, 2048, 16, 50257, 2048)
    gpt7b = gpt_graph("gpt-6.7b-s2048", 32, 4096, 32, 50257, 2048)
    small = build_cluster([parse_server_group("1x8:a100-40g:nvlink3"), parse_server_group("1x8:v100-16g:pcie3")],
                          "ib-hdr")
    medium = build_cluster([parse_server_group("2x8:a100-80g:nvlink3"), parse_server_group("2x8:v100-32g:pcie3")],
                           "ib-hdr")
    half = build_cluster([parse_server_group("2x8:a100-80g:nvlink3"), parse_server_group("2x8:v100-32g:pcie3")],
                         "ib-hdr")
    return {"gpt-1b": Instance("gpt-1b", gpt1b, small, 32),
            "gpt-7b": Instance("gpt-7b", gpt7b, medium, 64),
            "llama-70b": Instance("llama-70b", llama70b_graph(), tutorial_cluster(), 64),
            "llama-70b-32": Instance("llama-70b-32", llama70b_graph(), half, 64)}


# --------------------------------------------------------------------------- Metis's inputs
def device_kind(device: Device) -> str:
    """The device's kind: the catalog id a built cluster records, else its speed and memory."""
    return str(device.extra.get("kind") or f"speed{device.speed:g}-mem{device.memory:g}")


def metis_names(cluster: Cluster) -> dict[str, str]:
    """A Metis device name for each device kind of ``cluster``, in the order the kinds first appear.

    A kind whose catalog id starts with a Metis name gets that name; the others get the
    names left, in :data:`METIS_KINDS` order (Metis uses the name only as a label).

    Raises
    ------
    InputError
        With more kinds than Metis has names.

    Examples
    --------
    >>> c = build_cluster([parse_server_group("1x2:a100-80g"), parse_server_group("1x2:h100-sxm")], "ib-hdr")
    >>> metis_names(c)
    {'a100-80g': 'A100', 'h100-sxm': 'V100'}
    """
    kinds = list(dict.fromkeys(device_kind(d) for d in cluster.devices))
    if len(kinds) > len(METIS_KINDS):
        raise InputError(cluster.name, "devices", f"{len(kinds)} device kinds, but Metis knows {len(METIS_KINDS)} "
                                                  f"({', '.join(METIS_KINDS)}); use at most {len(METIS_KINDS)}")
    names: dict[str, str] = {}
    for kind in kinds:
        match = next((n for n in METIS_KINDS if kind.upper().startswith(n) and n not in names.values()), None)
        if match is not None:
            names[kind] = match
    free = [n for n in METIS_KINDS if n not in names.values()]
    for kind in kinds:
        if kind not in names:
            names[kind] = free.pop(0)
    return {k: names[k] for k in kinds}


def servers_of(cluster: Cluster) -> dict[str, list[Device]]:
    """Each server's devices, in the cluster's order."""
    found: dict[str, list[Device]] = {}
    for d in cluster.devices:
        found.setdefault(d.server, []).append(d)
    return found


def collective(t: int, nbytes: float, lat: float, bw: float, calls: int) -> float:
    """``calls`` ring all-reduces among ``t`` devices moving ``nbytes`` in all (docs/model.md 8.3)."""
    return 2 * (t - 1) * (calls * lat + nbytes / (t * bw)) if t > 1 and nbytes > 0 else 0.0


def layer_profile(graph: LayerGraph, speed: float, lat: float, bw: float, t: int, b: int,
                  state_factor: float) -> tuple[list[float], list[float]]:
    """Per layer, milliseconds of forward plus backward and MiB held by one device of a degree-``t`` replica.

    ``b`` samples per replica on devices of ``speed`` whose server link has latency ``lat``
    and bandwidth ``bw``: the terms pipeplan's simulator charges (docs/model.md 8.3, 8.4).
    """
    times, memory = [], []
    for i in range(len(graph.layers)):
        tp = graph.tensor_parallel_sums(i, i + 1, t)
        compute = (tp.af + tp.bf * b + tp.ab + tp.bb * b) / speed
        comm = collective(t, b * tp.fwd_bytes, lat, bw, tp.fwd_calls) + \
            collective(t, b * tp.bwd_bytes, lat, bw, tp.bwd_calls)
        times.append(1000.0 * (compute + comm))
        memory.append((state_factor * tp.params + b * tp.act) / MIB)
    return times, memory


def powers_of_two(top: int) -> list[int]:
    """``1, 2, 4, ...`` up to ``top``."""
    return [2 ** i for i in range(int(math.log2(top)) + 1)] if top >= 1 else []


@dataclass(frozen=True)
class MetisInputs:
    """What :func:`write_metis_inputs` wrote, and the arguments Metis needs with it."""

    directory: str
    """Holds ``hostfile``, ``clusterfile.json`` and ``profile/``."""
    names: dict[str, str]
    """Metis's name of each device kind."""
    max_tp: int
    """The largest degree profiled (``--max_profiled_tp_degree``)."""
    max_bs: int
    """The largest microbatch size profiled (``--max_profiled_batch_size``)."""
    hidden: int
    """Bytes per sample at a stage boundary, passed as ``--hidden_size`` with ``--sequence_length 1``."""
    num_layers: int
    """Layers of the graph."""
    files: list[str] = field(default_factory=list)
    """The profile files written."""

    def arguments(self, batch: int, variance: int, permute: int) -> list[str]:
        """Metis's command-line arguments for ``cost_het_cluster.py``."""
        d = self.directory
        return ["--model_name", "GPT", "--model_size", "pipeplan", "--num_layers", str(self.num_layers),
                "--gbs", str(batch), "--hidden_size", str(self.hidden), "--sequence_length", "1",
                "--vocab_size", str(self.hidden), "--attention_head_size", "1",
                "--hostfile_path", os.path.join(d, "hostfile"),
                "--clusterfile_path", os.path.join(d, "clusterfile.json"),
                "--profile_data_path", os.path.join(d, "profile"), "--max_profiled_tp_degree", str(self.max_tp),
                "--max_profiled_batch_size", str(self.max_bs), "--min_group_scale_variance", str(variance),
                "--max_permute_len", str(permute), "--log_path", os.path.join(d, "logs"), "--home_dir", d]


def write_metis_inputs(graph: LayerGraph, cluster: Cluster, directory: str, *, batch: int, max_tp: int = 8,
                       state_factor: float = STATE_FACTOR) -> MetisInputs:
    """Write Metis's profiles, hostfile and cluster file for ``graph`` on ``cluster`` under ``directory``.

    Parameters
    ----------
    graph, cluster
        The instance, as pipeplan sees it.
    directory : str
        Where to write (created if missing).
    batch : int
        The global batch: microbatch sizes ``1, 2, 4, ...`` up to it are profiled.
    max_tp : int
        The largest tensor-parallel degree to profile (at most the smallest server).
    state_factor : float
        Bytes of training state per byte of parameters (no ZeRO).

    Returns
    -------
    MetisInputs

    Raises
    ------
    InputError
        If Metis cannot read the cluster: more than four kinds, a server of ten or more
        devices (its hostfile reader takes one digit), servers of different sizes (it
        numbers ranks as if all had the first one's), or a batch that is not a power of two.
    """
    names = metis_names(cluster)
    servers = servers_of(cluster)
    sizes = {len(ds) for ds in servers.values()}
    if max(sizes) > 9:
        raise InputError(cluster.name, "servers", f"a server has {max(sizes)} devices, but Metis's hostfile reader "
                                                  "takes one digit (at most 9 devices per server)")
    if len(sizes) > 1:
        raise InputError(cluster.name, "servers", f"servers of {sorted(sizes)} devices, but Metis numbers ranks as if "
                                                  "every server had as many devices as the first; use equal servers")
    if batch < 1 or batch & (batch - 1):
        raise InputError("-", "--batch", f"{batch} is not a power of two, which Metis's microbatch sizes need")
    per_server = sizes.pop()
    max_tp = min(max_tp, per_server)
    profile_dir = Path(directory) / "profile"
    profile_dir.mkdir(parents=True, exist_ok=True)
    cut = max((layer.out for layer in graph.layers[:-1]), default=graph.input_bytes)
    reference_step = sum(layer.step_time for layer in graph.layers)
    inputs = MetisInputs(str(directory), names, max(powers_of_two(max_tp)), batch, int(math.ceil(cut)),
                         len(graph.layers))
    for kind, metis in names.items():
        server_id, devices = next((s, ds) for s, ds in servers.items() if device_kind(ds[0]) == kind)
        link = next(s for s in cluster.servers if s.id == server_id)
        speed = min(d.speed for d in cluster.devices if device_kind(d) == kind)
        for t in powers_of_two(max_tp):
            for b in powers_of_two(batch):
                times, memory = layer_profile(graph, speed, link.latency, link.bandwidth, t, b, state_factor)
                name = f"DeviceType.{metis}_tp{t}_bs{b}.json"
                atomic_write_text(profile_dir / name, json.dumps(_profile(graph, times, memory, reference_step)))
                inputs.files.append(name)
    hostfile, clusterfile = [], {}
    by_kind = sorted(servers.items(), key=lambda kv: list(names).index(device_kind(kv[1][0])))
    for i, (server_id, devices) in enumerate(by_kind):
        ip = f"10.0.{i // 250}.{i % 250 + 1}"
        hostfile.append(f"{ip} slots={len(devices)}")
        link = next(s for s in cluster.servers if s.id == server_id)
        clusterfile[ip] = {"instance_type": names[device_kind(devices[0])],
                           "inter_bandwidth": cluster.network.bandwidth / 1000.0 / MIB,
                           "intra_bandwidth": link.bandwidth / 1000.0 / MIB,
                           "memory": min(d.memory for d in devices) / 1024.0 / MIB, "pipeplan_server": server_id}
    atomic_write_text(Path(directory) / "hostfile", "\n".join(hostfile) + "\n")
    atomic_write_text(Path(directory) / "clusterfile.json", json.dumps(clusterfile, indent=1))
    (Path(directory) / "logs").mkdir(exist_ok=True)
    return inputs


def _profile(graph: LayerGraph, times: list[float], memory: list[float], step: float) -> dict[str, Any]:
    """One profile file in the layout Metis's README gives."""
    params = [layer.params for layer in graph.layers]
    total = sum(times)
    return {"model": {"model_name": graph.name, "num_layers": len(graph.layers),
                      "parameters": {"total_parameters_bytes": sum(params), "parameters_per_layer_bytes": params,
                                     "activation_parameters_bytes": [layer.out for layer in graph.layers]}},
            "execution_time": {"total_time_ms": total + FB_SYNC_MS + 1000.0 * step,
                               "forward_backward_time_ms": total + FB_SYNC_MS, "batch_generator_time_ms": 0.0,
                               "layernorm_grads_all_reduce_time_ms": 0.0, "embedding_grads_all_reduce_time_ms": 0.0,
                               "optimizer_time_ms": 1000.0 * step / 2, "layer_compute_total_ms": times},
            "execution_memory": {"total_memory_mb": sum(memory), "layer_memory_total_mb": memory}}


# --------------------------------------------------------------------------- Metis's plans
@dataclass(frozen=True)
class MetisPlan:
    """One line of Metis's ranked output."""

    rank: int
    """Its place in Metis's list (1: the plan Metis estimates fastest)."""
    cost: float
    """Metis's own estimate of the iteration (milliseconds, from the profiles)."""
    kinds: tuple[str, ...]
    """The Metis device names in the order ranks are numbered."""
    groups: tuple[int, ...]
    """Devices of each stage."""
    strategies: tuple[tuple[int, int], ...]
    """``(dp, tp)`` of each stage."""
    microbatches: int
    """Microbatches per iteration (Metis's ``batches``)."""
    partition: tuple[int, ...]
    """Layer boundaries: stage ``s`` holds layers ``partition[s] <= i < partition[s+1]``."""
    costed_stages: int | None = None
    """How many of its stages Metis's estimate covers, where its log says fewer than all (else ``None``)."""

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the plan in Metis's log."""
        return self.kinds, self.groups, self.strategies, self.microbatches, self.partition


_LINE = re.compile(r"^(\d+), (\S+), \((.*?)\), \[([\d, ]*)\], \[(.*?)\], (\d+), \[([\d, ]*)\]\s*$")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


_COSTED = re.compile(r"^node_sequence: \((.*?)\), device_group: \[([\d, ]*)\], num_stage: (\d+), batches: (\d+), "
                     r"gbs: \d+, strategies: \[(.*?)\], layer_partition: \[([\d, ]*)\]")


def _short_key(m: re.Match[str]) -> tuple[Any, ...]:
    strategies = tuple((int(a), int(b)) for a, b in re.findall(r"\((\d+), (\d+)\)", m.group(5)))
    return (tuple(re.findall(r"DeviceType\.(\w+)", m.group(1))), _ints(m.group(2)), strategies, int(m.group(4)),
            _ints(m.group(6)))


def parse_metis_lines(lines: Iterable[str]) -> list[MetisPlan]:
    """The ranked plans Metis prints after its ``rank, cost, node_sequence, ...`` header, best first.

    Its log before the header says, for each plan it estimates, how many stages the
    estimate covers: Metis's cost estimator sums over ``range(plan.num_stage)``, and for
    every device-kind order after the first its plan generator moves to two stages
    without raising ``num_stage`` (``InterStagePlanGenerator._find_next_node_sequence``
    drops the value ``_find_next_stage_device_groups`` returns), so the first two-stage
    plans of that order are estimated from their first stage alone.  Such a plan says so
    in :attr:`MetisPlan.costed_stages`.  The lines are read one at a time (Metis's log of
    a 32-device search runs to hundreds of megabytes).
    """
    short: dict[tuple[Any, ...], int] = {}
    found: list[MetisPlan] = []
    ranked = False
    for line in lines:
        if not ranked:
            if line.startswith("node_sequence: "):
                m = _COSTED.match(line)
                if m is not None and int(m.group(3)) < len(_ints(m.group(2))):
                    short[_short_key(m)] = int(m.group(3))
            elif line.startswith("rank, cost, node_sequence"):
                ranked = True
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        strategies = tuple((int(a), int(b)) for a, b in re.findall(r"\((\d+), (\d+)\)", m.group(5)))
        plan_ = MetisPlan(int(m.group(1)), float(m.group(2)), tuple(re.findall(r"DeviceType\.(\w+)", m.group(3))),
                          _ints(m.group(4)), strategies, int(m.group(6)), _ints(m.group(7)))
        found.append(replace(plan_, costed_stages=short[plan_.key]) if plan_.key in short else plan_)
    return found


def parse_metis_output(text: str) -> list[MetisPlan]:
    """:func:`parse_metis_lines` of a whole text.

    Examples
    --------
    >>> out = ("rank, cost, node_sequence, device_groups, strategies(dp_deg, tp_deg), batches(number of batch), "
    ...        "layer_partition\\n1, 12.5, (<DeviceType.A100: 'a100'>,), [2, 2], [(1, 2), (2, 1)], 4, [0, 3, 6]\\n")
    >>> parse_metis_output(out)[0].strategies
    ((1, 2), (2, 1))
    """
    return parse_metis_lines(text.splitlines())


class Untranslatable(ValueError):
    """A Metis plan that pipeplan's plan format cannot express; the message says why."""


def rank_devices(cluster: Cluster, names: dict[str, str], kinds: tuple[str, ...]) -> list[Device]:
    """Metis's ranks as pipeplan devices: the kinds in Metis's order, each kind's devices in the cluster's order."""
    by_name = {v: k for k, v in names.items()}
    order: list[Device] = []
    for name in kinds:
        if name not in by_name:
            raise Untranslatable(f"device kind {name} is not in the cluster")
        order.extend(d for d in cluster.devices if device_kind(d) == by_name[name])
    return order


def translate(record: MetisPlan, graph: LayerGraph, cluster: Cluster, names: dict[str, str], *, batch: int,
              state_factor: float = STATE_FACTOR, schedule: str = "1f1b") -> Plan:
    """The pipeplan plan (version 3) of one Metis plan.

    Stages are Metis's layer partition on its device groups; a stage of ``dp * tp``
    devices is ``dp`` replicas of ``tp`` devices, each taken from one server (the stage's
    devices server by server, in rank order); ``zero`` 0, no recomputation, ``batch``
    cut into Metis's number of equal microbatches.

    Raises
    ------
    Untranslatable
        If pipeplan cannot express the plan; the message says why.
    """
    n_layers, S = len(graph.layers), len(record.groups)
    p = record.partition
    if len(record.strategies) != S or len(p) != S + 1:
        raise Untranslatable(f"{S} device groups, {len(record.strategies)} strategies and {len(p) - 1} partition "
                             "ranges do not match")
    if p[0] != 0 or p[-1] != n_layers:
        raise Untranslatable(f"its layer partition {list(p)} covers layers {p[0]} to {p[-1] - 1} of 0 to "
                             f"{n_layers - 1}")
    empty = [s for s in range(S) if p[s + 1] <= p[s]]
    if empty:
        raise Untranslatable(f"stage {empty[0]} of {S} has no layers (partition {list(p)}); "
                             f"{len(empty)} stage(s) empty")
    if batch % record.microbatches:
        raise Untranslatable(f"{record.microbatches} microbatches do not divide the batch {batch}")
    ranks = rank_devices(cluster, names, record.kinds)
    if sum(record.groups) > len(ranks):
        raise Untranslatable(f"its groups use {sum(record.groups)} devices of {len(ranks)}")
    size = batch // record.microbatches
    stages, offset = [], 0
    for s, (count, (dp, tp)) in enumerate(zip(record.groups, record.strategies)):
        devices = ranks[offset:offset + count]
        offset += count
        if dp * tp != count:
            raise Untranslatable(f"stage {s}: dp {dp} x tp {tp} is not its {count} devices")
        per_server = Counter(d.server for d in devices)
        split = next(((srv, n) for srv, n in per_server.items() if n % tp), None)
        if split is not None:
            raise Untranslatable(f"stage {s}: {split[1]} of its devices are on server {split[0]}, which cannot hold "
                                 f"whole replicas of tp {tp} (pipeplan keeps a replica inside one server)")
        ordered = [d.id for srv in per_server for d in devices if d.server == srv]
        stages.append(Stage((p[s], p[s + 1]), tuple(ordered), (size,) * record.microbatches, False,
                            tensor_parallel=tp))
    done = Plan(graph.name, cluster.name, batch, state_factor, schedule, tuple(stages),
                extra={"metis": {"rank": record.rank, "cost_ms": record.cost}})
    try:
        done.validate(graph, cluster)
    except InputError as exc:
        raise Untranslatable(f"pipeplan refuses it: {exc.where}: {exc.what}") from None
    return done


# --------------------------------------------------------------------------- running
def check_metis(path: str) -> Path:
    """The Metis directory ``path``, checked.

    Raises
    ------
    InputError
        If it is missing or holds no ``cost_het_cluster.py``.
    """
    where = Path(path)
    if not (where / METIS_SCRIPT).is_file():
        raise InputError(path, "--metis", f"no {METIS_SCRIPT} there; give the directory of a clone of "
                                          "https://github.com/SamsungLabs/Metis")
    return where


def run_metis(metis: Path, python: str, inputs: MetisInputs, *, batch: int, variance: int, permute: int,
              timeout: float) -> tuple[list[MetisPlan], float, str]:
    """Run Metis's search; its ranked plans, its wall time and a status (``ok``, ``timeout`` or the failure)."""
    found = shutil.which(python)
    if found is None:
        raise InputError(python, "--metis-python", "no such program; give the Python that runs Metis")
    log = Path(inputs.directory) / "metis.out"
    started = time.perf_counter()
    with open(log, "w") as out:
        try:
            # Metis orders device kinds by iterating a set of enum members: fix the hash seed so a run repeats
            env = dict(os.environ, PYTHONHASHSEED="0")
            command = [os.path.abspath(found), str(metis / METIS_SCRIPT), *inputs.arguments(batch, variance, permute)]
            done = subprocess.run(command, cwd=str(metis), stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=env)
        except subprocess.TimeoutExpired:
            return [], time.perf_counter() - started, f"timeout after {timeout:g} s"
    wall = time.perf_counter() - started
    with open(log, errors="replace") as lines:
        plans = parse_metis_lines(lines)
    if done.returncode != 0:
        with open(log, "rb") as raw:
            raw.seek(max(0, log.stat().st_size - 4096))
            tail = raw.read().decode(errors="replace").strip().splitlines()
        return plans, wall, f"exit {done.returncode}: {tail[-1][:200] if tail else ''}"
    return plans, wall, "ok"


def score(p: Plan, graph: LayerGraph, cluster: Cluster) -> dict[str, Any]:
    """pipeplan's simulator on a plan: time, memory, degrees."""
    sim = simulate(p, graph, cluster)
    over = [(g, c.peak_memory, c.capacity) for g, c in enumerate(sim.groups) if c.peak_memory > c.capacity]
    return {"iteration_time": sim.iteration_time, "fits": not over,
            "over_memory": [{"group": g, "peak": peak, "capacity": cap} for g, peak, cap in over],
            "max_memory_share": max(c.peak_memory / c.capacity for c in sim.groups),
            "stages": len(p.stages), "degrees": [st.tensor_parallel for st in p.stages],
            "replicas": [st.replicas for st in p.stages], "zero": [p.stage_zero(s) for s in range(len(p.stages))],
            "microbatches": len(p.stages[0].microbatches), "recompute": sum(st.recompute for st in p.stages),
            "devices": sum(len(st.devices) for st in p.stages)}


def metis_side(inst: Instance, metis: Path, python: str, *, top: int, variance: int, permute: int, max_tp: int,
               timeout: float, keep: str | None, reuse: bool = False) -> dict[str, Any]:
    """Write Metis's inputs, run it, translate and score its ``top`` best plans.

    With ``keep``, the inputs, Metis's log and ``run.json`` (its wall time and status) stay
    there; with ``reuse`` too, a log left there by an earlier run is read instead of running
    Metis again.
    """
    with tempfile.TemporaryDirectory(prefix=f"metis-{inst.name}-") as tmp:
        directory = keep or tmp
        inputs = write_metis_inputs(inst.graph, inst.cluster, directory, batch=inst.batch, max_tp=max_tp)
        record = Path(directory) / "run.json"
        if keep and reuse and record.is_file():
            earlier = json.loads(record.read_text())
            wall, status = float(earlier["wall_time"]), str(earlier["status"])
            with open(Path(directory) / "metis.out", errors="replace") as lines:
                plans = parse_metis_lines(lines)
        else:
            plans, wall, status = run_metis(metis, python, inputs, batch=inst.batch, variance=variance,
                                            permute=permute, timeout=timeout)
            atomic_write_text(record, json.dumps({"wall_time": wall, "status": status}))
    devices = len(inst.cluster.devices)
    if status != "ok" and devices & (devices - 1):
        status += (f" (Metis's search starts from a one-stage plan on one device group of a power-of-two size; "
                   f"{devices} devices are not one)")
    full = [p for p in plans if p.costed_stages is None]
    out: dict[str, Any] = {"status": status, "wall_time": wall, "plans_found": len(plans), "max_tp": inputs.max_tp,
                           "names": inputs.names, "short_costed": len(plans) - len(full), "scored": []}
    chosen = sorted({id(p): p for p in plans[:1] + full[:top]}.values(), key=lambda p: p.rank)
    for record in chosen:
        row: dict[str, Any] = {"rank": record.rank, "metis_cost_ms": record.cost, "groups": list(record.groups),
                               "strategies": [list(x) for x in record.strategies], "kinds": list(record.kinds),
                               "microbatches": record.microbatches, "partition": list(record.partition),
                               "costed_stages": record.costed_stages}
        try:
            translated = translate(record, inst.graph, inst.cluster, inputs.names, batch=inst.batch)
        except Untranslatable as exc:
            row["untranslatable"] = str(exc)
        else:
            row.update(score(translated, inst.graph, inst.cluster))
            row["plan"] = translated.to_dict()
        out["scored"].append(row)
    return out


def pipeplan_side(inst: Instance, zero: str, *, solver: str, time_limit: float,
                  counts: tuple[int, ...]) -> dict[str, Any]:
    """pipeplan's best plan with per-stage tensor parallelism and ``zero``, over the microbatch ``counts``.

    One solve per count (``1f1b``); the fastest fitting plan wins, and the wall time is
    that of all the solves.
    """
    started = time.perf_counter()
    best: dict[str, Any] | None = None
    statuses = []
    for m in counts:
        done = plan(inst.graph, inst.cluster, batch=inst.batch, microbatches=m, solver=solver, schedule="1f1b",
                    state_factor=STATE_FACTOR, tensor_parallel="per-stage", zero=zero, time_limit=time_limit)
        statuses.append(f"m {m}: {done.record.status if done.record else 'no result'}")
        if done.plan is not None:
            scored = score(done.plan, inst.graph, inst.cluster)
            if scored["fits"] and (best is None or scored["iteration_time"] < best["iteration_time"]):
                best = dict(scored, plan=done.plan.to_dict(), status=done.record.status)
    out: dict[str, Any] = {"zero": zero, "solver": solver, "wall_time": time.perf_counter() - started,
                           "solves": statuses, "status": "; ".join(statuses)}
    if best is not None:
        out.update(best)
    return out


def microbatch_counts(batch: int, low: int = 8, high: int = 32) -> tuple[int, ...]:
    """The powers of two from ``low`` to ``high`` that divide ``batch`` (all of them at most ``batch``).

    >>> microbatch_counts(64)
    (8, 16, 32)
    """
    return tuple(m for m in powers_of_two(min(batch, high)) if m >= min(low, batch) and batch % m == 0)


# --------------------------------------------------------------------------- the table
def describe(row: dict[str, Any]) -> str:
    """A scored plan in a few words: time, stages, degrees, replicas, microbatches, memory."""
    if "untranslatable" in row:
        return f"not expressible: {row['untranslatable']}"
    if "iteration_time" not in row:
        return f"no plan ({row.get('status', '?')})"
    memory = "fits" if row["fits"] else \
        f"EXCEEDS memory ({100 * row['max_memory_share']:.0f}% of a device in pipeplan's model)"
    zero = f"; ZeRO {runs_text(row['zero'])}" if any(row["zero"]) else ""
    recompute = f"; recompute {row['recompute']} of {row['stages']}" if row["recompute"] else ""
    return (f"{row['iteration_time']:.3f} s: {row['stages']} stages, tp {runs_text(row['degrees'])}, "
            f"dp {runs_text(row['replicas'])}, m {row['microbatches']}{zero}{recompute}; {memory}")


def best_scored(metis: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest fitting plan among Metis's scored, fully estimated ones (by pipeplan's simulator)."""
    fitting = [r for r in metis["scored"] if r.get("fits") and r["costed_stages"] is None]
    return min(fitting, key=lambda r: r["iteration_time"]) if fitting else None


def metis_choice(metis: dict[str, Any]) -> dict[str, Any] | None:
    """Metis's best-ranked plan among those whose estimate covers every stage."""
    return next((r for r in metis["scored"] if r["costed_stages"] is None), None)


def _ratio(mine: dict[str, Any] | None, theirs: dict[str, Any]) -> str:
    if mine is None or "iteration_time" not in mine or "iteration_time" not in theirs:
        return "-"
    return f"{mine['iteration_time'] / theirs['iteration_time']:.2f}"


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of the comparison: times are pipeplan's simulator's, ratios Metis / pipeplan."""
    lines = ["| instance | Metis's plan 1 | Metis's first fully estimated plan (its choice) | best fitting of "
             "Metis's top plans | Metis wall (s) | pipeplan, ZeRO auto | pipeplan, ZeRO 0 | "
             "ratio: choice / pipeplan auto; / pipeplan 0 | ratio: best of top / pipeplan 0 | pipeplan wall (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m, auto, none = r["metis"], r["pipeplan"]["auto"], r["pipeplan"]["0"]
        first = m["scored"][0] if m["scored"] else {"status": m["status"]}
        if first.get("costed_stages") is not None:
            note = f" (estimated {first['metis_cost_ms'] / 1000:.3f} s from {first['costed_stages']} of " \
                   f"{len(first['groups'])} stages)"
        else:
            note = ""
        choice, best = metis_choice(m), best_scored(m)
        choice_text = "-" if choice is None else \
            f"plan {choice['rank']}, estimated {choice['metis_cost_ms'] / 1000:.3f} s: {describe(choice)}"
        best_text = "none fits" if best is None else f"plan {best['rank']}: {describe(best)}"
        count = sum(1 for x in m["scored"] if x["costed_stages"] is None)
        lines.append(f"| {r['instance']} ({r['devices']} devices, batch {r['batch']}) | {describe(first)}{note} | "
                     f"{choice_text} | {best_text} (of {count}; {m['plans_found']} ranked, {m['status']}) | "
                     f"{m['wall_time']:.1f} | {describe(auto)} | {describe(none)} | "
                     f"{_ratio(choice, auto)}; {_ratio(choice, none)} | {_ratio(best, none)} | "
                     f"{auto['wall_time']:.1f}; {none['wall_time']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metis", required=True, help="directory of a clone of SamsungLabs/Metis")
    ap.add_argument("--metis-python", default=sys.executable, help="Python that runs Metis (it needs numpy)")
    ap.add_argument("--instances", default=",".join(instances()), help="comma-separated names")
    ap.add_argument("--solver", default="group-search")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per pipeplan solve")
    ap.add_argument("--metis-timeout", type=float, default=600.0, help="seconds per Metis search")
    ap.add_argument("--max-tp", type=int, default=8, help="largest tensor-parallel degree Metis may choose")
    ap.add_argument("--top", type=int, default=10, help="Metis's best plans to translate and score")
    ap.add_argument("--variance", type=int, default=1, help="Metis's --min_group_scale_variance")
    ap.add_argument("--permute", type=int, default=4, help="Metis's --max_permute_len")
    ap.add_argument("--keep", metavar="DIR", help="keep Metis's inputs and output under DIR/<instance>")
    ap.add_argument("--reuse", action="store_true", help="with --keep: read the Metis logs an earlier run left there")
    ap.add_argument("--json", metavar="OUT.json", help="also write every result as JSON")
    ap.add_argument("--markdown", metavar="OUT.md", help="also write the table")
    args = ap.parse_args(argv)
    try:
        for flag in ("max_tp", "top", "variance", "permute"):
            if getattr(args, flag) < 1:
                raise InputError("-", f"--{flag.replace('_', '-')}", f"must be at least 1, got {getattr(args, flag)}")
        metis = check_metis(args.metis)
        known = instances()
        chosen = [n.strip() for n in args.instances.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in known]
        if unknown:
            raise InputError("-", "--instances", f"unknown {unknown[0]!r}; choose from {', '.join(known)}")
        results = []
        for name in chosen:
            inst = known[name]
            keep = os.path.join(args.keep, name) if args.keep else None
            m = metis_side(inst, metis, args.metis_python, top=args.top, variance=args.variance,
                           permute=args.permute, max_tp=args.max_tp, timeout=args.metis_timeout, keep=keep,
                           reuse=args.reuse)
            counts = microbatch_counts(inst.batch)
            sides = {z: pipeplan_side(inst, z, solver=args.solver, time_limit=args.time_limit, counts=counts)
                     for z in ("auto", "0")}
            results.append({"instance": name, "graph": inst.graph.name, "cluster": inst.cluster.name,
                            "devices": len(inst.cluster.devices), "batch": inst.batch, "metis": m, "pipeplan": sides})
            print(json.dumps({"instance": name, "metis": m["status"], "metis_wall": round(m["wall_time"], 1),
                              "pipeplan": {z: s.get("iteration_time") for z, s in sides.items()}}), flush=True)
    except InputError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    print(table(results))
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=1))
    if args.markdown:
        atomic_write_text(args.markdown, table(results) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
