"""The configuration walk of the exact solvers against brute force, and its bounds when stopped."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.exact import enumeration
from pipeplan.solver.exact.enumeration import _Walk, enumerate_configurations
from pipeplan.solver.bounds.terms import optimistic_time
from pipeplan.solver.exact.data import build_data
from pipeplan.solver.exact.incumbents import greedy_plans
from pipeplan.solver.exact.search import Search as _Search
from pipeplan.solver.exact.search import evaluate as _evaluate
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import Stops, TimeLimit, WorkBudget

from helpers import REL, brute_force, sized_problem

# instances whose greedy plan gives the walk a finite cutoff, so that its tables have bands
BANDED = [(68, 5, 4, "1f1b"), (74, 5, 4, "1f1b"), (64, 6, 3, "gpipe"), (60, 7, 4, "1f1b")]
CASES = [(51, 6, 3, "1f1b"), (52, 6, 4, "gpipe"), (53, 7, 4, "1f1b"), (54, 5, 4, "1f1b"), (55, 7, 3, "gpipe")]


def _search(problem, warm: bool) -> _Search:
    search = _Search(problem, TimeLimit(60).start())
    if warm:  # a poor incumbent, as the baselines give, so that several passes run
        for plan in greedy_plans(problem)[:1]:
            search.offer(plan)
    return search


def _walk(problem, warm: bool, seconds: float = 60.0, cells: float | None = None, seen: Stops | None = None):
    """Run the walk as the exact solvers do: arcs below the incumbent, the static bound raised first
    (what stopped it noted in ``seen``)."""
    seen = seen if seen is not None else Stops()
    search = _search(problem, warm)
    data = build_data(problem, search.cutoff())
    search.raise_bound(data.static_bound)
    budget = WorkBudget(cells, stops=seen) if cells is not None else None
    return search, enumerate_configurations(data, search, TimeLimit(seconds, stops=seen).start(), cells=budget)


class TestEnumerateConfigurations:
    @pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-{c[3]}")
    @pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
    def test_proves_the_brute_force_optimum(self, case, warm):
        seed, layers, devices, schedule = case
        problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule)
        best = brute_force(problem)
        search, walk = _walk(problem, warm)
        assert walk.complete
        if math.isinf(best):
            assert search.best_plan is None
            return
        assert search.best_time == pytest.approx(best, rel=1e-7)
        assert problem.evaluate(search.best_plan).iteration_time == pytest.approx(best, rel=REL)
        for point in search.trace:
            assert point.bound is None or point.bound <= best * (1 + REL)

    def test_warm_start_runs_several_passes(self):
        problem = sized_problem(51, layers=7, devices=4, schedule="1f1b")
        search, walk = _walk(problem, warm=True)
        assert walk.complete and walk.passes >= 2
        assert search.best_time == pytest.approx(brute_force(problem), rel=1e-7)

    @pytest.mark.parametrize("seconds", [0.0, 0.01, 0.05])
    def test_stopped_walk_bound_is_valid(self, seconds):
        """Stopped early, the walk's bound still never exceeds the optimum."""
        problem = sized_problem(56, layers=8, devices=4, schedule="1f1b")
        best = brute_force(problem)
        search, walk = _walk(problem, warm=True, seconds=seconds)
        assert walk.bound <= best * (1 + REL) or walk.complete
        assert search.bound <= best * (1 + REL)

    def test_same_result_twice(self):
        problem = sized_problem(57, layers=7, devices=4, schedule="1f1b")
        plans = []
        for _ in range(2):
            search, _ = _walk(problem, warm=True)
            plans.append(search.best_plan)
        assert plans[0] == plans[1]


