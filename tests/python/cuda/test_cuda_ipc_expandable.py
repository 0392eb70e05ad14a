"""CUDA IPC of expandable-segment memory, from and to torchmem (torch.multiprocessing).

PyTorch shares a tensor in an expandable segment as the physical handles under its block,
exported as POSIX file descriptors that the consumer copies with pidfd_getfd (handle type
'e'). torchmem's virtual-memory placement shares the same way, so a consumer with either
allocator maps the producer's pages, and torchmem opens the handles PyTorch's allocator makes.
The simulated device exports its physical allocations as memfd descriptors (tests/simcuda,
virtual memory); each producer runs in a process of its own with expandable segments on.
"""

import struct

import pytest
import simcuda
import torch

from processes import run

VERSION = 3 if torch.torch_version.TorchVersion(torch.__version__.split("+")[0]) >= (2, 13) else 2
# PyTorch's expandable segments need NVML (tests/simcuda/README.md).
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
              "LD_PRELOAD": simcuda.preload(nvml=True)}

PRODUCER = """
import os
sys.path.insert(0, "tests/python/cuda")
import torch.multiprocessing as mp
from ipc_children import consume
if __name__ == "__main__":
    context = mp.get_context("spawn")
    tensors, results = context.Queue(), context.Queue()
    # Daemonic: if the snippet fails while the child waits, exit terminates it.
    child = context.Process(target=consume, args=({consumer_torchmem}, tensors, results),
                            daemon=True)
    child.start()
    first = torch.full((1000,), 3.0).to("cuda")
    second = torch.full((1000,), 5.0).to("cuda")  # 4096 bytes further, on the same page
    handle = second.untyped_storage()._share_cuda_()[1]
    tensors.put((first, second))
    answer = results.get(timeout=300)
    tensors.put(None)
    child.join(timeout=300)
    answer["after"] = second.cpu().tolist()[:3]
    answer["exitcode"] = child.exitcode
    answer["handle"] = list(handle)
    answer["pid"] = os.getpid()
    print(json.dumps(answer))
"""


def share(producer: str, consumer: str) -> dict:
    snippet = PRODUCER.replace("{consumer_torchmem}", str(consumer == "torchmem"))
    return run(snippet, producer, env=EXPANDABLE)


def header(handle: list) -> tuple:
    """(version, type, pid, handle size, handle count, handle type or None) of an 'e' handle."""
    raw = bytes(handle)
    pid, size, count = struct.unpack_from("<i4xQQ", raw, 2)
    kind = struct.unpack_from("<i", raw, 26)[0] if raw[0] >= 3 else None
    return raw[0], chr(raw[1]), pid, size, count, kind


@pytest.mark.parametrize("consumer", ["torchmem", "native"])
def test_a_tensor_in_torchmems_expandable_memory_is_shared(consumer):
    answer = share("torchmem", consumer)
    assert answer["exitcode"] == 0
    assert answer["seen"] == [[3.0] * 3, [5.0] * 3]
    assert answer["same_segment_offset"] == 4096  # both tensors in the one mapping opened
    assert answer["after"] == [6.0] * 3  # the consumer's write is in the producer's pages
    # PyTorch's expandable format: one 2 MiB physical handle (torchmem's page), a POSIX
    # file descriptor of the producer's.
    version, kind, pid, size, count, handle_type = header(answer["handle"])
    assert (version, kind, pid, size, count) == (VERSION, "e", answer["pid"], 2 << 20, 1)
    assert handle_type in (None, 1)  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    header_bytes = 32 if VERSION >= 3 else 24
    assert len(answer["handle"]) == 2 + header_bytes + 4 * count


def test_torchmem_opens_a_tensor_shared_from_pytorchs_expandable_segments():
    answer = share("native", "torchmem")
    assert header(answer["handle"])[:2] == (VERSION, "e")  # PyTorch's expandable format
    assert answer["exitcode"] == 0
    assert answer["seen"] == [[3.0] * 3, [5.0] * 3]
    assert answer["same_segment_offset"] == 4096
    assert answer["after"] == [6.0] * 3
