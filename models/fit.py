"""Least-squares fit of ``time = a + b*n`` to timings at several microbatch sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """A fitted ``a + b*n`` with both coefficients clamped to be >= 0."""

    a: float
    """Fixed seconds per call (intercept), >= 0."""
    b: float
    """Seconds per sample (slope), >= 0."""
    residual: float
    """Root-mean-square of ``time - (a + b*n)`` over the points, in seconds."""
    relative_residual: float
    """``residual`` divided by the mean time (0 when every time is 0)."""

    def as_pair(self) -> tuple[float, float]:
        """``(a, b)`` as the graph's ``fwd``/``bwd`` fields want it."""
        return (self.a, self.b)


def fit_linear(sizes: Sequence[float], times: Sequence[float]) -> LinearFit:
    """Fit ``times ~ a + b*sizes`` by least squares, keeping ``a, b >= 0``.

    A negative coefficient is noise, not physics: when the unconstrained fit gives
    ``b < 0`` the best ``b = 0`` fit is ``a = mean(times)``; when it gives ``a < 0``
    the best ``a = 0`` fit is the line through the origin, ``b = sum(n t) / sum(n^2)``.

    Parameters
    ----------
    sizes : sequence of float
        Microbatch sizes (at least one, all > 0).
    times : sequence of float
        Measured seconds, one per size.

    Returns
    -------
    LinearFit

    Raises
    ------
    ValueError
        If the sequences are empty, differ in length, or a size is not positive.

    Examples
    --------
    >>> f = fit_linear([1, 2, 4], [3.0, 5.0, 9.0])
    >>> round(f.a, 9), round(f.b, 9), round(f.residual, 9)
    (1.0, 2.0, 0.0)
    """
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if n.size == 0 or n.shape != t.shape:
        raise ValueError(f"need equally many sizes and times (got {n.size} and {t.size})")
    if np.any(n <= 0):
        raise ValueError(f"microbatch sizes must be positive, got {list(sizes)}")
    a, b = _unconstrained(n, t)
    if b < 0:
        a, b = float(t.mean()), 0.0
    if a < 0:
        a, b = 0.0, float(np.dot(n, t) / np.dot(n, n))
    a, b = max(a, 0.0), max(b, 0.0)
    residual = math.sqrt(float(np.mean((t - (a + b * n)) ** 2)))
    mean = float(t.mean())
    return LinearFit(a, b, residual, residual / mean if mean > 0 else 0.0)


def _unconstrained(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    # With a single distinct size the slope is undetermined: attribute it all to b,
    # since per-sample work dominates real layers.
    if np.unique(n).size < 2:
        return 0.0, float(t.mean() / n.mean())
    design = np.stack([np.ones_like(n), n], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, t, rcond=None)
    return float(a), float(b)


def clamp_part(part: LinearFit, whole: LinearFit) -> LinearFit:
    """``part`` with each coefficient limited to that of ``whole`` (and kept >= 0).

    A part of a time (the weight-gradient half of a backward) fitted from other
    timings than the whole can exceed it by timing noise; the graph requires
    ``0 <= part <= whole`` per coefficient (spec section 7.1).

    Examples
    --------
    >>> clamp_part(LinearFit(3.0, 1.0, 0.0, 0.0), LinearFit(2.0, 4.0, 0.0, 0.0)).as_pair()
    (2.0, 1.0)
    """
    return LinearFit(min(max(part.a, 0.0), whole.a), min(max(part.b, 0.0), whole.b),
                     part.residual, part.relative_residual)
