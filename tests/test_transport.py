"""The rank-driven TCP transport (``pipeplan.runtime.transport``), between threads of one process.

Each thread plays one rank with its own :class:`TcpTransport`; the ranks publish
their listening addresses through a shared list, as ``dist.all_gather_object``
does between processes.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pipeplan.runtime.gradsync import links
from pipeplan.runtime.transport import TcpTransport
from pipeplan.runtime.worker import check_spin

KEY = ("fwd",)
OTHER = ("bwd",)


def make_pair(keys=(KEY,), timeout: float = 10.0, spin: float = 0.0) -> list[TcpTransport]:
    """Two connected transports, one per rank, with a link per key."""
    addresses: list = [None, None]
    published = threading.Barrier(2)
    made: list = [None, None]
    errors: list = []

    def gather(rank):
        def exchange(obj):
            addresses[rank] = obj
            published.wait()
            return list(addresses)
        return exchange

    def build(rank):
        try:
            made[rank] = TcpTransport(rank, [(key, 0, 1) for key in keys], gather(rank), timeout=timeout,
                                      spin=spin)
        except Exception as exc:  # surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and all(made), errors
    return made


def run_both(first, second) -> None:
    """Run the two ranks' parts at the same time; re-raise what either raised."""
    errors: list = []

    def guard(fn):
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(fn,)) for fn in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still blocked"
    if errors:
        raise errors[0]


