"""torchmem.leaks.owners: from a block to the named objects that hold it."""

from __future__ import annotations

import collections
import gc

import pytest
import torch

from leak_helpers import block_triple, collector_paused, torchmem_cpu  # noqa: F401
from torchmem.leaks import owners as _owners
from torchmem.leaks.paths import render_path

GLOBAL_CACHE: dict = {}
Pair = collections.namedtuple("Pair", "left right")


class Holder:
    """A plain object with attributes."""


class WithSlots:
    __slots__ = ("value",)


class Registry:
    """A class attribute holds a tensor."""

    table: dict = {}


def owners_of(tensor: torch.Tensor, **options) -> list[str]:
    """The owner paths of the block under ``tensor`` (the tensor's own local name in this
    helper is not a holder: ``tensor`` is deleted from the frame before the search)."""
    block = block_triple(tensor)
    del tensor
    result = _owners.find_owners([block], **options)
    return [owner.path for owner in result.owners[(block[0], block[1])]]


def owner_objects_of(tensor: torch.Tensor) -> list[_owners.Owner]:
    block = block_triple(tensor)
    del tensor
    return _owners.find_owners([block]).owners[(block[0], block[1])]


def teardown_function():
    GLOBAL_CACHE.clear()
    Registry.table.clear()


def test_a_module_global_is_named_module_dot_name():
    GLOBAL_CACHE["step"] = torch.zeros(10)
    paths = owners_of(GLOBAL_CACHE["step"])
    assert paths == [f"{__name__}.GLOBAL_CACHE['step']"]


def test_a_class_attribute_is_named_module_class_attribute():
    Registry.table[3] = torch.zeros(10)
    paths = owners_of(Registry.table[3])
    assert paths == [f"{__name__}.Registry.table[3]"]


def test_a_frame_local_is_named_function_and_local_with_its_location():
    losses = [torch.zeros(10)]

    (owner,) = owner_objects_of(losses[0])

    assert owner.path == "test_a_frame_local_is_named_function_and_local_with_its_location():losses[0]"
    assert owner.kind == "local"
    assert owner.location.startswith("tests/python/test_owners.py:")


def test_attribute_item_and_index_chains_render_as_python():
    trainer = Holder()
    trainer.state = Holder()
    trainer.state.eval_metrics = {"acc": Holder()}
    trainer.state.eval_metrics["acc"].tp = torch.zeros(10)
    trainer.history = [Pair(left=None, right=(torch.zeros(4),))]
    trainer.slot = WithSlots()
    trainer.slot.value = torch.zeros(3)
    function = "test_attribute_item_and_index_chains_render_as_python()"

    metric_paths = owners_of(trainer.state.eval_metrics["acc"].tp)
    history_paths = owners_of(trainer.history[0].right[0])
    slot_paths = owners_of(trainer.slot.value)

    assert metric_paths == [f"{function}:trainer.state.eval_metrics['acc'].tp"]
    assert history_paths == [f"{function}:trainer.history[0].right[0]"]
    assert slot_paths == [f"{function}:trainer.slot.value"]


def test_module_parameters_buffers_and_children_read_like_attribute_access():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    function = "test_module_parameters_buffers_and_children_read_like_attribute_access()"

    weight_paths = owners_of(model[0].weight)
    buffer_paths = owners_of(model[1].running_mean)

    assert weight_paths == [f"{function}:model[0].weight"]
    assert buffer_paths == [f"{function}:model[1].running_mean"]


def test_a_gradient_is_named_through_its_leaf_tensor():
    weight = torch.ones(3, requires_grad=True)
    (weight * 2).sum().backward()

    paths = owners_of(weight.grad)

    assert paths == ["test_a_gradient_is_named_through_its_leaf_tensor():weight.grad"]


def test_memory_saved_by_an_autograd_graph_is_named_through_the_tensor_owning_the_graph():
    weight = torch.ones(4, requires_grad=True)
    losses = []
    activation = weight.exp()
    losses.append((activation * 3).sum())
    block = block_triple(activation)
    del activation

    paths = [owner.path for owner in _owners.find_owners([block]).owners[(block[0], block[1])]]

    function = "test_memory_saved_by_an_autograd_graph_is_named_through_the_tensor_owning_the_graph()"
    # multiplying by a Python number saves nothing; exp saves its result for backward
    assert paths == [f"{function}:losses[0] (in its autograd graph: ExpBackward0._saved_result)"]


def test_an_autograd_node_held_by_python_names_what_it_saved():
    weight = torch.ones(4, requires_grad=True)
    result = weight.exp()
    node = result.grad_fn
    block = block_triple(result)
    del result

    paths = [owner.path for owner in _owners.find_owners([block]).owners[(block[0], block[1])]]

    function = "test_an_autograd_node_held_by_python_names_what_it_saved()"
    assert paths == [f"{function}:node (in its autograd graph: ExpBackward0._saved_result)"]
    assert node.name() == "ExpBackward0"


def test_a_view_keeps_the_whole_block_and_is_named():
    base = torch.zeros(100)
    window = base[10:20]
    block = block_triple(base)
    del base

    (owner,) = _owners.find_owners([block]).owners[(block[0], block[1])]

    assert owner.path == "test_a_view_keeps_the_whole_block_and_is_named():window"
    assert window.numel() == 10


