"""What a target runtime can run, the refusals of a plan it cannot, and the nearest plan it can.

Every target of ``pipeplan export`` runs one microbatch size, one microbatch count and
one data-parallel degree for all stages (see ``shared/reference/runtimes.md``); some
also have one recompute setting for all stages, no custom op lists, no GPipe, or
(version 2) not every schedule that puts several stages on one device group.  A plan
outside these limits is refused with the stage and the reason, or, with
``--allow-approximate``, changed into the nearest plan the target runs, one
:class:`Change` per difference.  The nearest plan keeps every stage on its device
group: a plan whose groups hold several stages is approximated only by a schedule of
the same placement (``interleaved-1f1b`` for stage ``s`` on group ``s mod R``,
``zbv`` for the V), and refused when the target has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import NAMED_V2, ZBV, group_programs, schedule_for


NO_DEGREE = "none"
"""A target that runs no tensor parallelism: every stage's degree must be 1."""
GLOBAL_DEGREE = "global"
"""A target with one tensor-parallel degree for the whole model (Megatron-LM, torchtitan)."""
STAGE_DEGREE = "per-stage"
"""A target that takes each stage's own degree."""


@dataclass(frozen=True)
class Parallelism:
    """What a target runs of tensor parallelism and sharded training state (docs/model.md section 8)."""

    degrees: str = NO_DEGREE
    """:data:`NO_DEGREE`, :data:`GLOBAL_DEGREE` or :data:`STAGE_DEGREE`."""
    degree_reason: str = ""
    """Why it takes no degree (``none``) or only one for all stages (``global``), in the runtime's terms."""
    degree_key: str = ""
    """Where the degree goes in the target's files (``--tensor-model-parallel-size``)."""
    zero_levels: tuple[int, ...] = (0,)
    """The ZeRO levels it runs (0: every replica keeps all its state)."""
    zero_reasons: dict[int, str] = field(default_factory=dict)
    """Why each other level is refused."""
    zero_keys: dict[int, str] = field(default_factory=dict)
    """Where each level it runs goes in its files."""
    zero_per_stage: bool = False
    """Whether stages may use different ZeRO levels (else one setting for all)."""
    zero_per_stage_reason: str = ""
    """The target's one setting, for the refusal."""


@dataclass(frozen=True)
class Target:
    """What one runtime can express."""

    name: str
    """The ``--to`` name."""
    title: str
    """The runtime's name for messages (``torch.distributed.pipelining``)."""
    schedules: tuple[str, ...]
    """The plan schedules it runs."""
    schedule_reason: str
    """Why the other schedules are refused (what the runtime schedules instead)."""
    recompute_per_stage: bool
    """Whether each stage can recompute on its own (else one setting for all)."""
    recompute_reason: str = ""
    """What the runtime's one recompute setting is (for the refusal)."""
    schedule_reasons: dict[str, str] = field(default_factory=dict)
    """Why a particular schedule is refused, where ``schedule_reason`` does not say it."""
    multi_stage_reason: str = ""
    """Why several stages on one device group are refused; empty when the runtime runs them."""
    parallelism: Parallelism = field(default_factory=Parallelism)
    """What it runs of tensor parallelism and ZeRO."""


@dataclass(frozen=True)
class Change:
    """One difference between a refused plan and the nearest plan the target runs."""

    where: str
    """The place in the plan (``stages[1].recompute``)."""
    what: str
    """The change, with the old and new values."""


