"""What the tests share: random problems of each size, brute forces over them, a reference timing of spec 7,
and generators of plans, batches of plans and random programs.

Imported as ``from helpers import ...`` (``tests/`` is on the path of every test file, run
alone or in the suite: ``pytest tests/test_simulator.py``); ``conftest.py`` holds the
small builders (a chain graph, a cluster, a plan in a few words).

- :func:`random_problem`: up to 10 layers on up to 4 devices of two speeds (the baselines,
  group-search, the path floor);
- :func:`sized_problem` and :func:`brute_force`: a chain of a given size with tight memory,
  and the best plan over every plan of one stage per device group (the exact solvers);
- :func:`piper_problem`: Piper's DP's instances;
- :func:`split_instance`: a problem whose splits are decisions and a pipeline of it (the
  split searches);
- :func:`virtual_problem`, :func:`reference` and :func:`virtual_brute_force`: schedules
  whose device groups hold several stages, timed and sized by spec 7.3 and 7.4 written
  again here over the schedule's own programs or over breadth-first ones (which satisfy
  every dependency of 7.3 for any placement of stages on groups), and the best plan over
  every plan of the space;
- :func:`group_plan`, :func:`random_batch`, :func:`program_instances` and
  :func:`random_program_batch`: plans and batches of plans for the simulators.
"""

from __future__ import annotations

import itertools
import math
import random
from types import SimpleNamespace

import numpy as np
from hypothesis import assume, strategies as st

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.evaluation.batched import simulate_batch
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage, equal_split
from pipeplan.solver.schedules.schedule import group_programs

REL = 1e-9
"""Float noise allowed when comparing iteration times."""

SPLIT_BACKWARD = ("interleaved-zb", "zbv")
"""The schedules whose backward runs as ``I`` and ``W`` (spec 7.2), written again here."""


# --------------------------------------------------------------------------- one stage per device group
def random_problem(seed: int, memory: float = 1e9, **switches) -> PlanningProblem:
    """A chain of <= 10 layers on <= 4 devices of two speeds on two servers."""
    rng = random.Random(seed)
    layers = [Layer(f"l{i}", (rng.uniform(0, 1e-4), rng.uniform(1e-4, 1e-3)),
                    (rng.uniform(0, 2e-4), rng.uniform(2e-4, 2e-3)), rng.uniform(1e6, 1e7),
                    rng.uniform(1e5, 1e6), rng.uniform(1e4, 1e5)) for i in range(rng.randint(2, 10))]
    devices = tuple(Device(f"d{i}", f"s{i % 2}", 1.0 if i % 2 == 0 else 0.5, memory)
                    for i in range(rng.randint(1, 4)))
    cluster = Cluster("c", (Link(1e11, 1e-6, "s0"), Link(1e10, 2e-6, "s1")), Link(1e9, 1e-5), devices)
    batch = rng.choice([4, 8, 16])
    return PlanningProblem(LayerGraph.chain("g", layers, 1e4), cluster, global_batch=batch,
                           microbatches=rng.choice([1, 2, 4]), schedule=rng.choice(["gpipe", "1f1b"]), **switches)


def sized_problem(seed: int, *, layers: int, devices: int, schedule: str, replication: bool = True,
                   recompute: bool = True, max_stages: int | None = None) -> PlanningProblem:
    """A chain of random layers on two device speeds over two servers, memory often tight."""
    rng = random.Random(seed)
    graph = LayerGraph.chain("g", [
        Layer(f"l{i}", (rng.uniform(0, 1e-3), rng.uniform(1e-4, 1e-3)),
              (rng.uniform(0, 2e-3), rng.uniform(2e-4, 2e-3)),
              rng.uniform(1e6, 1e7), rng.uniform(1e5, 2e6), rng.uniform(1e4, 1e6))
        for i in range(layers)], input_bytes=rng.uniform(1e3, 1e5))
    batch = rng.choice([4, 6, 8])
    microbatches = rng.choice([1, 2, 3, 4])
    need = 4 * sum(l.params for l in graph.layers) + batch * sum(l.act for l in graph.layers)
    fast_mem, slow_mem = (need * rng.uniform(0.35, 1.1) for _ in range(2))
    speeds = [1.0, rng.choice([0.4, 0.7])]
    devs = tuple(Device(f"d{i}", f"s{i % 2}", speeds[i % 2], fast_mem if i % 2 == 0 else slow_mem)
                 for i in range(devices))
    cluster = Cluster("c", (Link(rng.choice([5e9, 5e10]), 1e-6, "s0"), Link(rng.choice([5e9, 5e10]), 2e-6, "s1")),
                      Link(rng.choice([1e9, 1e10]), 1e-5), devs)
    return PlanningProblem(graph, cluster, global_batch=batch, microbatches=microbatches, schedule=schedule,
                           allow_replication=replication, allow_recompute=recompute, max_stages=max_stages)


