"""Planning for version-2 schedules (spec 7): the space, the bounds, the exact search, the refusals.

The search and the bounds are checked against an independent reference written here:
section 7.3 and 7.4 timed and sized over *breadth-first* programs (each group runs the
forwards of its stages in stage order, then their backwards in reverse stage order),
which satisfy every dependency of 7.3 for any placement of stages on groups.  The bounds
of :mod:`pipeplan.solver.bounds.virtual_bound` hold for every program order, so they must hold for
these; and the search must find what a brute force over every plan finds.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.registry import get_solver, schedule_refusal
from pipeplan.solver.schedules.schedule import group_programs
from pipeplan.solver.core.termination import WorkBudget
from pipeplan.solver.bounds.virtual_bound import candidate_bound, space_bound
from pipeplan.solver.exact.virtual_search import solve_v2
from pipeplan.solver.space.virtual_space import Candidate, candidates

V2 = ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")
SPLIT = ("interleaved-zb", "zbv")


# --------------------------------------------------------------------------- the reference
def owner(schedule: str, s: int, groups: int) -> int:
    """Spec 7.2's placement, written again here."""
    if schedule == "zbv":
        return s if s < groups else 2 * groups - 1 - s
    return s % groups


def breadth_first_programs(schedule: str, placement: list[int], groups: int, m: int) -> list[list[tuple]]:
    programs: list[list[tuple]] = [[] for _ in range(groups)]
    for s, g in enumerate(placement):
        programs[g] += [(s, "F", k) for k in range(m)]
    for s in reversed(range(len(placement))):
        back = [(s, "I", k) for k in range(m)] + [(s, "W", k) for k in range(m)] if schedule in SPLIT else \
            [(s, "B", k) for k in range(m)]
        programs[placement[s]] += back
    return programs