def check_plan(plan: Plan, target: Target, file: str, approximate: bool = False) -> tuple[Plan, list[Change]]:
    """The plan the target runs: ``plan`` itself, or with ``approximate`` the nearest one.

    Parameters
    ----------
    plan : Plan
        A valid plan.
    target : Target
        The runtime it is exported to.
    file : str
        The plan's path, for messages.
    approximate : bool
        Change what the target cannot run instead of refusing it.

    Returns
    -------
    (Plan, list of Change)
        The plan to export and the changes made (none without ``approximate``).

    Raises
    ------
    InputError
        Naming the first stage the target cannot run, and why (always, without ``approximate``;
        with it, only when no plan of the same stages fits, e.g. no equal split exists).

    Examples
    --------
    >>> from pipeplan.runtime.export.targets import TORCH
    >>> p = Plan("g", "c", 8, 4.0, "gpipe", (Stage((0, 1), ("a",), (4, 4)), Stage((1, 2), ("b",), (5, 3))))
    >>> check_plan(p, TORCH, "p.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeplan.models.errors.InputError: p.json: stages[1].microbatches: stage 1 splits the batch into ...
    >>> q, changes = check_plan(p, TORCH, "p.json", approximate=True)
    >>> q.stages[1].microbatches, len(changes)
    ((4, 4), 1)
    """
    check_parallelism(plan, target, file)
    changes: list[Change] = []
    for rule in (_schedule, _replicas, _split, _recompute):
        plan = rule(plan, target, file, approximate, changes)
    if changes:
        plan.validate(file=file)  # the nearest plan obeys the spec like any other
    return plan, changes


_NOT_APPROXIMATED = ("--allow-approximate changes no degree or ZeRO level: either changes the devices a stage "
                     "needs or the memory it holds")


def check_parallelism(plan: Plan, target: Target, file: str) -> None:
    """Refuse a plan whose tensor-parallel degrees or ZeRO levels the target cannot run.

    Raises
    ------
    InputError
        Naming the first stage the target cannot run, the numbers and the reason (with
        or without ``--allow-approximate``: see :data:`_NOT_APPROXIMATED`).

    Examples
    --------
    >>> from pipeplan.runtime.export.targets import DEEPSPEED
    >>> p = Plan("g", "c", 8, 4.0, "1f1b", (Stage((0, 1), ("a", "b"), (4, 4), tensor_parallel=2),
    ...                                     Stage((1, 2), ("c", "d"), (4, 4), tensor_parallel=2)))
    >>> check_parallelism(p, DEEPSPEED, "p.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeplan.models.errors.InputError: p.json: stages[0].tensor_parallel: stage 0 has tensor_parallel 2: DeepSpeed ...
    """
    caps = target.parallelism
    degrees = [st.tensor_parallel for st in plan.stages]
    if caps.degrees == NO_DEGREE and max(degrees) > 1:
        s = next(i for i, t in enumerate(degrees) if t > 1)
        raise InputError(file, f"stages[{s}].tensor_parallel",
                         f"stage {s} has tensor_parallel {degrees[s]}: {target.title} {caps.degree_reason}; export a "
                         f"plan whose stages all have tensor_parallel 1 ({_NOT_APPROXIMATED})")
    if caps.degrees == GLOBAL_DEGREE and len(set(degrees)) > 1:
        s = next(i for i, t in enumerate(degrees) if t != degrees[0])
        raise InputError(file, f"stages[{s}].tensor_parallel",
                         f"stage {s} has tensor_parallel {degrees[s]} but stage 0 has {degrees[0]}: {target.title} "
                         f"{caps.degree_reason}; re-plan with one degree for every stage (pipeplan plan "
                         f"--tensor-parallel uniform) ({_NOT_APPROXIMATED})")
    levels = [plan.stage_zero(s) for s in range(len(plan.stages))]
    bad = next((s for s, z in enumerate(levels) if z not in caps.zero_levels), None)
    if bad is not None:
        runs = " or ".join(str(z) for z in caps.zero_levels)
        raise InputError(file, _zero_where(plan, bad),
                         f"stage {bad} has zero {levels[bad]}: {target.title} {caps.zero_reasons[levels[bad]]}; "
                         f"export a plan with zero {runs} ({_NOT_APPROXIMATED})")
    if not caps.zero_per_stage and len(set(levels)) > 1:
        s = next(i for i, z in enumerate(levels) if z != levels[0])
        raise InputError(file, _zero_where(plan, s),
                         f"stage {s} has zero {levels[s]} but stage 0 has {levels[0]}: {target.title} "
                         f"{caps.zero_per_stage_reason}; give every stage the same ZeRO level "
                         f"({_NOT_APPROXIMATED})")


