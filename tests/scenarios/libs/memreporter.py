"""A memory reporter in the shape of pytorch_memlab's before Stonesjtu/pytorch_memlab#18: it
names tensors in a module-level mapping keyed by the tensor, which keeps every tensor it ever
reported alive."""

TENSOR_NAMES = {}


def report(named_tensors):
    for name, tensor in named_tensors.items():
        TENSOR_NAMES[tensor] = name  # the bug: a weak mapping would not keep the tensor
    return len(TENSOR_NAMES)
