"""``nsga``: NSGA-II over pipelines and microbatch splits, with UMPIPE's two chromosomes.

An individual is one integer vector made of two chromosomes (UMPIPE's DGAP idea,
``papers.md`` §1.3):

- chromosome A, the pipeline: ``S_max - 1`` cut genes (each distinct value in
  ``1 .. L-1`` is a stage boundary), one stage label per device (0: unused) and one
  recompute bit per stage;
- chromosome B, the splits: ``K`` size genes (0: no microbatch), one row shared by all
  stages, or one row per stage with ``per_stage``.

:class:`Codec` repairs every vector into a valid plan (stages contiguous and non-empty,
device groups non-empty and disjoint, sizes positive and summing to the batch, counts
within :attr:`PlanningProblem.split_counts`) and writes the repaired genes back, so the
population only ever holds valid individuals.  The crossover exchanges chromosome A as
a block or by one point, and chromosome B row by row; the mutation moves a cut, relabels
a device, flips recompute, moves samples between microbatches, or splits / merges one.

Objectives (pymoo :class:`~pymoo.core.problem.Problem`, evaluated a population at a
time by the batched simulator): iteration time and peak memory (largest per-device
peak, bytes); one inequality constraint, the worst relative memory overuse (``<= 0``
fits).  The population is seeded with the plans its caller gives (:class:`Nsga`'s
``seeding``; the registered ``nsga`` is seeded by :func:`pipeplan.solver.portfolio.nsga_seeds`:
group-search, the baselines and the exact solvers' proved plans).  The search stops
after ``generations`` (same seed, same plan) or at the time limit, whichever comes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.crossover import Crossover
from pymoo.core.mutation import Mutation
from pymoo.core.problem import Problem
from pymoo.core.repair import Repair
from pymoo.core.sampling import Sampling
from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

from pipeplan.solver.evaluation.batched import BatchSimulator, Candidate
from pipeplan.solver.bounds.infeasibility import heuristic_no_plan
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.core.termination import TimeLimit, WorkBudget

__all__ = ["Codec", "PlanProblem", "FrontPoint", "NsgaRun", "Seeding", "run_nsga", "Nsga"]

MAX_POPULATION = 4096
"""Largest population: pymoo's duplicate check holds a population-squared distance matrix."""

SEEDING_SHARE = 0.5
"""Fraction of the time limit that caps the seeding, and each seeding solver in it (see
:func:`pipeplan.solver.portfolio.nsga_seeds`): a cap over counted work, so only a machine slow enough
to reach it changes the seeds.  At 64 layers x 16 devices the exact seed's walk took 13 s on the
loaded 2-core machine this was measured on."""

BIG = 1e30
"""Objective value of a deadlocking individual, and the clip of every time (pymoo needs finite numbers)."""