class TestTableBudget:
    """The tables' entries are counted work: the walk stops on them, not on the clock."""

    PROBLEM = (56, 8, 4, "1f1b")

    def problem(self) -> PlanningProblem:
        seed, layers, devices, schedule = self.PROBLEM
        return sized_problem(seed, layers=layers, devices=devices, schedule=schedule)

    def test_a_whole_walk_counts_the_shift_table_and_every_rebuild(self):
        problem = self.problem()
        search, walk = _walk(problem, warm=True)
        data = build_data(problem, _search(problem, True).cutoff())
        assert walk.complete
        # at least the shift table and one build of the four plain tables
        assert walk.table_cells >= enumeration.shift_entries(data) + 4 * (math.prod(c.count + 1 for c in data.classes) + 1)
        assert walk.table_cells <= enumeration.DEFAULT_TABLE_CELLS

    def test_a_budget_below_the_shift_table_skips_the_walk(self):
        problem = self.problem()
        data = build_data(problem, _search(problem, True).cutoff())
        seen = Stops()
        _, walk = _walk(problem, warm=True, cells=enumeration.shift_entries(data) - 1, seen=seen)
        assert walk.skipped and walk.prefixes == 0 and walk.table_cells == 0
        assert seen.stopped_by() == "budget"

    def test_a_short_budget_stops_on_it_with_a_valid_bound(self):
        problem = self.problem()
        whole = _walk(problem, warm=True)[1].table_cells
        best = brute_force(problem)
        seen = Stops()
        search, walk = _walk(problem, warm=True, cells=whole // 2, seen=seen)
        assert not walk.complete and walk.table_cells <= whole // 2
        assert seen.stopped_by() == "budget"
        assert search.bound <= best * (1 + REL)

    def test_the_stop_does_not_depend_on_the_clock(self):
        problem = self.problem()
        whole = _walk(problem, warm=True)[1].table_cells
        runs = [_walk(problem, warm=True, cells=whole // 2) for _ in range(2)]
        assert runs[0][1] == runs[1][1]
        assert runs[0][0].best_plan == runs[1][0].best_plan and runs[0][0].bound == runs[1][0].bound


def _many_placements_problem() -> PlanningProblem:
    """Eight identical devices on eight servers with different links: a 3-stage pipeline has 336 placements."""
    graph = LayerGraph.chain("g", [Layer(f"l{i}", (1e-4, 1e-3), (2e-4, 2e-3), 1e6, 1e5, 1e6) for i in range(4)],
                             input_bytes=1e3)
    servers = tuple(Link(1e9 * (k + 1), 1e-6 * (k + 1), f"s{k}") for k in range(8))
    cluster = Cluster("c", servers, Link(5e8, 1e-5), tuple(Device(f"d{k}", f"s{k}", 1.0, 1e12) for k in range(8)))
    return PlanningProblem(graph, cluster, global_batch=8, microbatches=4, schedule="1f1b",
                           allow_replication=False, allow_recompute=False)


class TestPlacementLimit:
    def test_pooled_configuration_ends_the_walk_at_once(self):
        """More placements than PLACEMENT_LIMIT cap the bound; the walk hands over instead of repeating passes."""
        problem = _many_placements_problem()
        search, walk = _walk(problem, warm=True, seconds=600.0)  # a cap far away: the pool, not the clock, ends it
        assert not walk.complete and walk.passes <= 5
        assert search.pool < math.inf and search.bound <= brute_force(problem) * (1 + REL)


class TestEvaluate:
    def _setup(self):
        problem = _many_placements_problem()
        data = build_data(problem)
        config = [i for i, a in enumerate(data.arcs) if (a.lo, a.hi) in ((0, 1), (1, 2), (2, 4))
                  and a.tau == {0: 2, 1: 1, 2: 0}[a.lo]]
        return problem, data, config

    def test_clock_stop_pools_only_when_asked(self):
        problem, data, config = self._setup()
        expired = TimeLimit(0.0).start()
        search = _Search(problem, TimeLimit(60).start())
        assert not _evaluate(data, search, config, expired, pool_on_clock=False)
        assert search.pool == math.inf and search.best_plan is not None  # the first placement still ran
        assert _evaluate(data, search, config, expired)
        assert search.pool == pytest.approx(optimistic_time(data, config))

    def test_placements_beyond_the_limit_are_pooled(self):
        problem, data, config = self._setup()
        search = _Search(problem, TimeLimit(60).start())
        assert _evaluate(data, search, config, TimeLimit(60).start())
        assert search.pool == pytest.approx(optimistic_time(data, config))


def _prepared_walk(problem, prepare: bool = True) -> _Walk:
    """A walk over the arcs below the greedy incumbent, its tables built when ``prepare``."""
    search = _search(problem, warm=True)
    walk = _Walk(build_data(problem, search.cutoff()), search, TimeLimit(60).start())
    if prepare:
        walk.prepare(search.cutoff())
    return walk


def _paths(walk: _Walk, h: int, t: int, left: np.ndarray):
    """Every completion from layer ``h`` with label ``t`` on the devices ``left``: lists of local arc ids."""
    if h == walk.L:
        yield []
        return
    for j in walk.groups.get((h, t), []):
        if (walk.comp[j] <= left).all():
            hi = int(walk.tab["hi"][j])
            for nxt in walk.next_labels(t) if hi < walk.L else (None,):
                for rest in _paths(walk, hi, nxt, left - walk.comp[j]) if nxt is not None else ([],):
                    yield [int(j)] + rest


class TestCompletionTables:
    """The walk's device-aware tables against every completion, listed by brute force."""

    @pytest.mark.parametrize("case", BANDED, ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_tables_are_the_least_over_every_completion(self, case):
        seed, layers, devices, schedule = case
        problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule)
        walk = _prepared_walk(problem)
        data = walk.data
        assert len(walk.edges) == enumeration.DELTA_BANDS - 1  # bands are on for small tables
        tab, checked = walk.tab, 0
        for h in range(walk.L):
            for t in range(data.max_tau + 1):
                for a in range(walk.size):
                    paths = list(_paths(walk, h, t, walk.avail[a]))
                    pass_sums = [sum(tab["pass_cost"][p]) for p in paths]
                    deltas = [max(tab["pivot_extra"][p]) for p in paths]
                    assert walk.best["pass_cost"][h, t, a] == pytest.approx(min(pass_sums, default=math.inf))
                    assert walk.best["pivot_extra"][h, t, a] == pytest.approx(min(deltas, default=math.inf))
                    for k, edge in enumerate(walk.edges):
                        within = [s for s, d in zip(pass_sums, deltas) if d <= edge]
                        assert walk.banded[h, t, a, k] == pytest.approx(min(within, default=math.inf))
                    checked += len(paths)
        assert checked > 0

    def test_no_bands_beyond_the_work_limit(self, monkeypatch):
        monkeypatch.setattr(enumeration, "BAND_WORK_LIMIT", 0)
        problem = sized_problem(61, layers=5, devices=4, schedule="1f1b")
        walk = _prepared_walk(problem)
        assert len(walk.edges) == 0 and walk.banded.shape[-1] == 0

    @pytest.mark.parametrize("bands", [1, 3, 8])
    @pytest.mark.parametrize("case", BANDED, ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_brute_force_optimum_with_and_without_bands(self, case, bands, monkeypatch):
        monkeypatch.setattr(enumeration, "DELTA_BANDS", bands)
        seed, layers, devices, schedule = case
        problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule)
        best = brute_force(problem)
        search, walk = _walk(problem, warm=True)
        assert walk.complete
        if not math.isinf(best):
            assert search.best_time == pytest.approx(best, rel=1e-7)


def _plain_cells(walk: _Walk) -> int:
    """Entries of the four plain tables over every kept arc of ``walk``'s last build."""
    return len(walk.ids) * (walk.size + 1) * 4


class TestTablesPastTheBudget:
    """Past the table budget, the tables come from the undominated arcs: the same values, fewer entries."""

    @pytest.mark.parametrize("case", [BANDED[0], BANDED[1], BANDED[3]], ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_same_tables_from_fewer_arcs(self, case):
        seed, layers, devices, schedule = case
        problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule)
        whole = _prepared_walk(problem)
        assert whole.useful is None
        search = _search(problem, warm=True)
        budget = WorkBudget(_plain_cells(whole) - 1)  # the plain tables do not fit
        pruned = _Walk(build_data(problem, search.cutoff()), search, TimeLimit(60).start(), cells=budget)
        pruned.prepare(search.cutoff())
        assert pruned.useful is not None and pruned.table_cells < _plain_cells(whole)
        assert all(0 < mask.sum() < len(pruned.ids) for mask in pruned.useful.values())
        for name, table in whole.best.items():
            assert np.array_equal(pruned.best[name], table), name
        assert len(pruned.edges) == 0  # no bands on them

    def test_a_build_above_the_full_table_limit_takes_the_undominated_arcs(self, monkeypatch):
        seed, layers, devices, schedule = BANDED[0]
        problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule)
        whole = _prepared_walk(problem)
        monkeypatch.setattr(enumeration, "FULL_TABLE_CELLS", _plain_cells(whole) - 1)  # the budget is ample
        limited = _prepared_walk(problem)
        assert limited.useful is not None and limited.table_cells < _plain_cells(whole)
        for name, table in whole.best.items():
            assert np.array_equal(limited.best[name], table), name

    @pytest.mark.parametrize("case", BANDED[:2], ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_undominated_against_every_pair(self, case):
        seed, layers, devices, schedule = case
        walk = _prepared_walk(sized_problem(seed, layers=layers, devices=devices, schedule=schedule))
        order, starts = walk._lattice_groups()
        tab, n = walk.tab, len(walk.ids)
        same = ((tab["lo"][:, None] == tab["lo"][None, :]) & (tab["hi"][:, None] == tab["hi"][None, :])
                & (tab["tau"][:, None] == tab["tau"][None, :]))
        fewer = (walk.comp[:, None, :] <= walk.comp[None, :, :]).all(axis=2)
        for name in ("pass_cost", "work", "pivot_extra", "standalone"):
            v, index = tab[name], np.arange(n)
            smaller = (v[:, None] < v[None, :]) | ((v[:, None] == v[None, :]) & (index[:, None] < index[None, :]))
            dominated = (same & fewer & smaller).any(axis=0)  # [i, j]: i dominates j
            assert np.array_equal(walk._undominated(v, order, starts), ~dominated), name

    @pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_brute_force_optimum_on_undominated_tables(self, case, monkeypatch):
        """Every build past the budget (the plain tables over all arcs need one entry more than it holds)."""
        seed, layers, devices, schedule = case
        problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule)
        data = build_data(problem)
        plain = len(data) * (math.prod(c.count + 1 for c in data.classes) + 1) * 4
        built = []
        undominated = _Walk._undominated
        monkeypatch.setattr(_Walk, "_undominated", lambda self, *a: built.append(1) or undominated(self, *a))
        best = brute_force(problem)
        search, walk = _walk(problem, warm=False, cells=enumeration.shift_entries(data) + plain - 1)
        assert built and walk.complete
        assert walk.table_cells < enumeration.shift_entries(data) + plain
        if math.isinf(best):
            assert search.best_plan is None
            return
        assert search.best_time == pytest.approx(best, rel=1e-7)
        for point in search.trace:
            assert point.bound is None or point.bound <= best * (1 + REL)


class TestShiftTable:
    def test_one_row_per_composition_in_use(self):
        """Many device classes: rows only for the options' compositions, not for every devices-left vector."""
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (2e-4, 5e-4), (4e-4, 1e-3), 5e6, 5e5, 5e5) for i in range(5)],
                                 input_bytes=1e4)
        devices = tuple(Device(f"d{i}", f"s{i % 2}", 1.0 - 0.05 * i, 1e12) for i in range(12))  # 12 classes
        cluster = Cluster("c", (Link(5e10, 1e-6, "s0"), Link(5e10, 2e-6, "s1")), Link(1e10, 1e-5), devices)
        problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=4, schedule="1f1b",
                                  allow_replication=False, allow_recompute=False, max_stages=3)
        walk = _prepared_walk(problem, prepare=False)
        assert walk.size == 2 ** 12
        assert walk.shift.shape == (12, walk.size)  # one device of each class: 12 compositions
        for row, flat in enumerate(walk.shift_comps):
            comp = walk.avail[flat]
            for a in (0, walk.full_index, int(flat)):
                fits = (walk.avail[a] >= comp).all()
                assert walk.shift[row, a] == (a - flat if fits else walk.size)


