"""Training losses appended to a module-level history list, graphs and all: every step keeps
its loss and the autograd graph behind it (rballester/tntorch#19: "Every added loss used to be
a full computational graph"; the same in TRI-ML/packnet-sfm#47 and microsoft/SpareNet#12).

[scenario]
verdict = "leak"
kind = "global"
owner = "LOSS_HISTORY["
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
    loss.backward(retain_graph=True)
    optimizer.step()
    optimizer.zero_grad()
    LOSS_HISTORY.append(loss)  # the bug: loss.item() (or loss.detach()) keeps only the number


if __name__ == "__main__":
    main(globals())