# --------------------------------------------------------------------------- encoding
@dataclass
class Codec:
    """The two-chromosome integer encoding of plans for one problem, and its repair."""

    problem: PlanningProblem
    """The problem."""
    devices: tuple[str, ...] = field(init=False)
    """Device ids, in cluster order."""
    max_stages: int = field(init=False)
    """``S_max``."""
    slots: int = field(init=False)
    """``K``: size genes per row."""
    rows: int = field(init=False)
    """Split rows: ``S_max`` with ``per_stage``, else 1."""

    def __post_init__(self) -> None:
        p = self.problem
        self.devices = tuple(d.id for d in p.cluster.devices)
        self.max_stages = p.stage_limit
        self.slots = max(p.split_counts)
        self.rows = self.max_stages if p.per_stage else 1

    # layout: [cuts | device labels | recompute bits | size rows]
    @property
    def n_cuts(self) -> int:
        return self.max_stages - 1

    @property
    def a_len(self) -> int:
        """Length of chromosome A."""
        return self.n_cuts + len(self.devices) + self.max_stages

    @property
    def n_var(self) -> int:
        return self.a_len + self.rows * self.slots

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper gene bounds."""
        layers, batch = len(self.problem.graph), self.problem.global_batch
        xu = np.concatenate([np.full(self.n_cuts, layers), np.full(len(self.devices), self.max_stages),
                             np.ones(self.max_stages), np.full(self.rows * self.slots, batch)])
        return np.zeros(self.n_var, dtype=int), xu.astype(int)

    def encode(self, plan: Plan) -> np.ndarray:
        """Genes of a plan (its splits truncated/merged to ``K`` slots if needed)."""
        x = np.zeros(self.n_var, dtype=int)
        cuts = [st.layers[0] for st in plan.stages[1:]]
        x[:len(cuts)] = cuts
        for s, st in enumerate(plan.stages):
            for d in st.devices:
                x[self.n_cuts + self.devices.index(d)] = s + 1
            x[self.n_cuts + len(self.devices) + s] = int(st.recompute)
        for t in range(self.rows):
            split = plan.stages[min(t, len(plan.stages) - 1)].microbatches
            split = _fit_count(list(split), 1, self.slots)
            x[self.a_len + t * self.slots:self.a_len + t * self.slots + len(split)] = split
        return self.repair(x)

    def decode(self, x: np.ndarray) -> Candidate:
        """The plan of a repaired vector."""
        cuts = sorted({int(c) for c in x[:self.n_cuts] if 0 < c < len(self.problem.graph)})
        bounds = tuple(zip([0, *cuts], [*cuts, len(self.problem.graph)]))
        stages = len(bounds)
        labels = x[self.n_cuts:self.n_cuts + len(self.devices)]
        groups = tuple(tuple(d for d, l in zip(self.devices, labels) if l == s + 1) for s in range(stages))
        rc = tuple(bool(b) for b in x[self.n_cuts + len(self.devices):self.a_len][:stages])
        splits = tuple(self._row(x, s if self.problem.per_stage else 0) for s in range(stages))
        return Candidate(bounds, groups, rc, splits)

    def _row(self, x: np.ndarray, t: int) -> tuple[int, ...]:
        genes = x[self.a_len + t * self.slots:self.a_len + (t + 1) * self.slots]
        return tuple(int(g) for g in genes if g > 0)

    def repair(self, x: np.ndarray) -> np.ndarray:
        """A valid copy of ``x``; see the module docstring for the rules."""
        p = self.problem
        x = np.array(x, dtype=int)
        layers = len(p.graph)
        cuts = sorted({int(c) for c in x[:self.n_cuts] if 0 < c < layers})
        cap = min(self.max_stages, len(self.devices))
        cuts = cuts[:cap - 1]
        labels = x[self.n_cuts:self.n_cuts + len(self.devices)].copy()
        while True:
            groups = _assign(labels, len(cuts) + 1, p.allow_replication)
            if groups is not None:
                break
            cuts = cuts[:-1]  # too few devices for this many stages: merge the last two
        stages = len(cuts) + 1
        x[:self.n_cuts] = 0
        x[:len(cuts)] = cuts
        labels[:] = 0
        for s, members in enumerate(groups):
            labels[members] = s + 1
        x[self.n_cuts:self.n_cuts + len(self.devices)] = labels
        rc = x[self.n_cuts + len(self.devices):self.a_len]
        rc[:] = np.clip(rc, 0, 1) if p.allow_recompute else 0
        rc[stages:] = 0
        counts = p.split_counts
        for t in range(self.rows):
            lo = self.a_len + t * self.slots
            genes = [max(0, int(g)) for g in x[lo:lo + self.slots]]
            split = _fit_sum(_fit_count([g for g in genes if g > 0] or [1], counts.start, counts.stop - 1),
                             p.global_batch) if p.free_sizes else list(p.split)  # M fixed: M equal
            x[lo:lo + self.slots] = 0
            x[lo:lo + len(split)] = split
        return x


def _assign(labels: np.ndarray, stages: int, replication: bool) -> list[list[int]] | None:
    """Device indices of every stage from the labels, each group non-empty, or ``None``."""
    groups: list[list[int]] = [[] for _ in range(stages)]
    free = []
    for d, label in enumerate(labels):
        if label <= 0:
            free.append(d)
        else:
            groups[(int(label) - 1) % stages].append(d)
    if not replication:
        for g in groups:
            free.extend(g[1:])
            del g[1:]
        free.sort()
    for g in groups:
        if g:
            continue
        if free:
            g.append(free.pop(0))
            continue
        donor = max(groups, key=len)
        if len(donor) < 2:
            return None
        g.append(donor.pop())
    return groups


def _fit_count(values: list[int], lo: int, hi: int) -> list[int]:
    """``values`` with adjacent smallest pairs merged / largest halved until ``lo <= len <= hi``."""
    v = list(values)
    while len(v) > hi:
        i = min(range(len(v) - 1), key=lambda j: (v[j] + v[j + 1], j))
        v[i:i + 2] = [v[i] + v[i + 1]]
    while len(v) < lo:
        i = max(range(len(v)), key=lambda j: (v[j], -j))
        half = max(1, v[i] // 2)
        v[i:i + 1] = [half, max(1, v[i] - half)]
    return v


def _fit_sum(values: list[int], total: int) -> list[int]:
    """Positive integers in proportion to ``values`` that sum to ``total`` (largest remainders)."""
    s = sum(values)
    if s == total:
        return values
    exact = [v * total / s for v in values]
    out = [max(1, math.floor(e)) for e in exact]
    diff = total - sum(out)
    order = sorted(range(len(out)), key=lambda j: (-(exact[j] - math.floor(exact[j])), j))
    i = 0
    while diff > 0:
        out[order[i % len(out)]] += 1
        diff -= 1
        i += 1
    while diff < 0:  # minimums pushed the sum over: take from the largest
        j = max(range(len(out)), key=lambda k: (out[k], -k))
        out[j] -= 1
        diff += 1
    return out


# --------------------------------------------------------------------------- pymoo pieces
class PlanProblem(Problem):
    """Two objectives (time, peak memory) and one constraint (memory overuse), batched."""

    def __init__(self, codec: Codec) -> None:
        xl, xu = codec.bounds()
        super().__init__(n_var=codec.n_var, n_obj=2, n_ieq_constr=1, xl=xl, xu=xu, vtype=int)
        self.codec = codec
        p = codec.problem
        self.sim = BatchSimulator(p.graph, p.cluster, p.schedule, p.state_factor)
        self.archive: dict[bytes, tuple[np.ndarray, float, float, float]] = {}
        """Every evaluated individual: genes, time, peak memory, overuse."""

    def _evaluate(self, X, out, *args, **kwargs):
        X = np.asarray(X, dtype=int)
        res = self.sim.evaluate([self.codec.decode(x) for x in X])
        # pymoo's objectives are clipped at BIG; the archive keeps the simulated time itself
        # (inf only for a deadlock), so a slow plan is never mistaken for a missing one
        t = np.where(np.isfinite(res.iteration_time), np.minimum(res.iteration_time, BIG), BIG)
        over = np.where(np.isfinite(res.overuse), res.overuse, BIG)
        out["F"] = np.column_stack([t, res.peak_memory])
        out["G"] = over[:, None]
        for x, ti, mi, oi in zip(X, res.iteration_time, res.peak_memory, over):
            self.archive.setdefault(x.tobytes(), (x.copy(), float(ti), float(mi), float(oi)))


class CodecRepair(Repair):
    """Applies :meth:`Codec.repair` to every individual."""

    def _do(self, problem, X, **kwargs):
        return np.array([problem.codec.repair(x) for x in np.asarray(X, dtype=int)])


class SeededSampling(Sampling):
    """The seed individuals first, then random ones (repaired)."""

    def __init__(self, seeds: Sequence[np.ndarray]) -> None:
        super().__init__()
        self.seeds = [np.asarray(s, dtype=int) for s in seeds]

    def _do(self, problem, n_samples, *args, random_state=None, **kwargs):
        xl, xu = problem.xl, problem.xu
        out = list(self.seeds[:n_samples])
        while len(out) < n_samples:
            out.append(problem.codec.repair(random_state.integers(xl, xu + 1)))
        return np.array(out)


class TwoChromosomeCrossover(Crossover):
    """Chromosome A: block swap or one-point; chromosome B: row-wise exchange."""

    def __init__(self, prob: float = 0.9) -> None:
        super().__init__(2, 2, prob=prob)

    def _do(self, problem, X, *args, random_state=None, **kwargs):
        codec = problem.codec
        _, n_matings, _ = X.shape
        Y = X.copy()
        for i in range(n_matings):
            a, b = X[0, i].copy(), X[1, i].copy()
            if random_state.random() < 0.5:
                a[:codec.a_len], b[:codec.a_len] = X[1, i, :codec.a_len], X[0, i, :codec.a_len]
            else:
                cut = int(random_state.integers(1, codec.a_len)) if codec.a_len > 1 else 0
                a[cut:codec.a_len], b[cut:codec.a_len] = X[1, i, cut:codec.a_len], X[0, i, cut:codec.a_len]
            for t in range(codec.rows):
                if random_state.random() < 0.5:
                    lo, hi = codec.a_len + t * codec.slots, codec.a_len + (t + 1) * codec.slots
                    a[lo:hi], b[lo:hi] = X[1, i, lo:hi], X[0, i, lo:hi]
            Y[0, i], Y[1, i] = a, b
        return Y


class TwoChromosomeMutation(Mutation):
    """One structural move on chromosome A and/or one sample move on chromosome B."""

    def _do(self, problem, X, *args, random_state=None, **kwargs):
        codec = problem.codec
        rng = random_state
        X = np.array(X, dtype=int)
        for x in X:
            if rng.random() < 0.5:
                self._mutate_a(codec, x, rng)
            if rng.random() < 0.8:
                self._mutate_b(codec, x, rng)
        return X

    @staticmethod
    def _mutate_a(codec: Codec, x: np.ndarray, rng) -> None:
        move = rng.integers(3)
        if move == 0 and codec.n_cuts:  # shift or add/drop a boundary
            i = int(rng.integers(codec.n_cuts))
            x[i] = x[i] + int(rng.choice([-1, 1])) if x[i] > 0 and rng.random() < 0.7 else \
                int(rng.integers(0, len(codec.problem.graph)))
        elif move == 1:  # move a device to another stage or out of use
            d = int(rng.integers(len(codec.devices)))
            x[codec.n_cuts + d] = int(rng.integers(0, codec.max_stages + 1))
        else:  # flip a recompute bit
            s = int(rng.integers(codec.max_stages))
            x[codec.n_cuts + len(codec.devices) + s] ^= 1

    @staticmethod
    def _mutate_b(codec: Codec, x: np.ndarray, rng) -> None:
        t = int(rng.integers(codec.rows))
        lo = codec.a_len + t * codec.slots
        row = x[lo:lo + codec.slots]
        used = int((row > 0).sum())
        move = rng.integers(3)
        if move == 0 and used >= 2:  # move samples between two microbatches
            i, j = rng.choice(used, 2, replace=False)
            delta = int(rng.integers(1, max(2, row[i])))
            if row[i] > delta:
                row[i] -= delta
                row[j] += delta
        elif move == 1 and used < codec.slots:  # split one microbatch
            i = int(rng.integers(used)) if used else 0
            if row[i] >= 2:
                half = row[i] // 2
                row[i + 1:used + 1] = row[i:used].copy()
                row[i], row[i + 1] = half, row[i] - half
        elif used >= 2:  # merge two neighbours
            i = int(rng.integers(used - 1))
            row[i] += row[i + 1]
            row[i + 1:used] = np.append(row[i + 2:used], 0)[:used - i - 1]
            row[used - 1] = 0


# --------------------------------------------------------------------------- running
@dataclass(frozen=True)
class FrontPoint:
    """One non-dominated fitting plan."""

    plan: Plan
    """The plan."""
    iteration_time: float
    """Seconds per iteration (simulator)."""
    peak_memory: float
    """Largest per-device peak memory (bytes, simulator)."""


@dataclass(frozen=True)
class NsgaRun:
    """What one NSGA-II run found."""

    front: tuple[FrontPoint, ...]
    """Non-dominated fitting plans over everything evaluated, fastest first."""
    generations: int
    """Generations run."""
    evaluations: int
    """Distinct individuals evaluated."""
    stopped_by_time: bool
    """Whether the time limit (not the generation count) ended the run."""
    seeds: tuple[str, ...]
    """Names of the seeding solvers."""
    seeding_cut_by_time: bool = False
    """Whether the clock cut the seeding short: a seeding solver's cap fired, or the seeding's share of
    the time limit ran out before every seeding solver ran (the seeds may differ on another machine)."""

    @property
    def time_cut(self) -> tuple[str, ...]:
        """What the clock cut short: ``"seeding"``, ``"generations"``, both, or nothing (same run anywhere)."""
        return tuple(phase for phase, cut in (("seeding", self.seeding_cut_by_time), ("generations", self.stopped_by_time))
                     if cut)


class Seeding(Protocol):
    """Where a run's seed plans come from: ``seeding(problem, seed=, time_limit=, within=)`` -> ``[(name, plan)]``."""

    def __call__(self, problem: PlanningProblem, *, seed: int, time_limit: float,
                 within: TimeLimit) -> list[tuple[str, Plan]]:
        """Named fitting plans of ``problem``, found within ``time_limit`` seconds (cuts noted in ``within``)."""


