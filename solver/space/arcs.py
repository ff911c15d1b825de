"""Candidate stages (*arcs*) and the table of them that the exact solvers search.

Configurations and symmetry
---------------------------
Devices with the same ``(speed, memory)`` form a *class*.  A stage's timing and memory
depend on its devices only through the class counts (its *composition*): ``r`` is their
sum, ``v_s`` the smallest speed, the capacity the smallest memory.  Only transfers and
all-reduces depend on which servers hold the devices, and the lower bound uses
optimistic values for those.  A model decision is therefore an *arc*
``(lo, hi, tau, option)``: layers ``[lo, hi)``, ``tau = min(later stages, M)``, and an
option = (composition, recompute).  A configuration is a path of arcs from layer 0 to
layer ``L``; it is mapped to concrete device ids afterwards by
:func:`pipeplan.solver.space.placements.placements`, which enumerates placements up to server
symmetry (identical devices on one server, identical servers) and simulates each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.solver.space.device_classes import DeviceClass
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.schedules.schedule import schedule_for, stage_actions
from pipeplan.solver.space.stage_options import Option


@dataclass(frozen=True)
class Arc:
    """One candidate stage: layers ``[lo, hi)``, ``tau`` later stages (capped), an option."""

    lo: int
    hi: int
    tau: int
    option: int
    busy_path: float
    """Standalone ``c1``: fastest conceivable head + busy + max(all-reduce, tail)."""
    pass_cost: float
    """``u'``: one microbatch through the stage, its outgoing cut, and ``AR_0`` if first."""
    pivot_extra: float
    """``delta``: the pivot's critical ops beyond ``u``."""
    work: float = 0.0
    """``busy * r * v / V``: the stage's share of the work bound (``V`` = all speeds summed)."""
    busy: float = 0.0
    """All the stage's ops, one after the other."""
    allreduce: float = 0.0
    """Lower bound on ``AR_s``."""
    head_f: float = 0.0
    """``F0`` and its forward transfer: what the stage adds to a later stage's head."""
    head_fb: float = 0.0
    """``head_f`` plus ``B_{M-1}`` and the backward transfer reaching this stage."""
    standalone: float = 0.0
    """A bound on every configuration holding this arc (used to prune it)."""
    pivot_ar: float = 0.0
    """The arc as the pivot of term 2b: ``u + its outgoing transfers + delta + AR`` (no ``AR_0``)."""
    pivot2_extra: float = 0.0
    """Term 2c: the pivot's ops on the two-round-trip path beyond ``u``, plus its cut crossed twice more."""
    pivot2_ar: float = 0.0
    """Term 2c ending in the pivot's all-reduce: ``u + 4 transfers + delta2 + AR``."""
    chain: float = 0.0
    """Term 2d: ``TF(n_last)`` and the forward transfer of ``F_{M-1}`` as it passes through the stage."""
    pivot_fwd: float = 0.0
    """Term 2d as the pivot: its ops on the path from ``F_0`` through ``F_{M-1}``, minus ``TF(n_last)``."""
    end_ar: float = 0.0
    """Term 2d as the end stage: ``F_{M-1}``, its round trip's own cut, ``B_{M-1}`` (GPipe: every B) and ``AR``."""



ARC_FIELDS = ("lo", "hi", "tau", "option", "busy_path", "pass_cost", "pivot_extra", "work", "busy", "allreduce",
              "head_f", "head_fb", "standalone", "pivot_ar", "pivot2_extra", "pivot2_ar", "chain", "pivot_fwd",
              "end_ar")


@dataclass
class ExactData:
    """Everything the models need, as plain numbers (one numpy column per arc field)."""

    problem: PlanningProblem
    classes: tuple[DeviceClass, ...]
    options: tuple[Option, ...]
    table: dict[str, np.ndarray]
    """Column ``name`` of every arc, for each name of :data:`ARC_FIELDS`."""
    max_tau: int
    stage_limit: int
    static_bound: float
    """A lower bound needing no model: ``max_l min over arcs covering l`` of their standalone bound."""
    complete: bool = True
    """Whether every candidate arc was enumerated (the time limit may stop it early)."""
    _arcs: list[Arc] | None = None

    def __len__(self) -> int:
        return len(self.table["lo"])

    @property
    def arcs(self) -> list[Arc]:
        """The arcs as objects (built on first use)."""
        if self._arcs is None:
            cols = [self.table[name].tolist() for name in ARC_FIELDS]
            self._arcs = [Arc(*row) for row in zip(*cols)]
        return self._arcs

    def covering(self) -> list[list[int]]:
        """Arc indices covering each layer."""
        lo, hi = self.table["lo"], self.table["hi"]
        return [np.flatnonzero((lo <= layer) & (hi > layer)).tolist() for layer in range(len(self.problem.graph))]



def tau_ops(schedule: str, m: int, tau: int):
    # Under 1F1B the list depends on the stage only through w = min(S-1-s, m) = min(tau, m).
    return stage_actions(schedule, m, 0, tau + 1)



def two_round_trips(schedule: str, m: int, tau: int) -> bool:
    """Whether a pivot with ``tau`` later stages runs ``F_{M-1}`` after ``B_0`` (term 2c applies).

    Under 1F1B with ``w = tau <= M - 2`` warm-up forwards, ``F_{w+1} .. F_{M-1}`` follow
    ``B_0``; under GPipe, or with ``w >= M - 1``, every forward precedes ``B_0``.
    """
    return schedule_for(schedule).warmup_per_later_stage and tau <= m - 2
