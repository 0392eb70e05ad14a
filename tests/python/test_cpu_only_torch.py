"""torchmem with a CPU-only PyTorch: imports, installs for the CPU, never loads CUDA code.

The CUDA half (torchmem._C_cuda) is the only part linked to CUDA or torch's CUDA
libraries; torchmem._C and libtorchmem.so need only libc10 and libtorch.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchmem

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(torchmem.__file__).resolve().parent
CUDA_LIBRARIES = ("libcudart", "libcuda.", "libc10_cuda", "libtorch_cuda", "libcublas", "libnccl")


def needed_libraries(path: Path) -> list[str]:
    output = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                            check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in output.splitlines() if "(NEEDED)" in line]


@pytest.mark.parametrize("pattern", ["_C.*.so", "lib/libtorchmem.so"])
def test_the_cpu_modules_need_no_cuda_library(pattern):
    [path] = PACKAGE.glob(pattern)
    needed = needed_libraries(path)
    assert "libc10.so" in needed
    assert not [name for name in needed if name.startswith(CUDA_LIBRARIES)]


def test_only_the_cuda_module_links_cuda():
    [path] = PACKAGE.glob("_C_cuda.*.so")
    needed = needed_libraries(path)
    assert "libc10_cuda.so" in needed and "libtorchmem.so" in needed


def test_a_cpu_only_torch_imports_torchmem_and_installs_it_for_the_cpu():
    # What a CPU-only wheel looks like to torchmem: torch.version.cuda is None.
    code = """
import json, sys, torch
torch.version.cuda = None
import torchmem
torchmem.install("cpu")
x = torch.empty(1000)
with torchmem.tag("cpu-only"):
    y = torch.empty(1 << 20)
try:
    torchmem.install("cuda")
    cuda_error = None
except Exception as error:
    cuda_error = str(error)
print(json.dumps({"cpu": torchmem.is_installed("cpu"), "cuda": torchmem.is_installed("cuda"),
                  "tagged": torchmem.tag_stats("cpu")["cpu-only"]["current_bytes"],
                  "cuda_module_loaded": "torchmem._C_cuda" in sys.modules,
                  "cuda_error": cuda_error}))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["cpu"] and not outcome["cuda"] and not outcome["cuda_module_loaded"]
    assert outcome["tagged"] >= 4 << 20
    assert "CPU-only" in outcome["cuda_error"]
