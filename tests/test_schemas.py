"""The JSON Schemas describe every file pipeplan ships or writes, and refuse broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")  # the test extra installs it
from referencing import Registry, Resource  # noqa: E402  (installed with jsonschema)

from conftest import EXAMPLES, ROOT  # noqa: E402
from pipeplan.schema_files import SCHEMA_NAMES, schema, schema_text  # noqa: E402

KINDS = {"pipeplan.graph": "graph", "pipeplan.cluster": "cluster", "pipeplan.plan": "plan"}


def validator(name: str):
    registry = Registry().with_resources(
        (schema(n)["$id"], Resource.from_contents(schema(n))) for n in SCHEMA_NAMES)
    return jsonschema.Draft202012Validator(schema(name), registry=registry,
                                           format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def kind_of(data: dict) -> str:
    return KINDS[data["format"].split("/")[0]]


def assert_valid(path: Path) -> None:
    data = json.loads(path.read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(kind_of(data)).iter_errors(data)]
    assert not errors, f"{path}: {errors[:3]}"


def shipped_files() -> list[Path]:
    """Every graph, cluster and plan file in examples/ and in the tests' fixtures."""
    files = sorted(EXAMPLES.glob("*.json")) + sorted((ROOT / "tests" / "data").rglob("*.json"))
    return [f for f in files if json.loads(f.read_text()).get("format", "").split("/")[0] in KINDS]


class TestSchemaFiles:
    @pytest.mark.parametrize("name", SCHEMA_NAMES)
    def test_each_is_a_valid_draft_2020_12_schema(self, name):
        jsonschema.Draft202012Validator.check_schema(schema(name))
        assert schema(name)["$schema"] == "https://json-schema.org/draft/2020-12/schema"

    @pytest.mark.parametrize("name", ("graph", "cluster", "plan"))
    def test_every_field_says_what_it_means(self, name):
        def walk(node, where):
            if isinstance(node, dict):
                for key, sub in node.get("properties", {}).items():
                    assert "description" in sub, f"{name}: {where}.{key} has no description"
                for key, sub in node.items():
                    walk(sub, f"{where}.{key}")
            elif isinstance(node, list):
                for item in node:
                    walk(item, where)
        walk(schema(name), name)


class TestShippedFiles:
    def test_there_are_files_of_every_kind(self):
        kinds = {kind_of(json.loads(f.read_text())) for f in shipped_files()}
        assert kinds == {"graph", "cluster", "plan"}

    @pytest.mark.parametrize("path", shipped_files(), ids=lambda p: str(p.relative_to(ROOT)))
    def test_validates(self, path):
        assert_valid(path)


class TestWrittenFiles:
    def test_what_the_demo_writes_validates(self, tmp_path, run_cli):
        """The demo's profile, plan (with its solver record) and calibrated cluster, made the same way
        (the calibration's probe processes under the launcher's hang timeout)."""
        def cli(*argv):
            status, _, err = run_cli(*argv)
            assert status == 0, err[-2000:]

        graph, plan, calibrated = tmp_path / "g.json", tmp_path / "p.json", tmp_path / "c.json"
        cluster = str(EXAMPLES / "cpu-pair.cluster.json")
        cli("profile", "gpt-tiny", "--batch-sizes", "1,2", "-o", str(graph))
        cli("plan", str(graph), cluster, "--batch", "8", "--microbatches", "4", "--schedule", "1f1b",
            "--solver", "cpsat", "--time-limit", "5", "-o", str(plan))
        cli("calibrate", str(graph), cluster, str(plan), "--model", "gpt-tiny", "--runs", "1", "--steps", "3",
            "-o", str(calibrated))
        for path in (graph, plan, calibrated):
            assert_valid(path)
        assert "solver" in json.loads(plan.read_text())


class TestSchemasRefuse:
    def test_a_plan_without_its_batch(self):
        data = json.loads((EXAMPLES / "hetero.plan.json").read_text())
        del data["global_batch"]
        assert not validator("plan").is_valid(data)

    def test_a_negative_layer_size(self):
        data = json.loads((EXAMPLES / "chain8.graph.json").read_text())
        data["layers"][2]["params"] = -1
        assert not validator("graph").is_valid(data)

    def test_a_solver_record_with_an_unknown_status(self):
        data = json.loads((EXAMPLES / "hetero.plan.json").read_text())
        data["solver"] = {"name": "x", "status": "probably", "iteration_time": 1.0, "lower_bound": None,
                          "gap": None, "wall_time": 0.1, "seed": 0}
        assert not validator("plan").is_valid(data)
        data["solver"]["status"] = "feasible"
        assert validator("plan").is_valid(data)

    def test_a_cluster_with_zero_speed(self):
        data = json.loads((EXAMPLES / "two-servers.cluster.json").read_text())
        data["devices"][0]["speed"] = 0
        assert not validator("cluster").is_valid(data)


class TestSchemaCommand:
    @pytest.mark.parametrize("name", SCHEMA_NAMES)
    def test_prints_the_schema(self, run_cli, name):
        status, out, err = run_cli("schema", name)
        assert status == 0 and err == "" and out == schema_text(name) and json.loads(out)["$id"].endswith(name)

    def test_unknown_name(self, run_cli):
        status, _, err = run_cli("schema", "nope")
        assert status == 2 and err.startswith("error: pipeplan schema: arguments: ")
