"""Plan: every validation rule of the spec, and JSON round trips."""

import json

import pytest

from conftest import EXAMPLES, chain, cluster
from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import Plan, equal_split, load_plan


def base() -> dict:
    return {
        "format": "pipeplan.plan/1", "graph": "g", "cluster": "c", "global_batch": 8, "state_factor": 4,
        "schedule": "1f1b",
        "stages": [
            {"layers": [0, 2], "devices": ["d0"], "microbatches": [4, 4], "recompute": False},
            {"layers": [2, 4], "devices": ["d1", "d2"], "microbatches": [2, 2, 4], "recompute": True},
        ],
    }


class TestValidate:
    def test_a_good_plan_passes(self):
        Plan.from_dict(base()).validate(chain(4), cluster(3))

    @pytest.mark.parametrize("mutate, where, what", [
        (lambda d: d["stages"][1].update(layers=[3, 4]), "stages[1].layers", "gap: layers 2..2"),
        (lambda d: d["stages"][1].update(layers=[1, 4]), "stages[1].layers", "overlap: layers 1..1"),
        (lambda d: d["stages"][1].update(layers=[2, 2]), "stages[1].layers", "is empty"),
        (lambda d: d["stages"][0].update(layers=[1, 2]), "stages[0].layers", "gap: layers 0..0"),
        (lambda d: d["stages"][1].update(devices=["d0"]), "stages[1].devices[0]", "already used by stage 0"),
        (lambda d: d["stages"][1].update(devices=["d1", "d1"]), "stages[1].devices[1]", "already used"),
        (lambda d: d["stages"][1].update(devices=[]), "stages[1].devices", "must not be empty"),
        (lambda d: d["stages"][0].update(microbatches=[4, 3]), "stages[0].microbatches", "sum to 7"),
        (lambda d: d["stages"][0].update(microbatches=[8, 0]), "stages[0].microbatches[1]", "must be positive"),
        (lambda d: d["stages"][0].update(microbatches=[9, -1]), "stages[0].microbatches[1]", "must be positive"),
        (lambda d: d["stages"][0].update(microbatches=[4.0, 4]), "stages[0].microbatches[0]", "expected an integer"),
        (lambda d: d.update(schedule="zb-v"), "schedule", "unknown schedule 'zb-v'"),
        (lambda d: d.update(global_batch=0), "global_batch", "at least 1"),
        (lambda d: d.update(format="pipeplan.plan/9"), "format", "unknown format version"),
        (lambda d: d.pop("state_factor"), "state_factor", "missing required field"),
        (lambda d: d["stages"][0].update(recompute="yes"), "stages[0].recompute", "expected true or false"),
        (lambda d: d.update(stages=[]), "stages", "must not be empty"),
        (lambda d: d.update(schedule="custom"), "stages[0].ops", "custom schedule needs an op list"),
    ])
    def test_broken_rules(self, mutate, where, what):
        data = base()
        mutate(data)
        with pytest.raises(InputError) as info:
            Plan.from_dict(data, "p.json")
        assert (info.value.file, info.value.where) == ("p.json", where)
        assert what in info.value.what

    def test_layers_must_cover_the_graph(self):
        with pytest.raises(InputError, match="layers 4..4 belong to no stage"):
            Plan.from_dict(base()).validate(chain(5), cluster(3))
        with pytest.raises(InputError, match="the graph has only 3 layers"):
            Plan.from_dict(base()).validate(chain(3), cluster(3))

    def test_devices_must_exist(self):
        with pytest.raises(InputError) as info:
            Plan.from_dict(base()).validate(chain(4), cluster(2), "p.json")
        assert info.value.where == "stages[1].devices[1]" and "unknown device 'd2'" in info.value.what

    def test_custom_ops_checked(self):
        data = base()
        data["schedule"] = "custom"
        data["stages"][0]["ops"] = ["F0", "F1", "B0", "B1"]
        data["stages"][1]["ops"] = ["F0", "B1", "F1", "F2", "B0", "B2"]
        with pytest.raises(InputError) as info:
            Plan.from_dict(data)
        assert info.value.where == "stages[1].ops[1]" and "B1 comes before F1" in info.value.what


    def test_an_op_list_on_a_named_schedule_must_be_its_own(self):
        data = base()
        # stage 0 of 2 under 1f1b with 2 microbatches: w = 1, so F0 F1 B0 B1 (the same as gpipe's)
        data["stages"][0]["ops"] = ["F0", "F1", "B0", "B1"]
        data["stages"][1]["ops"] = ["F0", "B0", "F1", "B1", "F2", "B2"]  # the last stage: w = 0
        plan = Plan.from_dict(data)
        assert plan.to_dict()["stages"][1]["ops"] == ["F0", "B0", "F1", "B1", "F2", "B2"]
        data["stages"][1]["ops"] = ["F0", "F1", "B0", "B1", "F2", "B2"]
        with pytest.raises(InputError) as info:
            Plan.from_dict(data, "p.json")
        assert info.value.where == "stages[1].ops"
        assert "differs from this stage's 1f1b op list (F0 B0 F1 B1 F2 B2)" in info.value.what
        assert '"schedule": "custom"' in info.value.what


class TestRoundTrip:
    def test_extra_fields_survive(self):
        data = base()
        data["solver"] = {"name": "x", "status": "feasible"}
        data["stages"][0]["note"] = [1, 2]
        plan = Plan.from_dict(data)
        assert plan.to_dict() == data
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan

    @pytest.mark.parametrize("name, graph", [("hetero", "chain8"), ("skip8", "skip8"), ("custom", "chain8")])
    def test_examples(self, name, graph):
        g = load_graph(str(EXAMPLES / f"{graph}.graph.json"))
        c = load_cluster(str(EXAMPLES / "two-servers.cluster.json"))
        plan = load_plan(str(EXAMPLES / f"{name}.plan.json"), g, c)
        assert plan.to_dict() == json.loads((EXAMPLES / f"{name}.plan.json").read_text())


class TestEqualSplit:
    def test_even(self):
        assert equal_split(8, 4) == (2, 2, 2, 2)

    def test_remainder_goes_first(self):
        assert equal_split(10, 4) == (3, 3, 2, 2)

    def test_too_many(self):
        with pytest.raises(ValueError):
            equal_split(3, 4)
