"""Tensor parallelism and sharded training state (docs/model.md section 8).

``reference`` below re-derives, from the words of section 8 alone, every duration,
transfer, synchronisation, step and memory peak of a version-3 plan, reading the three
JSON objects directly (it uses nothing of the simulator; the programs come from the
schedule module, which its own tests hold to torch).  Random plans with random degrees,
ZeRO levels and state splits must agree with :func:`simulate`.
"""

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph, load_graph
from pipeplan.solver.evaluation.batched import Candidate, simulate_batch
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, load_cluster
from pipeplan.solver.formats.plan import Plan, load_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


# --------------------------------------------------------------------------- the reference
def _pair_links(cluster: dict, xs, ys) -> tuple[float, float]:
    """``(bw, lat)``: smallest bandwidth and largest latency over pairs of distinct devices (section 2)."""
    server = {d["id"]: d["server"] for d in cluster["devices"]}
    links = {s["id"]: (s["bandwidth"], s["latency"]) for s in cluster["servers"]}
    net = (cluster["network"]["bandwidth"], cluster["network"]["latency"])
    found = [links[server[x]] if server[x] == server[y] else net for x in xs for y in ys if x != y]
    return min(b for b, _ in found), max(lat for _, lat in found)


def _ring(k: int, nbytes: float, bw: float, lat: float, calls: int = 1) -> float:
    """``calls`` ring all-reduces among ``k`` devices moving ``nbytes`` in all: ``2(k-1)(lat + x / (k bw))`` each."""
    return 2 * (k - 1) * (calls * lat + nbytes / (k * bw)) if k > 1 else 0.0


