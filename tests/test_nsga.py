"""nsga: valid fitting plans, a non-dominated front that simulates to its objectives, determinism.

The portfolio's seeding of the gpt1 problem (seconds of CP-SAT and baselines) runs once
(:func:`gpt_seeding`) for the tests that take its plans; that the seeding itself gives
the same plans every time is ``tests/test_determinism.py``'s (``nsga`` and each seeding solver).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from pipeplan.models.graph import load_graph
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.heuristics.nsga import BIG, SEEDING_SHARE, Codec, Nsga, run_nsga
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.portfolio import nsga_seeds
from pipeplan.solver.evaluation.simulator import simulate
from helpers import split_instance
from conftest import EXAMPLES


def seeded_run(problem: PlanningProblem, *, generations: int, population: int, seed: int, time_limit: float):
    """NSGA-II as the registered ``nsga`` runs it: seeded by the portfolio within half the limit."""
    clock = TimeLimit(time_limit)
    seeds = nsga_seeds(problem, seed=seed, time_limit=0.5 * time_limit, within=clock)
    return run_nsga(problem, clock, generations=generations, population=population, seed=seed, seeds=seeds)


def gpt_problem(per_stage=False) -> PlanningProblem:
    return PlanningProblem(load_graph(str(EXAMPLES / "gpt1.graph.json")),
                           load_cluster(str(EXAMPLES / "two-servers.cluster.json")), global_batch=16,
                           microbatches=4, auto_microbatches=True, max_microbatches=8, per_stage=per_stage)


SEED, LIMIT = 3, 200.0
"""The seed and time limit of the gpt1 runs that share :func:`gpt_seeding`."""


@pytest.fixture(scope="module")
def gpt_seeding() -> tuple[list, list]:
    """``nsga_seeds`` of :func:`gpt_problem` as ``nsga`` runs it at ``SEED``, ``LIMIT``: ``(seeds, calls)``.

    ``calls``: ``(solver name, time_limit)`` of every :meth:`Solver.solve` the seeding made.
    """
    calls, real = [], Solver.solve

    def recording(self, problem, *, time_limit=60.0, **kw):
        calls.append((self.name, time_limit))
        return real(self, problem, time_limit=time_limit, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Solver, "solve", recording)
        seeds = nsga_seeds(gpt_problem(), seed=SEED, time_limit=SEEDING_SHARE * LIMIT, within=TimeLimit(10 * LIMIT))
    return seeds, calls


@pytest.fixture
def shared_seeding(gpt_seeding):
    """A ``seeding`` for :class:`Nsga` that hands out :func:`gpt_seeding`'s plans (for ``SEED`` and ``LIMIT`` only)."""
    def seeding(problem, *, seed, time_limit, within):
        assert (seed, time_limit) == (SEED, SEEDING_SHARE * LIMIT)
        return list(gpt_seeding[0])

    return seeding


class TestCodec:
    @pytest.mark.parametrize("per_stage", [False, True])
    def test_repair_gives_valid_plans(self, per_stage):
        problem = gpt_problem(per_stage)
        codec = Codec(problem)
        xl, xu = codec.bounds()
        rng = np.random.default_rng(0)
        for _ in range(200):
            x = codec.repair(rng.integers(xl - 2, xu + 3))
            assert np.array_equal(codec.repair(x), x)  # repair is idempotent
            cand = codec.decode(x)
            plan = Plan("gpt1-14", "two-servers", 16, 4.0, "1f1b", tuple(
                __import__("pipeplan.solver.formats.plan", fromlist=["Stage"]).Stage(b, g, sp, rc)
                for b, g, sp, rc in zip(cand.bounds, cand.groups, cand.splits, cand.recompute)))
            plan.validate(problem.graph, problem.cluster)
            assert problem.in_split_space(plan)