def _to_plan(problem: PlanningProblem, cand: Candidate) -> Plan:
    return Plan(problem.graph.name, problem.cluster.name, problem.global_batch, problem.state_factor,
                problem.schedule, tuple(Stage(b, g, sp, rc) for b, g, sp, rc in
                                        zip(cand.bounds, cand.groups, cand.splits, cand.recompute)))


def run_nsga(problem: PlanningProblem, clock: TimeLimit, *, generations: int = 60, population: int = 48,
             seed: int = 0, seeds: Sequence[tuple[str, Plan]] = (), seeding_cut: bool = False) -> NsgaRun:
    """NSGA-II on ``problem``; see the module docstring.

    Parameters
    ----------
    problem : PlanningProblem
        The problem (``per_stage``, ``split_counts`` shape chromosome B).
    generations, population : int
        NSGA-II's generation count and population size.
    clock : TimeLimit
        The cap (the generations are the budget); every generation run is noted in its
        record as a budget spent.
    seed : int
        Seeds pymoo's random state (same seed, same run, when ``generations`` ends it).
    seeds : sequence of (name, Plan)
        Plans of the first population, in order (the rest is random).
    seeding_cut : bool
        Whether the clock cut the search for ``seeds`` short (recorded in the run).

    Returns
    -------
    NsgaRun
    """
    codec = Codec(problem)
    pymoo_problem = PlanProblem(codec)
    genes = list(dict.fromkeys(codec.encode(p).tobytes() for _, p in seeds))
    algorithm = NSGA2(pop_size=population, sampling=SeededSampling([np.frombuffer(g, dtype=int) for g in genes]),
                      crossover=TwoChromosomeCrossover(), mutation=TwoChromosomeMutation(prob=1.0),
                      repair=CodecRepair(), eliminate_duplicates=True)
    algorithm.setup(pymoo_problem, termination=("n_gen", generations), seed=seed, verbose=False)
    stopped = False
    while algorithm.has_next():
        if clock.expired():  # the cap, or an interrupt: the front so far
            stopped = True
            break
        algorithm.next()
    if not stopped:
        clock.stops.note("budget")  # every generation ran
    elif genes and not pymoo_problem.archive:  # stopped before the first generation: the seeds are what was found
        pymoo_problem.evaluate(np.array([np.frombuffer(g, dtype=int) for g in genes]))
    front = _front(problem, codec, pymoo_problem.archive)
    # pymoo's n_gen is the number of the generation it would run next
    return NsgaRun(front, max(int(algorithm.n_gen or 1) - 1, 0), len(pymoo_problem.archive), stopped,
                   tuple(name for name, _ in seeds), seeding_cut)


