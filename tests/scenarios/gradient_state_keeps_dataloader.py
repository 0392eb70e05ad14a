"""Accelerate's ``GradientState`` is a singleton whose instances share one class-level dict as
their ``__dict__``; it kept a reference to every prepared dataloader, so a trainer deleted after
training still had its dataloader (and the batches it holds) kept alive from that shared state
(huggingface/accelerate#3391, reported through huggingface/sentence-transformers#3204: GPU
memory grew with every training run in one process).

[scenario]
verdict = "leak"
kind = "class"
owner = "GradientState._shared_state"
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/huggingface/accelerate/pull/3391"
"""

import torch

from _corpus import device, main

STEPS = 10


class GradientState:
    """A Borg: every instance shares ``_shared_state`` (as accelerate's state classes do)."""

    _shared_state = {}

    def __init__(self):
        self.__dict__ = self._shared_state
        self.__dict__.setdefault("dataloader_references", [None])


class DataLoaderShard:
    def __init__(self, samples):
        self.samples = samples
        self.gradient_state = GradientState()

    def __iter__(self):
        self.gradient_state.dataloader_references.append(self)  # the bug: a strong reference
        yield from self.samples


class Trainer:
    def __init__(self):
        samples = torch.randn(8, 512, device=device())  # ALLOC
        self.dataloader = DataLoaderShard(samples)

    def train(self):
        return sum(float(row.sum()) for row in self.dataloader)


def step(state, index):
    Trainer().train()  # one training run; the trainer is dropped afterwards


if __name__ == "__main__":
    main(globals())
