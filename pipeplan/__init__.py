"""pipeplan: plan, prove and run pipeline-parallel training on heterogeneous clusters.

The Python API, for a model in hand rather than on the command line::

    graph = pipeplan.profile_model(model, example)            # a LayerGraph
    plan, result = pipeplan.plan(graph, "cluster.json", batch=32, microbatches=8)
    table = pipeplan.compare(graph, "cluster.json", batch=32, microbatches=8, schedule="auto").rows()
    made = pipeplan.synthesize(plan, graph, "cluster.json")   # programs built for its partition

Both import their machinery on first use, so ``import pipeplan`` stays light.

Read a plan in your own runtime::

    >>> import pipeplan
    >>> plan = pipeplan.load_plan("examples/hetero.plan.json")
    >>> [(st.layers, st.devices, st.microbatches, st.recompute) for st in plan.stages][0]
    ((0, 3), ('g2', 'g3'), (16, 16, 16, 16), False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from torch import nn

    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster
    from pipeplan.solver.formats.plan import Plan
    from pipeplan.solver.core.schedule_synthesis import SynthesizedPlan
    from pipeplan.solver.planning import Planned

__all__ = ["profile_model", "plan", "compare", "synthesize", "load_plan"]


def profile_model(module: "nn.Module", example: Callable[[int], Any], units: str = "auto", *,
                  loss: Callable[[Any, int], Any] | None = None, analytic: bool = False,
                  batch_sizes: tuple[int, ...] = (1, 2, 4, 8), trace: str = "eager") -> "LayerGraph":
    """The layer graph of a PyTorch model: its units, dataflow, ties and costs.

    Parameters
    ----------
    module : nn.Module
        The model.
    example : callable
        ``example(n)`` returns the arguments of a batch of ``n`` samples: a tensor, a
        tuple, or ``(args, kwargs)``.
    units : str
        ``"auto"`` (the items of the model's trunk ModuleLists plus the sibling modules on
        the paths to them; see :mod:`pipeplan.models.units`) or comma-separated qualified
        submodule names.
    loss : callable, optional
        ``loss(output, n)``, a mean over the samples; the last unit is timed with it
        (default: the synthetic objective, the mean of the output's squares).
    analytic : bool
        Estimate times from FLOPs (``FlopCounterMode``) instead of measuring.
    batch_sizes : tuple of int
        Microbatch sizes measured (not with ``analytic``).
    trace : str
        ``"eager"``, ``"export"`` or ``"both"`` (see ``pipeplan profile --trace``).

    Returns
    -------
    LayerGraph
        With edges from the dataflow, ``tied_to`` from shared Parameters.

    Raises
    ------
    InputError
        For the refusals of ``pipeplan profile`` (a unit name that is not a submodule,
        Parameters outside every unit, glue code reading a Parameter, a failing forward).

    Examples
    --------
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> graph = profile_model(model, lambda n: torch.randn(n, 4), analytic=True)
    >>> [layer.name for layer in graph.layers], graph.edges
    (['0', '1', '2'], ((0, 1), (1, 2)))
    """
    from pipeplan.models.imported import trace_model
    from pipeplan.models.profile_imported import analyse_imported, profile_imported
    from pipeplan.models.profile_measured import MeasureConfig
    from pipeplan.models.spec import UserModel

    user = UserModel(type(module).__name__, f"<{type(module).__name__}>", module, example, loss)
    imported = trace_model(user, units, trace)
    if analytic:
        return analyse_imported(imported)
    return profile_imported(imported, MeasureConfig(batch_sizes=tuple(batch_sizes)))


def plan(graph: "LayerGraph | str", cluster: "Cluster | str", *, batch: int, microbatches: "int | str",
         solver: str = "cpsat", schedule: "str | Sequence[str]" = "1f1b", time_limit: float = 60.0, seed: int = 0,
         budget: float | None = None, warm_start: "Plan | str | None" = None,
         solver_options: "dict[str, Any] | None" = None, **options: Any) -> "Planned":
    """Plan training of ``graph`` on ``cluster`` with one solver, for one schedule or every one (``"auto"``).

    Parameters
    ----------
    graph : LayerGraph or str
        A layer graph or the path of a ``pipeplan.graph/1`` or ``/2`` file.
    cluster : Cluster or str
        A cluster or the path of a ``pipeplan.cluster/1`` file.
    batch : int
        Global batch (samples per iteration).
    microbatches : int or "auto"
        Equal microbatches per iteration, or ``"auto"``: split-aware solvers choose the
        count (up to ``max_microbatches``) and sizes.
    solver : str
        A registered solver (``cpsat``, ``ilp``, ``group-search``, ``nsga``, a baseline, ...).
    schedule : str or sequence of str
        A named schedule (``"1f1b"``, ``"zbv"``, ...), ``"adaptive"`` (partitions searched with
        synthesized programs: a ``custom`` plan), several, or ``"auto"`` for every one (adaptive
        included): the fastest fitting plan of all is returned, and every schedule's record kept.
    time_limit : float
        Seconds the solver may take (per schedule).
    seed : int
        Seed of randomised solvers (same seed, same plan).
    budget : float, optional
        Work in the solver's own unit (same seed and budget, same plan on any machine).
    warm_start : Plan or str, optional
        An earlier plan (or its file) of this problem to start from; the result is never slower.
    solver_options : dict, optional
        The solver's own settings (``generations``, ``population``, ``backend``).
    **options
        Further :class:`~pipeplan.solver.core.problem.PlanningProblem` fields
        (``virtual_stages``, ``state_factor``, ``allow_replication``, ``max_stages``,
        ``max_microbatches``, ``per_stage``, ...); ``memory_fraction`` (plan within that share of
        each device's memory) and ``adaptive`` (a :class:`pipeplan.solver.planning.AdaptiveOptions`).

    Returns
    -------
    pipeplan.solver.planning.Planned
        ``plan`` (``None`` when none fits) and ``record`` (the solver's record: status,
        ``optimal`` only when proved, lower bound, gap, wall time, seed, the algorithm that
        ran); ``outcomes`` (every schedule's), ``no_plan`` (why none came back), ``rows()``.
        It unpacks as ``(plan, record)``.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> g = LayerGraph.chain("two", [Layer("a", (0, 1e-3), (0, 2e-3), 4, 8, 16),
    ...                              Layer("b", (0, 1e-3), (0, 2e-3), 4, 8, 16)])
    >>> best, record = plan(g, "examples/cpu-pair.cluster.json", batch=8, microbatches=4, time_limit=10)
    >>> record.status, record.algorithm, len(best.stages) >= 1
    ('optimal', 'cpsat', True)
    """
    from pipeplan.solver import planning

    graph, cluster = _load(graph, cluster)
    if isinstance(warm_start, str):
        from pipeplan.solver.formats.plan import load_plan as load

        warm_start = load(warm_start, graph, cluster)
    return planning.plan(graph, cluster, batch=batch, microbatches=microbatches, solver=solver, schedule=schedule,
                         time_limit=time_limit, seed=seed, budget=budget, warm_start=warm_start,
                         solver_options=solver_options, **options)


def compare(graph: "LayerGraph | str", cluster: "Cluster | str", *, batch: int, microbatches: "int | str",
            solvers: "Sequence[str] | None" = None, schedule: "str | Sequence[str]" = "1f1b",
            time_limit: float = 60.0, seed: int = 0, budget: float | None = None,
            solver_options: "dict[str, Any] | None" = None, **options: Any) -> "Planned":
    """Run several solvers (default: every one that plans the schedules) on one schedule or several.

    The arguments are :func:`plan`'s; ``solvers`` names the solvers, in order.  A solver that
    refuses a problem is left out and said in the result's ``skipped``.

    Returns
    -------
    pipeplan.solver.planning.Planned
        ``rows()`` (one per schedule and solver: status, time, ratio to the best, bound,
        gap, the algorithm that ran), ``best`` (the fastest fitting plan of all) or ``no_plan``.

    Examples
    --------
    >>> done = compare("examples/chain8.graph.json", "examples/two-servers.cluster.json", batch=8,
    ...                microbatches=4, solvers=["even", "group-search"], schedule=["1f1b", "zbv"])
    >>> [(row["schedule"], row["solver"]) for row in done.rows()][:2]
    [('1f1b', 'even'), ('1f1b', 'group-search')]
    """
    from pipeplan.solver import planning

    graph, cluster = _load(graph, cluster)
    return planning.compare(graph, cluster, batch=batch, microbatches=microbatches, solvers=solvers,
                            schedule=schedule, time_limit=time_limit, seed=seed, budget=budget,
                            solver_options=solver_options, **options)


def _load(graph: "LayerGraph | str", cluster: "Cluster | str") -> "tuple[LayerGraph, Cluster]":
    """The graph and the cluster, read from their files where paths are given."""
    from pipeplan.models.graph import load_graph
    from pipeplan.solver.formats.cluster import load_cluster

    return (load_graph(graph) if isinstance(graph, str) else graph,
            load_cluster(cluster) if isinstance(cluster, str) else cluster)


def synthesize(plan: "Plan | str", graph: "LayerGraph | str", cluster: "Cluster | str", *, exact: bool = False,
               work: float = 30.0, time_limit: float | None = None, workers: int = 1, seed: int = 0,
               memory_fraction: float = 1.0, split_backward: bool = True) -> "SynthesizedPlan":
    """Each device group's program built for ``plan``'s own partition (``pipeplan synthesize``).

    The plan's stages, groups, splits and recompute are kept; its schedule becomes
    ``custom``, with programs from the partition's own action times, links, all-reduce,
    step and memory caps: the list scheduler's, or with ``exact`` the CP-SAT order
    model's (started from them), and never slower than the plan's own programs.

    Parameters
    ----------
    plan : Plan or str
        A plan (any schedule) or the path of a plan file.
    graph : LayerGraph or str
        Its layer graph or the path of one.
    cluster : Cluster or str
        Its cluster or the path of one.
    exact : bool
        Run the CP-SAT order model too (proof of the best order, or a bound).
    work : float
        CP-SAT deterministic seconds (``exact`` only): same work and seed, same plan.
    time_limit : float, optional
        Wall-clock cap in seconds for CP-SAT (``exact`` only).
    workers, seed : int
        CP-SAT's workers and random seed.
    memory_fraction : float
        Each group's memory cap as a share of its device memory, in ``(0, 1]``.
    split_backward : bool
        Let backwards run as ``I`` then ``W`` (else whole ``B`` s).

    Returns
    -------
    pipeplan.solver.core.schedule_synthesis.SynthesizedPlan
        ``plan`` (the custom plan, its record in ``extra["synthesis"]``: algorithm,
        status, ``optimal`` only when proved over the orders of this partition, lower
        bound, gap, wall time, seed), ``before`` and ``after`` (the simulator's results of
        both plans), ``record``, ``fits`` and ``reason``.

    Raises
    ------
    pipeplan.models.errors.InputError
        If a file is unreadable or breaks a rule of its format, or the plan does not
        match the graph and cluster.

    Examples
    --------
    >>> made = synthesize("examples/hetero.plan.json", "examples/chain8.graph.json",
    ...                   "examples/two-servers.cluster.json")
    >>> made.plan.schedule, made.after.iteration_time < made.before.iteration_time
    ('custom', True)
    """
    from pipeplan.models.graph import load_graph
    from pipeplan.solver.core.schedule_synthesis import synthesize_plan
    from pipeplan.solver.formats.cluster import load_cluster
    from pipeplan.solver.formats.plan import load_plan as load

    graph = load_graph(graph) if isinstance(graph, str) else graph
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    if isinstance(plan, str):
        plan = load(plan, graph, cluster)
    else:
        plan.validate(graph, cluster)
    return synthesize_plan(plan, graph, cluster, exact=exact, work=work, time_limit=time_limit, workers=workers,
                           seed=seed, memory_fraction=memory_fraction, split_backward=split_backward)


def load_plan(path: str) -> "Plan":
    """Read and check a plan file (``pipeplan.plan/1`` or ``/2``).

    Parameters
    ----------
    path : str
        The plan's JSON file.

    Returns
    -------
    pipeplan.solver.formats.plan.Plan
        ``stages`` (each with ``layers`` ``[lo, hi)``, ``devices``, ``microbatches``, the
        stage's own split, and ``recompute``), ``groups`` (the device groups),
        ``programs()`` (every group's actions, ``"0F3"``), ``stage_actions()`` (every stage's
        actions in its group's order), ``schedule``, ``global_batch`` and the solver record in ``extra["solver"]``.

    Raises
    ------
    pipeplan.models.errors.InputError
        If the file is unreadable, not JSON or breaks a rule of the plan format.

    Examples
    --------
    >>> plan = load_plan("examples/custom.plan.json")
    >>> plan.groups, plan.programs()[1][:4]
    ([('g0',), ('g1',)], ['1F0', '1B0', '1F1', '1B1'])
    """
    from pipeplan.solver.formats.plan import load_plan as load  # lazy: `import pipeplan` stays light

    return load(path)
