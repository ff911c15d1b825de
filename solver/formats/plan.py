"""The plan: stages, their devices, microbatch splits, recompute and schedule
(``pipeplan.plan/1``, ``/2`` and ``/3``).

Version 2 (spec 7.2) lets several stages share one device group and names the
schedules that do so; a plan is written as ``/1`` whenever it uses none of that, so
version-1 readers keep reading what they always read (:attr:`Plan.format`).  Every
plan, of either version, is a set of device groups running programs of actions
(:meth:`Plan.actions`): the one thing the simulator and the runtime read.

Version 3 (docs/model.md section 8) adds a tensor-parallel degree per stage
(``tensor_parallel``: its devices are then replicas of ``t`` devices each, each replica
inside one server), a ZeRO level per plan or stage (``zero``) and the split of the
training state into weights, gradients and optimizer state (``state``).  A plan is
written as ``/3`` only when it uses one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import MAX_EXACT_INT, Reader, check_integer, load_json
from pipeplan.solver.schedules.schedule import (NAMED_V2, SCHEDULE_CLASSES, SCHEDULES, Action, Schedule,
                                                check_programs, check_stage_ops, format_action, schedule_for,
                                                stage_actions)

if TYPE_CHECKING:
    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster

PLAN_FORMAT = "pipeplan.plan/1"
PLAN_FORMAT_V2 = "pipeplan.plan/2"
PLAN_FORMAT_V3 = "pipeplan.plan/3"

_STAGE_FIELDS = frozenset({"layers", "devices", "microbatches", "recompute", "ops"})
_PLAN_FIELDS = frozenset({"format", "graph", "cluster", "global_batch", "state_factor", "schedule", "stages"})
_PLAN_FIELDS_V2 = _PLAN_FIELDS | {"programs"}
_PLAN_FIELDS_V3 = _PLAN_FIELDS_V2 | {"zero", "state"}
_STAGE_FIELDS_V3 = _STAGE_FIELDS | {"tensor_parallel", "zero"}

ZERO_LEVELS = (0, 1, 2)
"""ZeRO levels: 0 nothing sharded, 1 optimizer state, 2 optimizer state and gradients (docs/model.md 8.2)."""
STATE_PARTS = ("weights", "gradients", "optimizer")
"""The parts of the training state, in the order of :attr:`Plan.state`."""

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
    tensor_parallel: int = 1
    """``t``: devices per replica (version 3); ``devices`` lists ``r * t`` of them, replica by replica."""
    zero: int | None = None
    """This stage's ZeRO level (version 3), overriding the plan's; ``None``: the plan's."""

    @property
    def replicas(self) -> int:
        """``r_s``: the number of replicas, ``len(devices) / t`` (the number of devices when ``t = 1``)."""
        return len(self.devices) // self.tensor_parallel

    @property
    def replica_devices(self) -> tuple[tuple[str, ...], ...]:
        """The devices of each replica: ``devices[j*t : (j+1)*t]`` for replica ``j``.

        Examples
        --------
        >>> Stage((0, 1), ("a", "b", "c", "d"), (4,), tensor_parallel=2).replica_devices
        (('a', 'b'), ('c', 'd'))
        """
        t = self.tensor_parallel
        return tuple(self.devices[j:j + t] for j in range(0, len(self.devices), t))

    @property
    def uses_v3(self) -> bool:
        """Whether the stage carries a version-3 field."""
        return self.tensor_parallel != 1 or self.zero is not None

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        data.update(layers=list(self.layers), devices=list(self.devices),
                    microbatches=list(self.microbatches), recompute=self.recompute)
        if self.ops is not None:
            data["ops"] = list(self.ops)
        if self.tensor_parallel != 1:
            data["tensor_parallel"] = self.tensor_parallel
        if self.zero is not None:
            data["zero"] = self.zero
        return data


