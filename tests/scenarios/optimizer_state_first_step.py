"""Adam creates its state (``exp_avg``, ``exp_avg_sq``) on the first ``step()``: memory rises
once and then stays flat, which is what an optimizer is supposed to do (the warm-up growth
issue 23 asks checks to stay quiet about; users report it as a leak, e.g.
huggingface/transformers#6354, "GPU memory consumption increases while training").

[scenario]
verdict = "clean"
kind = "optimizer state"
owner = ""
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/huggingface/transformers/issues/6354"
check = "step"
warmup = 1
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 10


def setup():
    model = TinyNet(4096)
    return model, torch.optim.Adam(model.parameters())


def step(state, index):
    model, optimizer = state
    loss = model(batch(4, 4096)).pow(2).mean()
    loss.backward()
    optimizer.step()  # ALLOC
    optimizer.zero_grad()


if __name__ == "__main__":
    main(globals())
