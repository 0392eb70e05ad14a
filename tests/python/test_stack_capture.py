"""Python stack capture through the CPU allocator, with real torch.

Each test allocates CPU tensors through torchmem at known sites and reads the
context id the engine stamped on the tensor's block.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import threading
import time
import warnings
import weakref

import pytest
import torch

import torchmem
from torchmem.stacks import capture as stack_capture
from torchmem.stacks import frames as stack_frames
from torchmem import _C
from torchmem.stacks.capture import capturing
from torchmem.stacks.frames import Frame, frames, is_internal, is_marker, user_first

HERE = os.path.abspath(__file__)


@pytest.fixture(scope="module", autouse=True)
def cpu_installed():
    was_installed = torchmem.is_installed("cpu")
    torchmem.install("cpu")
    yield
    if not was_installed:
        torchmem.uninstall("cpu")


@pytest.fixture(autouse=True)
def capture_balanced():
    """Every test starts and ends with capture off (requests balanced)."""
    assert not _C.stack_capture_requested()
    yield
    stack_capture.record_history(False)
    assert not _C.stack_capture_requested()


def line() -> int:
    """The caller's current line."""
    return sys._getframe(1).f_lineno


def context_of(tensor: torch.Tensor) -> int:
    return _C.cpu_engine().block(tensor.untyped_storage().data_ptr())["context"]


def live_context_ids() -> list[int]:
    return [block["context"] for block in _C.cpu_engine().allocated_blocks()]


def fresh_site(tag: str, body: str = "torch.empty(64)"):
    """A function compiled now, so its code object (and stack) is new."""
    namespace = {"torch": torch}
    exec(compile(f"def site():\n    return {body}\n", f"<site-{tag}>", "exec"), namespace)
    return namespace["site"]


# --- what is captured ----------------------------------------------------------


def test_no_capture_when_not_requested():
    t = torch.empty(256)
    assert context_of(t) == 0
    with capturing():
        assert context_of(torch.empty(256)) != 0
    assert context_of(torch.empty(256)) == 0


def allocate_here():
    return torch.empty(256), line()


def test_frames_name_the_allocating_function_and_line():
    with capturing():
        t, alloc_line = allocate_here(); call_line = line()  # noqa: E702
    stack = frames(context_of(t))
    assert stack[0] == Frame(HERE, alloc_line, "allocate_here")
    assert stack[1] == Frame(HERE, call_line, "test_frames_name_the_allocating_function_and_line")
    assert all(isinstance(frame, Frame) for frame in stack)


def test_nested_function_and_lambda():
    def outer():
        def inner():
            return torch.empty(256), line()

        (t, inner_line), outer_line = inner(), line()
        return t, inner_line, outer_line

    make = lambda: (torch.empty(256), line())  # noqa: E731

    with capturing():
        t, inner_line, outer_line = outer()
        u, lambda_line = make()
    stack = frames(context_of(t))
    assert stack[0] == Frame(HERE, inner_line, "inner")
    assert stack[1] == Frame(HERE, outer_line, "outer")
    stack = frames(context_of(u))
    assert stack[0] == Frame(HERE, lambda_line, "<lambda>")
    assert stack[1].name == "test_nested_function_and_lambda"


def test_allocation_on_another_thread():
    result = {}

    def worker():
        result["tensor"], result["line"] = torch.empty(256), line()

    with capturing():
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    stack = frames(context_of(result["tensor"]))
    assert stack[0] == Frame(HERE, result["line"], "worker")
    # Thread.run, _bootstrap_inner, _bootstrap: the thread's own stack only.
    assert [frame.name for frame in stack[1:]] == ["run", "_bootstrap_inner", "_bootstrap"]
    assert user_first(stack) == [stack[0], Frame("...", 0, "3 internal frames")]


def test_code_compiled_with_exec():
    namespace = {"torch": torch}
    source = "def generated():\n    x = 1\n    return torch.empty(256)\n"
    exec(compile(source, "<generated-capture-test>", "exec"), namespace)
    with capturing():
        t = namespace["generated"]()
        exec(compile("\n\nmodule_level = torch.empty(256)\n", "<exec-module>", "exec"), namespace); exec_line = line()  # noqa: E702,E501
    assert frames(context_of(t))[0] == Frame("<generated-capture-test>", 3, "generated")
    stack = frames(context_of(namespace["module_level"]))
    assert stack[0] == Frame("<exec-module>", 3, "<module>")
    assert stack[1] == Frame(HERE, exec_line, "test_code_compiled_with_exec")


