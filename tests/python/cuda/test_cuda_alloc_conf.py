"""PYTORCH_CUDA_ALLOC_CONF with torchmem: honoured as PyTorch's allocator would, or said.

torchmem reads the values PyTorch parsed (so both agree on every spelling), applies the
size knobs and the garbage-collection threshold itself, and warns once for each key it
does not implement. The comparisons run the same steps under PyTorch's own allocator and
under torchmem, each in a fresh process (the variable is read when CUDA starts).
"""

import json
import os

import pytest
import torch

import torchmem
from processes import ROOT, run

TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])


def set_allocator_settings(settings: str) -> None:
    """torch.cuda.memory._set_allocator_settings, under the name of the torch running."""
    if hasattr(torch._C, "_accelerator_setAllocatorSettings"):  # 2.10+: every accelerator
        torch._C._accelerator_setAllocatorSettings(settings)
    else:
        torch.cuda.memory._set_allocator_settings(settings)


LAYOUT_STEPS = """
MiB = 1 << 20
def tensor(size):
    return torch.empty(size, dtype=torch.uint8, device="cuda")

held = [tensor(s) for s in (1200, 1258291, 3 * MiB, 5 * MiB, 70 * MiB, 45 * MiB, 300 * MiB, 250 * MiB)]
del held[4], held[-2]  # a 70 MiB and a 300 MiB block become free
held.append(tensor(280 * MiB))  # 300 MiB is oversize: not split for this
held.append(tensor(40 * MiB))   # nor handed to a much smaller request
layout = sorted((b["size"], b["state"]) for s in torch.cuda.memory_snapshot() for b in s["blocks"])
stats = torch.cuda.memory_stats()
keys = [k for k in stats if k.startswith(("oversize", "reserved_bytes.all", "allocated_bytes.all",
                                          "inactive_split", "max_split"))]

# Garbage collection: with a memory fraction, cached blocks go (oldest first) once the
# reserved memory passes threshold x limit.
del held
torch.cuda.empty_cache()
torch.cuda.set_per_process_memory_fraction(1 / 16)  # 1 GiB of the simulated 16 GiB
for size in (300, 200, 100, 250, 350, 150):
    tensor(size * MiB)
after_gc = torch.cuda.memory_stats()
print(json.dumps({"layout": layout, "stats": {k: stats[k] for k in keys},
                  "reserved_after_gc": after_gc["reserved_bytes.all.current"],
                  "segments_freed": after_gc["segment.all.freed"]}))
"""


def test_size_knobs_and_garbage_collection_match_pytorchs_allocator():
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:100,roundup_power2_divisions:4,"
                                       "garbage_collection_threshold:0.6"}
    native = run(LAYOUT_STEPS, "native", env=conf)
    ours = run(LAYOUT_STEPS, "torchmem", env=conf)
    assert ours == native
    assert native["stats"]["max_split_size"] == 100 << 20
    assert native["stats"]["oversize_segments.current"] >= 1


SMALLEST_MAX_SPLIT_STEPS = """
MiB = 1 << 20
def tensor(size):
    return torch.empty(size, dtype=torch.uint8, device="cuda")

first = [tensor(3 * MiB), tensor(5 * MiB)]  # split off a fresh, already oversize, 20 MiB segment
del first  # whole again: oversize, so it serves no medium request
second = tensor(4 * MiB)  # from a new segment
layout = sorted((s["total_size"], [(b["size"], b["state"]) for b in s["blocks"]])
                for s in torch.cuda.memory_snapshot())
stats = torch.cuda.memory_stats()
print(json.dumps({"layout": layout, "stats": {k: v for k, v in stats.items()
                                              if k.startswith(("oversize", "segment.all",
                                                               "max_split"))}}))
"""


# PyTorch's parser wants max_split_size_mb >= 20 from torch 2.10 (> 20 in 2.9).
SMALLEST_MAX_SPLIT_MB = 21 if TORCH < "2.10" else 20


def test_the_smallest_max_split_size_pytorch_accepts_is_honoured_as_pytorch_does():
    conf = {"PYTORCH_CUDA_ALLOC_CONF": f"max_split_size_mb:{SMALLEST_MAX_SPLIT_MB}"}
    native = run(SMALLEST_MAX_SPLIT_STEPS, "native", env=conf)
    ours = run(SMALLEST_MAX_SPLIT_STEPS, "torchmem", env=conf)
    assert ours == native
    assert native["stats"]["max_split_size"] == SMALLEST_MAX_SPLIT_MB << 20
    if SMALLEST_MAX_SPLIT_MB == 20:  # the 20 MiB shared segment is itself oversize
        assert [blocks for _, blocks in native["layout"]] == [
            [[4 << 20, "active_allocated"], [16 << 20, "inactive"]], [[20 << 20, "inactive"]]]


