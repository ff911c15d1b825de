"""Peak memory of a stage (spec section 5).

The stash grows when ``Fk`` ends and shrinks when ``Bk`` ends, and a stage runs its
ops one at a time, so the peak depends on the op order only, not on timing.
"""

from __future__ import annotations

from typing import Sequence

from solver.schedule import FORWARD, Op


def stash_peak(ops: Sequence[Op], per_replica: Sequence[int], stash_per_sample: float,
               recompute_per_sample: float) -> float:
    """Largest stash (plus recompute working set while a backward runs) over ``ops``.

    Parameters
    ----------
    ops : sequence of Op
        The stage's op list.
    per_replica : sequence of int
        ``ceil(n_k / r)`` for each microbatch ``k``.
    stash_per_sample : float
        ``I_s`` for a recomputing stage, ``A_s`` otherwise.
    recompute_per_sample : float
        ``A_s`` for a recomputing stage (held while its backward runs), else 0.

    Examples
    --------
    >>> stash_peak([("F", 0), ("F", 1), ("B", 0), ("B", 1)], [2, 2], 10.0, 0.0)
    40.0
    """
    stash = peak = 0.0
    for kind, k in ops:
        if kind == FORWARD:
            stash += per_replica[k] * stash_per_sample
            peak = max(peak, stash)
        else:
            peak = max(peak, stash + per_replica[k] * recompute_per_sample)
            stash -= per_replica[k] * stash_per_sample
    return peak


def stage_peak_memory(state_factor: float, params: float, ops: Sequence[Op], per_replica: Sequence[int],
                      act: float, input_bytes: float, recompute: bool) -> float:
    """Peak bytes on each device of a stage: training state plus the stash peak.

    Parameters
    ----------
    state_factor : float
        Bytes of state per byte of parameters.
    params : float
        ``P_s``, parameter bytes of the stage's layers.
    ops, per_replica
        As in :func:`stash_peak`.
    act : float
        ``A_s``, saved-activation bytes per sample of the stage's layers.
    input_bytes : float
        ``I_s``, the stage's input bytes per sample.
    recompute : bool
        Whether the stage recomputes.
    """
    if recompute:
        return state_factor * params + stash_peak(ops, per_replica, input_bytes, act)
    return state_factor * params + stash_peak(ops, per_replica, act, 0.0)
