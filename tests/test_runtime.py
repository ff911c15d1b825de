"""The runtime: plans train exactly like one process; faults end cleanly; bad plans are refused.

Every multi-process test runs ``pipeplan run`` as a subprocess under a hard timeout
(2 to 4 workers, one torch thread each, a few float64 steps on tiny models).  Refusals,
which must come before any process starts, run the command in this process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.jsonio import dumps
from pipeplan.models.zoo import build_model
from pipeplan.runtime.pieces import piece_seed
from pipeplan.runtime.routing import cut_messages, grad_order, pieces, replica_split
from pipeplan.runtime.stage import Stage as RunStage
from pipeplan.runtime.verify import forward_in_pieces, needs_pieces, plan_pieces, reference_parameters
from pipeplan.solver.formats.plan import Plan, Stage

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = str(ROOT / "examples" / "two-servers.cluster.json")
LIMIT = 240
"""Seconds per run, hard: a guard against a test that hangs, far above what a run takes on a loaded machine."""


# ----------------------------------------------------------------- helpers
def model_graph(name: str) -> LayerGraph:
    """A graph whose layers are the zoo model's units (costs made up, shapes real)."""
    model = build_model(name, device="meta")
    x, _ = model.example_batch(1)
    outs = model.forward(x)
    layers = [Layer(u.name, (1e-4, 1e-5), (2e-4, 2e-5), 4.0 * sum(p.numel() for p in u.module.parameters()),
                    4.0 * outs[i].numel(), 4.0 * outs[i].numel(), u.tied_to)
              for i, u in enumerate(model.units)]
    return LayerGraph(f"{name}-{len(layers)}", layers, model.edges(), float(model.input_bytes_per_sample))


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("graphs")
    paths = {}
    for name in ("gpt-tiny", "unet", "vgg-tiny"):
        path = folder / f"{name}.graph.json"
        path.write_text(dumps(model_graph(name).to_dict()))
        paths[name] = str(path)
    return paths


def write_plan(folder: Path, stages: list[tuple], batch: int, schedule: str = "gpipe", name: str = "plan",
               graph: str = "gpt-tiny-6") -> str:
    """``stages``: ``(lo, hi, devices, microbatches[, recompute[, ops]])``; ``graph``: the graph it names."""
    built = tuple(Stage((lo, hi), tuple(devs), tuple(split), *(rest[:1] or [False]),
                        tuple(rest[1]) if len(rest) > 1 else None)
                  for lo, hi, devs, split, *rest in stages)
    path = folder / f"{name}.plan.json"
    path.write_text(dumps(Plan(graph, "two-servers", batch, 4.0, schedule, built).to_dict()))
    return str(path)


