"""pipeplan: plan, prove and run pipeline-parallel training on heterogeneous clusters.

Read a plan in your own runtime::

    >>> import pipeplan
    >>> plan = pipeplan.load_plan("examples/hetero.plan.json")
    >>> [(st.layers, st.devices, st.microbatches, st.recompute) for st in plan.stages][0]
    ((0, 3), ('g2', 'g3'), (16, 16, 16, 16), False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeplan.solver.plan import Plan

__all__ = ["load_plan"]


def load_plan(path: str) -> "Plan":
    """Read and check a plan file (``pipeplan.plan/1``).

    Parameters
    ----------
    path : str
        The plan's JSON file.

    Returns
    -------
    pipeplan.solver.plan.Plan
        ``stages`` (each with ``layers`` ``[lo, hi)``, ``devices``, ``microbatches``, the
        stage's own split, and ``recompute``), ``groups`` (the device groups),
        ``programs()`` (every group's actions, ``"0F3"``), ``op_lists()`` (every stage's
        ops), ``schedule``, ``global_batch`` and the solver record in ``extra["solver"]``.

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
    from pipeplan.solver.plan import load_plan as load  # lazy: `import pipeplan` stays light

    return load(path)
