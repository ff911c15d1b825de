"""Stopping rules: work budgets, the record of what stopped a solve, interrupts; and ``pipeplan plan`` stopped by
SIGINT / SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.termination import (Stops, TimeLimit, WorkBudget, clear_interrupt, interrupted, on_interrupt,
                                              past, request_interrupt)
from conftest import EXAMPLES, ROOT, process_cpu_seconds


@pytest.fixture(autouse=True)
def no_interrupt_left():
    yield
    clear_interrupt()


class TestWorkBudget:
    def test_spends_until_empty(self):
        budget = WorkBudget(2.5)
        assert [budget.spend(1.0) for _ in range(3)] == [True, True, False]
        assert budget.left() == 0.5 and not budget.exhausted()
        assert budget.spend(0.5) and budget.exhausted()

    def test_running_out_is_noted_in_its_record(self):
        seen = Stops()
        WorkBudget(1, stops=seen).spend(2)
        assert seen.budget_spent and seen.stopped_by() == "budget"

    @pytest.mark.parametrize("units", [0, -1, float("nan")])
    def test_refuses_an_empty_budget(self, units):
        with pytest.raises(ValueError, match="positive"):
            WorkBudget(units)


class TestStops:
    def test_nothing_cut_is_complete(self):
        clock = TimeLimit(60)
        assert not clock.expired() and not past(clock) and not clock.within(60).expired()
        assert clock.stops.stopped_by() == "complete"

    def test_a_cap_made_from_a_clock_notes_in_its_record(self):
        clock = TimeLimit(60)
        assert clock.within(0.0).expired() and clock.stops.stopped_by() == "time"

    def test_a_nested_solve_reaches_its_caller(self):
        caller = TimeLimit(60)
        inner = caller.nested(0.0)
        assert past(inner)
        assert inner.stops.stopped_by() == caller.stops.stopped_by() == "time"
        WorkBudget(1, stops=caller.nested(60).stops).spend(2)
        assert caller.stops.budget_spent

    def test_another_clock_is_not_seen(self):
        clock = TimeLimit(60)
        TimeLimit(0).expired()
        assert clock.stops.stopped_by() == "complete"

    def test_order_proof_interrupt_time_budget(self):
        seen = Stops()
        WorkBudget(1, stops=seen).spend(2)
        TimeLimit(0, stops=seen).expired()
        assert seen.stopped_by() == "time" and seen.stopped_by(proved=True) == "proved"
        request_interrupt()
        seen = Stops()
        TimeLimit(0, stops=seen).expired()
        assert seen.stopped_by() == "interrupt"

    def test_refuses_an_unknown_kind(self):
        with pytest.raises(ValueError, match="kind must be one of"):
            Stops().note("boredom")


class TestPhase:
    def test_a_phase_budget_stays_in_the_phase_its_clock_does_not(self):
        solve = TimeLimit(60)
        phase = solve.phase(0.0)
        assert not WorkBudget(1, stops=phase.stops).spend(2)
        assert phase.stops.budget_spent and not solve.stops.budget_spent
        assert phase.expired()
        assert phase.stops.time_cut and solve.stops.time_cut and solve.stops.stopped_by() == "time"

    def test_the_solve_s_own_budget_is_seen(self):
        solve = TimeLimit(60)
        solve.phase(60)
        WorkBudget(1, stops=solve.stops).spend(2)
        assert solve.stops.stopped_by() == "budget"


class TestInterrupt:
    def test_clocks_expire_and_stoppers_run(self):
        stopped = []
        with on_interrupt(lambda: stopped.append(1)):
            assert not interrupted()
            request_interrupt()
        assert stopped and interrupted()
        clock = TimeLimit(60)
        assert clock.expired() and TimeLimit(60).remaining() == 0.0 and past(TimeLimit(60))
        assert clock.stops.stopped_by() == "interrupt"

    def test_a_stopper_registered_after_the_interrupt_runs_at_once(self):
        request_interrupt()
        stopped = []
        with on_interrupt(lambda: stopped.append(1)):
            assert stopped


READY = "ready"
DRIVER = ("import sys; from pipeplan.cli import build_parser, main; build_parser(); "
          "from pipeplan.solver.solvers import solver_names; solver_names(); import rich.progress; "
          f"print({READY!r}, flush=True); sys.exit(main(sys.argv[1:]))")
"""``pipeplan`` with its imports done before it says it is ready (the clock starts at the solve)."""


def start_plan(out, *options: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", DRIVER, "plan", str(EXAMPLES / "gpt1.graph.json"),
                              str(EXAMPLES / "two-servers.cluster.json"), "--batch", "16", *options, "-o", str(out)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == READY
    return child


class TestPlanInterrupted:
    @pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
    def test_writes_the_best_plan_so_far_within_two_seconds(self, tmp_path, signum):
        # two seconds of the child's CPU after the signal: what it does before writing, which a busy
        # machine (giving the child a part of a core) does not stretch as it stretches the wall clock
        out = tmp_path / "plan.json"
        child = start_plan(out, "--microbatches", "auto", "--max-microbatches", "4", "--solver", "nsga",
                           "--time-limit", "60", "--budget", "100000")
        try:
            time.sleep(1.0)
            sent, cpu_at_signal = time.perf_counter(), process_cpu_seconds(child.pid)
            cpu = cpu_at_signal
            child.send_signal(signum)
            while time.perf_counter() - sent < 120:
                cpu = process_cpu_seconds(child.pid)  # before the checks: the sample precedes the write seen
                if out.exists() or child.poll() is not None:
                    break
                time.sleep(0.01)
            written = cpu - cpu_at_signal
            stdout, stderr = child.communicate(timeout=30)  # the interpreter's own exit (torch) takes a while
        finally:
            child.kill()
        assert child.returncode == 0, stderr
        assert written < 2.0
        doc = json.loads(out.read_text())
        assert doc["solver"]["stopped_by"] == "interrupt" and doc["solver"]["status"] == "feasible"
        from pipeplan.models.graph import load_graph
        from pipeplan.solver.formats.cluster import load_cluster
        Plan.from_dict(doc).validate(load_graph(str(EXAMPLES / "gpt1.graph.json")),
                                     load_cluster(str(EXAMPLES / "two-servers.cluster.json")))
        assert "stopped by interrupt" in stdout
