"""The consumer side of the IPC tests: runs in a process started with ``spawn``.

Kept apart from the test module so that the child imports only what it needs and
chooses its own allocator before CUDA starts there.
"""

from __future__ import annotations

import torch


def consume(use_torchmem: bool, tensors: "torch.multiprocessing.Queue",
            results: "torch.multiprocessing.Queue") -> None:
    """Reads the tensors it is sent, overwrites the second one, reports what it saw."""
    if use_torchmem:
        import torchmem

        torchmem.install()
    first, second = tensors.get()
    seen = (first.cpu().tolist()[:3], second.cpu().tolist()[:3])
    second.copy_(torch.full(second.shape, 6.0))  # a copy: kernels do not run on the simulator
    torch.cuda.synchronize()
    results.put({"seen": seen, "backend": torch.cuda.get_allocator_backend(),
                 "same_segment_offset": second.data_ptr() - first.data_ptr()})
    del first, second
    tensors.get()  # wait until the producer has read the answer
