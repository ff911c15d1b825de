"""Run the workers of several ``pipeplan run`` runs in one launch, one run after another.

    python run_plans.py JOBS.json      (started by pipeplan.runtime.launch.launch_local)

``JOBS.json`` lists ``{"name", "world", "port", "argv"}`` objects, largest ``world`` first:
``argv`` is the workers' command line (``python -m pipeplan.runtime.worker ARGV``, as
``pipeplan run`` launches it), ``world`` the run's number of ranks, ``port`` its rendezvous
port.  Rank ``r`` takes part in every run with ``world > r`` and leaves after the last one;
rank 0 prints ``run <name>`` before each.  The first run to fail ends the launch with its
exit status (a worker that raises exits at once, see ``pipeplan.runtime.worker.main``).
See ``tests/helpers.py: shared_launch``.
"""

import json
import os
import sys

from pipeplan.runtime import worker


def main() -> int:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    rank = int(os.environ["RANK"])
    for job in jobs:
        if rank >= job["world"]:
            break  # the runs are sorted by world, largest first: none after this one needs this rank
        os.environ.update(WORLD_SIZE=str(job["world"]), LOCAL_WORLD_SIZE=str(job["world"]),
                          MASTER_PORT=str(job["port"]))
        if rank == 0:
            print(f"run {job['name']}", flush=True)
        status = worker.main(job["argv"])
        sys.stdout.flush()
        if status:
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
