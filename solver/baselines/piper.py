"""``piper``: Piper's stage DP over layer ranges and data-parallel degrees.

Source: Piper (Tarnawski, Narayanan, Phanishayee; NeurIPS 2021), ``msr-fiddle/piper``
``algo.cpp`` (``papers.md`` §5.2, ``peers.md`` §1.8).  Piper grows the model from its
output end: ``dp[I][s]`` is the smallest bottleneck time of the layers ``I`` (closed
under successors) on stages whose data-parallel degrees sum to ``s``, and

``dp[I][s] = min over I' ⊂ I, d | N, d <= s of max(dp[I'][s - d], TPS(I \\ I', d, s))``

where ``N`` is the number of microbatches, ``TPS`` the stage's time (compute divided
by ``d``, plus ``2 (c + sync) / d`` for every edge crossing the stage boundary, plus
the data-parallel resync ``4 (d - 1) w / d``, all bytes over one ``bandwidth``) and a
stage fits when ``sum_v (a_v * ceil(s / d) + b_v) <= maxMemoryPerDevice``: a 1F1B stage
with ``s`` devices at and after it keeps ``ceil(s / d)`` microbatches in flight.  The
answer is ``min_s dp[All][s]`` (``s`` at most ``min(N, devices)``), the smallest ``s``
on ties, as ``algo.cpp``'s strict comparison picks.

Tensor parallelism is left out: pipeplan has none, so every TMPC here has ``t = 1``
and ``k`` (devices used) equals ``s``.  What pipeplan's model changes:

- stages are layer ranges in the graph's topological order (pipeplan's plans), so the
  downsets are the suffixes of that order;
- Piper's per-node choice between the plain TMPC and the "activation recomp" one is a
  per-stage choice (pipeplan recomputes whole stages): the plain stage when it fits,
  else the recomputing one (``a`` becomes the stage's input bytes, its activations
  count once in ``b``, its time gains a forward pass); the plan's recompute flags are
  then set as every baseline sets them (on the stages the simulator finds too full);
- times are per iteration (Piper's per-microbatch ``TPS`` times ``N``) and include
  pipeplan's per-call fixed costs; under the GPipe schedule all ``N`` microbatches are
  in flight instead of ``ceil(s / d)``; ``max_stages``, when it binds, adds a
  stage-count dimension to the table.

Heterogeneous adaptation: none, as in Piper, which sees one device type.  Its
estimates use the cluster's slowest device, smallest memory and smallest pair
bandwidth; the chosen stages then take devices in
:func:`~pipeplan.solver.baselines.common.rank_devices` order (fastest first), front to
back.  The one plan Piper chooses is scored by the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

from pipeplan.solver.baselines.common import Baseline, Proposal, StageModel, rank_devices, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit, past


@dataclass(frozen=True)
class PiperView:
    """The homogeneous cluster Piper's formulas see, and the problem's batch.

    Parameters
    ----------
    problem : PlanningProblem
        The problem.
    """

    problem: PlanningProblem
    """The problem."""

    @cached_property
    def model(self) -> StageModel:
        """Prefix sums of the layer costs."""
        return StageModel(self.problem)

    @property
    def speed(self) -> float:
        """The slowest device's speed (Piper profiles one device type)."""
        return min(d.speed for d in self.problem.cluster.devices)

    @property
    def memory(self) -> float:
        """``maxMemoryPerDevice``: the smallest device memory."""
        return min(d.memory for d in self.problem.cluster.devices)

    @cached_property
    def bandwidth(self) -> float:
        """Piper's one ``bandwidth``: the smallest pair bandwidth (``inf`` on one device)."""
        ids = [d.id for d in self.problem.cluster.devices]
        return self.problem.cluster.bw(ids) if len(ids) > 1 else math.inf

    @property
    def max_devices(self) -> int:
        """``boundOnS = min(mbsInBatch, maxDevices)``."""
        return min(self.problem.microbatches, len(self.problem.cluster.devices))

    def degrees(self) -> list[int]:
        """Data-parallel degrees Piper tries: divisors of ``N`` up to :attr:`max_devices`."""
        top = self.max_devices if self.problem.allow_replication else 1
        return [d for d in range(1, top + 1) if self.problem.microbatches % d == 0]

    def in_flight(self, s: int, d: int) -> int:
        """Microbatches a stage of degree ``d`` stashes with ``s`` devices at and after it."""
        return self.problem.microbatches if self.problem.needs.forwards_first else math.ceil(s / d)