def _zero_where(plan: Plan, s: int) -> str:
    """Where stage ``s``'s ZeRO level is written: its own ``zero``, else the plan's."""
    return f"stages[{s}].zero" if plan.stages[s].zero is not None else "zero"


def _refuse_or(approximate: bool, error: InputError, changes: list[Change], change: Change) -> None:
    if not approximate:
        raise error
    changes.append(change)


def placement(plan: Plan) -> str | None:
    """How the plan's stages sit on its device groups, in the terms the runtimes place them.

    Returns
    -------
    str or None
        ``"one"`` (every group holds one stage), ``"loop"`` (``S = v*R`` stages,
        stage ``s`` on group ``s mod R``: interleaved and looped schedules, torchtitan's
        ``loop`` style, Megatron's virtual stages), ``"v"`` (``2R`` stages, stage ``s``
        on group ``s`` and ``2R-1-s``: ZB-V, torchtitan's ``v`` style), else ``None``.

    Examples
    --------
    >>> a, b = ("a",), ("b",)
    >>> def on(*devices):
    ...     return Plan("g", "c", 1, 4.0, "custom", tuple(Stage((i, i + 1), d, (1,)) for i, d in enumerate(devices)))
    >>> placement(on(a, b)), placement(on(a, b, a, b)), placement(on(a, b, b, a)), placement(on(a, a, b, b))
    ('one', 'loop', 'v', None)
    """
    groups, stage_groups = len(plan.groups), plan.stage_groups
    count = len(stage_groups)
    if count == groups:
        return "one"
    if count % groups == 0 and all(g == s % groups for s, g in enumerate(stage_groups)):
        return "loop"
    if count == 2 * groups and all(g == ZBV.stage_group(s, groups) for s, g in enumerate(stage_groups)):
        return "v"
    return None


_SAME_PLACEMENT = {"one": "1f1b", "loop": "interleaved-1f1b", "v": "zbv"}
"""The schedule that runs a placement, for the nearest plan: the exporters' choice among the schedules of one
placement (several classes share ``"loop"``), so a table of names rather than a schedule attribute."""


def _fallback(plan: Plan, target: Target) -> str | None:
    """The schedule of the target that keeps every stage on its group, if any."""
    schedule = _SAME_PLACEMENT.get(placement(plan) or "")
    return schedule if schedule in target.schedules and schedule != plan.schedule else None


def _schedule(plan: Plan, target: Target, file: str, approximate: bool, changes: list[Change]) -> Plan:
    shared = placement(plan) != "one"
    if plan.schedule in target.schedules and not (shared and target.multi_stage_reason):
        return plan
    if shared and target.multi_stage_reason:
        reason = (f"puts {len(plan.stages)} stages on {len(plan.groups)} device groups, but {target.title} "
                  f"{target.multi_stage_reason}")
    else:
        reason = f"{target.title} {target.schedule_reasons.get(plan.schedule, target.schedule_reason)}"
    fallback = _fallback(plan, target)
    runs = " or ".join(repr(s) for s in target.schedules if not (shared and target.multi_stage_reason
                                                                 and s in NAMED_V2))
    fix = (f"pass --allow-approximate to run it as {fallback}" if fallback else
           "re-plan for it (--allow-approximate cannot: no schedule the target runs keeps these stages on their "
           "device groups)")
    error = InputError(file, "schedule", f"stage 0 (every stage): schedule {plan.schedule!r}: {reason}; export a "
                                         f"plan with schedule {runs}, or {fix}")
    if fallback is None:
        raise error
    _refuse_or(approximate, error, changes, Change("schedule", f"{plan.schedule} -> {fallback} ({reason})"))
    stages = tuple(replace(st, ops=None) for st in plan.stages)
    return replace(plan, schedule=fallback, stages=stages, custom_programs=None)


