"""Benchmark: the runtime's measured iteration times against the simulator, and against torch.

1. *Measured vs predicted.*  Measures the loopback link (ping-pong over the runs'
   transport) into a one-server cluster of two CPU "devices" of speed 1, then runs a
   set of plans with as many busy ranks as cores (two) through ``pipeplan run`` and
   compares each measured iteration time with the simulator's prediction for the same
   plan, cluster and a graph of ``gpt-tiny`` profiled on this machine.  The plans run
   in rounds; with ``--profile every-round`` each round is predicted from a profile
   taken just before it, to tell a drift of this shared machine's speed during the
   benchmark from the cost model's error (it did not move the error in two runs, so
   ``once``, one profile per model before its runs, is the default).  A plan's error
   is the median over its runs of measured / predicted - 1, and its timeline and
   op-cost errors are medians of per-run ratios too (before runtime16 they were ratios
   of the medians); the error against the first profile alone is reported next to it.  Every plan shape
   runs at a global batch of 32 and of 64 (see :func:`plans`), and the same shapes
   run on ``unet`` (:func:`unet_plans`, ops of 2-10 ms), each ``--repeats``
   times round-robin; a plan's time is the median over its runs.  Each row also
   says where the time went per rank (the run's ``busy``/``predicted_busy``,
   ``send_cpu`` and ``sync`` fields, see ``pipeplan.runtime.report.breakdown``), so the
   remaining error can be told apart: compute slower than profiled in isolation,
   sender-side cost of posting messages, gradient sums.  Target (issue 6): median
   error <= 10 %.
2. *Ours vs torch.distributed.pipelining.*  The same even two-stage partition of
   ``gpt-tiny`` (units 0-2 | 3-5, 4 microbatches of 8, and of 16) run by our
   executor with the ``1f1b`` schedule and by torch's ``Schedule1F1B`` (gloo, one
   thread per rank), alternating ``--rounds`` times; medians compared.  Target:
   ours at most 1.05x torch's time.  (Ours also keeps the tied embedding and head
   identical with a gradient exchange each iteration, which torch's stages do not.)

3. *Each schedule's best plan.*  For every schedule of the solver benchmark's
   schedule columns (``SCHEDULE_CASES``: gpipe, 1f1b, interleaved-1f1b v=2 and 4,
   interleaved-zb, looped-bfs, zbv) ``pipeplan plan --solver cpsat`` plans
   ``gpt-tiny`` at batch 64 in 4 microbatches on the two CPU devices (the solver
   chooses the stages and device groups), and the plan runs as in part 1; the table
   gives measured against predicted per schedule and the median |error| over the
   plans.  A schedule the planner refuses is listed with its one-line reason.

The machine is shared: every line carries the load average, and bursts of other
work show up as outliers, which the medians absorb.

Each row also has the run's *replayed* time (``pipeplan.runtime.replay``: the simulator's
timeline on the op times the run measured), which splits the error into the
timeline's part (measured vs replayed) and the op costs' part (replayed vs
predicted).

Each model's cluster is also calibrated (``pipeplan calibrate``) on a probe plan that is
not in the set (:func:`probe_plans`), right after the model's profile, and every plan
is predicted a second time with the calibrated cluster: the *calibrated* error.

Runs use ``pipeplan run --transport`` as given (default ``auto``: the
rank-driven TCP sockets on CPU), and the loopback link is measured over the same
transport.

Usage: ``python experiments/bench_runtime.py [--steps 12] [--repeats 3] [--rounds 5]
[--only predicted|torch|schedules] [--transport auto|tcp|dist] [--out out/bench_runtime]``;
prints tables and writes ``results.jsonl``, the README's table (``table.md``) and the
schedules' table (``schedules.md``) in ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch

from pipeplan.models.jsonio import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gpt-tiny"


# ----------------------------------------------------------------- set-up
def profile_graph(out: Path, model: str = MODEL, sizes: str = "1,2,4,8,16,32", tag: str = "") -> Path:
    """Profile ``model`` on this machine now, not from the profiler's cache.

    A cached profile may date from hours before, when this shared machine ran at
    another speed; measured afresh, the profile and the runs see the same machine.
    Three rounds of three repeats spread each op's samples over the profiling time,
    so a slow spell of a few seconds inflates one round's, not the op's median.
    """
    path = out / f"{model}{tag}.graph.json"
    _pipeplan("profile", model, "--batch-sizes", sizes, "--repeats", "3", "--rounds", "3", "--no-cache",
              "-o", str(path))
    return path


def local_cluster(out: Path, latency: float, bandwidth: float) -> Path:
    """Two speed-1 CPU devices on one server whose link is the measured loopback."""
    cluster = {"format": "pipeplan.cluster/1", "name": "local-2cpu",
               "servers": [{"id": "local", "bandwidth": bandwidth, "latency": latency}],
               "network": {"bandwidth": bandwidth, "latency": latency},
               "devices": [{"id": f"c{i}", "server": "local", "speed": 1.0, "memory": 8e9} for i in range(2)]}
    path = out / "local.cluster.json"
    atomic_write_text(path, json.dumps(cluster, indent=1))
    return path


def plans() -> dict[str, dict]:
    """Two-rank plans: partitions, schedules, splits, recompute, replication.

    Each shape at two sizes: the original global batch of 32 (microbatches of 4 to
    16 samples, where an op of ``gpt-tiny`` lasts 0.1 to 0.6 ms and fixed per-op
    costs weigh most) and a batch of 64 (microbatches of 8 to 32, ops of 0.2 to
    1.6 ms), closer to how a pipeline is used: microbatches big enough to keep a
    device busy.
    """
    def plan(batch, schedule, stages):
        return {"format": "pipeplan.plan/1", "graph": f"{MODEL}-6", "cluster": "local-2cpu", "global_batch": batch,
                "state_factor": 4, "schedule": schedule,
                "stages": [{"layers": list(layers), "devices": devs, "microbatches": split, "recompute": rec}
                           for layers, devs, split, rec in stages]}

    even = ((0, 3), (3, 6))
    out = {}
    for b in (32, 64):
        q = b // 4  # the "4 x q" microbatch size
        out.update({
            f"b{b} 1f1b 3|3 4x{q}": plan(b, "1f1b", [(even[0], ["c0"], [q] * 4, False),
                                                      (even[1], ["c1"], [q] * 4, False)]),
            f"b{b} gpipe 3|3 4x{q}": plan(b, "gpipe", [(even[0], ["c0"], [q] * 4, False),
                                                        (even[1], ["c1"], [q] * 4, False)]),
            f"b{b} 1f1b 3|3 8x{b // 8}": plan(b, "1f1b", [(even[0], ["c0"], [b // 8] * 8, False),
                                                           (even[1], ["c1"], [b // 8] * 8, False)]),
            f"b{b} 1f1b 3|3 2x{b // 2}": plan(b, "1f1b", [(even[0], ["c0"], [b // 2] * 2, False),
                                                           (even[1], ["c1"], [b // 2] * 2, False)]),
            f"b{b} 1f1b 2|4 4x{q}": plan(b, "1f1b", [((0, 2), ["c0"], [q] * 4, False),
                                                      ((2, 6), ["c1"], [q] * 4, False)]),
            f"b{b} 1f1b 4|2 4x{q}": plan(b, "1f1b", [((0, 4), ["c0"], [q] * 4, False),
                                                      ((4, 6), ["c1"], [q] * 4, False)]),
            f"b{b} 1f1b 3|3 recompute": plan(b, "1f1b", [(even[0], ["c0"], [q] * 4, True),
                                                          (even[1], ["c1"], [q] * 4, True)]),
            f"b{b} gpipe 3|3 unequal": plan(b, "gpipe", [(even[0], ["c0"], [3 * b // 8, 3 * b // 8, b // 4], False),
                                                          (even[1], ["c1"], [q] * 4, False)]),
            f"b{b} data-parallel r=2": plan(b, "gpipe", [((0, 6), ["c0", "c1"], [b // 2] * 2, False)]),
        })
    return out


def unet_plans() -> dict[str, dict]:
    """The same shapes on ``unet`` (8 units, skip connections relayed across the cut), batch 16.

    Its ops last 2 to 10 ms on this machine, so fixed per-op costs of the executor
    (Python dispatch, posting messages: tens of microseconds) weigh little: this is
    the regime a pipeline is used in.
    """
    def plan(schedule, stages):
        return {"format": "pipeplan.plan/1", "graph": "unet-8", "cluster": "local-2cpu", "global_batch": 16,
                "state_factor": 4, "schedule": schedule,
                "stages": [{"layers": list(layers), "devices": devs, "microbatches": split, "recompute": rec}
                           for layers, devs, split, rec in stages]}

    half = ((0, 4), (4, 8))
    return {
        "unet 1f1b 4|4 4x4": plan("1f1b", [(half[0], ["c0"], [4] * 4, False), (half[1], ["c1"], [4] * 4, False)]),
        "unet gpipe 4|4 4x4": plan("gpipe", [(half[0], ["c0"], [4] * 4, False), (half[1], ["c1"], [4] * 4, False)]),
        "unet 1f1b 4|4 8x2": plan("1f1b", [(half[0], ["c0"], [2] * 8, False), (half[1], ["c1"], [2] * 8, False)]),
        "unet 1f1b 3|5 4x4": plan("1f1b", [((0, 3), ["c0"], [4] * 4, False), ((3, 8), ["c1"], [4] * 4, False)]),
        "unet 1f1b 5|3 4x4": plan("1f1b", [((0, 5), ["c0"], [4] * 4, False), ((5, 8), ["c1"], [4] * 4, False)]),
        "unet 1f1b 4|4 recompute": plan("1f1b", [(half[0], ["c0"], [4] * 4, True), (half[1], ["c1"], [4] * 4, True)]),
        "unet gpipe 4|4 unequal": plan("gpipe", [(half[0], ["c0"], [6, 6, 4], False),
                                                 (half[1], ["c1"], [4] * 4, False)]),
        "unet data-parallel r=2": plan("gpipe", [((0, 8), ["c0", "c1"], [8, 8], False)]),
    }


def probe_plans() -> dict[str, tuple[str, dict]]:
    """Per model, the plan ``pipeplan calibrate`` measures device speeds with: ``(name, plan)``.

    Neither is one of the benchmark's plans (other global batches: 48 and 12), so the
    calibrated predictions are checked on plans the calibration never ran.
    """
    gpt = {"format": "pipeplan.plan/1", "graph": f"{MODEL}-6", "cluster": "local-2cpu", "global_batch": 48,
           "state_factor": 4, "schedule": "1f1b",
           "stages": [{"layers": [0, 3], "devices": ["c0"], "microbatches": [12] * 4, "recompute": False},
                      {"layers": [3, 6], "devices": ["c1"], "microbatches": [12] * 4, "recompute": False}]}
    unet = {"format": "pipeplan.plan/1", "graph": "unet-8", "cluster": "local-2cpu", "global_batch": 12,
            "state_factor": 4, "schedule": "1f1b",
            "stages": [{"layers": [0, 4], "devices": ["c0"], "microbatches": [3] * 4, "recompute": False},
                       {"layers": [4, 8], "devices": ["c1"], "microbatches": [3] * 4, "recompute": False}]}
    return {MODEL: ("b48 1f1b 3|3 4x12", gpt), "unet": ("unet b12 1f1b 4|4 4x3", unet)}


def calibrate(graph: Path, cluster: Path, out: Path, steps: int, model: str) -> Path:
    """``pipeplan calibrate`` on the model's probe plan; the calibrated cluster (its factors printed)."""
    name, plan = probe_plans()[model]
    probe = out / f"probe-{model}.plan.json"
    atomic_write_text(probe, json.dumps(plan, indent=1))
    path = out / f"{graph.stem}.calibrated.cluster.json"
    done = _pipeplan("calibrate", str(graph), str(cluster), str(probe), "--model", model, "--steps", str(steps),
                     "--warmup", "3", "--transport", TRANSPORT, "--json", "-o", str(path))
    summary = json.loads(done.stdout)
    print(f"calibrated on {name} ({model}): factors "
          f"{' '.join(f'{d} {f:.3f}' for d, f in summary['factors'].items())}; probe measured "
          f"{summary['measured_iteration_time'] * 1e3:.3f} ms, predicted {summary['predicted_before'] * 1e3:.3f} "
          f"ms before, {summary['predicted_after'] * 1e3:.3f} ms after  [{_load()}]", flush=True)
    return path


