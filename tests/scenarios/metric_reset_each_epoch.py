"""The advice of Lightning-AI/torchmetrics#1949 and #3294: a list-state metric reset at the end
of every epoch (four batches here) grows within an epoch and returns to empty after it.

[scenario]
verdict = "clean"
kind = "rises and falls"
owner = ""
modes = ["leak_check", "growth"]
report = "https://github.com/Lightning-AI/torchmetrics/issues/3294"
"""

import torch
from torchmetrics.classification import MultilabelAveragePrecision

from _corpus import device, main

STEPS = 16
EPOCH = 4
LABELS = 16


def setup():
    metric = MultilabelAveragePrecision(num_labels=LABELS, validate_args=False).to(device())
    target = torch.randint(0, 2, (256, LABELS), device=device())
    return metric, target


def step(state, index):
    metric, target = state
    preds = torch.rand(256, LABELS, device=device())  # ALLOC
    metric.update(preds, target)
    if (index + 1) % EPOCH == 0:
        metric.reset()


if __name__ == "__main__":
    main(globals())
