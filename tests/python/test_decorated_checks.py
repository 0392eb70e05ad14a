"""``@torchmem.leak_check()`` on functions: what they return is allowed at any nesting depth,
and coroutines and generators are checked while they run, not when they are created."""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import pytest
import torch

import torchmem
from leak_helpers import torchmem_cpu  # noqa: F401

KEPT: list = []


@pytest.fixture(autouse=True)
def clear_kept():
    yield
    KEPT.clear()


State = collections.namedtuple("State", "h c")


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    extras: dict


class Holder:
    def __init__(self):
        self.buffer = torch.zeros(64)


def test_tensors_returned_at_any_depth_are_allowed():
    check = torchmem.leak_check()  # raises on a leak

    @check
    def lstm_step(x):
        y = x * 2
        h, c = torch.zeros(16), torch.ones(16)
        return y, (h, c)

    y, (h, c) = lstm_step(torch.ones(8))

    assert not check.report.leaked
    assert [finding.note for finding in check.report.allowed] == ["returned by the checked function"] * 3


@pytest.mark.parametrize(
    "build",
    [
        lambda: {"out": [torch.zeros(8), {"deep": (torch.ones(8),)}]},
        lambda: State(torch.zeros(8), [torch.ones(8)]),
        lambda: Output(torch.zeros(8), {"hidden": [torch.ones(8)]}),
        lambda: [Holder()],  # an object holding a tensor: held through the result
    ],
    ids=["dict-list-dict-tuple", "namedtuple", "dataclass", "object"],
)
def test_every_kind_of_returned_container_is_allowed(build):
    check = torchmem.leak_check()

    result = check(build)()

    assert not check.report.leaked, check.report.render()
    assert check.report.allowed
    del result


def test_what_the_function_keeps_elsewhere_is_still_a_leak():
    check = torchmem.leak_check(raise_on_leak=False)

    @check
    def step():
        KEPT.append(torch.zeros(32))
        return (torch.ones(8), [torch.ones(8)])

    result = step()

    assert len(check.report.leaked) == 1
    assert check.report.leaked[0].owners[0].path.endswith("KEPT[0]")
    del result


def test_an_async_function_is_checked_while_it_runs():
    check = torchmem.leak_check(raise_on_leak=False)

    @check
    async def evaluate():
        await asyncio.sleep(0)
        KEPT.append(torch.zeros(256))  # made after the first await
        return torch.ones(8)

    coroutine = evaluate()
    assert check.entries == 0  # creating the coroutine checks nothing
    result = asyncio.run(coroutine)

    assert check.entries == 1 and check.report.finished
    assert len(check.report.leaked) == 1 and check.report.leaked[0].owners[0].path.endswith("KEPT[0]")
    assert [finding.note for finding in check.report.allowed] == ["returned by the checked function"]
    del result


def test_an_async_function_that_leaks_raises_when_awaited():
    @torchmem.leak_check()
    async def evaluate():
        await asyncio.sleep(0)
        KEPT.append(torch.zeros(256))

    with pytest.raises(torchmem.LeakError, match="KEPT"):
        asyncio.run(evaluate())


def test_a_generator_is_checked_from_its_first_item_to_its_exhaustion():
    check = torchmem.leak_check(raise_on_leak=False)

    @check
    def batches():
        for _ in range(3):
            KEPT.append(torch.zeros(256))  # kept across the whole iteration
            yield torch.ones(8)

    iterator = batches()
    assert check.entries == 0
    items = list(iterator)

    assert check.entries == 1 and check.report.finished
    assert len(check.report.leaked) == 3
    assert len([f for f in check.report.allowed if f.note == "yielded by the checked generator"]) == 3
    del items


def test_a_generator_closed_early_is_checked_up_to_there():
    check = torchmem.leak_check(raise_on_leak=False)

    @check
    def batches():
        for _ in range(10):
            KEPT.append(torch.zeros(256))
            yield 1

    iterator = batches()
    next(iterator)
    next(iterator)
    iterator.close()

    assert check.report.finished and len(check.report.leaked) == 2


def test_an_async_generator_is_refused_with_what_to_do():
    async def stream():
        yield 1

    with pytest.raises(TypeError, match="async generator"):
        torchmem.leak_check()(stream)
