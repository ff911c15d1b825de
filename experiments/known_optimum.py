"""Instances of 256 to 4,096 devices whose optimum is known, and how far plans and bounds are from it.

The family (:func:`known_problem`) is symmetric enough that an exhaustive search over
class-level descriptions of plans (:func:`class_optimum`) is complete: every layer is
the same block, every link (inside each server and between servers) is the same, no
tensor crosses a cut (``out = 0``, ``input_bytes = 0``), the batch splits into equal
microbatches, and the device classes are ordered alike by speed and memory (a faster
class never has less memory).  Two classes, 8 devices per server: four servers hold
fast devices, the rest slow ones (a few new servers in a large older cluster).

Completeness (why the search finds the optimum over *every* plan)
------------------------------------------------------------------
Describe a plan's stage by ``(l, c, r, f)``: its layer count, the class ``c`` of a slowest
device, its replica count and recompute flag.

1. *Its time and memory depend only on the description and the stage's position.*  Op
   times are ``l (a + b q_k) / v_c`` (identical layers, spec 4); every pair of devices
   talks at the same ``bw``/``lat``, so ``AR = 2 (r-1) (lat + l P / (r bw))`` and every
   transfer takes ``lat`` (no bytes cross a cut); the stage's smallest memory is class
   ``c``'s (a faster device has no less), and its peak depends on ``l``, ``q`` and its
   op list (spec 5).  So the plan's iteration time is :func:`pipeline_time` of its
   descriptions, and it fits exactly when each description fits at its position.
2. *The smallest ``r`` of a ``q``-class is no worse.*  All ``r`` with the same
   ``q_k = ceil(n_k / r)`` give the same op times and memory, transfers do not depend on
   ``r``, and ``AR`` grows with ``r``: replacing ``r`` by the smallest ``r_lo`` of its class
   keeps every duration or lowers it, and the timeline is monotone in its durations
   (a max-plus system with fixed op and link orders).  It also uses fewer devices.
3. *A description sequence is realisable exactly when it respects the nested device
   counts* ``sum_{s: v_{c_s} >= v} r_s <= #{devices of speed >= v}`` for each speed
   ``v``: necessary since a stage of class ``c`` uses devices of speed ``>= v_c``;
   sufficient by giving the stages of the fastest class devices first, then the next
   class the devices left of speed ``>= `` its own.  A stage given only faster devices
   than its class runs no slower and fits no worse (a description with a faster ``c``
   is also searched).

So ``min over plans = min over description sequences that respect the device counts
of pipeline_time``.  :func:`class_optimum` searches those sequences from the last
stage backwards (the position, hence the 1F1B warm-up, of each placed stage is known)
and prunes a partial sequence only when a path term of
:mod:`pipeplan.solver.bounds.class_paths` (proved there) of its placed stages, with the
unplaced layers at their cheapest, reaches the incumbent; at each full sequence it runs
:func:`pipeline_time`, which tests check against the simulator.  It is independent of
every bound it is used to judge (it shares only the path proofs and the timing).

A variant with four generations (``--generations 4``: ``bench_scale``'s speeds and
memories, four fast servers, the rest in thirds) keeps every symmetry but the number of
classes.

Usage::

    python -m pipeplan.experiments.known_optimum [--devices 256,1024,4096] [--generations 2,4]
        [--time-limit 60] [--model-time-limit 60] [--solvers group-search] [--out known.json]
        [--layers 8] [--microbatches 8] [--samples N] [--fast-servers 4]

prints, per size, the optimum, each solver's plan and its distance above the optimum,
each bound (the class bound, the class-level position model's, the path terms of the
optimal plan: :func:`paths_on`) and its distance below it, and the gap the plan and the
class bound prove together.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.solver.bounds.class_paths import path_bound, pipeline_time, stage_durations
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.evaluation.simulator import plan_costs
from pipeplan.solver.evaluation.memory import StageMemory, program_stash_peak
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.arcs import tau_ops
from pipeplan.solver.space.class_stages import q_classes
from pipeplan.solver.space.device_classes import device_classes

PER_SERVER = 8
"""Devices per server."""

FAST, SLOW = (1.0, 80e9), (0.3, 32e9)
"""``(speed, memory bytes)`` of the two classes."""

GENERATIONS = ((1.0, 80e9), (0.6, 40e9), (0.3, 32e9), (0.12, 16e9))
"""``(speed, memory bytes)`` of the four-generation variant (``bench_scale``'s generations)."""

LINK = (2.5e10, 2e-5)
"""``(bandwidth, latency)`` of every link, inside servers and between them."""

BLOCK = Layer("block", (2e-5, 1.5e-4), (4e-5, 3.0e-4), params=2.0e8, act=2.0e8, out=0.0)
"""Every layer of the family: a transformer block's times; its activations make memory depend on the warm-up."""

DEVICES = (256, 1024, 4096)


def known_cluster(devices: int, fast_servers: int = 4, generations: int = 2) -> Cluster:
    """``devices / 8`` servers, one link everywhere.  Two generations: the first ``fast_servers`` servers
    fast, the rest slow.  Four: the first ``fast_servers`` of :data:`GENERATIONS`' first, the rest in equal
    thirds of the other three (the slowest take what does not divide)."""
    servers = devices // PER_SERVER
    if servers * PER_SERVER != devices or servers <= fast_servers + (generations - 2):
        raise ValueError(f"{devices} devices: need a multiple of {PER_SERVER} above {PER_SERVER * fast_servers}")
    if generations not in (2, 4):
        raise ValueError(f"generations must be 2 or 4, got {generations}")
    table = (FAST, SLOW) if generations == 2 else GENERATIONS
    share = max(1, (servers - fast_servers) // (generations - 1))
    bw, lat = LINK
    links, devs = [], []
    for s in range(servers):
        gen = 0 if s < fast_servers else min(generations - 1, 1 + (s - fast_servers) // share)
        speed, memory = table[gen]
        links.append(Link(bw, lat, f"s{s}"))
        devs.extend(Device(f"s{s}g{k}", f"s{s}", speed, memory) for k in range(PER_SERVER))
    return Cluster(f"known-{devices}", tuple(links), Link(bw, lat), tuple(devs))


def microbatch_size(devices: int) -> int:
    """Samples per microbatch: 16 at 256 devices, doubling with every fourfold of devices (32 at 1,024,
    64 at 4,096), so a stage can use more replicas on a larger cluster."""
    return max(1, int(round(16 * math.sqrt(devices / 256))))


def known_problem(devices: int, layers: int = 8, microbatches: int = 8, schedule: str = "1f1b",
                  samples: int | None = None, fast_servers: int = 4, generations: int = 2,
                  allow_recompute: bool = True) -> PlanningProblem:
    """The family's instance on ``devices`` devices (see the module docstring): ``layers`` identical blocks,
    ``microbatches`` equal microbatches of ``samples`` samples (default :func:`microbatch_size`), the first
    ``fast_servers`` servers fast.

    Raises
    ------
    ValueError
        Unless ``devices`` is a multiple of 8 with more servers than ``fast_servers`` plus the
        other generations need (:func:`known_cluster`).

    Examples
    --------
    >>> problem = known_problem(256)
    >>> len(problem.graph), problem.global_batch, problem.microbatches, len(problem.cluster.devices)
    (8, 128, 8, 256)
    >>> check_symmetric(problem)
    """
    batch = microbatches * (samples if samples is not None else microbatch_size(devices))
    graph = LayerGraph.chain(f"blocks{layers}", [Layer(f"block.{i}", BLOCK.fwd, BLOCK.bwd, BLOCK.params, BLOCK.act,
                                                       BLOCK.out) for i in range(layers)], input_bytes=0.0)
    return PlanningProblem(graph, known_cluster(devices, fast_servers, generations), global_batch=batch,
                           microbatches=microbatches,
                           schedule=schedule, allow_recompute=allow_recompute)


def check_symmetric(problem: PlanningProblem) -> None:
    """Raise ``ValueError`` unless ``problem`` has every symmetry the completeness proof uses.

    Identical layers, no bytes across a cut, one link everywhere, equal microbatches, no
    faster class with less memory, a version-1 problem with equal sizes.
    """
    layers = problem.graph.layers
    first = layers[0]
    if any((l.fwd, l.bwd, l.params, l.act) != (first.fwd, first.bwd, first.params, first.act) for l in layers):
        raise ValueError("the layers differ")
    if any(problem.graph.cut_bytes(c) for c in range(len(layers) - 1)) or problem.graph.input_bytes:
        raise ValueError("bytes cross a cut")
    links = {(s.bandwidth, s.latency) for s in problem.cluster.servers} | {
        (problem.cluster.network.bandwidth, problem.cluster.network.latency)}
    if len(links) != 1:
        raise ValueError("the links differ")
    if len(set(problem.split)) != 1:
        raise ValueError("the microbatches differ in size")
    classes = device_classes(problem.cluster)
    if any(a.memory < b.memory for a, b in zip(classes, classes[1:])):
        raise ValueError("a faster class has less memory")
    if problem.needs.several_stages or problem.free_sizes:
        raise ValueError("version-1 equal-split problems only")


# ------------------------------------------------------------------------------------------------ search
@dataclass(frozen=True)
class Kind:
    """A stage description up to its layer count: slowest class, replicas (smallest of its q-class), recompute."""

    cls: int
    replicas: int
    recompute: bool


@dataclass
class KnownOptimum:
    """The result of :func:`class_optimum`."""

    time: float
    """The optimum iteration time (``inf`` when no plan fits)."""
    plan: Plan | None
    """A plan that runs in :attr:`time`."""
    stages: list[tuple[int, Kind]]
    """Its descriptions in pipeline order: ``(layers, kind)``."""
    nodes: int
    """Partial sequences the search visited."""
    leaves: int
    """Full sequences it timed."""
    seconds: float
    complete: bool
    """Whether the search finished (``time`` is then the optimum)."""
    lower: float = 0.0
    """A proved lower bound (``time`` when complete)."""
    trace: list = field(default_factory=list)


def class_optimum(problem: PlanningProblem, upper: float = math.inf, node_limit: int = 50_000_000,
                  tolerance: float = 1e-12) -> KnownOptimum:
    """The optimum of a symmetric problem by an exhaustive class-level search (module docstring).

    Parameters
    ----------
    problem : PlanningProblem
        Passes :func:`check_symmetric`.
    upper : float
        A known plan's time: the search only looks for faster ones (and reports ``upper``
        with no plan when none is; give ``inf`` to find the plan).
    node_limit : int
        Counted work: partial sequences visited before the search stops (then
        ``complete`` is false and ``lower`` the smallest bound left unexplored).
    tolerance : float
        Relative: a partial sequence whose bound is within this of the incumbent is pruned.

    Returns
    -------
    KnownOptimum
        With ``complete`` true, ``time`` is the optimum over every plan and ``plan`` one
        that runs in it (``None`` when none beats ``upper``); otherwise ``time`` is the best
        found and ``lower`` a proved bound.

    Examples
    --------
    >>> found = class_optimum(known_problem(40, layers=4, microbatches=4, samples=4, fast_servers=2))
    >>> found.complete, round(1e3 * found.time, 2), [(l, kd.replicas) for l, kd in found.stages]
    (True, 13.22, [(1, 1), (1, 1), (1, 1), (1, 1)])
    """
    check_symmetric(problem)
    start = time.perf_counter()
    L, M = len(problem.graph), len(problem.split)
    n = problem.split[0]
    block = problem.graph.layers[0]
    cluster = problem.cluster
    classes = device_classes(cluster)
    bw, lat = cluster.network.bandwidth, cluster.network.latency
    speeds = [c.speed for c in classes]
    nested = [sum(c.count for c in classes if c.speed >= v) for v in speeds]
    one_f_one_b = problem.needs.warmup_per_later_stage
    flags = (False, True) if problem.allow_recompute else (False,)
    kinds: list[Kind] = []
    for c, cls in enumerate(classes):
        most = nested[c] if problem.allow_replication else 1
        for r_lo, _, _ in q_classes(problem.split, most):
            for f in flags:
                kinds.append(Kind(c, r_lo, f))
    # terms[l][i]: l layers of kind i: (fwd, bwd, AR, largest fitting warm-up)
    terms: list[list[tuple[float, float, float, int]]] = [[] for _ in range(L + 1)]
    warmups = range(M + 1) if one_f_one_b else range(1)
    for l in range(1, L + 1):
        for kd in kinds:
            v = speeds[kd.cls]
            q = -(-n // kd.replicas)
            f = l * (block.fwd[0] + block.fwd[1] * q) / v
            b = l * (block.bwd[0] + block.bwd[1] * q) / v + (f if kd.recompute else 0.0)
            r = kd.replicas
            ar = 2 * (r - 1) * (lat + l * block.params / (r * bw)) if r > 1 and block.params > 0 else 0.0
            state = problem.state_factor * l * block.params
            fits = -1
            for w in warmups:
                ops = tau_ops(problem.schedule, M, w)
                stash = l * block.act if not kd.recompute else 0.0  # no input bytes: recompute keeps nothing
                memory = StageMemory((q,) * M, stash, l * block.act if kd.recompute else 0.0, 0.0)
                peak = state + program_stash_peak(ops, {0: memory})
                if peak <= classes[kd.cls].memory:
                    fits = w
                else:
                    break
            if not one_f_one_b and fits == 0:
                fits = M  # gpipe: the op list does not depend on the position
            terms[l].append((f, b, ar, fits))
    limit = problem.stage_limit

    best = [upper, None]
    counters = [0, 0]
    stopped = [False]
    frontier_low = [math.inf]
    # the suffix, last stage first: (layers, kind index)
    suffix: list[tuple[int, int]] = []
    used = [0] * len(classes)

    by_f = sorted(range(len(kinds)), key=lambda i: terms[1][i][0])
    by_u = sorted(range(len(kinds)), key=lambda i: terms[1][i][0] + terms[1][i][1])

    def cheapest_layer() -> tuple[float, float]:
        """``(TF, TF + TB)`` of one layer on the cheapest kind the devices left still allow (for the prefix)."""
        f_best = next((terms[1][i][0] for i in by_f if fits_devices(kinds[i])), math.inf)
        u_best = next((terms[1][i][0] + terms[1][i][1] for i in by_u if fits_devices(kinds[i])), math.inf)
        return f_best, u_best

    def bound(h: int) -> float:
        """Largest path term of the placed stages with the h unplaced layers at their cheapest."""
        S_known = len(suffix)
        if not S_known:
            return 0.0
        per_layer_f, per_layer_u = cheapest_layer() if h else (0.0, 0.0)
        if h and not math.isfinite(per_layer_u):
            return math.inf  # no device left for the layers still to place
        # pipeline order: placed stages are the last S_known, suffix[0] is the last stage
        order = list(reversed(suffix))
        fw = [terms[l][i][0] for l, i in order]
        bk = [terms[l][i][1] for l, i in order]
        ar = [terms[l][i][2] for l, i in order]
        t = [lat] * S_known
        t[-1] = 0.0
        passes = [fw[j] + bk[j] + 2 * t[j] for j in range(S_known)]
        head_pre = (h * per_layer_f + lat) if h else 0.0
        pass_pre = (h * per_layer_u + 2 * lat) if h else 0.0
        best_term = 0.0
        for p in range(S_known):
            k = S_known - 1 - p  # later stages
            busy = M * (fw[p] + bk[p])
            heads = head_pre + sum(fw[j] + t[j] for j in range(p))
            best_term = max(best_term, heads + busy + ar[p])
            after = sum(passes[p + 1:])
            w = min(k, M) if one_f_one_b else M
            crit = busy - min(w, M - 1) * fw[p] if one_f_one_b else busy
            cores = [crit + 2 * t[p] + after]
            if one_f_one_b and w <= M - 2:
                cores.append(busy - w * (fw[p] + bk[p]) + 4 * t[p] + 2 * after)
            lead0 = pass_pre + sum(passes[:p])
            for c in cores:
                best_term = max(best_term, lead0 + c)
                for e in range(p + 1):
                    lead = head_pre + sum(fw[j] + t[j] for j in range(e)) + ar[e] + sum(passes[e:p])
                    best_term = max(best_term, lead + c)
        return best_term

    def leaf() -> float:
        order = list(reversed(suffix))
        S = len(order)
        fw = [[terms[l][i][0]] * M for l, i in order]
        bk = [[terms[l][i][1]] * M for l, i in order]
        return pipeline_time(problem.schedule, fw, bk, [[lat] * M for _ in range(S - 1)],
                             [terms[l][i][2] for l, i in order])

    plain = {i: kinds.index(Kind(kd.cls, kd.replicas, False)) for i, kd in enumerate(kinds) if kd.recompute}

    def plain_fits(l: int, i: int, position: int) -> bool:
        fits = terms[l][plain[i]][3]
        return fits >= min(position, M) if one_f_one_b else fits >= 0

    def fits_devices(kd: Kind) -> bool:
        for c in range(len(classes)):
            if speeds[kd.cls] >= speeds[c] and sum(
                    used[x] for x in range(len(classes)) if speeds[x] >= speeds[c]) + kd.replicas > nested[c]:
                return False
        return True

    def search(h: int, value: float) -> None:
        if stopped[0] or counters[0] >= node_limit:
            stopped[0] = True
            frontier_low[0] = min(frontier_low[0], value)  # this subtree is left unexplored
            return
        counters[0] += 1
        if h == 0:
            counters[1] += 1
            value = leaf()
            if value < best[0]:
                best[0] = value
                best[1] = list(suffix)
            return
        position = len(suffix)
        if position >= limit:
            return
        children = []
        for l in range(1, h + 1):
            if h - l and position + 1 >= limit:
                continue
            for i, kd in enumerate(kinds):
                f, b, ar, fits = terms[l][i]
                if fits < min(position, M) if one_f_one_b else fits < 0:
                    continue
                if kd.recompute and plain_fits(l, i, position):
                    continue  # the same stage without recompute fits: it is no slower (module docstring, 2)
                if M * (f + b) + ar >= best[0] * (1 - tolerance):
                    continue
                if not fits_devices(kd):
                    continue
                suffix.append((l, i))
                used[kd.cls] += kd.replicas
                value = bound(h - l)
                used[kd.cls] -= kd.replicas
                suffix.pop()
                if value < best[0] * (1 - tolerance):
                    children.append((value, l, i))
        children.sort()
        for value, l, i in children:
            if value >= best[0] * (1 - tolerance):
                break
            kd = kinds[i]
            suffix.append((l, i))
            used[kd.cls] += kd.replicas
            search(h - l, value)
            used[kd.cls] -= kd.replicas
            suffix.pop()

    search(L, 0.0)
    seconds = time.perf_counter() - start
    complete = not stopped[0]
    opt = best[0]
    stages = [(l, kinds[i]) for l, i in reversed(best[1])] if best[1] else []
    plan = realize(problem, stages) if stages else None
    lower = opt if complete else min(opt, frontier_low[0])
    return KnownOptimum(opt, plan, stages, counters[0], counters[1], seconds, complete, lower)


def realize(problem: PlanningProblem, stages: list[tuple[int, Kind]]) -> Plan:
    """A plan with these descriptions: each class's stages take devices of that class first, then faster ones."""
    classes = device_classes(problem.cluster)
    free = {c: [d for _, ids in cls.ids_by_server for d in ids] for c, cls in enumerate(classes)}
    order = sorted(range(len(stages)), key=lambda s: -classes[stages[s][1].cls].speed)
    groups: dict[int, list[str]] = {}
    for s in order:
        kd = stages[s][1]
        take = []
        for c in sorted(free, key=lambda x: classes[x].speed):
            if classes[c].speed < classes[kd.cls].speed:
                continue
            while free[c] and len(take) < kd.replicas:
                take.append(free[c].pop(0))
        if len(take) < kd.replicas:
            raise ValueError("the descriptions need more devices than the cluster has")
        groups[s] = take
    bounds, lo = [], 0
    for l, _ in stages:
        bounds.append((lo, lo + l))
        lo += l
    return problem.make_plan(bounds, [groups[s] for s in range(len(stages))], [kd.recompute for _, kd in stages])


# ------------------------------------------------------------------------------------------------ report
SOLVERS = ("group-search",)
"""Solvers run by default.  ``ilp`` and ``cpsat`` build no model above 64 devices: they return
group-search's plan and the class bound, so their rows add nothing to its and the class bound's."""


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send fd 1 to fd 2 (HiGHS prints its banner from C++), so that the child's last stdout line is its JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_child(devices: int, generations: int, solver: str, time_limit: float, **shape) -> dict:
    """One solver on the family's instance (:func:`known_problem` with ``shape``) in this process (the child's side)."""
    from pipeplan.solver.solvers import get_solver, solver_names
    solver_names()
    problem = known_problem(devices, generations=generations, **shape)
    start = time.perf_counter()
    with _stdout_to_stderr():
        result = get_solver(solver).solve(problem, time_limit=time_limit, seed=0)
    plan = result.plan
    return {"solver": solver, "status": result.status, "iteration_time": result.iteration_time,
            "lower_bound": result.lower_bound, "wall_time": time.perf_counter() - start,
            "stages": None if plan is None else [[st.layers[1] - st.layers[0], len(st.devices), st.recompute]
                                                 for st in plan.stages],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def run_solver(devices: int, generations: int, solver: str, time_limit: float, **shape) -> dict:
    """:func:`run_child` in a fresh interpreter (its peak memory is its own)."""
    cmd = [sys.executable, "-m", "pipeplan.experiments.known_optimum", "--child", solver,
           "--devices", str(devices), "--generations", str(generations), "--time-limit", str(time_limit)]
    cmd += [f"--{key.replace('_', '-')}={value}" for key, value in shape.items() if value is not None]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * time_limit + 60)
    except subprocess.TimeoutExpired:
        return {"solver": solver, "status": "killed", "iteration_time": None, "lower_bound": None}
    if done.returncode:
        return {"solver": solver, "status": "error", "iteration_time": None, "lower_bound": None,
                "message": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""}
    return json.loads(done.stdout.strip().splitlines()[-1])


def paths_on(problem: PlanningProblem, plan: Plan) -> float:
    """:func:`pipeplan.solver.bounds.class_paths.path_bound` of ``plan``'s own durations, work term included.

    Each term is at most the plan's time.  For the optimal plan it is also the most the class-level
    position model can prove (:mod:`pipeplan.solver.exact.class_model`): the model's optimum is at most
    its value at the optimal plan's configuration, whose rows are these terms with every duration
    replaced by a lower bound.  So a model bound far below it is a weak relaxation or a short solve,
    and this value far below the optimum means that path terms alone cannot close the gap.
    """
    speed = problem.cluster.device_index
    durations = stage_durations(plan_costs(plan, problem.graph, problem.cluster))
    return path_bound(problem.schedule, *durations,
                      [len(st.devices) * min(speed[d].speed for d in st.devices) for st in plan.stages],
                      sum(d.speed for d in problem.cluster.devices))


def measure(devices: int, generations: int, solvers: list[str], time_limit: float,
            model_time_limit: float, **shape) -> dict:
    """The optimum of one size (:func:`known_problem` with ``shape``), and every plan's and bound's distance to it."""
    from pipeplan.solver.bounds.class_bound import class_bound
    from pipeplan.solver.exact.class_model import solve_class_model
    problem = known_problem(devices, generations=generations, **shape)
    found = class_optimum(problem)
    opt = found.time
    row = {"devices": devices, "generations": generations, "layers": len(problem.graph),
           "fast_servers": shape.get("fast_servers", 4), "global_batch": problem.global_batch,
           "microbatches": problem.microbatches, "optimum": opt, "complete": found.complete,
           "search_nodes": found.nodes, "search_seconds": found.seconds,
           "optimal_stages": [[l, kd.cls, kd.replicas, kd.recompute] for l, kd in found.stages]}
    start = time.perf_counter()
    row["class_bound"] = class_bound(problem)
    row["class_bound_seconds"] = time.perf_counter() - start
    row["paths_on_optimum"] = paths_on(problem, found.plan) if found.plan is not None else None
    if model_time_limit > 0:
        with _stdout_to_stderr():
            model = solve_class_model(problem, model_time_limit)
        row["model"] = {"bound": model.bound, "plan": model.iteration_time if math.isfinite(model.iteration_time)
                        else None, "status": model.status, "nodes": model.nodes, "seconds": model.seconds,
                        "size": list(model.model_size), "time_limit": model_time_limit}
    row["solvers"] = {name: run_solver(devices, generations, name, time_limit, **shape) for name in solvers}
    return row


def _pct(value: float | None, opt: float) -> str:
    return "-" if value is None else f"{100 * (value - opt) / opt:+.1f} %"


def _gap(plan: float | None, bound: float | None) -> str:
    return "-" if plan is None or bound is None else f"{100 * (plan - bound) / plan:.1f} %"


def markdown(rows: list[dict]) -> str:
    """Plans above the optimum (+) and bounds below it (-), per size; then the gap they would prove together."""
    names = list(rows[0]["solvers"]) if rows else []
    head = (["devices, generations", "optimum (search time)"] + [f"`{n}` plan" for n in names]
            + ["class bound", "position model bound (its plan)", "path terms of the optimal plan"]
            + [f"gap `{n}` plan / class bound" for n in names])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        opt = r["optimum"]
        plans = [r["solvers"][n].get("iteration_time") for n in names]
        model = r.get("model")
        cells = ([f"{r['devices']}, {r.get('generations', 2)}", f"{1e3 * opt:.2f} ms ({r['search_seconds']:.1f} s)"]
                 + [_pct(t, opt) for t in plans]
                 + [_pct(r["class_bound"], opt),
                    f"{_pct(model['bound'], opt)} ({_pct(model['plan'], opt)})" if model else "-",
                    _pct(r.get("paths_on_optimum"), opt)]
                 + [_gap(t, r["class_bound"]) for t in plans])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)))
    parser.add_argument("--generations", default="2,4", help="device generations of the variants (2, 4 or both)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver")
    parser.add_argument("--model-time-limit", type=float, default=60.0,
                        help="seconds for the class-level position model (0: leave it out)")
    parser.add_argument("--solvers", default=",".join(SOLVERS))
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--layers", type=int, default=8, help="blocks in the chain")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--samples", type=int, help="samples per microbatch (default: 16 at 256 devices, "
                                                    "doubling with every fourfold of devices)")
    parser.add_argument("--fast-servers", type=int, default=4, help="servers of the fastest generation")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = {"layers": args.layers, "microbatches": args.microbatches, "samples": args.samples,
             "fast_servers": args.fast_servers}
    if args.child:
        print(json.dumps(run_child(int(args.devices), int(args.generations), args.child, args.time_limit, **shape)))
        return 0
    rows = []
    for generations in (int(g) for g in args.generations.split(",")):
        for devices in (int(d) for d in args.devices.split(",")):
            rows.append(measure(devices, generations, [s for s in args.solvers.split(",") if s], args.time_limit,
                                args.model_time_limit, **shape))
            print(f"  {devices} devices, {generations} generations done", file=sys.stderr, flush=True)
            if args.out:
                atomic_write_text(args.out, json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
