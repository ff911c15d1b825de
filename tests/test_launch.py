"""The local launcher's watchdog (:func:`pipeplan.runtime.launch.launch_local`): start-up and hangs.

The workers here are small Python drivers that write heartbeats as the real worker does,
so the watchdog's timing is tested without torch or a process group.
"""

from __future__ import annotations

import time

import pytest

from pipeplan.runtime.launch import WorkerError, launch_local

# Rank 0 beats at once and then waits for rank 1 without a beat (as a rank blocked in
# init_process_group does); rank 1 beats only after SLOW seconds (as a rank still importing torch
# on a busy machine does).  Both then set up for SETUP seconds without a beat (the model, the
# rendezvous) and begin training.
DRIVER = """
import os, sys, time
from pipeplan.runtime.heartbeat import Heartbeat
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
slow, then, setup = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
if rank == 1:
    time.sleep(slow)
beat = Heartbeat(rank, world)
beat(-1, 0)
if then == "freeze-setting-up":  # no more beats, for longer than any allowance of these tests
    time.sleep(60)
time.sleep(setup + (slow if rank == 0 else 0.0))
beat(0, 0)  # training
if then == "finish":
    time.sleep(0.2)
else:  # freeze in training: no more beats, for longer than any timeout of these tests
    time.sleep(60)
"""


def _launch(tmp_path, slow: float, then: str, *, timeout: float, startup_timeout: float = 120.0,
            setup: float = 0.0) -> float:
    started = time.monotonic()
    launch_local([str(slow), then, str(setup)], 2, tmp_path, timeout=timeout, describe=lambda rank: f"worker {rank}",
                 entry=["-c", DRIVER], startup_timeout=startup_timeout)
    return time.monotonic() - started


class TestLaunchLocal:
    def test_slow_start_is_not_a_hang(self, tmp_path):
        # Rank 1's first beat comes 3 s after launch, rank 0 made no progress for 3 s by then:
        # neither counts as hung with a 1 s timeout, which is for training.
        assert _launch(tmp_path, 3.0, "finish", timeout=1.0) >= 3.0

    def test_a_slow_set_up_is_not_a_hang(self, tmp_path):
        # 2 s without a beat while setting up (what a busy machine makes of the model and the
        # rendezvous): the set-up allowance, not the 1 s timeout of training, applies
        _launch(tmp_path, 0.0, "finish", timeout=1.0, setup=2.0)

    def test_a_hang_in_training_is_found(self, tmp_path):
        # raised by the watchdog, not by the drivers' exit after their 60 s: found, not waited out
        with pytest.raises(WorkerError, match=r"made no progress for 1 s \(step 0, op 0, working\); presumed hung"):
            _launch(tmp_path, 0.0, "freeze", timeout=1.0)

    def test_a_hang_while_setting_up_is_found_after_the_set_up_allowance(self, tmp_path):
        with pytest.raises(WorkerError, match=r"made no progress for 2 s \(setting up\); presumed hung"):
            _launch(tmp_path, 0.0, "freeze-setting-up", timeout=1.0, startup_timeout=2.0)

    def test_a_worker_that_never_beats_is_reported_as_not_started(self, tmp_path):
        with pytest.raises(WorkerError, match=r"rank 1 \(worker 1\): did not start within 2 s of launch") as err:
            _launch(tmp_path, 30.0, "finish", timeout=1.0, startup_timeout=2.0)
        assert err.value.rank == 1
