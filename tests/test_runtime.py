"""The runtime: plans train exactly like one process; faults end cleanly; bad plans are refused.

The runs that train to completion share one launch (:func:`helpers.shared_launch`): 4
processes start Python and torch once and run, one after another, exactly the workers'
command line ``pipeplan run`` launches for each run (2 to 4 ranks, one torch thread each,
a few float64 steps on tiny models).  Each test then runs ``pipeplan run`` in this
process with the launch replaced by its run's result, after checking that the launch ran
the workers' command line of that very invocation: so the options are checked, the
plan is loaded and validated, and the summary, trace, chart, warnings and verdict come
out as from the command.  Version-2 plans (several stages per process, split backwards,
local hand-overs) train gpt-tiny on 4 processes under every named multi-stage schedule
and one custom program; their named schedules' programs are
:func:`pipeplan.solver.schedules.schedule.group_programs`' (equal to torch's, tested there).

Faults, a relative-path run and SIGTERM need launches of their own: they run
``pipeplan run`` in this process (faults, relative paths) or as a subprocess (SIGTERM),
each under a hard timeout.  Refusals, which must come before any process starts, run the
command in this process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import RUN_CLUSTER as CLUSTER, RUN_LIMIT as LIMIT, model_graph, run_shared, shared_launch, write_plan
from pipeplan.models.jsonio import dumps
from pipeplan.runtime.calibrate import run_factors
from pipeplan.runtime.gradsync import group_members, links
from pipeplan.runtime.pieces import piece_seed
from pipeplan.runtime.replay import program_durations
from pipeplan.runtime.routing import cut_messages, device_ranks, grad_order, pieces, rank_of, replica_split, stage_ranks
from pipeplan.runtime.stage import Stage as RunStage
from pipeplan.runtime.verify import forward_in_pieces, needs_pieces, plan_pieces, reference_parameters
from pipeplan.models.zoo import build_model
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import Action, format_action, group_programs, num_stages, stage_group

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("graphs")
    paths = {}
    for name in ("gpt-tiny", "unet", "vgg-tiny"):
        path = folder / f"{name}.graph.json"
        path.write_text(dumps(model_graph(name).to_dict()))
        paths[name] = str(path)
    return paths


@pytest.fixture
def refused(run_cli, monkeypatch):
    """``pipeplan run ARGV`` in this process, with a fault set for rank 0: a worker that started
    anyway fails with "injected fault" and exit 1, not the refusal's 2."""
    def run(*argv: str) -> tuple[int, str]:
        monkeypatch.setenv("PIPEPLAN_FAULT", "0:0:raise")
        status, _, err = run_cli("run", *argv)
        return status, err

    return run


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


def check_verified(summary: dict) -> dict:
    """``pipeplan run --verify --json``'s summary of an exact run."""
    # float64 end to end (the loss too) agrees to rounding: far below the 1e-6 the check allows
    assert summary["verified"] and summary["max_param_diff"] <= 1e-10, summary
    assert summary["measured_iteration_time"] > 0 and summary["predicted_iteration_time"] > 0
    assert math.isclose(summary["ratio"], summary["measured_iteration_time"] / summary["predicted_iteration_time"])
    assert len(summary["peak_memory"]) == summary["processes"]
    return summary


# ----------------------------------------------------------------- version-2 plans (several stages per process)
CUTS = ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6))


def _stages(cuts, devices, splits, recompute=()) -> list[dict]:
    return [{"layers": list(layers), "devices": list(devs), "microbatches": list(split), "recompute": s in recompute}
            for s, (layers, devs, split) in enumerate(zip(cuts, devices, splits))]


def named_case(schedule: str, groups: list[tuple[str, ...]], virtual: int, split: tuple[int, ...],
               cuts, recompute=()) -> dict:
    """A plan of ``schedule`` on ``groups`` (one microbatches list for all stages) and torch's programs."""
    num = num_stages(schedule, len(groups), virtual)
    devices = [groups[stage_group(schedule, s, len(groups))] for s in range(num)]
    programs = group_programs(schedule, len(groups), len(split), virtual)
    return {"name": schedule, "schedule": schedule, "global_batch": sum(split),
            "stages": _stages(cuts, devices, [split] * num, recompute),
            "programs": [[format_action(a) for a in program] for program in programs]}


