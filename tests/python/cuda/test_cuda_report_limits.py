"""``@pytest.mark.torchmem(limit_peak=...)`` on GPU memory (the simulated device): the peak of a
test's own CUDA allocations, per device, with the lines that made it; CPU memory the same test
allocates counts on the CPU, not against the GPU."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

MODULE = """
import pytest
import torch


@pytest.mark.torchmem(limit_peak="64 MiB", device="cuda", enabled=False)
def test_over_on_the_gpu():
    weights = torch.empty(48 * 2**20, dtype=torch.uint8, device="cuda")
    scratch = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda")


@pytest.mark.torchmem(limit_peak="64 MiB", device="cuda", enabled=False)
def test_under_on_each_device():
    # 40 MiB on the GPU and 40 MiB on the CPU: 80 MiB in all, but the limit is per device.
    on_gpu = torch.empty(40 * 2**20, dtype=torch.uint8, device="cuda")
    on_cpu = torch.empty(40 * 2**20, dtype=torch.uint8)
"""

CONFTEST = """
import torchmem
torchmem.install()       # CUDA, before anything initializes it
torchmem.install("cpu")  # and the CPU: both devices are measured
"""


def test_limit_peak_fails_a_test_over_it_on_a_cuda_device(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_gpu=MODULE)

    result = pytester.runpytest_subprocess("-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "torchmem: this test's own allocations peaked at 80.0 MiB on cuda:0, over its limit_peak of 64.0 MiB",
        "  what the test held at that peak, by the line that allocated it:",
        "     at peak   allocated at",
        "    48.0 MiB   test_gpu.py:7 in test_over_on_the_gpu   weights = torch.empty(48 * 2**20, *",
        "    32.0 MiB   test_gpu.py:8 in test_over_on_the_gpu   scratch = torch.empty(32 * 2**20, *",
    ])
    assert "on cpu" not in result.stdout.str()
