"""PyTorch's memory history and snapshots, recorded by torchmem.

``torch.cuda.memory._record_memory_history`` turns on torchmem's trace and stack
capture; ``_snapshot`` / ``_dump_snapshot`` give PyTorch's format with torchmem's
Python stacks, plus the TorchScript frames (and with ``stacks="all"`` the C++ frames)
PyTorch's own recorder gathers, which ``torch.cuda._memory_viz`` renders unchanged.
"""

import pickle
import subprocess
import sys

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])

record = torch.cuda.memory._record_memory_history


@pytest.fixture(autouse=True)
def history_off_after():
    yield
    record(None, clear_history=True)


def line_marked(mark: str) -> int:
    with open(__file__) as source:
        return next(n for n, text in enumerate(source, 1) if text.rstrip().endswith(mark))


def here(frames: list[dict]) -> list[int]:
    """The lines of this file among ``frames``."""
    return [frame["line"] for frame in frames if frame["filename"] == __file__]


def block_of(snapshot: dict, address: int) -> dict:
    return next(block for segment in snapshot["segments"] for block in segment["blocks"]
                if block["address"] == address)


def traces(snapshot: dict, device: int = 0) -> list[dict]:
    return snapshot["device_traces"][device]


def test_blocks_and_traces_carry_the_python_stack_of_their_allocation_and_free():
    record("all", context="all", stacks="python")
    kept = torch.empty(1 << 20, device="cuda")  # the kept line
    freed = torch.empty(2 << 20, dtype=torch.uint8, device="cuda")  # the freed line
    address = freed.data_ptr()
    del freed  # the del line
    snapshot = torch.cuda.memory._snapshot()

    assert here(block_of(snapshot, kept.data_ptr())["frames"])[0] == line_marked("# the kept line")
    entries = [entry for entry in traces(snapshot) if entry["addr"] == address]
    assert [entry["action"] for entry in entries] == ["alloc", "free_requested", "free_completed"]
    assert here(entries[0]["frames"])[0] == line_marked("# the freed line")
    assert here(entries[1]["frames"])[0] == line_marked("# the del line")
    assert entries[0]["size"] == 2 << 20 and entries[0]["stream"] == 0
    assert any(entry["action"] == "segment_alloc" for entry in traces(snapshot))
    del kept


def names(frames: list[dict]) -> list[str]:
    return [frame["name"] for frame in frames]


def test_stacks_all_adds_pytorchs_cpp_frames_to_the_python_ones():
    record("all", context="all", stacks="all")
    tensor = torch.rand(1000, device="cuda")  # the stacks-all line
    address = tensor.data_ptr()
    snapshot = torch.cuda.memory._snapshot()
    frames = block_of(snapshot, address)["frames"]
    assert here(frames)[0] == line_marked("# the stacks-all line")
    assert any("::rand" in name for name in names(frames))  # the C++ op that allocated
    alloc = next(entry for entry in traces(snapshot) if entry["addr"] == address)
    assert any("::rand" in name for name in names(alloc["frames"]))
    del tensor


def test_stacks_python_has_no_cpp_frames():
    record("all", context="all", stacks="python")
    tensor = torch.rand(1000, device="cuda")
    frames = block_of(torch.cuda.memory._snapshot(), tensor.data_ptr())["frames"]
    assert here(frames) and not any("::" in name for name in names(frames))
    del tensor


def test_leak_reports_keep_their_python_stacks_while_cpp_frames_are_recorded():
    import torchmem

    record("all", context="all", stacks="all")
    held = []
    with torchmem.leak_check(raise_on_leak=False, devices=["cuda:0"]) as report:
        held.append(torch.rand(1000, device="cuda"))  # the leaked line
    (finding,) = report.reachable
    assert finding.context != 0
    assert finding.allocation_site.line == line_marked("# the leaked line")
    assert "::" not in finding.allocation_site.name  # torchmem's reports show Python frames
    del held


@torch.jit.script
def scripted_allocation():
    return torch.rand(311, 411, device="cuda")


def test_torchscript_frames_come_first_as_with_pytorchs_recorder():
    record("state", stacks="python")  # PyTorch records TorchScript frames without C++ ones
    tensor = scripted_allocation()
    frames = block_of(torch.cuda.memory._snapshot(), tensor.data_ptr())["frames"]
    assert frames[0]["name"] == "scripted_allocation"
    assert here(frames)  # and the Python caller below it
    del tensor


def test_context_state_keeps_stacks_for_live_blocks_only():
    record("all", context="state", stacks="python")
    tensor = torch.empty(1000, device="cuda")
    snapshot = torch.cuda.memory._snapshot()
    assert here(block_of(snapshot, tensor.data_ptr())["frames"])
    entries = traces(snapshot)
    assert entries and all("frames" not in entry for entry in entries)  # as PyTorch's
    del tensor


def test_context_state_names_no_allocation_of_freed_memory():
    torch.cuda.empty_cache()
    record("all", context="state", stacks="python")
    freed = torch.empty(1000, device="cuda")  # splits a fresh 2 MiB segment
    address = freed.data_ptr()
    del freed
    segment = next(s for s in torch.cuda.memory._snapshot()["segments"] if s["address"] == address)
    # A split segment names no allocation (PyTorch's rule), its free block none either.
    assert segment["frames"] == [] and [b["frames"] for b in segment["blocks"]] == [[]]