def custom_case() -> dict:
    """Four stages on three groups; stages 1 and 2 share a replicated group but split the batch differently.

    So some of their messages stay inside a process and others go to the other
    replica of the same group; stages 1 and 2 split their backwards (one recomputing).
    """
    groups = [("g0",), ("g1", "g2"), ("g1", "g2"), ("g3",)]
    splits = [(4, 4), (3, 5), (4, 4), (8,)]
    programs = [["0F0", "0F1", "0B0", "0B1"],
                ["1F0", "1F1", "2F0", "2F1", "2I0", "1I0", "2I1", "2W0", "1I1", "1W0", "2W1", "1W1"],
                ["3F0", "3B0"]]
    return {"name": "custom", "schedule": "custom", "global_batch": 8,
            "stages": _stages(((0, 1), (1, 3), (3, 5), (5, 6)), groups, splits, recompute=(2,)),
            "programs": programs}


def cases() -> list[dict]:
    """Every named multi-stage schedule and the custom program, on 4 processes, unequal microbatches."""
    return [
        # 3 groups (one of 2 replicas) x 2 stages each; a recomputing stage on the replicated group
        named_case("interleaved-1f1b", [("g0", "g1"), ("g2",), ("g3",)], 2, (2, 1, 2, 1, 2, 1), CUTS, recompute=(3,)),
        named_case("interleaved-zb", [("g0", "g1"), ("g2", "g3")], 2, (2, 1, 2, 1),
                   ((0, 2), (2, 3), (3, 5), (5, 6)), recompute=(1,)),
        named_case("looped-bfs", [("g0",), ("g1", "g2", "g3")], 3, (3, 2, 2), CUTS),
        # the tied embedding (stage 0) and head (stage 3) on one replicated group
        named_case("zbv", [("g0", "g1"), ("g2", "g3")], 2, (3, 1, 2, 2), ((0, 2), (2, 3), (3, 5), (5, 6)),
                   recompute=(2,)),
        custom_case(),
    ]


V2_SCHEDULES = ["interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv", "custom"]


def case_plan(case: dict) -> Plan:
    """The case as a ``pipeplan.plan/2`` plan (a custom one carries its programs)."""
    stages = tuple(Stage(tuple(st["layers"]), tuple(st["devices"]), tuple(st["microbatches"]), st["recompute"])
                   for st in case["stages"])
    custom = tuple(tuple(program) for program in case["programs"]) if case["schedule"] == "custom" else None
    return Plan("gpt-tiny-6", "two-servers", case["global_batch"], 4.0, case["schedule"], stages,
                custom_programs=custom)


# ----------------------------------------------------------------- the shared launch
VERIFY = ("--steps", "2", "--warmup", "1", "--verify", "--timeout", "30")
"""The options of the exact runs: two float64 steps, checked against one-process training."""


