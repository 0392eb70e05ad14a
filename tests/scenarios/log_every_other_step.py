"""Logging every other step keeps the step's outputs and loss tensor on the device in an
epoch-level list: memory grows on half of the steps, a steady rate the flat steps in between
hide from a check that wants growth on every step (Lightning-AI/pytorch-lightning#4556,
"GPU memory leak with self.log on_epoch=True": the loss of every logged batch was kept for
epoch-end aggregation).

[scenario]
verdict = "leak"
kind = "intermittent growth"
owner = "EPOCH_LOG["
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/Lightning-AI/pytorch-lightning/issues/4556"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 16
LOG_EVERY = 2
EPOCH_LOG = []


def setup():
    model = TinyNet(4096)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(state, index):
    model, optimizer = state
    scores = model(batch(4, 4096)).softmax(dim=1)  # ALLOC
    loss = scores.pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if index % LOG_EVERY == 0:
        EPOCH_LOG.append({"train_loss": loss, "scores": scores})  # the bug: keep .detach()ed values


if __name__ == "__main__":
    main(globals())
