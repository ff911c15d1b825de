"""Lower bounds on the iteration time of version-2 plans (spec section 7), with their proofs.

Notation (spec 7.3): stage ``s`` on group ``g = g(s)`` with ``r_g`` devices of smallest
speed ``v_g``; microbatch ``k`` of ``n_k`` samples, ``q_k = ceil(n_k / r_g)``;
``TF_s(k)``, ``TB_s(k)`` (recompute included), ``TI_s(k)``, ``TW_s(k)`` as in 7.3, so
``TI + TW = TB``.  ``X_s(k)`` is the forward transfer from ``s`` to ``s+1`` and
``Y_s(k)`` the backward one from ``s`` to ``s-1`` (``lat + n_k * cut / (min(r) * bw)``;
0 when both stages are on one group).  ``A_s(k) = TB_s(k)`` for a schedule of whole
backwards (``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``looped-bfs``) and ``TI_s(k)``
for a split one (``interleaved-zb``, ``zbv``); ``Z_s(k) = TW_s(k)`` for a split
schedule, else 0.  Every stage uses the same split (spec 7.2), so microbatch ``k`` of
stage ``s`` waits exactly for microbatch ``k`` of its neighbours.

The bounds hold for *any* program order that satisfies the dependencies, hence for
every named schedule and every ``v``: they use only that a group runs one action at a
time, that its all-reduce and step follow its last action, and the dependencies of 7.3.
A FIFO link only delays a transfer past its own duration, never shortens it.

Term 1, group work (:func:`group_terms`).  Group ``g`` runs every action of its stages
one after another, so its last action ends no earlier than its first action's start plus
``W_g = sum over its stages s and microbatches k of (TF_s(k) + TB_s(k))`` (a ``B``, or an
``I`` and its ``W``, whose durations add up to ``TB``).  Its first action is a forward
(a ``B`` or ``I`` needs its ``F``, a ``W`` its ``I``), of some stage ``s`` and microbatch
``k``, which cannot start before microbatch ``k`` has gone forward through stages
``0 .. s-1``: ``H_s(k) = sum over t < s of (TF_t(k) + X_t(k))``.  Then
``T >= min over (s on g, k) of H_s(k) + W_g + AR_g + STEP_g``, since the iteration ends
no earlier than any group's last action plus its all-reduce and step.

Term 2, one microbatch's critical path (:func:`path_terms`).  Microbatch ``k``'s
backward at stage ``s`` (its ``B`` or ``I``) ends no earlier than
``P_s(k) = H_{S-1}(k) + TF_{S-1}(k) + sum over t >= s of A_t(k) + sum over t > s of Y_t(k)``
(the forwards through every stage, the last stage's backward after its own forward, then
each backward after the transfer from the stage above).  Its ``W`` (split schedules)
follows its ``I``, and group ``g(s)`` all-reduces and steps after that, so
``T >= P_s(k) + Z_s(k) + AR_{g(s)} + STEP_{g(s)}`` for every ``s`` and ``k``.

Term 3, work over the whole cluster (:func:`space_bound`), for every plan of the search
space at once.  A device of group ``g`` runs each action for ``(a + b*q) / v_g`` seconds
with ``v_g`` at most its own speed ``v_d``, so in ``T`` seconds it does at most
``T * v_d`` units of reference work.  Every layer runs, for each of the ``m``
microbatches, its forward and backward constants ``a_f + a_b`` on at least one device,
its per-sample parts ``(b_f + b_b) * q`` on each of its stage's ``r`` devices with
``r*q >= n_k`` (``B`` samples over the microbatches), and its step once on each device
of its group.  Hence ``T * sum of v_d >= sum over layers of (m*(a_f + a_b) + B*(b_f + b_b) + step)``.

Memory: a group whose state ``state_factor * P_g`` alone exceeds one of its devices'
memory fits no stash (stashes are ``>= 0``): :func:`state_overflows` rules the candidate
out without simulating it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.space.virtual_space import Candidate, stage_groups


@dataclass(frozen=True)
class StageTimes:
    """Per-microbatch durations of one stage (spec 7.3), in seconds."""

    forward: tuple[float, ...]
    """``TF_s(k)``."""
    backward: tuple[float, ...]
    """``A_s(k)``: ``TB_s(k)``, or ``TI_s(k)`` under a split schedule."""
    weight: tuple[float, ...]
    """``Z_s(k)``: ``TW_s(k)`` under a split schedule, else 0."""
    send_forward: tuple[float, ...]
    """``X_s(k)`` to stage ``s+1`` (0 for the last stage or the same group)."""
    send_backward: tuple[float, ...]
    """``Y_s(k)`` to stage ``s-1`` (0 for stage 0 or the same group)."""


def _ceil_div(n: int, r: int) -> int:
    return -(-n // r)


class Bounder:
    """The bounds of the module docstring for many candidates of one problem.

    Stage durations, transfers and group tails are remembered per layer range and
    device group, which candidates share by the thousand.
    """

    def __init__(self, problem: PlanningProblem) -> None:
        self.problem = problem
        self.speed = {d.id: d.speed for d in problem.cluster.devices}
        self.memory = {d.id: d.memory for d in problem.cluster.devices}
        self.split_backward = problem.needs.split_backward
        self.zeros = tuple(0.0 for _ in problem.split)
        self._stages: dict = {}
        self._sends: dict = {}
        self._tails: dict = {}
        self._owners: dict = {}

    def owners(self, candidate: Candidate) -> tuple[int, ...]:
        """The group of each stage."""
        key = (len(candidate.groups), len(candidate.bounds))
        if key not in self._owners:
            self._owners[key] = stage_groups(self.problem.schedule, candidate)
        return self._owners[key]

    def durations(self, lo: int, hi: int, devices: tuple[str, ...], recompute: bool) -> tuple[tuple[float, ...], ...]:
        """``(TF, A, Z)`` per microbatch of layers ``lo .. hi-1`` on ``devices``."""
        key = (lo, hi, devices, recompute)
        found = self._stages.get(key)
        if found is None:
            graph = self.problem.graph
            v, r = min(self.speed[d] for d in devices), len(devices)
            af, bf, ab, bb = graph.range_time(lo, hi)
            aw, bw = graph.range_weight_time(lo, hi) if self.split_backward else (0.0, 0.0)
            qs = [_ceil_div(n, r) for n in self.problem.split]
            fwd = tuple((af + bf * q) / v for q in qs)
            rec = fwd if recompute else self.zeros
            back = tuple(((ab - aw) + (bb - bw) * q) / v + x for q, x in zip(qs, rec))
            weight = tuple((aw + bw * q) / v for q in qs) if self.split_backward else self.zeros
            found = self._stages[key] = (fwd, back, weight)
        return found

    def send(self, sender: tuple[str, ...], receiver: tuple[str, ...], cut: int) -> tuple[float, ...]:
        """Each microbatch's transfer across the cut after layer ``cut`` (0 on one group)."""
        if sender == receiver:
            return self.zeros
        key = (sender, receiver, cut)
        found = self._sends.get(key)
        if found is None:
            cluster = self.problem.cluster
            lat = cluster.lat(sender, receiver)
            rate = min(len(sender), len(receiver)) * cluster.bw(sender, receiver)
            cut_bytes = self.problem.graph.cut_bytes(cut)
            found = self._sends[key] = tuple(lat + n * cut_bytes / rate for n in self.problem.split)
        return found

    def times(self, candidate: Candidate) -> list[StageTimes]:
        """Every stage's :class:`StageTimes`."""
        owners, groups, count = self.owners(candidate), candidate.groups, len(candidate.bounds)
        out = []
        for s, ((lo, hi), rc) in enumerate(zip(candidate.bounds, candidate.recompute)):
            devices = groups[owners[s]]
            fwd, back, weight = self.durations(lo, hi, devices, rc)
            ahead = self.send(devices, groups[owners[s + 1]], hi - 1) if s < count - 1 else self.zeros
            behind = self.send(devices, groups[owners[s - 1]], lo - 1) if s > 0 else self.zeros
            out.append(StageTimes(fwd, back, weight, ahead, behind))
        return out

    def _group(self, devices: tuple[str, ...], ranges: tuple[tuple[int, int], ...]) -> tuple[float, float]:
        """``(AR_g + STEP_g, P_g)`` of a group holding ``ranges``."""
        key = (devices, ranges)
        found = self._tails.get(key)
        if found is None:
            graph, cluster = self.problem.graph, self.problem.cluster
            params = sum(graph.range_sum("params", lo, hi) for lo, hi in ranges)
            step = sum(graph.range_step(lo, hi) for lo, hi in ranges)
            r = len(devices)
            allreduce = 2 * (r - 1) * (cluster.lat(devices) + params / (r * cluster.bw(devices))) if r > 1 else 0.0
            found = self._tails[key] = (allreduce + step / min(self.speed[d] for d in devices), params)
        return found

    def _groups(self, candidate: Candidate) -> list[tuple[float, float]]:
        owners = self.owners(candidate)
        return [self._group(devices, tuple(b for b, o in zip(candidate.bounds, owners) if o == g))
                for g, devices in enumerate(candidate.groups)]

    def tails(self, candidate: Candidate) -> list[float]:
        """``AR_g + STEP_g`` of each group (spec 7.3)."""
        return [tail for tail, _ in self._groups(candidate)]

    def bound(self, candidate: Candidate) -> float:
        """The largest of terms 1 and 2 (:func:`candidate_bound`)."""
        owners, times, tails = self.owners(candidate), self.times(candidate), self.tails(candidate)
        return max(max(group_terms(owners, times, tails)), max(path_terms(owners, times, tails)))

    def overflows(self, candidate: Candidate) -> bool:
        """Whether some group's training state alone exceeds one of its devices' memory (:func:`state_overflows`)."""
        factor = self.problem.state_factor
        return any(factor * params > min(self.memory[d] for d in devices)
                   for (_, params), devices in zip(self._groups(candidate), candidate.groups))


