"""Benchmark: the runtime's measured iteration times against the simulator, and against torch.

1. *Measured vs predicted.*  Profiles ``gpt-tiny`` on this machine, measures the
   loopback link (gloo ping-pong) into a one-server cluster of two CPU "devices" of
   speed 1, then runs a set of plans with as many busy ranks as cores (two) through
   ``pipeplan run`` and compares the median measured iteration time with the
   simulator's prediction for the same plan, graph and cluster.  Target (issue 6):
   median error <= 10 %.
2. *Ours vs torch.distributed.pipelining.*  The same even two-stage partition of
   ``gpt-tiny`` (units 0-2 | 3-5, 4 microbatches of 8) run by our executor with the
   ``1f1b`` schedule and by torch's ``Schedule1F1B`` (gloo, one thread per rank).
   Target: ours at most 1.05x torch's time.  (Ours also keeps the tied embedding and
   head identical with an all-reduce each iteration, which torch's stages do not.)

Usage: ``python experiments/bench_runtime.py [--steps 12] [--out out/bench_runtime]``;
prints a table and writes ``results.jsonl`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gpt-tiny"


# ----------------------------------------------------------------- set-up
def profile_graph(out: Path) -> Path:
    """Profile the model on this machine (cached by the profiler)."""
    path = out / f"{MODEL}.graph.json"
    _pipeplan("profile", MODEL, "--batch-sizes", "1,2,4,8,16", "--repeats", "7", "-o", str(path))
    return path


def local_cluster(out: Path, latency: float, bandwidth: float) -> Path:
    """Two speed-1 CPU devices on one server whose link is the measured loopback."""
    cluster = {"format": "pipeplan.cluster/1", "name": "local-2cpu",
               "servers": [{"id": "local", "bandwidth": bandwidth, "latency": latency}],
               "network": {"bandwidth": bandwidth, "latency": latency},
               "devices": [{"id": f"c{i}", "server": "local", "speed": 1.0, "memory": 8e9} for i in range(2)]}
    path = out / "local.cluster.json"
    path.write_text(json.dumps(cluster, indent=1))
    return path


def plans() -> dict[str, dict]:
    """Two-rank plans: partitions, schedules, splits, recompute, replication."""
    def plan(schedule, stages):
        return {"format": "pipeplan.plan/1", "graph": f"{MODEL}-6", "cluster": "local-2cpu", "global_batch": 32,
                "state_factor": 4, "schedule": schedule,
                "stages": [{"layers": list(layers), "devices": devs, "microbatches": split, "recompute": rec}
                           for layers, devs, split, rec in stages]}

    even = ((0, 3), (3, 6))
    return {
        "1f1b 3|3 4x8": plan("1f1b", [(even[0], ["c0"], [8] * 4, False), (even[1], ["c1"], [8] * 4, False)]),
        "gpipe 3|3 4x8": plan("gpipe", [(even[0], ["c0"], [8] * 4, False), (even[1], ["c1"], [8] * 4, False)]),
        "1f1b 3|3 8x4": plan("1f1b", [(even[0], ["c0"], [4] * 8, False), (even[1], ["c1"], [4] * 8, False)]),
        "1f1b 3|3 2x16": plan("1f1b", [(even[0], ["c0"], [16] * 2, False), (even[1], ["c1"], [16] * 2, False)]),
        "1f1b 2|4 4x8": plan("1f1b", [((0, 2), ["c0"], [8] * 4, False), ((2, 6), ["c1"], [8] * 4, False)]),
        "1f1b 4|2 4x8": plan("1f1b", [((0, 4), ["c0"], [8] * 4, False), ((4, 6), ["c1"], [8] * 4, False)]),
        "1f1b 3|3 recompute": plan("1f1b", [(even[0], ["c0"], [8] * 4, True), (even[1], ["c1"], [8] * 4, True)]),
        "gpipe 3|3 unequal": plan("gpipe", [(even[0], ["c0"], [12, 12, 8], False),
                                            (even[1], ["c1"], [8, 8, 8, 8], False)]),
        "data-parallel r=2": plan("gpipe", [((0, 6), ["c0", "c1"], [16, 16], False)]),
    }


# ----------------------------------------------------------------- runs
def run_ours(graph: Path, cluster: Path, plan_path: Path, steps: int) -> dict:
    done = _pipeplan("run", str(graph), str(cluster), str(plan_path), "--model", MODEL, "--steps", str(steps),
                     "--warmup", "3", "--json")
    return json.loads(done.stdout)


def _pipeplan(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "pipeplan.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"pipeplan {' '.join(argv)} failed:\n{done.stderr}")
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(task: str, out: Path, **kw) -> dict:
    """Run ``task`` on two gloo ranks (torch.multiprocessing); rank 0's result."""
    import torch.multiprocessing as mp

    result = out / f"{task}.json"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), GLOO_SOCKET_IFNAME="lo")
    mp.spawn(_rank_main, args=(task, str(result), kw), nprocs=2, join=True)
    return json.loads(result.read_text())


