"""``running_loss += loss`` without ``.item()``: the running sum is a tensor whose graph links
every step's loss, so each step's saved activations stay alive until the sum is dropped
(BatsResearch/labelmodels#4: "You're holding on to the graph for each batch per epoch, since
running_loss is the sum of non-detached tensors"; huggingface/transformers#6999, the Trainer's
``tr_loss``).

[scenario]
verdict = "leak"
kind = "graph"
owner = "['running_loss']"
modes = ["leak_check", "run", "growth"]
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
    loss.backward(retain_graph=True)
    state["optimizer"].step()
    state["optimizer"].zero_grad()
    state["running_loss"] += loss  # the bug: += loss.item()


if __name__ == "__main__":
    main(globals())
