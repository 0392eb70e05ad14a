"""The fix of rballester/tntorch#19: the loss history keeps ``loss.item()``, a Python number,
so the graph is freed every step.

[scenario]
verdict = "clean"
kind = "global"
owner = ""
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/rballester/tntorch/pull/19"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 12
LOSS_HISTORY = []


def setup():
    model = TinyNet()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(state, index):
    model, optimizer = state
    loss = model(batch()).pow(2).mean()  # ALLOC
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    LOSS_HISTORY.append(loss.item())


if __name__ == "__main__":
    main(globals())