def stage_times(problem: PlanningProblem, candidate: Candidate) -> list[StageTimes]:
    """Every stage's :class:`StageTimes` for ``candidate`` under the problem's schedule."""
    return Bounder(problem).times(candidate)


def group_tails(problem: PlanningProblem, candidate: Candidate) -> list[float]:
    """``AR_g + STEP_g`` of each group (spec 7.3)."""
    return Bounder(problem).tails(candidate)


def _heads(times: list[StageTimes]) -> list[list[float]]:
    """``H_s(k)``: the forward chain of microbatch ``k`` up to the start of stage ``s``."""
    heads = [[0.0] * len(times[0].forward)]
    for t in times[:-1]:
        heads.append([h + f + x for h, f, x in zip(heads[-1], t.forward, t.send_forward)])
    return heads


def group_terms(owners: tuple[int, ...], times: list[StageTimes], tails: list[float]) -> list[float]:
    """Term 1 of the module docstring, per group: ``min H + W_g + AR_g + STEP_g`` (``owners``: each stage's group)."""
    heads = _heads(times)
    terms = []
    for g in range(len(tails)):
        mine = [s for s, o in enumerate(owners) if o == g]
        work = math.fsum(f + b + w for s in mine for f, b, w in zip(times[s].forward, times[s].backward,
                                                                     times[s].weight))
        terms.append(min(min(heads[s]) for s in mine) + work + tails[g])
    return terms


