"""CPU storages PyTorch makes with c10's default allocator come from torchmem too.

torch.UntypedStorage(n), storage.clone() and copy.deepcopy of CPU tensors allocate with
c10::GetDefaultCPUAllocator(), which c10::SetCPUAllocator does not reach; install("cpu")
puts a stand-in in that allocator's place (csrc/torchmem/torch/cpu_allocator.h). These
tests hold it to what the header promises: memory from before, during and after an
install is freed by whoever made it, in any order; raw allocations pair across installs;
threads and forked children allocate safely.
"""

from __future__ import annotations

import copy
import os
import threading

import pytest
import torch

import torchmem
from torchmem import _C


@pytest.fixture(autouse=True)
def installed_again_afterwards():
    yield
    torchmem.install("cpu")  # other tests expect CPU tensors from torchmem


def engine_owns(pointer: int) -> bool:
    try:
        _C.cpu_engine().block(pointer)
        return True
    except ValueError:
        return False


def test_the_default_allocator_is_taken_over_on_this_torch():
    torchmem.install("cpu")
    assert _C.cpu_default_allocator_route() == (True, "")


def test_untyped_storage_clone_and_deepcopy_come_from_torchmem_while_installed():
    torchmem.install("cpu")
    storage = torch.UntypedStorage(4096)
    tensor = torch.ones(1000)
    clone = storage.clone()
    copied = copy.deepcopy(tensor)

    assert engine_owns(storage.data_ptr()) and engine_owns(clone.data_ptr())
    assert engine_owns(copied.untyped_storage().data_ptr())
    assert torch.equal(copied, tensor)


def test_memory_from_before_during_and_after_an_install_is_freed_in_any_order():
    torchmem.uninstall("cpu")
    before = torch.UntypedStorage(4096)
    torchmem.install("cpu")
    during = torch.UntypedStorage(4096)
    during_pointer = during.data_ptr()
    torchmem.uninstall("cpu")
    after = torch.UntypedStorage(4096)

    assert not engine_owns(before.data_ptr()) and engine_owns(during_pointer) and not engine_owns(after.data_ptr())
    del before, during, after  # each by its own deleter; a wrong one would crash or report
    assert not engine_owns(during_pointer)


def test_raw_allocations_pair_across_installs_in_both_directions():
    torchmem.uninstall("cpu")
    made_before = _C.default_cpu_allocator_raw_allocate(4096)
    torchmem.install("cpu")
    made_during = _C.default_cpu_allocator_raw_allocate(4096)
    allocated = torchmem.memory_stats("cpu")["allocated_bytes.all.current"]

    _C.default_cpu_allocator_raw_deallocate(made_before)  # c10's pointer, released during an install
    assert torchmem.memory_stats("cpu")["allocated_bytes.all.current"] == allocated
    torchmem.uninstall("cpu")
    _C.default_cpu_allocator_raw_deallocate(made_during)  # torchmem's, released after it
    assert torchmem.memory_stats("cpu")["allocated_bytes.all.current"] == allocated - 4096


def test_threads_allocating_while_it_is_installed_and_uninstalled_lose_nothing():
    torchmem.install("cpu")
    errors: list = []
    stop = threading.Event()

    def churn():
        try:
            while not stop.is_set():
                for _ in range(50):
                    source = torch.ones(257)
                    assert torch.equal(copy.deepcopy(source), source)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(20):
        torchmem.uninstall("cpu")
        torchmem.install("cpu")
    stop.set()
    for thread in threads:
        thread.join()

    assert errors == []
    _C.cpu_engine().check_invariants()  # raises if the pool is inconsistent


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_deep_copies_through_its_own_engine_and_frees_what_the_parent_made():
    torchmem.install("cpu")
    inherited = copy.deepcopy(torch.ones(1000))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        status = 1
        try:
            copied = copy.deepcopy(torch.ones(1000))
            owned = engine_owns(copied.untyped_storage().data_ptr())
            del inherited, copied
            status = 0 if owned else 2
        finally:
            os.write(write, bytes([status]))
            os._exit(0)
    os.close(write)
    status = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert status == bytes([0])
    del inherited
