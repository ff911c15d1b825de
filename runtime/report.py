"""What a run prints and writes: measured vs predicted, memory, verification."""

from __future__ import annotations

import json
import sys
from typing import Any

from pipeplan.models.errors import one_line
from pipeplan.models.jsonio import atomic_write_text
from pipeplan.runtime.checks import RunInputs
from pipeplan.runtime.measure import align, chrome_trace, idle_spans, iteration_times, measured_steps, median_step, write_gantt
from pipeplan.runtime.replay import rank_stages, replay
from pipeplan.runtime.verify import ABSOLUTE, TOLERANCE
from pipeplan.solver.bounds.infeasibility import format_bytes
from pipeplan.solver.evaluation.simulator import Simulation


def without_step(prediction: Simulation) -> float:
    """``T`` less the optimizer step: when the last group ends its all-reduce.

    The run times an iteration up to the gradient all-reduce (see
    :mod:`pipeplan.runtime.measure`) and trains with plain SGD, whose step is not the
    profiled optimizer's (Adam by default).  So measured times are compared with the
    prediction before the step; ``predicted_step`` in the summary says what it adds.
    """
    return max(end - group.step for end, group in zip(prediction.group_end, prediction.groups))


def summarize(inputs: RunInputs, result: dict) -> dict[str, Any]:
    """The JSON object of ``pipeplan run --json``."""
    align(result)
    measured, step = median_step(result)
    predicted = without_step(inputs.prediction)
    ranks = result["ranks"]
    summary: dict[str, Any] = {
        "model": result["model"], "plan": inputs.plan_file, "processes": len(ranks),
        "dtype": result["dtype"], "emulate": result["emulate"],
        "steps": result["steps"], "warmup": result["warmup"],
        "measured_iteration_time": measured,
        "predicted_iteration_time": predicted,
        "predicted_step": inputs.prediction.iteration_time - predicted,
        "ratio": measured / predicted if predicted > 0 else None,
        # The spec's timeline on the measured op times: see runtime.replay.
        "replayed_iteration_time": without_step(replay(ranks, measured_steps(result), inputs.prediction)),
        "iteration_times": iteration_times(result),
        "peak_memory": [r["peak_memory"] for r in ranks],
        "peak_memory_kind": ranks[0]["peak_memory_kind"],
        # one peak per device group
        "predicted_peak_memory": [inputs.prediction.peak_memory[r.get("group", r["stage"])] for r in ranks],
        "rss_peak": [r["rss_peak"] for r in ranks],
        "idle": [sum(b - a for a, b in idle_spans(r["steps"][step]["events"], r["steps"][step]["end"]))
                 for r in ranks],
        "devices": [r["device"] for r in ranks],
        "losses": step_losses(ranks),
        **breakdown(ranks, step, _busy_by_rank(inputs, ranks)),
    }
    if "max_param_diff" in result:
        diff = result["max_param_diff"]  # None: some parameter held NaN or inf
        summary.update(max_param_diff=diff, max_param_diff_at=result["max_param_diff_at"],
                       verified=diff is not None and diff <= TOLERANCE)
        if result.get("verify_notes"):
            summary["verify_notes"] = result["verify_notes"]
    return summary


def step_losses(ranks: list[dict]) -> list[float]:
    """The loss of the global batch at every step: the sum over the last stage's ranks.

    Each rank's ``loss`` is the sum of its pieces' losses scaled by their share of the
    batch (see :meth:`pipeplan.runtime.stage.Stage.loss`), so the sum over the ranks
    is the mean loss over the whole batch.  On a tensor-parallel last stage only each
    replica's leader reports it (its other ranks compute the same loss; theirs is ``None``).
    """
    last = max(s for r in ranks for s in rank_stages(r))
    steps = len(ranks[0]["steps"])
    return [sum(r["steps"][k]["loss"] for r in ranks if last in rank_stages(r) and r["steps"][k]["loss"] is not None)
            for k in range(steps)]


def _busy_by_rank(inputs: RunInputs, ranks: list[dict]) -> list[float]:
    """Seconds the spec charges each rank's actions: its group's busy time."""
    busy = inputs.prediction.busy
    return [float(busy[r.get("group", r["stage"])]) for r in ranks]


