"""A user's own models all the way to training: profile, plan, ``run --verify``, export, torchrun.

Eight models the zoo does not have (``tests/data/user_models/own_models.py``,
``examples/mymodel.py`` and ``hf:`` ones from small configurations): a CNN with
``nn.Flatten``, an MLP factory profiled with ``--analytic``, GPT-2, Mistral, BART as
an encoder-decoder, ViT, the docs' model with a long skip and a tied head, and a
residual model cut at hand-chosen ``--units``.  Each is profiled, planned on 2 or 3
processes and exported to torch in this process; then pipeplan run's workers train
it with ``--verify`` and the exported ``train.py`` trains it, both under torchrun
(``pipeplan run``'s form across machines), all the models of one process count in
one launch (``tests/data/user_models/run_many.py``: a launch costs more than a tiny
model's training).  ``train.py`` must reach the run's losses (1e-5: ``--verify``
trains in float64, torch in float32).  The runs are shared by the tests (a
module-scoped fixture); ``pipeplan run`` itself (the local launcher) runs imported
models in tests/test_user_models.py.  T5 (two input tensors), which ``run`` refuses,
``export`` refuses with the same message.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeplan.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "user_models"
OWN = DATA / "own_models.py"
STEPS = 2
LOSS_TOLERANCE = 1e-5
LIMIT = 300
"""Seconds a worker may wait for a peer before it counts as hung (a margin that load cannot eat)."""
LAUNCH_LIMIT = 1500
"""Hard timeout of one torchrun launch, which runs several models' trainings (seconds)."""

TOKENS = ["--input-shape", "6", "--input-dtype", "int64", "--input-high", "48"]
QUICK = ["--batch-sizes", "1,2", "--repeats", "1", "--warmup", "0"]


def _args(*pairs: str) -> list[str]:
    return [x for pair in pairs for x in ("--model-arg", pair)]


@dataclass(frozen=True)
class Case:
    """One model: how it is named, how it is profiled, on how many processes it is planned."""

    model: list[str]
    """The spec and its options, as on the command line."""
    profile: list[str]
    """The profiling options (``--analytic`` or the quick measurement)."""
    processes: int
    """Devices of the cluster it is planned on (the plan's processes)."""
    hf: bool = False
    """Whether it needs transformers."""


CASES = {
    "cnn": Case([f"{OWN}:cnn"], QUICK, 2),
    "mlp": Case([f"{OWN}:mlp", "--input-shape", "8"], ["--analytic"], 2),
    # dropout off where a model has it: pipeplan seeds each piece's masks, torch draws its own
    "gpt2": Case(["hf:gpt2", *_args("n_layer=2", "n_embd=16", "n_head=2", "vocab_size=48", "n_positions=8",
                                    "resid_pdrop=0.0", "embd_pdrop=0.0", "attn_pdrop=0.0"), *TOKENS],
                 ["--analytic"], 2, hf=True),
    "mistral": Case(["hf:mistral", *_args("num_hidden_layers=2", "hidden_size=16", "num_attention_heads=2",
                                          "num_key_value_heads=1", "intermediate_size=32", "vocab_size=48",
                                          "head_dim=8"), *TOKENS], ["--analytic"], 2, hf=True),
    "bart": Case(["hf:bart:seq2seq", *_args("encoder_layers=1", "decoder_layers=1", "d_model=8",
                                             "encoder_attention_heads=2", "decoder_attention_heads=2",
                                             "encoder_ffn_dim=16", "decoder_ffn_dim=16", "vocab_size=48",
                                             "max_position_embeddings=8", "dropout=0.0"), *TOKENS], QUICK, 2, hf=True),
    "vit": Case(["hf:vit", *_args("hidden_size=8", "num_hidden_layers=2", "num_attention_heads=2",
                                  "intermediate_size=16", "image_size=4", "patch_size=2"),
                 "--input-shape", "3,4,4"], ["--analytic"], 2, hf=True),
    "skip-tie": Case([f"{ROOT}/examples/mymodel.py:build", *_args("vocab=40", "dim=8", "layers=2", "seq=5")],
                     QUICK, 3),
    "hand-units": Case([f"{OWN}:residual", "--units", "embed,body.0,body.1,body.2,body.3,head"], QUICK, 3),
}


@dataclass
class Outcome:
    """What one model's runs gave."""

    graph: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)
    """The exported ``stages.json``."""
    run: dict = field(default_factory=dict)
    """The summary ``--verify --json`` of pipeplan run's workers."""
    torchrun: list[float] = field(default_factory=list)
    """The exported ``train.py``'s losses under torchrun."""


