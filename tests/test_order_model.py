"""The exact order model (solver/schedules/order_model.py) against brute force, and what its results claim.

The brute force is written here from the spec's words alone: every order of each
group's actions in which an ``F`` precedes its ``B``/``I`` and an ``I`` its ``W``
(and, for the in-order space, each stage's actions of one kind run in microbatch
order), every combination over the groups, each timed by ``simulate`` on the
``custom`` plan (the ones that deadlock are skipped; the ones whose peak exceeds a
device's memory too).  Costs are multiples of 1/8 s on devices of speed 1 and 1/2 and
links of 1 byte/s, so that every time is exact in binary floating point and the
model's floors lose nothing: its optimum must equal the brute force's exactly.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.order_model import (OrderLimits, OrderProblem, canonical_programs, floor_slack,
                                                   microbatch_classes, solve_order, time_resolution)
from pipeplan.solver.schedules.programs import Action
from pipeplan.solver.schedules.synthesis import evaluate, fixed_programs, schedule_instance, synthesize

EIGHTH = 0.125


def dyadic_problem(rng: random.Random, owners: list[int], splits: list[tuple[int, ...]], *,
                   memory: float = 1e12, exact: bool = True) -> tuple[Plan, LayerGraph, Cluster]:
    """One layer per stage, ``owners[s]`` its device, ``splits[s]`` its microbatches.

    ``exact``: costs in eighths of a second, speeds 1 or 1/2, links of 1 byte/s with
    outputs of whole eighths of a byte; else arbitrary floats.
    """
    def cost(lo: int, hi: int) -> float:
        return rng.randint(lo, hi) * EIGHTH if exact else rng.uniform(lo, hi) * EIGHTH

    layers = []
    for s in range(len(owners)):
        f, b = cost(2, 10), cost(4, 16)
        layers.append(Layer(f"l{s}", (0.0, f), (0.0, b), float(rng.randint(1, 3)), float(rng.randint(1, 9)),
                            cost(0, 6), bwd_w=(0.0, cost(1, int(b / EIGHTH) - 1) if exact else b * 0.4),
                            act_w=float(rng.randint(0, 1)), step=cost(0, 2)))
    graph = LayerGraph.chain("g", layers, input_bytes=1.0)
    devices = tuple(Device(f"d{i}", "s0", rng.choice([1.0, 0.5]), memory) for i in range(max(owners) + 1))
    cluster = Cluster("c", (Link(1.0, rng.choice([0.0, EIGHTH]), "s0"),), Link(1.0, 0.0), devices)
    batch = sum(splits[0])
    stages = tuple(Stage((s, s + 1), (f"d{owners[s]}",), splits[s]) for s in range(len(owners)))
    return Plan("g", "c", batch, 1.0, "custom", stages), graph, cluster


def group_orders(actions: list[Action], in_order: bool) -> list[tuple[Action, ...]]:
    """Every order of one group's actions with each ``F`` before its ``B``/``I`` and each ``I`` before its ``W``."""
    present = set(actions)

    def allowed(a: Action, placed: set[Action]) -> bool:
        s, kind, k = a
        if kind in "BI" and Action(s, "F", k) not in placed:
            return False
        if kind == "W" and Action(s, "I", k) not in placed:
            return False
        return not (in_order and k > 0 and Action(s, kind, k - 1) in present and Action(s, kind, k - 1) not in placed)

    out: list[tuple[Action, ...]] = []

    def extend(prefix: list[Action], placed: set[Action]) -> None:
        if len(prefix) == len(actions):
            out.append(tuple(prefix))
            return
        for a in actions:
            if a not in placed and allowed(a, placed):
                placed.add(a)
                prefix.append(a)
                extend(prefix, placed)
                prefix.pop()
                placed.remove(a)

    extend([], set())
    return out