def reference(graph: dict, cluster: dict, plan: dict, programs: list[list[str]]) -> dict:
    """Durations, transfers, synchronisation, steps and peaks as section 8 states them."""
    layers, stages = graph["layers"], plan["stages"]
    speed = {d["id"]: d["speed"] for d in cluster["devices"]}
    w, g, o = ((plan["state"][k] for k in ("weights", "gradients", "optimizer")) if "state" in plan
               else (1.0, 1.0, plan["state_factor"] - 2.0))
    out: dict = {"duration": {}, "transfer": {}, "allreduce": [], "step": [], "peak": []}

    def degree(s):
        return stages[s].get("tensor_parallel", 1)

    def replicas(s):
        return len(stages[s]["devices"]) // degree(s)

    def factors(layer, t):
        shares = layer.get("tp_share", [0, 0, 0])
        return [(1 - x) + x / t if t > 1 else 1.0 for x in shares]

    per_stage = {}
    for s, stage in enumerate(stages):
        t, r, dev = degree(s), replicas(s), stage["devices"]
        v = min(speed[d] for d in dev)
        reps = [dev[j:j + t] for j in range(0, len(dev), t)]
        bw_t = min(_pair_links(cluster, rep, rep)[0] for rep in reps) if t > 1 else 1.0
        lat_t = max(_pair_links(cluster, rep, rep)[1] for rep in reps) if t > 1 else 0.0
        lo, hi = stage["layers"]
        zero = stage.get("zero", plan.get("zero", 0))
        info = {"F": [], "B": [], "I": [], "W": [], "q": [], "zero": zero, "P": 0.0, "step": 0.0, "A": 0.0,
                "Aw": 0.0}
        for n in stage["microbatches"]:
            q = -(-n // r)
            tf = tb = ti = tw = 0.0
            for layer in layers[lo:hi]:
                tau = factors(layer, t)[0]
                af, bf = layer["fwd"]
                ab, bb = layer["bwd"]
                aw, bw = layer.get("bwd_w", [ab / 2, bb / 2])
                cf, cb = layer.get("tp_comm", [0, 0])
                c_f = _ring(t, q * cf, bw_t, lat_t) if cf > 0 else 0.0
                c_b = _ring(t, q * cb, bw_t, lat_t) if cb > 0 else 0.0
                tf += (af + bf * q) * tau / v + c_f
                tb += (ab + bb * q) * tau / v + c_b
                ti += ((ab - aw) + (bb - bw) * q) * tau / v + c_b
                tw += (aw + bw * q) * tau / v
            rec = tf if stage["recompute"] else 0.0
            for kind, x in (("F", tf), ("B", tb + rec), ("I", ti + rec), ("W", tw)):
                info[kind].append(x)
            info["q"].append(q)
        for layer in layers[lo:hi]:
            _, pi, alpha = factors(layer, t)
            info["P"] += layer["params"] * pi
            info["step"] += layer.get("step", 0.0) * pi
            info["A"] += layer["act"] * alpha
            info["Aw"] += layer.get("act_w", layer["act"]) * alpha
        info["input"] = graph["input_bytes"] if lo == 0 else layers[lo - 1]["out"]  # chains only
        info["state"] = info["P"] * (plan["state_factor"] if zero == 0 else w + g + o / r if zero == 1
                                     else w + (g + o) / r)
        per_stage[s] = info
        for k in range(len(stage["microbatches"])):
            for kind in "FBIW":
                out["duration"][(s, kind, k)] = info[kind][k]
    # transfers between stages on different devices (section 8.3: r counts replicas)
    for s in range(len(stages) - 1):
        a, b = stages[s], stages[s + 1]
        if set(a["devices"]) == set(b["devices"]):
            continue
        bw, lat = _pair_links(cluster, a["devices"], b["devices"])
        cut = layers[a["layers"][1] - 1]["out"]
        for direction, sender in (("fwd", a), ("bwd", b)):
            for k, n in enumerate(sender["microbatches"]):
                out["transfer"][(s, direction, k)] = lat + n * cut / (min(replicas(s), replicas(s + 1)) * bw)
    # groups: synchronisation, step, memory
    for program in programs:
        held = sorted({int(re.match(r"\d+", a).group()) for a in program})
        first = stages[held[0]]
        r = replicas(held[0])
        v = min(speed[d] for d in first["devices"])
        params = sum(per_stage[s]["P"] for s in held)
        if r > 1:
            bw, lat = _pair_links(cluster, first["devices"], first["devices"])
            out["allreduce"].append(_ring(r, params, bw, lat))
        else:
            out["allreduce"].append(0.0)
        out["step"].append(sum(per_stage[s]["step"] / (r if per_stage[s]["zero"] else 1) for s in held) / v)
        stash = top = 0.0
        for action in program:
            s, kind, k = re.fullmatch(r"(\d+)([FBIW])(\d+)", action).groups()
            info, k = per_stage[int(s)], int(k)
            q = info["q"][k]
            x = info["input"] if stages[int(s)]["recompute"] else info["A"]
            working = q * info["A"] if stages[int(s)]["recompute"] and kind in "BI" else 0.0
            top = max(top, stash + working)
            if kind == "F":
                stash += q * x
            elif kind == "B":
                stash -= q * x
            elif kind == "I":
                stash += q * info["Aw"] - q * x
            else:
                stash -= q * info["Aw"]
            top = max(top, stash)
        out["peak"].append(sum(per_stage[s]["state"] for s in held) + top)
    return out


# --------------------------------------------------------------------------- random instances
SERVERS = (("s0", 4.0, 0.01), ("s1", 1.0, 0.0), ("s2", 16.0, 0.25))


def _cluster_dict(speeds: list[float]) -> dict:
    return {"format": "pipeplan.cluster/1", "name": "c",
            "servers": [{"id": i, "bandwidth": b, "latency": lat} for i, b, lat in SERVERS],
            "network": {"bandwidth": 2.0, "latency": 0.5},
            "devices": [{"id": f"{s}d{j}", "server": s, "speed": speeds[8 * i + j], "memory": 1e12}
                        for i, (s, _, _) in enumerate(SERVERS) for j in range(8)]}


@st.composite
def instances(draw):
    """A chain graph with random tensor-parallel fields, a 3-server cluster, and a /3 plan on it."""
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "zbv"]))
    groups = draw(st.integers(1, 3)) if schedule != "zbv" else draw(st.integers(1, 2))
    n_stages = groups if schedule != "zbv" else 2 * groups
    n_layers = n_stages + draw(st.integers(0, 3))
    num = st.integers(0, 8).map(lambda x: x / 4)
    layers = []
    for i in range(n_layers):
        layer = {"name": f"l{i}", "fwd": [draw(num), draw(num)], "bwd": [draw(num), 2 * draw(num)],
                 "params": float(draw(st.integers(0, 64))), "act": float(draw(st.integers(0, 64))),
                 "out": float(draw(st.integers(0, 8))), "step": draw(num)}
        if draw(st.booleans()):
            layer["tp_share"] = [draw(st.sampled_from([0.0, 0.5, 0.75, 1.0])) for _ in range(3)]
        if draw(st.booleans()):
            layer["tp_comm"] = [float(draw(st.integers(0, 8))), float(draw(st.integers(0, 8)))]
        if draw(st.booleans()):
            layer["bwd_w"] = [layer["bwd"][0] / 2, layer["bwd"][1] / 4]
            layer["act_w"] = layer["act"] / 2
        layers.append(layer)
    graph = {"format": "pipeplan.graph/3", "name": "g", "input_bytes": float(draw(st.integers(0, 8))),
             "layers": layers}
    cluster = _cluster_dict([draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(24)])
    group_devices = []
    for gi in range(groups):  # replica 0 of group gi: server gi's devices 0-3; replica 1: server gi+1's 4-7
        t, r = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 2))
        devices = []
        for j in range(r):
            server = SERVERS[(gi + j) % 3][0]
            devices += [f"{server}d{4 * j + x}" for x in range(t)]
        group_devices.append((devices, t))
    batch = draw(st.integers(1, 6))
    bounds = sorted(draw(st.lists(st.integers(1, n_layers - 1), min_size=n_stages - 1, max_size=n_stages - 1,
                                  unique=True))) if n_stages > 1 else []
    edges = [0, *bounds, n_layers]
    shared_split = _split(draw, batch)
    stages = []
    for s in range(n_stages):
        g = s if s < groups else 2 * groups - 1 - s
        devices, t = group_devices[g]
        stage = {"layers": [edges[s], edges[s + 1]], "devices": devices, "recompute": draw(st.booleans()),
                 "microbatches": _split(draw, batch) if schedule == "gpipe" else shared_split}
        if t > 1 or draw(st.booleans()):
            stage["tensor_parallel"] = t
        if draw(st.booleans()):
            stage["zero"] = draw(st.integers(0, 2))
        stages.append(stage)
    plan = {"format": "pipeplan.plan/3", "graph": "g", "cluster": "c", "global_batch": batch,
            "state_factor": 4.0, "schedule": schedule, "stages": stages, "zero": draw(st.integers(0, 2))}
    if draw(st.booleans()):
        w, g = draw(st.sampled_from([(1.0, 1.0), (0.5, 1.0), (1.0, 2.0)]))
        plan["state"] = {"weights": w, "gradients": g, "optimizer": 4.0 - w - g}
    return graph, cluster, plan


