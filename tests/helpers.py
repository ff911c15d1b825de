"""Generators the tests share: plans, batches of plans and random programs.

``conftest.py`` holds the small builders (a chain graph, a cluster, a plan in a few
words); this module the generators several test files draw from, so that each test
file runs on its own (``pytest tests/test_simulator.py``).
"""

from __future__ import annotations

import random

from hypothesis import assume, strategies as st

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage

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