def brute_force(problem: PlanningProblem, chunk: int = 20_000) -> float:
    """Best fitting iteration time over every plan of the search space (``inf`` if none).

    Timed by the batched simulator, ``chunk`` plans at a time (its results equal the scalar
    simulator's to the bit, tests/test_batched.py)."""
    plans = _every_plan(problem)
    best = math.inf
    while batch := list(itertools.islice(plans, chunk)):
        result = simulate_batch(batch, problem.graph, problem.cluster)
        best = min(best, float(np.min(result.iteration_time, where=result.fits, initial=np.inf)))
    return best


def _every_plan(problem: PlanningProblem):
    """Every plan of the search space: stage ranges, ordered disjoint device groups, recompute flags."""
    L, ids = len(problem.graph), [d.id for d in problem.cluster.devices]
    for count in range(1, problem.stage_limit + 1):
        for cuts in itertools.combinations(range(1, L), count - 1):
            edges = (0,) + cuts + (L,)
            bounds = list(zip(edges, edges[1:]))
            for groups in _ordered_groups(ids, count, problem.allow_replication):
                for flags in itertools.product((False, True) if problem.allow_recompute else (False,), repeat=count):
                    yield problem.make_plan(bounds, groups, flags)


def _ordered_groups(ids, count, replication):
    """Every sequence of ``count`` disjoint non-empty device groups."""
    if count == 0:
        yield []
        return
    sizes = range(1, len(ids) + 1) if replication else (1,)
    for size in sizes:
        for first in itertools.combinations(ids, size):
            rest = [d for d in ids if d not in first]
            for tail in _ordered_groups(rest, count - 1, replication):
                yield [first] + tail


def piper_problem(seed: int) -> PlanningProblem:
    """A chain of <= 6 layers on <= 4 devices of random speeds and memories, <= 2 stages or any (piper's DP)."""
    rng = random.Random(seed)
    layers = [Layer(f"l{i}", (rng.uniform(0, 1e-4), rng.uniform(1e-4, 1e-3)), (rng.uniform(0, 2e-4),
                    rng.uniform(2e-4, 2e-3)), rng.uniform(1e5, 1e7), rng.uniform(1e5, 1e6), rng.uniform(1e4, 1e5))
              for i in range(rng.randint(1, 6))]
    devices = tuple(Device(f"d{i}", f"s{i % 2}", rng.choice([0.5, 1.0]), rng.choice([5e7, 2e8, 1e9]))
                    for i in range(rng.randint(1, 4)))
    cluster = Cluster("c", (Link(1e11, 1e-6, "s0"), Link(1e10, 2e-6, "s1")), Link(rng.choice([1e9, 1e11]), 1e-5), devices)
    return PlanningProblem(LayerGraph.chain("g", layers, 1e4), cluster, global_batch=rng.choice([8, 16]),
                           microbatches=rng.choice([2, 4, 8]), schedule=rng.choice(["gpipe", "1f1b"]),
                           max_stages=rng.choice([None, 2]), allow_recompute=rng.random() < 0.7)


