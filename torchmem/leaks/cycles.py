"""Which reference cycle held a block that only ``gc.collect()`` freed.

Given the objects the collector found unreachable (kept with ``gc.DEBUG_SAVEALL``) and the
blocks, finds for each block the nearest object above its tensors that lies on a cycle,
the path from it down to the tensor, and the shortest cycle through it, rendered as an
expression that evaluates back to the same object.
"""

from __future__ import annotations

import gc
import sys
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from typing import Iterable

from torchmem.leaks.paths import Owner, edge_labels, object_name, render_path
from torchmem.leaks.tensors import BlockIndex, locate_tensors, script_module_starts


@dataclass(frozen=True)
class CycleHolder:
    """How unreachable garbage held a block: the cycle member closest to the block, the
    path from it (``owner``), the types in the cycle and the cycle as an expression.

    ``holder_type`` is that member's type name; ``cycle_id`` tells cycles apart within one
    collection (blocks held by the same strongly connected component share it) and
    ``dropped_with`` names the garbage that was dropped together with it: the topmost cycles
    of the garbage (those no other garbage refers to) from which the holder's cycle is
    reached. A wrapper holding ten metric copies, each in its own cycle, is the one top of
    all ten; ten copies dropped one by one in a loop are each their own top, even though each
    refers to the same class, function or shared default (those are *below* every copy, so
    they join nothing). The cycle policy counts copies that share no top, per allocation
    stack and holder type (``cycle_policy``).
    """

    owner: Owner
    cycle_types: tuple
    cycle: str
    holder_type: str = ""
    cycle_id: int = 0
    dropped_with: frozenset = frozenset()

# --- unreachable cycles ----------------------------------------------------------------


def _tops_above(holders: set[int], forward: dict[int, list[int]], component: dict[int, int]) -> dict[int, frozenset]:
    """Component of each holder -> the top components above it: those reaching it (or it
    itself) that no other component of the garbage refers to.

    Garbage was dropped together when one top reaches it all (a wrapper's cycle above the
    cycles of its metric copies). Edges are followed upwards only: objects every copy
    refers to (its class, a module, a function, a shared default) are below the copies and
    never join them, whatever else refers to them.
    """
    above: dict[int, set[int]] = defaultdict(set)  # component -> components referring to it
    for node, successors in forward.items():
        source = component[node]
        for successor in successors:
            target = component[successor]
            if target != source:
                above[target].add(source)
    tops: dict[int, frozenset] = {}
    for holder in holders:
        if holder in tops:
            continue
        seen = {holder}
        pending = [holder]
        found = set()
        while pending:
            current = pending.pop()
            parents = above.get(current)
            if not parents:
                found.add(current)
                continue
            for parent in parents:
                if parent in tops:  # another holder above this one: its tops are known
                    found |= tops[parent]
                elif parent not in seen:
                    seen.add(parent)
                    pending.append(parent)
        tops[holder] = frozenset(found)
    return tops