class TestRunNsga:
    def test_front_non_dominated_and_simulates(self, gpt_seeding):
        problem = gpt_problem()
        run = run_nsga(problem, TimeLimit(60), generations=8, population=16, seed=1, seeds=gpt_seeding[0])
        assert run.front
        pts = [(p.iteration_time, p.peak_memory) for p in run.front]
        for a in pts:
            assert not any(b[0] <= a[0] and b[1] <= a[1] and b != a for b in pts)
        for p in run.front:
            r = simulate(p.plan, problem.graph, problem.cluster)
            assert r.fits and r.iteration_time == pytest.approx(p.iteration_time, rel=1e-9)
            assert max(r.peak_memory) == pytest.approx(p.peak_memory, rel=1e-9)


    @pytest.mark.parametrize("generations", [1, 3])
    def test_reports_the_generations_it_ran(self, generations):
        run = run_nsga(gpt_problem(), TimeLimit(60), generations=generations, population=8, seed=0)
        assert run.generations == generations

    def test_a_fitting_plan_slower_than_the_objective_clip_is_kept(self):
        # speeds of 1e-35 make every plan take 1e31 s or more: slow, but fitting
        problem = gpt_problem()
        slow = replace(problem.cluster, devices=tuple(replace(d, speed=1e-35) for d in problem.cluster.devices))
        run = seeded_run(replace(problem, cluster=slow), generations=2, population=8, seed=0, time_limit=60)
        assert run.front and run.front[0].iteration_time > BIG


class TestNsga:
    def test_same_seed_same_plan_and_not_worse_than_seeds(self, shared_seeding):
        # the same seeds (the seeding's own determinism: tests/test_determinism.py): the same GA run
        problem = gpt_problem()
        a = Nsga(generations=5, population=12, seeding=shared_seeding).solve(problem, time_limit=LIMIT, seed=SEED)
        b = Nsga(generations=5, population=12, seeding=shared_seeding).solve(problem, time_limit=LIMIT, seed=SEED)
        assert a.status == "feasible" and a.lower_bound is None
        assert a.plan == b.plan and a.iteration_time == b.iteration_time
        from pipeplan.solver.baselines import best_baseline
        assert a.iteration_time <= best_baseline(problem, time_limit=5).iteration_time

    def test_a_device_without_memory(self):
        # "memory": 0 is allowed; the overuse of a stage on it once divided by zero
        from pipeplan.models.graph import Layer, LayerGraph
        from pipeplan.solver.formats.cluster import Cluster, Device, Link
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (1e-4, 1e-4), (2e-4, 2e-4), 1e6, 1e5, 1e3) for i in range(6)])
        cluster = Cluster("c", (Link(1e10, 0.0, "s0"),), Link(1e9, 1e-5),
                          (Device("d0", "s0", 1.0, 0.0), Device("d1", "s0", 1.0, 1e8), Device("d2", "s0", 1.0, 1e8)))
        problem = PlanningProblem(graph, cluster, global_batch=4, microbatches=2)
        result = Nsga(generations=3, population=8, seeding=nsga_seeds).solve(problem, time_limit=60, seed=0)
        assert result.status == "feasible" and "d0" not in {d for st in result.plan.stages for d in st.devices}

    @pytest.mark.parametrize("seed", [0, 1])
    def test_within_two_percent_of_cpsat(self, seed):
        from pipeplan.solver.splits.cpsat_split import optimize_splits
        problem, base = split_instance(seed)
        best = optimize_splits(problem, base, time_limit=20).iteration_time
        result = Nsga(generations=15, population=24, seeding=nsga_seeds).solve(problem, time_limit=60, seed=0)
        assert result.iteration_time <= best * 1.02


class TestNsgaSeeds:
    def test_group_search_first_and_every_seed_solver_the_same_cap(self, gpt_seeding):
        # a share of what is left would make each seed depend on how fast the earlier ones ran
        seeds, calls = gpt_seeding
        cap = SEEDING_SHARE * LIMIT
        capped = [call for call in calls if call[1] == cap]  # the seeding solvers (what they run inside gets less)
        assert capped[0] == ("group-search", cap) and ("cpsat-joint", cap) in capped and ("cpsat", cap) in capped
        assert seeds[0][0] == "group-search"
        # 14 layers x 6 devices = 84 cells: above Alpa's 64 (and so the split baselines'), below Dapple's 256
        names = {name for name, _ in seeds}
        assert {"even", "dapple", "piper"} <= names
        assert not names & {"alpa", "umpipe-local", "umpipe-dp", "autopipe-slicing"}