def split_instance(seed: int, memory: float = 1e12) -> tuple[PlanningProblem, Plan]:
    """A split problem (``auto``, sometimes per stage) and a fitting pipeline of it, its split to be chosen."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    layers = [Layer(f"l{i}", (rng.uniform(1e-4, 1e-3), rng.uniform(1e-4, 1e-3)),
                    (rng.uniform(1e-4, 2e-3), rng.uniform(1e-4, 2e-3)), 1e6, rng.uniform(1e5, 1e6),
                    rng.uniform(1e4, 1e6)) for i in range(n)]
    graph = LayerGraph.chain("g", layers, 1e4)
    cluster = Cluster("c", (Link(1e9, 1e-5, "s0"), Link(1e9, 2e-5, "s1")), Link(1e8, 1e-4),
                      tuple(Device(f"d{i}", f"s{i % 2}", rng.choice([1.0, 0.5]), memory) for i in range(4)))
    stages = rng.randint(1, min(3, n))
    batch, top = rng.choice([4, 6, 8]), rng.choice([3, 4])
    per_stage, schedule = rng.random() < 0.5, rng.choice(["gpipe", "1f1b"])
    problem = PlanningProblem(graph, cluster, global_batch=batch, microbatches=2, schedule=schedule,
                              auto_microbatches=True, max_microbatches=top, per_stage=per_stage)
    cuts = [0, *sorted(rng.sample(range(1, n), stages - 1)), n]
    groups = [("d0",), ("d1", "d2"), ("d3",)]
    base = Plan("g", "c", batch, 4.0, schedule, tuple(
        Stage((cuts[s], cuts[s + 1]), groups[s], equal_split(batch, 2), rng.random() < 0.3) for s in range(stages)))
    return problem, base


# --------------------------------------------------------------------------- several stages per device group
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
        back = [(s, "I", k) for k in range(m)] + [(s, "W", k) for k in range(m)] if schedule in SPLIT_BACKWARD else \
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


def virtual_brute_force(problem: PlanningProblem, named: bool = True) -> tuple[float, list]:
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


def virtual_problem(seed_values, schedule: str, *, devices=2, layers=3, batch=4, m=2, memory=1e12,
                    servers=1, recompute=True, replication=True, virtual=None) -> PlanningProblem:
    """A chain of ``layers`` with split backwards and optimizer steps, costs drawn from ``seed_values``."""
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


# --------------------------------------------------------------------------- plans for the simulators
SLOW = 1.0
"""A link bandwidth of 1 byte/s: a transfer of n samples of b bytes takes n*b seconds."""


def flat(pairs):
    """``[(a, b), (c, d)]`` -> ``[a, b, c, d]``."""
    return [x for pair in pairs for x in pair]


def group_plan(layout, split, *, schedule="custom", programs=None, recompute=False, state_factor=0.0, ops=None):
    """One layer per stage; ``layout[s]`` is stage s's device list (equal lists: one group)."""
    stages = tuple(Stage((s, s + 1), tuple(devs), tuple(split), recompute, None if ops is None else tuple(ops[s]))
                   for s, devs in enumerate(layout))
    return Plan("g", "c", sum(split), state_factor, schedule, stages,
                custom_programs=None if programs is None else tuple(tuple(p) for p in programs))


# ---------------------------------------------------------------- batches of one-stage-per-group plans
def random_split(rng: random.Random, batch: int, m: int) -> tuple[int, ...]:
    ends = [0, *sorted(rng.sample(range(1, batch), m - 1)), batch]
    return tuple(b - a for a, b in zip(ends[:-1], ends[1:]))


def random_batch(seed: int):
    """Random graph, cluster and a batch of plans (per-stage splits, replicas, recompute)."""
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    layers = [Layer(f"l{i}", (rng.uniform(0, 1e-4), rng.uniform(1e-4, 1e-3)), (rng.uniform(0, 2e-4),
                    rng.uniform(1e-4, 2e-3)), rng.uniform(1e6, 1e7), rng.uniform(1e5, 1e6), rng.uniform(1e4, 1e5))
              for i in range(n)]
    graph = LayerGraph.chain("g", layers, 1e4)
    cluster = Cluster("c", (Link(1e11, 1e-6, "s0"), Link(1e10, 2e-6, "s1")), Link(1e9, 1e-5),
                      tuple(Device(f"d{i}", f"s{i % 2}", rng.choice([1.0, 0.5]), rng.choice([1e8, 1e10]))
                            for i in range(6)))
    stages, schedule, batch = rng.randint(1, min(n, 3)), rng.choice(["gpipe", "1f1b"]), rng.randint(4, 12)
    counts = [rng.randint(1, min(5, batch)) for _ in range(stages)]
    shared = rng.random() < 0.4
    plans = []
    for _ in range(rng.randint(1, 15)):
        cuts = [0, *sorted(rng.sample(range(1, n), stages - 1)), n]
        devs = [f"d{i}" for i in range(6)]
        rng.shuffle(devs)
        split = random_split(rng, batch, counts[0])
        built = []
        for s in range(stages):
            group, devs = tuple(devs[:rng.randint(1, 2)]), devs[2:]
            built.append(Stage((cuts[s], cuts[s + 1]), group, split if shared else random_split(rng, batch, counts[s]),
                               rng.random() < 0.3))
        plans.append(Plan("g", "c", batch, 4.0, schedule, tuple(built)))
    return graph, cluster, plans