def shared_runs(graphs: dict[str, str], folder: Path) -> dict[str, list[str]]:
    """``pipeplan run``'s arguments of every run of the shared launch, by name (writes their plans)."""
    names = {"gpt-tiny": "gpt-tiny-6", "unet": "unet-8", "vgg-tiny": "vgg-tiny-6"}  # the graphs' names

    def run(name, model, stages, batch, schedule, *options):
        plan = write_plan(folder, stages, batch, schedule, name=name, graph=names[model])
        return [graphs[model], CLUSTER, plan, "--model", model, *(options or VERIFY)]

    runs = {
        "gpipe_tied": run("gpipe_tied", "gpt-tiny", [(0, 3, ["g0"], [2, 2, 2]), (3, 6, ["g1"], [2, 2, 2])], 6,
                          "gpipe"),
        "1f1b_unequal": run("1f1b_unequal", "gpt-tiny", [(0, 2, ["g0"], [3, 5]), (2, 4, ["g1"], [2, 2, 1, 3]),
                                                             (4, 6, ["g2"], [2, 2, 2, 2])], 8, "1f1b"),
        "custom_v1": run("custom_v1", "gpt-tiny",
                         [(0, 4, ["g0"], [2, 2, 2], False, ["F0", "F1", "B0", "F2", "B1", "B2"]),
                          (4, 6, ["g1"], [3, 3], False, ["F0", "B0", "F1", "B1"])], 6, "custom"),
        "recompute_replication": run("recompute_replication", "gpt-tiny",
                                     [(0, 2, ["g0"], [4, 4], True), (2, 5, ["g2", "g3"], [3, 2, 3], True),
                                      (5, 6, ["g1"], [1, 7])], 8, "gpipe"),
        "uneven_last": run("uneven_last", "gpt-tiny", [(0, 3, ["g0"], [6]), (3, 6, ["g1"], [5, 1])], 6, "gpipe"),
        "diverged": run("diverged", "gpt-tiny", [(0, 3, ["g0"], [3, 3]), (3, 6, ["g1"], [3, 3])], 6, "gpipe",
                        "--steps", "3", "--warmup", "1", "--verify", "--timeout", "30", "--lr", "1e10"),
        "unet_skips": run("unet_skips", "unet", [(0, 2, ["g0"], [2, 2]), (2, 5, ["g1"], [1, 3]),
                                                       (5, 8, ["g2"], [2, 2])], 4, "gpipe"),
        "unet_replication": run("unet_replication", "unet", [(0, 3, ["g0"], [2, 1, 1], False),
                                                                   (3, 8, ["g2", "g3"], [3, 1], True)], 4, "1f1b"),
        "vgg_gpipe": run("vgg_gpipe", "vgg-tiny", [(0, 3, ["g0", "g1"], [3, 1, 1], True),
                                                        (3, 6, ["g2"], [1, 2, 2], True)], 5, "gpipe"),
        "vgg_1f1b": run("vgg_1f1b", "vgg-tiny", [(0, 4, ["g0"], [2, 2, 1]), (4, 6, ["g2", "g3"], [2, 2, 1], True)],
                        5, "1f1b"),
        "emulated": run("emulated", "gpt-tiny", [(0, 3, ["g0"], [2, 2]), (3, 6, ["g2"], [2, 2])], 4, "1f1b",
                        "--steps", "3", "--warmup", "1", "--emulate"),
    }
    for transport in ("tcp", "dist"):
        # Stage 0's replicas split 3 as 2+1 and 1 as 1+0; the tied embedding lives on 3 ranks.
        runs[f"replication_{transport}"] = run(
            f"replication_{transport}", "gpt-tiny", [(0, 3, ["g0", "g1"], [3, 3, 1]), (3, 6, ["g2"], [4, 3])], 7,
            "1f1b", *VERIFY, "--transport", transport)
    elsewhere = Path(run("elsewhere", "gpt-tiny", [(0, 6, ["g0"], [2, 2])], 4, "gpipe")[2])
    elsewhere.write_text(elsewhere.read_text().replace('"two-servers"', '"elsewhere"')
                         .replace('"gpt-tiny-6"', '"gpt-huge"'))
    runs["elsewhere"] = [graphs["gpt-tiny"], CLUSTER, str(elsewhere), "--model", "gpt-tiny", "--steps", "2", "--warmup", "1",
                         "--timeout", "30"]
    for case in cases():
        plan = folder / f"v2-{case['name']}.plan.json"
        plan.write_text(dumps(case_plan(case).to_dict()))
        runs[f"v2-{case['name']}"] = [graphs["gpt-tiny"], CLUSTER, str(plan), "--model", "gpt-tiny", *VERIFY]
    for name, (model, plan_dict) in TP_PLANS.items():
        if model == "llama" and not has_transformers():
            continue
        plan = folder / f"{name}.plan.json"
        plan.write_text(dumps(plan_dict))
        graph = graphs["gpt-tiny"] if model == "gpt-tiny" else llama_graph(folder)
        runs[name] = [graph, CLUSTER, str(plan), "--model", *(LLAMA if model == "llama" else [model]), *VERIFY]
    capped = folder / "capped.plan.json"
    capped.write_text(dumps(capped_plan(CAPPED_FRACTION).plan.to_dict()))
    # float32, as the graph was profiled: the meter's bytes are then the profile's
    runs["capped"] = [str(CAPPED_GRAPH), str(CAPPED_CLUSTER), str(capped), "--model", "gpt-tiny", "--steps", "2",
                      "--warmup", "1", "--timeout", "30"]
    return runs


CAPPED_GRAPH, CAPPED_CLUSTER = ROOT / "examples" / "gpt-tiny.graph.json", ROOT / "examples" / "cpu-pair.cluster.json"
CAPPED_FRACTION = 1.9e-4
"""``--memory-fraction`` of the capped run: 760 kB of cpu-pair's 4 GB per device, between the memory-minimal
programs' peaks (597 kB) and the unconstrained synthesized programs' (985 kB) on ``examples/interleaved.plan.json``."""


