"""The plan: stages, their devices, microbatch splits, recompute and schedule
(``pipeplan.plan/1``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import MAX_EXACT_INT, Reader, check_integer, load_json
from pipeplan.solver.schedule import SCHEDULES, Op, check_ops, format_op, stage_ops

if TYPE_CHECKING:
    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.cluster import Cluster

PLAN_FORMAT = "pipeplan.plan/1"

_STAGE_FIELDS = frozenset({"layers", "devices", "microbatches", "recompute", "ops"})
_PLAN_FIELDS = frozenset({"format", "graph", "cluster", "global_batch", "state_factor", "schedule", "stages"})

MAX_SAMPLES = MAX_EXACT_INT
"""Largest global batch (and layer index): sample counts beyond it are not exact in floating point."""


@dataclass(frozen=True)
class Stage:
    """One pipeline stage."""

    layers: tuple[int, int]
    """Half-open layer range ``[lo, hi)``."""
    devices: tuple[str, ...]
    """Device ids of its replicas (data parallelism inside the stage)."""
    microbatches: tuple[int, ...]
    """The stage's own split of the global batch, in processing order."""
    recompute: bool = False
    """Keep only the stage input in the forward pass and recompute for the backward."""
    ops: tuple[str, ...] | None = None
    """The op list (``"F0"``, ``"B0"``, ...) of a ``custom`` schedule, else ``None``."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Unknown fields, preserved on save."""

    @property
    def replicas(self) -> int:
        """``r_s``: the number of devices."""
        return len(self.devices)

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        data.update(layers=list(self.layers), devices=list(self.devices),
                    microbatches=list(self.microbatches), recompute=self.recompute)
        if self.ops is not None:
            data["ops"] = list(self.ops)
        return data


