"""Everything a run needs, loaded and cross-checked before any process starts.

A plan is run on a zoo model through its layer graph: the graph's layers must be
the model's units (same count, same names, same edges and ties), the plan must be
valid on the graph and the cluster, and its dependencies must not deadlock (the
simulator's prediction, computed here, proves that).  Any mismatch is an
:class:`~pipeplan.models.errors.InputError`, so the CLI refuses the run with one ``error:``
line and exit status 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph, load_graph
from pipeplan.models.model_options import ModelRequest
from pipeplan.models.zoo import ZooModel, model_names
from pipeplan.runtime.sharding import check_runnable
from pipeplan.runtime.training_data import build_run_model
from pipeplan.solver.formats.cluster import Cluster, load_cluster
from pipeplan.solver.formats.plan import Plan, load_plan
from pipeplan.solver.evaluation.simulator import Simulation, simulate


@dataclass(frozen=True)
class RunInputs:
    """The checked inputs of a run."""

    graph: LayerGraph
    """The profiled layer graph."""
    cluster: Cluster
    """The cluster the plan was made for."""
    plan: Plan
    """The plan, valid on both."""
    plan_file: str
    """Its path, for messages."""
    model_name: str
    """The zoo model."""
    seq_len: int | None
    """Tokens per sample for sequence models (the graph's profile), else ``None``."""
    dtype: torch.dtype
    """float64 with ``--verify``, else float32."""
    prediction: Simulation
    """The simulator's timeline of the plan on graph and cluster."""
    model: ZooModel
    """The model, built on the CPU with the run's dtype and seed."""
    request: ModelRequest
    """The model as named, with its options (workers and the reference build it again)."""


def load_inputs(graph_file: str, cluster_file: str, plan_file: str, model_name: str | ModelRequest,
                verify: bool, seed: int = 0) -> RunInputs:
    """Load and cross-check graph, cluster, plan and model.

    The model is built for real on the CPU: the zoo models a CPU box can train are
    small, and a ``meta`` build costs more (its initialisers load torch's compiler).

    Raises
    ------
    InputError
        On the first mismatch, naming the file and field.
    """
    graph = load_graph(graph_file)
    cluster = load_cluster(cluster_file)
    plan = load_plan(plan_file, graph, cluster)
    request = model_name if isinstance(model_name, ModelRequest) else ModelRequest(model_name)
    model_name = request.spec
    if request.is_zoo and model_name not in model_names():
        raise InputError("-", "--model", f"unknown model {model_name!r}; valid: {', '.join(model_names())}")
    seq_len = _profiled_seq_len(graph, model_name)
    dtype = torch.float64 if verify else torch.float32
    model = build_run_model(request, seq_len=seq_len, dtype=dtype, seed=seed)
    check_model_matches(model, graph, graph_file)
    prediction = simulate(plan, graph, cluster, file=plan_file, validate=False)
    prediction.check_finite(plan_file)  # a prediction of inf is no prediction (and no JSON)
    return RunInputs(graph, cluster, plan, plan_file, model_name, seq_len, dtype, prediction, model, request)


def _profiled_seq_len(graph: LayerGraph, model_name: str) -> int | None:
    profile = graph.extra.get("profile")
    if isinstance(profile, dict) and profile.get("model") == model_name:
        seq_len = (profile.get("config") or {}).get("seq_len")
        return seq_len if isinstance(seq_len, int) else None
    return None


def check_model_matches(model: ZooModel, graph: LayerGraph, graph_file: str) -> None:
    """The graph's layers must be the model's units: count, names, edges, ties.

    Raises
    ------
    InputError
        Naming the first layer that differs.
    """
    units = model.units
    if len(units) != len(graph.layers):
        raise InputError(graph_file, "layers", f"the graph has {len(graph.layers)} layers but model "
                                               f"{model.name!r} has {len(units)} units; run a graph profiled "
                                               f"from this model (pipeplan profile {model.name})")
    for i, (unit, layer) in enumerate(zip(units, graph.layers)):
        if unit.name != layer.name:
            raise InputError(graph_file, f"layers[{i}].name", f"layer {i} is {layer.name!r} but unit {i} of "
                                                              f"model {model.name!r} is {unit.name!r}")
        if unit.tied_to != layer.tied_to:
            raise InputError(graph_file, f"layers[{i}].tied_to", f"layer {i} is tied to {layer.tied_to} but "
                                                                 f"unit {unit.name!r} to {unit.tied_to}")
    want, have = set(model.edges()), set(graph.edges)
    if want != have:
        extra, missing = sorted(have - want), sorted(want - have)
        raise InputError(graph_file, "edges", f"the graph's edges differ from model {model.name!r}: "
                                              f"missing {missing or 'none'}, extra {extra or 'none'}")


def check_world(plan: Plan, world: int, plan_file: str) -> None:
    """The number of processes must be the number of devices the plan uses."""
    devices = len({d for st in plan.stages for d in st.devices})  # stages of one group share theirs
    if world != devices:
        raise InputError(plan_file, "stages", f"the plan uses {devices} devices but {world} processes run it; "
                                              f"start one process per device (ranks in plan order)")


def check_emulation(prediction: Simulation, timeout: float, plan_file: str, plan: Plan | None = None) -> None:
    """Refuse an ``--emulate`` run whose longest op would outlast ``--timeout``, or of a tensor-parallel ``plan``.

    Emulation makes each op take as long as the simulator says on the cluster's
    devices and links (the graph's seconds are this machine's); an op longer than
    ``--timeout`` would be taken for a hang halfway, and one of ``1e296`` seconds (a
    speed of ``1e-300``) would overflow the clock it sleeps on.

    Raises
    ------
    InputError
        Naming the longest op's seconds and the fix.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> from pipeplan.solver.formats.plan import Plan, Stage
    >>> graph = LayerGraph.chain("g", [Layer("l", (0.5, 0.0), (0.25, 0.0), 1.0, 1.0, 1.0)])
    >>> cluster = Cluster("c", (Link(1e9, 0.0, "s"),), Link(1e9, 0.0), (Device("d", "s", 1.0, 1e9),))
    >>> fast = simulate(Plan("g", "c", 1, 4.0, "gpipe", (Stage((0, 1), ("d",), (1,)),)), graph, cluster)
    >>> check_emulation(fast, 50.0, "p.json")
    >>> check_emulation(fast, 0.25, "p.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeplan.models.errors.InputError: p.json: --emulate: an emulated op would last 0.5 s, longer than --timeout 0.25 s ...
    """
    if plan is not None:
        check_runnable(plan, plan_file, emulate=True)
    spans = [end - start for starts, ends in zip(prediction.starts, prediction.ends) for start, end in zip(starts, ends)]
    spans += [tx.end - tx.start for tx in prediction.transfers] + [g.allreduce for g in prediction.groups]
    longest = max([0.0, *spans])
    if not longest < timeout:
        raise InputError(plan_file, "--emulate",
                         f"an emulated op would last {longest:.3g} s, longer than --timeout {timeout:g} s (the "
                         "slowest device or link of the cluster, against the graph's times on this machine), so "
                         "the run would be taken for a hang; raise --timeout, or run without --emulate")
