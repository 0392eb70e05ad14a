"""Who holds a block: from the tensors whose storage lies in it up to a named root.

A leak report is only useful if it says *what* keeps memory alive. Given engine blocks
(device, address, size), this module

1. finds the Python objects that use each block (``locate_tensors``): tensors and untyped
   storages whose storage starts inside it, the ``.grad`` of leaf tensors, and tensors saved
   in autograd graphs (reached from the tensors that own the graphs);
2. walks referrers upward from them, breadth first and for all blocks at once, until it
   meets a **named root** (``find_owners``): a module global (``module.name``), a class
   attribute (``module.Class.name``), or a local variable of a live frame
   (``function():name`` with file:line); the path is rendered as Python reads it,
   e.g. ``trainer.state.eval_metrics['acc'].tp``;
3. for blocks kept only by garbage (``find_cycle_holders``), finds the reference cycle
   that holds them and names the types in it.

Cost: this runs only when a leak check found survivors. Each level of the upward walk is
one pass over the heap (``gc.get_referrers`` for small frontiers, one ``gc.get_referents``
sweep with a set lookup for large ones), shared by all blocks, so hundreds of blocks cost
about as much as one; budgets on depth and time bound it.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import types
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from torchmem.leaks.cycles import CycleHolder, find_cycle_holders
from torchmem._support.files import short_path
from torchmem.leaks.paths import Owner, edge_labels, render_path
from torchmem.leaks.tensors import BlockIndex, BlockKey, device_key, locate_tensors

__all__ = [
    "Owner", "CycleHolder", "OwnerSearch", "BlockIndex", "BlockKey", "device_key", "locate_tensors",
    "find_owners", "find_cycle_holders", "edge_labels", "render_path",
]

DEFAULT_MAX_DEPTH = 12
DEFAULT_TIME_BUDGET = 10.0  # seconds, for one find_owners call
DEFAULT_MAX_OWNERS = 3
# Frontier sizes up to this use gc.get_referrers, whose cost grows with the number of
# targets; above it one sweep with a set lookup is cheaper.
_SMALL_FRONTIER = 48
# Caps that keep a pathological heap (one object referenced from everywhere) from
# swallowing the budget; paths through such objects are rarely the interesting ones.
_MAX_FRONTIER_PER_BLOCK = 400
_MAX_REFERRERS_PER_OBJECT = 64

# The leak machinery itself: this package, and the pytest plugin that drives it.
_LEAKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PYTEST_PLUGIN = os.path.join(os.path.dirname(_LEAKS_DIR.rstrip(os.sep)), "integrations", "pytest_plugin.py")


def _is_own_file(filename: str) -> bool:
    """Files of the leak machinery itself, whose frames and locals are never owners."""
    path = os.path.abspath(filename)
    return path.startswith(_LEAKS_DIR) or path == _PYTEST_PLUGIN


@dataclass
class OwnerSearch:
    """Result of ``find_owners``: owners per block key, and whether a budget stopped it."""

    owners: dict
    stopped_early: bool


# --- named roots -----------------------------------------------------------------------


class _ModuleNames:
    """``id(module.__dict__) -> module name``, rebuilt only when ``sys.modules`` changed size
    (ids are checked on use, so a replaced module cannot lend its name to a new dict)."""

    def __init__(self):
        self._names: dict[int, str] = {}
        self._built_for = -1

    def name_of(self, namespace) -> str | None:
        if not isinstance(namespace, dict):
            return None
        if self._built_for != len(sys.modules):
            self._rebuild()
        name = self._names.get(id(namespace))
        module = sys.modules.get(name) if name is not None else None
        if module is None or getattr(module, "__dict__", None) is not namespace:
            return None
        return name

    def _rebuild(self) -> None:
        names: dict[int, str] = {}
        for name, module in list(sys.modules.items()):
            if isinstance(module, types.ModuleType):
                names.setdefault(id(module.__dict__), name)
        self._names = names
        self._built_for = len(sys.modules)


_module_names = _ModuleNames()


def _global_name(function) -> str | None:
    """``module.qualname`` if that name resolves to ``function``, else None."""
    qualname = getattr(function, "__qualname__", "")
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    if module is None or "<" in qualname:
        return None
    value = module
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return f"{module.__name__}.{qualname}" if value is function else None


def _live_frames() -> list:
    """Every frame of every thread, innermost first, except this function's own: its
    frame holds the list, and a list holding that frame would be a reference cycle that
    keeps every frame, and every local of the checked code, alive until the next gc."""
    here = sys._getframe()
    frames = []
    for frame in sys._current_frames().values():
        if frame is here:
            frame = frame.f_back
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
    del here
    return frames


def _local_roots(frames: list, ignore: set) -> dict[int, list[tuple[str, str, str]]]:
    """id(value) -> [(function, local name, file:line)] for the locals of live frames.

    Reading ``f_locals`` materializes a dict on the frame (Python < 3.13); those dicts
    are added to ``ignore`` so the walk does not mistake them for holders.
    """
    roots: dict[int, list] = defaultdict(list)
    for frame in frames:
        ignore.add(id(frame))
        code = frame.f_code
        if _is_own_file(code.co_filename):
            continue
        namespace = frame.f_locals
        if namespace is frame.f_globals:  # module-level code: its names are module globals
            continue
        ignore.add(id(namespace))
        function = getattr(code, "co_qualname", code.co_name)
        location = f"{short_path(code.co_filename)}:{frame.f_lineno}"
        for name, value in namespace.items():
            roots[id(value)].append((function, name, location))
    return roots


# --- the upward walk -------------------------------------------------------------------


class _UpwardSearch:
    """Breadth-first from each block's start objects to named roots, one heap pass per level."""

    def __init__(self, starts: dict, objects: list, *, max_depth: int, deadline: float, max_owners: int):
        self.objects = objects
        self.nodes: dict[int, object] = {}
        # The search's own containers refer to the objects it visits; they are never holders.
        self.ignore: set[int] = {id(objects), id(self.nodes), id(starts)}
        for entries in starts.values():
            self.ignore.add(id(entries))
            self.ignore.update(map(id, entries))
        frames = _live_frames()
        self.local_roots = _local_roots(frames, self.ignore)
        del frames
        self.max_depth = max_depth
        self.deadline = deadline
        self.max_owners = max_owners
        self.down: dict = {}  # block key -> {node id: (child id | None, suffix labels, depth)}
        self.frontiers: dict = {}
        self.owners: dict = {key: [] for key in starts}
        self.found_at: dict = {}
        for key, entries in starts.items():
            down = self.down[key] = {}
            frontier = self.frontiers[key] = []
            for obj, suffix in entries:
                if id(obj) not in down:
                    self.nodes[id(obj)] = obj
                    down[id(obj)] = (None, suffix, 0)
                    frontier.append(id(obj))
        self.stopped_early = False

    def run(self) -> None:
        for key, frontier in self.frontiers.items():
            for node in frontier:
                self._check_local_root(key, node, 0)
        depth = 0
        while True:
            active = [key for key in self.frontiers if self._wants_more(key, depth)]
            if not active:
                return
            if depth >= self.max_depth or time.monotonic() > self.deadline:
                self.stopped_early = True
                return
            union = {node: self.nodes[node] for key in active for node in self.frontiers[key]}
            referrers = self._referrers(union)
            del union
            depth += 1
            for key in active:
                self.frontiers[key] = self._expand(key, referrers, depth)
            del referrers  # its lists hold this level's objects: not to be found as holders next
            for key in self.frontiers:
                if key not in active:
                    self.frontiers[key] = []

    def _wants_more(self, key, depth: int) -> bool:
        if not self.frontiers[key] or len(self.owners[key]) >= self.max_owners:
            return False
        first = self.found_at.get(key)
        # Once a block has a named owner, look one level further for others, then stop.
        return first is None or depth <= first

    def _referrers(self, frontier: dict[int, object]) -> dict[int, list]:
        targets = list(frontier.values())
        ignore = self.ignore | {id(frontier), id(targets)}
        if len(targets) <= _SMALL_FRONTIER:
            candidates = gc.get_referrers(*targets)
        else:
            wanted = frontier.keys()
            get_referents = gc.get_referents
            candidates = [obj for obj in self.objects if not wanted.isdisjoint(map(id, get_referents(obj)))]
        del targets
        by_child: dict[int, list] = defaultdict(list)
        for parent in candidates:
            parent_id = id(parent)
            if parent_id in ignore or (isinstance(parent, types.FrameType) and _is_own_file(parent.f_code.co_filename)):
                continue
            for child in gc.get_referents(parent):
                child_id = id(child)
                if child_id in frontier and len(by_child[child_id]) < _MAX_REFERRERS_PER_OBJECT:
                    by_child[child_id].append(parent)
        return by_child

    def _expand(self, key, referrers: dict[int, list], depth: int) -> list[int]:
        down = self.down[key]
        next_frontier = []
        for child_id in self.frontiers[key]:
            for parent in referrers.get(child_id, ()):
                parent_id = id(parent)
                if parent_id in down:
                    continue
                self.nodes[parent_id] = parent
                down[parent_id] = (child_id, (), depth)
                if self._check_named_root(key, parent, child_id, depth):
                    continue  # a named root: nothing above it makes a better name
                self._check_local_root(key, parent_id, depth)
                if len(next_frontier) < _MAX_FRONTIER_PER_BLOCK:
                    next_frontier.append(parent_id)
        return next_frontier

    def _labels_below(self, key, node_id: int) -> list[tuple]:
        """Labels from ``node_id`` down to the block's start object."""
        down = self.down[key]
        labels: list[tuple] = []
        current = node_id
        while True:
            child_id, suffix, _ = down[current]
            if child_id is None:
                labels.extend(suffix)
                return labels
            labels.extend(edge_labels(self.nodes[current], self.nodes[child_id]))
            current = child_id

    def _add_owner(self, key, owner: Owner, depth: int) -> None:
        owners = self.owners[key]
        if len(owners) < self.max_owners and all(existing.path != owner.path for existing in owners):
            owners.append(owner)
            self.found_at.setdefault(key, depth)

    def _check_local_root(self, key, node_id: int, depth: int) -> None:
        for function, name, location in self.local_roots.get(node_id, ()):
            path = render_path(f"{function}():{name}", self._labels_below(key, node_id))
            self._add_owner(key, Owner(path, "local", location), depth)

    def _check_named_root(self, key, parent, child_id: int, depth: int) -> bool:
        parent_id = id(parent)
        module_name = _module_names.name_of(parent)
        if module_name is not None:
            labels = edge_labels(parent, self.nodes[child_id])
            if labels and labels[0][0] == "item":  # a module's dict entry is an attribute
                labels = [("attr", labels[0][1])]
            path = render_path(module_name, labels + self._labels_below(key, child_id))
            self._add_owner(key, Owner(path, "global"), depth)
            return True
        if isinstance(parent, types.ModuleType):
            self._add_owner(key, Owner(render_path(parent.__name__, self._labels_below(key, parent_id)), "global"), depth)
            return True
        if isinstance(parent, type):
            name = f"{parent.__module__}.{parent.__qualname__}"
            self._add_owner(key, Owner(render_path(name, self._labels_below(key, parent_id)), "class"), depth)
            return True
        if isinstance(parent, types.FunctionType):
            name = _global_name(parent)
            if name is not None:
                self._add_owner(key, Owner(render_path(name, self._labels_below(key, parent_id)), "global"), depth)
                return True
        return False

    def unnamed_owner(self, key) -> Owner | None:
        """For a block without a named owner: the path from the outermost object reached."""
        down = self.down[key]
        deepest = max(down, key=lambda node: down[node][2])
        if down[deepest][2] == 0:
            return None  # nothing in Python refers to the objects that use the block
        obj = self.nodes[deepest]
        return Owner(render_path(f"<{type(obj).__name__}>", self._labels_below(key, deepest)), "unnamed")


