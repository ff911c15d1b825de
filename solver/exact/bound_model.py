"""The lower-bound model as plain rows, which either backend (MILP or CP-SAT) builds, and what a backend offers.

Model size: each per-layer sum above is an auxiliary variable defined by differences
from layer to layer (``C_l = C_{l-1} + sum_{lo=l} c x - sum_{hi=l} c x``), so every
arc appears in O(1) rows per term; the relaxation is the same as with the expanded
rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from pipeplan.solver.space.arcs import ExactData
from pipeplan.solver.core.termination import WorkBudget


@dataclass(frozen=True)
class CountRow:
    """``sum coef * x[arc] (sense) rhs`` with integer coefficients."""

    terms: tuple[tuple[int, int], ...]
    sense: str
    """``"<="`` or ``"=="``."""
    rhs: int



@dataclass(frozen=True)
class TimeRow:
    """``sum coef * aux (sense) sum seconds * x[arc]``: aux are time variables (``T``, ``D``, ...).

    ``aux`` holds ``(name, integer coefficient)``; ``terms`` holds ``(arc, seconds)``;
    ``sense`` is ``">="`` or ``"=="``.  A backend that floors the seconds (CP-SAT) keeps
    every ``>=`` row valid and every ``==`` row an exact definition of its aux variable.
    """

    aux: tuple[tuple[str, int], ...]
    terms: tuple[tuple[int, float], ...]
    sense: str = ">="



SIGNED_AUX = ("Ce", "Cs", "Cq")
"""Prefixes of the aux variables of :func:`model_rows` that may be negative (term 2c's relaxed sums)."""


def _balance(inflow: list[int], outflow: list[int]) -> CountRow:
    return CountRow(tuple((i, 1) for i in inflow) + tuple((i, -1) for i in outflow), "==", 0)


def model_rows(data: ExactData) -> tuple[list[CountRow], list[TimeRow]]:
    """The lower-bound model as plain rows, for either backend.

    Count rows: a path of arcs from layer 0 to layer ``L`` whose ``tau`` labels count the
    later stages (capped at ``max_tau``), at most ``stage_limit`` stages, and at most
    the available devices of each class.  Time rows: terms 1, 2 (2b, 2c) and 4 of
    :mod:`pipeplan.solver.bounds.terms`, with auxiliary time variables so that each arc appears in O(1) rows per
    term: ``C{k}_l = sum over arcs covering l of c_k x`` (defined by differences from
    layer to layer), ``H{k}_l = sum over arcs ending at or before l of h_k x``,
    ``R_l = sum over arcs starting after l of u' x`` (defined from the last layer down);
    term 2c reuses ``R_l`` twice (``E >= Ce_l + R_l``, ``T >= U + E``).
    """
    L, tab = len(data.problem.graph), data.table
    n = len(data)
    lo, hi, tau, opt = (tab[k].tolist() for k in ("lo", "hi", "tau", "option"))
    rows: list[CountRow] = [CountRow(tuple((i, 1) for i in range(n) if lo[i] == 0), "==", 1)]
    starts: dict[tuple[int, int], list[int]] = {}  # (layer, label) -> arcs starting there
    ends: dict[tuple[int, int], list[int]] = {}  # (layer, label) -> arcs ending there
    by_lo: list[list[int]] = [[] for _ in range(L + 1)]
    by_hi: list[list[int]] = [[] for _ in range(L + 1)]
    for i in range(n):
        starts.setdefault((lo[i], tau[i]), []).append(i)
        ends.setdefault((hi[i], tau[i]), []).append(i)
        by_lo[lo[i]].append(i)
        by_hi[hi[i]].append(i)
    capped = data.problem.needs.warmup_per_later_stage and data.max_tau < data.stage_limit - 1
    for b in range(1, L):
        if data.problem.needs.forwards_first:
            rows.append(_balance(ends.get((b, 0), []), starts.get((b, 0), [])))
            continue
        for label in range(0, data.max_tau + 1):
            inflow = ends.get((b, label + 1), [])
            outflow = list(starts.get((b, label), []))
            if capped and label == data.max_tau - 1:
                outflow += starts.get((b, data.max_tau), [])  # a capped stage may follow a capped one
            elif capped and label == data.max_tau:
                continue
            rows.append(_balance(inflow, outflow))
    rows.append(CountRow(tuple((i, 1) for i in range(n)), "<=", data.stage_limit))
    comps = [o.composition for o in data.options]
    for c, cls in enumerate(data.classes):
        terms = tuple((i, comps[opt[i]][c]) for i in range(n) if comps[opt[i]][c])
        rows.append(CountRow(terms, "<=", cls.count))
    times: list[TimeRow] = []
    cover = {"Cb": tab["busy"].tolist(), "Ca": (tab["busy"] + tab["allreduce"]).tolist(),
             "Cd": tab["pivot_extra"].tolist(), "Cr": tab["pivot_ar"].tolist(),
             "Ce": tab["pivot2_extra"].tolist(), "Cs": tab["pivot2_ar"].tolist(),
             "Cq": tab["pivot_fwd"].tolist(), "Cz": tab["end_ar"].tolist()}
    heads = {"Hf": tab["head_f"].tolist(), "Hb": tab["head_fb"].tolist(), "G": tab["chain"].tolist()}
    for name, c in cover.items():  # C_l - C_{l-1} = sum_{lo=l} c x - sum_{hi=l} c x
        for layer in range(L):
            aux = ((f"{name}{layer}", 1),) + (((f"{name}{layer - 1}", -1),) if layer else ())
            terms = tuple((i, c[i]) for i in by_lo[layer]) + tuple((i, -c[i]) for i in by_hi[layer])
            times.append(TimeRow(aux, terms, "=="))
    for name, h in heads.items():  # H_l - H_{l-1} = sum_{hi=l} h x, H_0 = 0
        for layer in range(1, L):
            aux = ((f"{name}{layer}", 1),) + (((f"{name}{layer - 1}", -1),) if layer > 1 else ())
            times.append(TimeRow(aux, tuple((i, h[i]) for i in by_hi[layer]), "=="))
    pass_cost = tab["pass_cost"].tolist()
    for layer in range(L - 2, -1, -1):  # R_l - R_{l+1} = sum_{lo=l+1} pass_cost x, R_{L-1} = 0
        aux = ((f"R{layer}", 1),) + (((f"R{layer + 1}", -1),) if layer < L - 2 else ())
        times.append(TimeRow(aux, tuple((i, pass_cost[i]) for i in by_lo[layer + 1]), "=="))
    for layer in range(L):
        hf = ((f"Hf{layer}", -1),) if layer else ()
        rr = ((f"R{layer}", -1),) if layer < L - 1 else ()
        times.append(TimeRow((("T", 1), (f"Cr{layer}", -1)) + hf + rr, ()))  # term 2b: pivot + all-reduce
        rr2 = ((f"R{layer}", -2),) if layer < L - 1 else ()
        times.append(TimeRow((("T", 1), (f"Cs{layer}", -1)) + hf + rr2, ()))  # term 2c, ending in the all-reduce
        times.append(TimeRow((("E", 1), (f"Ce{layer}", -1)) + rr, ()))  # term 2c: second trip + pivot's ops
    for layer in range(L - 1, -1, -1):  # term 2d: Z_l = Cz_l + R_l + G_l, ZM_l = max over l' >= l of Z_l'
        rr = ((f"R{layer}", -1),) if layer < L - 1 else ()
        gg = ((f"G{layer}", -1),) if layer else ()
        times.append(TimeRow(((f"ZM{layer}", 1), (f"Cz{layer}", -1)) + rr + gg, ()))
        if layer < L - 1:
            times.append(TimeRow(((f"ZM{layer}", 1), (f"ZM{layer + 1}", -1)), ()))
        hf = ((f"Hf{layer}", -1),) if layer else ()
        g_back = ((f"G{layer}", 1),) if layer else ()
        times.append(TimeRow((("T", 1), (f"Cq{layer}", -1), (f"ZM{layer}", -1)) + hf + rr + g_back, ()))
    for layer in range(L):
        hb = ((f"Hb{layer}", -1),) if layer else ()
        hf = ((f"Hf{layer}", -1),) if layer else ()
        times.append(TimeRow((("T", 1), (f"Cb{layer}", -1)) + hb, ()))  # head + busy + tail
        times.append(TimeRow((("T", 1), (f"Ca{layer}", -1)) + hf, ()))  # head + busy + all-reduce
        times.append(TimeRow((("D", 1), (f"Cd{layer}", -1)), ()))  # the pivot's extra ops
    times.append(TimeRow((("T", 1), ("D", -1)), tuple((i, c) for i, c in enumerate(tab["pass_cost"].tolist()))))
    times.append(TimeRow((("T", 1), ("E", -1)), tuple((i, c) for i, c in enumerate(tab["pass_cost"].tolist()))))
    times.append(TimeRow((("T", 1),), tuple((i, c) for i, c in enumerate(tab["work"].tolist()))))
    return [r for r in rows if r.terms or r.rhs], times



class LowerBoundModel(Protocol):
    """What a backend (MILP or CP-SAT) offers the cut loop."""

    budget: WorkBudget | None
    """Its work budget over all the solves of the loop, or ``None`` (it runs on the clock alone)."""

    def hint(self, arc_ids: Sequence[int]) -> None:
        """Warm-start the next solve from a configuration (a backend without hints ignores it)."""
        ...

    def solve(self, cutoff: float, time_limit: float) -> tuple[str, list[int] | None, float | None]:
        """Minimise the bound subject to ``T <= cutoff``.

        Returns ``(status, arc ids or None, proved bound or None)`` with status
        ``"optimal"``, ``"feasible"`` (stopped early with a solution), ``"infeasible"``
        or ``"unknown"`` (stopped early without one).
        """
        ...

    def exclude(self, arc_ids: Sequence[int]) -> None:
        """Add the no-good cut ``sum x[arc_ids] <= len(arc_ids) - 1``."""
        ...