def _cli(*argv: str) -> tuple[int, str]:
    """``pipeplan`` in this process: (status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


def _cluster(folder: Path, n: int) -> Path:
    """``n`` equal CPUs on links that cost nothing: the planner uses all of them."""
    path = folder / f"cpu-{n}.cluster.json"
    path.write_text(json.dumps({
        "format": "pipeplan.cluster/1", "name": f"cpu-{n}",
        "servers": [{"id": "local", "bandwidth": 1e12, "latency": 0.0}], "network": {"bandwidth": 1e12, "latency": 0.0},
        "devices": [{"id": f"cpu{i}", "server": "local", "speed": 1.0, "memory": 4e9} for i in range(n)]}))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _launch(jobs: list[dict], processes: int, folder: Path) -> dict[str, list[str]]:
    """Each job's stdout lines, from one torchrun launch running them one after the other."""
    spec = folder / f"jobs-{processes}.json"
    spec.write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", str(DATA / "run_many.py"), str(spec)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=LAUNCH_LIMIT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines: dict[str, list[str]] = {}
    current: list[str] = []
    for line in proc.stdout.splitlines():
        if line.startswith("job "):
            current = lines.setdefault(line.split(" ", 1)[1], [])
        else:
            current.append(line)
    return lines


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every case profiled, planned and exported; trained by pipeplan's workers with --verify and by its
    exported train.py, under torchrun."""
    base = tmp_path_factory.mktemp("own")
    try:
        import transformers  # noqa: F401
        hf = True
    except ImportError:
        hf = False
    results: dict[str, Outcome] = {}
    jobs: dict[int, list[dict]] = {}
    for name, case in CASES.items():
        if case.hf and not hf:
            continue
        graph, plan, folder = base / f"{name}.graph.json", base / f"{name}.plan.json", base / name
        cluster = _cluster(base, case.processes)
        status, err = _cli("profile", *case.model, *case.profile, "-o", str(graph))
        assert status == 0, f"{name}: {err}"
        status, err = _cli("plan", str(graph), str(cluster), "--batch", "8", "--microbatches", "4", "--solver",
                           "cpsat", "--no-replication", "--time-limit", "30", "-o", str(plan))
        assert status == 0, f"{name}: {err}"
        status, err = _cli("export", str(plan), "--to", "torch", "--graph", str(graph), "-o", str(folder))
        assert status == 0, f"{name}: {err}"
        results[name] = Outcome(json.loads(graph.read_text()), json.loads(plan.read_text()),
                                json.loads((folder / "stages.json").read_text()))
        jobs.setdefault(len(results[name].plan["stages"]), []).extend([
            {"name": f"{name} run", "kind": "worker",
             "argv": [str(graph), str(cluster), str(plan), "--model", *case.model, "--verify", "--steps", str(STEPS),
                      "--json", "--timeout", str(LIMIT)]},
            {"name": f"{name} train.py", "kind": "train", "argv": [str(folder / "train.py"), "--steps", str(STEPS)]}])
    for processes, launch in jobs.items():
        lines = _launch(launch, processes, base)
        for job in launch:
            name, kind = job["name"].rsplit(" ", 1)
            out = lines.get(job["name"], [])
            if kind == "run":
                results[name].run = json.loads(out[-1]) if out else {}
            else:
                results[name].torchrun = [float(line.split()[3]) for line in out if line.startswith("step ")]
    return results


class TestOwnModelsToTraining:
    @pytest.mark.parametrize("name", list(CASES))
    def test_planned_on_two_or_three_processes(self, outcomes, name):
        if name not in outcomes:
            pytest.skip("needs transformers")
        out = outcomes[name]
        assert len(out.plan["stages"]) == CASES[name].processes
        assert out.run["processes"] == CASES[name].processes
        assert [stage["layers"] for stage in out.stages["stages"]] == [stage["layers"] for stage in out.plan["stages"]]

    @pytest.mark.parametrize("name", list(CASES))
    def test_run_verifies(self, outcomes, name):
        if name not in outcomes:
            pytest.skip("needs transformers")
        run = outcomes[name].run
        assert run["verified"] and run["max_param_diff"] <= 1e-6, (run["max_param_diff"], run["max_param_diff_at"])

    @pytest.mark.parametrize("name", list(CASES))
    def test_torchrun_trains_to_the_losses_of_run(self, outcomes, name):
        if name not in outcomes:
            pytest.skip("needs transformers")
        out = outcomes[name]
        assert len(out.torchrun) == STEPS
        assert out.torchrun == pytest.approx(out.run["losses"], rel=LOSS_TOLERANCE)
        assert out.torchrun[0] != out.torchrun[-1]  # the weights moved

    def test_export_carries_what_built_the_model(self, outcomes):
        stages = outcomes["hand-units"].stages
        assert stages["model"] == "own_models.py:residual"  # the factory copied beside train.py
        assert stages["model_options"]["units"] == "embed,body.0,body.1,body.2,body.3,head"
        assert outcomes["mlp"].stages["model_options"]["input_shape"] == "8"
        if "gpt2" in outcomes:
            assert "n_layer=2" in outcomes["gpt2"].stages["model_options"]["model_args"]
            assert outcomes["gpt2"].stages["model_options"]["input_high"] == "48"

    def test_analytic_mlp_counted_on_meta(self, outcomes):
        assert outcomes["mlp"].graph["profile"]["counted_on"] == "meta"

    def test_the_profiles_hold_the_split_backward(self, outcomes):
        # measured: the input and weight halves were timed and counted for every layer
        for name in ("cnn", "hand-units", "skip-tie"):
            assert all("bwd_w" in layer and "act_w" in layer for layer in outcomes[name].graph["layers"]), name


class TestRefusedAlike:
    def test_t5_run_and_export_refuse_with_one_reason(self, tmp_path, run_cli):
        pytest.importorskip("transformers")
        graph, plan = tmp_path / "t5.graph.json", tmp_path / "t5.plan.json"
        cluster = _cluster(tmp_path, 2)
        status, _, err = run_cli("profile", f"{OWN}:t5", "--analytic", "-o", str(graph))
        assert status == 0, err
        status, _, err = run_cli("plan", str(graph), str(cluster), "--batch", "4", "--microbatches", "2",
                                 "--solver", "cpsat", "--no-replication", "--time-limit", "20", "-o", str(plan))
        assert status == 0, err
        status, _, ran = run_cli("run", str(graph), str(cluster), str(plan), "--model", f"{OWN}:t5", "--steps", "1")
        assert status == 2 and "the runtime feeds the model one input tensor" in ran
        status, _, exported = run_cli("export", str(plan), "--to", "torch", "--graph", str(graph),
                                      "-o", str(tmp_path / "out"))
        assert status == 2 and exported.count("\n") == 1 and not (tmp_path / "out").exists()
        assert exported.split(": ", 1)[1] == ran.split(": ", 1)[1]
