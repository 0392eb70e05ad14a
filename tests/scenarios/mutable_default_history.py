"""A mutable default argument used as a history: the same list object is shared by every call,
so every tensor appended to it stays alive (getnikola/nikola#1532: "Usually this problem
generates a memory leak, because you can have a never-ending array"; talmolab/dreem#40 had
tensors and dicts as defaults all over a PyTorch code base).

[scenario]
verdict = "leak"
kind = "default argument"
owner = "__defaults__"
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/getnikola/nikola/pull/1532"
"""

import torch

from _corpus import batch, main

STEPS = 10


def smooth(value, history=[]):  # noqa: B006 - the bug this scenario is about
    history.append(value)
    return torch.stack(history[-4:]).mean(dim=0)


@torch.no_grad()
def step(state, index):
    features = batch().mean(dim=0)  # ALLOC
    smooth(features)


if __name__ == "__main__":
    main(globals())
