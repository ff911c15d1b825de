"""The golden set: plans over every schedule and what the simulator says of them, to the bit.

``python tests/golden.py`` (from the checkout, with the project's environment) writes
``tests/data/golden/simulations.json``; ``--solvers`` writes ``solvers.json``, what
every registered solver returns on one small instance per schedule (seed 0), and
``--check-solvers`` solves them all again and names the ones that differ (the suite
checks the quick ones); ``tests/test_golden.py`` simulates every plan again
and compares every number bit for bit.  The plans are drawn once from a fixed seed and
kept in the file, so the comparison does not depend on how they were drawn.

What is recorded, per plan: the iteration time, each device group's peak memory, busy
time, end, all-reduce and optimizer step, and every action's and every transfer's start
and end (transfers sorted by cut, direction and microbatch).  Floats are stored with
``float.hex`` so that a difference in the last bit shows.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage, equal_split
from pipeplan.solver.schedules.schedule import group_programs, num_stages, stage_group

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "simulations.json"
SOLVER_GOLDEN = GOLDEN.with_name("solvers.json")
SOLVER_SEED = 7
SOLVER_SCHEDULES = ("1f1b", "interleaved-1f1b", "zbv")
QUICK_SECONDS = 0.5
"""A solve that took less than this when the set was written is also checked in the suite."""
SEED = 35
NAMED = ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


def _graph(rng: random.Random, layers: int, skips: bool) -> LayerGraph:
    built = []
    for i in range(layers):
        fa, fb = rng.choice((0.0, 1e-4)), rng.uniform(1e-4, 1e-3)
        ba, bb = 2 * fa, rng.uniform(1.5, 2.5) * fb
        act = rng.uniform(1e5, 1e6)
        v2 = rng.random() < 0.7
        built.append(Layer(f"l{i}", (fa, fb), (ba, bb), rng.uniform(1e6, 1e8), act, rng.uniform(1e4, 1e5),
                           bwd_w=(ba * 0.4, bb * rng.uniform(0.3, 0.6)) if v2 else None,
                           act_w=act * rng.uniform(0.2, 0.8) if v2 else None,
                           step=rng.uniform(1e-5, 1e-4) if v2 else None))
    edges = [(i, i + 1) for i in range(layers - 1)]
    if skips:
        edges += [(i, j) for i in range(layers) for j in range(i + 2, layers) if rng.random() < 0.15]
    return LayerGraph("golden", built, sorted(set(edges)), input_bytes=rng.uniform(1e3, 1e4))


def _cluster(rng: random.Random, devices: int) -> Cluster:
    servers = (Link(rng.uniform(5e10, 2e11), rng.uniform(1e-6, 1e-5), "s0"),
               Link(rng.uniform(5e9, 3e10), rng.uniform(1e-6, 2e-5), "s1"))
    devs = tuple(Device(f"d{i}", "s0" if i < devices // 2 else "s1", rng.choice((1.0, 0.7, 0.45)),
                        rng.uniform(1e10, 8e10)) for i in range(devices))
    return Cluster("golden", servers, Link(rng.uniform(1e9, 1.25e10), rng.uniform(1e-5, 3e-5)), devs)


def _bounds(rng: random.Random, layers: int, stages: int) -> list[tuple[int, int]]:
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    edges = [0, *cuts, layers]
    return list(zip(edges[:-1], edges[1:]))


def _unequal_split(rng: random.Random, batch: int, m: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, batch), m - 1))
    edges = [0, *cuts, batch]
    return tuple(b - a for a, b in zip(edges[:-1], edges[1:]))


def _one_stage_plans(rng: random.Random, schedule: str) -> tuple[Plan, LayerGraph, Cluster]:
    """gpipe, 1f1b or custom per-stage ops: unequal splits per stage, replicas, recompute."""
    stages = rng.randint(2, 4)
    layers = rng.randint(stages, stages + 5)
    graph, cluster = _graph(rng, layers, rng.random() < 0.5), _cluster(rng, stages * 2)
    ids = [d.id for d in cluster.devices]
    rng.shuffle(ids)
    batch = rng.choice((8, 12, 16))
    built = []
    for s, (lo, hi) in enumerate(_bounds(rng, layers, stages)):
        r = rng.choice((1, 1, 2))
        devices = tuple(ids[2 * s:2 * s + r])
        split = _unequal_split(rng, batch, rng.randint(2, 5)) if rng.random() < 0.5 else equal_split(batch, 4)
        ops = None
        if schedule == "custom":
            ops = tuple(_custom_ops(rng, len(split), s, stages))
        built.append(Stage((lo, hi), devices, split, rng.random() < 0.3, ops))
    return Plan("golden", "golden", batch, 4.0, schedule, tuple(built)), graph, cluster


def _custom_ops(rng: random.Random, m: int, s: int, stages: int) -> list[str]:
    """A 1F1B order with a random warm-up depth at least the plain one (always deadlock-free)."""
    w = min(m, stages - 1 - s + rng.randint(0, 2))
    ops = [f"F{k}" for k in range(w)]
    for i in range(m - w):
        ops += [f"F{w + i}", f"B{i}"]
    return ops + [f"B{k}" for k in range(m - w, m)]


def _group_plan(rng: random.Random, schedule: str) -> tuple[Plan, LayerGraph, Cluster]:
    """A named version-2 schedule: R groups of 1-2 devices, v stages per group."""
    groups = rng.randint(1 if schedule != "zbv" else 1, 3)
    virtual = 2 if schedule == "zbv" else rng.randint(1, 3)
    m = rng.choice((groups, 2 * groups, 4, 6)) if schedule != "zbv" else rng.randint(1, 6)
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        rounds = max(1, m // groups)
        m -= m % rounds
    stages = num_stages(schedule, groups, virtual)
    layers = stages + rng.randint(0, 4)
    graph, cluster = _graph(rng, layers, rng.random() < 0.5), _cluster(rng, 2 * groups)
    ids = [d.id for d in cluster.devices]
    rng.shuffle(ids)
    members = [tuple(ids[2 * g:2 * g + rng.choice((1, 2))]) for g in range(groups)]
    batch = m * rng.choice((1, 2, 3))
    split = _unequal_split(rng, batch, m) if rng.random() < 0.4 else equal_split(batch, m)
    built = tuple(Stage(b, members[stage_group(schedule, s, groups)], split, rng.random() < 0.25)
                  for s, b in enumerate(_bounds(rng, layers, stages)))
    return Plan("golden", "golden", batch, 4.0, schedule, built), graph, cluster


def _custom_program_plan(rng: random.Random) -> tuple[Plan, LayerGraph, Cluster]:
    """Custom programs: a named schedule's programs with every ``B`` split into ``I`` and a later ``W``."""
    plan, graph, cluster = _group_plan(rng, rng.choice(("interleaved-1f1b", "looped-bfs")))
    programs = group_programs(plan.schedule, len(plan.groups), len(plan.stages[0].microbatches), plan.virtual)
    written = []
    for program in programs:
        out, pending = [], []
        for a in program:
            if a.kind == "B":
                out.append(f"{a.stage}I{a.microbatch}")
                pending.append(f"{a.stage}W{a.microbatch}")
                if rng.random() < 0.5:
                    out.append(pending.pop(0))
            else:
                out.append(f"{a.stage}{a.kind}{a.microbatch}")
        written.append(tuple(out + pending))
    custom = Plan("golden", "golden", plan.global_batch, plan.state_factor, "custom", plan.stages,
                  custom_programs=tuple(written))
    return custom, graph, cluster


