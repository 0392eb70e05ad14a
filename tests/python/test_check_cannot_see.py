"""A leak check that cannot see the memory says so; "no leaks" means nothing was left.

``with torchmem.leak_check():`` keeping 4 MiB used to say "no leaks" when torchmem was not
installed, or when it served only the CPU and the tensors were on CUDA (PyTorch's own
allocator, which no check sees).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchmem
from leak_helpers import torchmem_cpu  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEPT: list = []


def test_a_check_with_torchmem_not_installed_refuses_naming_install():
    torchmem.uninstall("cpu")
    try:
        with pytest.raises(RuntimeError, match=r"torchmem is not installed.*torchmem.install\('cpu'\)"):
            with torchmem.leak_check():
                KEPT.append(torch.zeros(1 << 20))  # 4 MiB
    finally:
        torchmem.install("cpu")
        KEPT.clear()


def test_cuda_memory_kept_while_torchmem_serves_only_the_cpu_is_reported_as_not_checked(simcuda_dir):
    sys.path.insert(0, os.path.join(ROOT, "tests", "simcuda"))
    import simcuda  # noqa: PLC0415 - tests/simcuda is put on the path just above

    script = textwrap.dedent("""
        import warnings
        import torch
        import torchmem

        torchmem.install("cpu")
        torch.zeros(1, device="cuda")  # CUDA started with PyTorch's own allocator
        kept = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torchmem.leak_check() as report:  # raise_on_leak: would raise on a leak it saw
                kept.append(torch.empty(4 << 20, dtype=torch.uint8, device="cuda"))
        print(report.render().splitlines()[0])
        print("WARNING", caught[0].category.__name__, caught[0].message)
    """)
    env = simcuda.environment()
    env["PYTHONPATH"] = ROOT
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)

    assert result.returncode == 0, result.stderr
    summary, warning = result.stdout.strip().splitlines()[-2:]
    assert summary.startswith(
        "torchmem.leak_check: not checked: 4.0 MiB of CUDA memory (cuda:0) allocated inside is still allocated by "
        "PyTorch's own allocator, which this check cannot see (torchmem serves only cpu): call torchmem.install('cpu')"
    ), summary
    assert "no leaks" not in summary
    assert warning.startswith("WARNING UnseenMemoryWarning torchmem.leak_check (entered at <string>:")
    assert "install('cuda') before anything starts CUDA" in warning
