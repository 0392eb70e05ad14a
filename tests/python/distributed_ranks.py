"""What each rank runs in test_distributed.py (a module of its own, so spawned ranks import it
without pytest). Every function is ``fn(rank, world_size, ...)`` and returns plain data for the
test to assert on; the test process never shares memory with the ranks."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import torchmem
import torchmem.distributed as tmd

HISTORY = []  # what rank 1 "logs" every step and never drops: the planted leak
KiB = 1024
MiB = 1024 * KiB


def _untagged_allocations() -> int:
    return torchmem.tag_stats("cpu").get("untagged", {}).get("allocations", 0)


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))


def _outcome(call) -> dict:
    """What a call raised, as plain data (every rank reports the same way)."""
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "message": str(error), "notes": list(getattr(error, "__notes__", []))}
    return {"type": None, "message": None, "notes": []}


# --- world size 2: the whole API on CPU tensors over Gloo -----------------------------------------


def ddp_and_collectives(rank: int, world_size: int, flag_dir: str) -> dict:
    out = {}

    # A DDP training loop; rank 1 keeps 64 KiB per step (the leak). Gradient buckets, the
    # reducer's copies and Gloo's work must all be charged to the tags the loop opened.
    with torchmem.tag("ddp"):
        model = torch.nn.parallel.DistributedDataParallel(_tiny_model(), bucket_cap_mb=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    untagged_before = _untagged_allocations()

    def train(steps: int, leak: bool):
        for _ in range(steps):
            with torchmem.tag("step"):
                loss = model(torch.randn(16, 64)).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            if leak and rank == 1:
                with torchmem.tag("logging"):
                    HISTORY.append(torch.zeros(16 * KiB))

    # Warm-up, unchecked: DDP rebuilds its gradient buckets during the second step.
    train(2, leak=False)

    def checked_training():
        with tmd.leak_check(timeout=60):
            train(3, leak=True)

    out["leak"] = _outcome(checked_training)
    out["untagged_allocations_in_loop"] = _untagged_allocations() - untagged_before
    tags = torchmem.tag_stats("cpu")
    out["ddp_bytes"] = tags["ddp"]["peak_bytes"]
    out["step_allocations"] = tags["step"]["allocations"]
    HISTORY.clear()

    # The imbalance: rank 1 peaks 4 MiB higher, under tag "logging".
    if rank == 1:
        with torchmem.tag("logging"):
            big = torch.ones(MiB)  # 4 MiB of float32
            del big
    job = tmd.gather(timeout=60)
    everywhere = tmd.all_gather(timeout=60)
    out["gather_on_this_rank"] = None if job is None else job.to_dict()
    out["gather_text"] = None if job is None else job.render()
    out["all_gather_imbalance"] = [imbalance.to_dict() for imbalance in everywhere.imbalances]

    # An error inside the check on rank 0 only: rank 0's own error goes on, rank 1 stops too.
    def raising():
        with tmd.leak_check(timeout=60):
            if rank == 0:
                raise ValueError("bad batch on rank 0")

    out["raised"] = _outcome(raising)

    # Options that differ between ranks, and torchmem versions that differ.
    def mismatched_options():
        with tmd.leak_check(timeout=60, max_leaked_bytes=rank * 100):
            pass

    out["options_mismatch"] = _outcome(mismatched_options)
    real_version = torchmem.__version__
    if rank == 1:
        torchmem.__version__ = "0.0.1"
    try:
        out["version_mismatch"] = _outcome(_enter_exit)
    finally:
        torchmem.__version__ = real_version

    # Growth on rank 1 only.
    kept = []
    monitor = tmd.GrowthMonitor(warmup=1, by_site=False, timeout=60)
    for _ in range(5):
        if rank == 1:
            with torchmem.tag("cache"):
                kept.append(torch.zeros(4 * KiB))
        monitor.step()
    out["growth"] = _outcome(monitor.check)
    out["growth_ranks"] = monitor.report().growing_ranks
    kept.clear()

    out["async_tags"] = _async_collective_attribution(rank, flag_dir)
    return out


def _enter_exit() -> None:
    with tmd.leak_check(timeout=60):
        pass


def _async_collective_attribution(rank: int, flag_dir: str) -> dict:
    """An all_gather issued asynchronously inside tag("comm") while Gloo's workers are busy: it
    runs (and allocates its buffer) after rank 0 has moved on to tag("later"). The buffer belongs
    to "comm", where the work was issued."""
    flag = os.path.join(flag_dir, "rank0-moved-on")
    # Gloo's process group runs 2 worker threads (ProcessGroupGloo::Options in torch 2.14); four
    # all_reduces that wait for rank 1 keep them busy, so the all_gather waits in the queue.
    blockers = [torch.ones(8) for _ in range(4)]
    outputs = [torch.empty(64 * KiB) for _ in range(2)]
    source = torch.ones(64 * KiB)
    if rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)
    works = [dist.all_reduce(blocker, async_op=True) for blocker in blockers]
    with torchmem.tag("comm"):
        gather_work = dist.all_gather(outputs, source, async_op=True)
    with torchmem.tag("later"):
        if rank == 0:
            open(flag, "w").close()
        for work in works:
            work.wait()
        gather_work.wait()
    tags = torchmem.tag_stats("cpu")
    return {name: tags.get(name, {}).get("allocations", 0) for name in ("comm", "later")}


def fsdp2_tags(rank: int, world_size: int) -> dict:
    """FSDP2 (fully_shard) on CPU over Gloo: sharded parameters, all-gather buffers and
    reduce-scatter buffers are charged to the tags open around sharding, forward and backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _tiny_model()
    mesh = init_device_mesh("cpu", (world_size,))
    with torchmem.tag("shard"):
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    untagged_before = _untagged_allocations()
    for _ in range(2):
        with torchmem.tag("forward"):
            loss = model(torch.randn(16, 64)).square().mean()
        with torchmem.tag("backward"):
            loss.backward()
        with torchmem.tag("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
    tags = torchmem.tag_stats("cpu")
    full_first_layer = (64 * 128 + 128) * 4  # what one all-gather of layer 0 brings in
    return {
        "untagged_allocations_in_loop": _untagged_allocations() - untagged_before,
        "shard_current": tags["shard"]["current_bytes"],
        "forward_peak": tags["forward"]["peak_bytes"],
        "backward_allocations": tags["backward"]["allocations"],
        "full_first_layer": full_first_layer,
    }


# --- world size 4 -----------------------------------------------------------------------------


def four_ranks(rank: int, world_size: int) -> dict:
    out = {}
    if rank == 2:
        with torchmem.tag("eval_cache"):
            peak = torch.ones(2 * MiB)  # 8 MiB more than the other ranks at its peak
            del peak

    # The collective's tensor outlives the check: a Gloo worker may drop its reference to it a
    # moment after all_reduce returns, and the check is about what the ranks keep.
    total = torch.randn(1000)

    def leaking():
        with tmd.leak_check(timeout=60):
            with torchmem.tag("work"):
                dist.all_reduce(total)
                if rank == 1:
                    HISTORY.append(total * 2)

    out["leak"] = _outcome(leaking)
    HISTORY.clear()
    job = tmd.all_gather(timeout=60)
    out["imbalances"] = [imbalance.to_dict() for imbalance in job.imbalances]
    out["ranks"] = [report.rank for report in job.ranks]

    # Rank 3 reaches the end of a check 3 s late; with timeout=1 the others do not wait for it.
    def late():
        with tmd.leak_check(timeout=1):
            if rank == 3:
                time.sleep(3)

    out["late"] = _outcome(late)
    return out


# --- failures ---------------------------------------------------------------------------------


def crash_inside_a_check(rank: int, world_size: int, store_path: str) -> dict:
    """Rank 1 dies (no exception, no exit handlers) inside a collective check, once rank 0 is
    inside it too.

    Ordered through a store of its own, not by timing: a barrier first, so that every rank has
    finished init_process_group (Gloo connects the ranks there; a rank that dies while another
    still connects fails that one's init_process_group, outside any check), and rank 1 dies only
    after rank 0 has left the barrier and entered the check. The next thing rank 0 does is the
    check's exchange, which must fail at once.
    """
    store = dist.FileStore(store_path, world_size)
    dist.barrier()

    def body():
        with tmd.leak_check():
            if rank == 0:
                store.set("rank 0 is inside the check", "1")
            else:
                store.wait(["rank 0 is inside the check"])
                os._exit(7)

    started = time.monotonic()
    outcome = _outcome(body)
    outcome["seconds"] = time.monotonic() - started
    return outcome


def barrier_inside_a_check(rank: int, world_size: int) -> dict:
    """A barrier inside a leak check (after one outside it): what the check reports."""
    dist.barrier()
    with torchmem.leak_check(raise_on_leak=False) as report:
        dist.barrier()
    return {"leaked_bytes": report.leaked_bytes,
            "allowed": [(finding.requested_size, finding.note) for finding in report.allowed]}


def destroyed_group(rank: int, world_size: int) -> dict:
    """The process group is destroyed before a collective check: a clear error, at once."""
    # Every rank past init_process_group first: a rank that destroyed its group and exited
    # while Gloo still connected the other failed that rank's init ("Connection closed by
    # peer"), as it did under load.
    dist.barrier()
    dist.destroy_process_group()
    return _outcome(_enter_exit)


def leak_on_rank_1(rank: int, world_size: int) -> None:
    with torchmem.tag("logging"):
        if rank == 1:
            HISTORY.append(torch.zeros(4 * KiB))


def append_to_argument(rank: int, world_size: int, buffers: list) -> None:
    buffers.append(torch.zeros(4 * KiB))  # held only through the function's argument


class _SelfReferencing:
    def __init__(self):
        self.me = self
        self.state = torch.zeros(4 * KiB)


def cycle_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        _SelfReferencing()  # one object in a reference cycle, dropped: counted only under cycles="always"
