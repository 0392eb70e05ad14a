"""CUDA graphs and private memory pools through torchmem (simulated device).

A graph replays into the addresses its capture allocated, long after the capture's
tensors were freed in Python; so those blocks live in the graph's private pool and no
allocation outside it may get them. On the simulated device kernels do not run but a
replay redoes the graph's copies, so a replay that wrote over an eager tensor shows.
"""

import pytest
import torch

import torchmem
from torchmem import _C

TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])


def pool_segments(pool) -> list[dict]:
    return [s for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] == tuple(pool)]


def test_the_graph_hazard_replay_never_writes_over_eager_tensors():
    static_in = torch.arange(1024, dtype=torch.float32).to("cuda")
    out = torch.empty(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: the cache now holds free blocks of the intermediates' size
            tmp = static_in.clone()
            out.copy_(tmp)
            del tmp
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        tmp = static_in.clone()
        tmp2 = tmp.clone()
        out.copy_(tmp2)
    graph_addresses = {tmp.data_ptr(), tmp2.data_ptr()}
    del tmp, tmp2  # the capture's intermediates, freed in Python
    with torch.cuda.stream(side):  # eager work on the capture's stream, after the capture
        eager = [torch.full((1024,), 7.0).to("cuda") for _ in range(4)]
    out.copy_(torch.zeros(1024))

    graph.replay()
    torch.cuda.synchronize()
    assert not graph_addresses & {tensor.data_ptr() for tensor in eager}
    assert all(torch.equal(tensor.cpu(), torch.full((1024,), 7.0)) for tensor in eager)
    assert torch.equal(out.cpu(), static_in.cpu())  # the replay did run its copies
    del graph, eager


def test_a_capture_on_a_cold_cache_gets_a_new_segment_in_the_graphs_pool(sim):
    torch.cuda.empty_cache()
    mallocs = sim.call_count("cudaMalloc")
    source = torch.ones(1 << 16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # cudaMalloc under capture, in relaxed mode, as PyTorch does
        result = source.clone()
    assert sim.call_count("cudaMalloc") >= mallocs + 2
    segments = pool_segments(graph.pool())
    assert len(segments) == 1
    assert segments[0]["address"] <= result.data_ptr() < segments[0]["address"] + segments[0]["total_size"]
    graph.replay()
    torch.cuda.synchronize()
    del result, graph
    torch.cuda.empty_cache()  # the pool is gone with its graph: its segment goes back
    assert pool_segments(segments[0]["segment_pool_id"]) == []


def test_a_free_during_capture_of_a_block_used_on_another_stream_waits_for_the_capture_end():
    other = torch.cuda.Stream()
    tensor = torch.empty(1 << 18, device="cuda")
    tensor.record_stream(other)
    address = tensor.data_ptr()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        del tensor  # no event may be recorded now; the free is deferred
        assert _C.cuda_engine(0).event_health()["deferred_frees"] == 1
        fresh = torch.empty(1 << 18, device="cuda")
        assert fresh.data_ptr() != address
    after = torch.empty(1, device="cuda")  # the first allocation after the capture, as in PyTorch
    assert _C.cuda_engine(0).event_health()["deferred_frees"] == 0
    del after
    torch.cuda.synchronize()
    del fresh, graph


def test_graphs_sharing_a_pool_handle_use_one_pool():
    pool = torch.cuda.graph_pool_handle()
    source = torch.ones(1 << 16).to("cuda")  # kernels do not run here: fill by copying
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first, pool=pool):
        a = source.clone()
    with torch.cuda.graph(second, pool=pool):
        b = a.clone()
    assert first.pool() == second.pool() == pool
    assert {s["segment_pool_id"] for s in torch.cuda.memory_snapshot()
            if any(blk["address"] in (a.data_ptr(), b.data_ptr()) for blk in s["blocks"])} == {pool}
    first.replay()
    second.replay()
    torch.cuda.synchronize()
    assert torch.equal(b.cpu(), torch.ones(1 << 16))
    del first, second, a, b


def test_mem_pool_and_use_mem_pool():
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(1 << 20, device="cuda")
        assert pool.use_count() == 2  # the context holds a reference, as PyTorch's does
    outside = torch.empty(1 << 20, device="cuda")
    assert pool.use_count() == 1
    segments = pool.snapshot()
    assert [s["segment_pool_id"] for s in segments] == [pool.id]
    assert [b["address"] for b in segments[0]["blocks"] if b["state"] == "active_allocated"] == [
        inside.data_ptr()]
    if TORCH >= (2, 13):  # PyTorch counts reserved bytes per private pool from 2.13
        key = f"reserved_bytes_by_private_pools.{pool.id[0]}_{pool.id[1]}.all.current"
        assert torch.cuda.memory_stats()[key] == segments[0]["total_size"]

    del inside
    replacement = torch.empty(1 << 20, device="cuda")  # outside the pool: not the pool's block
    assert replacement.data_ptr() not in {b["address"] for b in segments[0]["blocks"]}
    reserved = torch.cuda.memory_reserved()
    del pool
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved
    del outside, replacement


@pytest.mark.skipif(TORCH < (2, 10), reason="MemPool(no_split=) arrived in torch 2.10")
def test_mem_pool_no_split_keeps_whole_blocks():
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool):
        first = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        address = first.data_ptr()
        del first
        second = torch.empty(1 << 19, dtype=torch.uint8, device="cuda")
    block = next(b for s in pool.snapshot() for b in s["blocks"] if b["address"] == second.data_ptr())
    assert block["size"] == 2 << 20  # the 2 MiB small-pool segment, not split
    assert second.data_ptr() == address
    del second, pool


