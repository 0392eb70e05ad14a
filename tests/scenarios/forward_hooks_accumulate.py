"""A forward hook registered on every step and never removed: each closure captures the tensor
it was registered with, and the module keeps every hook (chr5tphr/zennit#13, "Be more careful
with tensor references in Hook": stored tensors were kept through the hooks).

[scenario]
verdict = "leak"
kind = "closure"
owner = "_forward_hooks"
modes = ["leak_check", "growth"]
report = "https://github.com/chr5tphr/zennit/pull/13"
"""

import torch

from _corpus import TinyNet, batch, device, main

STEPS = 10


def attach_relevance_hook(module, reference):
    def hook(mod, inputs, output):
        return output * reference.mean()

    return module.register_forward_hook(hook)  # the bug: the handle is never removed


def setup():
    return TinyNet()


@torch.no_grad()
def step(model, index):
    reference = torch.randn(1024, device=device())  # ALLOC
    attach_relevance_hook(model, reference)
    model(batch())


if __name__ == "__main__":
    main(globals())
