"""The settings of a training run (:class:`RunConfig`), and the options of ``pipeplan run`` and of the
worker entry point that give them.

One typed object from the command line to every rank: ``pipeplan run`` builds it from its
options (:meth:`RunConfig.from_args`) and checks it (:meth:`RunConfig.checked`), the local
launcher hands it to the workers as their command line (:meth:`RunConfig.worker_argv`),
and each worker reads it back the same way; ``pipeplan calibrate`` and the experiments
build theirs directly.  Kept apart from :mod:`pipeplan.runtime.worker` (which imports
torch) so that building the command line's parsers, and every ``--help``, imports no torch.

Examples
--------
>>> from pipeplan.models.model_options import ModelRequest
>>> config = RunConfig("g.json", "c.json", "p.json", ModelRequest("gpt-tiny"), steps=3).checked()
>>> config.warmup, config.timeout
(2, 50.0)
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path

from pipeplan.models.errors import InputError
from pipeplan.models.model_options import SPEC_HELP, ModelRequest, add_model_options, request_from_args
from pipeplan.runtime.launch import STARTUP_TIMEOUT

DEFAULT_STEPS = 6
"""Training steps of a run unless told otherwise."""

DEFAULT_WARMUP = 2
"""Steps left out of the measured median unless ``--warmup`` says otherwise."""

DEFAULT_TIMEOUT = 50.0
"""``--timeout``: the launcher's check and the kill add well under a second, so a hang ends the run within 60 s."""

DEFAULT_LR = 0.05
"""SGD learning rate of the runs (the step the timings leave out)."""

MAX_SEED = 2 ** 63 - 1
"""Largest ``--seed`` (torch generators take a signed 64-bit seed)."""

TRANSPORTS = ("auto", "tcp", "dist")
"""Point-to-point transports (``--transport``)."""


