"""Property tests: random valid plans against an independent reference.

The reference below re-derives every duration from the spec's formulas and times the
plan as a longest path through a networkx DAG of ops and transfers, a different
algorithm from the simulator's sweep.  Both must agree on every random plan, deadlock
included (a cycle in the DAG).
"""

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.evaluation.simulator import check_deadlock_free, simulate

costs = st.tuples(st.integers(0, 5), st.integers(0, 5)).map(lambda t: (t[0] / 4, t[1] / 4))


@st.composite
def instances(draw):
    n_layers = draw(st.integers(1, 7))
    layers = [Layer(f"l{i}", draw(costs), draw(costs), float(draw(st.integers(0, 100))),
                    float(draw(st.integers(0, 100))), float(draw(st.integers(0, 20)))) for i in range(n_layers)]
    pairs = [(u, v) for u in range(n_layers) for v in range(u + 2, n_layers)]
    skips = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=3)) if pairs else []
    graph = LayerGraph("g", layers, [(i, i + 1) for i in range(n_layers - 1)] + skips, float(draw(st.integers(0, 9))))
    n_dev = draw(st.integers(1, 6))
    servers = draw(st.integers(1, 2))
    cluster = Cluster(
        "c",
        tuple(Link(float(draw(st.sampled_from([1, 4, 16]))), draw(st.sampled_from([0.0, 0.25])), f"s{j}")
              for j in range(servers)),
        Link(float(draw(st.sampled_from([1, 2]))), draw(st.sampled_from([0.0, 0.5]))),
        tuple(Device(f"d{i}", f"s{draw(st.integers(0, servers - 1))}", draw(st.sampled_from([0.5, 1.0, 2.0])),
                     float(draw(st.integers(0, 2000)))) for i in range(n_dev)),
    )
    n_stages = draw(st.integers(min(2, n_layers, n_dev), min(n_layers, n_dev)))
    cuts = sorted(draw(st.lists(st.integers(1, n_layers - 1), unique=True, min_size=n_stages - 1,
                                max_size=n_stages - 1))) if n_stages > 1 else []
    bounds = list(zip([0] + cuts, cuts + [n_layers]))
    order = draw(st.permutations([d.id for d in cluster.devices]))
    extra = draw(st.lists(st.integers(0, n_stages - 1), max_size=n_dev - n_stages))
    groups = [[order[s]] for s in range(n_stages)]
    for i, s in enumerate(extra):
        groups[s].append(order[n_stages + i])
    batch = draw(st.integers(1, 8))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "custom"]))
    stages = []
    for s, ((lo, hi), devs) in enumerate(zip(bounds, groups)):
        split = _composition(draw, batch)
        ops = _random_ops(draw, len(split)) if schedule == "custom" else None
        stages.append(Stage((lo, hi), tuple(devs), split, draw(st.booleans()), ops))
    plan = Plan("g", "c", batch, float(draw(st.sampled_from([0, 1, 4]))), schedule, tuple(stages))
    return graph, cluster, plan


def _composition(draw, total):
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    edges = [0] + cuts + [total]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def _random_ops(draw, m):
    pending_f, open_b, ops = list(range(m)), [], []
    while pending_f or open_b:
        choices = [("F", k) for k in pending_f] + [("B", k) for k in open_b]
        kind, k = draw(st.sampled_from(choices))
        (pending_f if kind == "F" else open_b).remove(k)
        if kind == "F":
            open_b.append(k)
        ops.append(f"{kind}{k}")
    return tuple(ops)


# ---------------------------------------------------------------- the reference
def spec_ops(plan, s):
    """Stage ``s``'s ``(kind, k)`` list as the spec (section 3) writes it, or as the plan lists it."""
    st_, S = plan.stages[s], len(plan.stages)
    m = len(st_.microbatches)
    if plan.schedule == "custom":
        return [(o[0], int(o[1:])) for o in st_.ops]
    w = m if plan.schedule == "gpipe" else min(S - 1 - s, m)
    ops = [("F", k) for k in range(w)]
    for i in range(m - w):
        ops += [("F", w + i), ("B", i)]
    return ops + [("B", k) for k in range(m - w, m)]


