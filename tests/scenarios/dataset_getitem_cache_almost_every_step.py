"""``@lru_cache(maxsize=None)`` on a dataset's ``__getitem__``: every new sample is kept in the
cache, so memory grows with every step that reads a sample it has not seen; here one step of
twelve re-reads a sample and grows nothing (MoonshotAI/Kimi-Audio#117, "@lru_cache(maxsize=None)
may cause memory leakage when training data grows larger").

[scenario]
verdict = "leak"
kind = "cache"
owner = "__getitem__"
modes = ["leak_check", "pytest", "growth"]
report = "https://github.com/MoonshotAI/Kimi-Audio/issues/117"
"""

import functools

import torch

from _corpus import device, main

STEPS = 12


class AudioDataset:
    @functools.lru_cache(maxsize=None)
    def __getitem__(self, index):
        return torch.randn(2048, device=device())  # ALLOC


DATASET = AudioDataset()


def step(state, index):
    sample_index = 3 if index == 7 else index  # step 7 reads sample 3 again: a cache hit
    DATASET[sample_index].mean()


if __name__ == "__main__":
    main(globals())
