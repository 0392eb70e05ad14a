"""getExpandableSegmentSizes (torch 2.10+) reports the expandable segments, as PyTorch's does.

One entry per expandable segment: its stream, whether it is the small pool's, and its mapped
bytes. Under expandable_segments:True torchmem's virtual-memory ranges are those segments.
The process starts with PYTORCH_CUDA_ALLOC_CONF, so that the placement holds from the start.
"""

import pytest
import torch

from processes import run

TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])
pytestmark = pytest.mark.skipif(
    TORCH < (2, 10), reason="CUDAAllocator::getExpandableSegmentSizes arrived in torch 2.10")

SNIPPET = """
    from torchmem import _C_cuda
    x = torch.empty(64 * (1 << 20), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    print(json.dumps({"stream": stream, "sizes": _C_cuda.expandable_segment_sizes(0)}))
"""


def test_the_large_pools_segment_with_its_stream_and_mapped_bytes():
    answer = run(SNIPPET, "torchmem", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    large = [(stream, size) for stream, small, size in answer["sizes"] if not small]
    assert len(large) == 1, answer
    stream, size = large[0]
    assert stream == answer["stream"]
    assert size >= 64 << 20
