"""Expandable segments' pages are created RDMA-capable where the device supports it, as PyTorch's.

PyTorch sets gpuDirectRDMACapable on its pages when the device reports
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, so that NICs (NCCL over InfiniBand)
can register them. The simulated device supports it with SIMCUDA_GPU_DIRECT_RDMA=1; without, it
refuses RDMA-capable pages as such a device does. Each case runs in a process of its own.
"""

import pytest

from processes import run

SNIPPET = """
    sys.path.insert(0, "tests/simcuda")
    import simcuda
    x = torch.empty(64 * (1 << 20), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    stats = simcuda.Control().vmm_stats()
    print(json.dumps([stats["allocations"], stats["rdma_capable_allocations"]]))
"""


@pytest.mark.parametrize("supported", [True, False])
def test_pages_are_rdma_capable_exactly_where_the_device_supports_it(supported):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "SIMCUDA_GPU_DIRECT_RDMA": "1" if supported else "0"}
    pages, rdma_capable = run(SNIPPET, "torchmem", env=env)
    assert pages >= 4  # 64 MiB of the large pool's 20 MiB pages
    assert rdma_capable == (pages if supported else 0)