def reference(problem: PlanningProblem, plan, named: bool = True) -> SimpleNamespace:
    """Spec 7.3 (time) and 7.4 (memory) of ``plan`` over the schedule's own programs
    (:func:`pipeplan.solver.schedules.schedule.group_programs`), or over breadth-first ones."""
    graph, cluster = problem.graph, problem.cluster
    keys = []
    for st_ in plan.stages:
        if frozenset(st_.devices) not in keys:
            keys.append(frozenset(st_.devices))
    placement = [keys.index(frozenset(st_.devices)) for st_ in plan.stages]
    devs = [next(st_.devices for st_ in plan.stages if frozenset(st_.devices) == k) for k in keys]
    S, R, split = len(plan.stages), len(keys), plan.stages[0].microbatches
    dev = {d.id: d for d in cluster.devices}
    speed = [min(dev[d].speed for d in g) for g in devs]
    r = [len(g) for g in devs]

    def q(s, k):
        return -(-split[k] // r[placement[s]])

    def dur(s, kind, k):
        lo, hi = plan.stages[s].layers
        layers = graph.layers[lo:hi]
        v, n = speed[placement[s]], q(s, k)
        tf = sum(l.fwd[0] + l.fwd[1] * n for l in layers) / v
        rec = tf if plan.stages[s].recompute else 0.0
        if kind == "F":
            return tf
        if kind == "B":
            return sum(l.bwd[0] + l.bwd[1] * n for l in layers) / v + rec
        if kind == "I":
            return sum(l.input_bwd[0] + l.input_bwd[1] * n for l in layers) / v + rec
        return sum(l.weight_bwd[0] + l.weight_bwd[1] * n for l in layers) / v

    def transfer(s, t, k):
        x, y = devs[placement[s]], devs[placement[t]]
        cut = plan.stages[min(s, t)].layers[1] - 1  # the layer before the cut between the two stages
        rate = min(len(x), len(y)) * cluster.bw(x, y)
        return cluster.lat(x, y) + split[k] * graph.cut_bytes(cut) / rate

    if named:
        programs = [[tuple(a) for a in p] for p in group_programs(plan.schedule, R, len(split), S // R)]
    else:
        programs = breadth_first_programs(plan.schedule, placement, R, len(split))
    end, arrive = {}, {}
    link_free: dict = {}
    ptr, clock = [0] * R, [0.0] * R
    while any(ptr[g] < len(programs[g]) for g in range(R)):
        moved = False
        for g in range(R):
            while ptr[g] < len(programs[g]):
                s, kind, k = programs[g][ptr[g]]
                if kind == "F":
                    need = [("fwd", s - 1, k)] if s > 0 else []
                elif kind == "W":
                    need = [("end", s, "I", k)]
                else:
                    need = [("bwd", s + 1, k)] if s < S - 1 else [("end", s, "F", k)]
                ready = []
                for item in need:
                    key = (item[1], item[2], item[3]) if item[0] == "end" else item
                    table = end if item[0] == "end" else arrive
                    if key not in table:
                        break
                    ready.append(table[key])
                else:
                    start = max([clock[g], *ready])
                    clock[g] = end[(s, kind, k)] = start + dur(s, kind, k)
                    for direction, t in (("fwd", s + 1), ("bwd", s - 1)):
                        sends = (kind == "F" and direction == "fwd") or (kind in "BI" and direction == "bwd")
                        if not sends or not 0 <= t < S:
                            continue
                        if placement[t] == g:
                            arrive[(direction, s, k)] = clock[g]
                        else:
                            link = (g, placement[t])
                            begin = max(clock[g], link_free.get(link, 0.0))
                            link_free[link] = arrive[(direction, s, k)] = begin + transfer(s, t, k)
                    ptr[g] += 1
                    moved = True
                    continue
                break
        assert moved, "breadth-first programs never deadlock"
    total, fits, peaks = 0.0, True, []
    for g in range(R):
        mine = [s for s in range(S) if placement[s] == g]
        params = sum(graph.range_sum("params", *plan.stages[s].layers) for s in mine)
        step = sum(graph.range_step(*plan.stages[s].layers) for s in mine)
        ar = 2 * (r[g] - 1) * (cluster.lat(devs[g]) + params / (r[g] * cluster.bw(devs[g]))) if r[g] > 1 else 0.0
        total = max(total, clock[g] + ar + step / speed[g])
        stash = peak = 0.0
        for s, kind, k in programs[g]:
            lo, hi = plan.stages[s].layers
            act = graph.range_sum("act", lo, hi)
            held = graph.stage_input_bytes(lo) if plan.stages[s].recompute else act
            if kind in "BI" and plan.stages[s].recompute:
                peak = max(peak, stash + q(s, k) * act)
            stash += {"F": q(s, k) * held, "B": -q(s, k) * held, "W": -q(s, k) * graph.range_act_weight(lo, hi),
                      "I": q(s, k) * (graph.range_act_weight(lo, hi) - held)}[kind]
            peak = max(peak, stash)
        peaks.append(problem.state_factor * params + peak)
        fits = fits and peaks[-1] <= min(dev[d].memory for d in devs[g])
    return SimpleNamespace(iteration_time=total, fits=fits, peak_memory=tuple(peaks))


def brute_force(problem: PlanningProblem, named: bool = True) -> tuple[float, list]:
    """The fastest fitting plan's reference time over every plan of the space (concrete devices), and every plan."""
    schedule, L, m = problem.schedule, len(problem.graph), problem.microbatches
    ids = [d.id for d in problem.cluster.devices]
    best, plans = math.inf, []
    for R in range(1, len(ids) + 1):
        if schedule in ("interleaved-1f1b", "interleaved-zb") and m % max(1, m // R):
            continue
        vs = [2] if schedule == "zbv" else [problem.virtual_stages] if problem.virtual_stages else range(1, L + 1)
        for v in vs:
            S = 2 * R if schedule == "zbv" else v * R
            if S > L:
                continue
            sizes = range(1, len(ids) + 1) if problem.allow_replication else [1]
            for widths in itertools.product(sizes, repeat=R):
                if sum(widths) > len(ids):
                    continue
                for order in itertools.permutations(ids, sum(widths)):
                    cut = list(itertools.accumulate(widths))
                    groups = [tuple(sorted(order[a:b])) for a, b in zip([0, *cut[:-1]], cut)]
                    if any(list(order[a:b]) != sorted(order[a:b]) for a, b in zip([0, *cut[:-1]], cut)):
                        continue  # each group once, in one order
                    for cuts in itertools.combinations(range(1, L), S - 1):
                        edges = [0, *cuts, L]
                        for flags in itertools.product((False, True) if problem.allow_recompute else (False,),
                                                       repeat=S):
                            plan = problem.make_plan(list(zip(edges[:-1], edges[1:])),
                                                     [groups[owner(schedule, s, R)] for s in range(S)], flags)
                            result = reference(problem, plan, named)
                            plans.append((plan, result))
                            if result.fits:
                                best = min(best, result.iteration_time)
    return best, plans


# --------------------------------------------------------------------------- instances
def make_problem(seed_values, schedule: str, *, devices=2, layers=3, batch=4, m=2, memory=1e12,
                 servers=1, recompute=True, replication=True, virtual=None) -> PlanningProblem:
    vals = iter(seed_values)

    def nxt():
        return next(vals, 1.0)

    def layer(i: int) -> Layer:
        # spec 7.1: each bwd_w coefficient at most bwd's, act_w at most act (shares of them in [0.05, 1])
        bwd, act = (0.2 * nxt(), 2 * nxt()), 300 * nxt()
        return Layer(f"l{i}", (0.1 * nxt(), nxt()), bwd, 100 * nxt(), act, 20 * nxt(),
                     bwd_w=(bwd[0] * nxt() / 2, bwd[1] * nxt() / 2), act_w=act * nxt() / 2, step=0.3 * nxt())

    graph = LayerGraph.chain("g", [layer(i) for i in range(layers)])
    links = tuple(Link(1e3 * (j + 1), 0.01, f"s{j}") for j in range(servers))
    devs = tuple(Device(f"d{i}", f"s{i % servers}", 1.0 + (i % 2) * nxt(), memory) for i in range(devices))
    cluster = Cluster("c", links, Link(200.0, 0.05), devs)
    return PlanningProblem(graph, cluster, global_batch=batch, microbatches=m, schedule=schedule,
                           allow_recompute=recompute, allow_replication=replication, virtual_stages=virtual)


VALUES = st.lists(st.floats(0.1, 2.0), min_size=40, max_size=40)


# --------------------------------------------------------------------------- tests
class TestCandidates:
    def test_every_plan_up_to_interchangeable_devices(self):
        # R = 1: v = 1 or 2 (one boundary choice each) on {d0}, {d1} or {d0, d1}: 6; R = 2, v = 1: (d0, d1), (d1, d0)
        p = make_problem([1.0] * 40, "looped-bfs", devices=2, layers=2, recompute=False)
        assert len(list(candidates(p))) == 8
        # two identical devices on one server: {d0} and {d1} are one choice, and so are the two orders
        same = PlanningProblem(p.graph, Cluster("c", p.cluster.servers, p.cluster.network,
                                                tuple(Device(f"d{i}", "s0", 1.0, 1e12) for i in range(2))),
                               global_batch=4, microbatches=2, schedule="looped-bfs", allow_recompute=False)
        found = list(candidates(same))
        assert len(found) == 5 and all(c.groups[0][0] == "d0" for c in found)

    def test_rounds_rule_leaves_out_groups(self):
        # m = 5 on R = 2 groups: rounds = max(1, 5 // 2) = 2 does not divide 5 (torch refuses); R = 1: rounds = 5
        p = make_problem([1.0] * 40, "interleaved-1f1b", devices=2, layers=4, batch=5, m=5, recompute=False)
        assert {len(c.groups) for c in candidates(p)} == {1}
        q = make_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, batch=5, m=5, recompute=False)
        assert {len(c.groups) for c in candidates(q)} == {1, 2}

    def test_zbv_has_two_stages_per_group(self):
        p = make_problem([1.0] * 40, "zbv", devices=2, layers=4, recompute=False)
        assert {(len(c.groups), len(c.bounds), c.virtual) for c in candidates(p)} == {(1, 2, 2), (2, 4, 2)}


class TestCandidateBound:
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2), st.integers(1, 4), st.integers(1, 2), st.booleans())
    def test_never_above_any_plan(self, values, schedule, m, servers, named):
        p = make_problem(values, schedule, devices=3, layers=4, batch=4, m=m, servers=servers)
        for candidate in itertools.islice(candidates(p), 0, None, 7):
            plan = p.make_plan(candidate.bounds, [candidate.groups[owner(schedule, s, len(candidate.groups))]
                                                  for s in range(len(candidate.bounds))], candidate.recompute)
            assert candidate_bound(p, candidate) <= reference(p, plan, named).iteration_time * (1 + 1e-12)

    def test_hand_computed_single_group(self):
        # one device, speed 1, no transfers: term 1 is all the work, 2 stages x 2 microbatches x (1 + 2) s
        g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 2), 0, 0, 0), Layer("b", (0, 1), (0, 2), 0, 0, 0)])
        c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
        p = PlanningProblem(g, c, global_batch=2, microbatches=2, schedule="looped-bfs")
        assert candidate_bound(p, Candidate(2, (("d0",),), ((0, 1), (1, 2)), (False, False))) == 12.0


