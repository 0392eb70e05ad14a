"""Datasets and a training loop for the DataLoader, fork and RSS tests.

They live in a module of their own (not in a test file) because ``spawn`` workers
unpickle the dataset by reference: the worker imports this module by name, which works
because a spawned worker gets the parent's ``sys.path``.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset

import torchmem
from torchmem import _C

# Memory a worker keeps for its whole life (one entry per item it produced): a worker
# that grows, whose growth must stay in the worker.
WORKER_HOARD: list = []

FEATURES = 8


class ProbeDataset(Dataset):
    """A small regression dataset whose items also say what the worker that made them saw.

    Item ``i`` is a dict: ``x`` (``FEATURES`` floats), ``y`` (one float), and, from the
    process that produced it, ``pid``, ``installed`` (1 if torchmem serves its CPU
    tensors) and ``engine_allocated`` (bytes allocated in that process's torchmem CPU
    engine). With ``hoard_bytes``, producing an
    item also keeps that many bytes alive in the worker under the tag ``worker-hoard``.
    """

    def __init__(self, length: int = 64, hoard_bytes: int = 0):
        self.length = length
        self.hoard_bytes = hoard_bytes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(FEATURES, generator=generator)
        y = x.sum(dim=0, keepdim=True) * 0.5
        if self.hoard_bytes:
            with torchmem.tag("worker-hoard"):
                WORKER_HOARD.append(torch.ones(self.hoard_bytes // 4))
        return {
            "x": x,
            "y": y,
            "pid": os.getpid(),
            "installed": int(_C.cpu_installed()),
            "engine_allocated": _C.cpu_engine().memory_stats()["allocated_bytes.all.current"],
        }


class GrowingDataset(Dataset):
    """Producing item 0 keeps ``grow_bytes`` more bytes (plain Python memory, written to,
    so it is resident) alive in the worker: a worker whose private memory really grows by
    ``grow_bytes`` per epoch."""

    def __init__(self, length: int = 8, grow_bytes: int = 32 << 20):
        self.length = length
        self.grow_bytes = grow_bytes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            WORKER_HOARD.append(b"\x01" * self.grow_bytes)
        return torch.full((FEATURES,), float(index))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One step, tagged by phase: the forward and backward pass under ``forward``/``backward``,
    the update under ``optimizer``. Returns the loss as a float (holding no tensor).

    The gradients are released after the update (not before the next backward), so
    nothing a step allocates outlives it except the optimizer's state: a leak check
    around a whole epoch then sees only what the epoch really leaked."""
    with torchmem.tag("forward"):
        loss = torch.nn.functional.mse_loss(model(x), y)
    with torchmem.tag("backward"):
        loss.backward()
    with torchmem.tag("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()
