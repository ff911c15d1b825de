"""``pipeplan run GRAPH CLUSTER PLAN --model NAME``: train with a plan on local processes.

One process per device of the plan, on loopback (messages over TCP sockets on CPU,
see :mod:`pipeplan.runtime.transport`; NCCL with CUDA).
Prints the measured iteration time next to the simulator's prediction; with
``--verify`` also checks every parameter against one-process training.  The same
workers run across machines under ``torchrun -m pipeplan.runtime.worker`` (see
:mod:`pipeplan.runtime.worker`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipeplan.models.errors import one_line
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.models.model_options import request_from_args
from pipeplan.loading import warn_names
from pipeplan.runtime.launch import WorkerError, launch_local, worker_args
from pipeplan.runtime.options import add_arguments, check_options
from pipeplan.runtime.routing import rank_of

if TYPE_CHECKING:  # checks and report import torch: imported where a run starts, not while the parser is built
    from pipeplan.runtime.checks import RunInputs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train with a plan on local processes and measure it",
                       description=__doc__.split("\n\n")[0])
    add_arguments(p)
    add_force_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeplan.runtime.checks import check_emulation, load_inputs
    from pipeplan.runtime.report import present

    check_options(args)
    # Everything that can be refused is refused here, before any process starts.
    check_outputs(args, args.trace, args.gantt, inputs={"graph": args.graph, "cluster": args.cluster, "plan": args.plan})
    inputs = load_inputs(args.graph, args.cluster, args.plan, request_from_args(args), args.verify, args.seed)
    if args.emulate:
        check_emulation(inputs.prediction, args.timeout, args.plan)
    for note in warn_names(inputs.plan, inputs.graph, inputs.cluster, args.plan, doing="running"):
        warn(note)
    if args.emulate and "calibration" in inputs.cluster.extra:
        warn(f"warning: {args.cluster}: calibration: --emulate stretches each op to its device's "
             "calibrated speed, which already counts the slowdown the probe measured on this machine: "
             "emulate with the cluster before calibration")
    try:
        result = launch(args, inputs)
    except WorkerError as exc:
        return report_worker_error(exc, args.plan)
    return present(args, inputs, result)


def launch(args: argparse.Namespace, inputs: RunInputs) -> dict:
    """Run the plan's workers once, on local processes.

    Parameters
    ----------
    args : argparse.Namespace
        The run's options (those of :func:`pipeplan.runtime.worker.add_arguments`).
    inputs : RunInputs
        The checked graph, cluster, plan and model.

    Returns
    -------
    dict
        The run's result as rank 0 wrote it: ``ranks`` (each rank's records), ``transport``
        and the run's settings.

    Raises
    ------
    WorkerError
        If a worker failed or hung; every worker has been stopped by then.
    """
    plan = inputs.plan
    ranks = rank_of(plan)
    of_stage = plan.stage_groups

    def describe(rank: int) -> str:
        g, j = ranks[rank]
        stages = [s for s, group in enumerate(of_stage) if group == g]
        held = f"stage {stages[0]}" if len(stages) == 1 else f"group {g}, stages {', '.join(map(str, stages))},"
        return f"{held} replica {j}, device {plan.groups[g][j]}"

    with tempfile.TemporaryDirectory(prefix="pipeplan-run-") as tmp:
        result_file = Path(tmp) / "result.json"
        launch_local(worker_args(args, result_file), len(ranks), Path(tmp), timeout=args.timeout,
                     describe=describe)
        return json.loads(result_file.read_text())


def report_worker_error(exc: WorkerError, plan_file: str) -> int:
    """Say which worker failed and why (with its log's last lines); exit status 1."""
    print(one_line(f"error: {plan_file}: run: {exc}; all workers stopped"), file=sys.stderr)
    if exc.log_tail:
        print("  last lines of its log:\n    " + exc.log_tail.replace("\n", "\n    "), file=sys.stderr)
    return 1