def brute_force(plan: Plan, graph: LayerGraph, cluster: Cluster, split: bool, in_order: bool) -> float:
    """The shortest iteration time over every valid order that fits, each timed by ``simulate``."""
    kinds = "FIW" if split else "FB"
    groups = plan.stage_groups
    per_group: list[list[Action]] = [[] for _ in plan.groups]
    for s, st in enumerate(plan.stages):
        per_group[groups[s]] += [Action(s, kind, k) for k in range(len(st.microbatches)) for kind in kinds]
    best = math.inf
    for combo in itertools.product(*(group_orders(acts, in_order) for acts in per_group)):
        programs = tuple(tuple(f"{a.stage}{a.kind}{a.microbatch}" for a in p) for p in combo)
        candidate = Plan(plan.graph, plan.cluster, plan.global_batch, plan.state_factor, "custom", plan.stages,
                         custom_programs=programs)
        try:
            result = simulate(candidate, graph, cluster, validate=False)  # valid by construction
        except DeadlockError:
            continue
        if result.fits:
            best = min(best, result.iteration_time)
    return best


def exact(plan: Plan, graph: LayerGraph, cluster: Cluster, split: bool, in_order: bool, **limits):
    instance = schedule_instance(plan, graph, cluster)
    hint = synthesize(instance, split_backward=split).programs
    return solve_order(OrderProblem(instance, split_backward=split, in_order=in_order), OrderLimits(**limits),
                       hint=hint if split or all(a.kind in "FB" for p in hint for a in p) else None)


BRUTE_CASES = {
    "2 groups, 2 microbatches, F I W, any order": ([0, 1], [(1, 1)] * 2, True, False),
    "2 groups, microbatches of 1 and 2 samples, F I W, any order": ([0, 1], [(1, 2)] * 2, True, False),
    "3 groups, 2 microbatches, F B, any order": ([0, 1, 2], [(1, 1)] * 3, False, False),
    "3 groups, 2 microbatches, F I W, in order": ([0, 1, 2], [(1, 1)] * 3, True, True),
    "2 groups, 3 against 1 microbatches, F B, any order": ([0, 1], [(1, 1, 1), (3,)], False, False),
    "2 groups, 4 against 1 microbatches, F B, any order": ([0, 1], [(1, 1, 1, 1), (4,)], False, False),
    "2 groups, stages 0 and 2 on one, 2 microbatches, F B, in order": ([0, 1, 0], [(1, 1)] * 3, False, True),
}


class TestSolveOrderAgainstBruteForce:
    @pytest.mark.parametrize("case", list(BRUTE_CASES))
    def test_the_optimum_is_the_brute_force_minimum(self, case):
        owners, splits, split, in_order = BRUTE_CASES[case]
        plan, graph, cluster = dyadic_problem(random.Random(case), owners, splits)
        best = brute_force(plan, graph, cluster, split, in_order)
        result = exact(plan, graph, cluster, split, in_order, work=30.0)
        assert result.status == "optimal" and result.stopped_by == "proof"
        assert result.iteration_time == best
        assert result.lower_bound <= best and result.gap < 1e-9
        check = Plan(plan.graph, plan.cluster, plan.global_batch, plan.state_factor, "custom", plan.stages,
                     custom_programs=tuple(tuple(f"{a.stage}{a.kind}{a.microbatch}" for a in p)
                                           for p in result.programs))
        assert simulate(check, graph, cluster).iteration_time == best

    def test_memory_caps_exclude_what_the_brute_force_excludes(self):
        """Device memory at the largest peak of the memory-minimal order: the fastest order no longer fits."""
        owners, splits = [0, 1], [(1, 1)] * 2
        plan, graph, cluster = dyadic_problem(random.Random(7), owners, splits)
        instance = schedule_instance(plan, graph, cluster)
        memory = max(evaluate(instance, synthesize(instance, fixed=False, rules=[]).programs).peak_memory)
        loose = exact(plan, graph, cluster, True, False, work=30.0)
        assert max(loose.timeline.peak_memory) > memory  # the cap binds
        plan, graph, cluster = dyadic_problem(random.Random(7), owners, splits, memory=memory)
        best = brute_force(plan, graph, cluster, True, False)
        result = exact(plan, graph, cluster, True, False, work=30.0)
        assert result.status == "optimal" and result.iteration_time == best and result.timeline.fits
        assert best > loose.iteration_time

    def test_inexact_costs_stay_within_the_floors(self):
        """Arbitrary floats: bound <= brute force <= the model's time <= brute force + the floors' slack."""
        owners, splits = [0, 1], [(1, 1)] * 2
        plan, graph, cluster = dyadic_problem(random.Random(8), owners, splits, exact=False)
        best = brute_force(plan, graph, cluster, True, False)
        result = exact(plan, graph, cluster, True, False, work=30.0)
        problem = OrderProblem(schedule_instance(plan, graph, cluster))
        assert result.lower_bound <= best <= result.iteration_time
        assert result.iteration_time <= best + floor_slack(problem, result.resolution)
        assert floor_slack(problem, result.resolution) == (12 + 4 + 4) * result.resolution