def _rank_main(rank: int, task: str, result: str, kw: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    data = _ping_pong(rank) if task == "loopback" else _torch_1f1b(rank, **kw)
    if rank == 0:
        Path(result).write_text(json.dumps(data))
    dist.destroy_process_group()


def _ping_pong(rank: int) -> dict:
    """Loopback latency (1-element round trips) and bandwidth (8 MB one way), gloo."""
    import torch.distributed as dist

    def one_way(nbytes: int, rounds: int) -> float:
        buf = torch.zeros(max(nbytes // 4, 1))
        times = []
        for _ in range(rounds):
            dist.barrier()
            t = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - t) / 2)
        return statistics.median(times)

    latency = one_way(4, 200)
    big = 8 << 20
    return {"latency": latency, "bandwidth": big / max(one_way(big, 10) - latency, 1e-9)}


def _torch_1f1b(rank: int, steps: int, warmup: int, batch: int, microbatches: int) -> dict:
    """torch.distributed.pipelining's Schedule1F1B on units 0-2 | 3-5 of the model."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from models.zoo import build_model

    model = build_model(MODEL, seed=0)

    class Part(nn.Module):
        def __init__(self, units):
            super().__init__()
            self.units = nn.ModuleList(u.module for u in units)

        def forward(self, x):
            for unit in self.units:
                x = unit(x)
            return x

    part = Part(model.units[:3] if rank == 0 else model.units[3:])
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    schedule = Schedule1F1B(stage, microbatches, loss_fn=model.loss)
    optimizer = torch.optim.SGD(part.parameters(), lr=0.05)
    times = []
    for step in range(steps):
        x, y = model.example_batch(batch, step)
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        took = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(float(took))
        optimizer.step()
        optimizer.zero_grad()
    return {"iteration_times": times, "median": statistics.median(times[warmup:])}


# ----------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (3 warm-up)")
    parser.add_argument("--out", default=str(ROOT / "out" / "bench_runtime"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))

    graph = profile_graph(out)
    link = _spawn("loopback", out)
    cluster = local_cluster(out, link["latency"], link["bandwidth"])
    print(f"loopback link: latency {link['latency'] * 1e6:.1f} us, bandwidth {link['bandwidth'] / 1e9:.2f} GB/s")
    rows = []
    for name, plan in plans().items():
        path = out / (name.replace(" ", "_").replace("|", "-").replace("=", "") + ".plan.json")
        path.write_text(json.dumps(plan, indent=1))
        s = run_ours(graph, cluster, path, args.steps)
        error = s["measured_iteration_time"] / s["predicted_iteration_time"] - 1
        rows.append({"plan": name, "measured": s["measured_iteration_time"],
                     "predicted": s["predicted_iteration_time"], "error": error})
        print(f"{name:<22} measured {s['measured_iteration_time'] * 1e3:8.3f} ms   predicted "
              f"{s['predicted_iteration_time'] * 1e3:8.3f} ms   error {100 * error:+6.1f} %", flush=True)
    median_error = statistics.median(abs(r["error"]) for r in rows)
    print(f"median |error| over {len(rows)} plans: {100 * median_error:.1f} % (target <= 10 %)")

    ours = rows[0]["measured"]  # "1f1b 3|3 4x8": the same partition and split as torch's run below
    theirs = _spawn("torch1f1b", out, steps=args.steps, warmup=3, batch=32, microbatches=4)["median"]
    print(f"even two-stage 1F1B, 4 x 8: ours {ours * 1e3:.3f} ms, torch Schedule1F1B {theirs * 1e3:.3f} ms, "
          f"ratio {ours / theirs:.3f} (target <= 1.05)")
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__, "steps": args.steps,
            "link": link}
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"bench": "measured-vs-predicted", **r, **meta}) + "\n")
        f.write(json.dumps({"bench": "ours-vs-torch-1f1b", "ours": ours, "torch": theirs, "ratio": ours / theirs,
                            "median_abs_error": median_error, **meta}) + "\n")


if __name__ == "__main__":
    main()