class TestSpaceBound:
    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2))
    def test_never_above_the_optimum(self, values, schedule):
        p = make_problem(values, schedule, devices=2, layers=3, m=2)
        best, _ = brute_force(p)
        assert space_bound(p) <= best * (1 + 1e-12)


class TestSolveV2:
    @pytest.mark.parametrize("schedule", V2)
    @pytest.mark.parametrize("memory", [1e12, 2400.0, 1300.0, 1000.0])  # all fit, some, a few or none
    @pytest.mark.parametrize("named", [True, False])
    def test_equals_brute_force(self, schedule, memory, named):
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = make_problem(values, schedule, devices=2, layers=4, batch=4, m=2, memory=memory, servers=2)
        best, _ = brute_force(p, named)
        result = solve_v2(p, "t", time_limit=60.0, seed=0, evaluate=lambda plan: reference(p, plan, named))
        if math.isinf(best):
            assert result.status == "infeasible" and result.plan is None
        else:
            assert result.status == "optimal"
            assert result.iteration_time == pytest.approx(best, rel=1e-12)
            assert result.lower_bound == result.iteration_time

    def test_budget_counts_simulations(self):
        p = make_problem([0.5 + 0.1 * i for i in range(40)], "looped-bfs", devices=2, layers=4)
        full = solve_v2(p, "t", time_limit=60.0, seed=0, evaluate=lambda plan: reference(p, plan))
        assert full.details["simulations"] > 2  # so that a budget of 2 cuts the search
        runs = [solve_v2(p, "t", time_limit=60.0, seed=0, budget=WorkBudget(2),
                         evaluate=lambda plan: reference(p, plan)) for _ in range(2)]
        assert runs[0].plan == runs[1].plan and runs[0].details["simulations"] == 2
        assert runs[0].status == "feasible" and runs[0].lower_bound <= full.iteration_time * (1 + 1e-12)

    def test_budget_bound_never_above_optimum(self):
        p = make_problem([0.5 + 0.1 * i for i in range(40)], "interleaved-zb", devices=2, layers=4)
        best, _ = brute_force(p)
        cut = solve_v2(p, "t", time_limit=60.0, seed=0, budget=WorkBudget(2), evaluate=lambda plan: reference(p, plan))
        assert cut.lower_bound <= best * (1 + 1e-12)


