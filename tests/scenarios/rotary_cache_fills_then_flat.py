"""A cache that grows for some steps and then stays flat: rotary-embedding ``cos``/``sin``
tables cached per sequence length, the way transformers' Llama did (``_set_cos_sin_cache``),
with batches of four lengths; once each length has been seen nothing more is kept. Growth that
stops is not a leak.

[scenario]
verdict = "clean"
kind = "cache that fills"
owner = ""
modes = ["run", "growth"]
report = "https://github.com/huggingface/transformers/blob/v4.35.0/src/transformers/models/llama/modeling_llama.py"
"""

import torch

from _corpus import device, main

STEPS = 16
LENGTHS = (128, 256, 384, 512)


class RotaryEmbedding:
    def __init__(self, dim=64):
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device()).float() / dim))
        self.cache = {}

    def __call__(self, length):
        if length not in self.cache:
            positions = torch.arange(length, device=device()).float()
            freqs = torch.outer(positions, self.inv_freq)  # ALLOC
            self.cache[length] = (freqs.cos(), freqs.sin())
        return self.cache[length]


def setup():
    return RotaryEmbedding()


def step(rotary, index):
    cos, sin = rotary(LENGTHS[index % len(LENGTHS)])
    (cos * sin).sum()


if __name__ == "__main__":
    main(globals())
