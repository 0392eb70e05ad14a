"""The fix of huggingface/accelerate#84: a reused ``Accelerator`` whose ``free_memory()`` drops
the optimizers it prepared before the next model is trained.

[scenario]
verdict = "clean"
kind = "global"
owner = ""
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/huggingface/accelerate/pull/89"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 10


class Accelerator:
    def __init__(self):
        self._optimizers = []

    def prepare(self, model, optimizer):
        self._optimizers.append(optimizer)
        return model, optimizer

    def free_memory(self):
        self._optimizers = []


ACCELERATOR = Accelerator()


def train_one_model():
    model = TinyNet()
    model, optimizer = ACCELERATOR.prepare(model, torch.optim.Adam(model.parameters()))
    loss = model(batch()).pow(2).mean()
    loss.backward()
    optimizer.step()  # ALLOC
    ACCELERATOR.free_memory()


def step(state, index):
    train_one_model()


if __name__ == "__main__":
    main(globals())
