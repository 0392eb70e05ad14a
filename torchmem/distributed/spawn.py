"""Run a function on N local ranks under torchmem, with a collective leak check around it.

    def train_step(rank, world_size):
        model = DDP(make_model())
        ...

    torchmem.distributed.spawn(train_step, world_size=2)          # raises if any rank leaked
    torchmem.distributed.spawn(train_step, world_size=4, devices=("cuda",), backend="nccl")

What a test of distributed code needs and ``torch.multiprocessing.spawn`` does not give:
torchmem installed in every rank before the function runs (CUDA too, before CUDA is
initialized), a process group that needs no free port (a ``FileStore`` in a temporary
directory), the function run inside ``torchmem.distributed.leak_check`` on every rank, and a
bound on everything: a rank that crashes or hangs ends the run within ``timeout`` seconds with
an error naming it, and the remaining ranks are stopped. The pytest plugin's
``torchmem_distributed`` fixture is this function with the test's ``@pytest.mark.torchmem``
settings.

``fn`` must be picklable (a module-level function), as with ``torch.multiprocessing.spawn``;
it is called as ``fn(rank, world_size, *args)`` and its return values come back as a list. A
script that calls ``spawn`` at its top level needs the ``if __name__ == "__main__":`` guard,
as every multiprocessing start method but fork does (the ranks import the main module).
The fork server is multiprocessing's own (``set_forkserver_preload`` is set before it starts;
a fork server the program started earlier is reused as it is).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from datetime import timedelta

from torchmem._support.validate import require_int
from torchmem.distributed.errors import DistributedLeakError

__all__ = ["spawn", "SpawnError"]

# How long the ranks still running get to finish once one rank has failed, before they are
# stopped (they are usually blocked in a collective the failed rank will never join).
_GRACE_AFTER_FAILURE_S = 5.0


class SpawnError(RuntimeError):
    """A rank raised, crashed or timed out. ``failures`` maps rank -> what happened (text);
    ``results`` holds the return values of the ranks that finished."""

    def __init__(self, message: str, failures: dict, results: dict | None = None):
        super().__init__(message)
        self.failures = dict(failures)
        self.results = dict(results or {})


def spawn(fn, *, world_size: int = 2, args: tuple = (), backend: str = "gloo", devices=("cpu",),
          timeout: float = 120.0, check: bool = True, repeat: int = 1, allow_arguments: bool = False,
          **check_options) -> list:
    """Runs ``fn(rank, world_size, *args)`` on ``world_size`` new processes that form a process
    group, and returns the ranks' return values (index = rank).

    Args:
        backend: ``"gloo"`` (CPU and CUDA tensors) or ``"nccl"``.
        devices: what torchmem serves in each rank: ``"cpu"`` and/or ``"cuda"`` (rank r then
            uses ``cuda:r % device_count``).
        timeout: seconds for the whole run; also the process group's timeout.
        check: run ``fn`` inside ``torchmem.distributed.leak_check(**check_options)``
            (``allow_tags``, ``max_leaked_bytes``, ``warmup``, ``timeout``, ...).
        repeat: calls of ``fn`` per rank, each checked (with ``warmup=N``, ``repeat=N+1`` makes
            the first N calls warm-up).
        allow_arguments: memory held only through ``args`` (each rank's copy) is allowed, as the
            pytest plugin allows a test's arguments (the ``torchmem_distributed`` fixture passes
            the test's ``allow_arguments``).

    Raises ``DistributedLeakError`` when the check found leaks (its ``job`` names the ranks),
    ``SpawnError`` when a rank raised, crashed or did not finish within ``timeout``.
    """
    require_int(world_size, what="torchmem.distributed.spawn: world_size", minimum=1)
    if isinstance(devices, str):
        devices = (devices,)
    devices = tuple(devices)
    for device in devices:
        if device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"torchmem.distributed.spawn: devices are 'cpu' and/or 'cuda', got {device!r}")
    try:
        pickle.dumps(fn)
    except Exception as error:  # noqa: BLE001
        raise TypeError(
            f"torchmem.distributed.spawn: {fn!r} cannot be sent to the ranks ({error}); define it at module "
            "level (not as a lambda or nested function), as torch.multiprocessing.spawn requires"
        ) from None
    context = _context()
    with tempfile.TemporaryDirectory(prefix="torchmem-spawn-") as directory:
        settings = {
            "store": os.path.join(directory, "store"),
            "results": directory,
            "backend": backend,
            "devices": devices,
            "timeout": timeout,
            "check": dict(check_options) if check else None,
            "repeat": repeat,
            "allow_arguments": bool(allow_arguments),
        }
        processes = [
            context.Process(target=_run_rank, args=(fn, rank, world_size, args, settings), daemon=True,
                            name=f"torchmem-rank-{rank}")
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        stopped = _wait(processes, timeout)
        results = {rank: _read_result(directory, rank) for rank in range(world_size)}
    return _outcome(results, processes, stopped, timeout)


def _context():
    """Fresh processes that start fast: a fork server that imported torch and torchmem once
    hands out forks of itself (never of the caller, whose threads and CUDA state a fork would
    copy), so a rank starts in milliseconds rather than re-importing torch. The fork server
    never initializes CUDA, so ranks can still install torchmem's CUDA allocator. Where fork
    servers do not exist, plain spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "torchmem", "torchmem.distributed"])
    return context


