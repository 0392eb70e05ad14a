"""torchmem.snapshot() / dump_snapshot(): PyTorch's snapshot schema, rendered by PyTorch's own viewers.

The viewers are ``torch.cuda._memory_viz`` (its Python functions and its command line) and
pytorch.org/memory_viz (MemoryViz.js, run in a browser). The JavaScript one is not runnable
here, so the rules it relies on are checked directly: which pickle opcodes its unpickler
knows, how it computes block addresses, and how it replays the trace backwards.
"""

from __future__ import annotations

import base64
import os
import pickle
import pickletools
import re
import subprocess
import sys

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

import torchmem
from torchmem.reports import snapshot as _snapshot
from torchmem.stacks import capture as stack_capture

SEGMENT_KEYS = {
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
    "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames", "compile_context", "user_metadata", "pool_id"}

# The opcodes MemoryViz.js's unpickler implements (torch/utils/viz/MemoryViz.js, `unpickle`);
# anything else makes pytorch.org/memory_viz throw "UNKNOWN OPCODE".
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}


@pytest.fixture(autouse=True)
def torchmem_cpu():
    """CPU tensors come from torchmem; history recording is off before and after each test."""
    torchmem.install("cpu")
    _snapshot.record_trace(0)
    yield
    _snapshot.record_trace(0)


def as_flamegraph_input(lines: str) -> str:
    """Stands in for flamegraph.pl, which _memory_viz would otherwise download."""
    return lines


def allocate(numel: int) -> torch.Tensor:
    return torch.empty(numel, dtype=torch.uint8)  # line: allocate


def line_of(marker: str) -> int:
    with open(__file__) as file:
        for number, text in enumerate(file, start=1):
            if text.rstrip().endswith(f"# line: {marker}"):
                return number
    raise AssertionError(marker)


def block_for(snapshot: dict, tensor: torch.Tensor) -> dict:
    address = tensor.untyped_storage().data_ptr()
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["address"] == address:
                return block
    raise AssertionError(f"no block at {address:#x}")


# --- schema -------------------------------------------------------------------------------------


def test_top_level_keys_are_pytorchs_plus_a_torchmem_section():
    snapshot = torchmem.snapshot()

    assert set(snapshot) == {"segments", "device_traces", "allocator_settings", "external_annotations", "torchmem"}
    assert snapshot["external_annotations"] == []
    assert snapshot["torchmem"]["device_names"] == ["cpu"]
    assert snapshot["torchmem"]["version"] == torchmem.__version__
    assert {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "expandable_segments"} <= set(snapshot["allocator_settings"])


def test_segments_and_blocks_have_exactly_pytorchs_keys_and_value_types():
    keep = [allocate(1000), allocate(3 << 20)]
    snapshot = torchmem.snapshot("cpu")

    assert snapshot["segments"]
    for segment in snapshot["segments"]:
        assert set(segment) == SEGMENT_KEYS
        assert segment["device"] == 0
        assert segment["segment_type"] in ("small", "large")
        assert segment["segment_pool_id"] == (0, 0)
        assert segment["is_expandable"] is False
        for block in segment["blocks"]:
            assert set(block) == BLOCK_KEYS
            assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
            assert all(set(frame) == {"filename", "line", "name"} for frame in block["frames"])
    del keep


def test_blocks_tile_each_segment_in_address_order_as_the_viewers_assume():
    # MemoryViz.js recomputes block addresses as segment address + sizes of the blocks
    # before; _memory_viz.segsum asserts allocated + free == total_size.
    keep = [allocate(size) for size in (100, 5000, 70_000, 2 << 20)]
    for segment in torchmem.snapshot()["segments"]:
        address = segment["address"]
        for block in segment["blocks"]:
            assert block["address"] == address
            address += block["size"]
        assert address == segment["address"] + segment["total_size"]
    del keep


def test_segment_totals_are_the_sums_of_their_blocks():
    keep = [allocate(4096), allocate(300)]
    for segment in torchmem.snapshot()["segments"]:
        allocated = [b for b in segment["blocks"] if b["state"] == "active_allocated"]
        active = [b for b in segment["blocks"] if b["state"] != "inactive"]
        assert segment["allocated_size"] == sum(b["size"] for b in allocated)
        assert segment["active_size"] == sum(b["size"] for b in active)
        assert segment["requested_size"] == sum(b["requested_size"] for b in active)
    del keep


def test_a_live_tensor_is_an_active_allocated_block_with_its_requested_size():
    tensor = allocate(1000)
    block = block_for(torchmem.snapshot(), tensor)

    assert block["state"] == "active_allocated"
    assert block["requested_size"] == 1000
    assert block["size"] == 1024  # rounded to 512 bytes, as PyTorch's allocator does


