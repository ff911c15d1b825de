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
from pipeplan.loading import warn_names
from pipeplan.runtime.launch import WorkerError, launch_local
from pipeplan.runtime.options import RunConfig, add_arguments
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
    """``pipeplan run``: the options as a :class:`~pipeplan.runtime.options.RunConfig`, checked, then the run."""
    from pipeplan.runtime.checks import check_emulation, load_inputs
    from pipeplan.runtime.report import present

    config = RunConfig.from_args(args).checked()
    # Everything that can be refused is refused here, before any process starts.
    check_outputs(args, config.trace, config.gantt,
                  inputs={"graph": config.graph, "cluster": config.cluster, "plan": config.plan})
    inputs = load_inputs(config.graph, config.cluster, config.plan, config.model, config.verify, config.seed)
    if config.emulate:
        check_emulation(inputs.prediction, config.timeout, config.plan, inputs.plan)
    for note in warn_names(inputs.plan, inputs.graph, inputs.cluster, config.plan, doing="running"):
        warn(note)
    if config.emulate and "calibration" in inputs.cluster.extra:
        warn(f"warning: {config.cluster}: calibration: --emulate stretches each op to its device's "
             "calibrated speed, which already counts the slowdown the probe measured on this machine: "
             "emulate with the cluster before calibration")
    try:
        result = launch(config, inputs)
    except WorkerError as exc:
        return report_worker_error(exc, config.plan)
    return present(config, inputs, result)


def launch(config: RunConfig, inputs: RunInputs) -> dict:
    """Run the plan's workers once, on local processes.

    Parameters
    ----------
    config : RunConfig
        The run's settings, checked (:meth:`pipeplan.runtime.options.RunConfig.checked`).
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
        launch_local(config.worker_argv(result_file), len(ranks), Path(tmp), timeout=config.timeout,
                     describe=describe)
        return json.loads(result_file.read_text())


def report_worker_error(exc: WorkerError, plan_file: str) -> int:
    """Say which worker failed and why (with its log's last lines); exit status 1."""
    print(one_line(f"error: {plan_file}: run: {exc}; all workers stopped"), file=sys.stderr)
    if exc.log_tail:
        print("  last lines of its log:\n    " + exc.log_tail.replace("\n", "\n    "), file=sys.stderr)
    return 1
