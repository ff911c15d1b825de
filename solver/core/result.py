"""The one record every solver returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.termination import STOPPED_BY

STATUSES = ("optimal", "feasible", "infeasible", "timeout-no-solution")
"""``optimal`` only when proved; ``feasible`` for a fitting plan without proof."""


@dataclass(frozen=True)
class TracePoint:
    """One step of a solver's anytime progress."""

    time: float
    """Seconds since the solver started."""
    incumbent: float | None
    """Best simulated iteration time so far (``None`` before the first plan)."""
    bound: float | None
    """Best proved lower bound so far (``None`` if none)."""


@dataclass(frozen=True)
class SolverResult:
    """A solver's answer and how much to trust it.

    ``gap = (iteration_time - lower_bound) / iteration_time`` when both exist.
    """

    name: str
    """Solver name in the registry."""
    status: str
    """One of :data:`STATUSES`."""
    plan: Plan | None
    """The best fitting plan found, or ``None``."""
    iteration_time: float | None
    """The plan's iteration time under the simulator (seconds)."""
    lower_bound: float | None
    """A proved lower bound on the best iteration time in the search space, or ``None``."""
    wall_time: float
    """Seconds the solver ran."""
    seed: int
    """The seed it ran with (same seed, same plan)."""
    trace: tuple[TracePoint, ...] = ()
    """Anytime progress: incumbents and bounds over time."""
    message: str = ""
    """Why it is infeasible or stopped early, in words; empty otherwise."""
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    """Solver-specific facts (backend, iterations, cuts added, ...)."""
    stopped_by: str = "complete"
    """What ended the search, one of :data:`pipeplan.solver.core.termination.STOPPED_BY`; only
    ``time`` and ``interrupt`` make the plan depend on the machine."""
    budget: float | None = None
    """The work budget it ran with (in the solver's ``budget_unit``), or ``None`` for a
    solver without one (it runs its whole search)."""
    algorithm: str = ""
    """The algorithm that ran (:attr:`pipeplan.solver.core.algorithm.Solver.name`): the solver's own
    name, or the one its search space runs (``cpsat`` on ``zbv`` runs ``virtual-bnb``)."""
    plan_by: str = ""
    """What found the plan: the algorithm itself or one of its phases (``group-search``,
    ``configuration walk``, a baseline, ...); empty without a plan."""
    bound_by: str = ""
    """What proved the lower bound (``class bound``, ``configuration walk``, ``cpsat model``,
    ``virtual-bnb``, ...); empty without a bound."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.stopped_by not in STOPPED_BY:
            raise ValueError(f"stopped_by must be one of {STOPPED_BY}, got {self.stopped_by!r}")

    @property
    def gap(self) -> float | None:
        """Relative gap between the plan and the bound (0 when proved optimal)."""
        if self.iteration_time is None or self.lower_bound is None or self.iteration_time <= 0:
            return None
        return max(0.0, (self.iteration_time - self.lower_bound) / self.iteration_time)

    def record(self) -> dict[str, Any]:
        """The ``"solver"`` object written into a plan file."""
        return {
            "name": self.name,
            "status": self.status,
            "iteration_time": self.iteration_time,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "wall_time": self.wall_time,
            "seed": self.seed,
            "stopped_by": self.stopped_by,
            "budget": self.budget,
            "algorithm": self.algorithm,
            "plan_by": self.plan_by,
            "bound_by": self.bound_by,
            "message": self.message,
            "trace": [[p.time, p.incumbent, p.bound] for p in self.trace],
            **({"details": self.details} if self.details else {}),
        }

    def plan_with_record(self) -> Plan:
        """The plan carrying this record in its ``"solver"`` field."""
        if self.plan is None:
            raise ValueError(f"solver {self.name} found no plan: {self.message}")
        return self.plan.with_extra(solver=self.record())