def path_terms(owners: tuple[int, ...], times: list[StageTimes], tails: list[float]) -> list[float]:
    """Term 2 of the module docstring, per microbatch: the largest ``P_s(k) + Z_s(k) + AR + STEP`` over ``s``."""
    last = len(times) - 1
    heads = _heads(times)
    terms = []
    for k in range(len(times[0].forward)):
        done = heads[last][k] + times[last].forward[k]  # P: end of the backward at stage s
        best = 0.0
        for s in range(last, -1, -1):
            if s < last:
                done += times[s + 1].send_backward[k]
            done += times[s].backward[k]
            best = max(best, done + times[s].weight[k] + tails[owners[s]])
        terms.append(best)
    return terms


def candidate_bound(problem: PlanningProblem, candidate: Candidate) -> float:
    """The largest of terms 1 and 2: no plan of ``candidate`` runs faster (see the module docstring).

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 2), 0, 0, 0), Layer("b", (0, 1), (0, 2), 0, 0, 0)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
    >>> p = PlanningProblem(g, c, global_batch=2, microbatches=2, schedule="looped-bfs")
    >>> candidate_bound(p, Candidate(2, (("d0",),), ((0, 1), (1, 2)), (False, False)))  # 2 x (1 + 2) x 2 s of work
    12.0
    """
    return Bounder(problem).bound(candidate)


def space_bound(problem: PlanningProblem) -> float:
    """Term 3 of the module docstring: a bound on every plan of the problem's search space."""
    layers = problem.graph.layers
    m, batch = problem.microbatches, problem.global_batch
    work = math.fsum(m * (l.fwd[0] + l.bwd[0]) + batch * (l.fwd[1] + l.bwd[1]) + l.step_time for l in layers)
    return work / math.fsum(d.speed for d in problem.cluster.devices)


def state_overflows(problem: PlanningProblem, candidate: Candidate) -> bool:
    """Whether some group's training state alone exceeds one of its devices' memory (no plan of it fits)."""
    return Bounder(problem).overflows(candidate)
