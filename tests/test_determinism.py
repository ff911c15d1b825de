"""Same problem, seed and budget, same plan and record (save the wall times): every solver.

Each solver runs the same small instance four times: twice in this process, once in a
fresh process and once while two busy processes keep the machine's cores loaded.  The
records must agree on everything but the seconds, and say that nothing but the work
budget or the search's own end stopped them (``stopped_by`` reproducible).

The exact solvers also run at a time limit close to what their work takes, once idle and
once while threads hold the interpreter lock: every phase of their search must end on
its counted work, not on a part of the clock.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading

import pytest

from pipeplan.models.graph import load_graph
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.exact.cpsat import DEFAULT_BUDGET
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.solvers import get_solver
from pipeplan.solver.core.termination import REPRODUCIBLE
from pipeplan.solver.portfolio import EXACT as EXACT_PHASES
from conftest import EXAMPLES, ROOT

SPLIT_AWARE = {"umpipe-local", "umpipe-dp", "autopipe-slicing", "cpsat", "cpsat-split", "nsga"}
"""Solvers run with ``--microbatches auto`` (they choose the splits); the others with M = 4."""
BUDGETS = {"nsga": 3, "cpsat": 30.0, "cpsat-split": 30.0, "ilp": 50_000, "group-search": 100}
"""Work budgets for the runs (the rest have none: they run their whole search)."""
TIME_CAP = 600.0
"""Seconds: a cap far above what any of these solves takes, so only the budgets end them."""
EXACT = ("ilp", "cpsat")
"""The solvers of :func:`pipeplan.solver.exact.solve.solve_exact`."""
SHORT_CAP = 20.0
"""Seconds: several times what an exact solve of :func:`problem` takes with :func:`busy_threads`
running (so the cap does not fire), yet short enough that a phase given a part of it instead of
counted work (a few per cent for the baselines) is cut short there."""
CHILD_TIMEOUT = 300
"""Seconds the solves in a fresh process may take before the test fails."""
ALL = ["even", "megatron", "deepspeed-uniform", "deepspeed-parameters", "greedy-speed", "autopipe", "pipedream", "dapple", "piper", "alpa",
       "umpipe-local", "umpipe-dp", "autopipe-slicing", "group-search", "ilp", "cpsat", "virtual-bnb", "cpsat-split",
       "nsga"]
"""Every registered solver (a test below checks the list is complete)."""
VIRTUAL_ONLY = {"virtual-bnb": "zbv"}
"""Solvers that plan only schedules whose device groups hold several stages, and the schedule they run on
(on gpt-tiny: its six layers keep the space small enough to be proved in a fraction of a second)."""


def problem(name: str, auto: bool | None = None) -> PlanningProblem:
    """GPT-1 on two servers; ``auto`` (default: ``name`` in :data:`SPLIT_AWARE`) lets the solver pick the splits."""
    auto = name in SPLIT_AWARE if auto is None else auto
    cluster = load_cluster(str(EXAMPLES / "two-servers.cluster.json"))
    if name in VIRTUAL_ONLY:
        return PlanningProblem(load_graph(str(EXAMPLES / "gpt-tiny.graph.json")), cluster, global_batch=16,
                               microbatches=4, schedule=VIRTUAL_ONLY[name])
    return PlanningProblem(load_graph(str(EXAMPLES / "gpt1.graph.json")), cluster, global_batch=16,
                           microbatches=4, auto_microbatches=auto, max_microbatches=4 if auto else None)


def comparable(record: dict) -> dict:
    """The record without its seconds: the wall time, and the trace's time stamps."""
    out = {k: v for k, v in record.items() if k != "wall_time"}
    out["trace"] = [point[1:] for point in record["trace"]]
    return json.loads(json.dumps(out))  # tuples become lists, as in a file


