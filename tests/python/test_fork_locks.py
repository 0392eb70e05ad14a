"""A child forked while another thread holds one of torchmem's Python locks must not hang.

Each case holds a lock in a thread, forks, and has the child do what needs that lock; a
child that has not finished within a minute is killed and reported as hung (it does a
few milliseconds of work).
"""

import os
import signal
import threading
import time

import pytest
import torch

import torchmem
from torchmem.runtime import install as _install
from torchmem.leaks import check as _leak
from torchmem.reports import snapshot as _snapshot
from torchmem.stacks import capture as stack_capture


def child_finishes(lock, work) -> str:
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: a copy of the process, with only this thread
        try:
            work()
        finally:
            os._exit(0)
    release.set()
    thread.join()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"exited {os.waitstatus_to_exitcode(status)}"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def check_leaks():
    with torchmem.leak_check(raise_on_leak=False):
        torch.ones(3)


@pytest.mark.parametrize(
    "lock, work",
    [
        (_leak._open_checks_lock, check_leaks),
        (_install._lock, lambda: torchmem.install("cpu")),
        (stack_capture._history_lock, lambda: torchmem.record_history(True)),
        (_snapshot._trace_lock, lambda: torchmem.record_trace(10)),
    ],
    ids=["leak_check", "install", "record_history", "record_trace"],
)
def test_a_child_forked_while_a_lock_is_held_can_use_it(lock, work):
    torchmem.install("cpu")
    torch.set_num_threads(1)  # a forked child cannot use OpenMP's threads (PyTorch's rule)
    assert child_finishes(lock, work) == "exited 0"