def _split(draw, batch: int) -> list[int]:
    cuts = sorted(draw(st.lists(st.integers(1, batch - 1), unique=True, max_size=3))) if batch > 1 else []
    return [b - a for a, b in zip([0, *cuts], [*cuts, batch])]


def _close(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12 * max(1.0, scale))


class TestAgainstReference:
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(instances())
    def test_random_plans_agree(self, instance):
        graph_d, cluster_d, plan_d = instance
        graph = LayerGraph.from_dict(json.loads(json.dumps(graph_d)))
        cluster = Cluster.from_dict(json.loads(json.dumps(cluster_d)))
        plan = Plan.from_dict(json.loads(json.dumps(plan_d)))
        result = simulate(plan, graph, cluster)
        ref = reference(graph_d, cluster_d, plan_d, plan.programs())
        scale = result.iteration_time
        for op in result.ops:
            assert _close(op.end - op.start, ref["duration"][(op.stage, op.kind, op.microbatch)], scale), op
        for tr in result.transfers:
            assert _close(tr.end - tr.start, ref["transfer"][(tr.cut, tr.direction, tr.microbatch)], scale), tr
        assert len(result.transfers) == len(ref["transfer"])
        for group, ar, step, peak in zip(result.groups, ref["allreduce"], ref["step"], ref["peak"]):
            assert _close(group.allreduce, ar, scale) and _close(group.step, step, scale)
            assert _close(group.peak_memory, peak, peak)


# --------------------------------------------------------------------------- the worked example
@pytest.fixture(scope="module")
def result():
    """The worked example of section 8.5, simulated."""
    files = [str(EXAMPLES / f"tp.{kind}.json") for kind in ("graph", "cluster", "plan")]
    graph, cluster = load_graph(files[0]), load_cluster(files[1])
    return simulate(load_plan(files[2], graph, cluster), graph, cluster)


