"""Roots of the owner search beyond module globals and locals, and what a report says when
the walk stops without one.

A tensor kept through a class attribute, a class-level dict that instances share as their
``__dict__``, a ``functools.lru_cache``, a closure cell, a default argument or a module
that lives only in ``sys.modules`` is reported from that root; when no root is found, the
report says what the topmost holder is and why the walk stopped there.
"""

from __future__ import annotations

import functools
import gc
import sys
import types

import pytest
import torch

import torchmem
from leak_helpers import block_triple, torchmem_cpu  # noqa: F401
from torchmem.leaks import owners as _owners

MODULE = __name__


class State:
    def __init__(self):
        self.items = []


class Buffer:
    def __init__(self, tensor=None, owner=None):
        self.buf = tensor
        self.owner = owner


class Trainer:
    def __init__(self):
        self.state = State()


class Registry:
    current = None  # class attribute: the trainer in use


class SharedSettings:
    """The Borg pattern: every instance's ``__dict__`` is one class-level dict."""

    _shared: dict = {}

    def __init__(self):
        self.__dict__ = SharedSettings._shared


# Many live instances share the dict (and refer to it): the class's dict is one referrer among them.
SETTINGS_USERS = [SharedSettings() for _ in range(100)]


@pytest.fixture(autouse=True)
def clean_roots():
    yield
    Registry.current = None
    SharedSettings._shared.clear()
    cached_features.cache_clear()
    memoized.cache_clear()
    sys.modules.pop("plugin_state_registry", None)


def held_by(report) -> list[str]:
    """The "held by" lines of the report, as the user reads them."""
    lines = report.render().splitlines()
    start = next(index for index, line in enumerate(lines) if "held by" in line)
    out = [lines[start].split("held by", 1)[1].strip()]
    for line in lines[start + 1:]:
        if not line.startswith("      " + " " * 14) or not line.strip():
            break
        out.append(line.strip())
    return out


def test_a_class_attribute_holding_an_object_that_many_others_refer_to_is_the_root():
    # The trainer is referred to by each of its 104 buffers (parent pointers): more referrers
    # than the walk follows per object. The class's dict is the one that leads to a name.
    with torchmem.leak_check(raise_on_leak=False) as report:
        trainer = Trainer()
        for _ in range(4):
            trainer.state.items.append(Buffer(torch.zeros(256), owner=trainer))
        trainer.children = [Buffer(owner=trainer) for _ in range(100)]
        Registry.current = trainer
        del trainer

    assert held_by(report) == [f"{MODULE}.Registry.current.state.items[0..3].buf"]
    assert "no named root" not in report.render()
    assert "holder search stopped" not in report.render()  # the buffers not followed hide no name


def test_a_class_level_dict_that_instances_share_as_their_dict_is_the_root():
    with torchmem.leak_check(raise_on_leak=False) as report:
        settings = SharedSettings()
        settings.state = State()
        settings.state.items.append(Buffer(torch.zeros(256)))
        del settings

    assert f"{MODULE}.SharedSettings._shared['state'].items[0].buf" in held_by(report)
    assert "no named root" not in report.render()


@functools.lru_cache(maxsize=8)
def cached_features(size: int):
    trainer = Trainer()
    trainer.state.items.append(Buffer(torch.zeros(size)))
    return trainer


@functools.cache
def memoized(size: int, *, scale: float = 1.0):
    return torch.full((size,), scale)


def test_a_result_kept_by_lru_cache_is_named_as_the_cached_call():
    with torchmem.leak_check(raise_on_leak=False) as report:
        cached_features(300)

    assert held_by(report) == [f"{MODULE}.cached_features(300).state.items[0].buf"]


def test_a_result_kept_by_functools_cache_is_named_with_its_arguments():
    with torchmem.leak_check(raise_on_leak=False) as report:
        memoized(301, scale=2.0)

    assert held_by(report) == [f"{MODULE}.memoized(301, scale=2.0)"]


def make_logger():
    history = []

    def log(value):
        history.append(value)

    return log


LOG = make_logger()


def test_a_closure_cell_is_named_with_its_free_variable():
    with torchmem.leak_check(raise_on_leak=False) as report:
        LOG(torch.zeros(302))

    assert held_by(report) == [f"{MODULE}.LOG.__closure__[0].cell_contents[0]"]


def keep_in_default(value, seen=[]):  # noqa: B006 - the bug under test
    seen.append(value)


