"""Snapshots, summaries and ``python -m torchmem run`` with CUDA tensors (simulated device).

Runs in the CUDA session (see conftest.py): torchmem serves CUDA and the CPU, and the
simulated runtime has two devices.
"""

import copy
import pickle
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

import torchmem
from torchmem.reports import snapshot as _snapshot

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_history_after():
    yield
    _snapshot.record_trace(0)


def block_for(snapshot: dict, tensor: torch.Tensor) -> dict:
    address = tensor.untyped_storage().data_ptr()
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["address"] == address:
                return segment, block
    raise AssertionError(f"no block at {address:#x}")


def test_cuda_devices_keep_their_index_and_the_cpu_comes_after_them():
    on_0 = torch.empty(1000, device="cuda:0")
    on_1 = torch.empty(1000, device="cuda:1")
    on_cpu = torch.empty(1000)
    snapshot = torchmem.snapshot()

    assert snapshot["torchmem"]["device_names"] == ["cuda:0", "cuda:1", "cpu"]
    assert len(snapshot["device_traces"]) == 3
    assert block_for(snapshot, on_0)[0]["device"] == 0
    assert block_for(snapshot, on_1)[0]["device"] == 1
    assert block_for(snapshot, on_cpu)[0]["device"] == 2
    del on_0, on_1, on_cpu


def test_a_snapshot_of_one_cuda_device_keeps_its_index():
    tensor = torch.empty(1000, device="cuda:1")
    snapshot = torchmem.snapshot("cuda:1")

    assert snapshot["torchmem"]["device_names"] == [None, "cuda:1"]
    assert {segment["device"] for segment in snapshot["segments"]} == {1}
    del tensor


def test_record_trace_reaches_every_cuda_device_and_memory_viz_renders_them():
    _snapshot.record_trace(1000)
    first = torch.empty(1 << 20, device="cuda:0")
    second = torch.empty(1 << 20, device="cuda:1")
    snapshot = torchmem.snapshot()

    assert any(entry["action"] == "alloc" for entry in snapshot["device_traces"][0])
    assert any(entry["action"] == "alloc" for entry in snapshot["device_traces"][1])
    text = memory_viz.trace(snapshot)
    assert "Device 0 ----" in text and "Device 1 ----" in text
    assert "total_reserved" in memory_viz.segsum(snapshot)
    assert "add_local_files" in memory_viz.trace_plot(snapshot)
    del first, second


def test_a_deep_copied_cuda_tensor_is_allocated_at_the_deepcopy_line():
    original = torch.zeros(512, 512, dtype=torch.int64, device="cuda")
    torchmem.record_history(True)
    try:
        copied = copy.deepcopy(original)  # the deepcopy line
    finally:
        torchmem.record_history(False)
    _, block = block_for(torchmem.snapshot("cuda:0"), copied)
    line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# the deepcopy line"))

    user_frames = [frame for frame in block["frames"] if frame["filename"] == __file__]
    assert user_frames[0]["line"] == line
    del original, copied


def test_the_summary_lists_the_cuda_devices_that_allocated():
    tensor = torch.empty(3 << 20, dtype=torch.uint8, device="cuda:0")
    data = torchmem.summary(format="dict")

    assert "cuda:0" in data["devices"]
    assert data["devices"]["cuda:0"]["allocated"]["current"] >= 3 << 20
    assert "torchmem summary: cuda:0" in torchmem.summary()
    del tensor


def test_run_installs_torchmem_for_cuda_before_the_script_touches_it(tmp_path):
    script = tmp_path / "gpu.py"
    script.write_text(textwrap.dedent("""\
        import torch
        weights = torch.ones(1 << 20, device="cuda")
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # keeps the simulated runtime's preload
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--snapshot", "mem.pickle", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    snapshot = pickle.loads((tmp_path / "mem.pickle").read_bytes())

    assert result.returncode == 0, result.stderr
    assert "torchmem summary: cuda:0" in result.stderr and "torchmem summary: cpu" in result.stderr
    assert snapshot["torchmem"]["device_names"][0] == "cuda:0"
    assert any(entry["action"] == "alloc" and entry["size"] == 4 << 20 for entry in snapshot["device_traces"][0])