def capped_plan(fraction: float):
    """``pipeplan synthesize`` of ``examples/interleaved.plan.json`` (gpt-tiny's profile, cpu-pair) under ``fraction``."""
    from pipeplan.models.graph import load_graph
    from pipeplan.solver.core.schedule_synthesis import synthesize_plan
    from pipeplan.solver.formats.plan import load_plan

    graph, cluster = load_graph(str(CAPPED_GRAPH)), load_cluster(str(CAPPED_CLUSTER))
    plan = load_plan(str(ROOT / "examples" / "interleaved.plan.json"), graph, cluster)
    return synthesize_plan(plan, graph, cluster, memory_fraction=fraction)


# ----------------------------------------------------------------- version-3 plans (tensor parallelism, ZeRO)
LLAMA = ["hf:llama", *[x for pair in ("num_hidden_layers=2", "hidden_size=16", "num_attention_heads=4",
                                      "num_key_value_heads=2", "head_dim=4", "intermediate_size=32", "vocab_size=48")
                       for x in ("--model-arg", pair)], "--input-shape", "8", "--input-dtype", "int64",
         "--input-high", "48"]
"""A Llama from a small configuration (transformers' LlamaForCausalLM): 4 query and 2 key/value heads, units
``model.embed_tokens``, ``model.rotary_emb``, two decoder layers, ``model.norm`` and ``lm_head``."""


def _v3(graph: str, batch: int, schedule: str, stages: list[tuple], zero: int = 0) -> dict:
    """A ``pipeplan.plan/3`` on the two-servers cluster; ``stages``: ``(lo, hi, devices, t, split[, recompute])``."""
    return {"format": "pipeplan.plan/3", "graph": graph, "cluster": "two-servers", "global_batch": batch,
            "state_factor": 4, "schedule": schedule, "zero": zero,
            "stages": [{"layers": [lo, hi], "devices": devs, "tensor_parallel": t, "microbatches": split,
                        "recompute": bool(rest and rest[0])} for lo, hi, devs, t, split, *rest in stages]}


TP_PLANS = {
    # TP 2 (one replica on s0) then 2 data-parallel replicas under ZeRO-2; the tied embedding and head
    # on 2 + 2 ranks (each tensor-parallel rank adds half its gradient)
    "tp_then_dp_zero2": ("gpt-tiny", _v3("gpt-tiny-6", 6, "gpipe", [(0, 3, ["g0", "g1"], 2, [3, 3]),
                                                                     (3, 6, ["g2", "g3"], 1, [3, 3])], zero=2)),
    # one group of 2 replicas x TP 2 on s1 holding two stages (the tied embedding and head on each rank), ZeRO-1:
    # two rings (one per tensor-parallel rank); split backwards (I and W apart), the second stage recomputing;
    # microbatches of 3 split 2 + 1 between the replicas
    "tp_x_dp_zero1": ("gpt-tiny", _v3("gpt-tiny-6", 6, "interleaved-zb",
                                      [(0, 3, ["g2", "g3", "g4", "g5"], 2, [3, 3]),
                                       (3, 6, ["g2", "g3", "g4", "g5"], 2, [3, 3], True)], zero=1)),
    # Hugging Face Llama: q/k/v, o, gate/up and down projections split by torch's own styles; two stages
    # on one pair of processes (the second recomputing), so that only 2 processes load transformers
    "tp_llama": ("llama", _v3("llama-6", 6, "interleaved-1f1b", [(0, 3, ["g0", "g1"], 2, [2, 2, 2]),
                                                                  (3, 6, ["g0", "g1"], 2, [2, 2, 2], True)])),
}
"""The version-3 plans of the shared launch: ``name -> (model, plan)``."""


def llama_graph(folder: Path) -> str:
    """:data:`LLAMA`'s graph, profiled analytically (once per folder); its path."""
    import contextlib
    import io

    from pipeplan.cli import main

    path = folder / "llama.graph.json"
    if not path.exists():
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status = main(["profile", *LLAMA, "--analytic", "-o", str(path)])
        assert status == 0, err.getvalue()
    return str(path)


def has_transformers() -> bool:
    """Whether the ``hf`` extra is installed (the Llama run needs it)."""
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def launched(graphs, tmp_path_factory) -> dict[str, dict]:
    """Every shared run, launched once (:func:`helpers.shared_launch`)."""
    folder = tmp_path_factory.mktemp("shared")
    return shared_launch(shared_runs(graphs, folder), folder)


@pytest.fixture
def shared_run(launched, run_cli, monkeypatch):
    """``shared_run(name, *more)``: ``pipeplan run`` in this process on that run of the shared launch
    (:func:`helpers.run_shared`), ``(status, stdout, stderr)``."""
    return lambda name, *more: run_shared(launched[name], run_cli, monkeypatch, *more)