@dataclass(frozen=True)
class Plan:
    """A complete plan for one training iteration.

    Examples
    --------
    >>> p = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 2), ("g0",), (2, 2)),))
    >>> p.op_lists()[0]
    [('F', 0), ('F', 1), ('B', 0), ('B', 1)]
    """

    graph: str
    """Name of the layer graph it was made for."""
    cluster: str
    """Name of the cluster it was made for."""
    global_batch: int
    """Samples per iteration."""
    state_factor: float
    """Bytes of training state per byte of parameters on each replica (4 for fp32 Adam)."""
    schedule: str
    """``"gpipe"``, ``"1f1b"`` or ``"custom"``."""
    stages: tuple[Stage, ...]
    """The stages in pipeline order."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Unknown top-level fields (a solver record, for one), preserved on save."""

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def op_lists(self) -> list[list[Op]]:
        """Every stage's op list, generated from the schedule or read from ``ops``."""
        s_count = len(self.stages)
        lists = []
        for s, st in enumerate(self.stages):
            custom = None
            if self.schedule == "custom":
                custom = check_ops(list(st.ops or []), len(st.microbatches), "-", f"stages[{s}].ops")
            lists.append(stage_ops(self.schedule, len(st.microbatches), s, s_count, custom))
        return lists

    @property
    def groups(self) -> list[tuple[str, ...]]:
        """The device groups in the order of the first stage using each (group 0 holds stage 0).

        In a version-1 plan every stage is a group of its own.
        """
        seen: dict[frozenset[str], tuple[str, ...]] = {}
        for st in self.stages:
            seen.setdefault(frozenset(st.devices), st.devices)
        return list(seen.values())

    def programs(self) -> list[list[str]]:
        """Every group's actions in order, as torch.distributed.pipelining writes them (``"0F3"``).

        Examples
        --------
        >>> p = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 1), ("a",), (1, 1)), Stage((1, 2), ("b",), (1, 1))))
        >>> p.programs()
        [['0F0', '0F1', '0B0', '0B1'], ['1F0', '1B0', '1F1', '1B1']]
        """
        keys = [frozenset(devices) for devices in self.groups]
        out: list[list[str]] = [[] for _ in keys]
        for s, (st, ops) in enumerate(zip(self.stages, self.op_lists())):
            out[keys.index(frozenset(st.devices))] += [f"{s}{format_op(op)}" for op in ops]
        return out

    def with_extra(self, **fields: Any) -> "Plan":
        """A copy with top-level extra fields added or replaced (e.g. ``solver=...``)."""
        return replace(self, extra={**self.extra, **fields})

    # ----------------------------------------------------------------- checking
    def validate(self, graph: "LayerGraph | None" = None, cluster: "Cluster | None" = None,
                 file: str = "-") -> None:
        """Check every rule of the spec; with a graph and a cluster, check against them too.

        Raises
        ------
        InputError
            Naming the first rule broken, where, and the numbers involved.
        """
        self._check_header(file)
        self._check_ranges(file, None if graph is None else len(graph))
        self._check_devices(file, cluster)
        for s, st in enumerate(self.stages):
            self._check_split(st, s, file)
            if self.schedule == "custom":
                check_ops(list(st.ops) if st.ops is not None else _missing_ops(file, s),
                          len(st.microbatches), file, f"stages[{s}].ops")
            elif st.ops is not None:
                self._check_named_ops(st, s, file)

    def _check_named_ops(self, st: Stage, s: int, file: str) -> None:
        """An op list on a gpipe/1f1b stage must be the one the schedule generates (it is not read)."""
        where = f"stages[{s}].ops"
        given = check_ops(list(st.ops or ()), len(st.microbatches), file, where)
        expected = stage_ops(self.schedule, len(st.microbatches), s, len(self.stages))
        if given != expected:
            shown = " ".join(format_op(op) for op in expected[:12]) + (" ..." if len(expected) > 12 else "")
            raise InputError(file, where, f"differs from this stage's {self.schedule} op list ({shown}), which "
                                          f"the schedule alone decides; another order needs \"schedule\": \"custom\"")

    def _check_header(self, file: str) -> None:
        if not 1 <= self.global_batch <= MAX_SAMPLES:
            raise InputError(file, "global_batch", f"must be 1 to 2**53 samples (counts beyond are not exact "
                                                   f"in floating point), got {self.global_batch}")
        if self.schedule not in SCHEDULES:
            raise InputError(file, "schedule", f"unknown schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if not self.stages:
            raise InputError(file, "stages", "a plan needs at least one stage")

    def _check_ranges(self, file: str, num_layers: int | None) -> None:
        expected_lo = 0
        for s, st in enumerate(self.stages):
            lo, hi = st.layers
            where = f"stages[{s}].layers"
            if hi <= lo:
                raise InputError(file, where, f"stage {s} is empty: [{lo}, {hi}) holds no layer (need lo < hi)")
            if lo > expected_lo:
                raise InputError(file, where, f"gap: layers {expected_lo}..{lo - 1} belong to no stage "
                                              f"(stage {s} starts at {lo}, the previous stage ends before {expected_lo})")
            if lo < expected_lo:
                raise InputError(file, where, f"overlap: layers {lo}..{expected_lo - 1} are in stage {s} "
                                              f"and in an earlier stage")
            expected_lo = hi
        if num_layers is not None and expected_lo != num_layers:
            where = f"stages[{len(self.stages) - 1}].layers"
            if expected_lo < num_layers:
                raise InputError(file, where, f"layers {expected_lo}..{num_layers - 1} belong to no stage "
                                              f"(the graph has {num_layers} layers)")
            raise InputError(file, where, f"ends at layer {expected_lo}, but the graph has only "
                                          f"{num_layers} layers (0..{num_layers - 1})")

    def _check_devices(self, file: str, cluster: "Cluster | None") -> None:
        used: dict[str, int] = {}
        for s, st in enumerate(self.stages):
            if not st.devices:
                raise InputError(file, f"stages[{s}].devices", "a stage needs at least one device")
            for j, dev in enumerate(st.devices):
                where = f"stages[{s}].devices[{j}]"
                if dev in used:
                    raise InputError(file, where, f"device {dev!r} is already used by stage {used[dev]}; "
                                                  f"a device belongs to at most one stage")
                if cluster is not None and dev not in cluster.device_index:
                    names = ", ".join(d.id for d in cluster.devices)
                    raise InputError(file, where, f"unknown device {dev!r}; cluster {cluster.name!r} has {names}")
                used[dev] = s

    def _check_split(self, st: Stage, s: int, file: str) -> None:
        where = f"stages[{s}].microbatches"
        if not st.microbatches:
            raise InputError(file, where, "a stage needs at least one microbatch")
        for k, n in enumerate(st.microbatches):
            if n < 1:
                raise InputError(file, f"{where}[{k}]", f"microbatch sizes must be positive, got {n}")
        total = sum(st.microbatches)
        if total != self.global_batch:
            raise InputError(file, where, f"sizes sum to {total}, but global_batch is {self.global_batch}")

    # ----------------------------------------------------------------- JSON
    @classmethod
    def from_dict(cls, data: Any, file: str = "-") -> "Plan":
        """Read a ``pipeplan.plan/1`` object and check its self-contained rules.

        Rules that need the graph or the cluster (coverage of every layer, known
        devices) are checked by :meth:`validate` with them.
        """
        top = Reader(data, file, "")
        top.format(PLAN_FORMAT)
        schedule = top.string("schedule")
        if schedule not in SCHEDULES:
            raise top.fail("schedule", f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        stages = tuple(_read_stage(item, file, f"stages[{i}]", schedule == "custom")
                       for i, item in enumerate(top.array("stages", nonempty=True)))
        batch = top.integer("global_batch", minimum=1, maximum=MAX_SAMPLES)
        plan = cls(top.string("graph"), top.string("cluster"), batch, top.number("state_factor"), schedule, stages,
                   top.extras(_PLAN_FIELDS))
        plan.validate(file=file)
        return plan

    def to_dict(self) -> dict[str, Any]:
        """The ``pipeplan.plan/1`` object (unknown fields kept)."""
        data = dict(self.extra)
        data.update({"format": PLAN_FORMAT, "graph": self.graph, "cluster": self.cluster,
                     "global_batch": self.global_batch, "state_factor": self.state_factor,
                     "schedule": self.schedule, "stages": [st.to_dict() for st in self.stages]})
        return data


def _missing_ops(file: str, s: int) -> list[str]:
    raise InputError(file, f"stages[{s}].ops", "a custom schedule needs an op list on every stage")


def _read_stage(item: Any, file: str, where: str, custom: bool) -> Stage:
    r = Reader(item, file, where)
    bounds = r.array("layers")
    if len(bounds) != 2:
        raise r.fail("layers", f"expected [lo, hi], got {len(bounds)} numbers")
    lo = check_integer(bounds[0], file, f"{where}.layers[0]", minimum=0, maximum=MAX_SAMPLES)
    hi = check_integer(bounds[1], file, f"{where}.layers[1]", minimum=0, maximum=MAX_SAMPLES)
    devices = r.array("devices", nonempty=True)
    for j, dev in enumerate(devices):
        if not isinstance(dev, str):
            raise InputError(file, f"{where}.devices[{j}]", f"expected a device id string, got {dev!r}")
    sizes = r.array("microbatches", nonempty=True)
    split = tuple(check_integer(n, file, f"{where}.microbatches[{k}]", maximum=MAX_SAMPLES)
                  for k, n in enumerate(sizes))
    ops = None
    if r.has("ops") and r.raw("ops") is not None:
        ops_raw = r.array("ops")
        for i, op in enumerate(ops_raw):
            if not isinstance(op, str):
                raise InputError(file, f"{where}.ops[{i}]", f"expected an op string such as \"F0\", got {op!r}")
        ops = tuple(ops_raw)
    elif custom:
        raise r.fail("ops", "a custom schedule needs an op list on every stage")
    return Stage((lo, hi), tuple(devices), split, r.boolean("recompute"), ops, r.extras(_STAGE_FIELDS))


def load_plan(path: str, graph: "LayerGraph | None" = None, cluster: "Cluster | None" = None) -> Plan:
    """Load a ``pipeplan.plan/1`` file and validate it (against a graph and cluster if given).

    Raises
    ------
    InputError
        On any broken rule: see :meth:`Plan.validate`.
    """
    plan = Plan.from_dict(load_json(path), str(path))
    if graph is not None or cluster is not None:
        plan.validate(graph, cluster, str(path))
    return plan


def equal_split(batch: int, m: int) -> tuple[int, ...]:
    """``batch`` samples in ``m`` microbatches as equal as integers allow, larger first.

    Examples
    --------
    >>> equal_split(10, 4)
    (3, 3, 2, 2)
    """
    if not 1 <= m <= batch:
        raise ValueError(f"cannot split {batch} samples into {m} positive microbatches")
    q, rem = divmod(batch, m)
    return tuple(q + 1 if k < rem else q for k in range(m))

