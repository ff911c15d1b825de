"""The published baselines: one module per method, all judged by the simulator.

The equal-split baselines ``even``, ``deepspeed-uniform``, ``deepspeed-parameters``,
``pipedream``, ``dapple``, ``alpa``, ``autopipe``, ``greedy-speed``, ``megatron`` and
``piper`` (:data:`BASELINES`), and the split baselines that start from the best of
them, ``umpipe-local``, ``umpipe-dp`` and ``autopipe-slicing`` (see each module's
docstring for its source and its heterogeneous adaptation); each is a row of
:data:`pipeplan.solver.solvers.SOLVERS`.  :func:`best_baseline` runs them all and keeps
the fastest plan.
"""

from __future__ import annotations

from pipeplan.solver.baselines.portfolio import BASELINES, best_baseline, fastest, run_baselines  # noqa: F401 (re-exported)

# Split-aware baselines (unequal microbatches on the best equal-split pipeline): they
# return plans outside the equal-split search space, so they stay out of BASELINES.
from pipeplan.solver.baselines.slicing import AutoPipeSlicing
from pipeplan.solver.baselines.umpipe import UmpipeDP, UmpipeLocal

SPLIT_BASELINES = (UmpipeLocal, UmpipeDP, AutoPipeSlicing)
"""Baselines that choose microbatch splits (``umpipe-local``, ``umpipe-dp``, ``autopipe-slicing``)."""
