"""Expandable segments' page maps and unmaps appear in allocation traces, as PyTorch's do.

PyTorch records segment_map/segment_unmap trace entries for expandable segments (never
segment_alloc): memory_viz draws reserved memory from them, and ProcessGroupNCCL's trace
tracker registers mapped memory with its communicators on segment_map. The process runs with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and a tracker attached through PyTorch's
attachAllocatorTraceTracker (trackers cannot be detached, hence a process of its own).
"""

from processes import run

MiB = 1 << 20

SNIPPET = """
    from torchmem import _C_cuda
    torch.cuda.memory._record_memory_history(max_entries=100000)
    _C_cuda.attach_recording_trace_tracker()
    x = torch.empty(64 * (1 << 20), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    def segments(entries):
        return [[e["action"], e["addr"], e["size"]] for e in entries
                if e["action"].startswith("segment")]
    traced = segments(torch.cuda.memory._snapshot()["device_traces"][0])
    tracked = segments(e for e in _C_cuda.recorded_trace_entries() if e["device"] == 0)
    print(json.dumps({"traced": traced, "tracked": tracked}))
"""


def bytes_by_action(entries):
    totals = {}
    for action, _, size in entries:
        totals[action] = totals.get(action, 0) + size
    return totals


def test_maps_and_unmaps_reach_the_history_and_the_trace_trackers():
    answer = run(SNIPPET, "torchmem", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    for name in ("traced", "tracked"):
        totals = bytes_by_action(answer[name])
        assert set(totals) == {"segment_map", "segment_unmap"}, (name, answer[name])
        assert totals["segment_map"] >= 64 * MiB, (name, answer[name])
        assert totals["segment_unmap"] == totals["segment_map"], (name, answer[name])  # empty_cache
    assert answer["tracked"] == answer["traced"]
