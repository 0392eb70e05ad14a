"""``metric(preds, target)`` in a loop with a metric whose state is a list of every batch
(``AveragePrecision`` without thresholds): the state grows with every call until ``reset()``,
which the loop never calls (Lightning-AI/torchmetrics#3294, "The gpu memory usage keeps growing
when using AveragePrecision").

[scenario]
verdict = "leak"
kind = "growth"
owner = ".target"
modes = ["leak_check", "growth"]
report = "https://github.com/Lightning-AI/torchmetrics/issues/3294"
"""

import torch
from torchmetrics.classification import MultilabelAveragePrecision

from _corpus import device, main

STEPS = 12
LABELS = 16


def setup():
    metric = MultilabelAveragePrecision(num_labels=LABELS, validate_args=False).to(device())
    return metric


def step(metric, index):
    preds = torch.rand(256, LABELS, device=device())
    target = torch.randint(0, 2, (256, LABELS), device=device())  # ALLOC
    metric.update(preds, target)  # forward() would also compute the batch's value


if __name__ == "__main__":
    main(globals())
