"""Shared pytest configuration for torchmem's Python tests."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# tests/python/cuda runs in its own pytest session on the simulated CUDA
# device (see test_cuda_simulated.py), with torchmem installed before CUDA
# is initialized; it is never collected by this session.
collect_ignore = ["cuda"]


@pytest.fixture(scope="session")
def simcuda_dir():
    """The built simulated CUDA device's library folder; fails the test that asks for it,
    saying how to build it, when it is not built."""
    simcuda_path = os.path.join(ROOT, "tests", "simcuda")
    if simcuda_path not in sys.path:
        sys.path.insert(0, simcuda_path)
    import simcuda  # noqa: PLC0415 - tests/simcuda is put on the path just above

    try:
        return simcuda.library_dir()
    except simcuda.SimcudaNotBuilt as error:
        pytest.fail(str(error), pytrace=False)
