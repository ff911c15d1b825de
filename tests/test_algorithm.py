"""The solver contract: ``Solver.solve`` records what stopped a solve, its budget and its algorithm; the
registered solvers' table; and the example of ``docs/contributing.md``, run as written."""

from __future__ import annotations

import ast
import re
import types

import pytest

from conftest import ROOT, chain, cluster
from pipeplan.models.errors import InputError
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PIPELINES, SPLITS, VIRTUAL, PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver import solvers


def small_problem(schedule: str = "1f1b", speeds=(1.0, 0.5), **kw) -> PlanningProblem:
    return PlanningProblem(chain(4), cluster(2, speed=list(speeds)), global_batch=4, microbatches=2,
                           schedule=schedule, **kw)


class Counting(Solver):
    """Spends ``work`` units of its budget, then returns the one-stage plan on the fastest device."""

    name = "counting"
    source = "a test"
    budget_unit = "steps"
    default_budget = 10

    def __init__(self, work: int = 3) -> None:
        self.work = work

    def run(self, problem, clock, budget, seed, warm_start):
        for _ in range(self.work):
            if not budget.spend():
                break
        plan = problem.make_plan([(0, len(problem.graph))], [("d0",)])
        return SolverResult(self.name, "feasible", plan, problem.evaluate(plan).iteration_time, None,
                            clock.elapsed(), seed)


class TestSolve:
    def test_records_the_algorithm_the_budget_and_what_stopped_it(self):
        done = Counting(work=3).solve(small_problem(), seed=5)
        assert (done.algorithm, done.budget, done.stopped_by, done.seed) == ("counting", 10, "complete", 5)
        assert done.plan_by == "counting" and done.bound_by == ""  # no bound: nothing proved it
        spent = Counting(work=30).solve(small_problem(), budget=4)
        assert (spent.budget, spent.stopped_by) == (4, "budget")

    def test_the_clock_cut_is_recorded(self):
        class Slow(Counting):
            def run(self, problem, clock, budget, seed, warm_start):
                clock.within(0.0).expired()  # a part with a cap of its own, cut
                return super().run(problem, clock, budget, seed, warm_start)

        assert Slow().solve(small_problem()).stopped_by == "time"

    def test_a_solve_inside_another_reports_to_it(self):
        outer = TimeLimit(60.0)
        Counting(work=30).solve(small_problem(), within=outer)
        assert outer.stops.stopped_by() == "budget"

    def test_a_faster_warm_start_replaces_the_plan_of_a_solver_that_takes_none(self):
        problem = small_problem(speeds=(1.0, 1.0))
        both = problem.make_plan([(0, 2), (2, 4)], [("d0",), ("d1",)])
        assert problem.evaluate(both).iteration_time < Counting().solve(problem).iteration_time
        done = Counting().solve(problem, warm_start=both)
        assert done.plan == both and done.status == "feasible"

    def test_a_schedule_it_does_not_plan_is_refused_in_one_line(self):
        with pytest.raises(InputError, match="counting does not plan zbv: it plans gpipe, 1f1b"):
            Counting().solve(small_problem("zbv"))

    def test_no_budget_without_a_unit(self):
        class Whole(Counting):
            budget_unit = None

            def run(self, problem, clock, budget, seed, warm_start):
                assert budget is None
                return super().run(problem, clock, WorkBudget(10), seed, warm_start)

        assert Whole().solve(small_problem(), budget=3).budget is None