def test_mem_pool_use_on_oom_lends_its_free_blocks_when_the_device_is_full(sim):
    sim.set_memory_capacity(64 << 20)
    pool = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(pool):
        cached = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")
    address = cached.data_ptr()
    del cached
    torchmem.set_memory_limit(60 << 20, device="cuda:0")
    borrowed = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")
    assert borrowed.data_ptr() == address
    del borrowed, pool


def test_checkpoint_state_restores_a_pool_as_cudagraph_trees_use_it():
    device = 0
    pool = torch.cuda.graph_pool_handle()

    def in_pool(allocate):
        torch._C._cuda_beginAllocateCurrentThreadToPool(device, pool)
        try:
            return allocate()
        finally:
            torch._C._cuda_endAllocateToPool(device, pool)
            torch._C._cuda_releasePool(device, pool)

    # The tree's own reference keeps the pool alive between recordings.
    torch._C._cuda_beginAllocateCurrentThreadToPool(device, pool)
    torch._C._cuda_endAllocateToPool(device, pool)
    a, b = in_pool(lambda: (torch.empty(1 << 18, device="cuda"), torch.empty(1 << 19, device="cuda")))
    state = torch._C._cuda_getCheckpointState(device, pool)
    b_address = b.data_ptr()
    del b  # execution moves to another path, which reuses b's memory
    c = in_pool(lambda: torch.empty(1 << 19, device="cuda"))
    assert c.data_ptr() == b_address

    # Back to the first path: c's storage dies with the restore; b's block is live again.
    torch._C._cuda_setCheckpointPoolState(device, state, [c.untyped_storage()._cdata], [])
    assert torch._C._cuda_checkPoolLiveAllocations(device, pool, {a.data_ptr(), b_address})
    torch._C._cuda_cudaCachingAllocator_raw_delete(b_address)  # what the tree does with it
    assert torch._C._cuda_checkPoolLiveAllocations(device, pool, {a.data_ptr()})
    del a, c
    assert torch._C._cuda_checkPoolLiveAllocations(device, pool, set())
    torch._C._cuda_releasePool(device, pool)
    torch.cuda.empty_cache()
    assert [s for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] == pool] == []


def test_checkpoint_of_an_unknown_pool_is_a_clear_error():
    with pytest.raises(RuntimeError, match="pool"):
        torch._C._cuda_getCheckpointState(0, (12345, 0))


def test_torch_compile_cudagraphs_backend_runs_on_torchmem():
    def f(x):
        return x.clone().clone()

    compiled = torch.compile(f, backend="cudagraphs")
    for length in (1024, 1024, 1024, 2048, 2048):  # record, replay, a second path
        x = torch.full((length,), 3.0).to("cuda")
        out = compiled(x)
        assert torch.equal(out.cpu(), torch.full((length,), 3.0))
    # torchmem's own vmm.* keys (present once expandable segments were used in this
    # process) aside, the same statistics as PyTorch reports.
    ours = {k: v for k, v in torchmem.memory_stats("cuda:0").items() if not k.startswith("vmm.")}
    assert ours == torch.cuda.memory_stats(0)
    pools = {s["segment_pool_id"] for s in torch.cuda.memory_snapshot()} - {(0, 0)}
    assert pools  # the cudagraph tree's private pool
    del out, compiled
    torch._dynamo.reset()
    torch._inductor.cudagraph_trees.reset_cudagraph_trees()  # releases the tree's pool
    torch.cuda.empty_cache()
    assert not pools & {s["segment_pool_id"] for s in torch.cuda.memory_snapshot()}
