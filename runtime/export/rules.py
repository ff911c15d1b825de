"""What a target runtime can run, the refusals of a plan it cannot, and the nearest plan it can.

Every target of ``pipeplan export`` runs one microbatch size, one microbatch count and
one data-parallel degree for all stages (see ``shared/reference/runtimes.md``); some
also have one recompute setting for all stages, no custom op lists, or no GPipe.  A
plan outside these limits is refused with the stage and the reason, or, with
``--allow-approximate``, changed into the nearest plan the target runs, one
:class:`Change` per difference.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeplan.models.errors import InputError
from pipeplan.solver.plan import Plan, Stage


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
    changes: list[Change] = []
    for rule in (_schedule, _replicas, _split, _recompute):
        plan = rule(plan, target, file, approximate, changes)
    return plan, changes


def _refuse_or(approximate: bool, error: InputError, changes: list[Change], change: Change) -> None:
    if not approximate:
        raise error
    changes.append(change)


def _schedule(plan: Plan, target: Target, file: str, approximate: bool, changes: list[Change]) -> Plan:
    if plan.schedule in target.schedules:
        return plan
    fallback = "1f1b"
    error = InputError(file, "schedule", f"stage 0 (every stage): schedule {plan.schedule!r}: {target.title} "
                                         f"{target.schedule_reason}; export a plan with schedule "
                                         f"{' or '.join(repr(s) for s in target.schedules)}, or pass "
                                         f"--allow-approximate to run it as {fallback}")
    _refuse_or(approximate, error, changes, Change("schedule", f"{plan.schedule} -> {fallback} "
                                                               f"({target.title} {target.schedule_reason})"))
    stages = tuple(replace(st, ops=None) for st in plan.stages)
    return replace(plan, schedule=fallback, stages=stages)


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
    for i, st in enumerate(plan.stages):
        if st.replicas > r:
            _refuse_or(approximate, error, changes,
                       Change(f"stages[{i}].devices", f"stage {i}: {st.replicas} -> {r} replicas "
                                                      f"({', '.join(st.devices[r:])} left unused)"))
        stages.append(replace(st, devices=st.devices[:r]))
    return replace(plan, stages=tuple(stages))


def equal_count_near(batch: int, replicas: int, wanted: int) -> int | None:
    """The microbatch count nearest ``wanted`` that splits ``batch`` into equal microbatches
    whose every replica part is equal too (the larger count on a tie); ``None`` if none does.

    Examples
    --------
    >>> equal_count_near(64, 2, 5), equal_count_near(9, 2, 3)
    (4, None)
    """
    counts = [m for m in range(1, batch + 1) if batch % (m * replicas) == 0]
    return min(counts, key=lambda m: (abs(m - wanted), -m)) if counts else None


def _split(plan: Plan, target: Target, file: str, approximate: bool, changes: list[Change]) -> Plan:
    r = plan.stages[0].replicas
    first = plan.stages[0].microbatches
    bad = next(((s, st) for s, st in enumerate(plan.stages) if _split_problem(st, first, r)), None)
    if bad is None:
        return plan
    s, st = bad
    m = equal_count_near(plan.global_batch, r, len(first))
    error = InputError(file, f"stages[{s}].microbatches", f"stage {s} {_split_problem(st, first, r)}: "
                                                          f"{target.title} {_SPLIT_REASON[target.name]}; "
                                                          + _split_fix(plan.global_batch, r, m))
    if m is None:
        raise error
    size = plan.global_batch // m
    stages = []
    for i, old in enumerate(plan.stages):
        if old.microbatches != (size,) * m:
            _refuse_or(approximate, error, changes,
                       Change(f"stages[{i}].microbatches", f"stage {i}: {_show(old.microbatches)} -> {m} x {size}"))
            old = replace(old, microbatches=(size,) * m, ops=None)
        stages.append(old)
    custom = plan.schedule == "custom"
    if custom:  # the op lists were written for the old counts
        changes.append(Change("schedule", "custom -> 1f1b (the op lists were for the old microbatch counts)"))
    return replace(plan, stages=tuple(stages), schedule="1f1b" if custom else plan.schedule)


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