def test_a_mutable_default_argument_is_named():
    with torchmem.leak_check(raise_on_leak=False) as report:
        keep_in_default(torch.zeros(303))

    assert held_by(report) == [f"{MODULE}.keep_in_default.__defaults__[0][0]"]
    keep_in_default.__defaults__[0].clear()


def test_a_module_only_sys_modules_holds_is_named_by_its_entry():
    with torchmem.leak_check(raise_on_leak=False) as report:
        module = types.ModuleType("plugin_state_registry")
        module.trainer = Trainer()
        module.trainer.state.items.append(Buffer(torch.zeros(304)))
        sys.modules["plugin_state_registry"] = module
        del module

    assert held_by(report) == ["plugin_state_registry.trainer.state.items[0].buf"]


class LazyModule:
    """What some libraries put in sys.modules in place of their module."""


def test_an_object_standing_in_for_a_module_in_sys_modules_is_named_by_its_entry():
    with torchmem.leak_check(raise_on_leak=False) as report:
        stand_in = LazyModule()
        stand_in.cache = [torch.zeros(309)]
        sys.modules["plugin_state_registry"] = stand_in
        del stand_in

    assert held_by(report) == ["sys.modules['plugin_state_registry'].cache[0]"]


# --- when the walk stops without a named root ------------------------------------------------


class Node:
    def __init__(self, next_node=None):
        self.next = next_node


def chain(length: int) -> Node:
    head = Node()
    node = head
    for _ in range(length - 1):
        node.next = Node()
        node = node.next
    return head


CHAIN = chain(30)  # a linked structure made before the check: every hop up it is a pass over the heap


def chain_tail() -> Node:
    node = CHAIN
    while isinstance(node.next, Node):
        node = node.next
    return node


def test_a_path_longer_than_the_depth_budget_says_where_the_walk_stopped_and_why():
    with torchmem.leak_check(raise_on_leak=False) as report:
        chain_tail().next = torch.zeros(305)

    text = report.render()
    (finding,) = report.findings
    chain_tail().next = None
    assert finding.owners[0].kind == "unnamed"
    assert "(no named root found above it)" in text
    assert (
        "note          no named root above the topmost holder reached, a Node: the walk stopped at its depth "
        "budget (12 references above the tensor)" in text
    )


def test_a_walk_that_followed_every_referrer_says_nothing_named_reaches_the_top():
    # A reference cycle that holds the tensor, kept alive by nothing the walk can name: the
    # collector is not run (gc_collect=False), so the cycle is still there when the walk runs.
    node = Node()
    node.next = Node(node)
    node.next.value = torch.zeros(306)
    block = block_triple(node.next.value)
    del node

    result = _owners.find_owners([block])

    (owner,) = result.owners[block[:2]]
    assert owner.kind == "unnamed" and owner.path.startswith("<Node>.")
    assert result.notes[block[:2]] == (
        "no named root above the topmost holder reached, a Node: every object that refers to it was followed, "
        "and only objects on the path (a reference cycle) or torchmem's own do: garbage not yet collected, "
        "or a cycle that something outside Python's view keeps"
    )
    gc.collect()


def make_registry_class():
    class LocalRegistry:
        items: list = []

    return LocalRegistry


REGISTRY_CLASS = make_registry_class()  # a class made in a function, bound to a module global


def test_a_class_made_inside_a_function_is_named_by_the_module_global_bound_to_it():
    with torchmem.leak_check(raise_on_leak=False) as report:
        REGISTRY_CLASS.items.append(Buffer(torch.zeros(307)))

    assert held_by(report) == [f"{MODULE}.REGISTRY_CLASS.items[0].buf"]
    REGISTRY_CLASS.items.clear()


def test_a_walk_that_dropped_referrers_of_a_crowded_object_says_so():
    # A trainer its 100 children point back to, in a cycle nothing named holds (the collector
    # has not run): the walk follows 16 referrers of one type per object and names none.
    trainer = Trainer()
    trainer.state.items.append(Buffer(torch.zeros(308)))
    trainer.children = [Buffer(owner=trainer) for _ in range(100)]
    block = block_triple(trainer.state.items[0].buf)
    del trainer

    result = _owners.find_owners([block])

    (owner,) = result.owners[block[:2]]
    assert owner.kind == "unnamed" and result.stopped_early
    assert result.notes[block[:2]] == (
        "no named root above the topmost holder reached, a list: a Trainer on the path is referred to by "
        "100 objects or more, and the 16 the walk followed lead to no name"
    )
    gc.collect()
