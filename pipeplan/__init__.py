"""pipeplan: plan, prove and run pipeline-parallel training on heterogeneous clusters.

The Python API, for a model in hand rather than on the command line::

    graph = pipeplan.profile_model(model, example)            # a LayerGraph
    plan, result = pipeplan.plan(graph, "cluster.json", batch=32, microbatches=8)

Both import their machinery on first use, so ``import pipeplan`` stays light.

Read a plan in your own runtime::

    >>> import pipeplan
    >>> plan = pipeplan.load_plan("examples/hetero.plan.json")
    >>> [(st.layers, st.devices, st.microbatches, st.recompute) for st in plan.stages][0]
    ((0, 3), ('g2', 'g3'), (16, 16, 16, 16), False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from torch import nn

    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster
    from pipeplan.solver.formats.plan import Plan
    from pipeplan.solver.core.result import SolverResult

__all__ = ["profile_model", "plan", "load_plan"]


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


def plan(graph: "LayerGraph | str", cluster: "Cluster | str", *, batch: int, microbatches: int,
         solver: str = "cpsat", time_limit: float = 60.0, seed: int = 0, **options: Any
         ) -> "tuple[Plan | None, SolverResult]":
    """Plan training of ``graph`` on ``cluster`` with one solver.

    Parameters
    ----------
    graph : LayerGraph or str
        A layer graph or the path of a ``pipeplan.graph/1`` or ``/2`` file.
    cluster : Cluster or str
        A cluster or the path of a ``pipeplan.cluster/1`` file.
    batch : int
        Global batch (samples per iteration).
    microbatches : int
        Equal microbatches per iteration.
    solver : str
        A registered solver (``cpsat``, ``ilp``, ``group-search``, ``nsga``, a baseline).
    time_limit : float
        Seconds the solver may take.
    seed : int
        Seed of randomised solvers (same seed, same plan).
    **options
        Further :class:`~pipeplan.solver.core.problem.PlanningProblem` fields
        (``schedule`` including the version-2 names, ``virtual_stages``, ``state_factor``,
        ``allow_replication``, ``max_stages``, ...).

    Returns
    -------
    (Plan or None, SolverResult)
        The plan (``None`` when none fits) and the solver's record: status (``optimal``
        only when proved), lower bound, gap, wall time, seed.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> g = LayerGraph.chain("two", [Layer("a", (0, 1e-3), (0, 2e-3), 4, 8, 16),
    ...                              Layer("b", (0, 1e-3), (0, 2e-3), 4, 8, 16)])
    >>> best, record = plan(g, "examples/cpu-pair.cluster.json", batch=8, microbatches=4, time_limit=10)
    >>> record.status, len(best.stages) >= 1
    ('optimal', True)
    """
    from pipeplan.models.graph import load_graph
    from pipeplan.solver.formats.cluster import load_cluster
    from pipeplan.solver.core.problem import PlanningProblem
    from pipeplan.solver.core.registry import get_solver

    graph = load_graph(graph) if isinstance(graph, str) else graph
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    problem = PlanningProblem(graph, cluster, global_batch=batch, microbatches=microbatches, **options)
    result = get_solver(solver).solve(problem, time_limit=time_limit, seed=seed)
    return result.plan, result


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
