"""Silencing what native solver libraries print: :func:`quiet_stdout`."""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def quiet_stdout():
    """Silence fd 1 (HiGHS prints its banner from C++ when a model is created).

    Python's ``redirect_stdout`` cannot catch it: the library writes to the file
    descriptor, not to ``sys.stdout``.  Where there is no real stdout (captured or
    closed), there is nothing to silence.
    """
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