def test_a_closure_is_named_through_its_cell():
    def make_counter():
        cached = torch.zeros(5)

        def counter():
            return cached.sum()

        return counter

    counter = make_counter()

    paths = owners_of(counter.__closure__[0].cell_contents)

    assert paths == ["test_a_closure_is_named_through_its_cell():counter.__closure__[0].cell_contents"]


def test_hundreds_of_blocks_are_named_in_one_search():
    tensors = [torch.zeros(16) for _ in range(300)]
    blocks = [block_triple(tensor) for tensor in tensors]

    result = _owners.find_owners(blocks)

    function = "test_hundreds_of_blocks_are_named_in_one_search()"
    for position, block in enumerate(blocks):
        assert [owner.path for owner in result.owners[(block[0], block[1])]] == [f"{function}:tensors[{position}]"]
    assert not result.stopped_early


@pytest.mark.parametrize("separate_dict", [False, True], ids=["attributes", "materialized-dict"])
def test_a_depth_budget_stops_the_search_and_names_the_outermost_object_reached(separate_dict):
    deep = Holder()
    deep.inner = Holder()
    deep.inner.inner = Holder()
    deep.inner.inner.value = torch.zeros(4)
    if separate_dict:
        # Python 3.10 always keeps an instance's attributes in a dict of their own, 3.11+
        # only once __dict__ was asked for: the hop from it to the instance is not a level.
        vars(deep.inner.inner)
    block = block_triple(deep.inner.inner.value)

    result = _owners.find_owners([block], max_depth=1, node_budget=0)  # no downward search: the walk up is limited

    (owner,) = result.owners[(block[0], block[1])]
    assert result.stopped_early
    assert (owner.kind, owner.path) == ("unnamed", "<Holder>.value")


def test_a_block_no_python_object_refers_to_has_no_owners():
    block = block_triple(torch.zeros(4))  # the tensor is freed at once: nothing holds the block

    result = _owners.find_owners([block])

    assert result.owners[(block[0], block[1])] == []


def test_the_cycle_holding_garbage_is_described_by_its_types_and_as_an_expression():
    class Metric:
        pass

    with collector_paused():
        metric = Metric()
        metric.state = {"tp": torch.zeros(8)}
        metric.callbacks = [metric.state]
        metric.owner = metric
        block = block_triple(metric.state["tp"])
        del metric
        flags = gc.get_debug()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
        finally:
            gc.set_debug(flags)
        garbage = list(gc.garbage)
        gc.garbage.clear()
        holders = _owners.find_cycle_holders([block], garbage)
        del garbage
        gc.collect()

    holder = holders[(block[0], block[1])]
    assert holder.owner.path == "<Metric>.state['tp']"
    assert holder.owner.kind == "cycle"
    assert holder.cycle == "Metric.owner is the same Metric"
    assert "Metric" in holder.cycle_types


def test_render_path_collapses_instance_dicts_and_module_containers():
    labels = [("dictof",), ("item", "state"), ("attr", "_modules"), ("item", "encoder"),
              ("attr", "_parameters"), ("item", "weight")]
    assert render_path("model", labels) == "model.state.encoder.weight"
    assert render_path("seq", [("attr", "_modules"), ("item", "0")]) == "seq[0]"
    assert render_path("cache", [("item", ("a", 1)), ("index", 2), ("via", "Tensor")]) == "cache[('a', 1)][2] -> <Tensor>"
    assert render_path("node", [("graph", "MulBackward0._saved_self")]) == (
        "node (in its autograd graph: MulBackward0._saved_self)"
    )


KEPT_BY_TEST: list = []


def test_a_leak_check_with_findings_leaves_no_cycle_holding_the_checked_codes_locals():
    # The owner search lists every live frame; that list must not end up in a reference
    # cycle, or the locals of the code around the check (here, 4 MiB) would stay
    # allocated after it returns, until the next garbage collection.
    import torchmem

    def checked_function():
        big = torch.ones(1 << 20)  # allocated before the check: not a finding
        with torchmem.leak_check(raise_on_leak=False) as report:
            KEPT_BY_TEST.append(torch.ones(10))  # the one leak: sends the check to the search
        del big
        return report

    with collector_paused():
        before = torchmem.memory_allocated("cpu")
        report = checked_function()
        assert [finding.kind for finding in report.findings] == ["reachable"]
        assert torchmem.memory_allocated("cpu") - before == 512  # only the leak itself
    KEPT_BY_TEST.clear()


def test_a_chain_of_frames_keeping_their_callers_alive_renders_as_one_hop():
    # A frame caught in a cycle keeps every caller's frame alive; the path names the
    # frame that holds the tensor, not each frame in between.
    labels = [("caller", "wrap() [torch/fx/x.py:10]"), ("caller", "main() [train.py:49]"),
              ("local", "metric"), ("attr", "total")]
    assert render_path("<frame of wrap()>", labels) == (
        "<frame of wrap()> -> (2 frames out) main() [train.py:49]:metric.total"
    )
    assert render_path("<frame of f()>", [("caller", "g() [a.py:1]"), ("local", "x")]) == (
        "<frame of f()> -> (its caller) g() [a.py:1]:x"
    )
