"""The CUDA session: runs only on the simulated device, with torchmem installed first.

Started by tests/python/test_cuda_simulated.py with tests/simcuda's runtime in
LD_PRELOAD. torchmem.install() must precede CUDA initialization, so it runs
here, at import, before any test module is collected.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "simcuda"))

import simcuda  # noqa: E402
import torch  # noqa: E402

import torchmem  # noqa: E402

if not any(name in os.environ.get("LD_PRELOAD", "") for name in simcuda.RUNTIME_NAMES):
    raise pytest.UsageError(
        "tests/python/cuda runs on the simulated CUDA device only: run "
        "`pytest tests/python/test_cuda_simulated.py`, which starts it with the right preload"
    )
assert not torch.cuda.is_initialized(), "something initialized CUDA before torchmem.install()"
torchmem.install()  # CUDA
torchmem.install("cpu")


@pytest.fixture
def sim():
    """The simulated device's controls, reset after the test."""
    control = simcuda.Control()
    control.reset()
    yield control
    control.reset()


@pytest.fixture(autouse=True)
def clean_cuda_cache():
    """Each test starts from an empty cache and no limit on both devices."""
    yield
    for device in range(torch.cuda.device_count()):
        torchmem.set_memory_limit(0, device=f"cuda:{device}")
    torch.cuda.synchronize()
    torchmem.empty_cache("cuda:0")
