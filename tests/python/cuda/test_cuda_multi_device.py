"""Two simulated devices held to a real node's rules (tests/simcuda/README.md, "Contexts").

What only a multi-GPU node shows, checked on the strict simulated device: a process creates a
CUDA context only on the devices it uses (each costs ~0.5 GiB on a GPU, and EXCLUSIVE_PROCESS
mode refuses a second process's); a device reads a peer's expandable-segment pages only once
the peer granted it access (cuMemSetAccess), so copies between devices need torchmem to grant
it; a block used by another device's stream waits for that stream on that device. PyTorch's
own allocator runs the same snippets as the reference where it applies.
"""

import os

import pytest
import torch

import simcuda
from processes import ROOT, run
from torchmem import _C

MiB = 1 << 20
TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])

# A fresh process with the settings under test; the fake NVML for PyTorch's own expandable
# segments (a real node always has NVML).
EXPANDABLE_WITH_FRACTION = {
    # per_process_memory_fraction is an allocator option from torch 2.10 on; older torch refuses it.
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"
    + (",per_process_memory_fraction:0.5" if TORCH >= (2, 10) else ""),
    "LD_PRELOAD": simcuda.preload(nvml=True),
    "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "simcuda"), str(ROOT)]),
}

CONTEXTS_AFTER_USING_CUDA_0 = """
import simcuda
x = torch.full((3 << 20,), 7, dtype=torch.uint8).to("cuda:0")
assert torch.cuda.device_count() == 2
sim = simcuda.Control()
print(json.dumps({"contexts": [sim.context_active(0), sim.context_active(1)],
                  "value": int(x[5].item())}))
"""


@pytest.mark.skipif(TORCH < (2, 10), reason="per_process_memory_fraction arrived in torch 2.10")
@pytest.mark.parametrize("route", ["native", "torchmem"])
def test_a_process_using_one_device_creates_no_context_on_the_other(route):
    # Expandable segments and a memory fraction both size the device; sizing must not create
    # a context (it did: cudaSetDevice + cudaMemGetInfo on every GPU at init).
    result = run(CONTEXTS_AFTER_USING_CUDA_0, route, env=EXPANDABLE_WITH_FRACTION)
    assert result == {"contexts": [True, False], "value": 7}


def test_exclusive_process_mode_lets_each_rank_have_its_own_device(tmp_path):
    # Two ranks of one node, each on its own GPU in EXCLUSIVE_PROCESS mode: the first one
    # still holds its context when the second starts, so a context of rank 0 on cuda:1 would
    # make rank 1 fail with "all CUDA-capable devices are busy or unavailable".
    env = dict(EXPANDABLE_WITH_FRACTION, SIMCUDA_EXCLUSIVE_PROCESS_DIR=str(tmp_path))
    rank1 = """
    import simcuda
    x = torch.full((1 << 20,), 3, dtype=torch.uint8).to("cuda:1")
    print(json.dumps(int(x[0].item())))
    """
    rank0 = f"""
    import subprocess, textwrap
    import simcuda
    x = torch.full((1 << 20,), 1, dtype=torch.uint8).to("cuda:0")
    code = "import json, sys, torch\\nimport torchmem\\ntorchmem.install()\\n" + textwrap.dedent({rank1!r})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print(json.dumps({{"rank1": done.stdout.strip().splitlines()[-1:] or done.stderr[-2000:],
                      "rank0": int(x[0].item())}}))
    """
    assert run(rank0, "torchmem", env=env) == {"rank1": ["3"], "rank0": 1}


COPIES_BETWEEN_DEVICES = """
first = torch.full((3 << 20,), 9, dtype=torch.uint8).to("cuda:0")
second = first.to("cuda:1")  # on cuda:0's stream, writing pages of cuda:1
later = torch.full((5 << 20,), 4, dtype=torch.uint8).to("cuda:1")  # pages mapped after
back = later.to("cuda:0")
again = first.to("cuda:1")  # into pages of cuda:1 mapped after access was granted
print(json.dumps({"devices": [str(t.device) for t in (second, back, again)],
                  "values": [int(t.cpu().min()) for t in (second, back, again)]
                            + [int(t.cpu().max()) for t in (second, back, again)]}))
"""


@pytest.mark.parametrize("route", ["native", "torchmem"])
def test_expandable_memory_is_copied_between_devices(route):
    # torch copies between GPUs on the source device's stream once peer access is enabled:
    # that device writes the destination's pages, which it may only do once granted access.
    result = run(COPIES_BETWEEN_DEVICES, route, env=EXPANDABLE_WITH_FRACTION)
    assert result == {"devices": ["cuda:1", "cuda:0", "cuda:1"], "values": [9, 4, 9, 9, 4, 9]}


def test_a_block_used_by_another_devices_stream_waits_for_that_stream(sim):
    sim.set_event_mode("manual")
    x = torch.empty(1 << 18, device="cuda:0")
    address = x.data_ptr()
    side = torch.cuda.Stream(device=1)
    with torch.cuda.stream(side):
        torch.ones(16).to("cuda:1", non_blocking=True)  # work still queued on cuda:1
    x.record_stream(side)
    del x
    y = torch.empty(1 << 18, device="cuda:0")
    assert y.data_ptr() != address  # cuda:1 may still read it
    sim.complete_stream(side)
    z = torch.empty(1 << 18, device="cuda:0")
    assert z.data_ptr() == address
    del y, z
    _C.cuda_engine(0).check_invariants()


def test_another_devices_default_stream_is_not_the_blocks_own(sim):
    # Every device's default stream is the same handle (nullptr): device 1's must not be taken
    # for the stream that allocated the block on device 0.
    sim.set_event_mode("manual")
    x = torch.empty(1 << 18, device="cuda:0")
    address = x.data_ptr()
    other_default = torch.cuda.default_stream(1)
    with torch.cuda.device(1):
        torch.ones(16).to("cuda:1", non_blocking=True)  # queued on cuda:1's default stream
    x.record_stream(other_default)
    del x
    y = torch.empty(1 << 18, device="cuda:0")
    assert y.data_ptr() != address
    with torch.cuda.device(1):
        sim.complete_stream(other_default)
    z = torch.empty(1 << 18, device="cuda:0")
    assert z.data_ptr() == address
    del y, z

