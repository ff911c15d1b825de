"""The planning problem: one frozen object that every solver takes."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import MAX_SAMPLES, Plan, Stage, equal_split
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.schedules.schedule import SCHEDULE_CLASSES, Schedule
from pipeplan.solver.evaluation.simulator import Simulation, simulate


PLANNED_SCHEDULES = tuple(NEEDS)
"""Every schedule a solver can be asked to plan for (``custom`` programs are not planned)."""

VIRTUAL_SCHEDULES = tuple(name for name, needs in NEEDS.items() if needs.stages_per_group is None)
"""Schedules whose stages per group ``v`` is a choice (``virtual_stages``)."""

PIPELINES, SPLITS, VIRTUAL = "pipelines", "splits", "virtual stages"
SPACES = (PIPELINES, SPLITS, VIRTUAL)
"""The search spaces a problem may lie in (:attr:`PlanningProblem.space`), each planned by its own
algorithms (:mod:`pipeplan.solver.solvers`): ``pipelines`` (one stage per device group, ``M``
equal microbatches), ``splits`` (one stage per group, microbatch sizes chosen: ``auto`` or
``per_stage``) and ``virtual stages`` (device groups holding several stages: the interleaved,
looped and zero-bubble schedules, ``M`` equal microbatches)."""

TENSOR_PARALLEL_MODES = ("1", "uniform", "per-stage")
"""``tensor_parallel`` choices: none, one chosen degree for every stage, a chosen degree per device group."""

ZERO_CHOICES = ("0", "1", "2", "auto")
"""``zero`` choices: a ZeRO level for every stage, or ``auto`` (chosen per stage)."""

MAX_DEVICES = 4096
"""Most devices a planning problem may have: the largest clusters the solvers are measured
to hold their time limits on (``experiments/bench_scale.py``, ``tests/test_scale.py``)."""

MAX_LAYERS = 256
"""Most layers a planning problem may have (``cpsat`` with a 2 s limit on 1,000 layers ran 4.4 s)."""

MAX_MICROBATCHES = 256
"""Most microbatches (``--microbatches``, and ``--max-microbatches`` with auto): the split
searches and timelines grow with the count (``cpsat-split`` with a 2 s limit and
``K = 1000`` ran 36 s)."""


def tensor_degrees(cluster: Cluster, most: int) -> list[int]:
    """The degrees ``t <= most`` that divide the device count of at least one server, smallest first.

    A replica's ``t`` devices sit in one server (docs/model.md 8.2); a degree that divides a
    server's count tiles it with replicas, as Megatron-LM and torchtitan place them.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> tensor_degrees(load_cluster("examples/tp.cluster.json"), 8)
    [1, 2, 4]
    """
    sizes = _server_sizes(cluster)
    found = {t for n in sizes for t in range(1, min(n, most) + 1) if n % t == 0}
    return sorted(found)


def _server_sizes(cluster: Cluster) -> list[int]:
    """The device count of each server that holds devices."""
    counts: dict[str, int] = {}
    for d in cluster.devices:
        counts[d.server] = counts.get(d.server, 0) + 1
    return list(counts.values())


def probe_counts(top: int) -> list[int]:
    """Microbatch counts from ``top`` down to 1 that are worth an equal-split solve.

    Every count up to 8; above it the ladder 12, 16, 24, 32, 48, ... (``2**j``
    and ``3 * 2**j``, steps of 1.33x to 1.5x) and ``top`` itself, so that a large ``K``
    costs about ``2 log2 K`` solves instead of ``K``.

    Examples
    --------
    >>> probe_counts(5)
    [5, 4, 3, 2, 1]
    >>> probe_counts(40)
    [40, 32, 24, 16, 12, 8, 7, 6, 5, 4, 3, 2, 1]
    """
    if top < 1:
        raise ValueError(f"need a count of at least 1, got {top}")
    counts = {top, *range(1, min(top, 8) + 1)}
    step = 8
    while step <= top:
        counts.update(c for c in (step, 3 * step // 2) if c <= top)
        step *= 2
    return sorted(counts, reverse=True)


def probe_order(counts: list[int]) -> list[int]:
    """The order to try ``counts`` in: the largest, then powers of two downward, then the rest downward.

    Coarse steps first, so that when time runs out before every count is tried the
    ones tried still span the range.

    Examples
    --------
    >>> probe_order([8, 7, 6, 5, 4, 3, 2, 1])
    [8, 4, 2, 1, 7, 6, 5, 3]
    >>> probe_order([12, 8, 7, 6, 5, 4, 3, 2, 1])
    [12, 8, 4, 2, 1, 7, 6, 5, 3]
    """
    top, *rest = sorted(counts, reverse=True)
    return [top, *sorted(rest, key=lambda m: (m & (m - 1) != 0, -m))]


@dataclass(frozen=True)
class PlanningProblem:
    """What to plan: a graph on a cluster, a batch, a schedule and the search space.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 2), 4, 8, 16)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
    >>> p = PlanningProblem(g, c, global_batch=8, microbatches=4)
    >>> p.split
    (2, 2, 2, 2)
    """

    graph: LayerGraph
    """The model."""
    cluster: Cluster
    """The devices and links."""
    global_batch: int
    """Samples per iteration."""
    microbatches: int
    """``M``: the number of equal microbatches every stage uses."""
    schedule: str = "1f1b"
    """A named schedule of :data:`PLANNED_SCHEDULES`: ``"gpipe"``, ``"1f1b"`` (version 1) or a version-2
    one, ``"interleaved-1f1b"``, ``"interleaved-zb"``, ``"looped-bfs"``, ``"zbv"`` (spec 7.2)."""
    state_factor: float = 4.0
    """Bytes of training state per parameter byte (4 for fp32 Adam)."""
    allow_replication: bool = True
    """Whether a stage may have several devices (data parallelism)."""
    allow_recompute: bool = True
    """Whether a stage may recompute its activations."""
    max_stages: int | None = None
    """Largest number of stages, or ``None`` for as many as devices and layers allow."""
    auto_microbatches: bool = False
    """Split-aware solvers choose the number of microbatches (1 .. ``max_split_count``);
    ``microbatches`` then only sets the equal split the seeding baselines use."""
    max_microbatches: int | None = None
    """``K``: most microbatches a split-aware solver may use (default ``microbatches``)."""
    per_stage: bool = False
    """Split-aware solvers may give every stage its own split (unequal data partitions)."""
    virtual_stages: int | None = None
    """``v``, stages per device group, for ``interleaved-1f1b``, ``interleaved-zb`` and ``looped-bfs``;
    ``None`` (``auto``) tries every ``v`` that fits.  ``zbv`` has ``v = 2``; version 1 has ``v = 1``."""
    tensor_parallel: str = "1"
    """The stages' tensor-parallel degrees (docs/model.md 8.2): ``"1"`` (none), ``"uniform"`` (one degree
    ``t`` for every stage, chosen) or ``"per-stage"`` (each device group its own, chosen); see
    :mod:`pipeplan.solver.heuristics.tensor_search`."""
    max_tensor_parallel: int = 8
    """Largest degree ``t`` tried (a degree must also divide the device count of a server)."""
    zero: str = "0"
    """The ZeRO level: ``"0"``, ``"1"``, ``"2"`` (every stage) or ``"auto"`` (each stage the lowest level up to
    :attr:`max_zero` that makes the plan fastest and fit; docs/solvers.md)."""
    max_zero: int = 2
    """Highest ZeRO level ``auto`` may give a stage (1 for runtimes that take ZeRO-1 only, as DeepSpeed's
    pipeline engine)."""

    def __post_init__(self) -> None:
        if not 1 <= self.global_batch <= MAX_SAMPLES:
            raise ValueError(f"global_batch must be 1 to 2**53, got {self.global_batch}")
        if not 1 <= self.microbatches <= self.global_batch:
            raise ValueError(f"microbatches must be in 1..{self.global_batch} (the batch), got {self.microbatches}; "
                             f"each microbatch needs at least one sample")
        if self.schedule not in PLANNED_SCHEDULES:
            why = ("custom programs come from a plan file (simulate it); solvers plan the named schedules"
                   if self.schedule in SCHEDULE_CLASSES else "unknown schedule")
            raise ValueError(f"schedule must be one of {', '.join(PLANNED_SCHEDULES)}, got {self.schedule!r}: {why}")
        self._check_virtual()
        if not 0 <= self.state_factor < math.inf:
            raise ValueError(f"state_factor must be finite and >= 0 (bytes of state per parameter byte), "
                             f"got {self.state_factor}")
        if self.max_stages is not None and self.max_stages < 1:
            raise ValueError(f"max_stages must be positive, got {self.max_stages}")
        if self.max_microbatches is not None and not 1 <= self.max_microbatches:
            raise ValueError(f"max_microbatches must be positive, got {self.max_microbatches}")
        if self.max_microbatches is not None and self.max_microbatches < self.microbatches:
            raise ValueError(f"max_microbatches ({self.max_microbatches}) is below microbatches "
                             f"({self.microbatches}); the equal split must stay in the search space")

        self._check_tensor_parallel()
        check_size(self.graph, self.cluster, max(self.microbatches, self.max_microbatches or 0))
        what, why = overflow_cause(self.graph, self.cluster, self.global_batch, self.state_factor)
        if what:
            raise Overflow(what, why)

    def _check_virtual(self) -> None:
        """Refuse a ``virtual_stages`` the schedule does not take, and unequal splits for version 2."""
        v = self.virtual_stages
        if v is not None and v < 1:
            raise ValueError(f"virtual_stages must be positive, got {v}")
        fixed = self.needs.stages_per_group
        if v is not None and fixed is not None:
            if v != fixed:
                raise ValueError(f"{self.schedule} has {fixed} stage(s) per device group, got virtual_stages {v}; "
                                 f"--virtual-stages applies to {', '.join(VIRTUAL_SCHEDULES)}")
        if self.needs.several_stages and self.per_stage:
            raise ValueError(f"{self.schedule} splits every stage alike (spec 7.2: all stages share one "
                             f"microbatches list), so per-stage splits do not apply; drop --per-stage")

    def _check_tensor_parallel(self) -> None:
        """Refuse an unknown degree mode or ZeRO choice, and ZeRO on a state too small to split."""
        if self.tensor_parallel not in TENSOR_PARALLEL_MODES:
            raise ValueError(f"tensor_parallel must be one of {', '.join(TENSOR_PARALLEL_MODES)}, "
                             f"got {self.tensor_parallel!r}")
        if not 1 <= self.max_tensor_parallel <= MAX_DEVICES:
            raise ValueError(f"max_tensor_parallel must be 1 to {MAX_DEVICES} devices per replica, "
                             f"got {self.max_tensor_parallel}")
        if self.zero not in ZERO_CHOICES:
            raise ValueError(f"zero must be one of {', '.join(ZERO_CHOICES)}, got {self.zero!r}")
        if self.max_zero not in (1, 2):
            raise ValueError(f"max_zero must be 1 or 2 (the highest level auto may choose), got {self.max_zero}")
        if self.zero != "0" and self.state_factor < 2:
            raise ValueError(f"ZeRO shards the optimizer state, the state_factor - 2 bytes per parameter byte "
                             f"beyond the weights and gradients (docs/model.md 8.2), but state_factor is "
                             f"{self.state_factor:g}; give --state-factor 2 or more, or --zero 0")

    @property
    def tensor_search(self) -> bool:
        """Whether the degrees or ZeRO levels are decisions (:attr:`tensor_parallel` or :attr:`zero` not the
        default): solvers then plan through :func:`pipeplan.solver.heuristics.tensor_search.solve_tensor_parallel`."""
        return self.tensor_parallel != "1" or self.zero != "0"

    @property
    def needs(self) -> type[Schedule]:
        """The schedule's class, which says what it needs of a plan (:data:`pipeplan.solver.schedules.needs.NEEDS`):
        ``stages_per_group``, ``split_backward``, ``several_stages``, ``forwards_first``, ..."""
        return NEEDS[self.schedule]

    @property
    def space(self) -> str:
        """The search space the problem lies in (one of :data:`SPACES`): from the schedule's needs and the split.

        Examples
        --------
        >>> from pipeplan.models.graph import Layer, LayerGraph
        >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
        >>> g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 2), 4, 8, 16)] * 2)
        >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
        >>> [PlanningProblem(g, c, 8, 4, schedule=s, auto_microbatches=a).space
        ...  for s, a in (("1f1b", False), ("1f1b", True), ("zbv", False))]
        ['pipelines', 'splits', 'virtual stages']
        """
        if self.needs.several_stages:
            return VIRTUAL
        return SPLITS if self.free_sizes else PIPELINES

    def equal_split_problem(self) -> "PlanningProblem":
        """The same problem with the split fixed to ``microbatches`` equal microbatches."""
        return replace(self, auto_microbatches=False, per_stage=False)

    def equal_split_problems(self) -> list["PlanningProblem"]:
        """Equal-split problems whose plans seed a search over splits: :meth:`equal_split_problem` first.

        Without ``auto_microbatches``: that one alone.  With it, after it one problem per
        other count of :func:`probe_counts` over :attr:`split_counts`, in the order
        :func:`probe_order` gives (``K``, then its power-of-two fractions, then the rest;
        the CLI sets ``microbatches`` to ``K``, so ``K`` comes first).  The best equal
        split can use fewer microbatches than the most allowed (fewer, larger
        microbatches pay the per-op costs less often), and seeding from ``K`` alone
        missed it (``chain8`` on ``two-servers``, GPipe, ``K = 8``: every split-aware
        solver ended at 80.17 ms, while 4 equal microbatches give 80.05 ms and 2 give
        76.96 ms).
        """
        if not self.auto_microbatches:
            return [self.equal_split_problem()]
        own = self.equal_split_problem()
        return [own, *(replace(own, microbatches=m, max_microbatches=None)
                       for m in probe_order(probe_counts(max(self.split_counts))) if m != own.microbatches)]

    @cached_property
    def split(self) -> tuple[int, ...]:
        """The microbatch sizes every stage uses (computed once: solvers ask for it per stage and plan)."""
        return equal_split(self.global_batch, self.microbatches)

    @property
    def stage_limit(self) -> int:
        """Most stages a plan may have: bounded by layers, devices (one stage per group) and ``max_stages``."""
        # a group holding several stages: devices do not bound the stages
        limit = len(self.graph) if self.needs.several_stages else min(len(self.graph), len(self.cluster.devices))
        return limit if self.max_stages is None else min(limit, self.max_stages)

    def make_plan(self, bounds: Sequence[tuple[int, int]], devices: Sequence[Sequence[str]],
                  recompute: Sequence[bool] | None = None) -> Plan:
        """A plan with the given stage ranges, device groups and recompute flags."""
        flags = list(recompute) if recompute is not None else [False] * len(bounds)
        stages = tuple(Stage((lo, hi), tuple(devs), self.split, bool(rc))
                       for (lo, hi), devs, rc in zip(bounds, devices, flags))
        return Plan(self.graph.name, self.cluster.name, self.global_batch, self.state_factor,
                    self.schedule, stages)

    @property
    def split_counts(self) -> range:
        """Microbatch counts a split-aware solver may use (``nsga``, ``cpsat-split``, ...).

        ``1 .. K`` (``K`` = ``max_microbatches``, else ``microbatches``, at most the
        batch) with ``auto_microbatches``; otherwise exactly ``microbatches``.
        """
        top = min(self.global_batch, self.max_microbatches or self.microbatches)
        return range(1, top + 1) if self.auto_microbatches else range(self.microbatches, self.microbatches + 1)

    @property
    def free_sizes(self) -> bool:
        """Whether microbatch sizes are decisions (``auto_microbatches`` or ``per_stage``).

        Otherwise ``--microbatches M`` means ``M`` equal microbatches (:attr:`split`)
        for every solver, split-aware ones included.
        """
        return self.auto_microbatches or self.per_stage

    def in_split_space(self, plan: Plan) -> bool:
        """Whether ``plan`` is in the search space of the split-aware solvers.

        As :meth:`in_search_space`, but each stage may use any split into a count of
        :attr:`split_counts`, shared by all stages unless ``per_stage``.  The equal
        split of ``microbatches`` is always inside, so such a solver is never worse
        than the equal-split solvers on the same stages and devices.
        """
        if plan.schedule != self.schedule or len(plan.stages) > self.stage_limit:
            return False
        if not self.allow_replication and any(st.replicas > 1 for st in plan.stages):
            return False
        if not self.allow_recompute and any(st.recompute for st in plan.stages):
            return False
        if not self.free_sizes:
            return all(st.microbatches == self.split for st in plan.stages)
        counts = self.split_counts
        for st in plan.stages:
            if len(st.microbatches) not in counts or sum(st.microbatches) != self.global_batch:
                return False
            if min(st.microbatches) < 1:
                return False
        return self.per_stage or len({st.microbatches for st in plan.stages}) == 1

    def evaluate(self, plan: Plan) -> Simulation:
        """The simulator's verdict on ``plan`` (the one judge of every solver)."""
        return simulate(plan, self.graph, self.cluster)

    def in_search_space(self, plan: Plan) -> bool:
        """Whether ``plan`` respects this problem's switches."""
        if len(plan.stages) > self.stage_limit:
            return False
        if not self.allow_replication and any(st.replicas > 1 for st in plan.stages):
            return False
        if not self.allow_recompute and any(st.recompute for st in plan.stages):
            return False
        return all(st.microbatches == self.split for st in plan.stages) and plan.schedule == self.schedule