def _cli_argv(entry: dict) -> list[str]:
    """``pipeplan run``'s arguments back from the workers' command line (less ``--result``)."""
    argv = list(entry["argv"])
    at = argv.index("--result")
    return argv[:at] + argv[at + 2:]


def verified(shared_run, name: str) -> dict:
    status, out, err = shared_run(name, "--json")
    assert status == 0, err
    assert "warning:" not in err, err  # the test plans name their graph and cluster
    return check_verified(json.loads(out))


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
def test_gpipe_gpt_tied_weights_across_stages(shared_run):
    verified(shared_run, "gpipe_tied")


def test_relative_paths_from_another_folder(graphs, tmp_path, run_cli, monkeypatch):
    # the workers start in the project's root: the files must still be the caller's (a launch of its own)
    shutil.copy(graphs["gpt-tiny"], tmp_path / "g.json")
    shutil.copy(CLUSTER, tmp_path / "c.json")
    write_plan(tmp_path, [(0, 3, ["g0"], [2, 2]), (3, 6, ["g1"], [2, 2])], 4, "1f1b", name="p")
    monkeypatch.chdir(tmp_path)
    status, out, err = run_cli("run", "g.json", "c.json", "p.plan.json", "--model", "gpt-tiny", "--steps", "2",
                               "--warmup", "1", "--verify", "--json", "--timeout", "30")
    assert status == 0, err
    check_verified(json.loads(out))


def test_plan_for_another_cluster_runs_with_a_warning(shared_run, launched):
    path = _cli_argv(launched["elsewhere"])[2]
    status, _, err = shared_run("elsewhere", "--json")
    assert status == 0, err
    assert (f"warning: {path}: cluster: plan was made for cluster 'elsewhere', running on 'two-servers'"
            in err)
    assert f"warning: {path}: graph: plan was made for graph 'gpt-huge', running on 'gpt-tiny-6'" in err


def test_1f1b_gpt_unequal_per_stage_splits(shared_run):
    verified(shared_run, "1f1b_unequal")


def test_custom_gpt(shared_run):
    verified(shared_run, "custom_v1")


@pytest.mark.parametrize("transport", ["tcp", "dist"])
def test_replication_with_remainders_and_tied_weights(shared_run, launched, transport):
    # Stage 0's replicas split 3 as 2+1 and 1 as 1+0; the tied embedding lives on 3 ranks.
    # Both transports: every other run takes the default (tcp on CPU).
    verified(shared_run, f"replication_{transport}")
    assert launched[f"replication_{transport}"]["result"]["transport"] == transport


def test_recompute_replication_unequal_gpt_four_processes(shared_run):
    verified(shared_run, "recompute_replication")


def test_uneven_last_stage_split_is_exact_in_float64(shared_run):
    # Pieces of 5 and 1 samples: with the loss in float32 their gradient scales differed
    # from one process's by a float32 rounding (1.2e-7 apart).
    verified(shared_run, "uneven_last")


def test_diverged_training_fails_verify_with_one_error_line(shared_run):
    status, out, err = shared_run("diverged", "--json")  # --lr 1e10
    assert status == 1, err
    summary = json.loads(out)
    assert summary["verified"] is False and summary["max_param_diff"] is None
    assert "Traceback" not in err
    assert "verify: max relative parameter difference not finite (NaN or inf)" in err and err.count("\n") == 1


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


def test_unet_skips_relayed_through_middle_stage(shared_run):
    # enc1 (unit 0) feeds dec1 (unit 6): its output crosses stage 1 untouched.
    verified(shared_run, "unet_skips")


def test_unet_replication_recompute_unequal_1f1b(shared_run):
    verified(shared_run, "unet_replication")


# ----------------------------------------------------------------- BatchNorm and dropout (vgg-tiny)
def test_vgg_tiny_batchnorm_dropout_replication_recompute_unequal_gpipe(shared_run):
    # BatchNorm statistics over each replica's part (3 -> 2 + 1; 1 -> 1 + 0: the second replica
    # skips that microbatch), dropout masks recomputed in stage 1
    verified(shared_run, "vgg_gpipe")


def test_vgg_tiny_replicated_dropout_stage_1f1b(shared_run):
    # the last microbatch has 1 sample for 2 replicas: one of them skips it
    verified(shared_run, "vgg_1f1b")


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