@dataclass(frozen=True)
class RunConfig:
    """One training run of a plan on processes, one per device of the plan."""

    graph: str
    """The layer graph's file (profiled from the model)."""
    cluster: str
    """The cluster file the plan was made for."""
    plan: str
    """The plan file to run."""
    model: ModelRequest
    """The model whose units are the graph's layers (``--model`` and its options)."""
    steps: int = DEFAULT_STEPS
    """Training steps."""
    warmup: int | None = None
    """First steps left out of the measured median, 0 to ``steps - 1``; ``None``: :data:`DEFAULT_WARMUP`,
    or ``steps - 1`` when fewer steps (:meth:`checked` settles it)."""
    verify: bool = False
    """Train in float64 and compare every parameter with one-process training (fails above 1e-6)."""
    emulate: bool = False
    """Stretch compute to each device's speed and delay transfers to the cluster's links."""
    lr: float = DEFAULT_LR
    """SGD learning rate."""
    seed: int = 0
    """Seed of the weights and batches, 0 to :data:`MAX_SEED`."""
    transport: str = "auto"
    """Point-to-point messages (one of :data:`TRANSPORTS`): ``tcp`` (sockets moved by each rank's own thread,
    CPU only), ``dist`` (torch.distributed: gloo or NCCL), ``auto`` (tcp on CPU, dist on GPUs)."""
    spin: str = "auto"
    """tcp transport: seconds a waiting rank polls before it sleeps, as text, or ``auto`` (0.005 when every
    local rank has a core of its own, else 0)."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds without progress before a worker counts as hung."""
    json: bool = False
    """Print one JSON object instead of the text summary."""
    trace: str | None = None
    """Where to write the measured Chrome trace, or ``None``."""
    gantt: str | None = None
    """Where to write the measured Gantt chart, or ``None``."""
    side_by_side: bool = False
    """Draw the simulated Gantt chart above the measured one."""
    result: str | None = None
    """Where rank 0 writes the run's result (set by the local launcher), or ``None``: rank 0 reports it."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunConfig":
        """The configuration of ``pipeplan run``'s parsed options (:func:`add_arguments`).

        Raises
        ------
        InputError
            For model options a zoo model does not take.
        """
        return cls(args.graph, args.cluster, args.plan, request_from_args(args), steps=args.steps,
                   warmup=args.warmup, verify=args.verify, emulate=args.emulate, lr=args.lr, seed=args.seed,
                   transport=args.transport, spin=args.spin, timeout=args.timeout, json=args.json, trace=args.trace,
                   gantt=args.gantt, side_by_side=args.side_by_side, result=args.result)

    def checked(self) -> "RunConfig":
        """This configuration with :attr:`warmup` settled, once every setting is checked (before any process starts).

        Raises
        ------
        InputError
            Naming the option, the value and what it must be.
        """
        if self.steps < 1:
            raise InputError("-", "--steps", f"must be at least 1, got {self.steps}")
        warmup = min(DEFAULT_WARMUP, self.steps - 1) if self.warmup is None else self.warmup
        if not 0 <= warmup <= self.steps - 1:
            raise InputError("-", "--warmup", f"must be 0 to steps-1 = {self.steps - 1} (at least one step is "
                                              f"measured), got {warmup}")
        if not 0 < self.timeout < float("inf"):
            raise InputError("-", "--timeout", f"must be positive seconds, got {self.timeout!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise InputError("-", "--seed", f"must be 0 to 2**63-1, got {self.seed}")
        if not 0 <= self.lr < float("inf"):  # SGD refuses a negative rate; NaN or inf would train to NaN
            raise InputError("-", "--lr", f"must be a finite learning rate >= 0, got {self.lr!r}")
        if self.transport not in TRANSPORTS:
            raise InputError("-", "--transport", f"must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        check_spin(self.spin)
        return replace(self, warmup=warmup)

    def worker_argv(self, result: Path) -> list[str]:
        """The workers' command line for this run (checked), rank 0 reporting to ``result``.

        The files are passed as absolute paths: the workers start in the project's root (so
        that ``-m pipeplan.runtime.worker`` imports this pipeplan, whatever the caller's folder
        holds), where a path relative to the caller's folder would name another file or none.
        """
        files = [os.path.abspath(path) for path in (self.graph, self.cluster, self.plan)]
        argv = [*files, *self.model.argv(), "--steps", str(self.steps), "--warmup", str(self.warmup),
                "--lr", repr(self.lr), "--seed", str(self.seed), "--timeout", repr(self.timeout),
                "--transport", self.transport, "--spin", self.spin, "--result", str(result)]
        return argv + [flag for flag, on in (("--verify", self.verify), ("--emulate", self.emulate)) if on]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's arguments, shared by ``pipeplan run`` and this entry point."""
    p.add_argument("graph", metavar="GRAPH", help="layer graph profiled from the model")
    p.add_argument("cluster", metavar="CLUSTER", help="cluster file the plan was made for")
    p.add_argument("plan", metavar="PLAN", help="plan to run")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help=f"the model whose units are the graph's layers: {SPEC_HELP}")
    add_model_options(p, trace=False)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"training steps (default {DEFAULT_STEPS})")
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
    p.add_argument("--transport", choices=TRANSPORTS, default="auto",
                   help="point-to-point messages: tcp (sockets moved by each rank's own thread, CPU only), "
                        "dist (torch.distributed: gloo or NCCL); auto (default): tcp on CPU, dist on GPUs")
    p.add_argument("--spin", default="auto", metavar="S",
                   help="tcp transport: seconds a waiting rank polls before it sleeps (default auto: 0.005 when "
                        "every local rank has a core of its own, else 0)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds without progress in training before a worker counts as hung (default "
                        f"{DEFAULT_TIMEOUT:g}: a hung or dead worker ends the run within 60 s; setting up, before "
                        f"the first step, may take up to {STARTUP_TIMEOUT:g} s between signs of progress)")


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