class Overflow(ValueError):
    """Times (``what == "time"`` or ``"graph-time"``) or bytes (``"memory"``) of some plan would overflow."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(why)
        self.what = what
        """``"time"`` (the cluster's speeds or links), ``"graph-time"`` (the graph's costs or bytes,
        overflowing even on speed-1 devices and 1 GB/s links) or ``"memory"`` (the graph's bytes)."""


class TooLarge(ValueError):
    """A problem larger than a solver can honour a time limit on; ``role`` is the input at fault."""

    def __init__(self, role: str, why: str) -> None:
        super().__init__(why)
        self.role = role
        """``"graph"``, ``"cluster"`` or ``"options"``."""


def check_size(graph: LayerGraph, cluster: Cluster, microbatches: int) -> None:
    """Refuse a problem beyond :data:`MAX_LAYERS`, :data:`MAX_DEVICES` or :data:`MAX_MICROBATCHES`.

    Raises
    ------
    TooLarge
        Naming the count, the limit and the fix.
    """
    if len(cluster.devices) > MAX_DEVICES:
        raise TooLarge("cluster", f"{len(cluster.devices)} devices, above the {MAX_DEVICES} a plan can be searched "
                                  f"for within a time limit; plan a part of the cluster (a few servers) and "
                                  f"replicate the plan")
    if len(graph) > MAX_LAYERS:
        raise TooLarge("graph", f"{len(graph)} layers, above the {MAX_LAYERS} a plan can be searched for within a "
                                f"time limit; profile coarser units (a block per layer)")
    if microbatches > MAX_MICROBATCHES:
        raise TooLarge("options", f"{microbatches} microbatches, above the {MAX_MICROBATCHES} a plan can be "
                                  f"searched for within a time limit; use fewer, larger microbatches")


def overflow_cause(graph: LayerGraph, cluster: Cluster, global_batch: int, state_factor: float) -> tuple[str, str]:
    """``(what, why)``: whether some plan's ``"time"`` or ``"memory"`` would overflow floating point.

    ``("", "")`` when neither can.  Every plan's iteration time is below the *ceiling*
    of running every op of every stage one after another on the slowest device (at most
    ``B`` microbatches a stage, each recomputed), every transfer on the slowest link,
    and every all-reduce of all the parameters; its memory below all the state plus
    every sample's bytes.  A ceiling that is finite keeps every simulated number finite,
    so no solver compares infinities and no report holds ``inf``.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer
    >>> from pipeplan.solver.formats.cluster import Device, Link
    >>> g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 2), 4, 8, 16)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 5e-324, 1e9),))
    >>> what, why = overflow_cause(g, c, 8, 4.0)
    >>> what, why[:55]
    ('time', 'durations overflow floating point: the slowest device r')
    """
    B, D = global_batch, len(cluster.devices)
    layers = graph.layers
    speed = min(d.speed for d in cluster.devices)
    links = (*cluster.servers, cluster.network)
    bandwidth, latency = min(l.bandwidth for l in links), max(l.latency for l in links)
    work = 2.0 * sum(B * (l.fwd[0] + l.bwd[0]) + B * (l.fwd[1] + l.bwd[1]) for l in layers)
    cut = graph.input_bytes + sum(l.out for l in layers)
    params = sum(l.params for l in layers)
    ceiling = (D * work / speed + 2.0 * B * D * (latency + B * cut / bandwidth)
               + 2.0 * D * (latency + params / bandwidth))
    if not math.isfinite(ceiling):
        nominal = D * work + 2.0 * B * D * B * cut / 1e9 + 2.0 * D * params / 1e9  # speed 1, 1 GB/s, no latency
        if not math.isfinite(nominal):
            return "graph-time", (f"durations overflow floating point even on speed-1 devices and 1 GB/s links: "
                                  f"the layers cost {work:g} s for the batch of {B} and move {cut:g} B per "
                                  f"sample; use realistic costs and sizes")
        return "time", (f"durations overflow floating point: the slowest device runs at speed {speed:g} and "
                        f"the slowest link carries {bandwidth:g} B/s, while the layers cost {work:g} s for the "
                        f"batch of {B} (before dividing by the speed); use realistic speeds, bandwidths and costs")
    memory = state_factor * params + B * (graph.input_bytes + sum(l.act + l.out for l in layers))
    if not math.isfinite(memory):
        return "memory", (f"bytes overflow floating point: {state_factor:g} x {params:g} B of state plus the "
                          f"activations of {B} samples; use realistic sizes")
    return "", ""