# ---------------------------------------------------------------- random programs
costs = st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda t: (t[0] / 4, t[1] / 4))
NAMED = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


@st.composite
def layers(draw, n):
    out = []
    for i in range(n):
        fwd, bwd = draw(costs), draw(costs)
        bwd_w = draw(st.none() | st.tuples(st.integers(0, 4), st.integers(0, 4)).map(
            lambda t, b=bwd: (b[0] * t[0] / 4, b[1] * t[1] / 4)))
        act = float(draw(st.integers(0, 50)))
        act_w = draw(st.none() | st.integers(0, 4).map(lambda j, a=act: a * j / 4))
        step = draw(st.none() | st.integers(0, 4).map(lambda j: j / 8))
        out.append(Layer(f"l{i}", fwd, bwd, float(draw(st.integers(0, 50))), act, float(draw(st.integers(0, 10))),
                         bwd_w=bwd_w, act_w=act_w, step=step))
    return out


def _composition(draw, total, parts):
    if parts == 1:
        return (total,)
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1)))
    edges = [0] + cuts + [total]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def _layout(schedule, groups, virtual):
    """Stage -> group index for a named schedule, as spec 7.2 lays them out."""
    if schedule in ("gpipe", "1f1b"):
        return list(range(groups))
    if schedule == "zbv":
        return [s if s < groups else 2 * groups - 1 - s for s in range(2 * groups)]
    return [s % groups for s in range(virtual * groups)]


def _random_programs(draw, stage_groups, splits):
    """Random programs: per microbatch B, or I then W, each after its F on its own stage.

    Mostly a random serial run of the whole pipeline (each action after what it waits
    for on the neighbouring stages), cut into the groups' programs: such programs
    cannot deadlock.  Otherwise every group orders its actions at random, and most of
    those deadlock.
    """
    serial = draw(st.sampled_from([True, True, True, False]))
    count = max(stage_groups) + 1
    todo = {}  # action -> the actions it needs first
    for s, split in enumerate(splits):
        for k in range(len(split)):
            todo[(s, "F", k)] = [(s - 1, "F", j) for j in _overlap(splits, s, k, s - 1)] if serial else []
            back = [(s + 1, "B", j) for j in _overlap(splits, s, k, s + 1)] if serial else []
            if draw(st.booleans()):
                todo[(s, "B", k)] = [(s, "F", k)] + back
            else:
                todo[(s, "I", k)] = [(s, "F", k)] + back
                todo[(s, "W", k)] = [(s, "I", k)]
    done, programs = set(), [[] for _ in range(count)]
    while todo:
        ready = sorted(a for a, need in todo.items() if all(x in done or _backward_of(x, done) for x in need))
        action = draw(st.sampled_from(ready))
        del todo[action]
        done.add(action)
        programs[stage_groups[action[0]]].append(f"{action[0]}{action[1]}{action[2]}")
    return programs


def _overlap(splits, s, k, t):
    """Microbatches of stage t sharing a sample with microbatch k of stage s (none if t is no stage)."""
    if not 0 <= t < len(splits):
        return []
    lo = sum(splits[s][:k])
    hi = lo + splits[s][k]
    edges = [sum(splits[t][:j]) for j in range(len(splits[t]) + 1)]
    return [j for j in range(len(splits[t])) if edges[j] < hi and lo < edges[j + 1]]


def _backward_of(action, done):
    """A needed ``B`` of a neighbour is also met by its ``I``."""
    s, kind, k = action
    return kind == "B" and (s, "I", k) in done


