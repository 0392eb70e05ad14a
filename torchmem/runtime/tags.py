"""``torchmem.tag``: charge the memory a region allocates to a name."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from torchmem import _C

F = TypeVar("F", bound=Callable)

# The name statistics and reports give memory allocated outside every tag. It is not a
# tag one can open (it would be two things), but leak_check(allow_tags=...) accepts it.
UNTAGGED = "untagged"


class tag:  # noqa: N801 - used like a function, as torch.no_grad is
    """Charges every allocation made inside to ``name``: a context manager or a decorator.

    Tags nest (the innermost wins), belong to the thread that opens them, and follow
    PyTorch's work into autograd's backward threads. A block freed later, elsewhere,
    still credits the tag it was allocated under. See ``torchmem.tag_stats()``.

        with torchmem.tag("metrics"):
            metric.update(preds, target)

        @torchmem.tag("eval")
        def evaluate(model, loader): ...
    """

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise TypeError(f"torchmem.tag: the name must be a str, got {type(name).__name__} ({name!r})")
        if not name:
            raise ValueError("torchmem.tag: the name must not be empty")
        if name == UNTAGGED:
            raise ValueError(
                f"torchmem.tag: {UNTAGGED!r} is the name torchmem gives memory allocated outside every tag; "
                "choose another name"
            )
        self.name = name
        self._depth = 0

    def __enter__(self) -> "tag":
        _C.push_tag(self.name)
        self._depth += 1
        return self

    def __exit__(self, *exc_info) -> None:
        if self._depth == 0:
            raise RuntimeError(f"torchmem.tag({self.name!r}) exited more often than it was entered")
        _C.pop_tag(self.name)
        self._depth -= 1

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with tag(self.name):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"torchmem.tag({self.name!r})"


def current_tag() -> str | None:
    """The innermost tag open on this thread, or None."""
    return _C.current_tag()