def stage_estimate(view: PiperView, lo: int, hi: int, d: int, s: int) -> tuple[float, bool] | None:
    """Piper's time of stage ``[lo, hi)`` on ``d`` replicas, and whether it recomputes.

    Parameters
    ----------
    view : PiperView
        Piper's view of the problem.
    lo, hi : int
        The stage's layers, ``0 <= lo < hi <= L``.
    d : int
        Its data-parallel degree.
    s : int
        Devices at and after it (``s >= d``): sets the microbatches in flight.

    Returns
    -------
    (float, bool) or None
        Seconds per iteration and the recompute choice (plain when it fits), or
        ``None`` when neither fits ``maxMemoryPerDevice``.

    Examples
    --------
    >>> stage_estimate(view, 0, 2, 1, 1)  # doctest: +SKIP
    (0.048, False)
    """
    pr, g = view.problem, view.problem.graph
    af, bf, ab, bb, params, act = view.model.sums(lo, hi)
    per_replica = [math.ceil(n / d) for n in pr.split]
    forward = sum(af + bf * q for q in per_replica) / view.speed
    compute = forward + sum(ab + bb * q for q in per_replica) / view.speed
    edges = (g.cut_bytes(lo - 1) if lo > 0 else 0.0) + (g.cut_bytes(hi - 1) if hi < len(g) else 0.0)
    comm = (2 * edges * pr.global_batch / d + 4 * (d - 1) * params / d) / view.bandwidth if edges or d > 1 else 0.0
    q, y, state = max(per_replica), view.in_flight(s, d), pr.state_factor * params
    if act * q * y + state <= view.memory:
        return compute + comm, False
    if pr.allow_recompute and g.stage_input_bytes(lo) * q * y + act * q + state <= view.memory:
        return compute + forward + comm, True
    return None


@dataclass(frozen=True)
class PiperChoice:
    """The plan Piper's DP chooses, in its own terms."""

    bottleneck: float
    """``min_s dp[All][s]``: Piper's estimate of the slowest stage (seconds per iteration)."""
    bounds: tuple[tuple[int, int], ...]
    """Half-open layer ranges of the stages, in order."""
    degrees: tuple[int, ...]
    """Data-parallel degree of each stage."""


def piper_dp(problem: PlanningProblem, deadline: TimeLimit | None = None) -> PiperChoice | None:
    """Piper's DP over suffixes, data-parallel degrees and device sums.

    Parameters
    ----------
    problem : PlanningProblem
        The problem.
    deadline : TimeLimit, optional
        The clock after which the DP gives up (default: none).

    Returns
    -------
    PiperChoice or None
        The minimum of Piper's bottleneck formula over its search space, or ``None``
        when no stage assignment fits its memory estimate (or the deadline passed).

    Examples
    --------
    >>> piper_dp(problem).degrees  # doctest: +SKIP
    (1, 1)
    """
    deadline = deadline if deadline is not None else TimeLimit(math.inf)
    view = PiperView(problem)
    L, top, degrees = len(problem.graph), view.max_devices, view.degrees()
    counting = problem.stage_limit < min(L, top)
    counts = range(1, problem.stage_limit + 1) if counting else [0]
    # best[(c, i, s)] = (bottleneck, next layer j, degree d) for layers [i, L) on s devices.
    best: dict[tuple[int, int, int], tuple[float, int, int]] = {(0, L, 0): (0.0, L, 0)}
    for i in range(L - 1, -1, -1):
        if past(deadline):
            return None
        for j in range(i + 1, L + 1):
            for d in degrees:
                for s in range(d, top + 1):
                    est = stage_estimate(view, i, j, d, s)
                    if est is None:
                        continue
                    for c in counts:
                        after = best.get((c - 1 if counting else 0, j, s - d))
                        if after is None:
                            continue
                        value = max(after[0], est[0])
                        key = (c, i, s)
                        if key not in best or value < best[key][0]:
                            best[key] = (value, j, d)
    finals = [(best[(c, 0, s)][0], s, c) for c in counts for s in range(1, top + 1) if (c, 0, s) in best]
    if not finals:
        return None
    value, s, c = min(finals)
    bounds, degs, i = [], [], 0
    while i < L:
        _, j, d = best[(c, i, s)]
        bounds.append((i, j))
        degs.append(d)
        i, s, c = j, s - d, (c - 1 if counting else 0)
    return PiperChoice(value, tuple(bounds), tuple(degs))


class Piper(Baseline):
    """Piper's DP over layer ranges and data-parallel degrees (no tensor parallelism)."""

    name = "piper"
    source = "Piper (NeurIPS'21) algo.cpp: DP over downsets and data-parallel degrees with its memory bound"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        choice = piper_dp(problem, deadline)
        if choice is not None:
            yield choice.bounds, split_groups(rank_devices(problem), choice.degrees)