@st.composite
def program_instances(draw):
    """``(graph, cluster, plan, stage_groups)``: any schedule, named or custom programs (most of which deadlock)."""
    schedule = draw(st.sampled_from(NAMED + ("custom",) * 3))
    groups = draw(st.integers(1, 3))
    if schedule == "custom":
        n_stages = draw(st.integers(1, 5))
        labels = [draw(st.integers(0, groups - 1)) for _ in range(n_stages)]
        renumber = {}
        stage_groups = [renumber.setdefault(x, len(renumber)) for x in labels]
        groups = len(renumber)
    else:
        virtual = draw(st.integers(1, 3)) if schedule in ("interleaved-1f1b", "interleaved-zb", "looped-bfs") else 1
        stage_groups = _layout(schedule, groups, virtual)
        n_stages = len(stage_groups)
    m = draw(st.integers(1, 6))
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        assume(m % max(1, m // groups) == 0)
    batch = draw(st.integers(m, m + 4))
    n_layers = n_stages + draw(st.integers(0, 2))
    graph_layers = draw(layers(n_layers))
    pairs = [(u, v) for u in range(n_layers) for v in range(u + 2, n_layers)]
    skips = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=2)) if pairs else []
    graph = LayerGraph("g", graph_layers, [(i, i + 1) for i in range(n_layers - 1)] + skips,
                       float(draw(st.integers(0, 9))))
    replicas = [draw(st.integers(1, 2)) for _ in range(groups)]
    servers = draw(st.integers(1, 2))
    devices = tuple(Device(f"d{i}", f"s{draw(st.integers(0, servers - 1))}", draw(st.sampled_from([0.5, 1.0, 2.0])),
                           float(draw(st.integers(0, 3000)))) for i in range(sum(replicas)))
    cluster_ = Cluster("c", tuple(Link(float(draw(st.sampled_from([1, 4, 16]))), draw(st.sampled_from([0.0, 0.25])),
                                       f"s{j}") for j in range(servers)),
                       Link(float(draw(st.sampled_from([1, 2]))), draw(st.sampled_from([0.0, 0.5]))), devices)
    order = draw(st.permutations([d.id for d in devices]))
    group_devices, taken = [], 0
    for r in replicas:
        group_devices.append(tuple(order[taken:taken + r]))
        taken += r
    cuts = sorted(draw(st.lists(st.integers(1, n_layers - 1), unique=True, min_size=n_stages - 1,
                                max_size=n_stages - 1))) if n_stages > 1 else []
    bounds = list(zip([0] + cuts, cuts + [n_layers]))
    shared = _composition(draw, batch, m)
    splits = [shared if schedule != "custom" else _composition(draw, batch, draw(st.integers(1, min(batch, 4))))
              for _ in range(n_stages)]
    stages = tuple(Stage(bounds[s], group_devices[stage_groups[s]], splits[s], draw(st.booleans()))
                   for s in range(n_stages))
    programs = _random_programs(draw, stage_groups, splits) if schedule == "custom" else None
    plan = Plan("g", "c", batch, float(draw(st.sampled_from([0, 1, 4]))), schedule, stages,
                custom_programs=None if programs is None else tuple(tuple(p) for p in programs))
    return graph, cluster_, plan, stage_groups