def pipeplan(*argv: str, env: dict | None = None, timeout: float = LIMIT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeplan.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def refused(run_cli, monkeypatch):
    """``pipeplan run ARGV`` in this process, with a fault set for rank 0: a worker that started
    anyway fails with "injected fault" and exit 1, not the refusal's 2."""
    def run(*argv: str) -> tuple[int, str]:
        monkeypatch.setenv("PIPEPLAN_FAULT", "0:0:raise")
        status, _, err = run_cli("run", *argv)
        return status, err

    return run


def run_verify(graph: str, plan: str, model: str, *extra: str) -> dict:
    done = pipeplan("run", graph, CLUSTER, plan, "--model", model, "--steps", "2", "--warmup", "1",
                    "--verify", "--json", "--timeout", "30", *extra)
    assert done.returncode == 0, done.stderr
    assert "warning:" not in done.stderr, done.stderr  # the test plans name their graph and cluster
    summary = json.loads(done.stdout)
    # float64 end to end (the loss too) agrees to rounding: far below the 1e-6 the check allows
    assert summary["verified"] and summary["max_param_diff"] <= 1e-10, summary
    assert summary["measured_iteration_time"] > 0 and summary["predicted_iteration_time"] > 0
    assert math.isclose(summary["ratio"], summary["measured_iteration_time"] / summary["predicted_iteration_time"])
    assert len(summary["peak_memory"]) == summary["processes"]
    return summary


def workers_alive(token: str) -> list[int]:
    """Pids of live processes whose command line mentions ``token``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State"))
            except (OSError, StopIteration):
                continue
            if token in cmdline and "pipeplan.runtime.worker" in cmdline and "zombie" not in state:
                pids.append(int(entry.name))
    return pids


# ----------------------------------------------------------------- routing (pure data)
def test_replica_split_is_balanced_larger_first():
    assert replica_split(7, 3) == [3, 2, 2]
    assert replica_split(2, 3) == [1, 1, 0]
    for n in range(1, 12):
        for r in range(1, 5):
            parts = replica_split(n, r)
            assert sum(parts) == n and max(parts) == -(-n // r)


def test_messages_cover_every_sample_once_in_both_directions():
    plan = Plan("g", "c", 11, 4.0, "1f1b", (
        Stage((0, 1), ("a", "b"), (5, 1, 5)),
        Stage((1, 2), ("c",), (2, 2, 7)),
        Stage((2, 3), ("d", "e", "f"), (4, 4, 3)),
    ))
    ops = plan.stage_actions()
    for cut in range(2):
        msgs = cut_messages(plan, cut, ops)
        for side, key in ((cut, "src"), (cut + 1, "dst")):
            for p in pieces(plan, side):
                mine = sorted((m.start, m.stop) for m in msgs if getattr(m, key) == p.rank
                              and (m.src_mb if key == "src" else m.dst_mb) == p.microbatch)
                covered = [s for a, b in mine for s in range(a, b)]
                assert covered == list(range(p.start, p.stop))
        assert sorted(m.tag for m in grad_order(msgs, ops)) == list(range(len(msgs)))


# ----------------------------------------------------------------- exact training
def test_gpipe_gpt_tied_weights_across_stages(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2, 2, 2]), (3, 6, ["g1"], [2, 2, 2])], 6, "gpipe")
    run_verify(graphs["gpt-tiny"], plan, "gpt-tiny")


def test_relative_paths_from_another_folder(graphs, tmp_path):
    # the workers start in the project's root: the files must still be the caller's
    shutil.copy(graphs["gpt-tiny"], tmp_path / "g.json")
    shutil.copy(CLUSTER, tmp_path / "c.json")
    write_plan(tmp_path, [(0, 3, ["g0"], [2, 2]), (3, 6, ["g1"], [2, 2])], 4, "1f1b", name="p")
    done = subprocess.run([sys.executable, "-m", "pipeplan.cli", "run", "g.json", "c.json", "p.plan.json",
                           "--model", "gpt-tiny", "--steps", "2", "--warmup", "1", "--verify", "--json",
                           "--timeout", "30"], cwd=tmp_path, capture_output=True, text=True, timeout=LIMIT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verified"]


def test_plan_for_another_cluster_runs_with_a_warning(graphs, tmp_path):
    path = Path(write_plan(tmp_path, [(0, 6, ["g0"], [2, 2])], 4, "gpipe"))
    path.write_text(path.read_text().replace('"two-servers"', '"elsewhere"').replace('"gpt-tiny-6"', '"gpt-huge"'))
    done = pipeplan("run", graphs["gpt-tiny"], CLUSTER, str(path), "--model", "gpt-tiny", "--steps", "2",
                    "--warmup", "1", "--json", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert (f"warning: {path}: cluster: plan was made for cluster 'elsewhere', running on 'two-servers'"
            in done.stderr)
    assert f"warning: {path}: graph: plan was made for graph 'gpt-huge', running on 'gpt-tiny-6'" in done.stderr


def test_1f1b_gpt_unequal_per_stage_splits(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 2, ["g0"], [3, 5]), (2, 4, ["g1"], [2, 2, 1, 3]), (4, 6, ["g2"], [2, 2, 2, 2])],
                      8, "1f1b")
    run_verify(graphs["gpt-tiny"], plan, "gpt-tiny")


def test_custom_gpt(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 4, ["g0"], [2, 2, 2], False, ["F0", "F1", "B0", "F2", "B1", "B2"]),
                                 (4, 6, ["g1"], [3, 3], False, ["F0", "B0", "F1", "B1"])], 6, "custom")
    run_verify(graphs["gpt-tiny"], plan, "gpt-tiny")


@pytest.mark.parametrize("transport", ["tcp", "dist"])
def test_replication_with_remainders_and_tied_weights(graphs, tmp_path, transport):
    # Stage 0's replicas split 3 as 2+1 and 1 as 1+0; the tied embedding lives on 3 ranks.
    # Both transports: every other test runs the default (tcp on CPU).
    plan = write_plan(tmp_path, [(0, 3, ["g0", "g1"], [3, 3, 1]), (3, 6, ["g2"], [4, 3])], 7, "1f1b")
    run_verify(graphs["gpt-tiny"], plan, "gpt-tiny", "--transport", transport)


def test_recompute_replication_unequal_gpt_four_processes(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 2, ["g0"], [4, 4], True),
                                 (2, 5, ["g2", "g3"], [3, 2, 3], True),
                                 (5, 6, ["g1"], [1, 7])], 8, "gpipe")
    run_verify(graphs["gpt-tiny"], plan, "gpt-tiny")


def test_uneven_last_stage_split_is_exact_in_float64(graphs, tmp_path):
    # Pieces of 5 and 1 samples: with the loss in float32 their gradient scales differed
    # from one process's by a float32 rounding (1.2e-7 apart).
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [6]), (3, 6, ["g1"], [5, 1])], 6, "gpipe")
    run_verify(graphs["gpt-tiny"], plan, "gpt-tiny")


def test_diverged_training_fails_verify_with_one_error_line(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [3, 3]), (3, 6, ["g1"], [3, 3])], 6, "gpipe")
    done = pipeplan("run", graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny", "--steps", "3", "--warmup", "1",
                    "--verify", "--json", "--timeout", "30", "--lr", "1e10")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["verified"] is False and summary["max_param_diff"] is None
    assert "Traceback" not in done.stderr
    assert "verify: max relative parameter difference not finite (NaN or inf)" in done.stderr


class TestMaxDifference:
    def test_nan_anywhere_is_the_worst(self):
        import torch

        from pipeplan.runtime.verify import max_difference

        want = {"a.w": torch.ones(3), "b.w": torch.ones(3)}
        got = {"a.w": torch.ones(3), "b.w": torch.tensor([1.0, math.nan, 1.0])}
        assert max_difference([(0, got)], want) == (math.inf, "b.w on rank 0")

    def test_relative_and_absolute(self):
        import torch

        from pipeplan.runtime.verify import relative_difference

        assert relative_difference(torch.tensor([2.0, 4.5]), torch.tensor([2.0, 4.0])) == 0.5 / 4.0
        # near zero the difference is absolute: at most ABSOLUTE = 1e-12 passes the 1e-6 check
        assert relative_difference(torch.tensor([0.25]), torch.zeros(1)) == 0.25 / 1e-6
        assert relative_difference(torch.tensor([1e-12]), torch.zeros(1)) == pytest.approx(1e-6)
        assert relative_difference(torch.tensor([math.inf]), torch.ones(1)) == math.inf

    def test_round_off_of_a_zero_gradient_passes(self):
        import torch

        from pipeplan.runtime.verify import TOLERANCE, relative_difference

        # a key bias: exact gradient 0, round-off ~1e-24 (got and want differ by 100 %)
        got, want = torch.tensor([1.9e-24, -3e-25]), torch.tensor([1.0e-24, 2e-25])
        assert relative_difference(got, want) <= TOLERANCE
        # a real difference on such a parameter still fails
        assert relative_difference(torch.tensor([1e-6]), torch.tensor([1e-24])) > TOLERANCE


def test_unet_skips_relayed_through_middle_stage(graphs, tmp_path):
    # enc1 (unit 0) feeds dec1 (unit 6): its output crosses stage 1 untouched.
    plan = write_plan(tmp_path, [(0, 2, ["g0"], [2, 2]), (2, 5, ["g1"], [1, 3]), (5, 8, ["g2"], [2, 2])], 4, "gpipe",
                      graph="unet-8")
    run_verify(graphs["unet"], plan, "unet")


def test_unet_replication_recompute_unequal_1f1b(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2, 1, 1], False),
                                 (3, 8, ["g2", "g3"], [3, 1], True)], 4, "1f1b", graph="unet-8")
    run_verify(graphs["unet"], plan, "unet")


# ----------------------------------------------------------------- BatchNorm and dropout (vgg-tiny)
def test_vgg_tiny_batchnorm_dropout_replication_recompute_unequal_gpipe(graphs, tmp_path):
    # BatchNorm statistics over each replica's part (3 -> 2 + 1; 1 -> 1 + 0: the second replica
    # skips that microbatch), dropout masks recomputed in stage 1
    plan = write_plan(tmp_path, [(0, 3, ["g0", "g1"], [3, 1, 1], True), (3, 6, ["g2"], [1, 2, 2], True)], 5,
                      "gpipe", graph="vgg-tiny-6")
    run_verify(graphs["vgg-tiny"], plan, "vgg-tiny")


def test_vgg_tiny_replicated_dropout_stage_1f1b(graphs, tmp_path):
    # the last microbatch has 1 sample for 2 replicas: one of them skips it
    plan = write_plan(tmp_path, [(0, 4, ["g0"], [2, 2, 1]), (4, 6, ["g2", "g3"], [2, 2, 1], True)], 5, "1f1b",
                      graph="vgg-tiny-6")
    run_verify(graphs["vgg-tiny"], plan, "vgg-tiny")


def _pieces_plan(batch=5, schedule="gpipe") -> Plan:
    return Plan("vgg-tiny-6", "two-servers", batch, 4.0, schedule,
                (Stage((0, 3), ("g0", "g1"), (3, 2)), Stage((3, 6), ("g2",), (1, 2, 2), True)))


class TestPlanPieces:
    def test_replica_parts_in_sample_order(self):
        plan = _pieces_plan()
        assert plan_pieces(plan, 0) == [(0, 0, 0, 2), (0, 1, 2, 3), (1, 0, 3, 4), (1, 1, 4, 5)]
        assert plan_pieces(plan, 1) == [(0, 0, 0, 1), (1, 0, 1, 3), (2, 0, 3, 5)]

    def test_empty_replica_parts_are_left_out(self):
        plan = Plan("g", "c", 3, 4.0, "gpipe", (Stage((0, 1), ("a", "b"), (1, 2)),))
        assert plan_pieces(plan, 0) == [(0, 0, 0, 1), (1, 0, 1, 2), (1, 1, 2, 3)]

    def test_agrees_with_the_ranks_pieces(self):
        plan = _pieces_plan()
        for s in range(2):
            ranks = sorted((p.start, p.stop, p.microbatch, p.replica) for p in pieces(plan, s) if p.size)
            assert ranks == sorted((a, b, k, j) for k, j, a, b in plan_pieces(plan, s))


class TestNeedsPieces:
    @pytest.mark.parametrize(("name", "expected"), [("gpt-tiny", False), ("unet", False), ("vgg-tiny", True),
                                                    ("resnet50", True), ("vgg16", True)])
    def test_batchnorm_or_dropout(self, name, expected):
        assert needs_pieces(build_model(name, device="meta")) is expected


class TestForwardInPieces:
    def test_equals_the_whole_batch_for_sample_independent_layers(self):
        model = build_model("unet", dtype=torch.float64)
        inputs, _ = model.example_batch(5, seed=3)
        plan = Plan("unet-8", "c", 5, 4.0, "gpipe", (Stage((0, 2), ("a", "b"), (3, 2)), Stage((2, 5), ("c",), (1, 4)),
                                                      Stage((5, 8), ("d",), (5,))))
        with torch.no_grad():
            torch.testing.assert_close(forward_in_pieces(model, plan, inputs, 0, 0), model(inputs), rtol=1e-12,
                                       atol=1e-12)

    def test_differs_from_the_whole_batch_with_batchnorm(self):
        # the reason the reference runs pieces: BatchNorm sees other statistics
        model = build_model("vgg-tiny", dtype=torch.float64)
        model.units[4].module[3].p = 0.0  # dropout off: only BatchNorm differs
        inputs, _ = model.example_batch(5, seed=3)
        with torch.no_grad():
            assert not torch.allclose(forward_in_pieces(model, _pieces_plan(), inputs, 0, 0), model(inputs))

    def test_whole_batch_reference_would_differ_for_vgg_tiny(self):
        kw = dict(steps=1, global_batch=5, lr=0.1, seed=0, dtype=torch.float64, seq_len=None)
        whole = reference_parameters("vgg-tiny", **kw)
        pieced = reference_parameters("vgg-tiny", plan=_pieces_plan(), **kw)
        assert max((whole[n] - pieced[n]).abs().max().item() for n in whole) > 1e-6


class TestStageRerun:
    def _stage(self) -> RunStage:
        model = build_model("vgg-tiny", dtype=torch.float64)
        return RunStage(model, 2, 6, True, None, None)

    def test_same_masks_and_untouched_running_statistics(self):
        stage = self._stage()
        x = {-1: torch.randn(3, 8, 16, 16, dtype=torch.float64), 1: torch.randn(3, 16, 8, 8, dtype=torch.float64)}
        seed = piece_seed(0, 1, 1, 0, 0)
        with torch.no_grad():
            first = stage.run(x, seed)[5]
        stats = [b.clone() for m in stage.norms for b in m.buffers()]
        again = stage.rerun({k: v.requires_grad_() if k == 1 else v for k, v in x.items()}, seed)
        torch.testing.assert_close(again[5], first, rtol=0, atol=0)
        assert all(torch.equal(a, b) for a, b in zip(stats, [b for m in stage.norms for b in m.buffers()]))
        again[5].sum().backward()  # the restored buffers must not break the backward
        assert x[1].grad is not None

    def test_another_piece_draws_another_mask(self):
        stage = self._stage()
        x = {1: torch.randn(3, 16, 8, 8, dtype=torch.float64)}
        with torch.no_grad():
            a, b = stage.run(x, piece_seed(0, 1, 1, 0, 0))[5], stage.run(x, piece_seed(0, 1, 1, 1, 0))[5]
        assert not torch.equal(a, b)


def test_trace_gantt_and_emulation(graphs, tmp_path):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2, 2]), (3, 6, ["g2"], [2, 2])], 4, "1f1b")
    trace, gantt = tmp_path / "run.trace.json", tmp_path / "run.png"
    done = pipeplan("run", graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny", "--steps", "3",
                    "--warmup", "1", "--emulate", "--json", "--trace", str(trace), "--gantt", str(gantt),
                    "--side-by-side")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["emulate"] and "max_param_diff" not in summary
    kinds = {e.get("cat") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"forward", "backward", "send", "receive"} <= kinds
    assert gantt.read_bytes()[:4] == b"\x89PNG"
    # g2 runs at 0.45x: its compute is stretched, so the iteration is slower than the graph's costs alone.
    assert summary["measured_iteration_time"] > 0.5 * summary["predicted_iteration_time"]


# ----------------------------------------------------------------- faults
@pytest.mark.parametrize("kind, expect", [("kill", "killed by signal SIGKILL"), ("hang", "no progress"),
                                          ("raise", "injected fault"), ("wait-forever", "waiting for peers"),
                                          ("freeze", "waiting for peers")])
def test_worker_fault_ends_run_and_leaves_no_process(graphs, tmp_path, kind, expect):
    # A 5 s --timeout is for training only: setting up (imports, model, rendezvous), which a busy
    # machine stretches, has its own allowance, so the fault at step 2 is what ends the run.
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2, 2]), (3, 6, ["g1"], [2, 2])], 4, "1f1b")
    done = pipeplan("run", graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny", "--steps", "4",
                    "--timeout", "5", env={"PIPEPLAN_FAULT": f"1:2:{kind}"})
    assert done.returncode == 1
    assert "error:" in done.stderr and "rank 1 (stage 1 replica 0, device g1)" in done.stderr, done.stderr
    assert expect in done.stderr
    assert workers_alive(str(tmp_path)) == []


# ----------------------------------------------------------------- refusals
def test_plan_for_another_model_is_refused(graphs, tmp_path, refused):
    plan = write_plan(tmp_path, [(0, 4, ["g0"], [2]), (4, 8, ["g1"], [2])], 2)
    status, err = refused(graphs["unet"], CLUSTER, plan, "--model", "gpt-tiny")
    assert status == 2
    assert err.startswith("error: ") and "units" in err


def test_renamed_layer_is_refused(graphs, tmp_path, refused):
    data = json.loads(Path(graphs["gpt-tiny"]).read_text())
    data["layers"][2]["name"] = "block.9"
    graph = tmp_path / "renamed.graph.json"
    graph.write_text(json.dumps(data))
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2]), (3, 6, ["g1"], [2])], 2)
    status, err = refused(str(graph), CLUSTER, plan, "--model", "gpt-tiny")
    assert status == 2 and "layers[2].name" in err and "block.1" in err


def test_plan_with_unknown_device_is_refused(graphs, tmp_path, refused):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2]), (3, 6, ["gpu9"], [2])], 2)
    status, err = refused(graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny")
    assert status == 2 and "unknown device 'gpu9'" in err


def test_tensor_parallel_plan_is_refused(graphs, tmp_path, refused):
    plan = json.loads(Path(write_plan(tmp_path, [(0, 3, ["g0", "g1"], [2]), (3, 6, ["g2"], [2])], 2)).read_text())
    plan["format"], plan["stages"][0]["tensor_parallel"] = "pipeplan.plan/3", 2
    path = tmp_path / "tp.plan.json"
    path.write_text(json.dumps(plan))
    status, err = refused(graphs["gpt-tiny"], CLUSTER, str(path), "--model", "gpt-tiny")
    assert status == 2 and "stage 0 has tensor_parallel 2, but pipeplan run takes only" in err


def test_bad_spin_is_refused_before_any_process(graphs, tmp_path, refused):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2]), (3, 6, ["g1"], [2])], 2)
    status, err = refused(graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny", "--spin", "-1")
    assert status == 2 and err.startswith("error: -: --spin: must be 'auto' or seconds >= 0")
    assert workers_alive(str(tmp_path)) == []


@pytest.mark.parametrize("option, value, message", [
    ("--timeout", "0", "--timeout: must be positive seconds, got 0.0"),
    ("--timeout", "nan", "--timeout: must be positive seconds, got nan"),
    ("--warmup", "3", "--warmup: must be 0 to steps-1 = 2 (at least one step is measured), got 3"),
    ("--warmup", "-1", "--warmup: must be 0 to steps-1 = 2"),
    ("--seed", str(2 ** 63), "--seed: must be 0 to 2**63-1"),
    ("--steps", "0", "--steps: must be at least 1, got 0"),
    ("--lr", "-1", "--lr: must be a finite learning rate >= 0, got -1.0"),
    ("--lr", "nan", "--lr: must be a finite learning rate >= 0, got nan"),
    ("--lr", "inf", "--lr: must be a finite learning rate >= 0, got inf"),
])
def test_bad_run_option_is_refused_before_any_process(graphs, tmp_path, refused, option, value, message):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2]), (3, 6, ["g1"], [2])], 2)
    status, err = refused(graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny", "--steps", "3", option, value)
    assert status == 2, err
    assert err.startswith("error: -: " + message) and err.count("\n") == 1


def test_emulation_that_would_outlast_the_timeout_is_refused_before_any_process(graphs, tmp_path, refused):
    # g1 at 1e-300 of this machine's speed: its ops would take about 1e296 s (and overflow the clock)
    cluster = json.loads(Path(CLUSTER).read_text())
    cluster["devices"][1]["speed"] = 1e-300
    slow = tmp_path / "slow.cluster.json"
    slow.write_text(json.dumps(cluster))
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2]), (3, 6, ["g1"], [2])], 2)
    status, err = refused(graphs["gpt-tiny"], str(slow), plan, "--model", "gpt-tiny", "--steps", "1", "--emulate")
    assert status == 2, err
    assert err.startswith(f"error: {plan}: --emulate: an emulated op would last ")
    assert "longer than --timeout 50 s" in err and err.count("\n") == 1


class TestRunConfig:
    @staticmethod
    def config(**kw):
        from pipeplan.models.model_options import ModelRequest
        from pipeplan.runtime.options import RunConfig

        return RunConfig("g.json", "c.json", "p.json", ModelRequest("gpt-tiny"), **kw)

    @pytest.mark.parametrize("steps, warmup", [(1, 0), (2, 1), (3, 2), (6, 2)])
    def test_default_warmup_leaves_at_least_one_step(self, steps, warmup):
        assert self.config(steps=steps).checked().warmup == warmup

    def test_given_warmup_is_kept(self):
        assert self.config(steps=4, warmup=3).checked().warmup == 3

    @pytest.mark.parametrize("kw", [{"timeout": float("inf")}, {"timeout": -5.0}, {"seed": -1}, {"spin": "x"},
                                    {"steps": 2, "warmup": 2}, {"transport": "pigeon"}])
    def test_refuses(self, kw):
        from pipeplan.models.errors import InputError

        with pytest.raises(InputError):
            self.config(**kw).checked()

    def test_the_workers_read_back_what_the_launcher_writes(self, tmp_path):
        import argparse

        from pipeplan.runtime.options import RunConfig, add_arguments

        config = self.config(steps=3, verify=True, lr=0.1, seed=7, transport="tcp", spin="0.001").checked()
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        again = RunConfig.from_args(parser.parse_args(config.worker_argv(tmp_path / "r.json")))
        expected = {**config.__dict__, "graph": os.path.abspath("g.json"), "cluster": os.path.abspath("c.json"),
                    "plan": os.path.abspath("p.json"), "result": str(tmp_path / "r.json")}
        assert again.__dict__ == expected


class TestHangKey:
    """Whom the launcher blames when nothing moves (pure data: beats and one real pid)."""

    @staticmethod
    def blamed(beats: dict, stopped: set = frozenset()) -> int:
        from pipeplan.runtime import launch

        real = launch._stopped
        launch._stopped = lambda pid: pid in stopped
        try:
            return min(beats, key=lambda r: launch._hang_key(r, beats[r], 0.0))
        finally:
            launch._stopped = real

    def test_a_working_rank_before_waiting_ones(self):
        from pipeplan.runtime.heartbeat import Beat

        beats = {0: Beat(1.0, 3, 2, True, 1.0), 1: Beat(2.0, 3, 0, False, 2.0)}
        assert self.blamed(beats) == 1

    def test_among_waiting_ranks_the_one_whose_waits_stopped_living(self):
        from pipeplan.runtime.heartbeat import Beat

        # rank 0 began waiting first but kept polling (alive 9.0); rank 1 froze in its wait at 2.0
        beats = {0: Beat(1.0, 3, 2, True, 9.0), 1: Beat(2.0, 3, 0, True, 2.0)}
        assert self.blamed(beats) == 1

    def test_a_stopped_process_first(self):
        from pipeplan.runtime.heartbeat import Beat

        beats = {0: Beat(1.0, 3, 2, False, 1.0), 1: Beat(2.0, 3, 0, True, 9.0)}
        assert self.blamed(beats, stopped={1}) == 1

    def test_this_process_is_not_stopped(self):
        from pipeplan.runtime.launch import _stopped

        assert not _stopped(os.getpid())


def test_sigterm_stops_workers_and_removes_the_run_folder(graphs, tmp_path):
    import signal

    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2, 2]), (3, 6, ["g1"], [2, 2])], 4, "1f1b")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pipeplan.cli", "run", graphs["gpt-tiny"], CLUSTER, plan,
                             "--model", "gpt-tiny", "--steps", "1000000"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(scratch)})
    try:
        deadline = time.monotonic() + LIMIT
        while len(workers_alive(str(tmp_path))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert list(scratch.glob("pipeplan-run-*")), "the run folder should exist while the run goes"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip() == "error: -: interrupted: terminated (SIGTERM)"
    assert list(scratch.glob("pipeplan-run-*")) == []
    deadline = time.monotonic() + 10
    while workers_alive(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers_alive(str(tmp_path)) == []


def test_deadlocking_custom_plan_is_refused(graphs, tmp_path, refused):
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [1, 1], False, ["F0", "B0", "F1", "B1"]),
                                 (3, 6, ["g1"], [1, 1], False, ["F0", "F1", "B1", "B0"])], 2, "custom")
    status, err = refused(graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny")
    assert status == 2 and "deadlock" in err
