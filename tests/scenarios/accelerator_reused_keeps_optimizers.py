"""One ``Accelerator`` reused to train several models in one process: it keeps a reference to
every optimizer it prepared, so each finished model's optimizer state stays on the GPU
(huggingface/accelerate#84, "When reusing Accelerator to train multiple models, the GPU memory
used by old optimizer is not released"; ``free_memory()`` came from it).

[scenario]
verdict = "leak"
kind = "global"
owner = "ACCELERATOR._optimizers["
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/huggingface/accelerate/issues/84"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 10


class Accelerator:
    def __init__(self):
        self._optimizers = []

    def prepare(self, model, optimizer):
        self._optimizers.append(optimizer)  # released only by free_memory()
        return model, optimizer


ACCELERATOR = Accelerator()


def train_one_model():
    model = TinyNet()
    model, optimizer = ACCELERATOR.prepare(model, torch.optim.Adam(model.parameters()))
    loss = model(batch()).pow(2).mean()
    loss.backward()
    optimizer.step()  # ALLOC


def step(state, index):
    train_one_model()


if __name__ == "__main__":
    main(globals())
