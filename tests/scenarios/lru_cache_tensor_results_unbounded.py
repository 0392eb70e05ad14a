"""An unbounded ``lru_cache`` on a function returning tensors, called with a new argument every
step: every result stays in the cache (pytorch/pytorch#112301, "Memory leak from
bsr_scatter_mm_indices_data argument cache"; MoonshotAI/Kimi-Audio#117).

[scenario]
verdict = "leak"
kind = "cache"
owner = "scatter_indices"
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/pytorch/pytorch/pull/112301"
"""

import functools

import torch

from _corpus import device, main

STEPS = 12


@functools.lru_cache(maxsize=None)
def scatter_indices(rows):
    return torch.arange(rows * 64, device=device())  # ALLOC


def step(state, index):
    scatter_indices(100 + index).sum()


if __name__ == "__main__":
    main(globals())
