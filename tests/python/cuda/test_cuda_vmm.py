"""expandable_segments:True through torchmem: the virtual-memory placement on the driver's API.

With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (here switched on at run time with
``torch.cuda.memory._set_allocator_settings``, which PyTorch parses and torchmem follows),
torchmem's CUDA engines reserve address ranges once (cuMemAddressReserve) and map physical
pages (cuMemCreate + cuMemMap + cuMemSetAccess) where live blocks need them: 2 MiB in the small
pool, 20 MiB in the large one, as PyTorch's expandable segments. The
simulated device implements that driver API over memfd-backed host pages, so these tests
check what a GPU would show: the device's mapped bytes equal ``torch.cuda.memory_reserved()``,
data lives across page boundaries, driver failures become clear errors, and the allocator
stays consistent after each.
"""

import os

import pytest
import torch

import torchmem
from allocator_settings import empty_cache, expandable, set_allocator_settings  # noqa: F401 (a fixture)
from torchmem import _C

MiB = 1 << 20
LARGE_PAGE = 20 * MiB  # the large pool's physical pages (PyTorch's kLargeBuffer)
TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])
# The fixture below switches expandable segments on at run time; before torch 2.11 PyTorch has
# no hook that passes such a change on to an allocator (test_cuda_alloc_conf.py covers the
# environment variable on every release).
pytestmark = pytest.mark.skipif(
    TORCH < (2, 11), reason="allocator settings changed at run time reach torchmem from torch 2.11")


def engine():
    return _C.cuda_engine(0)


def filled(count: int, value: int) -> torch.Tensor:
    """A device tensor holding ``value`` (copied from the host: kernels do not run here)."""
    return torch.full((count,), value, dtype=torch.uint8).to("cuda")


def holds(tensor: torch.Tensor, value: int) -> bool:
    return bool((tensor.cpu() == value).all())


def mapped_bytes(sim) -> int:
    return sim.vmm_stats()["mapped_bytes"]


def consistent():
    engine().check_invariants()
    stats = torch.cuda.memory_stats()
    assert stats["reserved_bytes.all.current"] == torch.cuda.memory_reserved()


def test_statistics_keys_are_pytorchs_again_once_expandable_segments_are_off():
    """The vmm.* figures exist while virtual memory is in use; after it, torchmem's statistics
    have PyTorch's keys again, whatever an earlier test switched on."""
    empty_cache()
    set_allocator_settings("expandable_segments:True")
    try:
        x = filled(MiB, 1)
        assert torchmem.memory_stats("cuda:0")["vmm.mapped_bytes"] > 0
        del x
    finally:
        set_allocator_settings("expandable_segments:False")
        empty_cache()
    stats = torchmem.memory_stats("cuda:0")
    assert not [key for key in stats if key.startswith("vmm.")]
    assert stats == torch.cuda.memory_stats(0)


def test_pages_are_mapped_as_blocks_need_them_and_unmapped_by_empty_cache(sim, expandable):
    reserves = sim.call_count("cuMemAddressReserve")
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # the large pool: a 20 MiB page
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # shares a's page
    assert torch.cuda.memory_reserved() == LARGE_PAGE  # PyTorch's segments: 40 MiB (two 20 MiB)
    assert mapped_bytes(sim) == torch.cuda.memory_reserved()
    assert sim.call_count("cuMemAddressReserve") == reserves + 1  # one range per pool and stream
    stats = torchmem.memory_stats("cuda:0")
    assert stats["vmm.mapped_bytes"] == LARGE_PAGE
    assert (stats["vmm.page_size"], stats["vmm.large_page_size"]) == (2 * MiB, LARGE_PAGE)
    # Both snapshots show the range as PyTorch shows an expandable segment: up to its last
    # used block (the rest of the reserved range is address space, not memory).
    for snapshot in (torch.cuda.memory_snapshot(), torchmem.snapshot("cuda:0")["segments"]):
        assert [(s["is_expandable"], s["total_size"]) for s in snapshot] == [(True, 6 * MiB)]
    consistent()

    maps = sim.call_count("cuMemMap")
    del b
    again = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # a cache hit: no driver call
    assert sim.call_count("cuMemMap") == maps
    del a, again
    assert mapped_bytes(sim) == torch.cuda.memory_reserved() == LARGE_PAGE  # unmapped lazily
    torch.cuda.empty_cache()
    assert mapped_bytes(sim) == torch.cuda.memory_reserved() == 0
    assert sim.vmm_stats()["allocated_bytes"] == 0  # every physical page went back
    consistent()