def _strongly_connected(nodes: list[int], edges: dict[int, list[int]]) -> dict[int, int]:
    """Node -> component number (iterative Tarjan)."""
    index_of: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    component: dict[int, int] = {}
    counter = 0
    for root in nodes:
        if root in index_of:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index_of[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index_of:
                    index_of[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(edges.get(successor, ()))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index_of[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index_of[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = node
                    if member == node:
                        break
    return component


def find_cycle_holders(blocks: Iterable[tuple], garbage: list) -> dict:
    """For blocks used by tensors in ``garbage`` (objects ``gc`` found unreachable, saved
    with ``gc.DEBUG_SAVEALL``): the nearest cycle member above the tensor, the path from
    it, and the cycle. Returns ``{(device, address): CycleHolder}``."""
    index = BlockIndex(blocks)
    starts = locate_tensors(index, garbage)
    # Tensors the garbage holds through C++ (a TorchScript module) or through an object the
    # collector does not track (a numpy array viewing it) are not in the garbage themselves.
    for key, entries in script_module_starts(index, garbage).items():
        starts[key].extend(entries)
    for key, entries in _array_views(index, garbage).items():
        starts[key].extend(entries)
    if not starts:
        return {}
    by_id = {id(obj): obj for obj in garbage}
    forward: dict[int, list[int]] = {}
    backward: dict[int, list[int]] = defaultdict(list)
    for obj in garbage:
        successors = [id(child) for child in gc.get_referents(obj) if id(child) in by_id]
        forward[id(obj)] = successors
        for successor in successors:
            backward[successor].append(id(obj))
    # After the graph is taken: naming edges reads instances' __dict__, which on 3.11+
    # materializes dicts that are not in the garbage and would cut the edges through them.
    starts = _lift_outside_starts(starts, garbage, by_id)
    component = _strongly_connected(list(by_id), forward)
    sizes: dict[int, int] = defaultdict(int)
    for root in component.values():
        sizes[root] += 1

    def on_cycle(node: int) -> bool:
        return sizes[component[node]] > 1 or node in forward.get(node, ())

    # The blocks of one object (a metric's states and their defaults) share its cycle:
    # describe each cycle member once.
    described: dict[int, tuple[tuple, str]] = {}

    def describe(node: int) -> tuple[tuple, str]:
        if node not in described:
            described[node] = _describe_cycle(node, by_id, forward, component)
        return described[node]

    holders = {}
    for key, entries in starts.items():
        holder = _nearest_cycle(entries, by_id, backward, component, on_cycle, describe)
        if holder is not None:
            holders[key] = holder
    tops = _tops_above({holder.cycle_id for holder in holders.values()}, forward, component)
    return {key: replace(holder, dropped_with=tops[holder.cycle_id]) for key, holder in holders.items()}


def _lift_outside_starts(starts: dict, garbage: list, by_id: dict) -> dict:
    """Start objects that are not garbage themselves (a numpy array, a TorchScript module's
    tensor reached through C++) are replaced by the garbage objects that refer to them."""
    outside = {id(obj) for entries in starts.values() for obj, _ in entries if id(obj) not in by_id}
    if not outside:
        return starts
    parents: dict[int, list] = defaultdict(list)
    for obj in garbage:
        for child in gc.get_referents(obj):
            if id(child) in outside:
                parents[id(child)].append(obj)
    lifted: dict = defaultdict(list)
    for key, entries in starts.items():
        for obj, suffix in entries:
            if id(obj) in by_id:
                lifted[key].append((obj, suffix))
                continue
            for parent in parents.get(id(obj), ()):
                lifted[key].append((parent, tuple(edge_labels(parent, obj)) + tuple(suffix)))
    return lifted


def _array_views(index: BlockIndex, garbage: list) -> dict:
    """``(array, labels)`` starts for numpy arrays held by the garbage whose ``.base`` chain
    ends at a tensor using a block (the arrays are untracked: never in the garbage list)."""
    numpy = sys.modules.get("numpy")
    found: dict = defaultdict(list)
    if numpy is None:
        return found
    seen: set[int] = set()
    for child in gc.get_referents(*garbage) if garbage else ():
        if not issubclass(type(child), numpy.ndarray) or id(child) in seen:
            continue
        seen.add(id(child))
        labels, base = [("attr", "base")], child.base
        while isinstance(base, numpy.ndarray):
            labels.append(("attr", "base"))
            base = base.base
        if base is None:
            continue
        for key, entries in locate_tensors(index, [base], follow_graphs=False).items():
            for _, suffix in entries:
                found[key].append((child, tuple(labels) + tuple(suffix)))
    return found


def _nearest_cycle(entries, by_id, backward, component, on_cycle, describe) -> CycleHolder | None:
    down: dict[int, tuple] = {}
    queue: deque[int] = deque()
    for obj, suffix in entries:
        if id(obj) in by_id and id(obj) not in down:
            down[id(obj)] = (None, suffix)
            queue.append(id(obj))
    while queue:
        node = queue.popleft()
        if on_cycle(node):
            node = _owner_of_namespace(node, down, by_id, backward, on_cycle)
            below = _labels_down(node, down, by_id)
            member = by_id[node]
            owner = Owner(render_path(object_name(member), below), "cycle")
            types_in_cycle, expression = describe(node)
            return CycleHolder(
                owner=owner, cycle_types=types_in_cycle, cycle=expression,
                holder_type=type(member).__qualname__, cycle_id=component[node],
            )
        for parent in backward.get(node, ()):
            if parent not in down:
                down[parent] = (node, ())
                queue.append(parent)
    return None


def _owner_of_namespace(node: int, down: dict, by_id: dict, backward: dict, on_cycle) -> int:
    """An instance's ``__dict__`` says less than the instance: step up to it when both are
    on the cycle (``<BinaryAccuracy>.tp`` rather than ``<dict>['tp']``)."""
    if not isinstance(by_id[node], dict):
        return node
    for parent in backward.get(node, ()):
        if on_cycle(parent) and edge_labels(by_id[parent], by_id[node]) == [("dictof",)]:
            down.setdefault(parent, (node, ()))
            return parent
    return node


def _labels_down(node: int, down: dict, by_id: dict) -> list[tuple]:
    labels: list[tuple] = []
    while True:
        child, suffix = down[node]
        if child is None:
            return labels + list(suffix)
        labels.extend(edge_labels(by_id[node], by_id[child]))
        node = child


def _describe_cycle(start: int, by_id, forward, component) -> tuple[tuple, str]:
    """The shortest cycle through ``start``: the types on it, and it as an expression that
    evaluates back to the start object."""
    previous: dict[int, int] = {}
    queue: deque[int] = deque([start])
    same = component[start]
    closing = None
    while queue and closing is None:
        node = queue.popleft()
        for successor in forward.get(node, ()):
            if successor == start:
                closing = node
                break
            if successor not in previous and component.get(successor) == same:
                previous[successor] = node
                queue.append(successor)
    path = [start]
    if closing is not None:
        chain = []
        node = closing
        while node != start:
            chain.append(node)
            node = previous[node]
        path.extend(reversed(chain))
    path.append(start)
    labels: list[tuple] = []
    for parent, child in zip(path, path[1:]):
        labels.extend(edge_labels(by_id[parent], by_id[child]))
    names = []
    for parent, node in zip([None, *path[:-2]], path[:-1]):
        # An instance's __dict__ is part of the instance, not a member of the cycle of its
        # own: Python 3.10 keeps it as a separate dict object on the path, 3.11+ inline.
        if parent is not None and edge_labels(by_id[parent], by_id[node]) == [("dictof",)]:
            continue
        name = type(by_id[node]).__name__
        if name not in names:
            names.append(name)
    first = type(by_id[start]).__name__
    base = object_name(by_id[start]) if first == "frame" else first
    return tuple(names), f"{render_path(base, labels)} is the same {first}"