def test_identical_sites_intern_to_the_same_id():
    with capturing():
        same = [torch.empty(256) for _ in range(5)]
        again = [allocate_here()[0] for _ in range(3)]
        other = torch.empty(256)
    ids = {context_of(t) for t in same}
    assert len(ids) == 1
    assert len({context_of(t) for t in again}) == 1
    assert context_of(other) not in ids | {context_of(again[0])}
    # Same code object and offset, different tensor sizes: same site.
    with capturing():
        sizes = [allocate_sized(n) for n in (16, 1 << 12, 1 << 20)]
    assert len({context_of(t) for t in sizes}) == 1


def allocate_sized(n):
    return torch.empty(n)


def test_torch_internal_frames_are_folded():
    with capturing():
        layer = torch.nn.Linear(8, 8); alloc_line = line()  # noqa: E702
    stack = frames(context_of(layer.weight))
    assert is_internal(stack[0])  # torch/nn/modules/linear.py allocates the parameter
    folded = user_first(stack)
    assert folded[0] == Frame(HERE, alloc_line, "test_torch_internal_frames_are_folded")
    inside = folded[-1]
    assert is_marker(inside) and re.fullmatch(r"\d+ torch frames? inside", inside.name)
    assert str(folded[0]) == f"{HERE}:{alloc_line} in test_torch_internal_frames_are_folded"


def test_deep_stacks_are_truncated_to_the_innermost_frames():
    def recurse(depth):
        return recurse(depth - 1) if depth else torch.empty(64)

    with capturing():
        t = recurse(400)
    stack = frames(context_of(t))
    assert stack[0].name == "recurse" and stack[-2].name == "recurse"
    assert is_marker(stack[-1]) and "not captured" in stack[-1].name
    assert len(stack) == 257


# --- the GIL -----------------------------------------------------------------


def test_every_supported_python_reads_frames_without_the_gil():
    """CPython 3.10 to 3.13 each have a frame walker (csrc/torchmem/python/frame_walk_*.c);
    a build that silently fell back to the GIL-taking path would cost ~1 us per allocation."""
    assert (3, 10) <= sys.version_info[:2] <= (3, 13)
    assert _C.capture_stats()["gil_free_walk"] is True


def test_capture_runs_without_the_gil_under_torch_ops():
    """torch.empty releases the GIL before allocating; torch.tensor(list) keeps it."""
    before = _C.capture_stats()
    released, held = fresh_site("gil-released"), fresh_site("gil-held", "torch.tensor([1.0, 2.0])")
    with capturing():
        a = released()
        middle = _C.capture_stats()
        b = held()
    after = _C.capture_stats()
    assert frames(context_of(a))[0].filename == "<site-gil-released>"
    assert frames(context_of(b))[0].filename == "<site-gil-held>"
    assert after["stacks_interned_total"] == before["stacks_interned_total"] + 2
    if after["gil_free_walk"]:
        assert middle["interned_without_gil"] == before["interned_without_gil"] + 1
        assert after["interned_without_gil"] == middle["interned_without_gil"]  # held: not counted


def test_engine_call_without_the_gil():
    """The engine binding releases the GIL around Allocate: the hook runs GIL-free."""
    engine = _C.cpu_engine()
    with capturing():
        address = engine.allocate(4096); alloc_line = line()  # noqa: E702
    try:
        context = engine.block(address)["context"]
        assert frames(context)[0] == Frame(HERE, alloc_line, "test_engine_call_without_the_gil")
    finally:
        engine.free(address)


def test_steady_state_takes_no_gil():
    site = fresh_site("steady")
    tensors = []
    with capturing():
        for i in range(201):
            tensors.append(site())
            if i == 0:  # first sight: the new code object was referenced under the GIL
                before = _C.capture_stats()
        after = _C.capture_stats()
    assert after["gil_acquisitions"] == before["gil_acquisitions"]
    assert after["stacks_interned_total"] == before["stacks_interned_total"]
    assert len({context_of(t) for t in tensors}) == 1