def time_cut_message(run: NsgaRun) -> str:
    """What the clock cut short in ``run``, in words (empty when nothing: the same run on any machine)."""
    said = {"seeding": f"the seeding's cap ({SEEDING_SHARE:.0%} of the time limit) cut a seeding solver short, so "
                       "another machine may seed differently",
            "generations": f"the time limit ended the search after {run.generations} generations"}
    return "; ".join(said[phase] for phase in run.time_cut)


def _front(problem: PlanningProblem, codec: Codec, archive: dict) -> tuple[FrontPoint, ...]:
    """Non-dominated fitting points of the archive, fastest first, one per objective pair."""
    rows = [v for v in archive.values() if v[3] <= 0 and math.isfinite(v[1])]
    if not rows:
        return ()
    F = np.array([[t, m] for _, t, m, _ in rows])
    first = NonDominatedSorting().do(F, only_non_dominated_front=True)
    seen, points = set(), []
    for i in sorted(first, key=lambda i: (F[i, 0], F[i, 1], rows[i][0].tobytes())):
        key = (F[i, 0], F[i, 1])
        if key in seen:
            continue
        seen.add(key)
        points.append(FrontPoint(_to_plan(problem, codec.decode(rows[i][0])), float(F[i, 0]), float(F[i, 1])))
    return tuple(points)


