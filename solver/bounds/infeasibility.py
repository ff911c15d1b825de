"""Why no plan fits: the tightest memory constraint, in words and numbers.

For every layer we compute the smallest footprint any plan could give it, a lower
bound over every stage that contains it: its own training state
(``state_factor * params``, which replication does not shrink) plus the activations of
one microbatch while its backward runs (``ceil(n / r) * act``, which neither recompute
nor the schedule can avoid), with the most replicas ``r`` allowed that still fit devices.
A layer whose bound exceeds every device is the tightest constraint; if every layer
fits alone, the whole model's state against the memory of the devices is checked next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult


def format_bytes(n: float, decimals: int = 1) -> str:
    """Bytes in the decimal (SI) unit that suits their size: B, kB, MB, GB or TB.

    The one convention of every size the command line prints (the files hold bytes, and
    link rates are GB/s, also decimal).

    Examples
    --------
    >>> format_bytes(31.2e9)
    '31.2 GB'
    >>> format_bytes(4.8e6, 2)
    '4.80 MB'
    >>> format_bytes(512)
    '512 B'
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.{decimals}f} {unit}"
    return f"{n:.0f} B"


PROOF_TOL = 1e-9
"""Relative slack before a bound counts as exceeding a memory: the simulator sums the same bytes
in another order, and a peak equal to the memory fits (``3.0000000000000004`` against ``3.0``)."""


def exceeds(need: float, memory: float) -> bool:
    """Whether ``need`` is more than ``memory`` beyond rounding (see :data:`PROOF_TOL`).

    Examples
    --------
    >>> exceeds(5 * (0.2 + 0.4), 3.0), exceeds(3.1, 3.0)
    (False, True)
    """
    return need > memory * (1 + PROOF_TOL)


def largest_microbatch(problem: PlanningProblem) -> int:
    """The smallest size the largest microbatch of any allowed split can have.

    With ``M`` equal microbatches it is the equal split's largest; when split-aware
    solvers choose sizes (``auto``, ``--per-stage``), any split into at most ``K``
    microbatches has one of at least ``ceil(B / K)`` samples.

    Examples
    --------
    ``B = 6`` in at most ``K = 3`` microbatches: one holds at least 2 samples.
    """
    if problem.free_sizes:
        return math.ceil(problem.global_batch / max(problem.split_counts))
    return max(problem.split)


def layer_footprint(problem: PlanningProblem, layer: int, replicas: int) -> float:
    """Lower bound on the bytes per device of any stage holding ``layer`` with ``replicas`` replicas.

    Examples
    --------
    A layer of 10 parameter bytes, state factor 4, 3 activation bytes per sample and
    microbatches of 8 samples needs ``40 + 8 * 3 = 64`` bytes on one device.
    """
    l = problem.graph.layers[layer]
    q = math.ceil(largest_microbatch(problem) / replicas)
    return problem.state_factor * l.params + q * l.act


def _layer_verdict(problem: PlanningProblem, layer: int, memories: list[float]) -> tuple[float, int, float]:
    """``(ratio need/capacity, replicas, need)`` for the best replica count of ``layer``.

    Only the first replica count of each per-replica microbatch ``ceil(q / r)`` is tried:
    the later ones of the same size need as much on devices that are no larger
    (``memories`` is sorted largest first), so they never have a smaller ratio.
    """
    max_r = len(memories) if problem.allow_replication else 1
    best = None
    for r in _first_counts(largest_microbatch(problem), max_r):
        need = layer_footprint(problem, layer, r)
        ratio = need / memories[r - 1] if memories[r - 1] > 0 else (0.0 if need <= 0 else math.inf)
        if best is None or ratio < best[0]:
            best = (ratio, r, need)
    assert best is not None
    return best


