"""A memory reporter library keeps a mapping keyed by tensors: every tensor it was shown stays
alive, held from the library's module, not from the script (Stonesjtu/pytorch_memlab#17: "The
tensor_name and tensor_device mapping dict maintains a reference to the key / value tensor,
which prevents python collecting unused tensors").

[scenario]
verdict = "leak"
kind = "library global"
owner = "libs.memreporter.TENSOR_NAMES"
modes = ["leak_check", "pytest", "run", "growth"]
report = "https://github.com/Stonesjtu/pytorch_memlab/issues/17"
"""

import torch

from _corpus import TinyNet, batch, main
from libs import memreporter

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
    memreporter.report({f"features_{index}": features.detach()})


if __name__ == "__main__":
    main(globals())