class TestShiftEntries:
    """The walk does not start when its shift table would outlast the time left or memory."""

    def _problem(self) -> PlanningProblem:
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (2e-4, 5e-4), (4e-4, 1e-3), 5e6, 5e5, 5e5) for i in range(5)],
                                 input_bytes=1e4)
        devices = tuple(Device(f"d{i}", "s0", 1.0 - 0.05 * i, 1e12) for i in range(6))  # 6 classes
        cluster = Cluster("c", (Link(5e10, 1e-6, "s0"),), Link(1e10, 1e-5), devices)
        return PlanningProblem(graph, cluster, global_batch=8, microbatches=4)

    def test_counts_compositions_times_vectors(self):
        data = build_data(self._problem())
        assert enumeration.shift_entries(data) == (2 ** 6 - 1) * 2 ** 6  # every non-empty subset x vectors

    def test_skipped_beyond_the_memory_cap(self, monkeypatch):
        problem = self._problem()
        monkeypatch.setattr(enumeration, "MAX_SHIFT_ENTRIES", 100)
        search, result = _walk(problem, warm=True)
        assert result.skipped and not result.complete and result.prefixes == 0
        assert result.bound == search.bound  # nothing more proved

    def test_skipped_when_the_table_would_outlast_the_clock(self, monkeypatch):
        monkeypatch.setattr(enumeration, "SHIFT_SECONDS_PER_ENTRY", 1.0)
        _, result = _walk(self._problem(), warm=True, seconds=5.0)
        assert result.skipped and result.prefixes == 0

    def test_runs_otherwise(self):
        _, result = _walk(self._problem(), warm=True)
        assert not result.skipped and result.complete
