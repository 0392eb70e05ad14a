"""Composer before mosaicml/composer#3180: every batch the trainer deep-copied its torchmetrics
metrics and computed on the copies. A Metric refers to itself (``update`` wraps the bound
method), so every copy is a reference cycle that only the cyclic collector frees; in a long run
the copies reach the oldest generation and memory grows until the process dies
(mosaicml/composer#3153).

[scenario]
verdict = "leak"
kind = "cycle"
owner = "<BinaryAccuracy>."
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/mosaicml/composer/issues/3153"
collector = "paused"
"""

from copy import deepcopy

import torch
from torchmetrics.classification import BinaryAccuracy

from _corpus import device, main

STEPS = 12


class Trainer:
    def __init__(self):
        # validate_args=False: on the simulated CUDA device kernels do not run, so the
        # metric's value checks would read arbitrary numbers.
        self.train_metrics = {"acc": BinaryAccuracy(validate_args=False).to(device())}
        self.logged = []

    def compute_and_log_metrics(self):
        metrics = deepcopy(self.train_metrics)  # ALLOC
        self.logged.append({name: float(metric.compute()) for name, metric in metrics.items()})


def setup():
    preds = torch.tensor([0.9, 0.2, 0.7, 0.4], device=device())
    target = torch.tensor([1, 0, 0, 1], device=device())
    return Trainer(), preds, target


def step(state, index):
    trainer, preds, target = state
    trainer.train_metrics["acc"].update(preds, target)
    trainer.compute_and_log_metrics()


if __name__ == "__main__":
    main(globals())
