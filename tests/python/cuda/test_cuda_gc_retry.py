"""The out-of-memory ladder's last rung (gc.collect(), then one retry) runs only where it is safe.

Not while a CUDA graph is captured: the collector's finalizers may make calls that a capture
forbids from any thread (cudaFree, event queries, synchronization), which would invalidate it.
Not on a thread Python does not know (here TorchScript's inter-op pool): the allocator would take
the GIL from inside an allocation, where the thread holding it may be waiting for this one.
"""

import gc

import pytest
import torch

import torchmem

MiB = 1 << 20


class Cycle:
    """Garbage that only the cycle collector frees."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.me = self


@pytest.fixture
def cycles_not_collected_by_themselves():
    torchmem.set_memory_limit(64 * MiB, device="cuda:0")
    gc.collect()
    gc.disable()
    yield
    gc.enable()
    gc.collect()


def test_no_garbage_collection_while_a_graph_is_captured(cycles_not_collected_by_themselves):
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(capturing)

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    capturing = False
    gc.callbacks.append(count)
    try:
        with torch.cuda.graph(graph, stream=stream):  # collects garbage before it begins
            capturing = True
            Cycle(torch.empty(40 * MiB, dtype=torch.uint8, device="cuda"))
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
            capturing = False
    finally:
        gc.callbacks.remove(count)
    assert True not in collections
    del graph


@torch.jit.script
def allocate(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device="cuda")


@torch.jit.script
def allocate_on_an_interop_thread(n: int) -> torch.Tensor:
    return torch.jit.wait(torch.jit.fork(allocate, n))


def test_no_garbage_collection_on_a_thread_python_does_not_know(cycles_not_collected_by_themselves):
    Cycle(torch.empty(40 * MiB, dtype=torch.uint8, device="cuda"))
    with pytest.raises(RuntimeError, match="out of memory"):
        allocate_on_an_interop_thread(40 * MiB)
    # The same allocation from Python's own thread collects the cycle and succeeds.
    x = allocate(40 * MiB)
    del x
