"""The fix of BatsResearch/labelmodels#4: ``running_loss += loss.item()``.

[scenario]
verdict = "clean"
kind = "graph"
owner = ""
modes = ["leak_check", "growth"]
report = "https://github.com/BatsResearch/labelmodels/issues/4"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 12


def setup():
    model = TinyNet()
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "running_loss": 0.0}


def step(state, index):
    activations = state["model"](batch()) * 2.0  # ALLOC
    loss = activations.pow(2).mean()
    loss.backward()
    state["optimizer"].step()
    state["optimizer"].zero_grad()
    state["running_loss"] += loss.item()


if __name__ == "__main__":
    main(globals())