def _replicas(plan: Plan, target: Target, file: str, approximate: bool, changes: list[Change]) -> Plan:
    counts = [st.replicas for st in plan.stages]
    r = min(counts)
    if len(set(counts)) == 1:
        return plan
    s = next(i for i, c in enumerate(counts) if c != counts[0])
    error = InputError(file, f"stages[{s}].devices", f"stage {s} has {counts[s]} replicas but stage 0 has "
                                                     f"{counts[0]}: {target.title} gives every stage the same "
                                                     f"data-parallel degree (world size / stages); use the same "
                                                     f"number of devices in every stage, or pass "
                                                     f"--allow-approximate to keep {r} per stage")
    stages = []
    for i, (st, g) in enumerate(zip(plan.stages, plan.stage_groups)):
        kept = plan.groups[g][:r]  # in the group's order, so that stages sharing a group keep the same devices
        if st.replicas > r:
            _refuse_or(approximate, error, changes,
                       Change(f"stages[{i}].devices", f"stage {i}: {st.replicas} -> {r} replicas "
                                                      f"({', '.join(d for d in st.devices if d not in kept)} "
                                                      f"left unused)"))
        stages.append(replace(st, devices=kept if st.replicas > r else st.devices))
    return replace(plan, stages=tuple(stages))


def equal_count_near(batch: int, replicas: int, wanted: int,
                     allowed: Callable[[int], bool] = lambda m: True) -> int | None:
    """The microbatch count nearest ``wanted`` that splits ``batch`` into equal microbatches
    whose every replica part is equal too (the larger count on a tie); ``None`` if none does.

    ``allowed`` narrows the counts further (the schedule's own rule on ``m``).

    Examples
    --------
    >>> equal_count_near(64, 2, 5), equal_count_near(9, 2, 3), equal_count_near(64, 1, 5, lambda m: m % 8 == 0)
    (4, None, 8)
    """
    counts = [m for m in range(1, batch + 1) if batch % (m * replicas) == 0 and allowed(m)]
    return min(counts, key=lambda m: (abs(m - wanted), -m)) if counts else None


def _split(plan: Plan, target: Target, file: str, approximate: bool, changes: list[Change]) -> Plan:
    r = plan.stages[0].replicas
    first = plan.stages[0].microbatches
    bad = next(((s, st) for s, st in enumerate(plan.stages) if _split_problem(st, first, r)), None)
    if bad is None:
        return plan
    s, st = bad
    custom = plan.schedule_class.from_plan
    schedule = _fallback(plan, target) if custom else plan.schedule
    m = equal_count_near(plan.global_batch, r, len(first), _count_rule(schedule or "custom", plan))
    error = InputError(file, f"stages[{s}].microbatches", f"stage {s} {_split_problem(st, first, r)}: "
                                                          f"{target.title} {_SPLIT_REASON[target.name]}; "
                                                          + _split_fix(plan.global_batch, r, m))
    if m is None:
        raise error
    if approximate and schedule is None:  # the programs were written for the old counts
        raise InputError(file, f"stages[{s}].microbatches", f"stage {s} {_split_problem(st, first, r)}: "
                                                            f"{target.title} {_SPLIT_REASON[target.name]}; and no "
                                                            f"schedule it runs keeps these stages on their device "
                                                            f"groups to replace the custom programs: split every "
                                                            f"stage into {m} microbatches of "
                                                            f"{plan.global_batch // m} samples and write programs "
                                                            f"for them")
    size = plan.global_batch // m
    stages = []
    for i, old in enumerate(plan.stages):
        if old.microbatches != (size,) * m:
            _refuse_or(approximate, error, changes,
                       Change(f"stages[{i}].microbatches", f"stage {i}: {_show(old.microbatches)} -> {m} x {size}"))
            old = replace(old, microbatches=(size,) * m, ops=None)
        stages.append(old)
    if custom:  # the op lists were written for the old counts
        changes.append(Change("schedule", f"custom -> {schedule} (the op lists were for the old microbatch "
                                          f"counts)"))
    return replace(plan, stages=tuple(stages), schedule=schedule or plan.schedule,
                   custom_programs=None if custom else plan.custom_programs)