class TestWorkedExample:
    def test_numbers_of_section_8_5(self, result):
        assert result.iteration_time == pytest.approx(0.0182, rel=1e-12)
        assert result.throughput == pytest.approx(439.56, rel=1e-4)
        assert [g.allreduce for g in result.groups] == pytest.approx([0.0, 0.00102], rel=1e-12)
        assert [g.step for g in result.groups] == pytest.approx([0.0005, 0.0005], rel=1e-12)
        assert list(result.peak_memory) == pytest.approx([2.6e6, 2.9e6], rel=1e-12)
        stage0 = {op.label: (op.start, op.end) for op in result.ops if op.stage == 0}
        assert stage0["0F0"] == pytest.approx((0.0, 0.0019)) and stage0["0B1"] == pytest.approx((0.014, 0.0177))

    def test_the_table_shows_replicas_and_zero(self, run_cli):
        status, out, _ = run_cli("simulate", *(str(EXAMPLES / f"tp.{k}.json") for k in ("graph", "cluster", "plan")))
        assert status == 0 and "(g0,g1) zero 1" in out and "g2,g3 zero 2" in out and "18.2000 ms" in out

    def test_the_page_shows_the_example_files(self):
        text = (ROOT / "docs" / "model.md").read_text()
        for heading in ("## 8. Version 3", "### 8.1 Graph", "### 8.2 Plan", "### 8.3 Timing", "### 8.4 Memory",
                        "### 8.5 A worked example"):
            assert f"\n{heading}" in text, heading
        section = text[text.index("### 8.5"):]
        shown = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)[:3]]
        assert shown == [json.loads((EXAMPLES / f"tp.{k}.json").read_text()) for k in ("graph", "cluster", "plan")]
        for number in ("0.0182", "0.00102", "2600000.0, 2900000.0", "18.2 ms", "2.6 MB", "2.9 MB"):
            assert number in section


# --------------------------------------------------------------------------- neutral values change nothing
class TestNeutralFields:
    """A degree of 1, ZeRO 0 and layer fields that t = 1 ignores give today's numbers, bit for bit."""

    def test_explicit_defaults_equal_a_version_2_plan(self):
        graph = load_graph(str(EXAMPLES / "chain8.graph.json"))
        cluster = load_cluster(str(EXAMPLES / "two-servers.cluster.json"))
        for name in ("hetero", "interleaved", "custom"):
            data = json.loads((EXAMPLES / f"{name}.plan.json").read_text())
            try:
                base = simulate(Plan.from_dict(data), graph, cluster)
            except InputError:
                continue  # a plan made for another cluster
            data3 = json.loads(json.dumps(data))
            data3["format"] = "pipeplan.plan/3"
            data3["state"] = {"weights": 1, "gradients": 1, "optimizer": data["state_factor"] - 2}
            for st_ in data3["stages"]:
                st_.update(tensor_parallel=1, zero=0)
            graph3 = graph.to_dict()
            graph3["format"] = "pipeplan.graph/3"
            for layer in graph3["layers"]:
                layer.update(tp_share=[1.0, 1.0, 1.0], tp_comm=[1e9, 1e9])
            again = simulate(Plan.from_dict(data3), LayerGraph.from_dict(graph3), cluster)
            assert again.summary() == base.summary(), name
            assert [(o.start, o.end) for o in again.ops] == [(o.start, o.end) for o in base.ops]

    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(instances())
    def test_random_plans_at_degree_1_and_zero_0(self, instance):
        graph_d, cluster_d, plan_d = instance
        cluster = Cluster.from_dict(cluster_d)
        for st_ in plan_d["stages"]:
            st_.update(tensor_parallel=1, zero=0)
        plan_d["zero"] = 0
        plain_plan = json.loads(json.dumps(plan_d))
        plain_plan["format"] = "pipeplan.plan/2"
        plain_graph = json.loads(json.dumps(graph_d))
        plain_graph["format"] = "pipeplan.graph/2"
        neutral = simulate(Plan.from_dict(plan_d), LayerGraph.from_dict(graph_d), cluster)
        base = simulate(Plan.from_dict(plain_plan), LayerGraph.from_dict(plain_graph), cluster)
        assert neutral.summary() == base.summary()
        assert [(o.start, o.end) for o in neutral.ops] == [(o.start, o.end) for o in base.ops]

    def test_zero_on_one_replica_shards_nothing(self):
        graph, cluster = load_graph(str(EXAMPLES / "tp.graph.json")), load_cluster(str(EXAMPLES / "tp.cluster.json"))
        data = json.loads((EXAMPLES / "tp.plan.json").read_text())
        data["stages"][1]["devices"] = ["g2"]
        zero = simulate(Plan.from_dict(data), graph, cluster)
        data["stages"][1]["zero"] = 0
        assert simulate(Plan.from_dict(data), graph, cluster).peak_memory[1] == zero.peak_memory[1]