class TestTcpTransport:
    def test_messages_match_in_posting_order(self):
        a, b = make_pair()
        sent = [torch.arange(n, dtype=torch.float32) for n in (1, 5, 1000)]
        got = [torch.empty(n, dtype=torch.float32) for n in (1, 5, 1000)]

        def rank0():
            works = [a.isend(t, 1, KEY, tag=i) for i, t in enumerate(sent)]
            for w in works:
                w.wait()

        def rank1():
            works = [b.irecv(t, 0, KEY, tag=i) for i, t in enumerate(got)]
            for w in reversed(works):  # waiting on the last one moves the earlier ones too
                w.wait()

        run_both(rank0, rank1)
        for s, g in zip(sent, got):
            assert torch.equal(s, g)

    def test_large_messages_both_ways_at_once_do_not_block(self):
        # 32 MB each way: far more than the socket buffers, so both sends stay pending
        # and must progress while each rank waits for its own receive.
        a, b = make_pair()
        big = 8 << 20
        out0, out1 = torch.randn(big), torch.randn(big)
        in0, in1 = torch.empty(big), torch.empty(big)

        def rank(me, transport, out, into):
            def part():
                recv = transport.irecv(into, 1 - me, KEY)
                send = transport.isend(out, 1 - me, KEY)
                recv.wait()
                send.wait()
            return part

        run_both(rank(0, a, out0, in0), rank(1, b, out1, in1))
        assert torch.equal(in0, out1) and torch.equal(in1, out0)

    def test_keys_are_separate_streams(self):
        # Rank 0 posts OTHER's message first; rank 1 waits for KEY's first.  One stream
        # per key, so neither waits for the other.
        a, b = make_pair((KEY, OTHER))
        x, y = torch.tensor([1.0]), torch.tensor([2.0])
        gx, gy = torch.empty(1), torch.empty(1)

        def rank0():
            for w in (a.isend(y, 1, OTHER), a.isend(x, 1, KEY)):
                w.wait()

        def rank1():
            b.irecv(gx, 0, KEY).wait()
            b.irecv(gy, 0, OTHER).wait()

        run_both(rank0, rank1)
        assert gx.item() == 1.0 and gy.item() == 2.0

    def test_a_polling_wait_gets_the_same_messages(self):
        a, b = make_pair(spin=0.05)
        got = torch.empty(3)

        def rank0():
            time.sleep(0.1)  # longer than the poll: the receiver polls, then sleeps in select
            a.isend(torch.tensor([1.0, 2.0, 3.0]), 1, KEY).wait()

        run_both(rank0, lambda: b.irecv(got, 0, KEY).wait())
        assert got.tolist() == [1.0, 2.0, 3.0]

    def test_a_message_reports_its_cpu_time_without_the_wait(self):
        a, b = make_pair()
        got = torch.empty(1000)
        work: list = []

        def rank0():
            time.sleep(0.2)
            a.isend(torch.ones(1000), 1, KEY).wait()

        def rank1():
            work.append(b.irecv(got, 0, KEY))
            work[0].wait()

        run_both(rank0, rank1)
        assert 0 < work[0].cpu < 0.1  # the 0.2 s wait is not in it

    def test_any_dtype_and_shape(self):
        a, b = make_pair()
        sent = torch.arange(12, dtype=torch.int64).reshape(3, 4)
        got = torch.empty(3, 4, dtype=torch.int64)
        run_both(lambda: a.isend(sent, 1, KEY).wait(), lambda: b.irecv(got, 0, KEY).wait())
        assert torch.equal(sent, got)

    def test_mismatched_tag_is_an_error_naming_both(self):
        a, b = make_pair()
        with pytest.raises(RuntimeError, match="expected tag 2 with 4 bytes, got tag 1 with 4 bytes"):
            run_both(lambda: a.isend(torch.zeros(1), 1, KEY, tag=1).wait(),
                     lambda: b.irecv(torch.empty(1), 0, KEY, tag=2).wait())

    def test_mismatched_size_is_an_error(self):
        a, b = make_pair()
        got = torch.full((2,), 7.0)
        with pytest.raises(RuntimeError, match="wrong size from rank 0.*4 bytes sent, 8 bytes expected"):
            run_both(lambda: a.isend(torch.zeros(1), 1, KEY).wait(),
                     lambda: b.irecv(got, 0, KEY).wait())
        assert got.tolist() == [7.0, 7.0]  # the header is checked before any byte lands

    def test_closed_peer_is_a_connection_error(self):
        a, b = make_pair()
        a.close()
        with pytest.raises(ConnectionError, match="rank 0 closed its connection"):
            b.irecv(torch.empty(1), 0, KEY).wait()

    def test_silent_peer_times_out_naming_it(self):
        a, b = make_pair(timeout=0.3)
        with pytest.raises(TimeoutError, match=r"no progress for 0.3 s waiting on rank 0"):
            b.irecv(torch.empty(1), 0, KEY).wait()

    def test_unknown_link_and_non_contiguous_tensors_are_refused(self):
        a, _ = make_pair()
        with pytest.raises(RuntimeError, match="no link"):
            a.isend(torch.zeros(1), 1, OTHER)
        with pytest.raises(ValueError, match="contiguous CPU tensors"):
            a.isend(torch.zeros(4, 4).t(), 1, KEY)


class TestLinks:
    def test_cuts_pair_the_two_stages_and_only_two_member_groups_get_links(self):
        from pipeplan.solver.formats.plan import Plan, Stage

        plan = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 1), ("d0",), (4,)), Stage((1, 2), ("d1", "d2"), (4,)),
                                               Stage((2, 3), ("d3", "d4", "d5"), (4,))))
        members = {(0, "fwd"): [0, 1, 2], (1, "bwd"): [1, 2, 3, 4, 5], ("stage", 1): [2, 1],
                   ("stage", 2): [3, 4, 5]}
        assert links(members, plan) == [((0, "fwd"), 0, 1), ((0, "fwd"), 0, 2)] + \
            [((1, "bwd"), a, b) for a in (1, 2) for b in (3, 4, 5)] + [(("stage", 1), 1, 2)]


class TestCheckSpin:
    def test_seconds(self):
        assert check_spin("0") == 0.0 and check_spin("0.005") == 0.005

    @pytest.mark.parametrize("bad", ["x", "-1", "nan", "inf"])
    def test_bad_values_are_refused(self, bad):
        from pipeplan.models.errors import InputError

        with pytest.raises(InputError, match="--spin"):
            check_spin(bad)
