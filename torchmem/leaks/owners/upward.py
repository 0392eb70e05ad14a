"""The owner search's second step: up from a block's tensors along their referrers.

Breadth first for all blocks at once, one pass over the heap per level (``gc.get_referrers``,
or one sweep with a set lookup for a large frontier), until each block meets a named root
(``torchmem.leaks.owners.roots``). While the collector is frozen a pass sees only the
objects made during the check; what those do not explain waits for one pass over the
whole heap. Reference counts higher than the references found say that something the
collector does not track (C++, an untracked object) holds an object too.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from collections import defaultdict

from torchmem.leaks import collector
from torchmem.leaks.owners.numpy_views import untracked_viewers
from torchmem.leaks.owners.roots import (
    LocalRoots, class_name, global_name, global_values, is_own_file, is_runner_module, leads_to_a_name, module_names,
)
from torchmem.leaks.paths import Owner, edge_labels, render_path

# Frontier sizes up to this use gc.get_referrers, whose cost grows with the number of
# targets; above it one sweep with a set lookup is cheaper.
_SMALL_FRONTIER = 48
# Caps that keep a pathological heap (one object referenced from everywhere) from
# swallowing the budget; paths through such objects are rarely the interesting ones.
_MAX_FRONTIER_PER_BLOCK = 400
_MAX_FROZEN_DEPTH = 64  # levels of the walk through objects made during the check
_MAX_REFERRERS_PER_OBJECT = 64
# ... of which at most this many of one type: an object referred to by many of its peers
# (parent pointers, instances sharing a dict) keeps room for the one referrer that differs.
_MAX_REFERRERS_OF_ONE_TYPE = 16


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


class UpwardSearch:
    """Breadth-first from each block's start objects to named roots, one heap pass per level."""

    def __init__(self, starts: dict, objects: list, local_roots: LocalRoots, ignore: set, allowed: dict, *,
                 max_depth: int, deadline: float, max_owners: int, new_objects: list | None = None,
                 give_up_after: int | None = None):
        # When set: stop (``given_up``) once this many passes over the whole heap have left
        # a block without a root that is certainly alive (see ``find_owners``).
        self.give_up_after = give_up_after
        self.given_up = False
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
        self.live_rooted: set = set()  # block keys a root that is certainly alive holds (_add_owner)
        # Why the walk stopped short, for the report of a block left without a named root:
        # block key -> {"depth", "time", "frontier"}, and node id -> referrers not followed.
        self.stops: dict = defaultdict(set)
        self.dropped: dict[int, int] = defaultdict(int)

    def run(self) -> None:
        self._walk()
        # Referrers dropped by the caps make the walk incomplete only for the blocks it left
        # without a name; for the others the name it found stands.
        for key, down in self.down.items():
            if not self.owners[key] and any(node in self.dropped for node in down):
                self.stopped_early = True

    def _walk(self) -> None:
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
            out_of_depth = (not frozen and whole_heap_levels >= 2 * self.max_depth) or depth >= _MAX_FROZEN_DEPTH
            out_of_time = time.monotonic() > self.deadline
            if not active or out_of_depth or out_of_time:
                self.stopped_early = True
                for key in active:
                    self.stops[key].add("time" if out_of_time else "depth")
                return
            if (self.give_up_after is not None and whole_heap_levels >= self.give_up_after
                    and any(key not in self.live_rooted for key in self.frontiers)):
                self.given_up = True
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
                        # Older objects may hold it too (hidden), or referrers were
                        # dropped by the caps: the pass over the whole heap looks again.
                        if node in self.hidden or not referrers.get(node) or self.dropped.get(node):
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
        viewers = untracked_viewers(self.new_objects, wanted) if self.new_objects is not None else {}
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
        """Walks each chain of untracked objects above ``children`` (``untracked_viewers``):
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
                self.stops[key].add("depth")
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
        # Referrers kept per child and type: beyond the caps, those that lead to a name (a
        # class, a module, a function, a cell, a module global) are kept all the same.
        of_type: dict[tuple, int] = defaultdict(int)
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
                isinstance(parent, types.FrameType) and is_own_file(parent.f_code.co_filename))
            for child in gc.get_referents(parent):
                child_id = id(child)
                if child_id in frontier:
                    references[child_id] += 0 if transient else 1
                    if not own:
                        kind = (child_id, type(parent))
                        if (len(by_child[child_id]) < _MAX_REFERRERS_PER_OBJECT
                                and of_type[kind] < _MAX_REFERRERS_OF_ONE_TYPE) or leads_to_a_name(parent):
                            by_child[child_id].append(parent)
                            of_type[kind] += 1
                        else:
                            self.dropped[child_id] += 1  # not followed (see run())
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
                    self.stops[key].add("depth")
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
                    self.stops[key].add("frontier")
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

    def _add_owner(self, key, owner: Owner, depth: int, *, runner: bool = False, live: bool = True) -> None:
        if live:
            # A root that is certainly alive (a module global of a module in sys.modules,
            # an object the check holds): the block is not garbage. A check's exit skips its
            # collection of the whole heap for such blocks (``classify``).
            self.live_rooted.add(key)
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
        found = global_values.lookup(obj)
        if found is None:
            return False
        module_name, name = found
        runner = is_runner_module(module_name)
        self._add_owner(key, Owner(render_path(f"{module_name}.{name}", self._labels_below(key, node_id)), "global"),
                        depth, runner=runner)
        return not runner

    def _check_local_root(self, key, node_id: int, depth: int) -> None:
        # A running function's local is alive, but not ``live``: another thread's frame (a
        # worker about to drop a collective's tensor) may let go of it while the exit runs,
        # and the exit's collection is what sees such a release (``classify``).
        for function, name, location in self.local_roots.by_id.get(node_id, ()):
            path = render_path(f"{function}():{name}", self._labels_below(key, node_id))
            self._add_owner(key, Owner(path, "local", location), depth, live=False)
        for function, name, location in self.local_roots.runner.get(node_id, ()):
            path = render_path(f"{function}():{name}", self._labels_below(key, node_id))
            self._add_owner(key, Owner(path, "local", location), depth, runner=True, live=False)

    def _check_named_root(self, key, parent, child_id: int, depth: int) -> bool:
        parent_id = id(parent)
        module_name = module_names.name_of(parent)
        if module_name is not None:
            labels = edge_labels(parent, self.nodes[child_id])
            if labels and labels[0][0] == "item":  # a module's dict entry is an attribute
                labels = [("attr", labels[0][1])]
            path = render_path(module_name, labels + self._labels_below(key, child_id))
            self._add_owner(key, Owner(path, "global"), depth, runner=is_runner_module(module_name))
            return not is_runner_module(module_name)
        if isinstance(parent, types.ModuleType):
            runner = is_runner_module(parent.__name__)
            # Reached through the module itself: its namespace was not sys.modules' (a module
            # removed from it or replaced, which garbage may hold): named, not proven alive.
            self._add_owner(key, Owner(render_path(parent.__name__, self._labels_below(key, parent_id)), "global"),
                            depth, runner=runner, live=sys.modules.get(parent.__name__) is parent)
            return not runner
        if isinstance(parent, type):
            name = class_name(parent)
            runner = is_runner_module(parent.__module__)
            self._add_owner(key, Owner(render_path(name, self._labels_below(key, parent_id)), "class"), depth,
                            runner=runner, live=False)  # a class may be garbage (a script's, released)
            return not runner
        if isinstance(parent, types.FunctionType):
            name = global_name(parent)
            if name is not None:
                runner = is_runner_module(parent.__module__ or "")
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

    def why_unnamed(self, key) -> str:
        """Why the walk found no named root above a block's outermost holder: the budget
        that stopped it, or that it followed every referrer."""
        down = self.down[key]
        top = type(self.nodes[self._deepest(key)]).__name__
        reasons = self.stops.get(key, set())
        dropped = [(self.dropped[node], node) for node in down if self.dropped.get(node)]
        if "time" in reasons:
            why = "the walk ran out of its time budget"
        elif "depth" in reasons:
            why = f"the walk stopped at its depth budget ({self.max_depth} references above the tensor)"
        elif dropped:
            count, node = max(dropped)
            followed = len([1 for entry in down.values() if entry[0] == node])
            why = (f"a {type(self.nodes[node]).__name__} on the path is referred to by {count + followed} objects "
                   f"or more, and the {followed} the walk followed lead to no name")
        elif "frontier" in reasons:
            why = (f"more than {_MAX_FRONTIER_PER_BLOCK} objects held the path at one level, and the walk "
                   "followed that many")
        else:
            why = ("every object that refers to it was followed, and only objects on the path (a reference cycle) "
                   "or torchmem's own do: garbage not yet collected, or a cycle that something outside Python's "
                   "view keeps")
        return f"no named root above the topmost holder reached, a {top}: {why}"

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
