"""Writing matplotlib figures: headless, atomic, closed afterwards."""

from __future__ import annotations

import io

from pipeplan.models.jsonio import atomic_write_bytes


def pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend (no display on servers and CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str, dpi: int = 100) -> None:
    """Write ``fig`` as a PNG to ``path`` atomically, then close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