def draw_cases(count_per_kind: int = 6) -> list[dict]:
    """The plans of the golden set, with their graphs and clusters, as JSON objects."""
    rng = random.Random(SEED)
    cases = []
    makers = [("gpipe", lambda: _one_stage_plans(rng, "gpipe")), ("1f1b", lambda: _one_stage_plans(rng, "1f1b")),
              ("custom-ops", lambda: _one_stage_plans(rng, "custom")),
              *((name, lambda name=name: _group_plan(rng, name)) for name in NAMED),
              ("custom-programs", lambda: _custom_program_plan(rng))]
    for kind, make in makers:
        made = 0
        while made < count_per_kind:
            plan, graph, cluster = make()
            try:
                plan.validate(graph, cluster)
                simulate(plan, graph, cluster)
            except Exception:  # a draw torch's generators or the rules refuse: draw again
                continue
            cases.append({"kind": kind, "plan": plan.to_dict(), "graph": graph.to_dict(),
                          "cluster": cluster.to_dict()})
            made += 1
    return cases


def _hex(values) -> list[str]:
    return [float(v).hex() for v in values]


def record(plan: Plan, graph: LayerGraph, cluster: Cluster) -> dict:
    """Every number the simulator gives for ``plan``, as hex floats."""
    result = simulate(plan, graph, cluster)
    ops = sorted((e.group, e.stage, e.kind, e.microbatch, e.start, e.end) for e in result.ops)
    transfers = sorted((t.cut, t.direction, t.microbatch, t.start, t.end) for t in result.transfers)
    return {
        "iteration_time": float(result.iteration_time).hex(),
        "peak_memory": _hex(result.peak_memory),
        "busy": _hex(result.busy),
        "group_end": _hex(result.group_end),
        "fits": result.fits,
        "ops": [[g, s, k, mb, float(a).hex(), float(b).hex()] for g, s, k, mb, a, b in ops],
        "transfers": [[c, d, mb, float(a).hex(), float(b).hex()] for c, d, mb, a, b in transfers],
        "syncs": [[e.group, e.kind, float(e.start).hex(), float(e.end).hex()] for e in result.syncs],
    }