def test_an_unsplit_segment_names_the_allocation_that_made_it():
    torch.cuda.empty_cache()
    record("all", context="state", stacks="python")
    whole = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")  # the whole-segment line
    address = whole.data_ptr()
    del whole
    segment = next(s for s in torch.cuda.memory._snapshot()["segments"] if s["address"] == address)
    assert here(segment["frames"])[0] == line_marked("# the whole-segment line")  # as PyTorch's


def test_a_free_block_reports_the_last_request_made_from_it():
    torch.cuda.empty_cache()
    first = torch.empty(1000, device="cuda")
    last = torch.empty(3000, dtype=torch.uint8, device="cuda")
    del first, last  # merge back into one free 2 MiB block
    blocks = [block for segment in torch.cuda.memory._snapshot()["segments"]
              for block in segment["blocks"]]
    assert [(b["state"], b["requested_size"]) for b in blocks] == [("inactive", 3000)]


def test_max_entries_keeps_the_newest_and_clear_history_drops_them():
    record("all", context="all", stacks="python", max_entries=4)
    sizes = [(n + 1) << 20 for n in range(6)]
    for size in sizes:
        torch.empty(size, dtype=torch.uint8, device="cuda")
    kept = traces(torch.cuda.memory._snapshot())
    assert len(kept) == 4
    assert kept[-1]["action"] == "free_completed" and kept[-1]["size"] == sizes[-1]

    record("all", context="all", stacks="python", max_entries=4, clear_history=True)
    assert traces(torch.cuda.memory._snapshot()) == []


@pytest.mark.skipif(TORCH < (2, 11), reason="_record_memory_history(skip_actions=) arrived in torch 2.11")
def test_skip_actions_are_not_recorded():
    record("all", context="all", stacks="python", skip_actions=["free_requested", "free_completed"])
    torch.empty(1000, device="cuda")
    actions = {entry["action"] for entry in traces(torch.cuda.memory._snapshot())}
    assert "alloc" in actions and not actions & {"free_requested", "free_completed"}


def test_history_off_records_nothing_new_and_drops_the_trace():
    record("all", context="all", stacks="python")
    torch.empty(1000, device="cuda")
    record(None)  # as PyTorch's: turning history off clears it
    tensor = torch.empty(1000, device="cuda")
    snapshot = torch.cuda.memory._snapshot()
    assert block_of(snapshot, tensor.data_ptr())["frames"] == []
    assert traces(snapshot) == []
    del tensor


@pytest.mark.skipif(TORCH < (2, 12), reason="torch.cuda.memory._allocation_traceback arrived in torch 2.12")
def test_allocation_traceback_of_a_live_pointer():
    record("all", context="all", stacks="python")
    tensor = torch.empty(1000, device="cuda")  # the traceback line
    frames = torch.cuda.memory._allocation_traceback(tensor.untyped_storage().data_ptr())
    assert here(frames)[0] == line_marked("# the traceback line")
    del tensor


def test_each_device_has_its_own_trace():
    record("all", context="all", stacks="python")
    on_1 = torch.empty(1000, device="cuda:1")
    snapshot = torch.cuda.memory._snapshot()
    assert any(entry["addr"] == on_1.data_ptr() for entry in traces(snapshot, 1))
    assert all(entry["addr"] != on_1.data_ptr() for entry in traces(snapshot, 0))
    del on_1


def test_dump_snapshot_is_rendered_by_pytorchs_memory_viz(tmp_path):
    record("all", context="all", stacks="python")
    tensors = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 7)]
    del tensors[1]
    path = tmp_path / "snapshot.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    snapshot = pickle.loads(path.read_bytes())

    assert "Device 0 ----" in memory_viz.trace(snapshot)
    assert "total_reserved" in memory_viz.segsum(snapshot)
    html = tmp_path / "trace.html"
    subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path),
                    "-o", str(html)], check=True, capture_output=True, timeout=300)
    assert "add_local_files" in html.read_text()
    assert "add_local_files" in memory_viz.segment_plot(snapshot)
    del tensors


@pytest.mark.skipif(TORCH < (2, 14), reason="memory annotations arrived in torch 2.14")
def test_user_metadata_and_annotations_are_stamped_on_trace_entries():
    record("all", context="all", stacks="python")
    assert torch._C._cuda_memoryMetadataSupported()
    torch.cuda.memory._set_memory_metadata("epoch 3")
    tagged = torch.empty(100, device="cuda")
    assert torch._C._cuda_getMemoryMetadata() == "epoch 3"
    torch.cuda.memory._set_memory_metadata("")
    torch.cuda.memory._annotate_tensor(tagged, "the weights")
    entries = [entry for entry in traces(torch.cuda.memory._snapshot())
               if entry["addr"] == tagged.data_ptr() and entry["action"] != "segment_alloc"]
    assert [(e["action"], e["user_metadata"]) for e in entries] == [
        ("alloc", "epoch 3"), ("annotate", "the weights")]
    assert all(entry["compile_context"] == "N/A" for entry in entries)  # PyTorch's "none"
    del tagged


def test_the_profiler_sees_each_allocation_and_free():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as profile:
        tensor = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del tensor
    changes = [event.device_memory_usage for event in profile.events() if event.name == "[memory]"]
    assert changes and changes[-1] == -(1 << 20)
