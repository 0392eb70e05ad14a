"""``functools.lru_cache`` on a method: the cache is keyed by ``self``, so every instance that
ever called it, and every tensor it holds, stays alive for the life of the process
(pytorch/pytorch#147233, "Putting lru_cache on methods will keep pointers to the self objects
alive forever and leak memory"; pymc-devs/pytensor#1660).

[scenario]
verdict = "leak"
kind = "cache"
owner = "Kernel.signature"
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/pytorch/pytorch/pull/147233"
"""

import functools

import torch

from _corpus import device, main

STEPS = 10


class Kernel:
    def __init__(self, size):
        self.workspace = torch.empty(size, device=device())  # ALLOC

    @functools.lru_cache(maxsize=None)
    def signature(self):
        return f"kernel[{self.workspace.numel()}]"


def step(state, index):
    Kernel(1024 + index).signature()


if __name__ == "__main__":
    main(globals())
