"""Run several trainings in one torchrun launch, one after the other (the test suite's launch sharing).

    torchrun --nproc-per-node=N run_many.py JOBS.json

``JOBS.json`` lists ``{"name", "kind", "argv"}`` objects: ``kind`` ``worker`` runs
pipeplan run's workers (``python -m pipeplan.runtime.worker ARGV``, the form ``pipeplan
run`` takes across machines), ``train`` an exported folder's ``train.py`` (``argv[0]``
the script, the rest its arguments).  Rank 0 prints ``job <name>`` before each job's
output.  Each job's process group keeps its keys under a prefix of its own in
torchrun's store, so one job's addresses are not read by the next.  The first job to
fail ends the launch with its exit status.
"""

import importlib
import json
import os
import runpy
import sys

from torch.distributed import PrefixStore

from pipeplan.runtime import worker

# the module, not the function torch.distributed re-exports under the same name
rendezvous = importlib.import_module("torch.distributed.rendezvous")
create_store = rendezvous._create_c10d_store


def run_job(job: dict) -> int:
    if job["kind"] == "worker":
        return worker.main(job["argv"])
    sys.argv = list(job["argv"])
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def main() -> int:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for k, job in enumerate(jobs):
        rendezvous._create_c10d_store = lambda *a, _k=k, **kw: PrefixStore(f"job{_k}", create_store(*a, **kw))
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"job {job['name']}", flush=True)
        status = run_job(job)
        sys.stdout.flush()
        if status:
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
