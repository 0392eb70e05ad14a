"""The ways to make torchmem PyTorch's CUDA allocator, each in a fresh process.

``torchmem.install()`` and ``change_current_allocator(torchmem.cuda_allocator())`` give
the complete allocator; ``CUDAPluggableAllocator`` over torchmem's exported entry points
is the reduced route (allocation and free only) for code that builds its own.
"""

from processes import run

COMPLETE_ROUTE_CHECKS = """
import torchmem
from torchmem import _C
with torchmem.tag("weights"):
    weights = torch.empty(1 << 20, device="cuda")
print(json.dumps({
    "backend": torch.cuda.get_allocator_backend(),
    "installed": torchmem.is_installed("cuda"),
    "block_tag": _C.cuda_engine(0).block(weights.data_ptr())["tag"],
    "stats_agree": torch.cuda.memory_stats(0) == torchmem.memory_stats("cuda:0"),
    "weights_bytes": torchmem.tag_stats("cuda:0")["weights"]["current_bytes"],
    "snapshot_segments": len(torch.cuda.memory_snapshot()),
}))
"""


def test_change_current_allocator_with_cuda_allocator_is_the_complete_allocator():
    result = run(COMPLETE_ROUTE_CHECKS, "cuda_allocator")
    assert result == {"backend": "native", "installed": True, "block_tag": "weights",
                      "stats_agree": True, "weights_bytes": 4 << 20, "snapshot_segments": 1}


def test_the_reduced_pluggable_route_still_allocates_through_torchmem():
    snippet = """
    import torchmem
    from torchmem import _C_cuda
    # What code that builds its own CUDAPluggableAllocator writes:
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _C_cuda.__file__, "torchmem_cuda_malloc", "torchmem_cuda_free")
    torch.cuda.memory.change_current_allocator(allocator)
    with torchmem.tag("weights"):
        weights = torch.arange(1000, dtype=torch.float32).to("cuda")
    kept = torch.equal(weights.cpu(), torch.arange(1000, dtype=torch.float32))
    tagged = torchmem.tag_stats("cuda:0")["weights"]["current_bytes"]
    del weights
    print(json.dumps({"kept": kept, "tagged": tagged,
                      "after_del": torchmem.memory_allocated("cuda:0"),
                      "complete": _C_cuda.installed()}))
    """
    assert run(snippet, "native") == {"kept": True, "tagged": 4096, "after_del": 0,
                                      "complete": False}


def test_the_reduced_route_with_torchmems_hooks():
    snippet = """
    import torchmem
    x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.set_per_process_memory_fraction(0.5)
    del x
    torch.cuda.empty_cache()  # the reset hook
    print(json.dumps({"installed": torchmem.is_installed("cuda"),
                      "reserved": torchmem.memory_reserved("cuda:0")}))
    """
    assert run(snippet, "pluggable") == {"installed": True, "reserved": 0}
