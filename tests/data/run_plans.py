"""Run the workers of several ``pipeplan run`` runs in one launch, one run after another.

    python run_plans.py JOBS.json      (started by pipeplan.runtime.launch.launch_local)

``JOBS.json`` lists ``{"name", "world", "argv"}`` objects, largest ``world`` first: ``argv``
is the workers' command line (``python -m pipeplan.runtime.worker ARGV``, as ``pipeplan
run`` launches it), ``world`` the run's number of ranks.  Rank ``r`` takes part in every
run with ``world > r`` and leaves after the last one; rank 0 prints ``run <name>`` before
each.  The first run to fail ends the launch with its exit status (a worker that raises
exits at once, see ``pipeplan.runtime.worker.main``).  See ``tests/helpers.py: shared_launch``.

The ranks meet once, on the launcher's ``MASTER_PORT``, and every run's process group
keeps its keys under a prefix of its own in that one store.  A rank that waits for a
later run's rendezvous while rank 0 still verifies the previous run so waits on an
open connection: connecting again and again to a port nobody listens on yet can, on
loopback, connect a socket to itself (when the kernel picks that very port for it) and
wait forever.
"""

import importlib
import json
import os
import sys
from datetime import timedelta

from torch.distributed import PrefixStore

from pipeplan.runtime import worker

# the module, not the function torch.distributed re-exports under the same name
rendezvous = importlib.import_module("torch.distributed.rendezvous")
STORE_TIMEOUT = timedelta(seconds=600)
"""How long a rank waits for a key of another rank (the launcher's hang guard is shorter)."""


def main() -> int:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = rendezvous._create_c10d_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world,
                                          STORE_TIMEOUT)
    for k, job in enumerate(jobs):
        if rank >= job["world"]:
            break  # the runs are sorted by world, largest first: none after this one needs this rank
        os.environ.update(WORLD_SIZE=str(job["world"]), LOCAL_WORLD_SIZE=str(job["world"]))
        rendezvous._create_c10d_store = lambda *args, _k=k, **kw: PrefixStore(f"run{_k}", store)
        if rank == 0:
            print(f"run {job['name']}", flush=True)
        status = worker.main(job["argv"])
        sys.stdout.flush()
        if status:
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
