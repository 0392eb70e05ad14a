"""A Lightning-style loop that collects every ``training_step`` output for the epoch-end hook,
loss tensor (and its graph) included, so memory climbs through the epoch and drops only when
the epoch ends (Lightning-AI/pytorch-lightning#1510, "Memory (CPU and GPU) leaks during the 1st
epoch", fixed by #1528 keeping detached values; the same with ``self.log(on_epoch=True)`` in
#4556).

[scenario]
verdict = "leak"
kind = "attribute"
owner = ".epoch_outputs["
modes = ["leak_check", "run", "growth"]
report = "https://github.com/Lightning-AI/pytorch-lightning/issues/1510"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 12


class Module(TinyNet):
    def training_step(self, inputs):
        loss = self(inputs).pow(2).mean()  # ALLOC
        return {"loss": loss, "log": {"train_loss": loss}}


class Trainer:
    def __init__(self, module):
        self.module = module
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        self.epoch_outputs = []

    def run_batch(self):
        output = self.module.training_step(batch())
        output["loss"].backward(retain_graph=True)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.epoch_outputs.append(output)  # the bug: keep output["loss"].detach()


def setup():
    return Trainer(Module())


def step(trainer, index):
    trainer.run_batch()


if __name__ == "__main__":
    main(globals())
