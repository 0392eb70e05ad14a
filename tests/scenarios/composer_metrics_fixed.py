"""The fix of mosaicml/composer#3153 (#3180): compute on the live metrics instead of deep
copies; nothing is copied, so no cycle is left per batch. The live metrics rebind their state
tensors on every update (``self.tp = self.tp + tp``), which a check around the loop sees alive
at its end; the check is told that the trainer may keep what it computed
(``allow_held_by={"state": state}``, header ``allow_state``), as the docs advise.

[scenario]
verdict = "clean"
kind = "cycle"
owner = ""
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/mosaicml/composer/pull/3180"
collector = "paused"
allow_state = true
"""

import torch
from torchmetrics.classification import BinaryAccuracy

from _corpus import device, main

STEPS = 12


class Trainer:
    def __init__(self):
        self.train_metrics = {"acc": BinaryAccuracy(validate_args=False).to(device())}
        self.logged = []

    def compute_and_log_metrics(self):
        metrics = self.train_metrics  # ALLOC
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
