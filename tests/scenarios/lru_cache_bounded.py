"""A bounded ``lru_cache`` (``maxsize=4``) on a function returning tensors, called with a new
argument every step: it keeps the four most recent results and evicts the rest, so memory
stops growing after four steps (pytorch/pytorch#112301's cache, bounded as ``lru_cache``'s
default bound intends).

[scenario]
verdict = "clean"
kind = "bounded cache"
owner = ""
modes = ["run", "growth"]
report = "https://github.com/pytorch/pytorch/pull/112301"
"""

import functools

import torch

from _corpus import device, main

STEPS = 12


@functools.lru_cache(maxsize=4)
def scatter_indices(rows):
    return torch.full((4096,), rows, device=device())  # ALLOC


def step(state, index):
    scatter_indices(100 + index).sum()


if __name__ == "__main__":
    main(globals())
