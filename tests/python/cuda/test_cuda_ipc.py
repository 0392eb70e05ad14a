"""CUDA tensors sent to other processes (torch.multiprocessing) from and to torchmem.

torchmem shares memory as PyTorch's allocator does: the segment holding the tensor
(cudaIpcGetMemHandle) and the tensor's offset in it, in PyTorch's handle format, so
either side may run PyTorch's allocator. The simulated device shares its memory between
processes (tests/simcuda, IPC).
"""

import pytest
import torch
import torch.multiprocessing as mp

import torchmem

from ipc_children import consume
from processes import run


def send_two_tensors_of_one_segment(use_torchmem_in_consumer: bool) -> tuple[dict, list]:
    context = mp.get_context("spawn")
    tensors, results = context.Queue(), context.Queue()
    # Killed below if it is still waiting: when sending fails (the queue's feeder thread only
    # prints a pickling error), the child waits for tensors forever, and multiprocessing would
    # join it forever at exit: the suite would hang, not fail.
    child = context.Process(target=consume, args=(use_torchmem_in_consumer, tensors, results))
    child.start()
    try:
        allocated_before = torchmem.memory_allocated("cuda:0")
        first = torch.full((1000,), 3.0).to("cuda")
        second = torch.full((1000,), 5.0).to("cuda")  # 4096 bytes further in the same segment
        tensors.put((first, second))
        answer = results.get(timeout=300)
        tensors.put(None)
        child.join(timeout=300)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0
    after = [first.cpu().tolist()[:3], second.cpu().tolist()[:3]]
    del first, second
    torch.cuda.ipc_collect()  # PyTorch holds sent blocks until the consumer is done: free them
    assert torchmem.memory_allocated("cuda:0") == allocated_before
    return answer, after


@pytest.mark.parametrize("consumer", ["torchmem", "native"])
def test_a_tensor_shared_by_torchmem_is_read_and_written_by_the_consumer(consumer):
    answer, after = send_two_tensors_of_one_segment(consumer == "torchmem")
    assert answer["seen"] == ([3.0] * 3, [5.0] * 3)
    assert answer["same_segment_offset"] == 4096  # offsets within the shared segment hold
    assert answer["backend"] == "native"  # torchmem's name too (see cuda_allocator.h)
    assert after == [[3.0] * 3, [6.0] * 3]  # the consumer's write is in the producer's tensor


def test_a_tensor_shared_by_pytorchs_allocator_is_opened_by_torchmem():
    snippet = """
    import sys
    sys.path.insert(0, "tests/python/cuda")
    import torch.multiprocessing as mp
    from ipc_children import consume
    if __name__ == "__main__":
        context = mp.get_context("spawn")
        tensors, results = context.Queue(), context.Queue()
        # Daemonic: if the snippet fails while the child waits, exit terminates it (see above).
        child = context.Process(target=consume, args=(True, tensors, results), daemon=True)
        child.start()
        first = torch.full((1000,), 3.0).to("cuda")
        second = torch.full((1000,), 5.0).to("cuda")
        tensors.put((first, second))
        answer = results.get(timeout=300)
        tensors.put(None)
        child.join(timeout=300)
        answer["after"] = second.cpu().tolist()[:3]
        answer["exitcode"] = child.exitcode
        print(json.dumps(answer))
    """
    answer = run(snippet, "native")
    assert answer["seen"] == [[3.0] * 3, [5.0] * 3]
    assert answer["after"] == [6.0] * 3 and answer["exitcode"] == 0


def test_the_handle_is_pytorchs_format_for_the_whole_segment():
    # In a process of its own: PyTorch keeps shared storages that no consumer opened.
    snippet = """
    storage = torch.UntypedStorage(1000, device="cuda")
    neighbour = torch.UntypedStorage(1000, device="cuda")
    _, handle, size, offset, *_ = neighbour._share_cuda_()
    [base] = [s["address"] for s in torch.cuda.memory_snapshot()
              if s["address"] <= neighbour.data_ptr() < s["address"] + s["total_size"]]
    print(json.dumps({"prefix": list(handle[:2]), "length": len(handle), "size": size,
                      "offset_in_segment": offset == neighbour.data_ptr() - base,
                      "one_handle_per_segment": storage._share_cuda_()[1] == handle}))
    """
    # PyTorch's format: its version (3 from torch 2.13, 2 before), 'c' (cudaMalloc), the
    # 64-byte cudaIpcMemHandle_t.
    version = 3 if torch.torch_version.TorchVersion(torch.__version__.split("+")[0]) >= (2, 13) else 2
    assert run(snippet, "torchmem") == {"prefix": [version, ord("c")], "length": 66, "size": 1000,
                                        "offset_in_segment": True, "one_handle_per_segment": True}