def _first_counts(q: int, most: int) -> list[int]:
    """The replica counts ``r <= most`` at which ``ceil(q / r)`` first takes each of its values.

    Examples
    --------
    >>> _first_counts(8, 10)  # ceil(8 / r) = 8, 4, 3, 2, 2, 2, 2, 1, 1, 1
    [1, 2, 3, 4, 8]
    """
    counts, r = [], 1
    while r <= most:
        counts.append(r)
        size = -(-q // r)
        if size <= 1:
            break
        r = -(-q // (size - 1))  # the first count with a smaller microbatch
    return counts


def _stage_limit_cause(problem: PlanningProblem) -> str:
    devices, layers = len(problem.cluster.devices), len(problem.graph)
    if problem.max_stages is not None and problem.max_stages == problem.stage_limit:
        return f"--max-stages {problem.max_stages}"
    return f"{devices} device(s)" if devices <= layers else f"{layers} layer(s)"


def proves_infeasible(problem: PlanningProblem) -> bool:
    """Whether the bounds of :func:`tightest_constraint` alone rule out every plan.

    True when some layer does not fit any device group even alone, the model's
    training state exceeds the memory of the largest devices a plan may use, or the
    layers need more stages than a plan may have (:func:`fewest_stages`); False when
    these bounds fit (a plan may still not exist: only an exact solver can tell).
    """
    return memory_verdict(problem)[0]


def tightest_constraint(problem: PlanningProblem) -> str:
    """The memory constraint that most clearly rules out every plan, as one sentence.

    Parameters
    ----------
    problem : PlanningProblem
        A problem for which no plan fits (the text is still computed otherwise).

    Returns
    -------
    str
        For example ``"layer 'block.11' alone needs 31.2 GB at microbatch 8 (state
        24.0 GB + activations 7.2 GB); the largest device has 24.0 GB"``.

    Examples
    --------
    See ``tests/test_infeasibility.py``.
    """
    return memory_verdict(problem)[1]


@dataclass(frozen=True)
class MemoryVerdict:
    """What the memory bounds say of a problem (:func:`memory_bound_verdict`)."""

    proved: bool
    """Whether they rule out every plan."""
    sentence: str
    """The tightest constraint, in words."""
    kind: str
    """Which bound: ``"layer"`` (a layer fits no device group alone), ``"state"`` (the model's
    state exceeds the largest devices a plan may use), ``"stages"`` (the layers need more stages
    than a plan may have) or ``"none"`` (every bound fits: only an exact solver can tell)."""


def memory_bound_verdict(problem: PlanningProblem) -> MemoryVerdict:
    """Whether the memory bounds rule out every plan, which one, and the tightest one in words.

    The whole-model bounds (``state``, ``stages``) count a stage per device; the ``layer``
    bound holds whatever the schedule.
    """
    memories = sorted((d.memory for d in problem.cluster.devices), reverse=True)
    verdicts = [_layer_verdict(problem, i, memories) for i in range(len(problem.graph))]
    worst = max(range(len(verdicts)), key=lambda i: (verdicts[i][0], -i))
    ratio, r, need = verdicts[worst]
    if ratio > 1 + PROOF_TOL:
        return MemoryVerdict(True, _layer_text(problem, worst, r, need, memories), "layer")
    return _model_verdict(problem, memories)


def memory_verdict(problem: PlanningProblem) -> tuple[bool, str]:
    """``(proved, sentence)``: whether the memory bounds rule out every plan, and the tightest one in words."""
    verdict = memory_bound_verdict(problem)
    return verdict.proved, verdict.sentence


def _layer_text(problem: PlanningProblem, i: int, r: int, need: float, memories: list[float]) -> str:
    layer = problem.graph.layers[i]
    n = largest_microbatch(problem)
    q = math.ceil(n / r)
    state = problem.state_factor * layer.params
    parts = f"(state {format_bytes(state)} + activations {format_bytes(q * layer.act)})"
    if r == 1:
        where = f"at microbatch {n}"
        tail = f"the largest device has {format_bytes(memories[0])}"
    else:
        where = f"at microbatch {n} over {r} replicas ({q} sample(s) each)"
        tail = f"the smallest of the {r} largest devices has {format_bytes(memories[r - 1])}"
    notes = []
    if not problem.allow_replication:
        notes.append("replication is off")
    if problem.allow_recompute:
        notes.append("recompute cannot shrink this")
    else:
        notes.append("recompute is off")
    return f"layer '{layer.name}' alone needs {format_bytes(need)} {where} {parts}; {tail} ({', '.join(notes)})"


def fewest_stages(problem: PlanningProblem) -> tuple[int, tuple[int, int, float] | None]:
    """A lower bound on the stages of any fitting plan, and the first run of layers that overflowed.

    Each stage holds its layers' whole training state on every replica, plus at least
    ``ceil(n / r)`` samples' activations of its largest microbatch (``n``), with ``r`` at
    most every device; no stage gets more than the largest device's memory.  Packing
    layers greedily into such stages from the first layer gives the fewest stages that
    can work (no contiguous split does better than greedy packing).

    Returns
    -------
    (int, (lo, hi, need) or None)
        The stage count, and the first layers ``[lo, hi)`` that did not fit together,
        with their need in bytes (``None`` when one stage holds everything).
    """
    largest = max(d.memory for d in problem.cluster.devices)
    r = len(problem.cluster.devices) if problem.allow_replication else 1
    q = math.ceil(largest_microbatch(problem) / r)
    count, used, lo, overflow = 1, 0.0, 0, None
    for i, layer in enumerate(problem.graph.layers):
        need = problem.state_factor * layer.params + q * layer.act
        if exceeds(used + need, largest):
            if overflow is None:
                overflow = (lo, i + 1, used + need)
            count, used, lo = count + 1, 0.0, i
        used += need
    return count, overflow


def _model_verdict(problem: PlanningProblem, memories: list[float]) -> MemoryVerdict:
    k = problem.stage_limit
    state = problem.state_factor * sum(l.params for l in problem.graph.layers)
    room = sum(memories[:k])
    # Every parameter byte's state sits on some stage's devices; activations are left
    # out, so this is a bound any plan must meet.
    if exceeds(state, room):
        return MemoryVerdict(True, (f"the model's training state alone needs {format_bytes(state)} (state factor "
                                    f"{problem.state_factor:g}); a plan has at most {k} stage(s), and the {k} "
                                    f"largest device(s) hold {format_bytes(room)} together"), "state")
    n = largest_microbatch(problem)
    stages, overflow = fewest_stages(problem)
    if stages > k and overflow is not None:
        lo, hi, need = overflow
        names = problem.graph.layers
        return MemoryVerdict(True, (f"the layers need at least {stages} stages, as every device of a stage holds the "
                                    f"training state of all its layers and its share of their activations: layers "
                                    f"'{names[lo].name}' to '{names[hi - 1].name}' together already need "
                                    f"{format_bytes(need)} at microbatch {n}, more than the largest device's "
                                    f"{format_bytes(memories[0])}; a plan has at most {k} stage(s) "
                                    f"({_stage_limit_cause(problem)})"), "stages")
    # Only the exact solvers can decide this case; the sentence says what they weighed,
    # without a sum that would suggest the plan fits (activations are spread over replicas).
    acts = n * sum(l.act for l in problem.graph.layers)
    in_flight = "all of them under GPipe" if problem.needs.forwards_first else \
        "under 1F1B, one per later stage plus one, up to the microbatch count"
    return MemoryVerdict(False, (f"every layer fits on a device alone, and the model's training state "
                                 f"({format_bytes(state)}) fits the {k} largest devices' {format_bytes(room)} taken "
                                 f"together, but no split into at most {k} contiguous stages fits device by device: "
                                 f"each replica holds its stage's whole training state and its share of the "
                                 f"activations of every microbatch in flight on the stage ({in_flight}; "
                                 f"{format_bytes(acts)} per microbatch of {n} for the whole model)"), "none")


UNPROVED = "that does not prove that no plan fits (ilp and cpsat decide it)"
"""How a heuristic's record ends when it found no plan and nothing proves that none fits."""


def heuristic_no_plan(problem: PlanningProblem, name: str, why: str, wall: float, seed: int,
                      trace: tuple = (), details: dict | None = None) -> SolverResult:
    """The record of a heuristic over the whole search space that came back without a plan.

    Finding nothing proves nothing: the status is ``infeasible`` only when the memory
    bounds (:func:`memory_verdict`) rule out every plan, and ``timeout-no-solution``
    (stopped without a plan and without a proof) otherwise, with ``why`` in the message.

    Parameters
    ----------
    problem : PlanningProblem
    name : str
        The solver's registry name.
    why : str
        What the heuristic tried, in words ("no evaluated plan fits in memory").
    wall : float
        Seconds it ran.
    seed : int
    trace, details
        As in :class:`pipeplan.solver.core.result.SolverResult`.

    Returns
    -------
    SolverResult

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 1), params=9.0, act=0.0, out=0.0)])
    >>> c = Cluster("c", (Link(1.0, 0.0, "s"),), Link(1.0, 0.0), (Device("d", "s", 1.0, 10.0),))
    >>> heuristic_no_plan(PlanningProblem(g, c, 1, 1), "nsga", "nothing fitted", 0.1, 0).status
    'infeasible'
    """
    proved, sentence = memory_verdict(problem)
    if proved:
        return SolverResult(name, "infeasible", None, None, None, wall, seed, tuple(trace),
                            f"no plan fits in memory: {sentence}", details or {})
    return SolverResult(name, "timeout-no-solution", None, None, None, wall, seed, tuple(trace),
                        f"{why}; {UNPROVED}", details or {})
