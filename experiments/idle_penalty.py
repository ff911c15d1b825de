"""How much slower an op runs right after its core sat idle: the runtime error the spec cannot see.

A pipeline rank waits for messages between ops; the profiler (``pipeplan.models.profile_measured``)
times each unit's forward and backward back to back.  This script times one unit of a
zoo model both ways on this machine: back to back, after the core idled for ``g``
seconds (``time.sleep``: the thread blocks, as a rank blocked on a receive does), and
after the same ``g`` spent spinning (the core stays busy: time passes, nothing
sleeps).  If idling costs more than spinning, the difference is what a waiting rank
pays per op on top of the profile, and it grows with the wait, so it depends on the
plan: a light stage or a GPipe rank waits more than the bottleneck of a 1F1B pipeline.

Usage: ``python experiments/idle_penalty.py [--model gpt-tiny] [--unit 2] [--batch 16]
[--repeats 40] [--gaps 0,0.25,0.5,1,2,5] [--out out/idle_penalty.json]`` (gaps in ms).
Prints a markdown table: median forward and backward time per gap and way of waiting,
and the ratio to back to back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeplan.models.jsonio import atomic_write_text  # noqa: E402
from pipeplan.models.profile_measured import time_unit, unit_args  # noqa: E402
from pipeplan.models.zoo import build_model  # noqa: E402


def spin(seconds: float) -> None:
    """Keep the core busy for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(model_name: str, unit: int, batch: int, gaps: list[float], repeats: int) -> list[dict]:
    torch.set_num_threads(1)  # as a pipeline rank runs
    model = build_model(model_name, seed=0)
    x, _ = model.example_batch(batch, 0)
    args = unit_args(model, x)[unit]
    module = model.units[unit].module
    time_unit(module, args, 5, repeats)  # warm the allocator and caches once
    rows = []
    for gap in sorted(set(gaps)):
        for way, wait in (("idle", time.sleep), ("spin", spin)):
            if gap == 0 and way == "spin":
                continue
            f, b = time_unit(module, args, 5, repeats, pause=(lambda: wait(gap)) if gap else None)
            rows.append({"gap": gap, "wait": way if gap else "back to back", "fwd": f, "bwd": b})
            print(f"gap {gap * 1e3:5.2f} ms {rows[-1]['wait']:<12} F {f * 1e3:.3f} ms  B {b * 1e3:.3f} ms",
                  file=sys.stderr, flush=True)
    base = rows[0]  # gap 0: back to back
    for row in rows:
        row["fwd_ratio"], row["bwd_ratio"] = row["fwd"] / base["fwd"], row["bwd"] / base["bwd"]
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| wait before each op | forward | x back to back | backward | x back to back |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        label = "none (back to back)" if r["gap"] == 0 else f"{r['gap'] * 1e3:g} ms {r['wait']}"
        lines.append(f"| {label} | {r['fwd'] * 1e3:.3f} ms | {r['fwd_ratio']:.2f} | {r['bwd'] * 1e3:.3f} ms | "
                     f"{r['bwd_ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--unit", type=int, default=2, help="unit index (default 2: a transformer block)")
    parser.add_argument("--batch", type=int, default=16, help="samples per op (default 16)")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--gaps", default="0,0.25,0.5,1,2,5", help="waits in ms, comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "idle_penalty.json")
    args = parser.parse_args(argv)
    gaps = [float(g) / 1e3 for g in args.gaps.split(",")]
    if 0.0 not in gaps:
        gaps.insert(0, 0.0)
    rows = measure(args.model, args.unit, args.batch, gaps, args.repeats)
    print(markdown(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps({"model": args.model, "unit": args.unit, "batch": args.batch,
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
