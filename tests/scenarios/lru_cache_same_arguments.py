"""A cache used as designed: an ``lru_cache`` on a function called with the same arguments
every step fills once, on the first step, and serves every later step (the bounded counterpart
of pytorch/pytorch#112301: a cached value is meant to live as long as the cache).

[scenario]
verdict = "clean"
kind = "cache"
owner = ""
modes = ["leak_check", "growth"]
report = "https://github.com/pytorch/pytorch/pull/112301"
check = "step"
warmup = 1
"""

import functools

import torch

from _corpus import device, main

STEPS = 10


@functools.lru_cache(maxsize=8)
def causal_mask(length):
    return torch.ones(length, length, device=device()).tril()  # ALLOC


def step(state, index):
    causal_mask(64).sum()


if __name__ == "__main__":
    main(globals())
