"""A LightningModule appends each validation batch's accuracy tensor to a list attribute and
never clears it: memory grows with every validation batch for the whole run
(Lightning-AI/pytorch-lightning#14270: "You append to self.val_accuracy_results forever but
never clear it").

[scenario]
verdict = "leak"
kind = "attribute"
owner = ".val_accuracy_results["
modes = ["leak_check", "growth"]
report = "https://github.com/Lightning-AI/pytorch-lightning/issues/14270"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 12


class Module(TinyNet):
    def __init__(self):
        super().__init__()
        self.val_accuracy_results = []

    @torch.no_grad()
    def validation_step(self, inputs):
        accuracy = (self(inputs) > 0).float().mean(dim=1)  # ALLOC
        self.val_accuracy_results.append(accuracy)


def setup():
    return Module()


def step(module, index):
    module.validation_step(batch())


if __name__ == "__main__":
    main(globals())
