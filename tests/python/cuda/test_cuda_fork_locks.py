"""A child forked while another thread holds one of the CUDA glue's locks must not hang.

The fork handlers hold each lock across fork() (waiting for the thread that holds it), so
the child starts with every lock free. Each case holds a lock on a thread of the parent for a
moment, forks meanwhile, and has the child take that lock and allocate; a child that has not
finished within a minute is killed and reported as hung (it does a few milliseconds of work).
"""

import os
import signal
import threading
import time

import pytest
import torch

from torchmem import _C_cuda

LOCKS = ["engine_table", "allocator", "ipc_handles", "history_contexts"]


def test_every_lock_of_the_cuda_glue_is_covered():
    assert sorted(_C_cuda.fork_lock_names()) == sorted(LOCKS)


def fork_while_held(name, work):
    holder = threading.Thread(target=_C_cuda.hold_fork_lock, args=(name, 300))
    holder.start()
    while not _C_cuda.fork_lock_held():
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:  # the child: a copy of the process, with only this thread
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    holder.join()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"exited {os.waitstatus_to_exitcode(status)}"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


@pytest.mark.parametrize("name", LOCKS)
def test_a_child_forked_while_a_cuda_lock_is_held_can_take_it_and_allocate(name):
    torch.set_num_threads(1)  # a forked child cannot use OpenMP's threads (PyTorch's rule)

    def work():
        _C_cuda.take_fork_lock(name)
        assert torch.ones(1000).sum().item() == 1000

    assert fork_while_held(name, work) == "exited 0"