def test_blocks_carry_the_python_stack_that_allocated_them_when_history_is_recorded():
    stack_capture.record_history(True)
    try:
        tensor = allocate(2000)
    finally:
        stack_capture.record_history(False)
    frames = block_for(torchmem.snapshot(), tensor)["frames"]

    assert frames[0] == {"filename": __file__, "line": line_of("allocate"), "name": "allocate"}
    assert frames[1]["name"] == "test_blocks_carry_the_python_stack_that_allocated_them_when_history_is_recorded"


def test_free_cached_memory_is_inactive_with_nothing_requested():
    tensor = allocate(5000)
    address = tensor.untyped_storage().data_ptr()
    del tensor
    snapshot = torchmem.snapshot()
    blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == address]

    assert blocks and blocks[0]["state"] == "inactive"
    assert blocks[0]["requested_size"] == 0 and blocks[0]["frames"] == []


# --- history --------------------------------------------------------------------------------------


def test_nothing_is_traced_until_record_trace_is_called():
    allocate(100)
    assert torchmem.snapshot()["device_traces"] == [[]]


def test_record_trace_records_alloc_and_free_with_pytorchs_keys_and_sizes():
    _snapshot.record_trace(1000)
    tensor = allocate(1000)
    address = tensor.untyped_storage().data_ptr()
    del tensor
    (trace,) = torchmem.snapshot()["device_traces"]

    for entry in trace:
        assert set(entry) == TRACE_KEYS
    mine = [entry for entry in trace if entry.get("addr") == address]
    assert [entry["action"] for entry in mine][-3:] == ["alloc", "free_requested", "free_completed"]
    # PyTorch records the requested size on the alloc and on both frees, and its readers
    # pair them: the frees must not carry the rounded size (1024).
    assert [entry["size"] for entry in mine][-3:] == [1000, 1000, 1000]
    alloc = mine[-3]
    assert alloc["frames"][0]["line"] == line_of("allocate")
    assert alloc["time_us"] > 0


def test_record_trace_records_segments_obtained_and_released():
    torchmem.empty_cache("cpu")  # so that no cached block of earlier tests can serve it
    _snapshot.record_trace(1000)
    tensor = allocate(30 << 20)  # a large request gets a segment of its own
    address = tensor.untyped_storage().data_ptr()
    del tensor
    torchmem.empty_cache("cpu")
    (trace,) = torchmem.snapshot()["device_traces"]
    actions = [entry["action"] for entry in trace if entry["addr"] == address]

    assert actions[0] == "segment_alloc" and actions[-1] == "segment_free"


def test_the_trace_keeps_only_the_last_max_entries_events():
    _snapshot.record_trace(5)
    for _ in range(10):
        allocate(100)
    (trace,) = torchmem.snapshot()["device_traces"]

    assert len(trace) == 5
    assert _snapshot.trace_max_entries() == 5
    assert torchmem.snapshot()["torchmem"]["trace_max_entries"] == 5


def test_an_out_of_memory_event_carries_device_free_instead_of_an_address():
    _snapshot.record_trace(1000)
    torchmem.set_memory_limit(64 << 20, "cpu")
    try:
        with pytest.raises(torch.OutOfMemoryError):
            allocate(1 << 30)
    finally:
        torchmem.set_memory_limit(0, "cpu")
    (trace,) = torchmem.snapshot()["device_traces"]
    oom = [entry for entry in trace if entry["action"] == "oom"][-1]

    assert "addr" not in oom and isinstance(oom["device_free"], int)
    assert oom["size"] == 1 << 30


def test_record_trace_turns_stack_capture_on_and_off_again():
    assert not stack_capture.is_recording_history()
    _snapshot.record_trace(10)
    assert stack_capture.is_recording_history()
    _snapshot.record_trace(0)
    assert not stack_capture.is_recording_history()


def test_record_trace_without_stacks_records_events_without_frames():
    _snapshot.record_trace(10)
    _snapshot.record_trace(10, stacks=False)
    allocate(100)
    (trace,) = torchmem.snapshot()["device_traces"]

    assert not stack_capture.is_recording_history()
    assert [entry["frames"] for entry in trace if entry["action"] == "alloc"] == [[]]


def test_record_trace_leaves_history_the_user_turned_on_alone():
    stack_capture.record_history(True)
    try:
        _snapshot.record_trace(10)
        _snapshot.record_trace(0)
        assert stack_capture.is_recording_history()
    finally:
        stack_capture.record_history(False)


