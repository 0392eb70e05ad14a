"""The fix of Stonesjtu/pytorch_memlab#17 (#18): the reporter's mapping holds its tensors weakly.

[scenario]
verdict = "clean"
kind = "library global"
owner = ""
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/Stonesjtu/pytorch_memlab/pull/18"
"""

import torch

from _corpus import TinyNet, batch, main
from libs import weak_memreporter

STEPS = 10


def setup():
    model = TinyNet()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(state, index):
    model, optimizer = state
    hidden = model(batch())  # ALLOC
    loss = hidden.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    weak_memreporter.report({f"hidden_{index}": hidden.detach()})


if __name__ == "__main__":
    main(globals())