# ---------------------------------------------------------------- batches of plans of one programs structure
def random_program_batch(seed: int):
    """Random graph, cluster and a batch of plans that share one programs structure (device groups holding stages).

    A named schedule (``interleaved-1f1b``, ``interleaved-zb``, ``looped-bfs``, ``zbv``) on
    ``R`` groups, or custom programs made from one with some backwards split into ``I``
    and a later ``W`` (and, now and then, two forwards of a stage swapped: programs that
    send out of microbatch order).  The plans differ in layer ranges, devices, recompute
    and splits: one split per plan under a named schedule (unequal sizes allowed),
    per-stage splits of one count under custom programs.
    """
    from pipeplan.solver.schedules.schedule import group_programs, num_stages, stage_group

    rng = random.Random(seed)
    schedule = rng.choice(("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv", "custom", "custom"))
    named = schedule if schedule != "custom" else rng.choice(("interleaved-1f1b", "looped-bfs"))
    groups = rng.randint(1, 3)
    virtual = 2 if named == "zbv" else rng.randint(1, 3)
    m = rng.choice((groups, 2 * groups, 3, 4))
    if named in ("interleaved-1f1b", "interleaved-zb"):
        m -= m % max(1, m // groups)
    stages = num_stages(named, groups, virtual)
    n = stages + rng.randint(0, 3)
    layers = [Layer(f"l{i}", (rng.choice((0.0, 1e-4)), rng.uniform(1e-4, 1e-3)),
                    (rng.uniform(0, 2e-4), rng.uniform(1e-3, 2e-3)), rng.uniform(1e6, 1e7), rng.uniform(1e5, 1e6),
                    rng.uniform(1e4, 1e5), bwd_w=(0.0, rng.uniform(1e-4, 1e-3)) if rng.random() < 0.7 else None,
                    act_w=rng.uniform(1e4, 1e5) if rng.random() < 0.7 else None,
                    step=rng.uniform(0, 1e-4) if rng.random() < 0.7 else None) for i in range(n)]
    edges = [(i, i + 1) for i in range(n - 1)] + [(i, j) for i in range(n) for j in range(i + 2, n)
                                                  if rng.random() < 0.1]
    graph = LayerGraph("g", layers, sorted(set(edges)), input_bytes=1e4)
    cluster = Cluster("c", (Link(1e11, 1e-6, "s0"), Link(1e10, 2e-6, "s1")), Link(1e9, 1e-5),
                      tuple(Device(f"d{i}", f"s{i % 2}", rng.choice([1.0, 0.5]), rng.choice([1e8, 1e10]))
                            for i in range(2 * groups)))
    programs = None
    if schedule == "custom":
        written = []
        for program in group_programs(named, groups, m, virtual):
            out, pending = [], []
            for a in program:
                if a.kind == "B" and rng.random() < 0.5:
                    out.append(f"{a.stage}I{a.microbatch}")
                    pending.append(f"{a.stage}W{a.microbatch}")
                    if rng.random() < 0.5:
                        out.append(pending.pop(0))
                else:
                    out.append(f"{a.stage}{a.kind}{a.microbatch}")
            written.append(out + pending)
        if rng.random() < 0.3 and m > 1:  # a stage's first two forwards swapped: sends out of microbatch order
            program = written[0]
            i, j = program.index("0F0"), program.index("0F1")
            program[i], program[j] = program[j], program[i]
        programs = tuple(tuple(p) for p in written)
    batch = m * rng.choice((1, 2, 3))
    plans = []
    for _ in range(rng.randint(2, 12)):
        cuts = [0, *sorted(rng.sample(range(1, n), stages - 1)), n]
        devs = [f"d{i}" for i in range(2 * groups)]
        rng.shuffle(devs)
        members = [tuple(devs[2 * g:2 * g + rng.choice((1, 2))]) for g in range(groups)]
        shared = random_split(rng, batch, m)
        split = [shared if schedule != "custom" or rng.random() < 0.5 else random_split(rng, batch, m)
                 for _ in range(stages)]
        built = tuple(Stage((cuts[s], cuts[s + 1]), members[stage_group(named, s, groups)], split[s],
                            rng.random() < 0.3) for s in range(stages))
        plans.append(Plan("g", "c", batch, 4.0, schedule, built, custom_programs=programs))
    return graph, cluster, plans


# ---------------------------------------------------------------- exports and runs (test_export*, test_replay, ...)
# What the export and replay tests share: a CPU cluster file for local processes, one torchrun
# launch that runs several exported torch folders and pipeplan's workers on the same plans
# (tests/data/torchrun_folders.py), and a rank record of measured spans.


def cpu_cluster_file(folder, n: int) -> str:
    """Write ``folder/cpu-<n>.cluster.json``: ``n`` CPU devices ``cpu0..`` on one server; its path."""
    import json

    path = folder / f"cpu-{n}.cluster.json"
    path.write_text(json.dumps({
        "format": "pipeplan.cluster/1", "name": f"cpu-{n}",
        "servers": [{"id": "local", "bandwidth": 3.0e9, "latency": 6.0e-5}],
        "network": {"bandwidth": 1.25e9, "latency": 1.0e-4},
        "devices": [{"id": f"cpu{i}", "server": "local", "speed": 1.0, "memory": 4.0e9} for i in range(n)]}))
    return str(path)


def torchrun_jobs(jobs: list[dict], processes: int, folder, timeout: float = 900.0,
                  env: dict[str, str] | None = None) -> dict[int, list[str]]:
    """Run ``jobs`` (see tests/data/torchrun_folders.py) in one ``torchrun --nproc-per-node=processes``.

    Returns, per job's index, the lines printed while it ran (every rank's); a failed
    launch fails the test with the launch's last error lines.  ``env``: variables to set
    (``None``: to remove).
    """
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    launcher = Path(__file__).resolve().parent / "data" / "torchrun_folders.py"
    jobs_file = folder / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = {key: value for key, value in {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                                         **(env or {})}.items() if value is not None}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", str(launcher), str(jobs_file)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed: dict[int, list[str]] = {}
    current = None
    for line in proc.stdout.splitlines():
        if line.startswith("job "):
            current = printed.setdefault(int(line.split()[1]), [])
        elif current is not None:
            current.append(line)
    return printed


def step_losses_printed(lines: list[str], steps: int) -> list[float]:
    """The losses of ``step <k> loss <value>`` lines, checked to be steps 0 .. steps-1 in order."""
    found = [line.split() for line in lines if line.startswith("step ")]
    assert [int(words[1]) for words in found] == list(range(steps)), lines
    return [float(words[3]) for words in found]


def rank(stage: int, steps: list[list[tuple[str, float]]]) -> dict:
    """A rank record of ``pipeplan run`` whose steps run the given ``(label, seconds)`` spans back to back."""
    records = []
    for spans in steps:
        events, t = [], 0.0
        for label, seconds in spans:
            events.append(["forward", label, t, t + seconds])
            t += seconds
        records.append({"events": events, "end": t})
    return {"stage": stage, "steps": records}


# ---------------------------------------------------------------- runtime: plan files and shared launches
# (pipeplan run on tiny zoo models; tests/test_runtime.py, tests/test_calibrate.py)
RUN_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
RUN_CLUSTER = str(RUN_ROOT / "examples" / "two-servers.cluster.json")
"""Six devices g0..g5 on two servers."""
RUN_LIMIT = 240
"""Seconds per ``pipeplan run`` subprocess, hard: a guard against a hang, far above what a run takes loaded."""
SHARED_HANG = 240
"""Seconds a process of a shared launch may go without progress (a hang guard, not a measurement): between
two runs a rank waits, without a beat, for rank 0 to verify the run before and set up the next."""


def model_graph(name: str) -> LayerGraph:
    """A graph whose layers are the zoo model's units (costs made up, shapes real)."""
    from pipeplan.models.zoo import build_model

    model = build_model(name, device="meta")
    x, _ = model.example_batch(1)
    outs = model.forward(x)
    layers = [Layer(u.name, (1e-4, 1e-5), (2e-4, 2e-5), 4.0 * sum(p.numel() for p in u.module.parameters()),
                    4.0 * outs[i].numel(), 4.0 * outs[i].numel(), u.tied_to)
              for i, u in enumerate(model.units)]
    return LayerGraph(f"{name}-{len(layers)}", layers, model.edges(), float(model.input_bytes_per_sample))


def write_plan(folder, stages: list[tuple], batch: int, schedule: str = "gpipe", name: str = "plan",
               graph: str = "gpt-tiny-6") -> str:
    """A plan file on the two-servers cluster; its path.

    ``stages``: ``(lo, hi, devices, microbatches[, recompute[, ops]])``; ``graph``: the graph it names.
    """
    from pipeplan.models.jsonio import dumps

    built = tuple(Stage((lo, hi), tuple(devs), tuple(split), *(rest[:1] or [False]),
                        tuple(rest[1]) if len(rest) > 1 else None)
                  for lo, hi, devs, split, *rest in stages)
    path = folder / f"{name}.plan.json"
    path.write_text(dumps(Plan(graph, "two-servers", batch, 4.0, schedule, built).to_dict()))
    return str(path)


def pipeplan(*argv: str, env: dict | None = None, timeout: float = RUN_LIMIT):
    """``pipeplan ARGV`` as a subprocess in the project's root; the completed process."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pipeplan.cli", *argv], cwd=RUN_ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run_config(argv: list[str]):
    """The checked :class:`~pipeplan.runtime.options.RunConfig` of ``pipeplan run ARGV``."""
    import argparse

    from pipeplan.runtime.options import RunConfig, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--force", action="store_true")
    return RunConfig.from_args(parser.parse_known_args(argv)[0]).checked()


def plan_world(plan_file: str) -> int:
    """Processes a plan runs on: one per device it names."""
    import json

    with open(plan_file) as f:
        return len({d for stage in json.load(f)["stages"] for d in stage["devices"]})


def shared_launch(runs: dict[str, list[str]], folder) -> dict[str, dict]:
    """Run the workers of several ``pipeplan run ARGV`` in one launch; what each run's rank 0 wrote.

    ``runs`` maps a name to ``pipeplan run``'s arguments.  Every process runs, one run after
    another, exactly the workers' command line ``pipeplan run`` would launch for that run
    (:meth:`~pipeplan.runtime.options.RunConfig.worker_argv`), on as many ranks as the plan
    has devices (``tests/data/run_plans.py``): starting Python and torch once per rank instead
    of once per run.  Returns ``{name: {"argv": ..., "result": ..., "error": ...}}``: ``result``
    is rank 0's result file (``None`` if the run did not finish), ``error`` the launcher's
    message when a run failed or hung and stopped the launch (the runs after it did not run).
    """
    import json

    from pipeplan.runtime.launch import WorkerError, launch_local

    jobs = []
    for name, argv in runs.items():
        config = run_config(argv)
        result = folder / f"{name}.result.json"
        jobs.append({"name": name, "world": plan_world(config.plan), "argv": config.worker_argv(result),
                     "result": str(result)})
    jobs.sort(key=lambda job: -job["world"])  # a rank leaves once no later run needs it
    (folder / "jobs.json").write_text(json.dumps(jobs))
    error = None
    try:
        launch_local([str(folder / "jobs.json")], jobs[0]["world"], folder, timeout=SHARED_HANG,
                     describe=lambda rank: f"rank {rank}", entry=[str(RUN_ROOT / "tests" / "data" / "run_plans.py")])
    except WorkerError as exc:
        error = f"{exc}\n{exc.log_tail}"
    out = {}
    for job in jobs:
        path = __import__("pathlib").Path(job["result"])
        out[job["name"]] = {"argv": job["argv"], "result_file": job["result"], "error": error,
                            "result": json.loads(path.read_text()) if path.exists() else None}
    return out


def run_shared(entry: dict, run_cli, monkeypatch, *more: str) -> tuple[int, str, str]:
    """``pipeplan run`` in this process on a run of :func:`shared_launch`: ``(status, stdout, stderr)``.

    ``entry``: the run's item of :func:`shared_launch`'s answer; ``more``: options the
    launcher handles alone (``--json``, ``--trace``, ``--gantt``, ``--side-by-side``).  The
    command loads and checks its files and options as always; its launch is replaced by
    the run's result, after checking that the shared launch ran this very invocation's
    workers.  Fails the test if the shared launch stopped before the run finished.
    """
    import copy
    from pathlib import Path

    import pytest

    import pipeplan.cmd_run

    if entry["result"] is None:
        pytest.fail(f"the shared launch stopped before this run finished: {entry['error']}")

    def launch(config, inputs):
        assert config.worker_argv(Path(entry["result_file"])) == entry["argv"]
        return copy.deepcopy(entry["result"])

    argv = list(entry["argv"])
    at = argv.index("--result")
    monkeypatch.setattr(pipeplan.cmd_run, "launch", launch)
    return run_cli("run", *argv[:at], *argv[at + 2:], *more)


def run_plan_command(argv: list[str]) -> int:
    """Parse and run ``pipeplan plan ARGV`` like pipeplan.cli.main, in process (InputError -> one line, exit 2)."""
    import argparse
    import sys

    from pipeplan import cmd_plan
    from pipeplan.models.errors import InputError

    parser = argparse.ArgumentParser(prog="pipeplan")
    cmd_plan.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        sys.stderr.write(exc.line() + "\n")
        return 2