class TestRegistered:
    def test_the_algorithm_of_each_space_runs_and_says_so(self):
        cpsat = solvers.get_solver("cpsat")
        assert [cpsat.algorithms[s].name for s in (PIPELINES, SPLITS, VIRTUAL)] == ["cpsat", "cpsat-joint",
                                                                                       "virtual-bnb"]
        done = solvers.get_solver("even").solve(small_problem("looped-bfs"), time_limit=10.0)
        assert (done.name, done.algorithm) == ("even", "even-interleaved")

    def test_a_space_without_an_algorithm_is_refused_naming_those_that_plan_it(self):
        with pytest.raises(InputError, match=r"pipedream does not plan zbv: .*solvers that do: even, megatron"):
            solvers.get_solver("pipedream").solve(small_problem("zbv"))
        with pytest.raises(InputError, match=r"ilp plans M equal microbatches only; .*cpsat, cpsat-split, nsga"):
            solvers.get_solver("ilp").solve(small_problem(auto_microbatches=True))

    def test_settings_reach_the_algorithms_that_declare_them(self):
        nsga = solvers.get_solver("nsga", generations=7, backend="cbc")
        assert {s: a.generations for s, a in nsga.algorithms.items()} == {PIPELINES: 7, SPLITS: 7, VIRTUAL: 7}
        assert solvers.get_solver("ilp", backend="cbc").algorithms[PIPELINES].backend == "cbc"

    def test_unknown_names_list_the_valid_ones(self):
        with pytest.raises(InputError, match="unknown solver 'gurobi'; valid: even, megatron"):
            solvers.get_solver("gurobi")


def contributing_example() -> tuple[str, str]:
    """The solver module and the table row of ``docs/contributing.md``'s "Adding a solver", as written."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    section = text[text.index("## Adding a solver"):text.index("## Adding a model to the zoo")]
    module, row = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return module, row


class TestContributingExample:
    @pytest.fixture
    def fastest_single(self):
        module, _ = contributing_example()
        namespace = types.ModuleType("fastest_single")
        exec(compile(module, "docs/contributing.md", "exec"), namespace.__dict__)
        return namespace.FastestSingle

    def test_plans_on_the_fastest_device_that_holds_the_model(self, fastest_single):
        done = fastest_single().solve(small_problem(), seed=3)
        assert done.status == "feasible" and done.plan.stages[0].devices == ("d0",)
        assert (done.algorithm, done.stopped_by, done.budget, done.seed) == ("fastest-single", "complete", 1e6, 3)
        assert fastest_single().solve(small_problem(), budget=0.5).stopped_by == "budget"

    def test_its_table_row_registers_it(self, fastest_single, monkeypatch):
        _, row = contributing_example()
        names = {"PIPELINES": PIPELINES, "SPLITS": SPLITS, "VIRTUAL": VIRTUAL, "FastestSingle": fastest_single}
        table = ast.parse("{" + row.strip().rstrip(",") + "}", mode="eval").body  # the row as written, names resolved
        entry = {key.value: {names[k.id]: names[v.id] for k, v in zip(value.keys, value.values)}
                 for key, value in zip(table.keys, table.values)}
        monkeypatch.setattr(solvers, "SOLVERS", {**solvers.SOLVERS, **entry})
        assert solvers.solver_names()[-1] == "fastest-single"
        done = solvers.get_solver("fastest-single").solve(small_problem())
        assert (done.name, done.status) == ("fastest-single", "feasible")
        with pytest.raises(InputError, match="fastest-single does not plan zbv"):
            solvers.get_solver("fastest-single").solve(small_problem("zbv"))


class TestSolversDoc:
    def test_the_table_of_docs_solvers_is_the_registered_one(self):
        text = (ROOT / "docs" / "solvers.md").read_text()
        section = text[text.index("## What each solver runs"):]
        rows = re.findall(r"^\| `([a-z-]+)` \| (.*) \|$", section[:section.index("\n\n", section.index("| solver"))],
                          flags=re.M)
        written = {name: [cell.strip().strip("`") for cell in cells.split("|")] for name, cells in rows}
        table = {name: [spaces[s]().name if s in spaces else "refused" for s in (PIPELINES, SPLITS, VIRTUAL)]
                 for name, spaces in solvers.SOLVERS.items()}
        assert list(written) == list(table) and written == table
