"""Stopping rules: work budgets, watches, interrupts; and ``pipeplan plan`` stopped by SIGINT / SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.termination import (TimeLimit, WorkBudget, clear_interrupt, interrupted, on_interrupt, past,
                                         phase_watch, request_interrupt, watch)
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

    def test_running_out_is_noted(self):
        with watch() as seen:
            WorkBudget(1).spend(2)
        assert seen.budget_spent and seen.stopped_by() == "budget"

    @pytest.mark.parametrize("units", [0, -1, float("nan")])
    def test_refuses_an_empty_budget(self, units):
        with pytest.raises(ValueError, match="positive"):
            WorkBudget(units)


class TestWatch:
    def test_nothing_cut_is_complete(self):
        with watch() as seen:
            assert not TimeLimit(60).expired() and not past(time.perf_counter() + 60)
        assert seen.stopped_by() == "complete"

    def test_a_clock_inside_a_nested_block_reaches_both(self):
        with watch() as outer:
            with watch() as inner:
                assert past(time.perf_counter() - 1)
        assert inner.stopped_by() == outer.stopped_by() == "time"

    def test_a_clock_after_the_block_is_not_seen(self):
        with watch() as seen:
            pass
        TimeLimit(0).expired()
        assert seen.stopped_by() == "complete"

    def test_order_proof_interrupt_time_budget(self):
        with watch() as seen:
            WorkBudget(1).spend(2)
            TimeLimit(0).expired()
        assert seen.stopped_by() == "time" and seen.stopped_by(proved=True) == "proved"
        request_interrupt()
        with watch() as seen:
            TimeLimit(0).expired()
        assert seen.stopped_by() == "interrupt"


class TestPhaseWatch:
    def test_what_stops_a_phase_stays_in_the_phase(self):
        with watch() as solve:
            with phase_watch() as phase:
                assert not WorkBudget(1).spend(2)
                assert TimeLimit(0.0).expired()
        assert phase.budget_spent and phase.time_cut
        assert not solve.budget_spent and not solve.time_cut
        assert solve.stopped_by() == "complete"

    def test_outside_the_phase_the_solve_sees_again(self):
        with watch() as solve:
            with phase_watch():
                pass
            WorkBudget(1).spend(2)
        assert solve.stopped_by() == "budget"


class TestInterrupt:
    def test_clocks_expire_and_stoppers_run(self):
        stopped = []
        with on_interrupt(lambda: stopped.append(1)):
            assert not interrupted()
            request_interrupt()
        assert stopped and interrupted()
        assert TimeLimit(60).expired() and TimeLimit(60).remaining() == 0.0
        assert past(time.perf_counter() + 60)

    def test_a_stopper_registered_after_the_interrupt_runs_at_once(self):
        request_interrupt()
        stopped = []
        with on_interrupt(lambda: stopped.append(1)):
            assert stopped


READY = "ready"
DRIVER = ("import sys; from pipeplan.cli import build_parser, main; build_parser(); "
          "from pipeplan.solver.core.registry import solver_names; solver_names(); import rich.progress; "
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
