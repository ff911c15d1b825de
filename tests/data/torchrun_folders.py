"""Run several exported torch folders, and pipeplan's own workers on the same plans, in one torchrun launch.

    torchrun --standalone --nproc-per-node=N torchrun_folders.py JOBS.json

JOBS.json is a list of jobs, run in turn; a job's ``"processes": P`` (default N) runs it on
ranks 0 .. P-1 as a world of P processes, the other ranks going on to the next job (and
waiting there for these: put the jobs of the most processes first).  A job is

- ``{"train": FOLDER, "argv": [...]}``: a folder that ``pipeplan export --to torch`` (or
  ``--to deepspeed``) wrote;
  its ``train.py`` is loaded as a module and its ``main`` called with ``argv``, as
  ``torchrun ... train.py ARGV`` run from that folder would.
- ``{"pipeplan": [...]}``: ``python -m pipeplan.runtime.worker ARGS`` (the workers ``pipeplan
  run`` starts, as they run under torchrun across machines); give it ``--result FILE``.

Rank 0 prints ``job <index>`` before each job's lines (a folder's ``step <k> loss <value>``).
Each job joins and leaves the process group itself, so the jobs run one after the other and
the launch's start-up (torch's import, the rendezvous) is paid once for all of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

INIT_PROCESS_GROUP = dist.init_process_group


def init_under_prefix(prefix: str):
    """``dist.init_process_group`` whose keys in torchrun's store start with ``prefix``.

    A process group made after ``destroy_process_group`` takes the same name, so its gloo
    rendezvous would read the addresses the previous job's ranks left in the store.
    """

    def init(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, **kwargs):
        if init_method not in (None, "env://"):
            raise ValueError(f"a job's process group comes from torchrun's environment, not {init_method!r}")
        timeout = timeout or dist.constants.default_pg_timeout
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timeout)
        return INIT_PROCESS_GROUP(backend, store=dist.PrefixStore(prefix, store), timeout=timeout,
                                  rank=int(os.environ["RANK"]) if rank in (None, -1) else rank,
                                  world_size=int(os.environ["WORLD_SIZE"]) if world_size in (None, -1) else world_size,
                                  **kwargs)

    return init


def train_folder(folder: Path, index: int, argv: list[str]) -> int:
    """``folder``'s ``train.py`` ``main(argv)``; the modules it imported from its folder are forgotten
    after it (the next folder's ``pipeline_module`` is another file of the same name)."""
    spec = importlib.util.spec_from_file_location(f"exported_train_{index}", folder / "train.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        return module.main(argv)
    finally:
        for name, loaded in list(sys.modules.items()):
            if Path(getattr(loaded, "__file__", None) or "/").resolve().parent == folder:
                del sys.modules[name]
        while str(folder) in sys.path:
            sys.path.remove(str(folder))


def run_job(index: int, job: dict) -> int:
    """Run ``job`` on this rank; a rank at or above the job's ``processes`` has no part in it."""
    processes = job.get("processes", int(os.environ["WORLD_SIZE"]))
    if int(os.environ["RANK"]) >= processes:
        return 0
    dist.init_process_group = init_under_prefix(f"job{index}/")
    threads, saved = torch.get_num_threads(), {key: os.environ[key] for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    os.environ.update(WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes))
    try:
        if os.environ.get("RANK", "0") == "0":
            print(f"job {index}", flush=True)
        if "train" in job:
            return train_folder(Path(job["train"]).resolve(), index, job["argv"])
        from pipeplan.runtime import worker

        return worker.main(job["pipeplan"])
    finally:
        torch.set_num_threads(threads)  # pipeplan's worker takes one thread; train.py keeps torchrun's
        os.environ.update(saved)
        # DTensor's caches hold the meshes of a tensor-parallel job, equal to the next job's by ranks alone
        from pipeplan.runtime.sharding import forget_meshes

        forget_meshes()


def main() -> int:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    for index, job in enumerate(jobs):
        status = run_job(index, job)
        if status:
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