# --- rendering with torch.cuda._memory_viz --------------------------------------------------------


@pytest.fixture
def recorded_snapshot():
    """A snapshot with history: small and large blocks, some freed, some alive."""
    _snapshot.record_trace(10_000)
    keep = [allocate(size) for size in (512, 4000, 200_000, 3 << 20)]
    for size in (1000, 8 << 20):
        allocate(size)  # freed at once
    snapshot = torchmem.snapshot()
    yield snapshot
    del keep


def test_segsum_accounts_for_every_byte(recorded_snapshot):
    text = memory_viz.segsum(recorded_snapshot)  # asserts allocated + free == reserved itself

    reserved = sum(segment["total_size"] for segment in recorded_snapshot["segments"])
    assert f"segments: {len(recorded_snapshot['segments'])}" in text
    assert f"total_reserved: {memory_viz.Bytes(reserved)}" in text


def test_trace_prints_the_recorded_events(recorded_snapshot):
    text = memory_viz.trace(recorded_snapshot)
    (events,) = recorded_snapshot["device_traces"]
    allocs = [e for e in events if e["action"] == "alloc"]
    frees = [e for e in events if e["action"] == "free_requested"]

    assert text.startswith(f"Device 0 ----------------\n{len(events)} entries\n")
    # one "name = segment[offset:size]" line per alloc, one "del name" per free
    assert len(re.findall(r"^\w+ = \w+\[\d+:", text, re.MULTILINE)) == len(allocs)
    assert len(re.findall(r"^del \w+ # ", text, re.MULTILINE)) == len(frees)
    assert f"[0:{memory_viz.Bytes(3 << 20)}]" in text or f":{memory_viz.Bytes(3 << 20)}]" in text


def test_memory_and_segments_flamegraph_input_names_the_allocating_line(recorded_snapshot):
    memory = memory_viz.memory(recorded_snapshot, format_flamegraph=as_flamegraph_input)
    segments = memory_viz.segments(recorded_snapshot, format_flamegraph=as_flamegraph_input)
    site = f"{os.path.basename(__file__)}:{line_of('allocate')}:allocate"

    assert re.search(rf"^stream_0;active_allocated;.*{re.escape(site)} 4000$", memory, re.MULTILINE)
    assert re.search(rf"^stream_0;seg_\d+;active_allocated;.*{re.escape(site)} 200000$", segments, re.MULTILINE)


def test_compare_lists_the_segments_only_one_snapshot_has(recorded_snapshot):
    extra = allocate(40 << 20)  # a new large segment
    after = torchmem.snapshot()
    output = memory_viz.compare(recorded_snapshot["segments"], after["segments"], format_flamegraph=as_flamegraph_input)

    assert re.search(r"^only_after;stream_0;seg_\d+;active_allocated;.* 41943040$", output, re.MULTILINE)
    del extra


@pytest.mark.parametrize("render", [memory_viz.trace_plot, memory_viz.segment_plot])
def test_trace_plot_and_segment_plot_embed_the_snapshot_for_the_browser_viewer(recorded_snapshot, render):
    html = render(recorded_snapshot)
    encoded = re.search(r'"base64": "([^"]+)"', html).group(1)
    embedded = pickle.loads(base64.b64decode(encoded))

    assert "add_local_files" in html
    assert embedded == recorded_snapshot


def test_dump_snapshot_pickles_only_what_memory_viz_js_can_unpickle(tmp_path, recorded_snapshot):
    path = tmp_path / "snapshot.pickle"
    torchmem.dump_snapshot(path)
    data = path.read_bytes()
    opcodes = {opcode.name for opcode, _, _ in pickletools.genops(data)}

    assert data[:2] == b"\x80\x04"  # protocol 4: MemoryViz.js accepts 2..4
    assert opcodes <= MEMORY_VIZ_OPCODES, opcodes - MEMORY_VIZ_OPCODES
    assert pickle.loads(data)["segments"]


def replay_backwards(snapshot: dict, device: int) -> int:
    """What pytorch.org/memory_viz's "Allocator State History" does: start from the
    snapshot's segments and live blocks and undo the trace event by event; every live
    block must lie inside a live segment at every step (the viewer dereferences it).
    Returns how many events were replayed."""
    segments = {s["address"]: s["total_size"] for s in snapshot["segments"] if s["device"] == device}
    blocks = {
        b["address"]: b["size"]
        for s in snapshot["segments"] if s["device"] == device
        for b in s["blocks"] if b["state"] != "inactive"
    }
    events = snapshot["device_traces"][device]
    for event in reversed(events):
        action = event["action"]
        if action == "free_completed":
            blocks[event["addr"]] = event["size"]
        elif action == "alloc":
            del blocks[event["addr"]]
        elif action == "segment_free":
            segments[event["addr"]] = event["size"]
        elif action == "segment_alloc":
            del segments[event["addr"]]
        for address in blocks:
            assert any(start <= address < start + size for start, size in segments.items()), (
                f"block {address:#x} outside every segment before {event}"
            )
    return len(events)


