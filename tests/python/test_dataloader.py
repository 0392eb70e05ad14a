"""DataLoader workers and fork() with torchmem serving the CPU tensors.

What these tests pin down (documented in ``torchmem/_workers.py``):

* ``fork`` workers inherit torchmem and a copy of the CPU engine, and allocate through
  that copy; nothing they allocate reaches the main process's statistics, tags or leak
  checks.
* ``spawn`` workers are fresh interpreters: torchmem serves them only if the main
  module installs it at import time (or ``worker_init_fn=torchmem.worker_init_fn``),
  and then with an engine of their own.
* ``pin_memory=True`` pins with PyTorch's pinned-memory allocator, never torchmem's.
* A fork made while another thread is inside the allocator gives a child that can
  allocate, free and exit: no lock is left held in the child.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import torchmem
from dataloader_helpers import ProbeDataset, make_model, train_step
from leak_helpers import torchmem_cpu  # noqa: F401  (autouse: torchmem serves CPU tensors)
from torchmem.stacks import capture as stack_capture
from torchmem import _C

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "simcuda"))
import simcuda  # noqa: E402

# Memory the main process holds before its workers start: a forked worker's copy of the
# engine counts it, a spawned worker's own engine does not.
BALLAST_BYTES = 4 << 20
HOARD_BYTES = 64 << 10  # what a worker keeps per item it produces
PLANTED_BYTES = 4096  # the leak the main process plants in every epoch (1024 floats)
# A forked child that has not exited by then is reported as hung (and killed).
CHILD_DEADLINE_SECONDS = 60.0

PLANTED: list = []  # the planted leaks, held by a module global as a real leak would be


@pytest.fixture(autouse=True)
def no_planted_leaks():
    PLANTED.clear()
    yield
    PLANTED.clear()


def no_accelerator_warning():
    """On a machine without a CUDA device (CI) PyTorch ignores pin_memory=True, with this
    warning; with a device it pins (test_pin_memory_... checks how, on the simulated one)."""
    if torch.accelerator.is_available():
        return contextlib.nullcontext()
    return pytest.warns(UserWarning, match="pin_memory.*no accelerator")


def run_epoch(model, optimizer, loader, epoch: int) -> list[dict]:
    """One epoch of training under the tag ``train``; plants one leak; returns what the
    workers said about themselves (one dict per batch)."""
    seen = []
    with torchmem.tag("train"):
        for batch in loader:
            train_step(model, optimizer, batch["x"], batch["y"])
            seen.append({key: batch[key].tolist() for key in ("pid", "installed", "engine_allocated")})
            seen[-1]["torchmem_block"] = is_torchmem_block(batch["x"])  # asked while the batch is alive
    with torchmem.tag("planted"):
        PLANTED.append(torch.full((PLANTED_BYTES // 4,), float(epoch)))
    return seen


def is_torchmem_block(tensor: torch.Tensor) -> bool:
    try:
        _C.cpu_engine().block(tensor.untyped_storage().data_ptr())
    except (RuntimeError, ValueError):
        return False
    return True


def train(loader, epochs: int) -> dict:
    """Trains for ``epochs`` epochs, each inside one reused leak check (warm-up: the first
    epoch, which creates the optimizer's momentum buffers). Returns per epoch the leak
    report, the main process's live bytes after it, and what the workers said."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    check = torchmem.leak_check(warmup=1, raise_on_leak=False)
    result = {"reports": [], "allocated": [], "workers": []}
    for epoch in range(epochs):
        with check as report:
            seen = run_epoch(model, optimizer, loader, epoch)
        result["reports"].append(report)
        result["allocated"].append(torchmem.memory_allocated("cpu"))
        result["workers"].append(seen)
    return result


def assert_each_epoch_leaks_exactly_the_planted_tensor(result: dict) -> None:
    reports = result["reports"]
    assert reports[0].warmup and not reports[0].leaked, reports[0].render()
    for report in reports[1:]:
        assert [(f.kind, f.tag, f.size) for f in report.findings] == [("reachable", "planted", PLANTED_BYTES)], (
            report.render()
        )
        assert "PLANTED" in report.render()  # the holder is named: the module global
    # After warm-up the main process's live bytes grow by the planted leak and nothing else.
    allocated = result["allocated"]
    assert [after - before for before, after in zip(allocated[1:], allocated[2:])] == [PLANTED_BYTES] * (
        len(allocated) - 2
    )


def batch_pids(seen: list[dict]) -> set[int]:
    return {pid for batch in seen for pid in batch["pid"]}


def workers_saw(seen: list[dict], key: str) -> set[int]:
    return {value for batch in seen for value in batch[key]}


def test_fork_workers_train_three_epochs_and_the_main_process_sees_only_its_own_memory():
    ballast = torch.zeros(BALLAST_BYTES // 4)
    # Garbage that earlier tests in this process left (test_hidden_owners.py run first
    # leaves 512 B) would be freed by the collection below and count against this test:
    # collect it before measuring.
    gc.collect()
    before = torchmem.memory_allocated("cpu")
    loader = DataLoader(
        ProbeDataset(length=48, hoard_bytes=HOARD_BYTES), batch_size=8, num_workers=2,
        multiprocessing_context="fork", pin_memory=True,
    )
    with no_accelerator_warning():
        result = train(loader, epochs=3)

    assert_each_epoch_leaks_exactly_the_planted_tensor(result)
    for seen in result["workers"]:
        # Two workers per epoch (not persistent: each epoch forks anew), never this process.
        assert len(batch_pids(seen)) == 2 and os.getpid() not in batch_pids(seen)
        # They allocated through torchmem, in a copy of the engine that still holds the
        # main process's blocks (the ballast among them) plus their own hoard.
        assert workers_saw(seen, "installed") == {1}
        assert min(workers_saw(seen, "engine_allocated")) >= before + HOARD_BYTES
    # The workers hoarded 48 x 64 KiB per epoch under their own tag; none of it, and not
    # the tag, reached the main process.
    assert "worker-hoard" not in torchmem.tag_stats("cpu")
    # The model and optimizer are gone with train(); what is left is the planted leaks.
    # (Collect first: the last leak check's owner search leaves a reference cycle that
    # holds a snapshot of train()'s locals until the next collection; see the report.)
    gc.collect()
    assert torchmem.memory_allocated("cpu") == before + 3 * PLANTED_BYTES
    # Batches arrive in shared memory that PyTorch mapped, not in torchmem blocks.
    assert {batch["torchmem_block"] for seen in result["workers"] for batch in seen} == {False}
    _C.cpu_engine().check_invariants()
    del ballast


def test_spawn_workers_train_three_epochs_with_torchmem_installed_by_worker_init_fn_in_engines_of_their_own():
    # Under pytest the main module is pytest's, which does not install torchmem (without
    # worker_init_fn the workers would use PyTorch's allocator: see the script test below).
    ballast = torch.zeros(BALLAST_BYTES // 4)
    loader = DataLoader(
        ProbeDataset(length=32, hoard_bytes=HOARD_BYTES), batch_size=8, num_workers=2,
        multiprocessing_context="spawn", persistent_workers=True, pin_memory=True,
        worker_init_fn=torchmem.worker_init_fn,
    )
    with no_accelerator_warning():
        result = train(loader, epochs=3)

    assert_each_epoch_leaks_exactly_the_planted_tensor(result)
    pids = set()
    for seen in result["workers"]:
        pids |= batch_pids(seen)
        assert workers_saw(seen, "installed") == {1}
        # A fresh engine: it holds the worker's own hoard, never the main process's ballast.
        assert 0 < max(workers_saw(seen, "engine_allocated")) < BALLAST_BYTES
    assert len(pids) == 2 and os.getpid() not in pids  # persistent: the same two workers all along
    assert "worker-hoard" not in torchmem.tag_stats("cpu")
    assert {batch["torchmem_block"] for seen in result["workers"] for batch in seen} == {False}
    _C.cpu_engine().check_invariants()
    del ballast


def test_worker_init_fn_rejects_anything_but_a_worker_id():
    with pytest.raises(TypeError, match="worker_init_fn=torchmem.worker_init_fn"):
        torchmem.worker_init_fn(None)


# --- a user's script, as a user runs it ----------------------------------------------------------

SPAWN_SCRIPT = """\
    import json, os, sys
    import torch
    import torchmem
    from torch.utils.data import DataLoader, Dataset
    from torchmem import _C

    if os.environ.get("INSTALL_AT_IMPORT") == "1":
        torchmem.install("cpu")  # top level: runs again when a spawned worker re-imports this file

    class Items(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return {"x": torch.randn(4), "installed": int(_C.cpu_installed()),
                    "main_name": sys.modules["__main__"].__name__}

    if __name__ == "__main__":
        torchmem.install("cpu")
        model = torch.nn.Linear(4, 1)
        loader = DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context="spawn",
                            persistent_workers=True)
        installed, names = set(), set()
        for epoch in range(2):
            with torchmem.leak_check(raise_on_leak=False) as report:
                for batch in loader:
                    model(batch["x"]).sum().backward()
                    model.zero_grad(set_to_none=True)  # no gradient outlives the step
                    installed.update(batch["installed"].tolist())
                    names.update(batch["main_name"])
            assert not report.leaked, report.render()
        print(json.dumps({"installed": sorted(installed), "names": sorted(names)}))
"""


@pytest.mark.parametrize("at_import, expected", [("1", [1]), ("0", [0])], ids=["installed-at-import", "main-only"])
def test_spawn_workers_have_torchmem_exactly_when_the_script_installs_it_at_import_time(tmp_path, at_import, expected):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SPAWN_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(ROOT), INSTALL_AT_IMPORT=at_import)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"installed": expected, "names": ["__mp_main__"]}


# --- pin_memory on a (simulated) CUDA device -----------------------------------------------------

PIN_SCRIPT = """\
    import json
    import torch
    import torchmem
    from torch.utils.data import DataLoader, Dataset
    from torchmem import _C

    class Items(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, index):
            return torch.full((256,), float(index))

    def is_torchmem_block(tensor):
        try:
            _C.cpu_engine().block(tensor.untyped_storage().data_ptr())
            return True
        except (RuntimeError, ValueError):
            return False

    if __name__ == "__main__":
        torchmem.install("cpu")
        torchmem.install("cuda")
        # Elementwise work only: the simulated device runs kernels as no-ops and has no cuBLAS.
        weight = torch.nn.Parameter(torch.ones(256, device="cuda"))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        loader = DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context="fork", pin_memory=True)
        cpu_before = torchmem.memory_allocated("cpu")
        pinned, ours = [], []
        for epoch in range(2):
            for batch in loader:
                pinned.append(batch.is_pinned())
                ours.append(is_torchmem_block(batch))
                loss = (batch.to("cuda", non_blocking=True) * weight).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        torch.cuda.synchronize()
        print(json.dumps({
            "pinned": pinned, "torchmem_blocks": ours,
            "cpu_allocated_change": torchmem.memory_allocated("cpu") - cpu_before,
            "cuda_allocations": torchmem.memory_stats("cuda")["allocation.all.allocated"],
        }))
"""


def test_pin_memory_pins_with_pytorchs_pinned_allocator_not_torchmems(tmp_path):
    script = tmp_path / "pin.py"
    script.write_text(textwrap.dedent(PIN_SCRIPT))
    env = simcuda.environment(device_count=1, memory_bytes="4G")
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["pinned"] == [True] * 8  # 2 epochs x 4 batches, every one pinned
    assert seen["torchmem_blocks"] == [False] * 8  # ... by PyTorch, not by torchmem
    assert seen["cpu_allocated_change"] == 0  # pinning allocated nothing through torchmem
    assert seen["cuda_allocations"] > 0  # the CUDA side of the step did


# --- fork while another thread is inside the allocator -------------------------------------------

FORKS = 30
# Sizes that reach every pool: small (<= 1 MiB, 2 MiB segments), medium (20 MiB
# segments) and large (a segment of its own).
HAMMER_SIZES = (64, 4096, 300_000, 3 << 20, 12 << 20)


def child_work() -> int:
    """What a forked child does: allocate and free in every pool under a tag, run a leak
    check, then verify the engine; returns the exit code (0: all fine)."""
    try:
        # As DataLoader workers do: OpenMP's thread team is not fork-safe (a parallel region
        # in a forked child waits forever for the parent's OpenMP threads), so a forked
        # child must compute on one thread. That hang is libgomp's, not torchmem's.
        torch.set_num_threads(1)
        engine = _C.cpu_engine()
        before = engine.memory_stats()["allocated_bytes.all.current"]
        with torchmem.tag("child"):
            tensors = [torch.ones(size // 4) for size in HAMMER_SIZES]
            total = sum(int(t.sum()) for t in tensors)
            del tensors
        with torchmem.leak_check(gc_collect=False) as report:
            scratch = torch.randn(1000)
            del scratch
        engine.check_invariants()
        after = engine.memory_stats()["allocated_bytes.all.current"]
        ok = total == sum(size // 4 for size in HAMMER_SIZES) and not report.leaked and after == before
        return 0 if ok else 3
    except BaseException:  # noqa: BLE001 - the child must reach os._exit whatever happens
        import traceback

        traceback.print_exc()
        return 2


def wait_bounded(pid: int, deadline_seconds: float) -> int | None:
    """The child's exit code, or None if it did not exit in time (it is then killed)."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_repeated_forks_while_a_thread_hammers_the_allocator_give_children_that_work():
    engine = _C.cpu_engine()
    stop = threading.Event()
    iterations = [0]
    errors: list[BaseException] = []

    def hammer():
        # Everything that takes a lock torchmem owns: the engine (allocations, frees,
        # reports that walk the pool), the tag and scope registries, and with capture on
        # the stack table. Scopes are opened directly (not with leak_check) to exercise
        # the C++ registry; leak_check's own Python lock is not fork-safe (see the report).
        try:
            with torchmem.tag("hammer"):
                while not stop.is_set():
                    scope = _C.open_scope()
                    tensors = [torch.empty(size // 4).fill_(1.0) for size in HAMMER_SIZES]
                    engine.segments()
                    del tensors
                    _C.close_scope(scope)
                    if iterations[0] % 16 == 0:
                        engine.check_invariants()
                        engine.empty_cache()  # so that later allocations obtain new segments
                    iterations[0] += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    # Load torchmem's lazily imported parts now: a fork while the other thread imports a
    # module would leave the child waiting for that module's import lock (a Python limit,
    # see torchmem/_workers.py), which is not what this test is about.
    torchmem.tag, torchmem.leak_check  # noqa: B018
    thread = threading.Thread(target=hammer, daemon=True)
    outcomes = []
    with stack_capture.capturing():
        thread.start()
        while iterations[0] == 0 and thread.is_alive():
            time.sleep(0.001)
        hammering_before = iterations[0]
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:
                os._exit(child_work())
            outcomes.append(wait_bounded(pid, CHILD_DEADLINE_SECONDS))
        hammering_during = iterations[0] - hammering_before
        stop.set()
        thread.join(timeout=CHILD_DEADLINE_SECONDS)

    assert not errors, errors
    assert not thread.is_alive(), "the hammering thread did not stop"
    hung = outcomes.count(None)
    assert hung == 0, f"{hung} of {FORKS} forked children did not exit within {CHILD_DEADLINE_SECONDS} s (killed)"
    assert outcomes == [0] * FORKS, f"children's exit codes: {outcomes} (2: exception, 3: wrong figures)"
    assert hammering_during > 0, "the other thread never ran while the forks happened"
    assert "child" not in torchmem.tag_stats("cpu")  # the children's tag stayed in the children
    gc.collect()
    engine.check_invariants()
