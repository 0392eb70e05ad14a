"""What each rank runs in test_cuda_distributed.py: CUDA tensors on the simulated device (one
simulated GPU per rank), collectives over Gloo. NCCL cannot run here: it embeds its own CUDA
runtime and talks to the real driver, which the simulated device does not replace.

Models are elementwise (no cuBLAS on the simulated device) and kernels do not run, so values
are arbitrary: these ranks check memory, never numbers."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import simcuda
import torchmem
import torchmem.distributed as tmd

HISTORY = []
MiB = 1 << 20


class Scale(torch.nn.Module):
    """y = x * weight + bias, elementwise."""

    def __init__(self, features: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(features))
        self.bias = torch.nn.Parameter(torch.zeros(features))

    def forward(self, x):
        return x * self.weight + self.bias


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _untagged_allocations(device) -> int:
    return torchmem.tag_stats(device).get("untagged", {}).get("allocations", 0)


def _outcome(call) -> dict:
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": None, "message": None}


def ddp(rank: int, world_size: int) -> dict:
    device = _device()
    with torchmem.tag("ddp"):
        model = torch.nn.parallel.DistributedDataParallel(Scale(1 << 16).to(device), bucket_cap_mb=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(steps: int, leak: bool):
        for _ in range(steps):
            with torchmem.tag("step"):
                model(torch.randn(4, 1 << 16, device=device)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            if leak and rank == 1:
                with torchmem.tag("logging"):
                    HISTORY.append(torch.zeros(1 << 16, device=device))  # 256 KiB a step

    train(2, leak=False)  # warm-up: DDP rebuilds its buckets in step 2
    untagged_before = _untagged_allocations(device)

    def checked():
        with tmd.leak_check(timeout=60, devices=[str(device)]):
            train(3, leak=True)

    out = {"device": str(device), "leak": _outcome(checked)}
    torch.cuda.synchronize()
    out["untagged_allocations_in_loop"] = _untagged_allocations(device) - untagged_before
    HISTORY.clear()
    if rank == 1:
        with torchmem.tag("logging"):
            scratch = torch.empty(8 * MiB, dtype=torch.uint8, device=device)
            del scratch
    job = tmd.gather(timeout=60)
    out["job"] = None if job is None else job.to_dict()
    out["job_text"] = None if job is None else job.render()
    return out


def _pending_bytes(device, at_least: int, timeout: float = 10.0) -> int:
    """Pending bytes once they reach ``at_least`` (or the timeout): Gloo's worker thread drops its
    own reference to a collective's tensor a moment after the collective returned."""
    deadline = time.monotonic() + timeout
    while True:
        pending = torchmem.fragmentation(device)["pending_free_bytes"]
        if pending >= at_least or time.monotonic() > deadline:
            return pending
        time.sleep(0.001)


def comm_stream(rank: int, world_size: int) -> dict:
    """Gloo runs a CUDA all_reduce on a stream of its own and records the tensor on it
    (record_stream): freed, the block waits for that stream, still charged to its tag."""
    sim = simcuda.Control()
    device = _device()
    out = {}
    sim.set_event_mode("manual")  # work completes only when something synchronizes
    try:
        with tmd.leak_check(timeout=60, devices=[str(device)]) as report:
            with torchmem.tag("grads"):
                grads = torch.ones(1 << 18, device=device)  # 1 MiB
                dist.all_reduce(grads)
            del grads
            out["pending_after_free"] = _pending_bytes(device, at_least=MiB)
        out["report"] = report.render()
    finally:
        sim.set_event_mode("immediate")
    torch.cuda.synchronize()
    torch.empty(16, device=device)  # an allocation processes completed events
    out["pending_after_sync"] = torchmem.fragmentation(device)["pending_free_bytes"]
    return out


def fsdp2(rank: int, world_size: int) -> dict:
    """FSDP2 on CUDA: all-gathers and reduce-scatters run on FSDP's own streams."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    device = _device()
    model = torch.nn.Sequential(Scale(1 << 16), Scale(1 << 16)).to(device)
    # The mesh over the Gloo world group itself: init_device_mesh("cuda") of torch 2.9 and
    # 2.10 replaces a Gloo default group by a new "cuda:nccl" one, which cannot run here.
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    with torchmem.tag("shard"):
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    untagged_before = _untagged_allocations(device)
    for _ in range(2):
        with torchmem.tag("forward"):
            loss = model(torch.randn(4, 1 << 16, device=device)).sum()
        with torchmem.tag("backward"):
            loss.backward()
        with torchmem.tag("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
    torch.cuda.synchronize()
    tags = torchmem.tag_stats(device)
    return {
        "untagged_allocations_in_loop": _untagged_allocations(device) - untagged_before,
        "shard_current": tags["shard"]["current_bytes"],
        "forward_peak": tags["forward"]["peak_bytes"],
        "backward_allocations": tags["backward"]["allocations"],
    }
