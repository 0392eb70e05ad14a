"""Buffers registered in a class-level registry (``Class.registry``) that nothing ever
unregisters: the class attribute, reachable from the module, keeps every buffer (reported as
Lightning-AI/pytorch-lightning#18356: memory grew with each new ``Fabric`` made in one process;
here what keeps it is a class attribute, reachable from the module).

[scenario]
verdict = "leak"
kind = "class"
owner = "BufferPool.registry"
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/Lightning-AI/pytorch-lightning/issues/18356"
"""

import torch

from _corpus import device, main

STEPS = 10


class BufferPool:
    registry = {}

    def __init__(self, name, size):
        self.name = name
        self.buffer = torch.zeros(size, device=device())  # ALLOC
        BufferPool.registry[name] = self


def step(state, index):
    pool = BufferPool(f"run{index}", 2048)
    pool.buffer.add_(1)


if __name__ == "__main__":
    main(globals())
