"""The fix of Stonesjtu/pytorch_memlab#17 (#18): the reporter's mapping holds its tensors weakly.

[scenario]
verdict = "clean"
kind = "library global"
owner = ""
modes = ["leak_check", "pytest", "growth"]
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
    hidden = model(batch())
    features = hidden.relu()  # ALLOC
    loss = features.pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    weak_memreporter.report({f"features_{index}": features.detach()})


if __name__ == "__main__":
    main(globals())
