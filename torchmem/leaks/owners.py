"""Who holds a block: from the tensors whose storage lies in it up to a named root.

A leak report is only useful if it says *what* keeps memory alive. Given engine blocks
(device, address, size), this module

1. finds the Python objects that use each block (``locate_tensors``): tensors and untyped
   storages whose storage starts inside it, the ``.grad`` of leaf tensors, and tensors saved
   in autograd graphs (reached from the tensors that own the graphs);
2. searches **down** from the roots it already knows, at no cost in heap passes: objects
   the check was told to allow (``AllowedRoot``: a pytest test's parametrize values and
   fixtures) and the locals of live frames; most holders are found here;
3. walks referrers **up** from the rest, breadth first and for all blocks at once, until
   it meets a **named root**: a module global (``module.name``), a class attribute
   (``module.Class.name``), a live frame's local (``function():name`` with file:line) or an
   allowed root. Roots inside the test runner's machinery (pytest's frames and globals)
   are kept only as a last resort: behind them there is usually the user's object that
   really keeps the memory (the module-level list a ``@pytest.mark.parametrize`` was given);
4. explains what the walk cannot see: numpy arrays viewing a tensor (untracked by the
   collector, so invisible to ``gc.get_referrers``: found from the tracked containers that
   hold them), TorchScript modules, autograd graphs and other C++ holders, and never says
   that no Python object refers to a tensor when its reference count says otherwise;
5. for blocks kept only by garbage (``find_cycle_holders``), finds the reference cycle
   that holds them and names the types in it.

Cost: this runs only for blocks that survived the check's collection. Step 2 visits a
bounded number of objects; each level of step 3 is one pass over the heap
(``gc.get_referrers``), shared by all blocks. While the collector is frozen
(``torchmem.leaks.collector``) the tensors are looked for among the objects made during
the check first.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time
import types
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable

from torchmem.leaks import collector
from torchmem.leaks.cycles import CycleHolder, find_cycle_holders
from torchmem.leaks.frame_locals import local_items
from torchmem._support.files import short_path
from torchmem.leaks.paths import Owner, edge_labels, render_path
from torchmem.leaks.tensors import BlockIndex, BlockKey, device_key, locate_tensors, script_module_starts
from torchmem.stacks.frames import RUNNER, origin

__all__ = [
    "Owner", "AllowedRoot", "CycleHolder", "OwnerSearch", "BlockIndex", "BlockKey", "device_key",
    "locate_tensors", "find_owners", "find_cycle_holders", "edge_labels", "render_path",
]

DEFAULT_MAX_DEPTH = 12
DEFAULT_TIME_BUDGET = 10.0  # seconds, for one find_owners call
DEFAULT_MAX_OWNERS = 3
DEFAULT_NODE_BUDGET = 20_000  # objects the downward search may visit
# Frontier sizes up to this use gc.get_referrers, whose cost grows with the number of
# targets; above it one sweep with a set lookup is cheaper.
_SMALL_FRONTIER = 48
# Caps that keep a pathological heap (one object referenced from everywhere) from
# swallowing the budget; paths through such objects are rarely the interesting ones.
_MAX_FRONTIER_PER_BLOCK = 400
_MAX_FROZEN_DEPTH = 64  # levels of the walk through objects made during the check
_MAX_REFERRERS_PER_OBJECT = 64

# The leak machinery itself: this package, and the pytest plugin that drives it.
_LEAKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PYTEST_PLUGIN = os.path.join(os.path.dirname(_LEAKS_DIR.rstrip(os.sep)), "integrations", "pytest_plugin.py")


def _is_own_file(filename: str) -> bool:
    """Files of the leak machinery itself, whose frames and locals are never owners."""
    path = os.path.abspath(filename)
    return path.startswith(_LEAKS_DIR) or path == _PYTEST_PLUGIN


def _is_runner_file(filename: str) -> bool:
    """Code that only runs the user's (pytest, pluggy, runpy, threading): its locals and
    globals hold the user's objects on the way, and are named only when nothing else is."""
    return origin(filename) == RUNNER


@dataclass(frozen=True)
class AllowedRoot:
    """An object the caller knows and names: paths through it start with ``name``. When
    ``allowed``, blocks held only through it are reported as ``allowed`` with ``note``
    (otherwise it only names holders, e.g. a pytest test's arguments under
    ``allow_arguments=False``)."""

    name: str
    obj: object
    note: str
    allowed: bool = True


@dataclass
class OwnerSearch:
    """Result of ``find_owners``.

    ``owners``: named holders per block key; ``allowed``: keys held only through allowed
    roots, with the note that says why that is allowed; ``unnamed``: keys no named root
    was found for, except ``held_outside``: those whose walk ended at an object nothing
    the collector tracks refers to (C++, an untracked object; garbage could not be it);
    ``notes``: what is known about holders the walk cannot name (C++, untracked
    objects); ``stopped_early``: a budget stopped the walk.
    """

    owners: dict
    stopped_early: bool
    allowed: dict = field(default_factory=dict)
    unnamed: set = field(default_factory=set)
    notes: dict = field(default_factory=dict)
    held_outside: set = field(default_factory=set)


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

_ATOMS = (type(None), bool, int, float, complex, str, bytes, types.ModuleType, type, types.FunctionType,
          types.BuiltinFunctionType)


