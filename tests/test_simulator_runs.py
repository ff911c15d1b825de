"""The order a plan structure's wiring keeps (``Wiring.compiled_runs``) times later plans exactly as the sweep does.

The first timeline of a structure sweeps the groups and its wiring keeps the order the
actions ran in; later timelines of that structure, whatever their durations, run in that
order without checking arrivals.  Both must give every number bit for bit.
"""

import json
from dataclasses import replace

import pytest

from conftest import chain, cluster, plan
from golden import GOLDEN, record
from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.evaluation import simulator
from pipeplan.solver.evaluation.simulator import SEVERAL, plan_costs, plan_wiring, run_programs, simulate
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan

CASES = json.loads(GOLDEN.read_text())["cases"]


def _numbers(result) -> tuple:
    return (result.iteration_time, result.starts, result.ends, result.transfer_starts, result.arrivals,
            result.peak_memory)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c['kind']}-{i}" for i, c in enumerate(CASES)])
def test_the_golden_numbers_from_the_kept_order(index):
    case = CASES[index]
    plan, graph = Plan.from_dict(case["plan"]), LayerGraph.from_dict(case["graph"])
    cluster = Cluster.from_dict(case["cluster"])
    simulator._WIRINGS.clear()
    assert plan_wiring(plan).compiled_runs() is None
    for _ in range(3):  # the sweep (keeps the order), then the kept order compiled, then reused
        got = record(plan, graph, cluster)
        for field, want in case["expected"].items():
            assert got[field] == want, f"{case['kind']} case {index}: {field} differs"
    assert plan_wiring(plan).compiled_runs() is not None


@pytest.mark.parametrize("index", range(0, len(CASES), 3))
def test_an_order_kept_for_other_durations(index):
    """A structure's order, kept from one plan, times a plan of other layers, devices and recompute flags."""
    case = CASES[index]
    plan, graph = Plan.from_dict(case["plan"]), LayerGraph.from_dict(case["graph"])
    cluster = Cluster.from_dict(case["cluster"])
    other = replace(plan, stages=tuple(replace(st, recompute=not st.recompute) for st in plan.stages))
    if len(plan.stages) > 1 and plan.stages[0].layers[1] - plan.stages[0].layers[0] > 1:  # move the first cut
        first, second = other.stages[0], other.stages[1]
        cut = first.layers[1] - 1
        other = replace(other, stages=(replace(first, layers=(first.layers[0], cut)),
                                       replace(second, layers=(cut, second.layers[1])), *other.stages[2:]))
    simulator._WIRINGS.clear()
    fresh = _numbers(simulate(other, graph, cluster))  # swept
    simulator._WIRINGS.clear()
    for _ in range(2):
        simulate(plan, graph, cluster)  # the order kept, then compiled
    assert plan_wiring(other) is plan_wiring(plan)
    assert plan_wiring(plan).compiled_runs() is not None
    assert _numbers(simulate(other, graph, cluster)) == fresh
    assert _numbers(run_programs(plan_costs(other, graph, cluster, cache={}))) == fresh


@pytest.mark.parametrize("schedule, splits", [("gpipe", [(1, 3, 2, 2), (4, 4), (2, 2, 1, 3)]),
                                              ("1f1b", [(2, 2, 2, 2)] * 3)])
def test_queued_transfers_and_several_inputs(schedule, splits):
    """Transfers wait for their link (slower than the stages), microbatches wait for several of the last stage's."""
    graph, slow = chain(6, out=4.0), cluster(4, bandwidth=0.5, network_bw=0.5, servers=2)
    devices = [["d0", "d3"], ["d1"], ["d2"]]
    p = plan([(2 * s, 2 * s + 2, devices[s], split) for s, split in enumerate(splits)], batch=8, schedule=schedule)
    simulator._WIRINGS.clear()
    swept = simulate(p, graph, slow)
    ends = {(op.stage, op.kind, op.microbatch): op.end for op in swept.ops}
    assert any(t.start > ends[(t.cut, "F", t.microbatch)] for t in swept.transfers if t.direction == "fwd")
    for _ in range(2):
        assert _numbers(simulate(p, graph, slow)) == _numbers(swept)
    wiring = plan_wiring(p)
    assert wiring.compiled_runs() is not None
    assert schedule == "1f1b" or any(w == SEVERAL for waits in wiring.waits for w in waits)


def test_a_deadlock_keeps_no_order():
    """A structure that deadlocks is swept (and reported) on every call."""
    bad = plan([(0, 1, ["d0"], [1, 1, 1, 1]), (1, 2, ["d1"], [4])], batch=4, schedule="1f1b")
    simulator._WIRINGS.clear()
    errors = []
    for _ in range(2):
        with pytest.raises(DeadlockError) as info:
            simulate(bad, chain(2), cluster(2), file="p.json")
        errors.append((info.value.file, info.value.where, info.value.what))
    assert errors[0] == errors[1] and errors[0][:2] == ("p.json", "stages[0].ops[2]")
    assert plan_wiring(bad).compiled_runs() is None