def breakdown(ranks: list[dict], step: int, predicted_busy: list[float]) -> dict[str, Any]:
    """Where a rank's time went in ``step``, next to what the spec charges for it.

    ``busy``: seconds in forward, backward and recompute spans (the spec's op times,
    ``predicted_busy``, one per rank, are profiled per unit in isolation: what a rank adds on top,
    e.g. the loss on the last stage or caches gone cold while it waited, shows here);
    ``send_cpu``: seconds the rank spent posting sends (packing and handing buffers
    to the backend, which the spec does not charge to the sender: a transfer only
    occupies its link); ``waits``: seconds blocked on receives; ``sync``: the
    gradient sums after the last op (all-reduce and tied weights; the spec has no
    time for tied weights).
    """
    out: dict[str, list[float]] = {"busy": [], "predicted_busy": [], "send_cpu": [], "waits": [], "sync": []}
    for r, charged in zip(ranks, predicted_busy):
        spent = {"forward": 0.0, "backward": 0.0, "recompute": 0.0, "send": 0.0, "receive": 0.0, "allreduce": 0.0}
        for kind, label, a, b in r["steps"][step]["events"]:
            if kind == "send" and label == "wait sends":
                spent["receive"] += b - a  # waiting for the last sends to leave
            else:
                spent[kind] = spent.get(kind, 0.0) + b - a
        out["busy"].append(spent["forward"] + spent["backward"] + spent["recompute"])
        out["predicted_busy"].append(charged)
        out["send_cpu"].append(spent["send"])
        out["waits"].append(spent["receive"])
        out["sync"].append(spent["allreduce"])
    return out


def present(args, inputs: RunInputs, result: dict) -> int:
    """Write the trace and Gantt chart, print the summary; exit status 1 if verification failed."""
    align(result)
    summary = summarize(inputs, result)
    _, step = median_step(result)
    plan = inputs.plan
    title = (f"measured {plan.graph} ({plan.schedule}, {summary['processes']} processes"
             f"{', emulated' if result['emulate'] else ''}): iteration "
             f"{summary['measured_iteration_time'] * 1e3:.3f} ms (median step {step})")
    if args.trace:
        atomic_write_text(args.trace, json.dumps(chrome_trace(result, step, title)))
    if args.gantt:
        write_gantt(result, step, args.gantt, title,
                    inputs.prediction if args.side_by_side else None, f"simulated {plan.graph}")
    if args.json:
        print(json.dumps(summary))
    else:
        _print_text(summary)
    if summary.get("verified") is False:
        notes = "".join(f"; {note}" for note in summary.get("verify_notes", ()))
        print(one_line(f"error: {inputs.plan_file}: verify: max relative parameter difference "
                       f"{_difference(summary['max_param_diff'])} at {summary['max_param_diff_at']} exceeds "
                       f"{TOLERANCE:g} (or {ABSOLUTE:g} absolute near zero){notes}"), file=sys.stderr)
        return 1
    return 0


def _print_text(summary: dict[str, Any]) -> None:
    ratio = summary["ratio"]
    print(f"measured iteration {summary['measured_iteration_time'] * 1e3:.3f} ms "
          f"(median of steps {summary['warmup']}..{summary['steps'] - 1}), predicted "
          f"{summary['predicted_iteration_time'] * 1e3:.3f} ms, ratio {ratio:.3f}" if ratio is not None else "")
    print(f"replayed {summary['replayed_iteration_time'] * 1e3:.3f} ms: the spec's timeline on the measured op "
          f"times (measured / replayed: the timeline's error; replayed / predicted: the op costs')")
    if "max_param_diff" in summary:  # --verify trains in float64: times are not those of the profile
        print("note: --verify trains in float64, so these times are not comparable with a float32 profile; "
              "run without --verify to measure")
    print(f"{'rank':>4}  {'device':<8}{'peak memory':>14}  {'predicted':>12}  {'idle (ms)':>10}")
    for i, device in enumerate(summary["devices"]):
        print(f"{i:>4}  {device:<8}{format_bytes(summary['peak_memory'][i], 2):>14}  "
              f"{format_bytes(summary['predicted_peak_memory'][i], 2):>12}  {summary['idle'][i] * 1e3:>10.3f}")
    print(f"peak memory: {summary['peak_memory_kind']}")
    if "max_param_diff" in summary:
        verdict = "ok" if summary["verified"] else "FAILED"
        print(f"verify: max relative parameter difference {_difference(summary['max_param_diff'])} "
              f"({summary['dtype']}, at {summary['max_param_diff_at']}): {verdict}")
        for note in summary.get("verify_notes", ()):
            print(f"note: {note}")


def _difference(diff: float | None) -> str:
    """A parameter difference for people (``None``: some parameter held NaN or inf)."""
    return "not finite (NaN or inf)" if diff is None else f"{diff:.3g}"
