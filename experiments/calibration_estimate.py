"""After the fact: what calibration would have done to the runtime benchmark's earlier runs.

No run is repeated.  For each kept ``experiments/results/runtimeN.jsonl``, one plan per
plan set stands in for the probe (the even 1F1B plan with 4 microbatches), one factor per
set is taken from its measured op costs, every other plan's prediction is scaled by it
and the median |error| is printed (the stand-in left out). Two factors are compared:
the op costs as the replay counts them (compute plus message CPU, what ``pipeplan
calibrate`` measures) and compute alone (the runs' ``busy`` over ``predicted_busy``).
Scaling a whole prediction is an approximation (message and all-reduce times do not
scale with speed), and the factor comes from a run of the set rather than from a probe
run of its own, so these are estimates, not measurements.

Usage: ``python experiments/calibration_estimate.py [N ...]`` (default: every kept run
with a ``.jsonl``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
STAND_INS = {"b32 ": "b32 1f1b 3|3 4x8", "b64 ": "b64 1f1b 3|3 4x16", "unet ": "unet 1f1b 4|4 4x4"}
"""Per plan set (name prefix), the plan whose measured op costs give the set's factor."""


def estimate(rows: list[dict]) -> dict[str, float]:
    """Median |error| over the plans (stand-ins left out): as measured, and with each factor."""
    errors: dict[str, list[float]] = {"profile": [], "op costs": [], "compute": []}
    for prefix, name in STAND_INS.items():
        plans = [r for r in rows if r["plan"].startswith(prefix)]
        probe = next(r for r in plans if r["plan"] == name)
        factors = {"op costs": 1 + probe["op_cost_error"], "compute": sum(probe["busy"]) / sum(probe["predicted_busy"])}
        for r in plans:
            if r is not probe:
                errors["profile"].append(abs(r["error"]))
                for key, factor in factors.items():
                    errors[key].append(abs((1 + r["error"]) / factor - 1))
    return {key: statistics.median(values) for key, values in errors.items()}


def main() -> None:
    runs = [int(n) for n in sys.argv[1:]] or sorted(int(p.stem.removeprefix("runtime")) for p in
                                                    RESULTS.glob("runtime*.jsonl"))
    print("run        profile alone   factor from op costs   factor from compute alone   (median |error|)")
    for n in runs:
        rows = [json.loads(line) for line in (RESULTS / f"runtime{n}.jsonl").read_text().splitlines()]
        got = estimate([r for r in rows if r.get("bench") == "measured-vs-predicted"])
        print(f"runtime{n:<4} {100 * got['profile']:>10.1f} % {100 * got['op costs']:>18.1f} % "
              f"{100 * got['compute']:>24.1f} %")


if __name__ == "__main__":
    main()