class TestRefusals:
    def test_solvers_without_a_v2_form_refuse_in_one_line(self):
        p = make_problem([1.0] * 40, "zbv", devices=2, layers=4)
        with pytest.raises(InputError) as err:
            get_solver("pipedream").solve(p, time_limit=5.0)
        assert "pipedream does not plan zbv" in str(err.value) and "cpsat" in str(err.value)
        assert "\n" not in str(err.value)

    def test_exact_solvers_plan_every_named_schedule(self):
        for name in ("ilp", "cpsat"):
            assert all(not schedule_refusal(get_solver(name), s) for s in ("gpipe", "1f1b") + V2)

    def test_custom_is_not_planned(self):
        with pytest.raises(ValueError, match="custom programs come from a plan file"):
            make_problem([1.0] * 40, "custom")

    def test_virtual_stages_only_where_they_apply(self):
        with pytest.raises(ValueError, match="zbv has 2 stage"):
            make_problem([1.0] * 40, "zbv", virtual=3)
        with pytest.raises(ValueError, match="1f1b has 1 stage"):
            make_problem([1.0] * 40, "1f1b", virtual=2)


# --------------------------------------------------------------------------- the command line
GRAPH, CLUSTER = "examples/chain8.graph.json", "examples/two-servers.cluster.json"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    from pipeplan.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