@functools.lru_cache(maxsize=None)
def predict(graph: Path, cluster: Path, plan: Path) -> float:
    """The simulator's iteration time of ``plan`` (``pipeplan simulate --json``; the files do not change)."""
    return json.loads(_pipeplan("simulate", str(graph), str(cluster), str(plan), "--json").stdout)["iteration_time"]


# ----------------------------------------------------------------- runs
GROUPS = (("b32 ", "gpt-tiny, batch 32", "gpt-tiny b32"), ("b64 ", "gpt-tiny, batch 64", "gpt-tiny b64"),
          ("unet ", "unet, batch 16", "unet b16"))
"""The plan sets, by the prefix of their names, and how the summary and the table call them."""

TRANSPORT = "auto"
"""``pipeplan run --transport`` of every run (set by ``--transport``)."""


def run_ours(graph: Path, cluster: Path, plan_path: Path, steps: int, model: str = MODEL) -> dict:
    done = _pipeplan("run", str(graph), str(cluster), str(plan_path), "--model", model, "--steps", str(steps),
                     "--warmup", "3", "--json", "--transport", TRANSPORT)
    return json.loads(done.stdout)


def _pipeplan(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "pipeplan.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"pipeplan {' '.join(argv)} failed:\n{done.stderr}")
    return done


SCHEDULE_BATCH, SCHEDULE_MICROBATCHES = 64, 4
"""Batch and microbatches of the schedules' plans (4 is a multiple of every schedule's rounds on 2 groups)."""


def schedule_plans(graph: Path, cluster: Path, out: Path, time_limit: float) -> tuple[dict[str, dict], dict[str, str]]:
    """Each schedule's best plan of ``graph`` on ``cluster`` by ``pipeplan plan --solver cpsat``.

    Returns the plans by name (``"sched zbv"``) and, by the same names, the one-line
    reason of each schedule the planner refused.
    """
    from pipeplan.experiments.bench_solvers import SCHEDULE_CASES, VIRTUAL_SCHEDULES, case_name

    found, refused = {}, {}
    for schedule, v in SCHEDULE_CASES:
        name, path = f"sched {case_name(schedule, v)}", out / f"sched-{schedule}-v{v}.plan.json"
        virtual = ["--virtual-stages", str(v)] if schedule in VIRTUAL_SCHEDULES else []
        done = subprocess.run([sys.executable, "-m", "pipeplan.cli", "plan", str(graph), str(cluster), "--batch",
                               str(SCHEDULE_BATCH), "--microbatches", str(SCHEDULE_MICROBATCHES), "--schedule",
                               schedule, *virtual, "--solver", "cpsat", "--time-limit", str(time_limit),
                               "--force", "-o", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode:
            refused[name] = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        else:
            found[name] = json.loads(path.read_text())
    return found, refused


def schedules_table(rows: list[dict], refused: dict[str, str]) -> str:
    """Measured against predicted per schedule's best plan, the median |error|, and the refusals."""
    lines = ["| schedule | stages / groups | measured | predicted | error | calibrated error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['plan'][len('sched '):]} | {r['stages']} / {r['groups']} | {r['measured'] * 1e3:.2f} ms | "
                     f"{r['predicted'] * 1e3:.2f} ms | {100 * r['error']:+.1f} % | {100 * r['calibrated_error']:+.1f} % |")
    if rows:
        lines.append(f"| median over {len(rows)} plans | | | | {100 * median_abs(rows, 'error'):.1f} % | "
                     f"{100 * median_abs(rows, 'calibrated_error'):.1f} % |")
    lines += [f"\n- {name[len('sched '):]}: not planned: {why}" for name, why in refused.items()]
    return "\n".join(lines) + "\n"


def median_abs(rows: list[dict], key: str) -> float:
    """The median of ``|row[key]|`` over ``rows``."""
    return statistics.median(abs(r[key]) for r in rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(task: str, out: Path, **kw) -> dict:
    """Run ``task`` on two gloo ranks (torch.multiprocessing); rank 0's result."""
    import torch.multiprocessing as mp

    result = out / f"{task}.json"
    for attempt in range(3):  # torch's gloo teardown has been seen to abort a rank now and then
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), GLOO_SOCKET_IFNAME="lo")
        try:
            mp.spawn(_rank_main, args=(task, str(result), kw), nprocs=2, join=True)
            break
        except mp.ProcessExitedException as exc:
            if attempt == 2:
                raise
            print(f"({task}: {exc}; retrying)", file=sys.stderr, flush=True)
    return json.loads(result.read_text())


def _rank_main(rank: int, task: str, result: str, kw: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    data = _ping_pong(rank, **kw) if task == "loopback" else _torch_1f1b(rank, **kw)
    if rank == 0:
        atomic_write_text(Path(result), json.dumps(data))
    dist.destroy_process_group()


def _ping_pong(rank: int, transport: str) -> dict:
    """Loopback latency (1-element round trips) and bandwidth (8 MB one way) over ``transport``.

    The runs' own transport (``pipeplan.runtime.transport``): gloo for ``dist``, the rank-driven
    sockets for ``tcp`` (and ``auto`` on CPU), so the cluster's link is the one the
    runs use.
    """
    import torch.distributed as dist

    from pipeplan.runtime.transport import DistTransport, TcpTransport

    key = ("ping",)
    if transport == "dist":
        link = DistTransport({key: None})
    else:
        def gather(obj):
            out: list = [None, None]
            dist.all_gather_object(out, obj)
            return out
        link = TcpTransport(rank, [(key, 0, 1)], gather)

    def one_way(nbytes: int, rounds: int) -> float:
        buf = torch.zeros(max(nbytes // 4, 1))
        times = []
        for _ in range(rounds):
            dist.barrier()
            t = time.perf_counter()
            if rank == 0:
                link.isend(buf, 1, key).wait()
                link.irecv(buf, 1, key).wait()
            else:
                link.irecv(buf, 0, key).wait()
                link.isend(buf, 0, key).wait()
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

    from pipeplan.models.zoo import build_model

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
def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def measured_vs_predicted(profile: Callable[[int], Path], cluster: Path, out: Path, steps: int, repeats: int,
                          model: str = MODEL, plan_set: dict[str, dict] | None = None) -> list[dict]:
    """Every plan ``repeats`` times, round-robin (a burst of load elsewhere spreads over plans).

    ``profile(r)`` gives the graph that round ``r`` is predicted from: a fresh profile
    per round (``--profile every-round``) or the first one throughout (``once``).  A
    plan's ``error`` pairs each run with its round's prediction (the median of the
    runs' ratios); ``first_profile_error`` compares the median run with the prediction
    from round 0's profile alone, as a single profile before all runs would.
    """
    paths = {}
    for name, plan in (plans() if plan_set is None else plan_set).items():
        path = out / (name.replace(" ", "_").replace("|", "-").replace("=", "") + ".plan.json")
        atomic_write_text(path, json.dumps(plan, indent=1))
        paths[name] = path
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    calibrated: dict[Path, Path] = {}  # profile -> the cluster calibrated with it
    for round_ in range(repeats):
        graph = profile(round_)
        if graph not in calibrated:
            calibrated[graph] = calibrate(graph, cluster, out, steps, model)
        for name, path in paths.items():
            got = run_ours(graph, cluster, path, steps, model)
            got["calibrated_prediction"] = predict(graph, calibrated[graph], path)
            runs[name].append(got)
    rows = []
    for name, got in runs.items():
        first = got[0]["predicted_iteration_time"]  # round 0's prediction
        ratios = [r["measured_iteration_time"] / r["predicted_iteration_time"] for r in got]
        replay_ratios = [r["replayed_iteration_time"] / r["predicted_iteration_time"] for r in got]
        got = sorted(got, key=lambda r: r["measured_iteration_time"])
        s = got[(len(got) - 1) // 2]  # the run with the (lower) median time, for its breakdown
        measured = statistics.median(r["measured_iteration_time"] for r in got)
        predicted = statistics.median(r["predicted_iteration_time"] for r in got)
        replayed = statistics.median(r["replayed_iteration_time"] for r in got)
        error = statistics.median(ratios) - 1
        op_cost_error = statistics.median(replay_ratios) - 1
        timeline_error = statistics.median(r["measured_iteration_time"] / r["replayed_iteration_time"] for r in got) - 1
        calibrated_error = statistics.median(r["measured_iteration_time"] / r["calibrated_prediction"] for r in got) - 1
        row = {"plan": name, "measured": measured, "predicted": predicted, "error": error,
               "calibrated_predicted": statistics.median(r["calibrated_prediction"] for r in got),
               "calibrated_error": calibrated_error,
               "first_profile_error": measured / first - 1,
               "replayed": replayed, "timeline_error": timeline_error,
               "op_cost_error": op_cost_error,
               "runs": [r["measured_iteration_time"] for r in got],
               "predictions": [r["predicted_iteration_time"] for r in got],
               **{key: s[key] for key in ("busy", "predicted_busy", "send_cpu", "waits", "sync")}}
        rows.append(row)
        busy = " ".join(f"{b * 1e3:.2f}/{p * 1e3:.2f}" for b, p in zip(row["busy"], row["predicted_busy"]))
        print(f"{name:<26} measured {measured * 1e3:8.3f} ms  predicted {predicted * 1e3:8.3f} ms  "
              f"error {100 * error:+6.1f} % (first profile {100 * row['first_profile_error']:+6.1f} %, "
              f"calibrated {100 * calibrated_error:+6.1f} %)  "
              f"replayed {replayed * 1e3:8.3f} ms (timeline "
              f"{100 * row['timeline_error']:+5.1f} %, op costs {100 * op_cost_error:+5.1f} %)"
              f"  | per rank: compute meas/pred {busy} ms, send cpu "
              f"{' '.join(f'{x * 1e3:.2f}' for x in row['send_cpu'])} ms, grad sync "
              f"{' '.join(f'{x * 1e3:.2f}' for x in row['sync'])} ms", flush=True)
    return rows


def markdown_table(rows: list[dict]) -> str:
    """The README's table: per plan shape, each model's times and errors (raw, calibrated, timeline)."""
    by_shape: dict[str, dict[str, dict]] = {}
    for r in rows:
        prefix = next(p for p, _, _ in GROUPS if r["plan"].startswith(p))
        by_shape.setdefault(_shape(r["plan"]), {})[prefix] = r
    head = "| plan | " + " | ".join(f"{label}: measured / predicted / calibrated / replayed | error | calibrated "
                                    f"| timeline" for _, _, label in GROUPS) + " |"
    lines = [head, "|---|" + "---|---:|---:|---:|" * len(GROUPS)]
    for shape, got in by_shape.items():
        cells = []
        for prefix, _, _ in GROUPS:
            r = got.get(prefix)
            cells += ["", "", "", ""] if r is None else [
                " / ".join(f"{r[k] * 1e3:.{1 if prefix == 'unet ' else 2}f}"
                           for k in ("measured", "predicted", "calibrated_predicted", "replayed")) + " ms",
                f"{100 * r['error']:+.0f} %", f"{100 * r['calibrated_error']:+.0f} %",
                f"{100 * r['timeline_error']:+.0f} %"]
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _shape(plan: str) -> str:
    """``"b32 1f1b 3|3 4x8"`` -> ``"1f1b, even split, 4 microbatches"``: the models' versions of a plan share it."""
    words = plan.split()[1:]
    if words[0] == "data-parallel":
        return "data parallel, one stage on 2 replicas"
    schedule, cut, rest = words
    part = {"3|3": "even split", "4|4": "even split", "2|4": "light first stage", "3|5": "light first stage",
            "4|2": "light second stage", "5|3": "light second stage"}[cut]
    named = {"unequal": "unequal per-stage splits"}
    tail = f"{rest.split('x')[0]} microbatches" if "x" in rest else named.get(rest, rest)
    return f"{schedule}, {part}, {tail}"


def ours_vs_torch(graph: Path, cluster: Path, out: Path, steps: int, rounds: int) -> list[dict]:
    """Our 1f1b and torch's Schedule1F1B on the same even split, alternating, ``rounds`` times each."""
    results = []
    for batch in (32, 64):
        q = batch // 4
        path = out / f"torch-match-b{batch}.plan.json"
        atomic_write_text(path, json.dumps(plans()[f"b{batch} 1f1b 3|3 4x{q}"], indent=1))
        ours, theirs = [], []
        for i in range(rounds):  # alternate which goes first, so a slow spell hits both
            order = ("ours", "torch") if i % 2 == 0 else ("torch", "ours")
            for who in order:
                if who == "ours":
                    ours.append(run_ours(graph, cluster, path, steps)["measured_iteration_time"])
                else:
                    theirs.append(_spawn("torch1f1b", out, steps=steps, warmup=3, batch=batch,
                                         microbatches=4)["median"])
        mo, mt = statistics.median(ours), statistics.median(theirs)
        per_round = statistics.median(a / b for a, b in zip(ours, theirs))
        results.append({"batch": batch, "microbatches": 4, "ours": mo, "torch": mt, "ratio": mo / mt,
                        "median_round_ratio": per_round, "ours_runs": ours, "torch_runs": theirs})
        print(f"even two-stage 1F1B, 4 x {q}: ours {mo * 1e3:.3f} ms, torch Schedule1F1B {mt * 1e3:.3f} ms "
              f"(medians of {rounds} alternating runs), ratio {mo / mt:.3f}, median per-round ratio "
              f"{per_round:.3f} (target <= 1.05)  [{_load()}]", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (3 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per plan (their median is reported)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating ours/torch rounds per comparison")
    parser.add_argument("--only", choices=("predicted", "torch", "schedules"), help="run one of the three benchmarks")
    parser.add_argument("--plan-time-limit", type=float, default=20.0,
                        help="seconds of pipeplan plan per schedule's best plan (default 20)")
    parser.add_argument("--transport", choices=("auto", "tcp", "dist"), default="auto",
                        help="pipeplan run --transport of every run, and of the link measurement")
    parser.add_argument("--profile", choices=("once", "every-round"), default="once",
                        help="profile each model once before its runs (default), or afresh before each round")
    parser.add_argument("--out", default=str(ROOT / "out" / "bench_runtime"))
    args = parser.parse_args()
    global TRANSPORT
    TRANSPORT = args.transport
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))

    profiles: dict[tuple[str, int], Path] = {}

    def profile(model: str, sizes: str) -> Callable[[int], Path]:
        """Round ``r``'s graph of ``model``: profiled afresh, or round 0's under ``--profile once``."""
        def graph(round_: int) -> Path:
            if args.profile == "once":
                round_ = 0
            if (model, round_) not in profiles:
                profiles[model, round_] = profile_graph(out, model, sizes, f".r{round_}")
            return profiles[model, round_]
        return graph

    gpt = profile(MODEL, "1,2,4,8,16,32")
    link = _spawn("loopback", out, transport=args.transport)
    cluster = local_cluster(out, link["latency"], link["bandwidth"])
    print(f"loopback link: latency {link['latency'] * 1e6:.1f} us, bandwidth {link['bandwidth'] / 1e9:.2f} GB/s "
          f"[{_load()}]")
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__, "steps": args.steps,
            "link": link, "transport": args.transport}
    records: list[dict] = []

    def save() -> None:  # after each part, so a later failure keeps what was measured
        with open(out / "results.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    if args.only in (None, "predicted"):
        rows = measured_vs_predicted(gpt, cluster, out, args.steps, args.repeats)
        unet = profile("unet", "1,2,4,8")
        rows += measured_vs_predicted(unet, cluster, out, max(6, args.steps // 2), args.repeats, "unet", unet_plans())
        median_error = statistics.median(abs(r["error"]) for r in rows)
        for prefix, label, _ in GROUPS:
            mine = [abs(r["error"]) for r in rows if r["plan"].startswith(prefix)]
            print(f"median |error|, {label}: {100 * statistics.median(mine):.1f} % over {len(mine)} plans")
        print(f"median |error| over all {len(rows)} plans: {100 * median_error:.1f} % (target <= 10 %)  [{_load()}]")
        first_error = statistics.median(abs(r["first_profile_error"]) for r in rows)
        print(f"median |error| predicting every run from the first profile: {100 * first_error:.1f} %")
        calibrated_error = statistics.median(abs(r["calibrated_error"]) for r in rows)
        for prefix, label, _ in GROUPS:
            mine = [abs(r["calibrated_error"]) for r in rows if r["plan"].startswith(prefix)]
            print(f"median |error| with the calibrated cluster, {label}: {100 * statistics.median(mine):.1f} %")
        print(f"median |error| with the calibrated cluster (pipeplan calibrate on each model's probe plan): "
              f"{100 * calibrated_error:.1f} %")
        for key, label in (("timeline_error", "measured vs replayed (the timeline)"),
                           ("op_cost_error", "replayed vs predicted (the op costs)")):
            print(f"median |{label}|: {100 * statistics.median(abs(r[key]) for r in rows):.1f} %")
        atomic_write_text(out / "table.md", markdown_table(rows))
        records += [{"bench": "measured-vs-predicted", **r, **meta} for r in rows]
        records.append({"bench": "measured-vs-predicted-summary", "median_abs_error": median_error,
                        "median_abs_first_profile_error": first_error,
                        "median_abs_calibrated_error": calibrated_error, "profile": args.profile, **meta})
        save()
    if args.only in (None, "torch"):
        records += [{"bench": "ours-vs-torch-1f1b", **r, **meta}
                    for r in ours_vs_torch(gpt(0), cluster, out, args.steps, args.rounds)]
        save()
    if args.only in (None, "schedules"):
        found, refused = schedule_plans(gpt(0), cluster, out, args.plan_time_limit)
        rows = measured_vs_predicted(gpt, cluster, out, args.steps, args.repeats, plan_set=found) if found else []
        for r in rows:
            stages = found[r["plan"]]["stages"]
            r["stages"], r["groups"] = len(stages), len({frozenset(st["devices"]) for st in stages})
        table = schedules_table(rows, refused)
        atomic_write_text(out / "schedules.md", table)
        print(table, end="")
        records += [{"bench": "schedules-measured-vs-predicted", **r, **meta} for r in rows]
        records.append({"bench": "schedules-summary", "refused": refused, **meta,
                        "median_abs_error": median_abs(rows, "error") if rows else None})
        save()


if __name__ == "__main__":
    main()