def solve_here(name: str, time_limit: float = TIME_CAP, auto: bool | None = None) -> dict:
    """Plan and record (without seconds) of ``name`` on :func:`problem` (``auto``: its microbatch choice)."""
    result = get_solver(name).solve(problem(name, auto), time_limit=time_limit, seed=7, budget=BUDGETS.get(name))
    return {"plan": result.plan.to_dict() if result.plan else None, "record": comparable(result.record())}


def solve_in_new_process(names: list[str]) -> dict[str, dict]:
    """:func:`solve_here` of every name, in one fresh Python process."""
    code = ("import json, sys; sys.path.insert(0, 'tests'); import test_determinism as t; "
            f"print(json.dumps({{n: t.solve_here(n) for n in {names!r}}}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def busy_cores(count: int = 2):
    """``count`` processes spinning on the CPU for the duration of the block (then killed)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(timeout=10)


@contextlib.contextmanager
def busy_threads(count: int = 8):
    """``count`` threads spinning in Python for the duration of the block.

    They hold the interpreter lock most of the time, so the solve's Python code runs
    several times slower on any number of cores (busy processes slow it only when they
    outnumber the cores).
    """
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(timeout=10)


@pytest.fixture(scope="class")
def first(request):
    """The first run of the class's solver."""
    return solve_here(request.cls.name)


@pytest.fixture(scope="module")
def fresh_process() -> dict[str, dict]:
    """Every solver's run in one new process (one start-up instead of one per solver)."""
    return solve_in_new_process(ALL)


class _SameRecord:
    """The four runs of :attr:`name` agree (see the module docstring)."""

    name = ""

    def test_reproducible_stop(self, first):
        assert first["plan"] is not None
        assert first["record"]["stopped_by"] in REPRODUCIBLE, first["record"]

    def test_twice_in_one_process(self, first):
        assert solve_here(self.name) == first

    def test_in_a_new_process(self, first, fresh_process):
        assert fresh_process[self.name] == first

    def test_on_a_loaded_machine(self, first):
        with busy_cores():
            again = solve_here(self.name)
        assert again == first


class TestEven(_SameRecord):
    name = "even"


class TestMegatron(_SameRecord):
    name = "megatron"


class TestDeepspeedUniform(_SameRecord):
    name = "deepspeed-uniform"


class TestDeepspeedParameters(_SameRecord):
    name = "deepspeed-parameters"


class TestGreedySpeed(_SameRecord):
    name = "greedy-speed"


class TestAutopipe(_SameRecord):
    name = "autopipe"


class TestPipedream(_SameRecord):
    name = "pipedream"


class TestDapple(_SameRecord):
    name = "dapple"


class TestPiper(_SameRecord):
    name = "piper"


class TestAlpa(_SameRecord):
    name = "alpa"


class TestUmpipeLocal(_SameRecord):
    name = "umpipe-local"


class TestUmpipeDp(_SameRecord):
    name = "umpipe-dp"


class TestAutopipeSlicing(_SameRecord):
    name = "autopipe-slicing"


class TestGroupSearch(_SameRecord):
    name = "group-search"


class TestIlp(_SameRecord):
    name = "ilp"


class TestCpsat(_SameRecord):
    name = "cpsat"


class TestVirtualBnb(_SameRecord):
    name = "virtual-bnb"


class TestCpsatSplit(_SameRecord):
    name = "cpsat-split"


class TestNsga(_SameRecord):
    name = "nsga"


@pytest.mark.parametrize("name", EXACT)
class TestExactSolverUnderLoad:
    def test_same_record_at_a_short_limit_with_the_interpreter_busy(self, name):
        idle = solve_here(name, SHORT_CAP, auto=False)
        with busy_threads():
            loaded = solve_here(name, SHORT_CAP, auto=False)
        assert idle["record"]["stopped_by"] in REPRODUCIBLE, idle["record"]
        # the guarantee: the same record, unless the record says the cap cut the loaded solve
        # (a machine many times slower than its 20 s allow; a share of the clock cut phases silently)
        if loaded["record"]["stopped_by"] == "proved":
            # a proof is the same on every machine; the record of how the work got there (which
            # phase proved it, how far the walk went before a later phase closed the gap) may differ
            same = ("status", "iteration_time", "lower_bound")
            assert loaded["plan"] == idle["plan"], loaded["record"]
            assert [loaded["record"][k] for k in same] == [idle["record"][k] for k in same], loaded["record"]
        else:
            assert loaded == idle or loaded["record"]["stopped_by"] == "time", loaded["record"]


SMALL_BUDGET = DEFAULT_BUDGET / 50_000
"""A ``cpsat`` budget that scales every phase down far enough that the walk on :func:`problem` stops on
its table entries (0.12 million of the 0.5 million a whole walk builds), and the model's loop after it
stops on its budget too."""


def exact_here(budget: float | None = None, time_limit: float = TIME_CAP) -> tuple[dict, object]:
    """:func:`solve_here`'s plan and record of ``cpsat`` at M = 4 with ``budget``, and the result itself."""
    result = get_solver("cpsat").solve(problem("cpsat", auto=False), time_limit=time_limit, seed=7, budget=budget)
    return {"plan": result.plan.to_dict() if result.plan else None, "record": comparable(result.record())}, result


class TestWalkOnItsTableBudget:
    """The walk stops on its counted table entries: the same record idle, twice, and with the interpreter busy."""

    def run(self) -> dict:
        return exact_here(SMALL_BUDGET, time_limit=SHORT_CAP)[0]

    def test_stops_on_the_table_budget(self):
        details = self.run()["record"]["details"]
        assert details["enumeration"] == "stopped"
        assert details["enumeration_prefixes"] < details["work"]["prefixes"]  # the tables stopped it
        assert 0 < details["enumeration_table_cells"] <= details["work"]["table_cells"]

    def test_same_record_twice_and_with_the_interpreter_busy(self):
        idle = self.run()
        assert self.run() == idle
        with busy_threads(2):  # two spinners: the solve runs a few times slower (eight: the test too slow)
            loaded = self.run()
        assert idle["record"]["stopped_by"] in REPRODUCIBLE, idle["record"]
        assert loaded == idle


class TestBudgetScalesTheExactSolve:
    """``--budget`` scales every counted phase of an exact solve, not the model's alone."""

    def test_every_phase_gets_its_share(self):
        record = exact_here(SMALL_BUDGET)[0]["record"]
        assert record["budget"] == SMALL_BUDGET
        assert record["details"]["work"] == EXACT_PHASES.scaled(SMALL_BUDGET / DEFAULT_BUDGET).counts()

    def test_a_small_budget_walks_less_and_stays_valid(self):
        small, result = exact_here(SMALL_BUDGET)
        whole, best = exact_here()
        work, details = small["record"]["details"]["work"], small["record"]["details"]
        assert details["enumeration_prefixes"] <= work["prefixes"]
        assert details["enumeration_table_cells"] <= work["table_cells"]
        assert details["enumeration_table_cells"] < whole["record"]["details"]["enumeration_table_cells"]
        assert small["record"]["stopped_by"] in REPRODUCIBLE, small["record"]
        evaluated = problem("cpsat", auto=False).evaluate(result.plan)
        assert evaluated.fits and evaluated.iteration_time == pytest.approx(result.iteration_time)
        assert result.lower_bound <= best.lower_bound * (1 + 1e-9)  # best is proved: its bound is the optimum

    def test_same_record_twice(self):
        assert exact_here(SMALL_BUDGET)[0] == exact_here(SMALL_BUDGET)[0]


class TestEverySolverHasAClass:
    def test_the_list_is_the_registry(self):
        from pipeplan.solver.solvers import solver_names

        assert sorted(ALL) == sorted(solver_names())
        classes = {cls.name for cls in _SameRecord.__subclasses__()}
        assert classes == set(ALL)
