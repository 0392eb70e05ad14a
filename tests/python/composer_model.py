"""The shape of Composer's Trainer before mosaicml/composer#3180, for the scenario tests.

Every batch, ``_compute_and_log_metrics`` deep-copied the torchmetrics metrics it was
given and computed on the copies. A Metric refers to itself (``metric.update`` wraps the
bound method), so every copy is a reference cycle whose tensors only the cyclic garbage
collector frees. Used on CPU (tests/python/test_scenarios.py) and on the simulated CUDA
device (tests/python/cuda/test_cuda_scenarios.py).
"""

from __future__ import annotations

from copy import deepcopy

import torch
from torchmetrics.classification import BinaryAccuracy, BinaryF1Score

import torchmem


class TrainerState:
    def __init__(self, device: str):
        # validate_args=False: on the simulated CUDA device kernels do not run, so the
        # metric's value checks would read arbitrary numbers.
        self.train_metrics = {
            "acc": BinaryAccuracy(validate_args=False).to(device),
            "f1": BinaryF1Score(validate_args=False).to(device),
        }


class ComposerLikeTrainer:
    def __init__(self, device: str = "cpu"):
        self.device = device
        self.state = TrainerState(device)
        self.logged: list[dict] = []

    def train_batch(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        with torchmem.tag("metrics"):
            for metric in self.state.train_metrics.values():
                metric.update(preds, target)
            self._compute_and_log_metrics(self.state.train_metrics)

    def _compute_and_log_metrics(self, metrics: dict) -> None:
        metrics = deepcopy(metrics)  # the bug, removed by mosaicml/composer#3180
        computed = {name: metric.compute() for name, metric in metrics.items()}  # compute on the copies
        self.logged.append({name: float(value) for name, value in computed.items()})


def run_composer_like_training(trainer: ComposerLikeTrainer, steps: int, monitor) -> None:
    preds = torch.tensor([0.9, 0.2, 0.7, 0.4], device=trainer.device)
    target = torch.tensor([1, 0, 0, 1], device=trainer.device)
    for _ in range(steps):
        trainer.train_batch(preds, target)
        monitor.step()
