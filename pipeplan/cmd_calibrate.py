"""``pipeplan calibrate GRAPH CLUSTER PLAN --model NAME -o OUT``: device speeds measured in a pipeline.

Runs the probe plan ``--runs`` times on local processes, as ``pipeplan run`` does,
and writes the cluster with each of the plan's devices at the speed its ops ran at
(see :mod:`pipeplan.runtime.calibrate`): predictions made with the written cluster charge the
slowdown a pipeline meets on this machine, which a graph profiled op by op in
isolation does not see.  Locally every process runs at this machine's speed, whatever
the cluster file says, so the written speeds describe this machine.  Nothing is
written if a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from pipeplan.models.errors import InputError, one_line
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.notices import warn
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.models.model_options import SPEC_HELP, add_model_options, request_from_args
from pipeplan.cmd_run import launch, report_worker_error
from pipeplan.loading import warn_names
from pipeplan.runtime.launch import WorkerError
from pipeplan.runtime.options import DEFAULT_WARMUP, RunConfig, add_launch_options
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.evaluation.simulator import simulate

DEFAULT_RUNS = 3
"""Probe runs; each device takes the median of its factors over them."""

PROBE_GAP = 0.10
"""A probe whose measured time is off its calibrated prediction by more than this gets a note."""

FAR_FACTOR = 2.0
"""A factor above this (or below its inverse) gets a warning: the probe measured that device poorly."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure device speeds in a pipeline and write a calibrated cluster",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("graph", metavar="GRAPH", help="layer graph profiled from the model")
    p.add_argument("cluster", metavar="CLUSTER", help="cluster to calibrate (its devices run the probe locally)")
    p.add_argument("plan", metavar="PLAN", help="probe plan: the devices it uses are calibrated")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help=f"the model whose units are the graph's layers: {SPEC_HELP}")
    add_model_options(p, trace=False)
    p.add_argument("-o", "--output", required=True, metavar="OUT.json", help="the calibrated cluster")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, metavar="R",
                   help=f"probe runs, each device takes its median factor (default {DEFAULT_RUNS})")
    p.add_argument("--steps", type=int, default=12, metavar="N", help="training steps per run (default 12)")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help=f"first steps of each run left out (default {DEFAULT_WARMUP}, or steps-1 when fewer steps)")
    add_launch_options(p)  # calibrate with the transport the runs will use
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_force_option(p)
    p.set_defaults(func=run)


def probe_config(args: argparse.Namespace) -> RunConfig:
    """The probe runs' settings, checked: a calibration measures float32 training at real speed (no
    ``--verify``, no ``--emulate``, the runs' learning rate)."""
    return RunConfig(args.graph, args.cluster, args.plan, request_from_args(args), steps=args.steps,
                     warmup=args.warmup, seed=args.seed, transport=args.transport, spin=args.spin,
                     timeout=args.timeout).checked()


