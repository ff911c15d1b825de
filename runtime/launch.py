"""Start one worker process per device on this machine, over loopback, and watch them.

Each worker runs ``python -m pipeplan.runtime.worker`` with the environment ``torchrun`` would
give it.  The launcher is their watchdog:

- a worker that exits with an error or a signal stops the run at once;
- once every worker trains, a worker whose heartbeat (:mod:`pipeplan.runtime.heartbeat`)
  stands still for ``timeout`` seconds is hung: the rank named is the one that stopped
  on its own, not one merely blocked waiting for it (:func:`_hang_key`);
- setting up is not training: a worker's first beat comes after Python has imported
  torch, and building the model and meeting the other ranks follow, each taking seconds
  on a busy machine while the ranks that got there first wait without progress.  Until
  every worker trains, each may go ``startup_timeout`` seconds between beats (and one
  that has not beaten ``startup_timeout`` seconds after launch is reported as not
  started), so that ``timeout`` can be short without a slow start reading as a hang;
- every worker is killed when the run ends, however it ends (each runs in its own
  session, is killed by process group, and dies with the launcher through
  ``PR_SET_PDEATHSIG`` should the launcher itself be killed).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from pipeplan.runtime import heartbeat

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 120.0
"""Seconds a worker may take from launch to its first heartbeat (starting Python, importing torch), and
between two beats while setting up (building the model, the rendezvous, the connections)."""
SETTING_UP = -1
"""The heartbeat's step while a worker sets up (see :class:`pipeplan.runtime.heartbeat.Beat`)."""
_PEER_ERRORS = ("connection", "gloo", "timed out", "timeout", "broken pipe", "peer", "remote", "nccl")


class WorkerError(RuntimeError):
    """A worker died or hung; the message names the rank and the cause."""

    def __init__(self, rank: int, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.log_tail = log_tail


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: if the launcher dies, the kernel kills the worker.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def launch_local(worker_args: list[str], world: int, workdir: Path, *, timeout: float,
                 describe: Callable[[int], str], extra_env: dict[str, str] | None = None,
                 entry: Sequence[str] = ("-m", "pipeplan.runtime.worker"),
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
    """Run ``world`` workers to completion.

    Parameters
    ----------
    worker_args : list of str
        Arguments of ``python -m pipeplan.runtime.worker``.
    world : int
        Number of processes (one per device of the plan).
    workdir : Path
        Where logs and the heartbeat map go.
    timeout : float
        Seconds without a heartbeat before a worker counts as hung, once every worker
        trains (is past its set-up, step -1).
    describe : callable
        ``rank -> "stage 0 replica 1, device g1"`` for messages.
    extra_env : dict, optional
        More environment for the workers.
    entry : sequence of str
        What ``python`` runs, before ``worker_args`` (the worker module; a test's own driver).
    startup_timeout : float
        Seconds from launch to a worker's first heartbeat before it counts as not started,
        and between beats until every worker trains.

    Raises
    ------
    WorkerError
        If a worker fails or hangs; every worker has been killed by then.
    """
    beat_file = workdir / "heartbeat"
    table = heartbeat.create(str(beat_file), world)
    env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               **{heartbeat.ENV: str(beat_file)}, **(extra_env or {}))
    procs: list[subprocess.Popen] = []
    logs = [workdir / f"rank{r}.log" for r in range(world)]
    try:
        for rank in range(world):
            with open(logs[rank], "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, *entry, *worker_args],
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, cwd=ROOT,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent))
        _watch(procs, table, timeout, describe, logs, startup_timeout)
    finally:
        _kill_all(procs)


def _watch(procs: list[subprocess.Popen], table, timeout: float, describe: Callable[[int], str],
           logs: list[Path], startup_timeout: float = STARTUP_TIMEOUT) -> None:
    started = time.perf_counter()
    ready: float | None = None  # when every running worker had beaten once
    training: float | None = None  # when every running worker was past its set-up
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank = min(failed, key=lambda r: _blame(codes[r], logs[r]))
            raise WorkerError(rank, f"rank {rank} ({describe(rank)}): {_cause(codes[rank], logs[rank])}",
                              _tail(logs[rank]))
        if all(code == 0 for code in codes):
            return
        now = time.perf_counter()
        running = [r for r, code in enumerate(codes) if code is None]
        beats = {r: heartbeat.read(table, r) for r in running}
        if ready is None:
            unstarted = [r for r in running if beats[r].time == 0]
            if unstarted and now - started > startup_timeout:
                rank = unstarted[0]
                raise WorkerError(rank, f"rank {rank} ({describe(rank)}): did not start within "
                                        f"{startup_timeout:g} s of launch (no heartbeat yet)", _tail(logs[rank]))
            if not unstarted:
                ready = now
        if ready is not None and training is None and all(beats[r].step != SETTING_UP for r in running):
            training = now
        if ready is not None:
            # the hang clock of training starts when the last worker begins it, so that the ranks
            # that waited for it in their first step are not stale at once
            limit, since = (timeout, training) if training is not None else (max(timeout, startup_timeout), ready)
            stale = [r for r in running if now - max(beats[r].time, since) > limit]
            if stale:
                rank = min(running, key=lambda r: _hang_key(procs[r].pid, beats[r], since))
                raise WorkerError(rank, f"rank {rank} ({describe(rank)}): made no progress for {limit:g} s "
                                        f"({_where(beats[rank])}); presumed hung", _tail(logs[rank]))
        time.sleep(0.05)


def _hang_key(pid: int, beat: heartbeat.Beat, started: float) -> tuple:
    """Sort key of the rank to blame for a hang: the one that froze, not one blocked on it.

    First a process the kernel reports stopped (``SIGSTOP``, a debugger); then a rank
    not waiting for peers (stuck in its own work); then, among waiting ranks, the one
    whose last sign of life is oldest (a live waiter refreshes it while it sleeps, see
    :mod:`pipeplan.runtime.heartbeat`), and last the one whose progress stopped first (the ranks
    waiting for it may have gone quiet after it).
    """
    return (not _stopped(pid), beat.waiting, max(beat.alive, started), max(beat.time, started))


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state ``T`` or ``t`` in ``/proc/PID/stat``; False elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


def _blame(code: int, log: Path) -> tuple[int, int]:
    """Sort key: a worker killed by a signal, then one failing on its own, before peers' knock-on errors."""
    if code < 0:
        return (0, 0)
    last = _last_line(log).lower()
    return (1 if not any(word in last for word in _PEER_ERRORS) else 2, 0)


def _cause(code: int, log: Path) -> str:
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    last = _last_line(log)
    return last.split(": ", 1)[1] if last.startswith("rank ") and ": " in last else \
        (last or f"exited with status {code}")


def _where(beat: heartbeat.Beat) -> str:
    if beat.time == 0:
        return "never started"
    if beat.step == SETTING_UP:
        return "setting up"
    if beat.step == -2:
        return "verifying"
    state = "waiting for peers" if beat.waiting else "working"
    return f"step {beat.step}, op {beat.position}, {state}"


def _last_line(log: Path) -> str:
    lines = _tail(log).splitlines()
    return lines[-1].strip() if lines else ""


def _tail(log: Path, count: int = 6) -> str:
    try:
        text = log.read_bytes()[-4000:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-count:])


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the worker and anything it started
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