def test_unimplemented_keys_warn_once_each_and_pinned_keys_are_pytorchs():
    snippet = """
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.empty(100, device="cuda")
        second = torch.empty(100, device="cuda")
        torch.cuda.memory_stats()
    from torchmem import _C_cuda
    print(json.dumps({"warnings": [str(w.message) for w in caught],
                      "unimplemented": _C_cuda.unimplemented_settings(),
                      "allocated": torch.cuda.memory_allocated(),
                      "expandable": [s["is_expandable"] for s in torch.cuda.memory_snapshot()]}))
    """
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,release_lock_on_cudamalloc:True,"
                                       "pinned_use_cuda_host_register:True,"
                                       "pinned_num_register_threads:4"}
    result = run(snippet, "torchmem", env=conf)
    torchmem_warnings = [w for w in result["warnings"] if w.startswith("torchmem:")]
    # expandable_segments:True is implemented: torchmem's virtual-memory placement.
    assert len(torchmem_warnings) == 1
    assert "release_lock_on_cudamalloc:True" in torchmem_warnings[0]
    assert not any("pinned" in w for w in torchmem_warnings)
    assert len(result["unimplemented"]) == 1
    assert result["allocated"] == 1024  # two 512-byte blocks: torchmem still serves CUDA
    assert result["expandable"] == [True]


@pytest.mark.parametrize("variable", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_expandable_segments_select_the_virtual_memory_placement(variable):
    snippet = """
    import simcuda
    x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    print(json.dumps({"reserved": torch.cuda.memory_reserved(),
                      "mapped": simcuda.Control().vmm_stats()["mapped_bytes"],
                      "mallocs": simcuda.Control().call_count("cudaMalloc")}))
    """
    env = {variable: "expandable_segments:True",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "simcuda"), str(ROOT)])}
    # A 20 MiB page of the large pool mapped (as PyTorch's expandable segments map), where
    # PyTorch's placement would take a 20 MiB segment with cudaMalloc.
    assert run(snippet, "torchmem", env=env) == {"reserved": 20 << 20, "mapped": 20 << 20,
                                                 "mallocs": 0}


def test_another_backend_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    with pytest.raises(RuntimeError) as error:
        torchmem.cuda_allocator()
    message = str(error.value)
    assert "backend:cudaMallocAsync" in message
    assert "Remove backend:cudaMallocAsync from PYTORCH_CUDA_ALLOC_CONF" in message


def test_pytorch_alloc_conf_is_read_when_the_cuda_one_is_absent(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")
    with pytest.raises(RuntimeError, match="PYTORCH_ALLOC_CONF has backend:cudaMallocAsync"):
        torchmem.cuda_allocator()


# c10's config parser hook, through which torchmem hears of settings changed at run time,
# arrived in torch 2.11; before, torchmem reads PYTORCH_CUDA_ALLOC_CONF once, at install.
@pytest.mark.skipif(TORCH < (2, 11),
                    reason="torch < 2.11 has no hook for allocator settings changed at run time")
def test_settings_changed_at_run_time_reach_the_engines():
    try:
        set_allocator_settings("max_split_size_mb:50")
        assert torch.cuda.memory_stats()["max_split_size"] == 50 << 20
        big = torch.empty(60 << 20, dtype=torch.uint8, device="cuda")
        del big  # an oversize block now
        assert torch.cuda.memory_stats()["oversize_segments.current"] == 1
        small = torch.empty(20 << 20, dtype=torch.uint8, device="cuda")
        assert small.data_ptr() != 0 and torch.cuda.memory_stats()["oversize_allocations.current"] == 0
        del small
    finally:
        set_allocator_settings("max_split_size_mb:18446744073709")
        torch.cuda.empty_cache()


def test_a_bad_setting_is_pytorchs_error_before_torchmem_sees_it():
    # A ValueError from torch 2.10 on, a RuntimeError before.
    with pytest.raises((ValueError, RuntimeError), match="power of 2"):
        set_allocator_settings("roundup_power2_divisions:3")
    json.dumps(torch.cuda.memory_stats())  # the allocator still answers
