"""Measured next to simulated: a claim's plans trained by the runtime on this machine.

Where a claim can be measured here (2 to 4 CPU processes, small zoo models), its
plans run through the runtime as ``pipeplan run`` runs them: the inputs checked by
:func:`pipeplan.runtime.checks.load_inputs`, one worker per device started and watched
by :func:`pipeplan.runtime.launch.launch_local`, the result summarised by
:func:`pipeplan.runtime.report.summarize`.  A plan's measured iteration time is the
median over the steps after warm-up (up to the gradient sums, without the optimizer
step), its simulated one the spec's prediction of the same span for the same plan,
graph and cluster.  Each plan runs ``repeats`` times, round-robin with the claim's
other plans, so that a slow spell of this shared machine falls on all of them, and
the median of those runs is kept.

The graph is profiled on this machine just before the runs (:func:`profiled`), so the
simulator and the runtime see the same machine.  The cluster is made of CPU "devices"
on loopback (:func:`cpu_cluster`); with ``emulate`` each device's compute is stretched
to its speed and each transfer delayed to its link (``pipeplan run --emulate``), which
is how a heterogeneous cluster, or more ranks than cores, is measured here.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipeplan.experiments.claims.common import Section, mapping
from pipeplan.models.graph import LayerGraph
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.models.profile_measured import MeasureConfig, profile_measured
from pipeplan.runtime.checks import RunInputs, check_emulation, load_inputs
from pipeplan.runtime.launch import WorkerError, launch_local
from pipeplan.runtime.report import summarize, without_step
from pipeplan.runtime.routing import rank_of
from pipeplan.models.model_options import ModelRequest
from pipeplan.runtime.options import RunConfig
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan

LOOPBACK = Link(3.0e9, 6.0e-5)
"""The loopback link of ``examples/cpu-pair.cluster.json`` (bandwidth B/s, latency s)."""
PROFILE_SIZES = (1, 2, 4, 8, 16, 32)
"""Microbatch sizes the graph is profiled at (the runs' microbatches lie in this range)."""


@dataclass(frozen=True)
class RunSettings:
    """How long each measured run lasts and how often it repeats."""

    steps: int
    """Training steps per run."""
    warmup: int
    """First steps left out of each run's median."""
    repeats: int
    """Runs per plan (round-robin over the plans); the median run is kept."""
    timeout: float = 50.0
    """Seconds without progress before a worker counts as hung (``pipeplan run --timeout``)."""

    def describe(self, sec: Section) -> str:
        """``"10 steps (3 warm-up), median of 3 runs per plan"``, its numbers recorded by ``sec``."""
        return (f"{sec.num(self.steps, 0)} steps ({sec.num(self.warmup, 0)} warm-up), median of "
                f"{sec.num(self.repeats, 0)} run{'s' if self.repeats != 1 else ''} per plan")


QUICK_RUNS = RunSettings(steps=4, warmup=2, repeats=1)
"""``--quick``: one short run per plan."""
FULL_RUNS = RunSettings(steps=10, warmup=3, repeats=3)
"""The full run."""


@dataclass
class Measured:
    """One plan, simulated and measured."""

    processes: int
    """Worker processes (one per device of the plan)."""
    simulated: float
    """Predicted seconds of an iteration up to the gradient sums (what the runs time)."""
    simulated_peak: float
    """Predicted peak memory of the busiest device group, bytes."""
    runs: list[float] = field(default_factory=list)
    """Each run's median iteration time after warm-up, seconds."""
    peaks: list[float] = field(default_factory=list)
    """Each run's largest rank peak memory, bytes (tracked tensor bytes on CPU)."""
    errors: list[str] = field(default_factory=list)
    """One line per run that failed (a worker died or hung)."""

    @property
    def measured(self) -> float | None:
        """The median over the runs, ``None`` when every run failed."""
        return statistics.median(self.runs) if self.runs else None

    @property
    def peak(self) -> float | None:
        """The largest measured peak memory over the runs, bytes."""
        return max(self.peaks) if self.peaks else None

    def to_json(self) -> dict:
        return {"processes": self.processes, "simulated": self.simulated, "measured": self.measured,
                "runs": self.runs, "simulated_peak": self.simulated_peak, "peak": self.peak,
                "peaks": self.peaks, "errors": self.errors}


def cpu_cluster(name: str, speeds: Sequence[float], servers: Sequence[tuple[str, Link]] = (),
                network: Link = LOOPBACK, memory: float = 4e9) -> Cluster:
    """CPU "devices" of the given speeds on loopback servers.

    Parameters
    ----------
    name : str
        The cluster's name.
    speeds : sequence of float
        One speed per device, relative to this machine's core (below 1 only takes
        effect with ``--emulate``).
    servers : sequence of (str, Link)
        Server id and its link, devices dealt out in order, as many per server as
        ``len(speeds) // len(servers)``; none: one server on :data:`LOOPBACK`.
    network : Link
        The link between servers.
    memory : float
        Bytes per device.

    Returns
    -------
    Cluster
        Devices ``c0``, ``c1``, ... in order.

    Examples
    --------
    >>> c = cpu_cluster("pair", [1.0, 1.0])
    >>> [(d.id, d.server) for d in c.devices]
    [('c0', 'local'), ('c1', 'local')]
    """
    servers = tuple(servers) or (("local", LOOPBACK),)
    per = max(1, len(speeds) // len(servers))
    links = tuple(Link(link.bandwidth, link.latency, sid) for sid, link in servers)
    devices = tuple(Device(f"c{i}", servers[min(i // per, len(servers) - 1)][0], v, memory)
                    for i, v in enumerate(speeds))
    return Cluster(name, links, Link(network.bandwidth, network.latency), devices)


def profiled(model: str, sizes: Sequence[int] = PROFILE_SIZES) -> LayerGraph:
    """``model`` profiled on this machine now (microbatches ``sizes``, three rounds, no cache).

    A cached profile may date from hours before, when this shared machine ran at
    another speed; measured afresh, the profile and the runs see the same machine.
    """
    return profile_measured(model, config=MeasureConfig(tuple(sizes), warmup=2, repeats=3, rounds=3),
                            use_cache=False)


def measure_plans(plans: dict[str, Plan], graph: LayerGraph, cluster: Cluster, model: str,
                  runs: RunSettings, emulate: bool = False) -> dict[str, Measured]:
    """Run every plan ``runs.repeats`` times with the runtime, round-robin, and set it beside its prediction.

    Parameters
    ----------
    plans : dict of str to Plan
        Named plans, valid on ``graph`` and ``cluster``.
    graph : LayerGraph
        Profiled from ``model`` (its layers are the model's units).
    cluster : Cluster
        The cluster the plans were made for.
    model : str
        The zoo model to train.
    runs : RunSettings
        Steps, warm-up, repeats and the hang timeout.
    emulate : bool
        ``pipeplan run --emulate``: stretch compute to each device's speed, delay transfers to the links.

    Returns
    -------
    dict of str to Measured
        By plan name.  A run whose worker fails or hangs is recorded in ``errors``, not raised.

    Raises
    ------
    InputError
        If a plan cannot run (the model does not match the graph, an emulated op
        would outlast the timeout): refused before any process starts.
    """
    with tempfile.TemporaryDirectory(prefix="pipeplan-reproduce-") as tmp:
        folder = Path(tmp)
        graph_file, cluster_file = folder / "graph.json", folder / "cluster.json"
        atomic_write_text(graph_file, dumps(graph.to_dict()))
        atomic_write_text(cluster_file, dumps(cluster.to_dict()))
        prepared, out = {}, {}
        for i, (name, plan) in enumerate(plans.items()):
            plan_file = folder / f"plan{i}.json"
            atomic_write_text(plan_file, dumps(plan.to_dict()))
            config = _run_config(graph_file, cluster_file, plan_file, model, runs, emulate)
            inputs = load_inputs(config.graph, config.cluster, config.plan, model, False, config.seed)
            if emulate:
                check_emulation(inputs.prediction, config.timeout, config.plan)
            prepared[name] = (config, inputs)
            out[name] = Measured(len(rank_of(plan)), *_prediction(inputs))
        for _ in range(runs.repeats):
            for name, (config, inputs) in prepared.items():
                _run_once(config, inputs, folder, out[name])
    return out


def _prediction(inputs: RunInputs) -> tuple[float, float]:
    """``(seconds up to the gradient sums, peak bytes of the busiest group)`` the simulator predicts."""
    return without_step(inputs.prediction), float(max(inputs.prediction.peak_memory))


def _run_config(graph_file: Path, cluster_file: Path, plan_file: Path, model: str, runs: RunSettings,
                emulate: bool) -> RunConfig:
    """The settings of ``pipeplan run GRAPH CLUSTER PLAN --model MODEL ...``, checked as it checks them."""
    return RunConfig(str(graph_file), str(cluster_file), str(plan_file), ModelRequest(model), steps=runs.steps,
                     warmup=runs.warmup, timeout=runs.timeout, emulate=emulate).checked()


def _run_once(config: RunConfig, inputs: RunInputs, folder: Path, into: Measured) -> None:
    """One run of ``config``'s plan; its median and peak appended to ``into`` (or its error)."""
    result_file = folder / "result.json"
    result_file.unlink(missing_ok=True)
    world = len(rank_of(inputs.plan))
    try:
        launch_local(config.worker_argv(result_file), world, folder, timeout=config.timeout,
                     describe=lambda rank: f"rank {rank} of {world}")
    except WorkerError as exc:
        into.errors.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return
    summary = summarize(inputs, json.loads(result_file.read_text()))
    into.runs.append(summary["measured_iteration_time"])
    into.peaks.append(float(max(summary["peak_memory"])))


TABLE_HEADER = ["plan", "mapping", "split", "processes", "simulated (ms)", "measured (ms)", "measured / simulated",
                "runs kept", "run spread"]
"""Columns of :func:`table_rows`."""


def table_rows(sec: Section, plans: dict[str, Plan], measured: dict[str, Measured], runs: RunSettings
               ) -> list[list[str]]:
    """One row per plan: its mapping and split, simulated and measured times, runs that finished.

    ``split``: stage 0's microbatch sizes; ``run spread``: the slowest kept run over the
    fastest, less one.  Every number goes through :meth:`Section.num`.
    """
    rows = []
    for name, m in measured.items():
        plan = plans[name]
        split = "+".join(sec.num(b, 0) for b in plan.stages[0].microbatches)
        ms = None if m.measured is None else 1e3 * m.measured
        rows.append([name, mapping(plan), split, sec.num(m.processes, 0), sec.num(1e3 * m.simulated, 3),
                     sec.num(ms, 3), sec.num(None if m.measured is None else m.measured / m.simulated, 2, "×"),
                     f"{sec.num(len(m.runs), 0)} of {sec.num(runs.repeats, 0)}",
                     sec.num(100 * (max(m.runs) / min(m.runs) - 1) if m.runs else None, 1, "%")])
    return rows


def ratios(measured: dict[str, Measured], slow: str, fast: str) -> tuple[float | None, float | None]:
    """``(simulated, measured)`` iteration time of plan ``slow`` over that of plan ``fast``.

    Examples
    --------
    >>> m = {"a": Measured(2, 0.3, 0.0, runs=[0.6]), "b": Measured(2, 0.2, 0.0, runs=[0.5])}
    >>> ratios(m, "a", "b")
    (1.4999999999999998, 1.2)
    """
    a, b = measured.get(slow), measured.get(fast)
    if a is None or b is None:
        return None, None
    sim = a.simulated / b.simulated if b.simulated > 0 else None
    meas = a.measured / b.measured if a.measured is not None and b.measured else None
    return sim, meas


def record(sec: Section, key: str, plans: dict[str, Plan], measured: dict[str, Measured], runs: RunSettings,
           conditions: str) -> None:
    """Store the runs under ``sec.data[key]``, add their detail table (captioned with ``conditions``) and say how they ran."""
    sec.data[key] = {"conditions": conditions, "runs": vars(runs),
                     "plans": {n: {"mapping": mapping(plans[n]), **m.to_json()} for n, m in measured.items()}}
    sec.tables.append((f"Measured by the runtime: {conditions}", TABLE_HEADER, table_rows(sec, plans, measured, runs)))
    sec.measured_method = (
        "Rows and tables marked *measured*: the plans ran through the runtime as `pipeplan run` runs them (one "
        "worker process per device, on loopback), on a graph profiled on this machine just before.  A run's time "
        "is its median iteration after warm-up, up to the gradient sums, like the simulated time beside it; each "
        "plan ran round-robin with the others and its median run is kept (*run spread*: the slowest run over the "
        "fastest).  With --emulate each device's compute is stretched to its speed and each transfer delayed to "
        "its link.  On this shared machine measured times exceed the simulated ones by what a profile taken in "
        "isolation does not see (other processes' load, per-op dispatch, the loss, message posting): compare the "
        "ratios between plans, and read two plans' measured difference as noise when it is within their spread.")
