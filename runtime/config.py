"""The settings of a training run: what ``pipeplan run`` takes, and what its workers run with (:class:`RunConfig`).

One typed object from the command line to every rank: ``pipeplan run`` builds it from its
options (:meth:`RunConfig.from_args`) and checks it (:meth:`RunConfig.checked`), the local
launcher hands it to the workers as their command line (:meth:`RunConfig.worker_argv`),
and each worker reads it back the same way; ``pipeplan calibrate`` and the experiments
build theirs directly.

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
from pipeplan.models.model_options import ModelRequest, request_from_args

DEFAULT_STEPS = 6
"""Training steps of a run unless told otherwise."""

DEFAULT_WARMUP = 2
"""Steps left out of the measured median unless ``warmup`` says otherwise."""

DEFAULT_TIMEOUT = 50.0
"""``timeout``: the launcher's check and the kill add well under a second, so a hang ends the run within 60 s."""

DEFAULT_LR = 0.05
"""SGD learning rate of the runs (the step the timings leave out)."""

MAX_SEED = 2 ** 63 - 1
"""Largest ``seed`` (torch generators take a signed 64-bit seed)."""

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
        """The configuration of ``pipeplan run``'s parsed options (:func:`pipeplan.runtime.worker.add_arguments`).

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
        spin_seconds(self.spin)
        return replace(self, warmup=warmup)

    def worker_argv(self, result: Path) -> list[str]:
        """The workers' command line for this run, rank 0 reporting to ``result``.

        The files are passed as absolute paths: the workers start in the project's root (so
        that ``-m pipeplan.runtime.worker`` imports this pipeplan, whatever the caller's folder
        holds), where a path relative to the caller's folder would name another file or none.
        """
        files = [os.path.abspath(path) for path in (self.graph, self.cluster, self.plan)]
        argv = [*files, *self.model.argv(), "--steps", str(self.steps), "--warmup", str(self.warmup),
                "--lr", repr(self.lr), "--seed", str(self.seed), "--timeout", repr(self.timeout),
                "--transport", self.transport, "--spin", self.spin, "--result", str(result)]
        return argv + [flag for flag, on in (("--verify", self.verify), ("--emulate", self.emulate)) if on]


def spin_seconds(spin: str) -> float | None:
    """``spin`` as seconds (``None`` for ``auto``).

    Raises
    ------
    InputError
        Unless ``auto`` or a finite number >= 0.
    """
    if spin == "auto":
        return None
    try:
        seconds = float(spin)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise InputError("-", "--spin", f"must be 'auto' or seconds >= 0, got {spin!r}")
    return seconds