def test_the_allocator_state_history_replays_consistently(recorded_snapshot):
    torchmem.empty_cache("cpu")  # segment_free events too
    snapshot = torchmem.snapshot()

    assert replay_backwards(snapshot, 0) > 10


# --- the file and the command line ----------------------------------------------------------------


def run_memory_viz(*args: str, home) -> subprocess.CompletedProcess:
    # flamegraph.pl is looked up in ~/.cache (and downloaded when missing): give it one that echoes.
    cache = home / ".cache"
    cache.mkdir(exist_ok=True)
    script = cache / "flamegraph.pl"
    script.write_text("#!/bin/sh\ncat\n")
    script.chmod(0o755)
    env = dict(os.environ, HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", *args],
        capture_output=True, text=True, env=env, cwd=home, timeout=300,
    )


def test_the_memory_viz_command_line_renders_a_dumped_snapshot(tmp_path, recorded_snapshot):
    path = tmp_path / "snapshot.pickle"
    torchmem.dump_snapshot(path)

    stats = run_memory_viz("stats", str(path), home=tmp_path)
    trace = run_memory_viz("trace", str(path), home=tmp_path)
    plots = [run_memory_viz(kind, str(path), "-o", str(tmp_path / f"{kind}.html"), home=tmp_path)
             for kind in ("trace_plot", "segment_plot")]
    graphs = [run_memory_viz(kind, str(path), "-o", str(tmp_path / f"{kind}.txt"), home=tmp_path)
              for kind in ("memory", "segments")]

    for result in [stats, trace, *plots, *graphs]:
        assert result.returncode == 0, result.stderr
    assert "total_reserved" in stats.stdout
    assert "Device 0" in trace.stdout
    assert "add_local_files" in (tmp_path / "trace_plot.html").read_text()
    assert "active_allocated" in (tmp_path / "memory.txt").read_text()


def test_dump_snapshot_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        torchmem.dump_snapshot(tmp_path / "missing" / "snapshot.pickle")


def test_dump_snapshot_refuses_a_directory(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        torchmem.dump_snapshot(tmp_path)


def test_dump_snapshot_names_an_unwritable_file(tmp_path):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(b"")
    path.chmod(0o400)
    if os.access(path, os.W_OK):  # root ignores file modes, but nobody creates files in /proc
        path = "/proc/torchmem-snapshot.pickle"
    with pytest.raises(OSError, match="cannot write"):
        torchmem.dump_snapshot(path)


def test_dump_snapshot_rejects_a_path_that_is_not_a_path():
    with pytest.raises(TypeError, match="str or os.PathLike"):
        torchmem.dump_snapshot(42)


# --- choosing devices -----------------------------------------------------------------------------


def test_a_cpu_snapshot_puts_the_cpu_at_device_index_0():
    keep = allocate(100)
    snapshot = torchmem.snapshot("cpu")

    assert snapshot["torchmem"]["device_names"] == ["cpu"]
    assert {segment["device"] for segment in snapshot["segments"]} == {0}
    assert len(snapshot["device_traces"]) == 1
    del keep


def test_devices_accept_a_torch_device_and_a_list():
    assert torchmem.snapshot(torch.device("cpu"))["torchmem"]["device_names"] == ["cpu"]
    assert torchmem.snapshot(["cpu", "cpu"])["torchmem"]["device_names"] == ["cpu"]


@pytest.mark.parametrize(
    "devices, error, message",
    [
        ("tpu", ValueError, "not a device name|not supported"),
        ("cuda:0", ValueError, "does not serve cuda:0"),
        ([], ValueError, "empty"),
        (3.5, TypeError, "devices must be"),
        ([True], TypeError, "is not a device"),
    ],
)
def test_bad_devices_are_refused_with_a_clear_message(devices, error, message):
    with pytest.raises(error, match=message):
        torchmem.snapshot(devices)


@pytest.mark.parametrize("max_entries, error", [(-1, ValueError), (True, TypeError), ("10", TypeError)])
def test_record_trace_refuses_bad_sizes(max_entries, error):
    with pytest.raises(error, match="max_entries"):
        _snapshot.record_trace(max_entries)
