"""``BinaryPrecisionRecallCurve.compute()`` called every step without ``reset()``: the metric
keeps every batch's predictions and targets, so ``self.preds`` and ``self.target`` grow without
bound (Lightning-AI/torchmetrics#2921, found through openvinotoolkit/anomalib#2531).

[scenario]
verdict = "leak"
kind = "growth"
owner = ".target"
modes = ["leak_check", "growth"]
report = "https://github.com/Lightning-AI/torchmetrics/issues/2921"
"""

import torch
from torchmetrics.classification import BinaryPrecisionRecallCurve

from _corpus import device, main

STEPS = 12


def setup():
    return BinaryPrecisionRecallCurve(validate_args=False).to(device())


def step(metric, index):
    preds = torch.rand(512, device=device())
    target = torch.randint(0, 2, (512,), device=device())  # ALLOC
    metric.update(preds, target)
    metric.compute()


if __name__ == "__main__":
    main(globals())