def test_trace_gantt_and_emulation(shared_run, tmp_path):
    trace, gantt = tmp_path / "run.trace.json", tmp_path / "run.png"
    status, out, err = shared_run("emulated", "--json", "--trace", str(trace), "--gantt", str(gantt), "--side-by-side")
    assert status == 0, err
    summary = json.loads(out)
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
def test_worker_fault_ends_run_and_leaves_no_process(graphs, tmp_path, run_cli, monkeypatch, kind, expect):
    # A 5 s --timeout is for training only: setting up (imports, model, rendezvous), which a busy
    # machine stretches, has its own allowance, so the fault at step 2 is what ends the run.
    # pipeplan run runs in this process: its launcher and workers are the real ones.
    plan = write_plan(tmp_path, [(0, 3, ["g0"], [2, 2]), (3, 6, ["g1"], [2, 2])], 4, "1f1b")
    monkeypatch.setenv("PIPEPLAN_FAULT", f"1:2:{kind}")
    status, _, err = run_cli("run", graphs["gpt-tiny"], CLUSTER, plan, "--model", "gpt-tiny", "--steps", "4",
                             "--timeout", "5")
    assert status == 1
    assert "error:" in err and "rank 1 (stage 1 replica 0, device g1)" in err, err
    assert expect in err
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


# ----------------------------------------------------------------- version-2 plans
@pytest.mark.parametrize("name", V2_SCHEDULES)
def test_verify_equals_one_process_training(shared_run, name):
    verified(shared_run, f"v2-{name}")


def test_each_rank_ran_its_groups_program_with_split_backwards(launched):
    case = cases()[3]  # zbv: rank 0 and 1 hold stages 0 and 3, ranks 2 and 3 stages 1 and 2
    zbv = launched["v2-zbv"]["result"]
    assert [(r["rank"], r["group"], r["stages"]) for r in zbv["ranks"]] == \
        [(0, 0, [0, 3]), (1, 0, [0, 3]), (2, 1, [1, 2]), (3, 1, [1, 2])]
    compute = [label for kind, label, *_ in zbv["ranks"][0]["steps"][1]["events"]
               if kind in ("forward", "backward", "recompute")]
    # rank 0 is the larger replica of every microbatch: it runs every action, in the program's order
    assert compute == [a[:1] + ":" + a[1:] for a in case["programs"][0]]


def test_custom_recompute_before_its_input_gradient(launched):
    rank1 = launched["v2-custom"]["result"]["ranks"][1]
    compute = [label for kind, label, *_ in rank1["steps"][1]["events"] if kind in ("forward", "backward", "recompute")]
    assert compute.index("2:R0") == compute.index("2:I0") - 1
    assert compute.index("2:W0") > compute.index("2:I1")


def test_the_cases_are_valid_version_2_plans():
    graph = model_graph("gpt-tiny")
    assert [case["name"] for case in cases()] == V2_SCHEDULES
    for case in cases():
        plan = case_plan(case)
        plan.validate(graph, load_cluster(CLUSTER), case["name"])
        assert plan.format == "pipeplan.plan/2" and plan.programs() == case["programs"]


def test_run_verify_on_a_zbv_plan_file(shared_run, tmp_path):
    charts = [str(tmp_path / "run.png"), str(tmp_path / "run.trace.json")]
    status, out, err = shared_run("v2-zbv", "--json", "--gantt", charts[0], "--side-by-side", "--trace", charts[1])
    assert status == 0, err
    summary = check_verified(json.loads(out))
    assert summary["processes"] == 4 and summary["devices"] == ["g0", "g1", "g2", "g3"]
    # one predicted peak per group, the same on both replicas of a group
    peaks = summary["predicted_peak_memory"]
    assert peaks[0] == peaks[1] and peaks[2] == peaks[3] and peaks[0] != peaks[2]
    assert summary["replayed_iteration_time"] > 0 and len(summary["losses"]) == 2
    assert all(Path(chart).stat().st_size > 0 for chart in charts)
    names = {e["args"]["name"] for e in json.loads(Path(charts[1]).read_text())["traceEvents"] if e["ph"] == "M"
             and e["name"] == "process_name"}
    assert len(names) == 4