@dataclass(frozen=True)
class Plan:
    """A complete plan for one training iteration.

    Examples
    --------
    >>> p = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 2), ("g0",), (2, 2)),))
    >>> p.programs()[0]
    ['0F0', '0F1', '0B0', '0B1']
    >>> p.format
    'pipeplan.plan/1'
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
    """A name in :data:`~pipeplan.solver.schedules.schedule.SCHEDULES` (the version-2 ones need a ``/2`` plan)."""
    stages: tuple[Stage, ...]
    """The stages in pipeline order."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Unknown top-level fields (a solver record, for one), preserved on save."""
    custom_programs: tuple[tuple[str, ...], ...] | None = None
    """A ``custom`` version-2 plan's ``programs``: one action list (``"0F3"``) per group, else ``None``."""
    zero: int = 0
    """The ZeRO level of every stage that gives none (version 3): 0, 1 or 2."""
    state: tuple[float, float, float] | None = None
    """Bytes of ``(weights, gradients, optimizer state)`` per byte of parameters (version 3); ``None``: the default
    split of :attr:`state_split`."""

    def stage_zero(self, s: int) -> int:
        """The ZeRO level of stage ``s``: its own, else the plan's."""
        own = self.stages[s].zero
        return self.zero if own is None else own

    @property
    def state_split(self) -> tuple[float, float, float]:
        """``(w, g, o)``: :attr:`state`, or ``(1, 1, state_factor - 2)`` when the plan gives none."""
        return self.state if self.state is not None else (1.0, 1.0, self.state_factor - 2.0)

    @property
    def uses_v3(self) -> bool:
        """Whether the plan uses a version-3 field (a degree above 1, a ZeRO level, a state split)."""
        return self.zero != 0 or self.state is not None or any(st.uses_v3 for st in self.stages)

    def tensor_parallel_uses(self) -> list[str]:
        """In words, what of version 3 the plan uses (empty for a plan any earlier reader understands).

        Consumers that do not run tensor parallelism or ZeRO (the exports, the runtime, the
        solvers' warm start) refuse a plan for which this is not empty
        (:meth:`refuse_tensor_parallel`).
        """
        found = [f"stage {s} has tensor_parallel {st.tensor_parallel}" for s, st in enumerate(self.stages)
                 if st.tensor_parallel != 1]
        found += [f"stage {s} has zero {self.stage_zero(s)}" for s in range(len(self.stages)) if self.stage_zero(s)]
        return found

    def refuse_tensor_parallel(self, file: str, what: str) -> None:
        """Raise :class:`InputError` if the plan uses tensor parallelism or ZeRO, which ``what`` does not support.

        Raises
        ------
        InputError
            Naming the first stage that uses them.
        """
        found = self.tensor_parallel_uses()
        if found:
            raise InputError(file, "stages", f"{found[0]}, but {what} takes only tensor_parallel 1 and zero 0 "
                                             f"(docs/model.md section 8); give a plan without them")

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    # ----------------------------------------------------------------- groups and programs
    @property
    def groups(self) -> list[tuple[str, ...]]:
        """The device groups in the order of the first stage using each (group 0 holds stage 0).

        In a version-1 plan every stage is a group of its own.
        """
        seen: dict[frozenset[str], tuple[str, ...]] = {}
        for st in self.stages:
            seen.setdefault(frozenset(st.devices), st.devices)
        return list(seen.values())

    @property
    def stage_groups(self) -> list[int]:
        """The group of each stage, numbered as in :attr:`groups`.

        Examples
        --------
        >>> a, b = ("a",), ("b",)
        >>> Plan("g", "c", 1, 4.0, "looped-bfs", tuple(Stage((i, i + 1), d, (1,)) for i, d in
        ...      enumerate([a, b, a, b]))).stage_groups
        [0, 1, 0, 1]
        """
        index: dict[frozenset[str], int] = {}
        return [index.setdefault(frozenset(st.devices), len(index)) for st in self.stages]

    @property
    def virtual(self) -> int:
        """``v``: stages per group (1 when every group holds one stage), as the stage count implies."""
        return max(1, len(self.stages) // max(1, len(self.groups)))

    def _format_2_uses(self) -> list[str]:
        """What of version 2 the plan uses, in words: what makes it a ``pipeplan.plan/2`` file (empty: ``/1``).

        Examples
        --------
        >>> Plan("g", "c", 1, 4.0, "zbv", (Stage((0, 1), ("a",), (1,)), Stage((1, 2), ("a",), (1,))))._format_2_uses()
        ['schedule zbv', 'stages 0 and 1 share device group 0']
        """
        found = []
        named = SCHEDULE_CLASSES.get(self.schedule)  # None for an unknown name, which validate() reports
        if named is not None and named.format_version >= 2:
            found.append(f"schedule {self.schedule}")
        owner: dict[int, int] = {}
        for s, g in enumerate(self.stage_groups):
            if g in owner:
                found.append(f"stages {owner[g]} and {s} share device group {g}")
                break
            owner[g] = s
        if self.custom_programs is not None:
            found.append("programs")
        split = next((f"op {op} of stage {s}" for s, st in enumerate(self.stages)
                      for op in st.ops or () if isinstance(op, str) and op[:1] in ("I", "W")), None)
        if split is not None:
            found.append(split)
        return found

    @property
    def format(self) -> str:
        """The file format the plan is written in: ``/3`` when it uses anything of version 3, else ``/2`` when it
        uses anything of version 2, else ``pipeplan.plan/1``."""
        if self.uses_v3:
            return PLAN_FORMAT_V3
        return PLAN_FORMAT_V2 if self._format_2_uses() else PLAN_FORMAT

    @property
    def programs_by_stage(self) -> bool:
        """Whether the programs are the stages' own op lists: ``gpipe``, ``1f1b`` or custom per-stage ``ops``.

        Each group then holds one stage, and errors in its programs are reported where
        the plan writes them, at ``stages[s].ops[i]``.
        """
        return self.custom_programs is None and not _generates_group_programs(self.schedule)

    @property
    def schedule_class(self) -> type[Schedule]:
        """The class of the plan's schedule (:func:`~pipeplan.solver.schedules.schedule.schedule_for`).

        Raises
        ------
        ValueError
            For an unknown name (:meth:`validate` reports it at ``schedule``).
        """
        return schedule_for(self.schedule)

    def actions(self, file: str = "-") -> list[list[Action]]:
        """Every group's program as :class:`~pipeplan.solver.schedules.schedule.Action` s, generated or read.

        Raises
        ------
        InputError
            If the programs break a rule of spec 7.2 (see :meth:`validate`).
        """
        if self.custom_programs is not None:
            return check_programs([list(p) for p in self.custom_programs], self.stage_groups,
                                  [len(st.microbatches) for st in self.stages], file, "programs")
        named = self.schedule_class
        if named.several_stages and not named.from_plan:
            try:
                return named.programs(len(self.groups), len(self.stages[0].microbatches), self.virtual)
            except ValueError as exc:
                raise InputError(file, "stages[0].microbatches", str(exc)) from None
        count = len(self.stages)
        if named.from_plan:
            return [check_stage_ops(list(st.ops or ()), s, len(st.microbatches), file, f"stages[{s}].ops")
                    for s, st in enumerate(self.stages)]
        return [list(stage_actions(self.schedule, len(st.microbatches), s, count)) for s, st in enumerate(self.stages)]

    def programs(self) -> list[list[str]]:
        """Every group's actions in order, as torch.distributed.pipelining writes them (``"0F3"``).

        Examples
        --------
        >>> p = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 1), ("a",), (1, 1)), Stage((1, 2), ("b",), (1, 1))))
        >>> p.programs()
        [['0F0', '0F1', '0B0', '0B1'], ['1F0', '1B0', '1F1', '1B1']]
        """
        return [[format_action(a) for a in program] for program in self.actions()]

    def stage_actions(self) -> list[list[Action]]:
        """Every stage's actions, in the order its group runs them.

        Examples
        --------
        >>> a, b = ("a",), ("b",)
        >>> p = Plan("g", "c", 1, 4.0, "looped-bfs", tuple(Stage((i, i + 1), d, (1,)) for i, d in enumerate([a, b, a, b])))
        >>> [format_action(x) for x in p.stage_actions()[2]]
        ['2F0', '2B0']
        """
        lists: list[list[Action]] = [[] for _ in self.stages]
        for program in self.actions():
            for action in program:
                lists[action.stage].append(action)
        return lists

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
            Naming the first rule broken, where, and the numbers involved: among them
            (version 2) two stages whose device sets partly overlap, a stage on the
            wrong group for its named schedule, different ``microbatches`` lists under
            a named multi-stage schedule, ``m`` not a multiple of the rounds, and in
            custom programs an action on a group that does not hold its stage, a ``W``
            before its ``I``, a missing or repeated action.
        """
        self._check_header(file)
        self._check_ranges(file, None if graph is None else len(graph))
        self._check_devices(file, cluster)
        self._check_tensor_parallel(file, cluster)
        self._check_state(file)
        for s, st in enumerate(self.stages):
            self._check_split(st, s, file)
        named = self.schedule_class
        if self.custom_programs is not None and not named.from_plan:
            raise InputError(file, "programs", f"programs are read only under \"schedule\": \"custom\"; "
                                               f"{self.schedule} generates its own (remove \"programs\")")
        if named.one_stage_per_group:
            self._check_one_stage_per_group(file, f"under {self.schedule}")
        elif not named.from_plan:
            self._check_named_v2(file)
        elif self.custom_programs is None:
            self._check_one_stage_per_group(file, "in a custom plan without \"programs\"")
        if named.from_plan:
            self._check_custom(file)
        else:
            for s, st in enumerate(self.stages):
                if st.ops is not None:
                    self._check_named_ops(st, s, file)

    def _check_custom(self, file: str) -> None:
        if self.custom_programs is not None:
            given = next((s for s, st in enumerate(self.stages) if st.ops is not None), None)
            if given is not None:
                raise InputError(file, f"stages[{given}].ops", "a plan with \"programs\" takes no per-stage ops "
                                                               "(the programs say everything): remove one of them")
            self.actions(file)
            return
        for s, st in enumerate(self.stages):
            if st.ops is None:
                _missing_ops(file, s)
        self.actions(file)

    def _check_one_stage_per_group(self, file: str, context: str) -> None:
        first: dict[int, int] = {}
        for s, g in enumerate(self.stage_groups):
            if g in first:
                raise InputError(file, f"stages[{s}].devices", f"stage {s} runs on the devices of stage {first[g]} "
                                                               f"(group {g}), but {context} every group holds one "
                                                               f"stage; several stages on a group need one of "
                                                               f"{', '.join(NAMED_V2)} or custom programs")
            first[g] = s

    def _check_named_v2(self, file: str) -> None:
        """Stage count, groups and splits as the named schedule lays them out; then its programs."""
        groups, count = len(self.groups), len(self.stages)
        named = self.schedule_class
        fixed = named.stages_per_group
        expected = named.num_stages(groups, fixed or max(1, count // groups))
        if count != expected or (fixed is None and count % groups):
            shape = f"{fixed}R" if fixed is not None else "a multiple v*R of the group count R"
            raise InputError(file, "stages", f"{self.schedule} runs {shape} stages; this plan has {count} stages on "
                                             f"{groups} device groups")
        actual = self.stage_groups
        for s in range(count):
            want = named.stage_group(s, groups)
            if actual[s] != want:
                holder = next(t for t in range(count) if actual[t] == want)
                raise InputError(file, f"stages[{s}].devices",
                                 f"under {self.schedule} with {groups} groups stage {s} runs on group {want} "
                                 f"(the devices of stage {holder}: {', '.join(self.groups[want])}), but it is on "
                                 f"group {actual[s]} ({', '.join(self.groups[actual[s]])})")
        split = self.stages[0].microbatches
        for s, st in enumerate(self.stages):
            if st.microbatches != split:
                raise InputError(file, f"stages[{s}].microbatches",
                                 f"{_shown(st.microbatches)} differs from stage 0's {_shown(split)}; under "
                                 f"{self.schedule} every stage splits the batch alike (torch's chunks); "
                                 f"unequal splits per stage need a custom plan")
        self.actions(file)

    def _check_named_ops(self, st: Stage, s: int, file: str) -> None:
        """An op list on a gpipe/1f1b stage must be the one the schedule generates (it is not read)."""
        where = f"stages[{s}].ops"
        if self.schedule_class.several_stages:
            raise InputError(file, where, f"{self.schedule} generates every group's program, so per-stage ops are "
                                          f"not read; remove them, or use \"schedule\": \"custom\" with \"programs\"")
        given = check_stage_ops(list(st.ops or ()), s, len(st.microbatches), file, where)
        expected = list(stage_actions(self.schedule, len(st.microbatches), s, len(self.stages)))
        if given != expected:
            shown = " ".join(f"{a.kind}{a.microbatch}" for a in expected[:12]) + (" ..." if len(expected) > 12 else "")
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
        """Each stage's devices distinct and known; two stages' device sets equal (one group) or disjoint."""
        owner: dict[str, int] = {}  # device -> first stage using it
        for s, st in enumerate(self.stages):
            if not st.devices:
                raise InputError(file, f"stages[{s}].devices", "a stage needs at least one device")
            mine = set(st.devices)
            for j, dev in enumerate(st.devices):
                where = f"stages[{s}].devices[{j}]"
                if dev in st.devices[:j]:
                    raise InputError(file, where, f"device {dev!r} is already used by stage {s} (it appears "
                                                  f"twice in its list); list each replica once")
                if cluster is not None and dev not in cluster.device_index:
                    names = ", ".join(d.id for d in cluster.devices)
                    raise InputError(file, where, f"unknown device {dev!r}; cluster {cluster.name!r} has {names}")
                t = owner.get(dev)
                if t is not None and set(self.stages[t].devices) != mine:
                    theirs = set(self.stages[t].devices)
                    raise InputError(file, f"stages[{s}].devices",
                                     f"stage {s} ({', '.join(st.devices)}) and stage {t} "
                                     f"({', '.join(self.stages[t].devices)}) share {_names(mine & theirs)} but not "
                                     f"{_names(mine ^ theirs)}; two stages' devices must be equal as sets (one "
                                     f"device group) or disjoint")
                owner.setdefault(dev, s)

    def _check_tensor_parallel(self, file: str, cluster: "Cluster | None") -> None:
        """Each degree divides its stage's device count, each replica sits in one server, a group's stages agree."""
        first: dict[frozenset[str], int] = {}
        for s, st in enumerate(self.stages):
            t = st.tensor_parallel
            if t < 1:
                raise InputError(file, f"stages[{s}].tensor_parallel", f"must be an integer >= 1, got {t}")
            if len(st.devices) % t:
                raise InputError(file, f"stages[{s}].devices",
                                 f"stage {s} lists {len(st.devices)} devices, not a multiple of its tensor_parallel "
                                 f"{t}: its devices are replicas of {t} devices each; list r * {t} devices")
            if cluster is not None and t > 1:
                for j, replica in enumerate(st.replica_devices):
                    servers = sorted({cluster.device_index[d].server for d in replica})
                    if len(servers) > 1:
                        raise InputError(file, f"stages[{s}].devices",
                                         f"replica {j} of stage {s} ({', '.join(replica)}, devices {j * t} to "
                                         f"{j * t + t - 1} of its list) spans servers {', '.join(servers)}; the {t} "
                                         f"devices of a tensor-parallel replica must sit in one server")
            owner = first.setdefault(frozenset(st.devices), s)
            other = self.stages[owner]
            if owner != s and (other.tensor_parallel != t or
                               set(map(frozenset, other.replica_devices)) != set(map(frozenset, st.replica_devices))):
                raise InputError(file, f"stages[{s}].tensor_parallel",
                                 f"stage {s} shares its device group with stage {owner} but splits it differently "
                                 f"(tensor_parallel {t} with replicas {_replicas(st)}, against {other.tensor_parallel}"
                                 f" with {_replicas(other)}); stages of one group have the same replicas")
            own = st.zero
            if own is not None and own not in ZERO_LEVELS:
                raise InputError(file, f"stages[{s}].zero", f"must be 0, 1 or 2, got {own}")
        if self.zero not in ZERO_LEVELS:
            raise InputError(file, "zero", f"must be 0, 1 or 2, got {self.zero}")

    def _check_state(self, file: str) -> None:
        """``state``'s parts sum to ``state_factor``; the default split needs ``state_factor >= 2`` under ZeRO."""
        if self.state is not None:
            total = sum(self.state)
            if abs(total - self.state_factor) > 1e-9 * max(abs(self.state_factor), 1.0):
                parts = " + ".join(f"{x:g}" for x in self.state)
                raise InputError(file, "state", f"weights + gradients + optimizer = {parts} = {total:g}, but "
                                                f"state_factor is {self.state_factor:g}; state_factor is the whole "
                                                f"state of a replica, so the parts must sum to it")
        elif self.state_factor < 2 and any(self.stage_zero(s) for s in range(len(self.stages))):
            raise InputError(file, "state", f"a ZeRO level needs the state split into weights, gradients and "
                                            f"optimizer; without \"state\" it is 1 + 1 + (state_factor - 2), and "
                                            f"state_factor is {self.state_factor:g} < 2: give \"state\"")

    def _check_split(self, st: Stage, s: int, file: str) -> None:
        where = f"stages[{s}].microbatches"
        if not st.microbatches:
            raise InputError(file, where, "a stage needs at least one microbatch")
        if not min(st.microbatches) >= 1:  # one pass in C first: simulate validates every plan it is given
            for k, n in enumerate(st.microbatches):
                if n < 1:
                    raise InputError(file, f"{where}[{k}]", f"microbatch sizes must be positive, got {n}")
        total = sum(st.microbatches)
        if total != self.global_batch:
            raise InputError(file, where, f"sizes sum to {total}, but global_batch is {self.global_batch}")

    # ----------------------------------------------------------------- JSON
    @classmethod
    def from_dict(cls, data: Any, file: str = "-") -> "Plan":
        """Read a ``pipeplan.plan/1`` or ``/2`` object and check its self-contained rules.

        A ``/1`` plan may neither share devices between stages nor name a version-2
        schedule (its ``programs``, if any, is an unknown field, kept).  Rules that need
        the graph or the cluster (coverage of every layer, known devices) are checked
        by :meth:`validate` with them.
        """
        top = Reader(data, file, "")
        version = top.format(PLAN_FORMAT, PLAN_FORMAT_V2, PLAN_FORMAT_V3)
        version2, version3 = version != PLAN_FORMAT, version == PLAN_FORMAT_V3
        schedule = top.string("schedule")
        if schedule not in SCHEDULES:
            raise top.fail("schedule", f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        if not version2 and schedule_for(schedule).format_version > 1:
            raise top.fail("schedule", f"{schedule} is a version-2 schedule; a {PLAN_FORMAT} plan runs gpipe, "
                                       f"1f1b or custom (write \"format\": \"{PLAN_FORMAT_V2}\")")
        programs = _read_programs(top, file) if version2 and top.has("programs") else None
        stages = tuple(_read_stage(item, file, f"stages[{i}]", schedule_for(schedule).from_plan and programs is None,
                                   version3)
                       for i, item in enumerate(top.array("stages", nonempty=True)))
        batch = top.integer("global_batch", minimum=1, maximum=MAX_SAMPLES)
        known = _PLAN_FIELDS_V3 if version3 else _PLAN_FIELDS_V2 if version2 else _PLAN_FIELDS
        zero, state = _read_v3_fields(top) if version3 else (0, None)
        plan = cls(top.string("graph"), top.string("cluster"), batch, top.number("state_factor"), schedule, stages,
                   top.extras(known), programs, zero, state)
        if not version2:
            _check_v1(plan, file)
        plan.validate(file=file)
        return plan

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON object, as ``/1`` unless it uses version 2 (unknown fields kept)."""
        data = dict(self.extra)
        data.update({"format": self.format, "graph": self.graph, "cluster": self.cluster,
                     "global_batch": self.global_batch, "state_factor": self.state_factor,
                     "schedule": self.schedule, "stages": [st.to_dict() for st in self.stages]})
        if self.custom_programs is not None:
            data["programs"] = [list(p) for p in self.custom_programs]
        if self.zero != 0:
            data["zero"] = self.zero
        if self.state is not None:
            data["state"] = dict(zip(STATE_PARTS, self.state))
        return data


def _check_v1(plan: Plan, file: str) -> None:
    """What a ``/1`` plan may not do: share a device between stages, split a backward into ``I`` and ``W``."""
    used: dict[str, int] = {}
    for s, st in enumerate(plan.stages):
        for j, dev in enumerate(st.devices):
            if dev in used and used[dev] != s:
                raise InputError(file, f"stages[{s}].devices[{j}]",
                                 f"device {dev!r} is already used by stage {used[dev]}; in a {PLAN_FORMAT} plan a "
                                 f"device belongs to at most one stage (a {PLAN_FORMAT_V2} plan may put several "
                                 f"stages on one device group)")
            used.setdefault(dev, s)
        for i, op in enumerate(st.ops or ()):
            if isinstance(op, str) and op[:1] in ("I", "W"):
                raise InputError(file, f"stages[{s}].ops[{i}]", f"op {op} splits the backward, which needs "
                                                               f"\"format\": \"{PLAN_FORMAT_V2}\"")


def _read_v3_fields(top: Reader) -> tuple[int, tuple[float, float, float] | None]:
    """A ``/3`` plan's ``zero`` (default 0) and ``state`` (default ``None``)."""
    zero = top.integer("zero", minimum=0, maximum=2) if top.has("zero") else 0
    state = None
    if top.has("state"):
        parts = Reader(top.raw("state"), top.file, "state")
        unknown = sorted(set(parts.obj) - set(STATE_PARTS))
        if unknown:
            raise parts.fail(unknown[0], f"unknown part of the training state; the parts are {', '.join(STATE_PARTS)}")
        state = tuple(parts.number(name) for name in STATE_PARTS)
    return zero, state  # type: ignore[return-value]


def _replicas(st: Stage) -> str:
    return " ".join("[" + ", ".join(r) + "]" for r in st.replica_devices)


def _read_programs(top: Reader, file: str) -> tuple[tuple[str, ...], ...]:
    programs = top.array("programs", nonempty=True)
    out = []
    for g, program in enumerate(programs):
        if not isinstance(program, list):
            raise InputError(file, f"programs[{g}]", f"expected a list of actions such as [\"0F0\", \"0B0\"], "
                                                     f"got {type(program).__name__}")
        for i, action in enumerate(program):
            if not isinstance(action, str):
                raise InputError(file, f"programs[{g}][{i}]", f"expected an action string such as \"0F3\", "
                                                              f"got {action!r}")
        out.append(tuple(program))
    return tuple(out)


def _names(devices: set[str]) -> str:
    return ", ".join(sorted(devices))


def _shown(sizes: tuple[int, ...]) -> str:
    """A microbatch list, shortened past 8 entries."""
    return "[" + ", ".join(map(str, sizes[:8])) + (", ...]" if len(sizes) > 8 else "]")


def _missing_ops(file: str, s: int) -> list[str]:
    raise InputError(file, f"stages[{s}].ops", "a custom schedule needs an op list on every stage")


def _read_stage(item: Any, file: str, where: str, custom: bool, version3: bool = False) -> Stage:
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
    degree, zero = 1, None
    if version3:
        if r.has("tensor_parallel"):
            degree = r.integer("tensor_parallel", minimum=1, maximum=MAX_SAMPLES)
        if r.has("zero"):
            zero = r.integer("zero", minimum=0, maximum=2)
    return Stage((lo, hi), tuple(devices), split, r.boolean("recompute"), ops,
                 r.extras(_STAGE_FIELDS_V3 if version3 else _STAGE_FIELDS), degree, zero)


def load_plan(path: str, graph: "LayerGraph | None" = None, cluster: "Cluster | None" = None) -> Plan:
    """Load a ``pipeplan.plan/1``, ``/2`` or ``/3`` file and validate it (against a graph and cluster if given).

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


def _generates_group_programs(schedule: str) -> bool:
    """Whether ``schedule`` names a schedule that generates every group's program, a group holding several stages
    (:data:`~pipeplan.solver.schedules.schedule.NAMED_V2`); ``False`` for an unknown name, which validation reports."""
    named = SCHEDULE_CLASSES.get(schedule)
    return named is not None and named.several_stages and not named.from_plan