def find_owners(
    blocks: Iterable[tuple],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    time_budget: float = DEFAULT_TIME_BUDGET,
    max_owners: int = DEFAULT_MAX_OWNERS,
) -> OwnerSearch:
    """Named holders of each block in ``blocks`` (``(device, address, size)`` triples).

    Returns ``OwnerSearch(owners={(device, address): [Owner, ...]}, stopped_early)``;
    blocks that no Python object reaches get an empty list. Up to ``max_owners`` paths
    per block, shortest first. Stops after ``max_depth`` levels or ``time_budget``
    seconds (then ``stopped_early`` is True and unresolved blocks get an ``unnamed``
    owner naming the outermost object reached).
    """
    index = BlockIndex(blocks)
    objects = gc.get_objects()
    try:
        starts = locate_tensors(index, objects)
        search = _UpwardSearch(
            starts, objects, max_depth=max_depth, deadline=time.monotonic() + time_budget, max_owners=max_owners
        )
        search.run()
        owners = {key: [] for key in index.keys}
        for key, found in search.owners.items():
            if not found:
                fallback = search.unnamed_owner(key)
                found = [fallback] if fallback is not None else []
            owners[key] = found
        return OwnerSearch(owners=owners, stopped_early=search.stopped_early)
    finally:
        del objects
