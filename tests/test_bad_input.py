"""The error contract on the inputs and outputs fuzzing found breaking it (issue 30's reproducers).

Each failing command ends with exactly one ``error:`` line on stderr, exit 2, and no
file written; each successful one prints only finite numbers.
"""

from __future__ import annotations

import io
import json
import os
import stat
import threading

import pytest

from conftest import EXAMPLES
from pipeplan import notices
from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import MAX_INPUT_BYTES, check_output_kind, read_input
from pipeplan.solver.core.problem import MAX_DEVICES, MAX_LAYERS, MAX_MICROBATCHES, TooLarge, check_size
from conftest import chain, cluster

GRAPH = str(EXAMPLES / "chain8.graph.json")
CLUSTER = str(EXAMPLES / "two-servers.cluster.json")
PLAN = str(EXAMPLES / "hetero.plan.json")


def _write(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _one_layer(tmp_path, fwd, bwd=(0, 0)) -> str:
    return _write(tmp_path, "g.json", {"format": "pipeplan.graph/1", "name": "g", "input_bytes": 0,
                                       "layers": [{"name": "a", "fwd": list(fwd), "bwd": list(bwd),
                                                   "params": 0, "act": 0, "out": 0}]})


def _chain(tmp_path, layers: int, fwd) -> str:
    return _write(tmp_path, "g.json", {"format": "pipeplan.graph/1", "name": "g", "input_bytes": 0,
                                       "layers": [{"name": f"l{i}", "fwd": list(fwd), "bwd": [0, 0], "params": 0,
                                                   "act": 0, "out": 0} for i in range(layers)]})


def _devices(tmp_path, count: int) -> str:
    return _write(tmp_path, "c.json", {
        "format": "pipeplan.cluster/1", "name": "c", "servers": [{"id": "s", "bandwidth": 1e9, "latency": 0}],
        "network": {"bandwidth": 1e9, "latency": 0},
        "devices": [{"id": f"d{i}", "server": "s", "speed": 1, "memory": 1e9} for i in range(count)]})


def _plan(tmp_path, stages, schedule="1f1b", batch=1) -> str:
    return _write(tmp_path, "p.json", {
        "format": "pipeplan.plan/1", "graph": "g", "cluster": "c", "global_batch": batch, "state_factor": 4,
        "schedule": schedule,
        "stages": [{"layers": list(layers), "devices": devices, "microbatches": split, "recompute": False}
                   for layers, devices, split in stages]})


def _refused(result, start: str) -> None:
    status, _, err = result
    assert status == 2, err
    assert err.startswith(start) and err.count("\n") == 1, err


class TestReadInput:
    def test_a_regular_file_is_read_whole(self, tmp_path):
        path = tmp_path / "a.json"
        path.write_bytes(b'{"a": 1}')
        assert read_input(path) == b'{"a": 1}'

    def test_a_fifo_is_refused_without_blocking(self, tmp_path):
        fifo = tmp_path / "in.fifo"
        os.mkfifo(fifo)
        outcome = []
        reader = threading.Thread(target=lambda: outcome.append(_error_of(read_input, fifo)), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert outcome and "is a FIFO" in outcome[0]

    @pytest.mark.parametrize("device", ["/dev/zero", "/dev/full", "/dev/null"])
    def test_a_device_is_refused_before_reading(self, device):
        if not os.path.exists(device):
            pytest.skip(f"{device} is missing here")
        assert "is a character device" in _error_of(read_input, device)

    def test_a_directory_is_refused(self, tmp_path):
        assert "is a directory" in _error_of(read_input, tmp_path)

    def test_a_file_above_the_cap_is_refused_by_its_size(self, tmp_path):
        big = tmp_path / "big.json"
        with open(big, "wb") as handle:
            handle.truncate(MAX_INPUT_BYTES + 1)  # sparse: no disk used
        assert f"is {MAX_INPUT_BYTES + 1} bytes, above the input limit of {MAX_INPUT_BYTES}" in _error_of(read_input,
                                                                                                         big)

    def test_a_missing_file(self, tmp_path):
        assert _error_of(read_input, tmp_path / "none.json") == "no such file"


def _error_of(function, *args, **kwargs) -> str:
    with pytest.raises(InputError) as caught:
        function(*args, **kwargs)
    return caught.value.what


class TestCheckOutputKind:
    def test_a_new_path_and_a_writable_file_pass(self, tmp_path):
        check_output_kind(tmp_path / "new.json")
        (tmp_path / "old.json").write_text("{}")
        check_output_kind(tmp_path / "old.json")

    def test_a_device_is_refused(self, tmp_path):
        assert "is a character device" in _error_of(check_output_kind, _null_device(tmp_path))

    def test_a_fifo_is_refused(self, tmp_path):
        os.mkfifo(tmp_path / "out.fifo")
        assert "is a FIFO" in _error_of(check_output_kind, tmp_path / "out.fifo")

    def test_a_dangling_symlink_is_refused(self, tmp_path):
        (tmp_path / "link.json").symlink_to(tmp_path / "gone.json")
        assert "which does not exist" in _error_of(check_output_kind, tmp_path / "link.json")

    def test_a_read_only_file_is_refused_unless_forced(self, tmp_path):
        path = tmp_path / "ro.json"
        path.write_text("{}")
        path.chmod(stat.S_IRUSR | stat.S_IRGRP)
        assert "pass --force" in _error_of(check_output_kind, path)
        check_output_kind(path, force=True)


def _null_device(tmp_path) -> str:
    """A character device like /dev/null under ``tmp_path`` (making one needs root)."""
    path = tmp_path / "null"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device needs root")
    return str(path)


class TestNotices:
    def test_flush_prints_held_lines_in_order_once(self):
        notices.discard()
        notices.warn("warning: a")
        notices.warn("warning: b\nc")
        stream = io.StringIO()
        notices.flush(stream)
        notices.flush(stream)
        assert stream.getvalue() == "warning: a\nwarning: b\\nc\n"

    def test_discard_forgets(self):
        notices.warn("warning: a")
        notices.discard()
        stream = io.StringIO()
        notices.flush(stream)
        assert stream.getvalue() == ""


class TestNonFiniteResults:
    """Issue 30, items 1 and 2: finite inputs whose results overflow."""

    def test_throughput_of_a_5e_324_s_iteration_is_refused(self, run_cli, tmp_path):
        graph, cluster = _one_layer(tmp_path, (5e-324, 0)), _devices(tmp_path, 1)
        plan = _plan(tmp_path, [((0, 1), ["d0"], [1])])
        _refused(run_cli("simulate", graph, cluster, plan, "--json"), f"error: {plan}: plan: its simulated "
                                                                     f"iteration time is 4.94066e-324 s")

    def test_validate_agrees_with_simulate(self, run_cli, tmp_path):
        graph, cluster = _one_layer(tmp_path, (5e-324, 0)), _devices(tmp_path, 1)
        plan = _plan(tmp_path, [((0, 1), ["d0"], [1])])
        _refused(run_cli("validate", graph, cluster, plan), f"error: {plan}: plan: its simulated iteration time")
        assert run_cli("validate", plan)[0] == 0  # alone, there is nothing to simulate it on

    def test_compare_refuses_an_infinite_throughput(self, run_cli, tmp_path):
        graph, cluster = _one_layer(tmp_path, (5e-324, 0)), _devices(tmp_path, 1)
        _refused(run_cli("compare", graph, cluster, "--batch", "1", "--microbatches", "1", "--solvers",
                         "even,greedy-speed", "--json"), "error: -: even: throughput: is inf")

    def test_plan_refuses_an_infinite_throughput_before_writing(self, run_cli, tmp_path):
        graph, cluster = _one_layer(tmp_path, (5e-324, 0)), _devices(tmp_path, 1)
        output = tmp_path / "p.json"
        _refused(run_cli("plan", graph, cluster, "--batch", "1", "--microbatches", "1", "--solver", "even",
                         "-o", str(output)), "error: -: even: throughput: is inf")
        assert not output.exists()

    def test_a_trace_whose_microseconds_overflow_is_refused(self, run_cli, tmp_path):
        graph, cluster = _one_layer(tmp_path, (1e303, 0)), _devices(tmp_path, 1)
        plan = _plan(tmp_path, [((0, 1), ["d0"], [1])])
        trace = tmp_path / "t.json"
        _refused(run_cli("simulate", graph, cluster, plan, "--trace", str(trace)),
                 f"error: {plan}: --trace: the iteration time 1e+303 s is beyond the float range in microseconds")
        assert not trace.exists()

    def test_the_bubble_fraction_stays_finite_where_s_times_t_overflows(self, run_cli, tmp_path):
        graph, cluster = _chain(tmp_path, 2, (1.6e307, 0)), _devices(tmp_path, 2)
        plan = _plan(tmp_path, [((0, 1), ["d0"], [1] * 10), ((1, 2), ["d1"], [1] * 10)], schedule="gpipe", batch=10)
        assert run_cli("validate", graph, cluster, plan)[0] == 0
        status, out, err = run_cli("simulate", graph, cluster, plan, "--json")
        assert status == 0 and err == ""
        summary = json.loads(out, parse_constant=lambda token: pytest.fail(f"{token} in the JSON"))
        # T = 11 ops of 1.6e307 s; each stage is busy 10 of them: 1 - 10/11
        assert summary["iteration_time"] == pytest.approx(11 * 1.6e307)
        assert summary["bubble_fraction"] == pytest.approx(1 - 10 / 11)


class TestWarningsBeforeErrors:
    """Issue 30, item 3: a name-mismatch warning must not precede the error."""

    def test_validate_prints_the_error_alone(self, run_cli, tmp_path):
        plan = json.loads((EXAMPLES / "hetero.plan.json").read_text())
        plan["graph"] = "other"
        plan["stages"][0]["devices"] = ["nowhere"]
        path = _write(tmp_path, "p.json", plan)
        status, out, err = run_cli("validate", GRAPH, CLUSTER, path)
        assert status == 2 and out == "" and err.count("\n") == 1 and err.startswith(f"error: {path}: ")

    def test_the_warning_follows_a_success(self, run_cli, tmp_path):
        plan = json.loads((EXAMPLES / "hetero.plan.json").read_text())
        plan["graph"] = "other"
        path = _write(tmp_path, "p.json", plan)
        status, _, err = run_cli("simulate", GRAPH, CLUSTER, path, "--json")
        assert status == 0 and err == (f"warning: {path}: graph: plan was made for graph 'other', "
                                       f"simulating on 'chain8'\n")


class TestSpecialInputs:
    """Issue 30, items 4 and 5: FIFOs and devices as inputs."""

    def test_a_fifo_input_is_one_error_line(self, run_cli, tmp_path):
        fifo = tmp_path / "in.fifo"
        os.mkfifo(fifo)
        _refused(run_cli("validate", str(fifo)), f"error: {fifo}: file: is a FIFO")

    def test_dev_zero_input_is_one_error_line(self, run_cli):
        _refused(run_cli("simulate", "/dev/zero", CLUSTER, PLAN), "error: /dev/zero: file: is a character device")


class TestSpecialOutputs:
    """Issue 30, item 7: ``-o`` onto devices, FIFOs, dangling symlinks and read-only files."""

    def _plan(self, run_cli, output, *extra):
        return run_cli("plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "2", "--solver", "even",
                       "-o", str(output), *extra)

    def test_a_device_output_is_refused(self, run_cli, tmp_path):
        device = _null_device(tmp_path)  # never the system's /dev/null: a regression would replace it
        _refused(self._plan(run_cli, device), f"error: {device}: output: is a character device")
        assert stat.S_ISCHR(os.lstat(device).st_mode)

    def test_a_fifo_output_is_refused_and_kept(self, run_cli, tmp_path):
        fifo = tmp_path / "out.fifo"
        os.mkfifo(fifo)
        _refused(self._plan(run_cli, fifo), f"error: {fifo}: output: is a FIFO")
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)

    def test_a_dangling_symlink_output_is_refused_and_kept(self, run_cli, tmp_path):
        link = tmp_path / "plan.json"
        link.symlink_to(tmp_path / "gone.json")
        _refused(self._plan(run_cli, link), f"error: {link}: output: is a symlink to")
        assert link.is_symlink() and not (tmp_path / "gone.json").exists()

    def test_a_symlink_to_a_file_is_written_through(self, run_cli, tmp_path):
        target, link = tmp_path / "real.json", tmp_path / "plan.json"
        target.write_text("{}")
        link.symlink_to(target)
        assert self._plan(run_cli, link)[0] == 0
        assert link.is_symlink() and json.loads(target.read_text())["format"] == "pipeplan.plan/1"

    def test_a_read_only_output_needs_force(self, run_cli, tmp_path):
        output = tmp_path / "ro.json"
        output.write_text("{}")
        output.chmod(stat.S_IRUSR)
        _refused(self._plan(run_cli, output), f"error: {output}: output: is a read-only file: pass --force")
        assert output.read_text() == "{}"
        assert self._plan(run_cli, output, "--force")[0] == 0
        assert json.loads(output.read_text())["format"] == "pipeplan.plan/1"


class TestCheckSize:
    def test_the_limits_themselves_pass(self):
        check_size(chain(MAX_LAYERS), cluster(MAX_DEVICES), MAX_MICROBATCHES)

    @pytest.mark.parametrize("layers, devices, microbatches, role", [
        (MAX_LAYERS + 1, 2, 8, "graph"), (8, MAX_DEVICES + 1, 8, "cluster"), (8, 2, MAX_MICROBATCHES + 1, "options")])
    def test_one_beyond_a_limit_is_refused_naming_the_input(self, layers, devices, microbatches, role):
        with pytest.raises(TooLarge) as caught:
            check_size(chain(layers), cluster(devices), microbatches)
        assert caught.value.role == role and str(max(layers, devices, microbatches)) in str(caught.value)


class TestSizesBeyondATimeLimit:
    """Issue 30, item 6: sizes no time limit could honour are refused up front, with the numbers."""

    def test_ten_thousand_devices(self, run_cli, tmp_path):
        devices = _devices(tmp_path, 10_000)
        _refused(run_cli("plan", GRAPH, devices, "--batch", "64", "--microbatches", "8", "--solver", "cpsat",
                         "--time-limit", "2", "-o", str(tmp_path / "p.json")),
                 f"error: {devices}: devices: 10000 devices, above the {MAX_DEVICES}")
        assert not (tmp_path / "p.json").exists()

    def test_ten_thousand_layers(self, run_cli, tmp_path):
        graph = _chain(tmp_path, 10_000, (1e-4, 1e-5))
        _refused(run_cli("plan", graph, CLUSTER, "--batch", "64", "--microbatches", "8", "--solver", "cpsat",
                         "--time-limit", "2", "-o", str(tmp_path / "p.json")),
                 f"error: {graph}: layers: 10000 layers, above the {MAX_LAYERS}")

    def test_a_million_microbatches(self, run_cli, tmp_path):
        _refused(run_cli("plan", GRAPH, CLUSTER, "--batch", "1000000", "--microbatches", "1000000", "--solver",
                         "even", "-o", str(tmp_path / "p.json")),
                 f"error: -: --microbatches: 1000000 microbatches, above the {MAX_MICROBATCHES}")

    def test_a_billion_microbatches_allowed_with_auto(self, run_cli, tmp_path):
        _refused(run_cli("plan", GRAPH, CLUSTER, "--batch", "10000", "--microbatches", "auto", "--max-microbatches",
                         "1000000000", "--solver", "cpsat-split", "-o", str(tmp_path / "p.json")),
                 "error: -: --max-microbatches: 1000000000 microbatches, above the")