def run(args: argparse.Namespace) -> int:
    """Probe, calibrate, write; 0, or 1 if a probe run failed (``InputError`` on bad input)."""
    # the runtime imports torch: imported here, not while the parser is built (every --help)
    from pipeplan.runtime.calibrate import calibrated_cluster, device_factors, run_factors
    from pipeplan.runtime.checks import load_inputs
    from pipeplan.runtime.measure import align, measured_steps, median_step

    config = probe_config(args)
    if args.runs < 1:
        raise InputError("-", "--runs", f"must be at least 1, got {args.runs}")
    # The cluster may be replaced by its calibrated self; the graph and plan may not.
    check_outputs(args, args.output, inputs={"graph": args.graph, "plan": args.plan})
    inputs = load_inputs(config.graph, config.cluster, config.plan, config.model, False, config.seed)
    for note in warn_names(inputs.plan, inputs.graph, inputs.cluster, args.plan, doing="calibrating"):
        warn(note)
    runs, measured, transports = [], [], set()
    for i in range(args.runs):
        print(f"probe run {i + 1}/{args.runs} ...", file=sys.stderr, flush=True)
        try:
            result = align(launch(config, inputs))
        except WorkerError as exc:
            return report_worker_error(exc, args.plan)
        runs.append(run_factors(result["ranks"], measured_steps(result), inputs.plan, inputs.graph, inputs.cluster))
        measured.append(median_step(result)[0])
        transports.add(result.get("transport", args.transport))
    factors = device_factors(runs)
    if not factors:
        raise InputError(args.plan, "stages", "no device's ops took measurable time, so there is nothing to "
                                              "calibrate; use a probe plan with real work on its devices")
    note = {"graph": inputs.graph.name, "model": args.model, "plan": os.path.basename(args.plan),
            "runs": args.runs, "steps": config.steps, "warmup": config.warmup,
            "transport": "/".join(sorted(transports))}
    try:
        cluster = calibrated_cluster(inputs.cluster, factors, note)
    except ValueError as exc:
        raise InputError(args.cluster, "devices", str(exc)) from None
    after = simulate(inputs.plan, inputs.graph, cluster, file=args.plan, validate=False)
    after.check_finite(args.plan)
    summary = {"cluster": args.output, "factors": factors,
               "speeds": {d.id: d.speed for d in cluster.devices if d.id in factors},
               "run_factors": runs, "not_calibrated": cluster.extra["calibration"]["not_calibrated"],
               "measured_iteration_time": statistics.median(measured),
               "predicted_before": inputs.prediction.iteration_time, "predicted_after": after.iteration_time}
    atomic_write_text(args.output, dumps(cluster.to_dict()))
    for note_line in _notes(summary):
        warn(note_line)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_text(summary, inputs.cluster)
    return 0


def _notes(summary: dict) -> list[str]:
    """Warnings about what the calibrated cluster does not capture."""
    notes = []
    far = {d: f for d, f in summary["factors"].items() if not 1 / FAR_FACTOR <= f <= FAR_FACTOR}
    if far:
        notes.append(f"warning: {summary['cluster']}: factors: "
                     f"{', '.join(f'{d} {f:.3g}' for d, f in far.items())} (measured / charged) are far from 1: "
                     f"such a device's ops took little time next to its messages' CPU, or the graph was not "
                     f"profiled on this machine; a probe that gives each device several layers measures it better")
    if summary["not_calibrated"]:
        notes.append(f"warning: {summary['cluster']}: not_calibrated: devices {', '.join(summary['not_calibrated'])} "
                     f"keep their uncalibrated speed (no probe gave them work); a planner will see the calibrated "
                     f"devices slower or faster than these by the calibration alone")
    gap = summary["measured_iteration_time"] / summary["predicted_after"] - 1
    if abs(gap) > PROBE_GAP:
        notes.append(f"note: the probe measured {summary['measured_iteration_time'] * 1e3:.3f} ms, "
                     f"{100 * gap:+.1f} % off its calibrated prediction {summary['predicted_after'] * 1e3:.3f} ms: "
                     f"speeds scale op times only, and the rest is the timeline (messages, iteration starts) "
                     f"or a run slower than the others")
    return [one_line(n) for n in notes]


def _print_text(summary: dict, before: Cluster) -> None:
    speeds_before = {d.id: d.speed for d in before.devices}
    print(f"probe measured {summary['measured_iteration_time'] * 1e3:.3f} ms (median of the runs' medians), "
          f"predicted {summary['predicted_before'] * 1e3:.3f} ms before calibration, "
          f"{summary['predicted_after'] * 1e3:.3f} ms after")
    print(f"{'device':<10}{'speed before':>13}  {'factor':>7}  {'per run':<24}{'speed after':>11}")
    for device, factor in summary["factors"].items():
        per_run = " ".join(f"{run[device]:.3f}" if device in run else "-" for run in summary["run_factors"])
        print(f"{device:<10}{speeds_before[device]:>13.4g}  {factor:>7.3f}  {per_run:<24}"
              f"{summary['speeds'][device]:>11.4g}")
    print(f"wrote {summary['cluster']} (factor = measured / charged seconds of the device's ops; "
          f"speed after = speed before / factor)")