class _GlobalValues:
    """``id(value) -> (module name, global name)`` for the module globals that hold
    containers and instances: a holder that is a module global is named when the walk
    reaches it, without another pass over the heap for its module's dict. Built once per
    ``sys.modules`` size (about 10 ms); entries are checked on use, so a global rebound
    since then is not named wrongly (the walk finds it the slow way)."""

    def __init__(self):
        self._index: dict[int, tuple[str, str]] = {}
        self._indexed: set[str] = set()
        self._built_for = -1

    def lookup(self, obj) -> tuple[str, str] | None:
        if issubclass(type(obj), _ATOMS):  # type(): some proxies warn when asked for __class__
            return None
        if self._built_for != len(sys.modules):
            self._rebuild()
        found = self._index.get(id(obj))
        if found is None:
            return None
        module = sys.modules.get(found[0])
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or namespace.get(found[1], _NOT_THERE) is not obj:
            return None
        return found

    def _rebuild(self) -> None:
        """Indexes the modules imported since the last time (entries of modules gone or
        rebound fail the check on use)."""
        index = self._index
        for module_name, module in list(sys.modules.items()):
            if module_name in self._indexed:
                continue
            self._indexed.add(module_name)
            namespace = getattr(module, "__dict__", None) if isinstance(module, types.ModuleType) else None
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                if not issubclass(type(value), _ATOMS) and not name.startswith("__"):
                    index.setdefault(id(value), (module_name, name))
        self._built_for = len(sys.modules)


_NOT_THERE = object()
_global_values = _GlobalValues()


def warm_up() -> None:
    """Indexes the module globals of every module imported so far (tens of milliseconds in a
    large process), so that the first owner search does not pay for it: the pytest plugin
    calls it once collection has imported the test modules."""
    _global_values.lookup(_global_values)


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


@dataclass
class _LocalRoots:
    """The locals of live frames: ``by_id`` maps id(value) -> [(function, name, file:line)];
    ``runner`` is the same for frames of the test runner's code (named only as a last
    resort); ``values`` lists (root name, location, value) for the downward search."""

    by_id: dict
    runner: dict
    values: list


def _local_roots(frames: list, ignore: set) -> _LocalRoots:
    """The locals of ``frames``, read without leaving snapshots behind (``frame_locals``)."""
    roots: dict[int, list] = defaultdict(list)
    runner: dict[int, list] = defaultdict(list)
    values = []
    for frame in frames:
        ignore.add(id(frame))
        code = frame.f_code
        if _is_own_file(code.co_filename):
            continue
        if not (code.co_flags & 0x1):  # CO_OPTIMIZED: module and class bodies are namespaces, not locals
            continue
        function = getattr(code, "co_qualname", code.co_name)
        location = f"{short_path(code.co_filename)}:{frame.f_lineno}"
        target = runner if _is_runner_file(code.co_filename) else roots
        for name, value in local_items(frame):
            target[id(value)].append((function, name, location))
            if target is roots:
                values.append((f"{function}():{name}", location, value))
    return _LocalRoots(roots, runner, values)


# --- the downward search from known roots ----------------------------------------------