class Nsga(Solver):
    """NSGA-II (pymoo) with UMPIPE's two chromosomes; returns the fastest fitting plan."""

    name = "nsga"
    source = "NSGA-II (Deb et al. 2002, pymoo) with UMPIPE's (TPDS'25) dual chromosome"
    budget_unit = "generations"
    warm_start = True
    chooses_splits = True
    settings = ("generations", "population")

    def __init__(self, *, generations: int = 60, population: int = 48, seeding: Seeding | None = None) -> None:
        self.generations = generations
        """Generations to run (the default budget)."""
        self.population = population
        """Population size."""
        self.seeding = seeding
        """Where the first population's plans come from (``None``: a warm start and random individuals only)."""

    @property
    def default_budget(self) -> int:
        """The generations run without ``budget``."""
        return self.generations

    def front(self, problem: PlanningProblem, clock: TimeLimit, *, generations: int, seed: int,
              warm_start: Plan | None = None) -> NsgaRun:
        """The whole run: :attr:`seeding`'s plans (in :data:`SEEDING_SHARE` of ``clock``) after ``warm_start``, then the GA."""
        seeds = [("warm-start", warm_start)] if warm_start is not None else []
        seeding_cut = False
        if self.seeding is not None:
            # a record of its own, whose cuts still reach the clock's
            seeding_clock = TimeLimit(clock.seconds, started=clock.started, stops=clock.stops.nested())
            seeds += self.seeding(problem, seed=seed, time_limit=SEEDING_SHARE * clock.seconds, within=seeding_clock)
            seeding_cut = seeding_clock.stops.time_cut
        return run_nsga(problem, clock, generations=generations, population=self.population, seed=seed, seeds=seeds,
                        seeding_cut=seeding_cut)

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem``: status ``feasible`` (nothing is proved), no lower bound; ``warm_start`` joins the seeds."""
        run = self.front(problem, clock, generations=int(budget.units), seed=seed, warm_start=warm_start)
        wall = clock.elapsed()
        details = {"generations": run.generations, "evaluations": run.evaluations, "front_size": len(run.front),
                   "stopped_by_time_limit": bool(run.time_cut), "time_cut": list(run.time_cut),
                   "seeds": list(run.seeds)}
        if not run.front:
            why = ("time limit reached before any evaluated plan fitted" if run.stopped_by_time
                   else "no evaluated plan fits in memory")
            return heuristic_no_plan(problem, self.name, why, wall, seed, details=details)
        best = run.front[0]
        return SolverResult(self.name, "feasible", best.plan, best.iteration_time, None, wall, seed,
                            (TracePoint(wall, best.iteration_time, None),),
                            time_cut_message(run), details)
