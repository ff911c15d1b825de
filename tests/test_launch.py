"""The local launcher's watchdog (:func:`pipeplan.runtime.launch.launch_local`): start-up and hangs.

The workers here are small Python drivers that write heartbeats as the real worker does,
so the watchdog's timing is tested without torch or a process group.
"""

from __future__ import annotations

import time

import pytest

from pipeplan.runtime.launch import WorkerError, launch_local

# Rank 0 beats at once and then waits (as a rank blocked in init_process_group does); rank 1
# beats only after SLOW seconds (as a rank still importing torch on a busy machine does).
DRIVER = """
import os, sys, time
from pipeplan.runtime.heartbeat import Heartbeat
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
slow, then = float(sys.argv[1]), sys.argv[2]
if rank == 1:
    time.sleep(slow)
beat = Heartbeat(rank, world)
beat(-1, 0)
if then == "finish":
    time.sleep(slow + 0.5 if rank == 0 else 0.5)
else:  # freeze: no more beats, for longer than any timeout of these tests
    time.sleep(60)
"""


def _launch(tmp_path, slow: float, then: str, *, timeout: float, startup_timeout: float = 120.0) -> float:
    started = time.monotonic()
    launch_local([str(slow), then], 2, tmp_path, timeout=timeout, describe=lambda rank: f"worker {rank}",
                 entry=["-c", DRIVER], startup_timeout=startup_timeout)
    return time.monotonic() - started


class TestLaunchLocal:
    def test_slow_start_is_not_a_hang(self, tmp_path):
        # Rank 1's first beat comes 3 s after launch, rank 0 made no progress for 3 s by then:
        # neither counts as hung with a 1 s timeout, because the hang clock starts at rank 1's beat.
        assert _launch(tmp_path, 3.0, "finish", timeout=1.0) >= 3.0

    def test_a_hang_after_start_is_found(self, tmp_path):
        started = time.monotonic()
        with pytest.raises(WorkerError, match=r"made no progress for 1 s \(setting up\); presumed hung"):
            _launch(tmp_path, 0.0, "freeze", timeout=1.0)
        assert time.monotonic() - started < 30

    def test_a_worker_that_never_beats_is_reported_as_not_started(self, tmp_path):
        with pytest.raises(WorkerError, match=r"rank 1 \(worker 1\): did not start within 2 s of launch") as err:
            _launch(tmp_path, 30.0, "finish", timeout=1.0, startup_timeout=2.0)
        assert err.value.rank == 1