@pytest.fixture(scope="module")
def v_instance():
    """Four groups, V placement, six microbatches of unequal random costs."""
    rng = random.Random(3)
    owners = [0, 1, 2, 3, 3, 2, 1, 0]
    plan, graph, cluster = dyadic_problem(rng, owners, [(1,) * 6] * 8, exact=False)
    return schedule_instance(plan, graph, cluster)


class TestSolveOrder:
    def test_a_work_limit_stops_without_claiming_optimality(self, v_instance):
        syn = synthesize(v_instance)
        result = solve_order(OrderProblem(v_instance), OrderLimits(work=1e-4), hint=syn.programs)
        assert result.status == "feasible" and result.stopped_by == "work"
        assert result.iteration_time <= syn.iteration_time
        assert result.lower_bound <= result.iteration_time and result.gap >= 0

    def test_never_worse_than_the_fixed_schedules_and_a_valid_bound(self, v_instance):
        result = solve_order(OrderProblem(v_instance, in_order=True), OrderLimits(work=2.0),
                             hint=synthesize(v_instance).programs)
        for name, programs in fixed_programs(v_instance).items():
            fixed = evaluate(v_instance, programs).iteration_time
            assert result.iteration_time <= fixed, name
        assert result.lower_bound <= result.iteration_time

    def test_in_order_programs_are_in_microbatch_order(self, v_instance):
        result = solve_order(OrderProblem(v_instance, in_order=True), OrderLimits(work=1.0))
        for program in result.programs:
            for s in {a.stage for a in program}:
                for kind in "FIW":
                    ks = [a.microbatch for a in program if a.stage == s and a.kind == kind]
                    assert ks == sorted(ks)

    def test_identical_microbatches_are_searched_in_order(self):
        """Equal microbatches: in-order programs are as good as any (the module's proof), so only they are searched;
        the brute-force cases with any order check that nothing better is lost."""
        plan, graph, cluster = dyadic_problem(random.Random(11), [0, 1, 2], [(1, 1, 1)] * 3)
        result = solve_order(OrderProblem(schedule_instance(plan, graph, cluster)), OrderLimits(work=5.0))
        assert result.space.endswith("any order") and result.status == "optimal"
        for program in result.programs:
            for kind in "FIW":
                ks = [a.microbatch for a in program if a.kind == kind]
                assert ks == sorted(ks)

    def test_deterministic(self, v_instance):
        problem = OrderProblem(v_instance, in_order=True)
        first = solve_order(problem, OrderLimits(work=0.2))
        second = solve_order(problem, OrderLimits(work=0.2))
        assert first.programs == second.programs and first.lower_bound == second.lower_bound

    def test_state_above_the_cap_is_infeasible(self):
        plan, graph, cluster = dyadic_problem(random.Random(9), [0, 1], [(1, 1)] * 2)
        instance = schedule_instance(plan, graph, cluster, memory_caps=[1e12, 1.0])
        assert instance.groups[1].state > 1.0
        result = solve_order(OrderProblem(instance), OrderLimits(work=5.0))
        assert result.status == "infeasible" and result.programs is None and result.stopped_by == "proof"

    def test_a_hint_with_other_actions_is_refused(self):
        plan, graph, cluster = dyadic_problem(random.Random(10), [0, 1], [(1, 1)] * 2)
        instance = schedule_instance(plan, graph, cluster)
        split_hint = synthesize(instance).programs
        with pytest.raises(ValueError, match="the hint's actions are not the problem's"):
            solve_order(OrderProblem(instance, split_backward=False), hint=split_hint)

    def test_the_resolution_is_a_power_of_two(self, v_instance):
        res = time_resolution(v_instance)
        assert math.log2(res) == int(math.log2(res))
        assert 2 ** 24 <= v_instance.serial_work() / res < 2 ** 25