def test_capture_progresses_while_another_thread_holds_the_gil():
    """A thread in a GIL-free torch call keeps allocating, with capture on, while the
    main thread holds the GIL: steady-state capture never waits for the GIL."""
    if not _C.capture_stats()["gil_free_walk"]:
        pytest.skip("this build captures with the GIL (not CPython 3.11)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            churn = torch.jit.script(_churn)
        except Exception as error:  # TorchScript missing or broken in this torch
            pytest.skip(f"torch.jit.script unavailable: {error}")
    progress = torch.zeros(1, dtype=torch.int64)
    counter = progress.numpy()  # read without releasing the GIL
    done = threading.Event()
    result = {}

    def worker():
        for n in (1, 1_000_000_000):  # one call site: warm-up, then the long call
            result["last"], result["line"] = churn(n, progress, done_flag), line()

    done_flag = torch.zeros(1, dtype=torch.int64)
    switch_interval = sys.getswitchinterval()
    with capturing():
        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        while counter[0] < 1000:  # warmed up and inside the long call (sleep releases the GIL)
            time.sleep(0.001)
        gil_acquisitions = _C.capture_stats()["gil_acquisitions"]
        # Hold the GIL: no switch requests are honoured, and the loop below never blocks.
        sys.setswitchinterval(1000.0)
        try:
            start, deadline = int(counter[0]), time.monotonic() + 30
            while int(counter[0]) < start + 10_000 and time.monotonic() < deadline:
                pass
            progressed = int(counter[0]) - start
        finally:
            sys.setswitchinterval(switch_interval)
            done_flag.fill_(1)
        thread.join()
    assert progressed >= 10_000, "the allocating thread stalled while the GIL was held"
    assert _C.capture_stats()["gil_acquisitions"] == gil_acquisitions
    assert frames(context_of(result["last"]))[0] == Frame(HERE, result["line"], "worker")


def _churn(n: int, progress: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    last = torch.empty(64)
    for _ in range(n):
        last = torch.empty(64)
        progress.add_(1)
        if bool(done[0] > 0):
            break
    return last


# --- lifetime and pruning ------------------------------------------------------


def test_code_objects_stay_alive_until_pruned():
    site = fresh_site("deleted-later")
    code_ref = weakref.ref(site.__code__)
    with capturing():
        t = site()
        unrelated = torch.empty(64)  # moves this thread's "latest capture" off site's stack
    context = context_of(t)
    del site
    gc.collect()
    assert code_ref() is not None  # held by the stack table
    assert frames(context)[0] == Frame("<site-deleted-later>", 2, "site")

    del t
    stack_capture.prune(live_context_ids)
    gc.collect()
    assert code_ref() is None  # released once no live block names it
    assert frames(context) == []
    del unrelated


def test_prune_bounds_the_table():
    sites = [fresh_site(f"bounded-{i}") for i in range(300)]
    code_refs = [weakref.ref(site.__code__) for site in sites]
    with capturing():
        for site in sites:
            site()  # freed at once: nothing keeps these stacks
        keep, keep_line = torch.empty(64), line()
    grown = _C.capture_stats()
    assert grown["interned_stacks"] >= 300
    del sites, site
    dropped = stack_capture.prune(live_context_ids)
    gc.collect()
    after = _C.capture_stats()
    assert dropped >= 300
    assert after["interned_stacks"] <= len(set(live_context_ids())) + threading.active_count()
    assert after["code_objects_held"] <= grown["code_objects_held"] - 300
    assert after["bytes_used"] < grown["bytes_used"]
    assert after["stacks_pruned_total"] >= grown["stacks_pruned_total"] + 300
    assert all(ref() is None for ref in code_refs)
    # A live block keeps its stack.
    assert frames(context_of(keep))[0] == Frame(HERE, keep_line, "test_prune_bounds_the_table")
    # Ids are never reused.
    with capturing():
        newer = fresh_site("after-prune")()
    assert context_of(newer) > context_of(keep)


def test_prune_keeps_stacks_captured_after_the_epoch_began():
    epoch = _C.begin_stack_prune()
    with capturing():
        t = fresh_site("during-prune")()
        other = fresh_site("moves-latest")()
    context = context_of(t)
    del t  # not live, but captured after the epoch began
    _C.prune_stacks([], epoch=epoch)
    assert frames(context)[0].filename == "<site-during-prune>"
    _C.prune_stacks(live_context_ids())  # a fresh epoch: now it goes
    assert frames(context) == []
    del other


def test_symbolize_unknown_ids():
    assert frames(0) == []
    assert frames(2**62) == []


# --- concurrency ---------------------------------------------------------------


def shared_site():
    return torch.empty(64), line()


def test_threads_capture_concurrently_with_pruning():
    n_threads, iterations = 4, 250
    results: list[list] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def allocator(index):
        try:
            own = fresh_site(f"thread-{index}")
            kept = []
            for i in range(iterations):
                a, shared_line = shared_site()
                b = own()
                c = fresh_site(f"thread-{index}-{i}")()  # a new stack every iteration
                if i % 5 == 0:
                    kept.append((a, b, c, i))
            results[index] = [(kept, shared_line)]
        except BaseException as error:  # noqa: BLE001 - surfaced below
            errors.append(error)

    def pruner():
        while not stop.is_set():
            stack_capture.prune(live_context_ids)

    with capturing():
        threads = [threading.Thread(target=allocator, args=(k,)) for k in range(n_threads)]
        prune_thread = threading.Thread(target=pruner)
        prune_thread.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.set()
        prune_thread.join()
    assert not errors
    shared_ids = set()
    for index, [(kept, shared_line)] in enumerate(results):
        assert len(kept) == iterations // 5
        for a, b, c, i in kept:
            stack = frames(context_of(a))
            assert stack[0] == Frame(HERE, shared_line, "shared_site")
            assert stack[1].name == "allocator"
            shared_ids.add(context_of(a))
            assert frames(context_of(b))[0] == Frame(f"<site-thread-{index}>", 2, "site")
            assert frames(context_of(c))[0] == Frame(f"<site-thread-{index}-{i}>", 2, "site")
    # Identical stacks on different threads are one interned stack.
    assert len(shared_ids) == 1


def wait_for_child(pid: int, patience_s: float = 60.0) -> int:
    """The child's exit code; a child still running after `patience_s` is hung
    (a lock inherited held): killed, and reported as such."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung: a stack-table lock was inherited held")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_fork_while_other_threads_capture():
    """A forked child (a DataLoader worker) can capture and prune even if another
    thread was inside the capture hook when the parent forked."""
    stop = threading.Event()
    # A standalone engine: the hammering thread never holds the CPU engine's lock,
    # which the child uses (the engine's own fork safety is not under test here).
    side_engine = _C.Engine()

    def hammer():
        i = 0
        while not stop.is_set():
            side_engine.free(side_engine.allocate(512))
            namespace = {"side_engine": side_engine}
            exec(compile("def site():\n    side_engine.free(side_engine.allocate(512))\n",
                         f"<hammer-{i}>", "exec"), namespace)
            namespace["site"]()  # a new stack: the exclusive (insert) path
            i += 1

    with capturing():
        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            for attempt in range(10):
                pid = os.fork()
                if pid == 0:  # the child: no pytest machinery, just an exit code
                    code = 3
                    try:
                        t = fresh_site(f"child-{attempt}")()
                        code = 0 if frames(context_of(t))[0].filename == f"<site-child-{attempt}>" else 1
                        stack_capture.prune(live_context_ids)  # takes every table lock
                        assert _C.capture_stats()["interned_stacks"] >= 1
                    except BaseException:  # noqa: BLE001 - reported through the exit code
                        code = 2
                    os._exit(code)
                assert wait_for_child(pid) == 0
        finally:
            stop.set()
            thread.join()


# --- the Python switches ---------------------------------------------------------


def test_capturing_is_reference_counted():
    with capturing():
        with capturing():
            assert _C.stack_capture_requested()
        assert _C.stack_capture_requested()
    assert not _C.stack_capture_requested()
    with pytest.raises(RuntimeError, match="without a matching"):
        _C.release_stack_capture()


def test_record_history_switch():
    assert torchmem.record_history is stack_capture.record_history
    stack_capture.record_history()
    stack_capture.record_history(True)  # idempotent
    assert stack_capture.is_recording_history() and _C.stack_capture_requested()
    with capturing():
        pass
    assert _C.stack_capture_requested()  # a leak check's scope does not end history
    t = torch.empty(64)
    assert frames(context_of(t))[0].name == "test_record_history_switch"
    stack_capture.record_history(False)
    stack_capture.record_history(None)  # torch's spelling of "off"
    assert not _C.stack_capture_requested()
    stack_capture.record_history("all")
    assert _C.stack_capture_requested()
    stack_capture.record_history(False)
    with pytest.raises(ValueError, match="record_history"):
        stack_capture.record_history("sometimes")


def test_is_internal_and_user_first_on_synthetic_stacks():
    torch_dir = os.path.dirname(torch.__file__)
    t1 = Frame(os.path.join(torch_dir, "nn", "modules", "module.py"), 10, "_call_impl")
    t2 = Frame(os.path.join(torch_dir, "nn", "modules", "linear.py"), 20, "forward")
    user1 = Frame("/home/me/train.py", 5, "step")
    user2 = Frame("/home/me/train.py", 50, "main")
    frozen = Frame("<frozen runpy>", 88, "_run_code")
    exec_frame = Frame("<string>", 1, "<module>")
    assert is_internal(t1) and is_internal(frozen)
    assert not is_internal(user1) and not is_internal(exec_frame)
    assert is_internal(Frame(stack_frames.__file__, 1, "capturing"))  # torchmem itself
    assert is_internal(Frame(threading.__file__, 1, "run"))

    stack = [t2, t1, user1, t1, t1, t2, user2, frozen]
    assert user_first(stack) == [
        user1,
        Frame("...", 0, "3 torch frames"),
        user2,
        Frame("...", 0, "1 internal frame"),
        Frame("...", 0, "2 torch frames inside"),
    ]
    assert user_first([t1, t2]) == [t1, t2]  # nothing of the user's: unchanged
    assert user_first([]) == []