# --------------------------------------------------------------------------- formats
class TestFormats:
    def test_round_trip(self):
        for kind, load, cls in (("plan", load_plan, Plan), ("graph", load_graph, LayerGraph)):
            obj = load(str(EXAMPLES / f"tp.{kind}.json"))
            data = obj.to_dict()
            assert data["format"].endswith("/3")
            assert cls.from_dict(json.loads(json.dumps(data))).to_dict() == data
        plan = load_plan(str(EXAMPLES / "tp.plan.json"))
        assert plan.stages[0].tensor_parallel == 2 and plan.stages[0].replicas == 1
        assert plan.stages[1].zero == 2 and plan.zero == 1 and plan.state == (1.0, 1.0, 2.0)

    def test_written_as_version_2_without_version_3_fields(self):
        data = json.loads((EXAMPLES / "tp.plan.json").read_text())
        for st_ in data["stages"]:
            st_.pop("tensor_parallel", None)
            st_.pop("zero", None)
        data.pop("state"), data.pop("zero")
        assert Plan.from_dict(data).to_dict()["format"] == "pipeplan.plan/1"

    def test_earlier_versions_ignore_the_fields(self):
        data = json.loads((EXAMPLES / "tp.plan.json").read_text())
        data["format"] = "pipeplan.plan/2"
        plan = Plan.from_dict(data)
        assert plan.stages[0].tensor_parallel == 1 and plan.stages[0].replicas == 2 and plan.zero == 0
        assert plan.stages[0].extra == {"tensor_parallel": 2} and plan.extra["zero"] == 1
        graph = json.loads((EXAMPLES / "tp.graph.json").read_text())
        graph["format"] = "pipeplan.graph/2"
        layer = LayerGraph.from_dict(graph).layers[0]
        assert layer.tp_share is None and layer.extra["tp_share"] == [0.8, 1.0, 0.5]

    def test_schema_accepts_the_example(self):
        jsonschema = pytest.importorskip("jsonschema")
        from pipeplan.schema_files import schema

        for kind in ("plan", "graph"):
            jsonschema.Draft202012Validator(schema(kind)).validate(json.loads((EXAMPLES / f"tp.{kind}.json").read_text()))


# --------------------------------------------------------------------------- refusals
def _plan_with(change) -> dict:
    data = json.loads((EXAMPLES / "tp.plan.json").read_text())
    change(data)
    return data


def _three_devices(data: dict) -> None:
    data["stages"][0]["devices"] = ["g0", "g1", "g2"]
    data["stages"][1]["devices"] = ["g3"]


