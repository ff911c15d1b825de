"""A mixed-integer linear model in rows, handed to HiGHS or CP-SAT: :class:`LinearModel`.

The exact models of :mod:`pipeplan.solver.exact` (the position model of
:mod:`~pipeplan.solver.exact.class_model`, the version-2 model of
:mod:`~pipeplan.solver.exact.virtual_model`) build their variables and rows here, block
by block, and each solves it with its own options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

import numpy as np


@dataclass
class LinearModel:
    """``min x[objective]`` over bounded, possibly integer, columns and ranged rows.

    Examples
    --------
    >>> m = LinearModel()
    >>> t, x = m.var("T"), m.var("x", 0, 3, integer=True)
    >>> m.objective = t
    >>> m.row({t: 1.0, x: -2.0}, 0.0)          # T >= 2 x
    >>> m.row([(x, 1.0), (x, 1.0)], 2.0, 6.0)  # 2 <= 2 x <= 6: a column twice is summed
    >>> list(m.rows())
    [([0, 1], [1.0, -2.0], 0.0, inf), ([1], [2.0], 2.0, 6.0)]
    >>> m.size
    (2, 2, 3)
    """

    names: list[str] = field(default_factory=list)
    """Each column's name."""
    lower: list[float] = field(default_factory=list)
    """Each column's lower bound."""
    upper: list[float] = field(default_factory=list)
    """Each column's upper bound (``inf``: none)."""
    integer: list[bool] = field(default_factory=list)
    """Whether each column is integer."""
    row_lower: list[float] = field(default_factory=list)
    """Each row's lower bound (``-inf``: none)."""
    row_upper: list[float] = field(default_factory=list)
    """Each row's upper bound (``inf``: none)."""
    starts: list[int] = field(default_factory=lambda: [0])
    """Where each row's entries start in :attr:`index` and :attr:`value` (one more entry than rows)."""
    index: list[int] = field(default_factory=list)
    """The column of each entry, row by row."""
    value: list[float] = field(default_factory=list)
    """The coefficient of each entry."""
    objective: int = 0
    """The column minimised."""
    target_terms: list[tuple[int, int, float]] = field(default_factory=list)
    """``(row, column, constant)``: entries whose coefficient is ``constant - target``, set for each target of a
    feasibility check (:class:`pipeplan.solver.exact.virtual_targets.TargetLP`)."""

    def var(self, name: str, lower: float = 0.0, upper: float = math.inf, integer: bool = False) -> int:
        """A new column; returns its index."""
        self.names.append(name)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.names) - 1

    def row(self, terms: Mapping[int, float] | Iterable[tuple[int, float]], lower: float = -math.inf,
            upper: float = math.inf) -> None:
        """Add ``lower <= sum(a * x[c]) <= upper`` over ``terms``, ``{c: a}`` or ``(c, a)`` pairs.

        A column given twice gets the sum of its coefficients; a zero coefficient is left out.
        """
        merged: dict[int, float] = {}
        for column, coef in (terms.items() if isinstance(terms, Mapping) else terms):
            merged[column] = merged.get(column, 0.0) + coef
        for column, coef in merged.items():
            if coef != 0.0:
                self.index.append(column)
                self.value.append(float(coef))
        self.starts.append(len(self.index))
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def rows(self) -> Iterator[tuple[list[int], list[float], float, float]]:
        """Each row as ``(columns, coefficients, lower, upper)``."""
        for r, (lo, hi) in enumerate(zip(self.row_lower, self.row_upper)):
            a, b = self.starts[r], self.starts[r + 1]
            yield self.index[a:b], self.value[a:b], lo, hi

    @property
    def size(self) -> tuple[int, int, int]:
        """``(columns, rows, nonzeros)``."""
        return len(self.names), len(self.row_lower), len(self.index)

    def highs_lp(self):
        """The model as a ``highspy.HighsLp`` (row-wise matrix, infinite bounds as HiGHS's infinity)."""
        import highspy

        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.names), len(self.row_lower)
        cost = np.zeros(len(self.names))
        cost[self.objective] = 1.0
        lp.col_cost_ = cost
        lp.col_lower_ = np.array(self.lower, dtype=float)
        lp.col_upper_ = np.array([u if math.isfinite(u) else inf for u in self.upper], dtype=float)
        lp.row_lower_ = np.array([v if math.isfinite(v) else -inf for v in self.row_lower], dtype=float)
        lp.row_upper_ = np.array([v if math.isfinite(v) else inf for v in self.row_upper], dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(self.starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(self.index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(self.value, dtype=float)
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                           for b in self.integer]
        return lp