def random_programs(rng: random.Random, instance, split: bool = True) -> tuple[tuple[Action, ...], ...]:
    """Valid programs that cannot deadlock: a random topological order of every action, each group's share of it."""
    stages, last = instance.stages, len(instance.stages) - 1
    back = "I" if split else "B"

    def preds(a: Action) -> list[Action]:
        s, kind, k = a
        if kind == "F":
            return [Action(s - 1, "F", k)] if s > 0 else []
        if kind == "W":
            return [Action(s, "I", k)]
        return [Action(s, "F", k)] + ([Action(s + 1, back, k)] if s < last else [])

    pending = [a for acts in instance.actions(split) for a in acts]
    done: set[Action] = set()
    programs: list[list[Action]] = [[] for _ in instance.groups]
    while pending:
        ready = [a for a in pending if all(p in done for p in preds(a))]
        a = rng.choice(ready)
        pending.remove(a)
        done.add(a)
        programs[stages[a.stage].group].append(a)
    return tuple(tuple(p) for p in programs)


class TestCanonicalPrograms:
    """The relabelling the model's symmetry breaking rests on (the module docstring's proof), on random programs."""

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10_000), placement=st.sampled_from(["one", "v"]),
           sizes=st.lists(st.sampled_from([1, 2]), min_size=2, max_size=5), split=st.booleans())
    def test_no_later_same_peaks_alike_in_order(self, seed, placement, sizes, split):
        rng = random.Random(seed)
        owners = [0, 1, 2] if placement == "one" else [0, 1, 1, 0]
        plan, graph, cluster = dyadic_problem(rng, owners, [tuple(sizes)] * len(owners), exact=bool(seed % 2))
        instance = schedule_instance(plan, graph, cluster)
        classes = microbatch_classes(instance)
        assert sorted(k for ks in classes for k in ks) == list(range(len(sizes)))
        assert all(instance.stages[0].samples[k] == instance.stages[0].samples[ks[0]] for ks in classes for k in ks)
        programs = random_programs(rng, instance, split)
        made = canonical_programs(instance, programs)
        before, after = evaluate(instance, programs), evaluate(instance, made)
        assert after.iteration_time <= before.iteration_time
        assert after.peak_memory == before.peak_memory
        rank = {k: i for ks in classes for i, k in enumerate(ks)}
        cls = {k: c for c, ks in enumerate(classes) for k in ks}
        for program, given_ in zip(made, programs):
            assert sorted(program) == sorted(given_)
            for s in {a.stage for a in program}:
                for kind in "FBIW":
                    for c in range(len(classes)):
                        ks = [a.microbatch for a in program if a.stage == s and a.kind == kind and cls[a.microbatch] == c]
                        assert [rank[k] for k in ks] == list(range(len(ks)))

    def test_classes_need_equal_splits(self):
        plan, graph, cluster = dyadic_problem(random.Random(12), [0, 1], [(1, 1), (2,)])
        assert microbatch_classes(schedule_instance(plan, graph, cluster)) == ((0,), (1,))
