"""A new metric for every evaluation, used once and dropped without ``reset()``
(Lightning-AI/torchmetrics#1949, "Memory leak when creating multiple instances of the same
metric"). Every torchmetrics ``Metric`` lives in a reference cycle by design, so each call
leaves one cycle that the next collection frees: one cycle per call of a reused check is not a
leak (torchmetrics documented it, #2006). Only a reused check can tell this from the
Composer bug (what differs is when the garbage was made, which a collection at the end cannot
see): memory sampled per step grows the same way until a collection runs, so the growth mode
does not apply.

[scenario]
verdict = "clean"
kind = "cycle"
owner = ""
modes = ["leak_check"]
report = "https://github.com/Lightning-AI/torchmetrics/issues/1949"
check = "step"
warmup = 1
"""

import torch
from torchmetrics.classification import BinaryAUROC

from _corpus import device, main

STEPS = 10


def setup():
    preds = torch.rand(256, device=device())
    target = torch.randint(0, 2, (256,), device=device())
    return preds, target


def step(state, index):
    preds, target = state
    metric = BinaryAUROC(validate_args=False).to(device())  # ALLOC
    metric.update(preds, target)
    return float(metric.compute())


if __name__ == "__main__":
    main(globals())
