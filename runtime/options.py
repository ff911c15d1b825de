"""The options of ``pipeplan run`` and of the worker entry point, and their checks.

Kept apart from :mod:`pipeplan.runtime.worker` (which imports torch) so that building the
command line's parsers, and every ``--help``, imports no torch.
"""

from __future__ import annotations

import argparse

from pipeplan.models.errors import InputError
from pipeplan.models.model_options import SPEC_HELP, add_model_options
from pipeplan.runtime.launch import STARTUP_TIMEOUT

DEFAULT_WARMUP = 2
"""Steps left out of the measured median unless ``--warmup`` says otherwise."""

DEFAULT_TIMEOUT = 50.0
"""``--timeout``: the launcher's check and the kill add well under a second, so a hang ends the run within 60 s."""

DEFAULT_LR = 0.05
"""SGD learning rate of the runs (the step the timings leave out)."""

MAX_SEED = 2 ** 63 - 1
"""Largest ``--seed`` (torch generators take a signed 64-bit seed)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's arguments, shared by ``pipeplan run`` and this entry point."""
    p.add_argument("graph", metavar="GRAPH", help="layer graph profiled from the model")
    p.add_argument("cluster", metavar="CLUSTER", help="cluster file the plan was made for")
    p.add_argument("plan", metavar="PLAN", help="plan to run")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help=f"the model whose units are the graph's layers: {SPEC_HELP}")
    add_model_options(p, trace=False)
    p.add_argument("--steps", type=int, default=6, metavar="N", help="training steps (default 6)")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help=f"first steps left out of the measured median (0 to steps-1; default {DEFAULT_WARMUP}, "
                        "or steps-1 when fewer steps)")
    p.add_argument("--verify", action="store_true",
                   help="train in float64 and compare every parameter with one-process training (fails above 1e-6)")
    p.add_argument("--emulate", action="store_true",
                   help="stretch compute to each device's speed and delay transfers to the cluster's links")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", metavar="OUT.json", help="write the measured Chrome trace")
    p.add_argument("--gantt", metavar="OUT.png", help="write the measured Gantt chart")
    p.add_argument("--side-by-side", action="store_true", help="draw the simulated Gantt chart above the measured one")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"SGD learning rate (default {DEFAULT_LR:g})")
    add_launch_options(p)
    p.add_argument("--result", metavar="FILE", help=argparse.SUPPRESS)  # set by the local launcher


def add_launch_options(p: argparse.ArgumentParser) -> None:
    """How the workers run and talk: ``--seed``, ``--transport``, ``--spin``, ``--timeout`` (run and calibrate)."""
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default 0)")
    p.add_argument("--transport", choices=("auto", "tcp", "dist"), default="auto",
                   help="point-to-point messages: tcp (sockets moved by each rank's own thread, CPU only), "
                        "dist (torch.distributed: gloo or NCCL); auto (default): tcp on CPU, dist on GPUs")
    p.add_argument("--spin", default="auto", metavar="S",
                   help="tcp transport: seconds a waiting rank polls before it sleeps (default auto: 0.005 when "
                        "every local rank has a core of its own, else 0)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds without progress in training before a worker counts as hung (default "
                        f"{DEFAULT_TIMEOUT:g}: a hung or dead worker ends the run within 60 s; setting up, before "
                        f"the first step, may take up to {STARTUP_TIMEOUT:g} s between signs of progress)")


def check_options(args: argparse.Namespace) -> None:
    """Refuse bad run options (``InputError``) and settle ``--warmup``, before any process starts.

    Examples
    --------
    >>> ns = argparse.Namespace(steps=1, warmup=None, timeout=50.0, seed=0, spin="auto", lr=0.05)
    >>> check_options(ns); ns.warmup
    0
    """
    if args.steps < 1:
        raise InputError("-", "--steps", f"must be at least 1, got {args.steps}")
    if args.warmup is None:
        args.warmup = min(DEFAULT_WARMUP, args.steps - 1)
    elif not 0 <= args.warmup <= args.steps - 1:
        raise InputError("-", "--warmup", f"must be 0 to steps-1 = {args.steps - 1} (at least one step is "
                                          f"measured), got {args.warmup}")
    if not 0 < args.timeout < float("inf"):
        raise InputError("-", "--timeout", f"must be positive seconds, got {args.timeout!r}")
    if not 0 <= args.seed <= MAX_SEED:
        raise InputError("-", "--seed", f"must be 0 to 2**63-1, got {args.seed}")
    if not 0 <= args.lr < float("inf"):  # SGD refuses a negative rate; NaN or inf would train to NaN
        raise InputError("-", "--lr", f"must be a finite learning rate >= 0, got {args.lr!r}")
    check_spin(args.spin)


def check_spin(spin: str) -> float | None:
    """``--spin`` as seconds (``None`` for ``auto``); ``InputError`` unless ``auto`` or a number >= 0."""
    if spin == "auto":
        return None
    try:
        seconds = float(spin)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise InputError("-", "--spin", f"must be 'auto' or seconds >= 0, got {spin!r}")
    return seconds
