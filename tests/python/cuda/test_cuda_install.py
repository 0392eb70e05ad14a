"""Installing torchmem as PyTorch's CUDA allocator (on the simulated device)."""

import subprocess
import sys

import torch

import torchmem
from torchmem import _C


def test_pytorch_allocates_cuda_tensors_through_torchmem():
    assert torchmem.is_installed("cuda")
    assert torch.cuda.get_allocator_backend() == "native"  # see cuda_allocator.h for why
    before = torchmem.memory_allocated("cuda:0")
    x = torch.empty(1000, device="cuda")
    block = _C.cuda_engine(0).block(x.data_ptr())
    assert block["requested_size"] == 4000 and block["state"] == "allocated"
    assert torchmem.memory_allocated("cuda:0") == before + 4096
    del x
    assert torchmem.memory_allocated("cuda:0") == before


def test_installing_twice_is_a_no_op():
    torchmem.install()
    torchmem.install("cuda")
    assert torch.cuda.get_allocator_backend() == "native"


def test_cuda_cannot_be_uninstalled():
    try:
        torchmem.uninstall("cuda")
    except RuntimeError as error:
        assert "only once per process" in str(error)
    else:
        raise AssertionError("uninstall('cuda') must refuse")


def test_install_after_cuda_init_says_why_and_how_to_fix():
    code = (
        "import torch, torchmem\n"
        "torch.zeros(1, device='cuda')\n"
        "try:\n"
        "    torchmem.install()\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "CUDA is already initialized" in out
    assert "python -m torchmem run" in out
    assert "torchmem.install() at the very top" in out


def test_empty_tensors_take_no_memory():
    x = torch.empty(0, device="cuda")
    assert x.data_ptr() == 0


def test_caching_allocator_alloc_and_delete_go_through_torchmem():
    stream = torch.cuda.current_stream()
    ptr = torch.cuda.caching_allocator_alloc(3 << 20, stream=stream)
    assert _C.cuda_engine(0).block(ptr)["requested_size"] == 3 << 20
    torch.cuda.caching_allocator_delete(ptr)
    assert all(b["address"] != ptr for b in _C.cuda_engine(0).allocated_blocks())


def test_second_device_has_its_own_engine(sim):
    assert torch.cuda.device_count() == 2
    x = torch.empty(1 << 20, device="cuda:1")
    assert _C.cuda_engine(1).block(x.data_ptr())["size"] == 4 << 20
    assert torchmem.memory_allocated("cuda:1") >= 4 << 20
    assert sim.live_bytes(1) >= 20 << 20  # the engine's 20 MiB segment
    del x