def _children(obj) -> list:
    """What the downward search follows from ``obj``: its referents, and for a numpy array
    (which the collector does not track, so it reports no referents) its ``.base``."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        base = obj.base
        return [] if base is None else [base]
    return gc.get_referents(obj)


_SKIP_DOWN = (type, types.ModuleType, types.FrameType, types.CodeType, types.BuiltinFunctionType, str, bytes)


def _downward(roots: list, targets: dict, *, budget: int, deadline: float, skip: set) -> dict:
    """Breadth first from every root at once, along referents, to the start objects.

    ``roots``: ``(name, kind, location, note, object)``; ``targets``: ``id(start) ->
    [(block key, suffix labels)]``. Returns ``{block key: [(Owner, note)]}`` with the
    shortest path from each root that reaches a block's start objects. Module namespaces,
    classes, code and frames are not entered (they lead everywhere); ``skip`` are ids not
    to enter either (the search's own containers).
    """
    parent: dict[int, tuple] = {}  # id -> (parent id or None, root index)
    nodes: dict[int, object] = {}
    queue: deque = deque()
    for index, (_, _, _, _, obj) in enumerate(roots):
        if id(obj) not in parent and id(obj) not in skip:
            parent[id(obj)] = (None, index)
            nodes[id(obj)] = obj
            queue.append(obj)
    found: dict = defaultdict(list)
    remaining = set(targets)
    visited = 0
    while queue and remaining and visited < budget:
        obj = queue.popleft()
        visited += 1
        obj_id = id(obj)
        if obj_id in targets:
            remaining.discard(obj_id)
            chain = [obj_id]
            while parent[chain[-1]][0] is not None:
                chain.append(parent[chain[-1]][0])
            chain.reverse()
            name, kind, location, note, _ = roots[parent[obj_id][1]]
            labels: list = []
            for above, below in zip(chain, chain[1:]):
                labels.extend(edge_labels(nodes[above], nodes[below]))
            for key, suffix in targets[obj_id]:
                found[key].append((Owner(render_path(name, labels + list(suffix)), kind, location), note))
        if visited % 512 == 0 and time.monotonic() > deadline:
            break
        if isinstance(obj, _SKIP_DOWN) or _module_names.name_of(obj) is not None:
            continue
        for child in _children(obj):
            child_id = id(child)
            if child_id in parent or child_id in skip or child is None:
                continue
            parent[child_id] = (obj_id, parent[obj_id][1])
            nodes[child_id] = child
            queue.append(child)
    return found


# --- the upward walk -------------------------------------------------------------------


# References to a candidate that the pass itself holds when _only_this_pass_holds asks:
# the candidates list, the caller's loop variable, the function's argument and
# getrefcount's argument (the same on Python 3.10 to 3.13).
_PASS_REFERENCES = 4


def _only_this_pass_holds(candidate) -> bool:
    """A referrer nothing else refers to holds nothing for anyone: the argument tuple of
    the ``gc.get_referrers(*targets)`` call itself (Python 3.13 returns it among the
    referrers of the targets; followed upwards, each level's call would add one more)."""
    return sys.getrefcount(candidate) <= _PASS_REFERENCES


def _sweep_referrers(frontier: dict[int, object], ignore: set) -> list:
    """The tracked objects that refer to the frontier's objects, found by one sweep over
    the heap with a set lookup (cheaper than ``gc.get_referrers`` for many targets). The
    list of every object is made here and dropped at once (kept on the search, it would
    hold the search and form a cycle)."""
    wanted = frontier.keys()
    get_referents = gc.get_referents
    objects = gc.get_objects()
    ignore.add(id(objects))
    candidates = []
    for obj in objects:
        if not wanted.isdisjoint(map(id, get_referents(obj))):
            candidates.append(obj)
    del objects
    return candidates


# On Python 3.13, pybind11 before 3.0.4 (torch 2.9 to 2.12 are built with 3.0.1) ignores
# what PyObject_VisitManagedDict returns in its objects' tp_traverse, so gc.get_referrers
# never names such an object as the referrer of its own __dict__ (a TorchScript module's
# ScriptMethod); gc.get_referents, which the sweep reads, is unaffected.
_GET_REFERRERS_MISSES_MANAGED_DICTS = sys.version_info >= (3, 13)


class _UpwardSearch:
    """Breadth-first from each block's start objects to named roots, one heap pass per level."""

    def __init__(self, starts: dict, objects: list, local_roots: _LocalRoots, ignore: set, allowed: dict, *,
                 max_depth: int, deadline: float, max_owners: int, new_objects: list | None = None):
        self.new_objects = new_objects  # the objects made during the check, while frozen
        self.nodes: dict[int, object] = {}
        # The search's own containers refer to the objects it visits; they are never holders.
        self.ignore: set[int] = set(ignore) | {id(objects), id(self.nodes), id(starts), id(self), id(self.__dict__)}
        for entries in starts.values():
            self.ignore.add(id(entries))
            self.ignore.update(map(id, entries))
        self.local_roots = local_roots
        self.allowed = allowed  # id(object) -> AllowedRoot
        self.max_depth = max_depth
        self.deadline = deadline
        self.max_owners = max_owners
        self.down: dict = {}  # block key -> {node id: (child id | None, suffix labels, depth)}
        # block key -> {node id: references followed in passes over the whole heap}, which
        # max_depth bounds; the hop from an instance's __dict__ to the instance is free.
        self.hops: dict = {}
        self.frontiers: dict = {}
        self.owners: dict = {key: [] for key in starts}
        self.fallbacks: dict = {key: [] for key in starts}  # roots in the runner's machinery
        self.allowed_notes: dict = {}  # block key -> note of the allowed root found
        self.found_at: dict = {}
        # Nodes a pass over the whole heap found no referrer for: held from C++ or by an
        # untracked object (not by garbage: garbage is tracked, and would refer to them).
        self.no_referrers: set[int] = set()
        self.hidden: set[int] = set()  # objects with references a frozen pass cannot see
        self.unexplained: set[int] = set()  # ... that no pass over the whole heap explains
        for key, entries in starts.items():
            down = self.down[key] = {}
            hops = self.hops[key] = {}
            frontier = self.frontiers[key] = []
            for obj, suffix in entries:
                if id(obj) not in down:
                    self.nodes[id(obj)] = obj
                    down[id(obj)] = (None, suffix, 0)
                    hops[id(obj)] = 0
                    frontier.append(id(obj))
        self.stopped_early = False

    def run(self) -> None:
        for key, frontier in self.frontiers.items():
            for node in frontier:
                self._check_local_root(key, node, 0)
                self._check_allowed_root(key, node, 0)
                self._check_global_value(key, self.nodes[node], node, 0)
        # While the collector is frozen, a pass sees only the objects made during the check
        # (cheap). Objects none of those refers to wait ("escapes") until the walk through
        # new objects is done; then one pass over the whole heap, after a thaw, looks them
        # up all at once and the walk goes on there.
        frozen = collector.is_frozen()
        escapes: dict = defaultdict(list)
        depth = 0
        whole_heap_levels = 0
        while True:
            active = [key for key in self.frontiers if self._wants_more(key, depth)]
            if not active:
                waiting = [key for key in escapes if escapes[key] and not self.owners[key]]
                if not waiting:
                    return
                if frozen and self._through_arrays(waiting, escapes, depth + 1):
                    depth += 1
                    continue  # numpy arrays made during the check hold some: walk on, still frozen
                collector.thaw()
                frozen = False
                for key in waiting:
                    self.frontiers[key] = escapes[key]
                escapes.clear()
                active = waiting
            # max_depth bounds the references followed in passes over the whole heap;
            # passes over the objects made during the check are cheap, and paths through
            # them long (a matplotlib figure). A hop that costs a pass but no reference in
            # the path (from an instance's __dict__ to the instance) is not counted, so the
            # budget reaches as far on Python 3.10 (where the dict is a referrer of its own)
            # as on 3.11+ (where the instance refers to its attributes): at most two passes
            # per reference.
            if not frozen:
                active = self._within_budget(active)
            if not active or (not frozen and whole_heap_levels >= 2 * self.max_depth) \
                    or depth >= _MAX_FROZEN_DEPTH or time.monotonic() > self.deadline:
                self.stopped_early = True
                return
            whole_heap_levels += 0 if frozen else 1
            union: dict[int, object] = {}
            for key in active:
                for node in self.frontiers[key]:
                    union[node] = self.nodes[node]
            referrers = self._referrers(union)
            if frozen:
                for key in active:
                    for node in self.frontiers[key]:
                        if node in self.hidden or not referrers.get(node):
                            escapes[key].append(node)
            del union
            depth += 1
            for key in active:
                self.frontiers[key] = self._expand(key, referrers, depth)
            del referrers  # its lists hold this level's objects: not to be found as holders next
            for key in self.frontiers:
                if key not in active:
                    self.frontiers[key] = []

    def _through_arrays(self, waiting: list, escapes: dict, depth: int) -> bool:
        """Escaped objects that numpy arrays made during the check view (untracked, so no
        pass finds them): the arrays become their referrers. True if any was found."""
        wanted: set[int] = set()
        for key in waiting:
            for node in escapes[key]:
                wanted.add(node)
        viewers = _untracked_viewers(self.new_objects, wanted) if self.new_objects is not None else {}
        self.ignore.add(id(viewers))
        progressed = False
        for key in waiting:
            hit: list = []
            rest: list = []
            for node in escapes[key]:
                (hit if node in viewers else rest).append(node)
            if hit:
                escapes[key] = rest
                self.frontiers[key] = self._enter_chains(key, hit, viewers, depth)
                progressed = True
        del viewers
        return progressed

    def _enter_chains(self, key, children: list[int], chains: dict, depth: int) -> list[int]:
        """Walks each chain of untracked objects above ``children`` (``_untracked_viewers``):
        the objects inside a chain are entered as they are, the outermost of each (which a
        tracked object refers to) through ``_expand``, which names it or makes it the next
        frontier."""
        down = self.down[key]
        hops = self.hops[key]
        below_outermost: dict[int, list] = defaultdict(list)
        for child_id in children:
            for chain in chains[child_id]:
                below = child_id
                for obj in reversed(chain[1:]):
                    if id(obj) not in down:
                        self.nodes[id(obj)] = obj
                        down[id(obj)] = (below, (), depth)
                        hops[id(obj)] = hops[below]
                    below = id(obj)
                below_outermost[below].append(chain[0])
        self.frontiers[key] = list(below_outermost)
        return self._expand(key, below_outermost, depth)

    def _within_budget(self, active: list) -> list:
        """``active`` with each frontier cut to the objects whose referrers may still be
        within ``max_depth``: those reached in fewer hops, and dicts (an instance's
        ``__dict__`` leads to its instance at no cost). Cutting any stops the search early."""
        kept = []
        for key in active:
            hops = self.hops[key]
            frontier = [node for node in self.frontiers[key]
                        if hops[node] < self.max_depth or isinstance(self.nodes[node], dict)]
            if len(frontier) < len(self.frontiers[key]):
                self.stopped_early = True
            self.frontiers[key] = frontier
            if frontier:
                kept.append(key)
        return kept

    def _wants_more(self, key, depth: int) -> bool:
        if not self.frontiers[key] or len(self.owners[key]) >= self.max_owners:
            return False
        first = self.found_at.get(key)
        # Once a block has a named owner, look one level further for others, then stop.
        return first is None or depth <= first

    def _referrers(self, frontier: dict[int, object]) -> dict[int, list]:
        """Referrers of the frontier's objects among the objects the collector tracks (only
        those made during the check while it is frozen)."""
        targets = list(frontier.values())
        ignore = self.ignore | {id(frontier), id(targets)}
        by_child: dict[int, list] = defaultdict(list)
        references: dict[int, int] = defaultdict(int)  # from every candidate, the search's own included
        if len(targets) <= _SMALL_FRONTIER:
            counted = self._count_references(gc.get_referrers(*targets), frontier, ignore, by_child, references)
            if _GET_REFERRERS_MISSES_MANAGED_DICTS:
                # A dict nothing was found to refer to, though something does: perhaps the
                # __dict__ of a pybind11 object that get_referrers cannot see. A sweep
                # (which reads get_referents, unaffected) looks for those only; referrers
                # already counted, and the sweep's own dict, are skipped.
                stray: dict[int, object] = {}
                for node in frontier:  # no loop variable holds the object: the counts stay exact
                    if type(frontier[node]) is dict and not by_child.get(node) \
                            and sys.getrefcount(frontier[node]) - 1 > references.get(node, 0):
                        stray[node] = frontier[node]
                if stray:
                    counted.add(id(stray))
                    ignore.add(id(stray))
                    self._count_references(_sweep_referrers(stray, ignore), stray, ignore, by_child, references,
                                           skip=counted)
                stray = None
        else:
            self._count_references(_sweep_referrers(frontier, ignore), frontier, ignore, by_child, references)
        del targets
        self._note_hidden_references(frontier, references, self.hidden if collector.is_frozen() else self.unexplained)
        return by_child

    def _count_references(self, candidates: list, frontier: dict[int, object], ignore: set, by_child: dict,
                          references: dict, skip: set | frozenset = frozenset()) -> set[int]:
        """Adds the references from ``candidates`` (except ids in ``skip``) to the frontier's
        objects: all to ``references``, those from objects that are not the search's own
        to ``by_child``. Returns the ids of the candidates counted."""
        counted: set[int] = set()
        for parent in candidates:
            parent_id = id(parent)
            if parent_id in skip:
                continue
            counted.add(parent_id)
            # The argument tuple of this very pass is gone by the time references are
            # compared with reference counts: not counted (a reference the search holds on
            # to, the frontier dict for one, is).
            transient = _only_this_pass_holds(parent)
            own = transient or parent_id in ignore or (
                isinstance(parent, types.FrameType) and _is_own_file(parent.f_code.co_filename))
            for child in gc.get_referents(parent):
                child_id = id(child)
                if child_id in frontier:
                    references[child_id] += 0 if transient else 1
                    if not own:
                        if len(by_child[child_id]) < _MAX_REFERRERS_PER_OBJECT:
                            by_child[child_id].append(parent)
                        else:
                            self.stopped_early = True  # a referrer was dropped
            child = None
        parent = candidates = None
        return counted

    def _note_hidden_references(self, frontier: dict[int, object], references: dict[int, int], into: set) -> None:
        """Objects whose reference count is higher than the references the pass found. While
        frozen (``hidden``) they are also held by something older, by C++ or by an untracked
        object, and the walk looks them up in the whole heap later; after a pass over the
        whole heap (``unexplained``) they are held from C++, by an untracked object or by a
        running function's local."""
        for child_id in frontier:
            # getrefcount's argument is the one reference not counted among the referrers.
            if sys.getrefcount(frontier[child_id]) - 1 > references.get(child_id, 0):
                into.add(child_id)

    def _expand(self, key, referrers: dict[int, list], depth: int) -> list[int]:
        down = self.down[key]
        hops = self.hops[key]
        next_frontier = []
        whole_heap = not collector.is_frozen()
        for child_id in self.frontiers[key]:
            if whole_heap and not referrers.get(child_id):
                self.no_referrers.add(child_id)
            child = self.nodes[child_id]
            for parent in referrers.get(child_id, ()):
                parent_id = id(parent)
                if parent_id in down:
                    continue
                parent_hops = hops[child_id] + (0 if not whole_heap or _holds_as_its_dict(parent, child) else 1)
                if parent_hops > self.max_depth:
                    self.stopped_early = True  # beyond the depth budget: not reached
                    continue
                self.nodes[parent_id] = parent
                down[parent_id] = (child_id, (), depth)
                hops[parent_id] = parent_hops
                if self._check_allowed_root(key, parent_id, depth):
                    continue
                if self._check_global_value(key, parent, parent_id, depth):
                    continue
                if self._check_named_root(key, parent, child_id, depth):
                    continue  # a named root: nothing above it makes a better name
                self._check_local_root(key, parent_id, depth)
                if len(next_frontier) < _MAX_FRONTIER_PER_BLOCK:
                    next_frontier.append(parent_id)
                else:
                    self.stopped_early = True  # a path was dropped: the walk is not exhaustive
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

    def _add_owner(self, key, owner: Owner, depth: int, *, runner: bool = False) -> None:
        if runner:  # pytest's frames and globals: named only if nothing better turns up
            if len(self.fallbacks[key]) < self.max_owners:
                self.fallbacks[key].append(owner)
            return
        owners = self.owners[key]
        if len(owners) < self.max_owners and all(existing.path != owner.path for existing in owners):
            owners.append(owner)
            self.found_at.setdefault(key, depth)

    def _check_allowed_root(self, key, node_id: int, depth: int) -> bool:
        root = self.allowed.get(node_id)
        if root is None:
            return False
        kind = "allowed" if root.allowed else "global"
        self._add_owner(key, Owner(render_path(root.name, self._labels_below(key, node_id)), kind), depth)
        if root.allowed:
            self.allowed_notes.setdefault(key, root.note)
        return True

    def _check_global_value(self, key, obj, node_id: int, depth: int) -> bool:
        found = _global_values.lookup(obj)
        if found is None:
            return False
        module_name, name = found
        runner = _is_runner_module(module_name)
        self._add_owner(key, Owner(render_path(f"{module_name}.{name}", self._labels_below(key, node_id)), "global"),
                        depth, runner=runner)
        return not runner

    def _check_local_root(self, key, node_id: int, depth: int) -> None:
        for function, name, location in self.local_roots.by_id.get(node_id, ()):
            path = render_path(f"{function}():{name}", self._labels_below(key, node_id))
            self._add_owner(key, Owner(path, "local", location), depth)
        for function, name, location in self.local_roots.runner.get(node_id, ()):
            path = render_path(f"{function}():{name}", self._labels_below(key, node_id))
            self._add_owner(key, Owner(path, "local", location), depth, runner=True)

    def _check_named_root(self, key, parent, child_id: int, depth: int) -> bool:
        parent_id = id(parent)
        module_name = _module_names.name_of(parent)
        if module_name is not None:
            labels = edge_labels(parent, self.nodes[child_id])
            if labels and labels[0][0] == "item":  # a module's dict entry is an attribute
                labels = [("attr", labels[0][1])]
            path = render_path(module_name, labels + self._labels_below(key, child_id))
            self._add_owner(key, Owner(path, "global"), depth, runner=_is_runner_module(module_name))
            return not _is_runner_module(module_name)
        if isinstance(parent, types.ModuleType):
            runner = _is_runner_module(parent.__name__)
            self._add_owner(key, Owner(render_path(parent.__name__, self._labels_below(key, parent_id)), "global"),
                            depth, runner=runner)
            return not runner
        if isinstance(parent, type):
            name = f"{parent.__module__}.{parent.__qualname__}"
            runner = _is_runner_module(parent.__module__)
            self._add_owner(key, Owner(render_path(name, self._labels_below(key, parent_id)), "class"), depth,
                            runner=runner)
            return not runner
        if isinstance(parent, types.FunctionType):
            name = _global_name(parent)
            if name is not None:
                runner = _is_runner_module(parent.__module__ or "")
                self._add_owner(key, Owner(render_path(name, self._labels_below(key, parent_id)), "global"), depth,
                                runner=runner)
                return not runner
        return False

    def owners_of(self, key) -> list:
        """The named owners of a block, the runner's roots if nothing else was found."""
        return self.owners[key] or self.fallbacks[key]

    def unnamed_owner(self, key) -> Owner | None:
        """For a block without a named owner: the path from the outermost object reached."""
        deepest = self._deepest(key)
        if self.down[key][deepest][2] == 0:
            return None  # nothing in Python refers to the objects that use the block
        obj = self.nodes[deepest]
        return Owner(render_path(f"<{type(obj).__name__}>", self._labels_below(key, deepest)), "unnamed")

    def held_outside(self, key) -> bool:
        """True when the walk reached an object held from outside what the collector tracks
        (no tracked referrer, or more references than tracked referrers)."""
        deepest = self._deepest(key)
        return self.down[key][deepest][2] > 0 and (deepest in self.no_referrers or deepest in self.unexplained)

    def _deepest(self, key) -> int:
        """The outermost object reached, preferring one held from outside the tracked heap."""
        down = self.down[key]
        deepest = None
        outside = self.no_referrers | self.unexplained
        for node, (_, _, depth) in down.items():  # a loop, not max(key=lambda): no closure cell
            # The start objects' counts include the search's own variables: never "outside".
            rank = (depth > 0 and node in outside, depth)
            if deepest is None or rank > (down[deepest][2] > 0 and deepest in outside, down[deepest][2]):
                deepest = node
        return deepest


def _holds_as_its_dict(parent, child) -> bool:
    """True if ``child`` is ``parent.__dict__`` (an instance's, a function's, a module's)."""
    if not isinstance(child, dict):
        return False
    try:
        return object.__getattribute__(parent, "__dict__") is child
    except Exception:  # noqa: BLE001 - no __dict__, or a class that hides it
        return False


def _is_runner_module(name: str) -> bool:
    module = sys.modules.get(name)
    filename = getattr(module, "__file__", None)
    return bool(filename) and _is_runner_file(filename)


# --- what the walk cannot see ----------------------------------------------------------


def _untracked_viewers(objects: list, wanted: set[int]) -> dict[int, list[list]]:
    """``id(object) -> [chain, ...]`` for ids in ``wanted``: each chain lists the untracked
    objects through which a numpy array views it, outermost first, down to (not including)
    the object itself: ``[array]``, ``[view, array]`` for an array of arrays' ``.base``,
    or ``[dict, array]`` when an untracked container holds the array.

    numpy arrays are not tracked by the collector: ``gc.get_referrers`` never returns
    them and ``gc.get_objects`` never lists them. They are found as referents of the
    tracked objects that hold them (one pass over the heap, so only when needed). Nor are
    dicts and tuples that hold only untracked objects: a ``{'locs': array}`` is invisible
    too, and on Python 3.10 so is every instance's ``__dict__`` holding an array (3.11+
    keep such attributes in the instance itself). A second pass looks inside those, only
    for the objects the first did not explain; its chain starts at the container, whose
    tracked holder ``gc.get_referrers`` does find.
    """
    numpy = sys.modules.get("numpy")
    if numpy is None or not wanted:
        return {}
    array_types = {numpy.ndarray, *numpy.ndarray.__subclasses__()}
    viewers: dict[int, list[list]] = defaultdict(list)
    _arrays_among_referents(objects, array_types, wanted, viewers, seen=set(), prefix=[])
    missing = wanted - viewers.keys()
    if missing:
        _arrays_in_untracked_containers(objects, array_types, missing, viewers)
    return viewers


_CHUNK = 4096


def _arrays_among_referents(holders: list, array_types: set, wanted: set[int], viewers: dict, *, seen: set,
                            prefix: list) -> None:
    """Adds ``prefix + [array, its base arrays...]`` for every array among the referents of
    ``holders`` whose ``.base`` chain reaches an object in ``wanted``."""
    for start in range(0, len(holders), _CHUNK):
        referents = gc.get_referents(*holders[start:start + _CHUNK])
        # Filtered in C (map, compress): the heap has millions of references.
        arrays = list(itertools.compress(referents, map(array_types.__contains__, map(type, referents))))
        del referents
        for child in arrays:
            if id(child) in seen:
                continue
            seen.add(id(child))
            chain, base = [child], child.base
            while base is not None:
                if id(base) in wanted:
                    viewers[id(base)].append(prefix + chain)
                    break
                if type(base) not in array_types:
                    break
                chain.append(base)
                base = base.base


_UNTRACKED_CONTAINERS = {dict, tuple}
_MAX_CONTAINER_NESTING = 3


def _chunks(objects: list):
    for start in range(0, len(objects), _CHUNK):
        yield objects[start:start + _CHUNK]


def _arrays_in_untracked_containers(objects: list, array_types: set, wanted: set[int], viewers: dict) -> None:
    """Arrays that untracked dicts and tuples hold, the containers being referents of
    ``objects`` (or nested in such containers, up to ``_MAX_CONTAINER_NESTING`` deep).

    Most heaps hold many untracked containers (tuples of names, dicts of numbers) and almost
    never an array in one: each level of containers is gathered and checked in C, a chunk
    at a time, and looked at one container at a time only where a chunk holds arrays."""
    levels: list[list] = []
    seen: dict[int, object] = {}
    holders = objects
    for _ in range(_MAX_CONTAINER_NESTING):
        boxes: dict[int, object] = {}
        for chunk in _chunks(holders):
            referents = gc.get_referents(*chunk)
            found = itertools.compress(referents, map(_UNTRACKED_CONTAINERS.__contains__, map(type, referents)))
            untracked = list(itertools.filterfalse(gc.is_tracked, found))
            boxes.update(zip(map(id, untracked), untracked))
            del referents, untracked
        for box_id in boxes.keys() & seen.keys():
            del boxes[box_id]
        if not boxes:
            return
        seen.update(boxes)
        level = list(boxes.values())
        del boxes
        levels.append(level)
        for chunk in _chunks(level):
            if not any(map(array_types.__contains__, map(type, gc.get_referents(*chunk)))):
                continue
            for box in chunk:
                found_here: dict = defaultdict(list)
                _arrays_among_referents([box], array_types, wanted, found_here, seen=set(), prefix=[box])
                for target, chains in found_here.items():
                    viewers[target].extend(_with_outer_containers(levels, chain) for chain in chains)
        holders = level


def _with_outer_containers(levels: list[list], chain: list) -> list:
    """``chain`` (starting at a container of the last level) preceded by the containers of
    the levels above that hold it, so that it starts at one a tracked object refers to."""
    for level in reversed(levels[:-1]):
        inner = id(chain[0])
        for chunk in _chunks(level):
            if inner not in set(map(id, gc.get_referents(*chunk))):
                continue
            holder = next(box for box in chunk if inner in set(map(id, gc.get_referents(box))))
            chain = [holder, *chain]
            break
    return chain


# --- the search ------------------------------------------------------------------------

_NO_PYTHON_OBJECT = (
    "no Python object uses this block: it is held from C++ (a TorchScript module, an autograd graph no Python "
    "object reaches, a C++ extension or cache)"
)
_UNREFERRED = (
    "the outermost object reached, a {type}, is referred to by no object Python's collector tracks: it is held "
    "from C++ (TorchScript keeps the functions and modules it compiled; an autograd graph, a C++ extension) or "
    "by an untracked object"
)
_HIDDEN = (
    "the tensors using it are held from outside the objects Python's collector tracks: from C++ (a TorchScript "
    "module, an autograd graph, a C++ extension) or by an object the collector does not track"
)


def find_owners(
    blocks: Iterable[tuple],
    *,
    allowed_roots: Iterable[AllowedRoot] = (),
    max_depth: int = DEFAULT_MAX_DEPTH,
    time_budget: float = DEFAULT_TIME_BUDGET,
    max_owners: int = DEFAULT_MAX_OWNERS,
    node_budget: int = DEFAULT_NODE_BUDGET,
) -> OwnerSearch:
    """Named holders of each block in ``blocks`` (``(device, address, size)`` triples).

    Returns an ``OwnerSearch``: ``owners={(device, address): [Owner, ...]}`` (up to
    ``max_owners`` paths per block, shortest first; blocks nothing reaches get an empty
    list and a note), the blocks held only through ``allowed_roots``, and whether a budget
    (``max_depth`` levels, ``time_budget`` seconds, ``node_budget`` objects searched
    downward) stopped it; then unresolved blocks get an ``unnamed`` owner naming the
    outermost object reached.
    """
    index = BlockIndex(blocks)
    deadline = time.monotonic() + time_budget
    allowed = {id(root.obj): root for root in allowed_roots}
    objects = gc.get_objects()  # while frozen: only the objects made during the check
    try:
        starts = locate_tensors(index, objects)
        if collector.is_frozen() and any(key not in starts for key in index.keys):
            collector.thaw()  # a block used by an older tensor object (a .grad, a resized tensor)
            objects = gc.get_objects()
            starts = locate_tensors(index, objects)
        ignore = {id(objects), id(starts), id(allowed)}
        frames = _live_frames()
        local_roots = _local_roots(frames, ignore)
        del frames
        result = OwnerSearch(owners={key: [] for key in index.keys}, stopped_early=False)
        # 1. Down from the roots already known: allowed objects and the locals of live frames.
        targets: dict = defaultdict(list)
        for key, entries in starts.items():
            for obj, suffix in entries:
                targets[id(obj)].append((key, suffix))
        obj = None  # a loop variable would be a reference the walk cannot explain
        roots = [
            (root.name, "allowed" if root.allowed else "global", None, root.note if root.allowed else None, root.obj)
            for root in allowed.values()
        ]
        roots += [(name, "local", location, None, value) for name, location, value in local_roots.values]
        skip = ignore | {id(targets), id(roots), id(local_roots.values)}
        found = _downward(roots, targets, budget=node_budget, deadline=deadline, skip=skip)
        del roots
        local_roots.values.clear()  # the locals' values: needed no more, and not to be found as holders
        for key, owners in found.items():
            for owner, note in owners[:max_owners]:
                result.owners[key].append(owner)
                if note is not None:
                    result.allowed.setdefault(key, note)
            if any(owner.kind != "allowed" for owner, _ in owners):
                result.allowed.pop(key, None)  # also held by something that is not allowed
        # 2. Up from the rest, one heap pass per level.
        rest = {key: entries for key, entries in starts.items() if not result.owners[key]}
        if rest:
            _walk_up(rest, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners)
        # 3. What the walk cannot see, for blocks still without a named owner.
        stuck = [key for key in index.keys if not _named(result.owners[key])]
        if stuck:
            _explain(stuck, starts, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners)
        result.unnamed = {
            key for key in index.keys
            if not _named(result.owners[key]) and key not in result.held_outside and key in starts
        }
        return result
    finally:
        del objects


def _named(owners: list) -> bool:
    return any(owner.kind != "unnamed" for owner in owners)


def _walk_up(starts, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners) -> None:
    search = _UpwardSearch(
        starts, objects, local_roots, ignore, allowed, max_depth=max_depth, deadline=deadline,
        max_owners=max_owners, new_objects=objects if collector.is_frozen() else None,
    )
    search.run()
    result.stopped_early |= search.stopped_early
    for key in starts:
        owners = search.owners_of(key)
        if not owners:
            fallback = search.unnamed_owner(key)
            owners = [fallback] if fallback is not None else []
            if fallback is not None and search.held_outside(key):
                # The outermost object is held from outside what the collector tracks.
                result.notes[key] = _UNREFERRED.format(type=fallback.path.split(">", 1)[0].lstrip("<"))
                result.held_outside.add(key)
        result.owners[key] = owners
        if owners and all(owner.kind == "allowed" for owner in owners):
            result.allowed[key] = search.allowed_notes[key]


def _explain(stuck, starts, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners) -> None:
    """Holders the upward walk cannot see: numpy arrays viewing the tensors (untracked by
    the collector), TorchScript modules (C++), and otherwise a note saying so."""
    # TorchScript modules hold tensors in C++; when Python tensor objects use the block the
    # walk above already went through them, so look in the modules only for the others.
    unused = [key for key in stuck if key not in starts]
    # Only a start object no tracked object refers to can be held by an untracked array
    # (an array's .base is the tensor itself); the sweep is a pass over every referent.
    wanted = {id(obj) for key in stuck if not result.owners[key] for obj, _ in starts.get(key, ())}
    scripted: dict = {}
    viewers: dict = {}
    if unused or wanted:
        collector.thaw()
        objects = gc.get_objects()
        if unused:
            scripted = script_module_starts(BlockIndex([(key[0], key[1], 1) for key in unused]), objects)
        viewers = _untracked_viewers(objects, wanted)
    retry: dict = {}
    for key in stuck:
        entries = list(scripted.get(key, ()))
        for obj, suffix in starts.get(key, ()):
            for chain in viewers.get(id(obj), ()):
                # From the outermost untracked object down to the tensor, then the tensor's own labels.
                labels: list = []
                for above, below in zip(chain, [*chain[1:], obj]):
                    labels.extend(edge_labels(above, below))
                entries.append((chain[0], tuple(labels) + tuple(suffix)))
        if entries:
            retry[key] = entries
    if retry:
        _walk_up(retry, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners)
    for key in stuck:
        if _named(result.owners[key]):
            if key in scripted:
                result.notes.setdefault(key, "held from C++ by a TorchScript module (torch.jit.script)")
            continue
        if result.owners[key]:
            continue  # Python objects do refer to it; no named root above them (garbage, or a budget)
        if key in scripted:
            module = scripted[key][0][0]
            result.owners[key] = [Owner(render_path(f"<{type(module).__name__} {module.original_name}>",
                                                    scripted[key][0][1]), "unnamed")]
            result.notes[key] = ("held from C++ by a TorchScript module (torch.jit.script); nothing in Python holds "
                                 "the module")
        elif key not in starts:
            result.notes[key] = _NO_PYTHON_OBJECT
        else:
            result.notes[key] = _HIDDEN
