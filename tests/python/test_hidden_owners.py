"""Holders a walk over gc.get_referrers cannot see, and the frames it must not disturb.

numpy arrays are not tracked by Python's collector, so a tensor viewed by one has no
referrer the walk can find; TorchScript modules keep tensors in C++; the owner search reads
running functions' locals, which on Python 3.10-3.12 must leave no snapshot behind.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch

import torchmem
from leak_helpers import block_triple, collector_paused, owner_paths, torchmem_cpu  # noqa: F401
from torchmem.leaks import owners as _owners


class Locator:
    """Like matplotlib's FixedLocator: keeps the tick positions it was given as an array."""

    def __init__(self, locs):
        self.locs = np.asarray(locs)


PLOTS: dict = {}


def plot_with_tensor_ticks() -> None:
    ticks = torch.arange(256, dtype=torch.float32)
    PLOTS["figure"] = Locator(ticks)  # np.asarray(tensor) views the tensor's memory


def test_a_numpy_array_viewing_a_tensor_is_named_as_its_holder():
    with torchmem.leak_check(raise_on_leak=False) as report:
        plot_with_tensor_ticks()

    (finding,) = report.reachable
    assert owner_paths(finding) == [f"{__name__}.PLOTS['figure'].locs.base"]
    assert "no Python object" not in report.render()
    PLOTS.clear()


RESULTS: list = []


def test_a_numpy_array_in_a_dict_of_arrays_is_named_through_the_dict():
    # A dict that holds only untracked objects (arrays, numbers) is untracked too: the
    # walk must look inside it to find the array, on every Python.
    with torchmem.leak_check(raise_on_leak=False) as report:
        RESULTS.append({"step": 3, "view": torch.arange(256, dtype=torch.float32).numpy()})

    (finding,) = report.reachable
    assert owner_paths(finding) == [f"{__name__}.RESULTS[0]['view'].base"]
    RESULTS.clear()


def test_an_array_viewing_an_array_viewing_a_tensor_is_named_from_the_outer_array():
    with torchmem.leak_check(raise_on_leak=False) as report:
        RESULTS.append((torch.arange(256, dtype=torch.float32).numpy()[::2],))

    (finding,) = report.reachable
    assert owner_paths(finding) == [f"{__name__}.RESULTS[0][0].base.base"]
    RESULTS.clear()


def test_a_numpy_view_inside_cycle_garbage_is_found_as_the_cycle_holder():
    class Node:
        def __init__(self):
            self.me = self
            self.view = torch.ones(256).numpy()

    with collector_paused(), torchmem.leak_check(raise_on_leak=False) as report:
        Node()

    (finding,) = report.cycle
    assert owner_paths(finding) == ["<Node>.view.base"]


class Scaler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.ones(256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


SCRIPTED: dict = {}


def script_a_module() -> None:
    module = Scaler()
    SCRIPTED["scaler"] = torch.jit.script(module)


def test_a_tensor_a_torchscript_module_holds_in_cpp_is_named_through_the_module():
    with torchmem.leak_check(raise_on_leak=False) as report:
        script_a_module()

    # The scripted module keeps the original module alive: its forward wraps the original's.
    (finding,) = report.reachable
    assert owner_paths(finding) == [f"{__name__}.SCRIPTED['scaler'].forward.__wrapped__.__self__.scale"]
    SCRIPTED.clear()


def script_and_drop() -> None:
    torch.jit.script(Scaler())


def test_a_module_torchscript_keeps_from_cpp_after_python_dropped_it_is_said_to_be_held_from_cpp():
    with torchmem.leak_check(raise_on_leak=False) as report:
        script_and_drop()

    text = report.render()
    assert "no Python object refers to it" not in text
    for finding in report.reachable:  # what TorchScript keeps (if anything) is explained
        assert finding.owners or finding.note, text


def test_a_block_no_python_object_uses_says_so_and_why():
    keep = torch.ones(1, requires_grad=True)
    with torchmem.leak_check(raise_on_leak=False) as report:
        # A hook keeps a tensor alive from C++; no Python object refers to that tensor.
        hidden = torch.zeros(256)
        keep.register_hook(lambda grad, hidden=hidden: grad)
        del hidden

    (finding,) = report.reachable
    text = report.render()
    assert "no Python object refers to it" not in text
    assert "(" in text.splitlines()[3]  # the held-by line explains instead of naming
    del keep


def test_the_owner_search_is_told_apart_from_runner_roots_by_origin():
    # A local of a pytest frame would be a root of last resort; here a plain local wins.
    tensor = torch.zeros(16)
    result = _owners.find_owners([block_triple(tensor)])
    (owners,) = result.owners.values()
    assert owners[0].kind == "local"


# --- the owner search leaves running functions' locals alone ---------------------------


def inner_check_then_drop_the_local(started: threading.Event, resume: threading.Event) -> None:
    big = torch.zeros(1 << 16)  # 256 KiB, alive while the other thread's check searches
    started.set()
    resume.wait()
    del big  # after this the memory must be gone, whatever the search read


def test_reading_another_threads_locals_leaves_no_snapshot_that_keeps_them_alive():
    started, resume = threading.Event(), threading.Event()
    with torchmem.leak_check(raise_on_leak=False) as outer:
        worker = threading.Thread(target=inner_check_then_drop_the_local, args=(started, resume))
        worker.start()
        started.wait()
        # The search reads every live frame's locals, the worker's among them.
        with torchmem.leak_check(raise_on_leak=False) as inner:
            KEEP.append(torch.ones(8))
        resume.set()
        worker.join()
        KEEP.clear()

    assert inner.reachable  # the search ran
    assert outer.findings == [], outer.render()


def function_with_a_check_inside() -> None:
    local = torch.zeros(1 << 16)
    with torchmem.leak_check(raise_on_leak=False):
        KEEP.append(torch.ones(8))  # a survivor, so the search runs and reads this frame
    del local
    KEEP.clear()


KEEP: list = []


def test_reading_the_enclosing_functions_locals_leaves_no_snapshot_either():
    with torchmem.leak_check(raise_on_leak=False) as outer:
        function_with_a_check_inside()

    assert outer.findings == [], outer.render()


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="f_locals is a proxy from 3.13 (PEP 667): nothing to keep")
def test_a_snapshot_someone_else_holds_is_left_as_it_is():
    frame = sys._getframe()
    value = torch.zeros(4)
    mine = frame.f_locals  # locals() and f_locals are the same dict on 3.10-3.12
    from torchmem.leaks.frame_locals import local_items

    items = dict(local_items(frame))
    assert items["value"] is value
    assert mine["value"] is value  # not emptied: this test holds it
