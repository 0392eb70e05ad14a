"""Gradient accumulation that keeps each micro-batch's loss until the optimizer step every four
micro-batches, then drops them: memory rises and falls with a period of four steps and does not
grow (the pattern of huggingface/accelerate's gradient accumulation guide).

[scenario]
verdict = "clean"
kind = "rises and falls"
owner = ""
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/huggingface/accelerate/blob/main/docs/source/usage_guides/gradient_accumulation.md"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 16
ACCUMULATE = 4
PENDING = []


def setup():
    model = TinyNet(4096)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(state, index):
    model, optimizer = state
    PENDING.append(model(batch(4, 4096)).pow(2).mean())  # ALLOC
    if len(PENDING) == ACCUMULATE:
        torch.stack(PENDING).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        PENDING.clear()


if __name__ == "__main__":
    main(globals())