def reference(graph, cluster, plan):
    """(iteration time, peak memory per stage), or None on a deadlock."""
    S = len(plan.stages)
    dag, dur = nx.DiGraph(), {}
    ops_of, last_op, allreduce, peaks = [], [], [], []
    for s, st_ in enumerate(plan.stages):
        ops = spec_ops(plan, s)
        ops_of.append(ops)
        lo, hi = st_.layers
        r = len(st_.devices)
        v = min(cluster.device_index[d].speed for d in st_.devices)
        for p, (kind, k) in enumerate(ops):
            q = math.ceil(st_.microbatches[k] / r)
            tf = sum((L.fwd[0] + L.fwd[1] * q) / v for L in graph.layers[lo:hi])
            tb = sum((L.bwd[0] + L.bwd[1] * q) / v for L in graph.layers[lo:hi]) + (tf if st_.recompute else 0)
            dur[("op", s, p)] = tf if kind == "F" else tb
            dag.add_node(("op", s, p))
            if p:
                dag.add_edge(("op", s, p - 1), ("op", s, p))
        last_op.append(("op", s, len(ops) - 1))
        P = sum(L.params for L in graph.layers[lo:hi])
        allreduce.append(2 * (r - 1) * (cluster.lat(st_.devices) + P / (r * cluster.bw(st_.devices))) if r > 1 else 0)
        peaks.append(_peak(graph, plan, s, ops))
    for c in range(S - 1):
        a, b = plan.stages[c], plan.stages[c + 1]
        cut = sum(graph.layers[u].out for u in range(a.layers[1])
                  if any(x == u and y >= a.layers[1] for x, y in graph.edges))
        lat, bw = cluster.lat(a.devices, b.devices), cluster.bw(a.devices, b.devices)
        rate = min(len(a.devices), len(b.devices)) * bw
        _link(dag, dur, ops_of[c], c, "F", a, b, c + 1, lat, cut, rate)
        _link(dag, dur, ops_of[c + 1], c + 1, "B", b, a, c, lat, cut, rate)
    try:
        order = list(nx.topological_sort(dag))
    except nx.NetworkXUnfeasible:
        return None
    end = {}
    for node in order:
        start = max((end[u] for u in dag.predecessors(node)), default=0.0)
        end[node] = start + dur[node]
    return max(end[n] + ar for n, ar in zip(last_op, allreduce)), peaks


def _link(dag, dur, sender_ops, s, kind, sender, receiver, r_stage, lat, cut, rate):
    """Transfers of ``sender`` stage s's ``kind`` ops, FIFO, into overlapping receiver ops."""
    previous = None
    for p, (op_kind, j) in enumerate(sender_ops):
        if op_kind != kind:
            continue
        node = ("tx", kind, s, j)
        dur[node] = lat + sender.microbatches[j] * cut / rate
        dag.add_edge(("op", s, p), node)
        if previous is not None:
            dag.add_edge(previous, node)
        previous = node
    # edges into the receiver: every receiver op of the same kind overlapping samples
    for p2, k in _receiver_ops(r_stage, kind):
        k_lo, k_hi = sum(receiver.microbatches[:k]), sum(receiver.microbatches[:k + 1])
        for j in range(len(sender.microbatches)):
            j_lo, j_hi = sum(sender.microbatches[:j]), sum(sender.microbatches[:j + 1])
            if j_lo < k_hi and k_lo < j_hi:
                dag.add_edge(("tx", kind, s, j), ("op", r_stage, p2))


_OPS = {}  # stage -> its op list, set by run_reference


def _receiver_ops(s, kind):
    return [(p, k) for p, (kd, k) in enumerate(_OPS[s]) if kd == kind]


def _peak(graph, plan, s, ops):
    st_ = plan.stages[s]
    lo, hi = st_.layers
    r = len(st_.devices)
    A = sum(L.act for L in graph.layers[lo:hi])
    I = graph.input_bytes if lo == 0 else sum(
        graph.layers[u].out for u in range(lo) if any(x == u and y >= lo for x, y in graph.edges))
    per = A if not st_.recompute else I
    stash = peak = 0.0
    for kind, k in ops:
        q = math.ceil(st_.microbatches[k] / r)
        if kind == "F":
            stash += q * per
            peak = max(peak, stash)
        else:
            peak = max(peak, stash + (q * A if st_.recompute else 0))
            stash -= q * per
    return plan.state_factor * sum(L.params for L in graph.layers[lo:hi]) + peak


def run_reference(graph, cluster, plan):
    _OPS.clear()
    for s in range(len(plan.stages)):
        _OPS[s] = spec_ops(plan, s)
    return reference(graph, cluster, plan)


# ---------------------------------------------------------------- properties
class TestSimulateProperties:
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(instances())
    def test_agrees_with_the_longest_path_reference(self, instance):
        graph, cluster, plan = instance
        expected = run_reference(graph, cluster, plan)
        if expected is None:
            with pytest.raises(DeadlockError):
                simulate(plan, graph, cluster)
            with pytest.raises(DeadlockError):
                check_deadlock_free(plan)
            return
        result = simulate(plan, graph, cluster)
        check_deadlock_free(plan)
        T, peaks = expected
        assert result.iteration_time == pytest.approx(T, rel=1e-9, abs=1e-12)
        assert result.peak_memory == pytest.approx(peaks, rel=1e-9)

    @settings(max_examples=200, deadline=None)
    @given(instances())
    def test_never_crashes_and_is_at_least_the_busiest_stage(self, instance):
        graph, cluster, plan = instance
        try:
            result = simulate(plan, graph, cluster)
        except DeadlockError:
            assert plan.schedule != "gpipe", "GPipe runs every forward first: it cannot deadlock"
            return
        for busy, cost in zip(result.busy, result.groups):
            assert result.iteration_time >= busy + cost.allreduce - 1e-9
        assert result.fits == all(p <= c.capacity for p, c in zip(result.peak_memory, result.groups))
        if result.iteration_time > 0:
            assert result.throughput == pytest.approx(plan.global_batch / result.iteration_time)
        for op in result.ops:
            assert 0 <= op.start <= op.end <= result.iteration_time + 1e-9