def _count_rule(schedule: str, plan: Plan) -> Callable[[int], bool]:
    """Whether ``schedule`` runs ``m`` microbatches on the plan's groups (torch refuses some counts)."""
    named = schedule_for(schedule)
    if named.one_stage_per_group or named.from_plan:  # any count runs; the multi-stage ones refuse some (torch)
        return lambda m: True
    groups, virtual = len(plan.groups), plan.virtual

    def allowed(m: int) -> bool:
        try:
            group_programs(schedule, groups, m, virtual)
        except ValueError:
            return False
        return True
    return allowed


_SPLIT_REASON = {
    "torch": "chunks each batch with torch.tensor_split into equal microbatches and sizes every receive buffer "
             "from one microbatch, so a split of unequal sizes or counts would silently run other microbatches "
             "than the plan's (and unequal chunks mis-shape the outputs)",
    "torchtitan": "runs one pipeline_parallel_microbatch_size for every stage",
    "deepspeed": "runs one train_micro_batch_size_per_gpu and gradient_accumulation_steps for every stage",
    "megatron": "runs one --micro-batch-size for every stage",
}


def _split_problem(st: Stage, first: tuple[int, ...], replicas: int) -> str | None:
    sizes = st.microbatches
    if len(sizes) != len(first):
        return f"splits the batch into {len(sizes)} microbatches but stage 0 into {len(first)}"
    if len(set(sizes)) > 1:
        return f"splits the batch into unequal microbatches {_show(sizes)}"
    if sizes != first:
        return f"splits the batch into microbatches of {sizes[0]} samples but stage 0 into {first[0]}"
    if sizes[0] % replicas:
        return (f"splits microbatches of {sizes[0]} samples over {replicas} replicas, which leaves them unequal "
                f"parts")
    return None


def _split_fix(batch: int, replicas: int, m: int | None) -> str:
    if m is None:
        return (f"no count splits {batch} samples equally over {replicas} replicas: choose a global batch that "
                f"is a multiple of {replicas}")
    return (f"split every stage into {m} microbatches of {batch // m} samples, or pass --allow-approximate "
            f"to do so")


def _show(sizes: tuple[int, ...]) -> str:
    shown = list(sizes[:8])
    return "[" + ", ".join(map(str, shown)) + (", ..." if len(sizes) > 8 else "") + "]"


def _recompute(plan: Plan, target: Target, file: str, approximate: bool, changes: list[Change]) -> Plan:
    flags = [st.recompute for st in plan.stages]
    if target.recompute_per_stage or len(set(flags)) == 1:
        return plan
    s = next(i for i, f in enumerate(flags) if f != flags[0])
    error = InputError(file, f"stages[{s}].recompute", f"stage {s} recomputes {'' if flags[s] else 'not '}but "
                                                       f"stage 0 {'does' if flags[0] else 'does not'}: {target.title} "
                                                       f"{target.recompute_reason}; make every stage recompute alike, "
                                                       f"or pass --allow-approximate to recompute on every stage")
    stages = []
    for i, st in enumerate(plan.stages):
        if not st.recompute:
            # recomputing everywhere keeps each stage's memory at most what the plan's fitted
            _refuse_or(approximate, error, changes, Change(f"stages[{i}].recompute", f"stage {i}: recompute "
                                                                                     f"false -> true"))
        stages.append(replace(st, recompute=True))
    return replace(plan, stages=tuple(stages))
