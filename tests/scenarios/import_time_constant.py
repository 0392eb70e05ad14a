"""A library imported in the middle of the run makes a tensor constant at import and keeps it
in its globals for the life of the process: torchmetrics' ``chrf`` module does
``_EPS_SMOOTHING = tensor(1e-16)``. Not a leak of the program (issue 23's second row; the
constant is in Lightning-AI/torchmetrics' ``functional/text/chrf.py``).

[scenario]
verdict = "clean"
kind = "import-time constant"
owner = ""
modes = ["run", "growth"]
report = "https://github.com/Lightning-AI/torchmetrics/blob/v1.9.0/src/torchmetrics/functional/text/chrf.py"
"""

import torch

from _corpus import TinyNet, batch, main

STEPS = 10


def setup():
    model = TinyNet()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(state, index):
    model, optimizer = state
    loss = model(batch()).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if index == 0:
        from torchmetrics.functional.text.chrf import chrf_score  # noqa: F401  # ALLOC


if __name__ == "__main__":
    main(globals())
