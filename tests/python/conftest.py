"""Shared pytest configuration for torchmem's Python tests."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# tests/python/cuda runs in its own pytest session on the simulated CUDA
# device (see test_cuda_simulated.py), with torchmem installed before CUDA
# is initialized; it is never collected by this session.
collect_ignore = ["cuda"]