def _wait(processes: list, timeout: float) -> set[int]:
    """Waits for every rank; stops the rest once the deadline passes or a rank has failed and
    the others had a grace period. Returns the ranks that were stopped."""
    deadline = time.monotonic() + timeout
    failed_at = None
    while True:
        alive = [process for process in processes if process.is_alive()]
        if not alive:
            return set()
        if failed_at is None and any(process.exitcode not in (None, 0) for process in processes):
            failed_at = time.monotonic()
        now = time.monotonic()
        if now >= deadline or (failed_at is not None and now - failed_at >= _GRACE_AFTER_FAILURE_S):
            break
        alive[0].join(0.05)
    stopped = set()
    for rank, process in enumerate(processes):
        if process.is_alive():
            stopped.add(rank)
            process.terminate()
    for process in processes:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
    return stopped


def _read_result(directory: str, rank: int):
    path = os.path.join(directory, f"result.{rank}")
    try:
        with open(path, "rb") as file:
            return pickle.load(file)
    except FileNotFoundError:
        return None


def _outcome(results: dict, processes: list, stopped: set, timeout: float) -> list:
    failures: dict[int, str] = {}
    leak_job = None
    for rank, result in results.items():
        process = processes[rank]
        if result is None:
            if rank in stopped:
                failures[rank] = f"did not finish within the run's {timeout:g} s (or after another rank failed): stopped"
            else:
                failures[rank] = f"exited with code {process.exitcode} without a result (crashed or killed)"
        elif result["status"] == "error":
            failures[rank] = result["error"]
        elif result["status"] == "leak":
            leak_job = leak_job or result["job"]
    if failures:
        first_cause = {rank: why for rank, why in failures.items() if "RankFailedError" not in why}
        shown = first_cause or failures
        raise SpawnError(
            "torchmem.distributed.spawn: "
            + ", ".join(f"rank {rank}" for rank in shown)
            + " failed:\n"
            + "\n".join(f"--- rank {rank} ---\n{why.rstrip()}" for rank, why in shown.items()),
            failures,
            {rank: result["value"] for rank, result in results.items() if result and result["status"] == "ok"},
        )
    if leak_job is not None:
        from torchmem.distributed.collective import CollectiveLeakReport

        job = CollectiveLeakReport(leak_job["site"], leak_job["entry"], leak_job["ranks"])
        raise DistributedLeakError(job, None)
    return [results[rank]["value"] for rank in sorted(results)]


# --- in each rank ---------------------------------------------------------------------------


def _run_rank(fn, rank: int, world_size: int, args: tuple, settings: dict) -> None:
    result = {"status": "error", "error": "did not start"}
    try:
        result = _rank_main(fn, rank, world_size, args, settings)
    except BaseException as error:  # noqa: BLE001 - reported to the parent, whatever it is
        from torchmem.distributed.errors import DistributedLeakError as _LeakError

        if isinstance(error, _LeakError):
            result = {"status": "leak", "job": error.job.to_dict()}
        else:
            result = {"status": "error", "error": "".join(traceback.format_exception(error))}
    finally:
        _write_result(settings["results"], rank, result)


def _write_result(directory: str, rank: int, result: dict) -> None:
    path = os.path.join(directory, f"result.{rank}")
    try:
        data = pickle.dumps(result)
    except Exception as error:  # noqa: BLE001 - e.g. a return value that cannot be pickled
        data = pickle.dumps({"status": "error", "error": f"rank {rank}: its result cannot be sent back ({error})"})
    with open(path + ".tmp", "wb") as file:
        file.write(data)
    os.replace(path + ".tmp", path)


def _rank_main(fn, rank: int, world_size: int, args: tuple, settings: dict) -> dict:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size)})
    import torch
    import torch.distributed as dist

    import torchmem
    import torchmem.distributed as tmd

    kinds = {device.split(":")[0] for device in settings["devices"]}
    if "cuda" in kinds:
        torchmem.install("cuda")  # before anything initializes CUDA
        torch.cuda.set_device(rank % torch.cuda.device_count())
    if "cpu" in kinds:
        torchmem.install("cpu")
    timeout = timedelta(seconds=settings["timeout"])
    store = dist.FileStore(settings["store"], world_size)
    dist.init_process_group(settings["backend"], store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        values = []
        check = None
        if settings["check"] is not None:
            options = dict(settings["check"])
            if "devices" not in options:
                options["devices"] = [
                    f"cuda:{torch.cuda.current_device()}" if kind == "cuda" else "cpu" for kind in sorted(kinds)
                ]
            if settings["allow_arguments"]:
                options["allow_held_by"] = {f"args[{index}]": value for index, value in enumerate(args)}
            check = tmd.leak_check(**options)
        call = fn if check is None else check(fn)  # as a decorator: returned tensors may outlive it
        for _ in range(settings["repeat"]):
            values.append(call(rank, world_size, *args))
        return {"status": "ok", "value": values[-1] if values else None}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