class TestSchedulesFromArgs:
    def test_all_auto_and_one(self):
        import argparse

        from pipeplan.cmd_plan import schedules_from_args

        assert schedules_from_args(argparse.Namespace(schedules="all", schedule="1f1b")) == \
            ["gpipe", "1f1b", *V2]
        assert schedules_from_args(argparse.Namespace(schedules=None, schedule="auto")) == ["gpipe", "1f1b", *V2]
        assert schedules_from_args(argparse.Namespace(schedules="zbv, 1f1b,zbv", schedule="1f1b")) == ["zbv", "1f1b"]
        with pytest.raises(InputError, match="unknown schedule 'zb'; valid: gpipe"):
            schedules_from_args(argparse.Namespace(schedules="1f1b,zb", schedule="1f1b"))


class TestCliRefusals:
    def test_a_solver_without_a_v2_form(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule", "zbv",
                                "--solver", "alpa", "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "alpa does not plan zbv" in err
        assert not (tmp_path / "p.json").exists()

    def test_virtual_stages_on_zbv(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule", "zbv",
                                "--virtual-stages", "3", "--solver", "cpsat", "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "zbv has 2 stage(s) per device group" in err

    def test_auto_microbatches_with_v2(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "auto", "--schedule",
                                "looped-bfs", "--solver", "ilp", "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "M equal microbatches only" in err

    def test_pareto_v2(self, tmp_path, capsys):
        code, _, err = run_cli(["pareto", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule",
                                "interleaved-zb", "-o", str(tmp_path / "f.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "pareto writes the front of nsga" in err

    def test_unknown_schedule_list(self, capsys):
        code, _, err = run_cli(["compare", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedules",
                                "1f1b,zb"], capsys)
        assert code == 2 and "unknown schedule 'zb'" in err


# --------------------------------------------------------------------------- every solver, judged by the reference
@pytest.fixture
def judged_by_reference(monkeypatch):
    """Every solver's plans judged by the reference of this file (named programs)."""
    monkeypatch.setattr(PlanningProblem, "evaluate", lambda self, plan: reference(self, plan))


SMALL = [0.3 + 0.17 * ((7 * i) % 11) for i in range(60)]


class TestRegisteredSolvers:
    @pytest.mark.parametrize("name", ["ilp", "cpsat"])
    @pytest.mark.parametrize("schedule", V2)
    def test_exact_equals_brute_force(self, judged_by_reference, name, schedule):
        p = make_problem(SMALL, schedule, devices=2, layers=4, batch=4, m=2, memory=2400.0, servers=2)
        best, _ = brute_force(p)
        result = get_solver(name).solve(p, time_limit=60.0, seed=3)
        assert result.status == "optimal" and result.stopped_by == "proved"
        assert result.iteration_time == pytest.approx(best, rel=1e-12) and result.gap == 0.0
        assert result.seed == 3 and result.budget == 20_000 and result.plan.schedule == schedule

    def test_budget_and_time_are_recorded(self, judged_by_reference):
        p = make_problem(SMALL, "interleaved-1f1b", devices=2, layers=4, batch=4, m=2)
        assert get_solver("cpsat").solve(p, time_limit=60.0).details["simulations"] > 1
        cut = [get_solver("cpsat").solve(p, time_limit=60.0, budget=1) for _ in range(2)]
        assert cut[0].stopped_by == "budget" and cut[0].budget == 1 and cut[0].status == "feasible"
        assert cut[0].plan == cut[1].plan
        timed = get_solver("ilp").solve(p, time_limit=1e-9)
        assert timed.stopped_by == "time" and timed.status == "timeout-no-solution"

    @pytest.mark.parametrize("name", ["group-search", "nsga", "even", "megatron", "deepspeed-uniform",
                                      "deepspeed-parameters"])
    @pytest.mark.parametrize("schedule", V2)
    def test_heuristics_plan_no_faster_than_the_optimum(self, judged_by_reference, name, schedule):
        p = make_problem(SMALL, schedule, devices=3, layers=4, batch=4, m=2, servers=2)
        best, _ = brute_force(make_problem(SMALL, schedule, devices=3, layers=4, batch=4, m=2, servers=2,
                                           recompute=False))  # with memory to spare recompute only slows
        runs = [get_solver(name).solve(p, time_limit=60.0) for _ in range(2)]
        result = runs[0]
        assert result.status == "feasible" and result.plan.schedule == schedule
        assert result.iteration_time >= best * (1 - 1e-12) and runs[1].plan == result.plan
        if name == "group-search":
            assert result.lower_bound <= best * (1 + 1e-12)
        else:
            assert result.lower_bound is None  # a baseline, or nsga, proves nothing


class TestInterleavedForms:
    def test_even_and_megatron_split_per_virtual_stage(self):
        from pipeplan.solver.baselines.even import EvenSplit
        from pipeplan.solver.baselines.megatron import Megatron

        names = ["embed"] + [f"block.{i}" for i in range(4)] + ["head"]
        graph = LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in names])
        p = make_problem([1.0] * 60, "interleaved-1f1b", devices=2, layers=6)
        p = PlanningProblem(graph, p.cluster, global_batch=4, microbatches=2, schedule="interleaved-1f1b")
        assert EvenSplit().v2_bounds(p, 4) == ((0, 2), (2, 4), (4, 5), (5, 6))
        # 4 blocks over 4 chunks: one each, the embedding with the first, the head with the last
        assert Megatron().v2_bounds(p, 4) == ((0, 2), (2, 3), (3, 4), (4, 6))
        assert Megatron().v2_bounds(p, 3) is None  # Megatron refuses 4 blocks over 3 chunks

    def test_groupings(self):
        from pipeplan.solver.baselines.deepspeed import DeepSpeedUniform
        from pipeplan.solver.heuristics.virtual_groups import equal_groupings

        p = make_problem([1.0] * 60, "looped-bfs", devices=4, layers=4)
        assert [tuple(map(len, g)) for g in equal_groupings(p, 2)] == [(1, 1), (2, 2)]
        assert [tuple(map(len, g)) for g in DeepSpeedUniform().v2_groupings(p, 3)] == [(1, 1, 1)]


class TestDecoder:
    def test_even_vectors_decode_to_the_even_split(self):
        from pipeplan.solver.heuristics.virtual_nsga import Decoder
        from pipeplan.solver.space.virtual_space import even_bounds

        p = make_problem([1.0] * 60, "interleaved-1f1b", devices=2, layers=5)
        decoder = Decoder(p)
        for i, st_ in enumerate(decoder.structures):
            c = decoder.decode(decoder.encode_even(i))
            assert (c.virtual, c.groups) == (st_.virtual, st_.groups)
            assert c.bounds == even_bounds(5, st_.stages) and not any(c.recompute)

    def test_every_vector_decodes_to_a_valid_candidate(self):
        import numpy as np

        from pipeplan.solver.heuristics.virtual_nsga import Decoder

        p = make_problem([1.0] * 60, "zbv", devices=3, layers=6)
        decoder, rng = Decoder(p), np.random.default_rng(0)
        for _ in range(200):
            c = decoder.decode(rng.random(decoder.size) * (1 - 1e-9))
            assert len(c.bounds) == 2 * len(c.groups) and c.bounds[0][0] == 0 and c.bounds[-1][1] == 6
            assert all(lo < hi == nxt for (lo, hi), (nxt, _) in zip(c.bounds, c.bounds[1:] + ((6, 6),)))
            used = [d for g in c.groups for d in g]
            assert len(used) == len(set(used)) and len(c.recompute) == len(c.bounds)


# --------------------------------------------------------------------------- with the project's simulator
class TestWithTheSimulator:
    @pytest.mark.parametrize("schedule", V2)
    def test_cpsat_equals_brute_force(self, schedule):
        p = make_problem(SMALL, schedule, devices=2, layers=4, batch=4, m=2, memory=2400.0, servers=2)
        best, plans = brute_force(p)
        for plan, ref in plans[::9]:  # the reference of this file is the simulator's twin
            sim = p.evaluate(plan)
            assert sim.iteration_time == pytest.approx(ref.iteration_time, rel=1e-9) and sim.fits == ref.fits
        result = get_solver("cpsat").solve(p, time_limit=60.0)
        assert result.status == "optimal" and result.iteration_time == pytest.approx(best, rel=1e-12)


class TestEmptySpace:
    def test_too_many_virtual_stages_is_said(self):
        p = make_problem([1.0] * 60, "looped-bfs", devices=2, layers=4, virtual=5)
        result = solve_v2(p, "t", time_limit=10.0, seed=0, evaluate=lambda plan: reference(p, plan))
        assert result.status == "infeasible" and "needs more stages than the 4 layers" in result.message

    def test_a_solver_refuses_it_in_one_line(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule",
                                "looped-bfs", "--virtual-stages", "9", "--solver", "cpsat",
                                "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "needs more stages than the 8 layers" in err