def solver_problem(schedule: str):
    """The small instance every solver is run on: 6 layers (with skips), 4 devices on 2 servers, 4 microbatches."""
    from pipeplan.solver.core.problem import PlanningProblem

    rng = random.Random(SOLVER_SEED)
    graph, cluster = _graph(rng, 6, True), _cluster(rng, 4)
    return PlanningProblem(graph, cluster, 8, 4, schedule)


def solve_record(schedule: str, name: str) -> dict:
    """What solver ``name`` returns on :func:`solver_problem` with seed 0: its plan, times, bound and status."""
    from pipeplan.solver.solvers import get_solver

    result = get_solver(name).solve(solver_problem(schedule), time_limit=60.0, seed=0)
    return {"status": result.status, "stopped_by": result.stopped_by,
            "iteration_time": None if result.iteration_time is None else float(result.iteration_time).hex(),
            "lower_bound": None if result.lower_bound is None else float(result.lower_bound).hex(),
            "plan": None if result.plan is None else result.plan.to_dict()}


def solver_cases() -> list[tuple[str, str]]:
    """(schedule, solver) for every solver that plans each of :data:`SOLVER_SCHEDULES`."""
    from pipeplan.solver.solvers import get_solver, solver_names

    return [(s, n) for s in SOLVER_SCHEDULES for n in solver_names() if s in get_solver(n).schedules]


def write_solvers() -> None:
    import time

    cases = []
    for schedule, name in solver_cases():
        start = time.perf_counter()
        got = solve_record(schedule, name)
        seconds = time.perf_counter() - start
        if got["stopped_by"] == "time":
            raise SystemExit(f"{name} on {schedule} hit its time limit: its plan would depend on the machine")
        cases.append({"schedule": schedule, "solver": name, "quick": seconds < QUICK_SECONDS, "expected": got})
        print(f"{schedule} {name}: {got['status']} in {seconds:.2f} s", file=sys.stderr)
    SOLVER_GOLDEN.write_text(json.dumps({"cases": cases}, indent=1) + "\n")


def check_solvers(quick_only: bool = False) -> list[str]:
    """The (schedule, solver) cases whose record differs from :data:`SOLVER_GOLDEN`."""
    differ = []
    for case in json.loads(SOLVER_GOLDEN.read_text())["cases"]:
        if quick_only and not case["quick"]:
            continue
        got = solve_record(case["schedule"], case["solver"])
        if got["stopped_by"] != "time" and got != case["expected"]:
            differ.append(f"{case['schedule']} {case['solver']}")
    return differ


def main() -> None:
    if "--solvers" in sys.argv:
        write_solvers()
        return
    if "--check-solvers" in sys.argv:
        differ = check_solvers()
        print("solver golden set: " + ("all equal" if not differ else "differ: " + ", ".join(differ)))
        raise SystemExit(1 if differ else 0)
    cases = draw_cases()
    for case in cases:
        case["expected"] = record(Plan.from_dict(case["plan"]), LayerGraph.from_dict(case["graph"]),
                                  Cluster.from_dict(case["cluster"]))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({"cases": cases}, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {len(cases)} cases to {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    main()
