"""DataLoader workers and ``fork()``: which allocator a worker uses, and what it shares.

torchmem serves a process's CPU tensors once ``torchmem.install("cpu")`` ran *in that
process*. What that means for a ``torch.utils.data.DataLoader`` with ``num_workers > 0``
depends on how its workers start (``multiprocessing_context``):

``fork`` (the default on Linux)
    The worker is a copy of the main process made by ``fork()``, so it inherits
    torchmem as installed there, together with a *copy* of the CPU engine: the blocks
    that were allocated in the main process at the moment of the fork are allocated in
    the worker's copy too (their memory is shared copy-on-write by the kernel), and the
    forking thread's open ``torchmem.tag`` and ``leak_check`` scopes are open in the
    worker. The worker then allocates and frees through its own copy. Nothing flows
    back: the main process's statistics, tags and leak checks never see what a worker
    allocates, and a worker's ``torchmem.memory_stats()`` starts from the main process's
    figures at the fork. torchmem's C++ side holds every lock it owns (engines, tag and
    scope registries, the stack-capture table) across ``fork()`` with
    ``pthread_atfork``, so a fork made while another thread is inside the allocator
    cannot leave the child with a lock nobody will release.

``spawn`` and ``forkserver``
    The worker is a fresh interpreter. It re-imports the main script as
    ``__mp_main__`` (and unpickles the dataset), so torchmem serves the worker only if
    that import installs it: a ``torchmem.install("cpu")`` at the top level of the
    script does, one under ``if __name__ == "__main__":`` (or in ``python -m torchmem
    run``, which installs before the script runs) does not, and the worker then uses
    PyTorch's default CPU allocator. Either way the worker's engine is its own, empty
    at the start. To install in workers whatever the start method, pass
    ``worker_init_fn=torchmem.worker_init_fn`` (or call it first in your own
    ``worker_init_fn``); it is a no-op in a forked worker, where torchmem is already
    installed.

What the main process receives. Before a worker sends a batch, PyTorch moves its
tensors into shared memory (``default_collate`` even builds them there); the main
process maps that shared memory. Those tensors were not allocated by torchmem in the
main process: they are not in its statistics or leak checks, and in
``torchmem.rss_report()`` they are ``shmem``. What the training step then computes
from them is torchmem's.

``pin_memory=True``. The pinned copy of each batch is made (in a thread of the main
process) by PyTorch's pinned-memory allocator (``cudaHostAlloc`` behind a caching host
allocator), not by torchmem: pinned batches are not in torchmem's figures, with or
without ``torchmem.install("cuda")``; the CUDA tensors they are copied into are. On a
machine without a CUDA device PyTorch ignores ``pin_memory=True`` (it warns and pins
nothing).

One limit, from Python rather than torchmem: a fork made while another Python thread
is importing a module leaves the child waiting for that module's import lock forever.
torchmem loads its submodules on first use (``torchmem.tag`` imports
``torchmem.runtime.tags``), so touch the parts of torchmem you use before starting threads
that fork, or let the DataLoader fork from the main thread as it normally does.
"""

from __future__ import annotations

__all__ = ["worker_init_fn"]


def worker_init_fn(worker_id: int) -> None:
    """Installs torchmem for the CPU tensors of a DataLoader worker::

        DataLoader(dataset, num_workers=2, multiprocessing_context="spawn",
                   worker_init_fn=torchmem.worker_init_fn)

    Needed with ``spawn``/``forkserver`` workers unless the main script installs
    torchmem at import time; a no-op in ``fork`` workers. To combine it with your own
    initialization, call it first in your ``worker_init_fn``.
    """
    if isinstance(worker_id, bool) or not isinstance(worker_id, int):
        raise TypeError(
            f"torchmem.worker_init_fn: expected the worker id (an int) DataLoader passes, got {worker_id!r}; "
            "pass the function itself: DataLoader(..., worker_init_fn=torchmem.worker_init_fn)"
        )
    from torchmem.runtime import install as _install

    _install.install("cpu")
