"""torchmem across the ranks of a torch.distributed job (DDP, FSDP, torchrun).

    import torchmem, torchmem.distributed as tmd

    job = tmd.gather()                      # collective: a JobReport on rank 0, None elsewhere
    if job is not None:
        print(job.render())                 # a row per rank, imbalance, every rank's leaks

    with tmd.leak_check():                  # collective: every rank leaves together and raises
        evaluate(model, loader)             #   the same DistributedLeakError, naming the ranks

    monitor = tmd.GrowthMonitor(warmup=2)   # step() is local; check() is collective
    ...
    monitor.check()

    torchrun --nproc-per-node=8 -m torchmem run train.py   # one report for the whole job

Everything travels over torch.distributed itself: the caller's process group
(``all_gather_object``/``gather_object``) in code, and the launcher's own store
(``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``) for ``python -m torchmem run``, which works
even after the script destroyed its process group. The parts:

    payload     what one rank sends (RankReport) and how it is encoded
    job         JobReport: the table, imbalance between ranks, leaks by rank
    exchange    the process-group collectives, bounded waits, clear errors
    gather      gather() / all_gather()
    collective  leak_check and GrowthMonitor that decide together
    launcher    the job report of ``python -m torchmem run`` under torchrun or any launcher
    spawn       run a function on N local ranks (tests; the pytest plugin's fixture)
    errors      what can go wrong, each error naming the ranks
"""

from __future__ import annotations

from torchmem.distributed.collective import CollectiveLeakReport, GrowthMonitor, JobGrowthReport, leak_check
from torchmem.distributed.errors import (
    CollectiveError,
    CollectiveMismatchError,
    DistributedLeakError,
    GrowthError,
    RankFailedError,
)
from torchmem.distributed.gather import all_gather, gather, local_report
from torchmem.distributed.job import Imbalance, JobReport
from torchmem.distributed.payload import RankReport
from torchmem.distributed.spawn import SpawnError, spawn

__all__ = [
    "gather",
    "all_gather",
    "local_report",
    "JobReport",
    "RankReport",
    "Imbalance",
    "leak_check",
    "CollectiveLeakReport",
    "GrowthMonitor",
    "JobGrowthReport",
    "CollectiveError",
    "CollectiveMismatchError",
    "RankFailedError",
    "DistributedLeakError",
    "GrowthError",
    "spawn",
    "SpawnError",
]
