"""``pipeplan run GRAPH CLUSTER PLAN --model NAME``: train with a plan on local processes.

One process per device of the plan, on loopback (messages over TCP sockets on CPU,
see :mod:`runtime.transport`; NCCL with CUDA).
Prints the measured iteration time next to the simulator's prediction; with
``--verify`` also checks every parameter against one-process training.  The same
workers run across machines under ``torchrun -m runtime.worker`` (see
:mod:`runtime.worker`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from models.errors import one_line
from models.jsonio import check_writable
from pipeplan.loading import warn_names
from runtime.checks import check_emulation, load_inputs
from runtime.launch import WorkerError, launch_local
from runtime.report import present
from runtime.routing import rank_of
from runtime.worker import add_arguments, check_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train with a plan on local processes and measure it",
                       description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)


def worker_args(args: argparse.Namespace, result: Path) -> list[str]:
    """The workers' command line: the run's own arguments, reporting to ``result``.

    The files are passed as absolute paths: the workers start in the project's root (so
    that ``-m runtime.worker`` imports this pipeplan, whatever the caller's folder holds),
    where a path relative to the caller's folder would name another file or none.
    """
    files = [os.path.abspath(path) for path in (args.graph, args.cluster, args.plan)]
    argv = [*files, "--model", args.model, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--lr", repr(args.lr), "--seed", str(args.seed),
            "--timeout", repr(args.timeout), "--transport", args.transport, "--spin", args.spin,
            "--result", str(result)]
    return argv + [flag for flag, on in (("--verify", args.verify), ("--emulate", args.emulate)) if on]


def run(args: argparse.Namespace) -> int:
    check_options(args)
    # Everything that can be refused is refused here, before any process starts.
    check_writable(args.trace, args.gantt)
    inputs = load_inputs(args.graph, args.cluster, args.plan, args.model, args.verify, args.seed)
    plan = inputs.plan
    if args.emulate:
        check_emulation(inputs.prediction, args.timeout, args.plan)
    for note in warn_names(plan, inputs.graph, inputs.cluster, args.plan, doing="running"):
        print(note, file=sys.stderr)
    ranks = rank_of(plan)

    def describe(rank: int) -> str:
        s, j = ranks[rank]
        return f"stage {s} replica {j}, device {plan.stages[s].devices[j]}"

    with tempfile.TemporaryDirectory(prefix="pipeplan-run-") as tmp:
        result_file = Path(tmp) / "result.json"
        try:
            launch_local(worker_args(args, result_file), len(ranks), Path(tmp), timeout=args.timeout,
                         describe=describe)
        except WorkerError as exc:
            print(one_line(f"error: {args.plan}: run: {exc}; all workers stopped"), file=sys.stderr)
            if exc.log_tail:
                print("  last lines of its log:\n    " + exc.log_tail.replace("\n", "\n    "), file=sys.stderr)
            return 1
        result = json.loads(result_file.read_text())
    return present(args, inputs, result)