class TestRefusals:
    @pytest.mark.parametrize("change, where, what", [
        (lambda d: d["stages"][0].update(tensor_parallel=0), "stages[0].tensor_parallel", "at least 1"),
        (lambda d: d["stages"][0].update(tensor_parallel=3), "stages[0].devices",
         "stage 0 lists 2 devices, not a multiple of its tensor_parallel 3"),
        (_three_devices, "stages[0].devices", "3 devices, not a multiple of its tensor_parallel 2"),
        (lambda d: d.update(zero=3), "zero", "at most 2"),
        (lambda d: d["stages"][1].update(zero="1"), "stages[1].zero", "integer"),
        (lambda d: d.update(state={"weights": 1, "gradients": 1, "optimizer": 3}), "state",
         "= 5, but state_factor is 4"),
        (lambda d: d.update(state={"weights": 1, "gradients": 1, "moments": 2}), "state.moments", "unknown part"),
        (lambda d: (d.pop("state"), d.update(state_factor=1.5)), "state", "state_factor is 1.5 < 2"),
    ])
    def test_bad_plan(self, change, where, what):
        with pytest.raises(InputError) as info:
            Plan.from_dict(_plan_with(change), "p.json")
        assert info.value.where == where and what in info.value.what, info.value.what

    def test_replica_across_servers(self, tmp_path):
        cluster = json.loads((EXAMPLES / "tp.cluster.json").read_text())
        cluster["servers"].append({"id": "s1", "bandwidth": 1e9, "latency": 1e-5})
        cluster["devices"][1]["server"] = "s1"
        with pytest.raises(InputError) as info:
            Plan.from_dict(_plan_with(lambda d: None), "p.json").validate(
                load_graph(str(EXAMPLES / "tp.graph.json")), Cluster.from_dict(cluster), "p.json")
        assert info.value.where == "stages[0].devices"
        assert "replica 0 of stage 0 (g0, g1, devices 0 to 1 of its list) spans servers s0, s1" in info.value.what

    def test_group_stages_split_alike(self):
        data = json.loads((EXAMPLES / "tp.plan.json").read_text())
        data.update(schedule="zbv", stages=[
            {"layers": [0, 1], "devices": ["g0", "g1"], "tensor_parallel": 2, "microbatches": [8],
             "recompute": False},
            {"layers": [1, 2], "devices": ["g1", "g0"], "microbatches": [8], "recompute": False}])
        with pytest.raises(InputError) as info:
            Plan.from_dict(data, "p.json")
        assert info.value.where == "stages[1].tensor_parallel" and "shares its device group with stage 0" in \
            info.value.what

    @pytest.mark.parametrize("field, value, where, what", [
        ("tp_share", [0.5, 1.5, 0.0], "layers[0].tp_share[1]", "between 0 and 1"),
        ("tp_share", [0.5, 1.0], "layers[0].tp_share", "expected 3 numbers"),
        ("tp_comm", [-1, 0], "layers[0].tp_comm[0]", "must not be negative"),
    ])
    def test_bad_graph(self, field, value, where, what):
        data = json.loads((EXAMPLES / "tp.graph.json").read_text())
        data["layers"][0][field] = value
        with pytest.raises(InputError) as info:
            LayerGraph.from_dict(data, "g.json")
        assert info.value.where == where and what in info.value.what, info.value.what

    def test_cli_says_one_line(self, run_cli, tmp_path):
        bad = tmp_path / "p.json"
        bad.write_text(json.dumps(_plan_with(_three_devices)))
        status, out, err = run_cli("simulate", str(EXAMPLES / "tp.graph.json"), str(EXAMPLES / "tp.cluster.json"),
                                   str(bad))
        assert status == 2 and out == "" and err.count("\n") == 1
        assert err.startswith(f"error: {bad}: stages[0].devices: stage 0 lists 3 devices")

    def test_consumers_without_tensor_parallelism_refuse(self):
        # the exports, pipeplan run and --warm-start call refuse_tensor_parallel with their names
        plan = load_plan(str(EXAMPLES / "tp.plan.json"))
        with pytest.raises(InputError) as info:
            plan.refuse_tensor_parallel("p.json", "the torch export")
        assert info.value.where == "stages" and info.value.what.startswith(
            "stage 0 has tensor_parallel 2, but the torch export takes only tensor_parallel 1 and zero 0")
        zero_only = Plan.from_dict(_plan_with(lambda d: d["stages"][0].pop("tensor_parallel")))
        assert zero_only.tensor_parallel_uses() == ["stage 0 has zero 1", "stage 1 has zero 2"]
        load_plan(str(EXAMPLES / "hetero.plan.json")).refuse_tensor_parallel("p.json", "x")  # nothing to refuse
        with pytest.raises(ValueError, match="simulate"):
            Candidate.from_plan(plan)


class TestBatched:
    def test_version_3_plans_take_the_scalar_simulator(self):
        graph, cluster = load_graph(str(EXAMPLES / "tp.graph.json")), load_cluster(str(EXAMPLES / "tp.cluster.json"))
        plan = load_plan(str(EXAMPLES / "tp.plan.json"), graph, cluster)
        plain = Plan.from_dict(_plan_with(lambda d: (d.pop("zero"), d.pop("state"), d["stages"][0].pop(
            "tensor_parallel"), d["stages"][1].pop("zero"))))
        out = simulate_batch([plan, plain], graph, cluster)
        assert out.iteration_time.tolist() == [simulate(p, graph, cluster).iteration_time for p in (plan, plain)]
        assert out.peak_memory[0] == 2.9e6 and not out.batched[0]