def test_a_synthesized_plan_keeps_its_memory_cap_in_the_measured_peaks(shared_run):
    """A custom plan synthesized under ``--memory-fraction``: each rank's measured peak stays within the cap, and
    the stash part of it is the simulator's group peak less the state, to within the CPU meter.

    The CPU meter (``pipeplan.runtime.memory``) counts tensor bytes: parameters and gradients,
    the tensors autograd saves and the stashed stage inputs.  The run trains with plain SGD,
    so it holds 2 copies of the parameters where the plan's ``state_factor`` of 4 counts
    Adam's two moments too: the state parts are compared as 2 and 4 copies.  What the
    meter does not count (allocator overhead and caching, the loss's own buffers,
    transfer buffers, Python and torch themselves) is not compared.
    """
    status, out, err = shared_run("capped", "--json")
    assert status == 0, err
    summary = json.loads(out)
    assert summary["peak_memory_kind"] == "tracked-tensor-bytes" and summary["dtype"] == "float32"
    made = capped_plan(CAPPED_FRACTION)
    free = capped_plan(1.0)
    cluster = load_cluster(str(CAPPED_CLUSTER))
    memory = {d.id: d.memory for d in cluster.devices}
    from pipeplan.models.graph import load_graph

    graph = load_graph(str(CAPPED_GRAPH))
    params = [sum(graph.layers[i].params for s in group_stages for i in range(*made.plan.stages[s].layers))
              for group_stages in ([s for s, g in enumerate(made.plan.stage_groups) if g == k]
                                   for k in range(len(made.plan.groups)))]
    group_of = {d: g for g, devs in enumerate(made.plan.groups) for d in devs}
    assert made.fits and max(free.after.peak_memory) > CAPPED_FRACTION * min(memory.values())  # the cap binds
    for device, measured, predicted in zip(summary["devices"], summary["peak_memory"],
                                           summary["predicted_peak_memory"]):
        cap = CAPPED_FRACTION * memory[device]
        g = group_of[device]
        assert predicted == made.after.peak_memory[g] <= cap
        assert measured <= cap
        stash, predicted_stash = measured - 2 * params[g], predicted - made.plan.state_factor * params[g]
        assert stash == pytest.approx(predicted_stash, rel=0.1)  # measured 2026-12-02: +1.5 % and +6.2 %


# ----------------------------------------------------------------- version-2 plans: pure data
def _shared_plan() -> Plan:
    case = custom_case()
    return case_plan(case)


class TestRanks:
    def test_a_device_is_one_rank_whatever_the_stages_on_it(self):
        plan = _shared_plan()
        assert device_ranks(plan) == {"g0": 0, "g1": 1, "g2": 2, "g3": 3}
        assert stage_ranks(plan) == [[0], [1, 2], [1, 2], [3]]
        assert plan.stage_groups == [0, 1, 1, 2]
        assert rank_of(plan) == [(0, 0), (1, 0), (1, 1), (2, 0)]

    def test_version_1_numbering_is_unchanged(self):
        plan = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 1), ("x",), (4,)), Stage((1, 2), ("y", "z"), (4,))))
        assert stage_ranks(plan) == [[0], [1, 2]] and rank_of(plan) == [(0, 0), (1, 0), (1, 1)]


class TestLocalHandOver:
    def test_messages_between_stages_of_one_group(self):
        plan = _shared_plan()
        ops = plan.stage_actions()  # each stage's actions in its group's order
        msgs = cut_messages(plan, 1, ops)
        # stage 1 pieces: rank 1 [0,2) [3,6), rank 2 [2,3) [6,8); stage 2: rank 1 [0,2) [4,6), rank 2 [2,4) [6,8)
        assert [(m.src, m.dst, m.start, m.stop) for m in msgs] == \
            [(1, 1, 0, 2), (2, 2, 2, 3), (1, 2, 3, 4), (1, 1, 4, 6), (2, 2, 6, 8)]
        # gradients come back in the order stage 2 runs its I's
        assert [m.dst_mb for m in grad_order(msgs, ops)] == [0, 0, 0, 1, 1]

    def test_only_ranks_that_differ_get_links(self):
        plan = _shared_plan()
        from pipeplan.models.zoo import build_model

        members = group_members(plan, build_model("gpt-tiny", device="meta"))
        assert members[(1, "fwd")] == [1, 2] and members[("group", 1)] == [1, 2]
        assert links(members, plan).count(((1, "fwd"), 1, 2)) == 1


def _record(group: int, stages: list[int], spans: list[tuple[str, float]], device: str = "d") -> dict:
    """A rank record whose one step runs the ``(label, seconds)`` spans back to back."""
    events, t = [], 0.0
    for label, seconds in spans:
        events.append(["backward", label, t, t + seconds])
        t += seconds
    return {"group": group, "stages": stages, "stage": stages[0], "device": device,
            "steps": [{"events": events, "end": t}]}