def test_values_survive_across_page_boundaries(expandable):
    pattern = torch.arange(45 * MiB // 4, dtype=torch.int32)  # 45 MiB: three 20 MiB pages
    neighbour = filled(MiB, 7)
    on_device = pattern.to("cuda")
    copy = on_device.clone()  # device to device, into pages mapped for it
    assert torch.equal(on_device.cpu(), pattern)
    assert torch.equal(copy.cpu(), pattern)
    assert holds(neighbour, 7)
    del copy
    torch.cuda.empty_cache()  # unmaps only pages no live tensor touches
    assert torch.equal(on_device.cpu(), pattern)
    assert holds(neighbour, 7)


@pytest.mark.parametrize("call, error, exception, words", [
    ("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", torch.OutOfMemoryError, "cuMemCreate"),
    ("cuMemCreate", "CUDA_ERROR_UNKNOWN", RuntimeError, "cuMemCreate"),
    ("cuMemMap", "CUDA_ERROR_INVALID_VALUE", RuntimeError, "cuMemMap"),
    ("cuMemSetAccess", "CUDA_ERROR_UNKNOWN", RuntimeError, "cuMemSetAccess"),
])
def test_driver_failures_are_clear_errors_and_leave_the_allocator_consistent(
        sim, expandable, call, error, exception, words):
    held = filled(MiB, 1)
    reserved = torch.cuda.memory_reserved()
    sim.fail_next(call, 1000, error)
    with pytest.raises(exception) as raised:
        torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
    assert words in str(raised.value) and "cuda:0" in str(raised.value)
    consistent()
    # The pages mapped before the failure were unmapped and freed again.
    assert mapped_bytes(sim) == torch.cuda.memory_reserved() == reserved
    sim.clear_faults()
    after = filled(16 * MiB, 3)  # works again
    assert holds(after, 3) and holds(held, 1)
    assert mapped_bytes(sim) == torch.cuda.memory_reserved()
    consistent()


def test_memory_limit_and_the_out_of_memory_ladder(sim, expandable):
    torch.cuda.set_per_process_memory_fraction(64 * MiB / torch.cuda.get_device_properties(0).total_memory)
    try:
        first = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # another stream: its own range, cached pages here
            cached = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
            del cached
        retries = torch.cuda.memory_stats()["num_alloc_retries"]
        # 40 + 20 cached + 20 new > 64 MiB: the ladder unmaps the side stream's cached pages.
        second = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_reserved() <= 64 * MiB
        assert mapped_bytes(sim) == torch.cuda.memory_reserved()
        reserved = {k: torch.cuda.memory_stats()[f"reserved_bytes.all.{k}"] for k in ("current", "peak")}
        with pytest.raises(torch.OutOfMemoryError) as raised:
            torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        assert "memory limit" in str(raised.value)
        assert torch.cuda.memory_stats()["num_alloc_retries"] > retries
        # The failed allocation mapped no page up to the limit: not even for a moment (the
        # ladder may have given cached pages back: current can only have fallen).
        after = {k: torch.cuda.memory_stats()[f"reserved_bytes.all.{k}"] for k in ("current", "peak")}
        assert after["peak"] == reserved["peak"]
        assert after["current"] <= reserved["current"]
        consistent()
        del first, second
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_a_mem_pool_with_use_on_oom_lends_the_pages_it_holds(sim, expandable):
    pool = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(pool):
        cached = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
    address = cached.data_ptr()
    del cached  # two pages cached in the pool's range, never stolen for others
    creates = sim.call_count("cuMemCreate")
    torchmem.set_memory_limit(40 * MiB, device="cuda:0")  # reached: no page may be created
    try:
        borrowed = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        assert borrowed.data_ptr() == address
        assert sim.call_count("cuMemCreate") == creates
        assert torch.cuda.memory_reserved() == 40 * MiB
        consistent()
        del borrowed
    finally:
        torchmem.set_memory_limit(0, device="cuda:0")
    del pool


def test_cuda_graph_private_pools_keep_their_pages(sim, expandable):
    source = torch.arange(MiB, dtype=torch.float32, device="cuda")  # 4 MiB
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = source.clone()
    address = result.data_ptr()
    pool = [s for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] == tuple(graph.pool())]
    assert [s["is_expandable"] for s in pool] == [True]
    del result  # the graph still replays into its pages
    torch.cuda.empty_cache()
    mapped = mapped_bytes(sim)
    eager = [torch.empty(4 * MiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    assert address not in {t.data_ptr() for t in eager}
    source.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert mapped_bytes(sim) >= mapped  # the pool's pages were neither unmapped nor stolen
    consistent()
    del graph, eager
    torch.cuda.empty_cache()
    assert mapped_bytes(sim) == torch.cuda.memory_reserved()


def test_a_forked_child_leaves_the_parents_pages_alone(sim, expandable):
    held = filled(3 * MiB, 5)
    mapped = mapped_bytes(sim)
    pid = os.fork()
    if pid == 0:  # the child: CPU tensors through torchmem work; CUDA is refused by PyTorch
        code = 0
        try:
            assert int(torch.ones(1000).sum()) == 1000
            try:
                torch.empty(10, device="cuda")
                code = 3
            except RuntimeError as error:
                code = 0 if "forked subprocess" in str(error) else 4
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert mapped_bytes(sim) == mapped
    assert holds(held, 5)
    consistent()


def test_each_device_maps_its_own_pages(sim, expandable):
    on_first = filled(MiB, 1)  # a 2 MiB page of the small pool on cuda:0
    with torch.cuda.device(1):
        on_second = filled(25 * MiB, 2)  # two 20 MiB pages of the large pool on cuda:1
    assert on_second.device == torch.device("cuda:1")
    assert (torch.cuda.memory_reserved(0), torch.cuda.memory_reserved(1)) == (2 * MiB, 40 * MiB)
    assert mapped_bytes(sim) == 42 * MiB
    expandable_devices = {s["device"] for s in torch.cuda.memory_snapshot() if s["is_expandable"]}
    assert expandable_devices == {0, 1}
    assert holds(on_first, 1) and holds(on_second, 2)
    _C.cuda_engine(1).check_invariants()
    consistent()
    del on_first, on_second
    torch.cuda.empty_cache()  # every device's cache, as PyTorch's
    assert mapped_bytes(sim) == 0
    assert torch.cuda.memory_reserved(0) == torch.cuda.memory_reserved(1) == 0


# Driver calls that a warm training step must not make: mapping changes, segment calls, and
# the stream synchronisation an unmap starts with.
DRIVER_CALLS = ("cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemRelease",
                "cuMemAddressReserve", "cudaMalloc", "cudaFree", "cudaStreamSynchronize")
# A step's allocations: small-pool tensors and large ones of sizes that are not multiples of a
# page, freed in another order than allocated so that places are reused differently each time.
STEP_SIZES = (512, 3 * MiB, 100_000, 17 * MiB, 45 * MiB, 6 * MiB, 700_000, 2 * MiB + 1, 33 * MiB,
              4096, 9 * MiB, 61 * MiB)


def training_step() -> None:
    live = []
    for index, size in enumerate(STEP_SIZES):
        live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        if index % 3 == 2:
            del live[1]
    del live


def driver_calls(sim) -> dict:
    return {call: sim.call_count(call) for call in DRIVER_CALLS}


def test_warm_steps_make_no_driver_call_and_no_synchronization(sim, expandable):
    training_step()  # cold: pages are created and mapped
    cold = driver_calls(sim)
    assert cold["cuMemCreate"] > 0
    synchronizing = sim.synchronizing_calls()
    for _ in range(3):
        training_step()
        assert driver_calls(sim) == cold
    assert sim.synchronizing_calls() == synchronizing
    consistent()


def test_large_blocks_map_twenty_mib_pages_small_blocks_two(sim, expandable):
    creates, maps = sim.call_count("cuMemCreate"), sim.call_count("cuMemMap")
    device_bytes = sim.vmm_stats()["allocated_bytes"]
    large = [torch.empty(4 * MiB, dtype=torch.uint8, device="cuda") for _ in range(5)]
    # Five 4 MiB tensors in one 20 MiB page: one cuMemCreate and one cuMemMap (2 MiB pages: ten).
    assert (sim.call_count("cuMemCreate"), sim.call_count("cuMemMap")) == (creates + 1, maps + 1)
    assert sim.vmm_stats()["allocated_bytes"] == device_bytes + LARGE_PAGE
    small = torch.empty(1000, dtype=torch.uint8, device="cuda")
    assert sim.vmm_stats()["allocated_bytes"] == device_bytes + LARGE_PAGE + 2 * MiB
    assert torch.cuda.memory_reserved() == LARGE_PAGE + 2 * MiB
    consistent()
    del large, small
    torch.cuda.empty_cache()
    assert sim.vmm_stats()["allocated_bytes"] == device_bytes