class TestSeedingCells:
    def test_equal_split_baselines_keep_the_incumbent_sizes(self):
        from pipeplan.solver.baselines import BASELINES
        from pipeplan.solver.portfolio import seeding_cells

        limits = {cls.__name__: seeding_cells(cls) for cls in BASELINES}
        assert limits["Alpa"] == 64 and limits["Dapple"] == 256 and limits["PipeDream"] == 1024
        assert limits["EvenSplit"] == math.inf and limits["Megatron"] == math.inf

    def test_split_baselines_only_where_every_baseline_runs_whole(self):
        from pipeplan.solver.baselines import SPLIT_BASELINES
        from pipeplan.solver.portfolio import seeding_cells

        assert [seeding_cells(cls) for cls in SPLIT_BASELINES] == [64, 64, 64]


class TestParetoCommand:
    def test_writes_front(self, run_cli, tmp_path):
        out, png = tmp_path / "front.json", tmp_path / "front.png"
        status, stdout, _ = run_cli("pareto", str(EXAMPLES / "gpt1.graph.json"),
                                    str(EXAMPLES / "two-servers.cluster.json"), "--batch", "16",
                                    "--microbatches", "auto", "--max-microbatches", "8", "--generations", "4",
                                    "--population", "12", "-o", str(out), "--plot", str(png))
        assert status == 0, stdout
        doc = json.loads(out.read_text())
        assert doc["format"] == "pipeplan.pareto/1" and doc["points"] and png.stat().st_size > 0
        # one story, whatever the machine's load: the clock cut something exactly when the record says time
        assert (doc["stopped_by"] == "time") == doc["stopped_by_time_limit"] == bool(doc["time_cut"])

    def test_a_seeding_cut_short_is_reported_as_the_seeding(self, run_cli, tmp_path, monkeypatch):
        # a seeding solver's cap fires (as on a slow machine); every generation still runs
        import pipeplan.solver.portfolio as portfolio

        def capped_seeding(problem, *, seed, time_limit, within):
            within.stops.note("time")
            return []

        monkeypatch.setattr(portfolio, "nsga_seeds", capped_seeding)
        out = tmp_path / "front.json"
        status, stdout, _ = run_cli("pareto", str(EXAMPLES / "chain8.graph.json"),
                                    str(EXAMPLES / "two-servers.cluster.json"), "--batch", "16", "--microbatches", "4",
                                    "--generations", "3", "--population", "8", "-o", str(out))
        assert status == 0, stdout
        doc = json.loads(out.read_text())
        assert doc["generations"] == 3 and doc["stopped_by"] == "time"
        assert doc["stopped_by_time_limit"] is True and doc["time_cut"] == ["seeding"]
        assert "3 of 3 generations, stopped by time (the seeding's cap" in stdout

    def test_nothing_found_in_time_is_not_called_infeasible(self, run_cli, tmp_path):
        out = tmp_path / "front.json"
        status, _, err = run_cli("pareto", str(EXAMPLES / "chain8.graph.json"),
                                 str(EXAMPLES / "two-servers.cluster.json"), "--batch", "64", "--microbatches", "8",
                                 "--time-limit", "0.0001", "-o", str(out))
        assert status == 3 and not out.exists()
        assert err.startswith("no plan found: nsga found no fitting plan in the time given, which does not prove")

    def test_proved_infeasible_says_no_plan_fits(self, run_cli, tmp_path):
        cluster = json.loads((EXAMPLES / "two-servers.cluster.json").read_text())
        for device in cluster["devices"]:
            device["memory"] = 1000  # bytes: far below any layer's state
        path = tmp_path / "small.cluster.json"
        path.write_text(json.dumps(cluster))
        status, _, err = run_cli("pareto", str(EXAMPLES / "chain8.graph.json"), str(path), "--batch", "64",
                                 "--microbatches", "8", "--time-limit", "5", "-o", str(tmp_path / "f.json"))
        assert status == 3 and err.startswith("no plan fits: ")

    def test_a_backend_is_refused(self, run_cli, tmp_path):
        status, _, err = run_cli("pareto", str(EXAMPLES / "chain8.graph.json"),
                                 str(EXAMPLES / "two-servers.cluster.json"), "--batch", "8", "--microbatches", "2",
                                 "--backend", "cbc", "-o", str(tmp_path / "f.json"))
        assert status == 2 and err.startswith("error: -: --backend: ") and not (tmp_path / "f.json").exists()