class TestProgramDurations:
    def test_split_backward_halves_with_their_messages_slowest_replica(self):
        program = [Action(1, "F", 0), Action(2, "F", 0), Action(2, "I", 0), Action(1, "B", 0), Action(2, "W", 0)]
        a = _record(1, [1, 2], [("1:F0", 1.0), ("1:send A0", 0.25), ("2:F0", 2.0), ("2:recv G0", 0.5),
                                ("2:I0", 3.0), ("2:send G0", 0.25), ("1:B0", 4.0), ("2:W0", 5.0)])
        b = _record(1, [1, 2], [("1:F0", 1.5), ("2:F0", 1.0), ("2:I0", 1.0), ("1:B0", 1.0), ("2:W0", 6.0)])
        other = _record(0, [0], [("F0", 100.0)])
        # I: receive (its span: no recorded CPU part, the shortest of its direction) + I + send
        assert program_durations([a, b, other], [0], 1, program) == pytest.approx((1.5, 2.0, 3.75, 4.0, 6.0))

    def test_version_1_records(self):
        r = {"stage": 0, "steps": [{"events": [["forward", "F0", 0.0, 1.0], ["backward", "B0", 1.0, 3.0]],
                                    "end": 3.0}]}
        assert program_durations([r], [0], 0, [Action(0, "F", 0), Action(0, "B", 0)]) == (1.0, 2.0)


class TestRunFactorsOfAGroup:
    def test_every_stage_of_the_group_and_both_halves_count(self):
        from conftest import chain, cluster

        plan = Plan("g", "c", 2, 4.0, "custom", (Stage((0, 1), ("d0",), (2,)), Stage((1, 2), ("d0",), (2,))))
        # one layer per stage: F = 2, B = 4 for 2 samples; charged 12 on d0 (speed 1)
        ranks = [_record(0, [0, 1], [("0:F0", 2.0), ("1:F0", 3.0), ("1:I0", 3.0), ("0:B0", 4.0), ("1:W0", 3.0)],
                         device="d0")]
        assert run_factors(ranks, [0], plan, chain(2), cluster(1)) == pytest.approx({"d0": 15 / 12})


# ----------------------------------------------------------------- version 3: tensor parallelism and ZeRO
@pytest.mark.parametrize("name", list(TP_PLANS))
def test_tensor_parallel_and_zero_train_like_one_process(shared_run, launched, name):
    if name == "tp_llama" and not has_transformers():
        pytest.skip("needs the hf extra (transformers)")
    summary = verified(shared_run, name)
    model, plan = TP_PLANS[name]
    ranks = launched[name]["result"]["ranks"]
    degree = {r: st["tensor_parallel"] for st in plan["stages"] for r in st["devices"]}
    for rank in ranks:  # the layers were split: a rank of degree 2 holds shards (4 per split linear pair)
        assert (rank["sharded_parameters"] > 0) == (degree[rank["device"]] == 2), rank
    # the loss is counted once per replica: the same as one process's (what --verify trained against)
    assert len(summary["losses"]) == 2 and all(0 < loss < 10 for loss in summary["losses"])
    zero = [rank["zero_stepped"] for rank in ranks if rank["zero_stepped"] is not None]
    if plan["zero"]:  # each ring's sharded parameters are stepped by exactly one of its ranks
        assert zero and all(0 < mine < total for mine, total in zero), zero
        assert sum(mine for mine, _ in zero) == sum(total for _, total in zero) // 2  # rings of 2
    else:
        assert not zero
    for rank in ranks:  # the meter's state: weights and the gradients kept, fewer under ZeRO-2 (spec 8.4, SGD)
        sharded_grads = plan["zero"] == 2 and rank["zero_stepped"] is not None
        assert (rank["state_bytes"] < 2 * rank["param_bytes"]) == sharded_grads, rank
        assert rank["state_bytes"] > rank["param_bytes"]


def test_tensor_parallel_losses_equal_the_same_batch_without_it(launched):
    # the same model, batch and seed: TP x DP x ZeRO-1 (interleaved-zb) and TP then ZeRO-2 (GPipe) train alike
    a, b = (launched[name]["result"]["ranks"] for name in ("tp_then_dp_zero2", "tp_x_dp_zero1"))
    from pipeplan.runtime.report import step_losses

    assert step_losses(a) == pytest.approx(step_losses(b), rel=1e-12)
