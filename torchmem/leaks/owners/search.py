"""``find_owners``: who holds a block, from the tensors that use it up to a named root.

The search in order (each step in its own module of this package):

1. the Python objects that use each block (``torchmem.leaks.tensors.locate_tensors``);
2. down from the roots already known, at no cost in heap passes (``downward``);
3. up from the rest along referrers until a named root (``upward``, ``roots``);
4. what the walk cannot see: numpy arrays viewing a tensor (``numpy_views``), TorchScript
   modules, and a note for holders outside what the collector tracks.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from torchmem.leaks import collector
from torchmem.leaks.owners.closed import closed_starts
from torchmem.leaks.owners.downward import downward_search
from torchmem.leaks.owners.numpy_views import untracked_viewers
from torchmem.leaks.owners.roots import AllowedRoot, live_frames, read_local_roots
from torchmem.leaks.owners.upward import UpwardSearch
from torchmem.leaks.paths import Owner, edge_labels, render_path
from torchmem.leaks.tensors import BlockIndex, locate_tensors, script_module_starts

DEFAULT_MAX_DEPTH = 12
DEFAULT_TIME_BUDGET = 10.0  # seconds, for one find_owners call
DEFAULT_MAX_OWNERS = 3
DEFAULT_NODE_BUDGET = 20_000  # objects the downward search may visit


@dataclass
class OwnerSearch:
    """Result of ``find_owners``.

    ``owners``: named holders per block key; ``allowed``: keys held only through allowed
    roots, with the note that says why that is allowed; ``unnamed``: keys no named root
    was found for, except ``held_outside``: those whose walk ended at an object nothing
    the collector tracks refers to (C++, an untracked object; garbage could not be it);
    ``notes``: what is known about holders the walk cannot name (C++, untracked
    objects); ``stopped_early``: a budget stopped the walk; ``live_rooted``: keys held by
    a root that is certainly alive and stays so while the exit runs (a module global of a
    module in ``sys.modules``, an object the check holds), so not by garbage.
    """

    owners: dict
    stopped_early: bool
    allowed: dict = field(default_factory=dict)
    unnamed: set = field(default_factory=set)
    notes: dict = field(default_factory=dict)
    held_outside: set = field(default_factory=set)
    live_rooted: set = field(default_factory=set)
    given_up: bool = False
    heap_listed: bool = True  # False: decided from the roots alone (``closed``), no pass over the heap



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
    give_up_after: int | None = None,
) -> OwnerSearch:
    """Named holders of each block in ``blocks`` (``(device, address, size)`` triples).

    Returns an ``OwnerSearch``: ``owners={(device, address): [Owner, ...]}`` (up to
    ``max_owners`` paths per block, shortest first; blocks nothing reaches get an empty
    list and a note), the blocks held only through ``allowed_roots``, and whether a budget
    (``max_depth`` levels, ``time_budget`` seconds, ``node_budget`` objects searched
    downward) stopped it; then unresolved blocks get an ``unnamed`` owner naming the
    outermost object reached.

    ``give_up_after``: a number of passes over the whole heap after which the search stops
    (``given_up``, its result incomplete) if a block still has no root that is certainly
    alive (``live_rooted``): a leak check's exit asks that first, to skip its collection of
    the whole heap for blocks such a root holds, without paying a long walk for the others.
    """
    index = BlockIndex(blocks)
    deadline = time.monotonic() + time_budget
    allowed = {id(root.obj): root for root in allowed_roots}
    if _use_closed_roots:
        result = _search_from_closed_roots(index, allowed, deadline, max_owners, node_budget)
        if result is not None:
            return result
    return _full_search(index, allowed, deadline, max_depth, max_owners, node_budget, give_up_after)


_use_closed_roots = True  # tests turn it off to compare with the full search


def _search_from_closed_roots(index, allowed, deadline, max_owners, node_budget) -> OwnerSearch | None:
    """Step 1 alone, without listing the heap, when ``closed.closed_starts`` proves the roots
    hold every block and the walk down names a holder for each; else None."""
    ignore = {id(allowed)}
    frames = live_frames()
    local_roots = read_local_roots(frames, ignore)
    del frames
    roots = _roots(allowed, local_roots)
    try:
        skip = ignore | {id(roots), id(local_roots.values)}
        starts = closed_starts(index, roots, budget=node_budget, skip=skip)
        if starts is None:
            return None
        result = OwnerSearch(owners={key: [] for key in index.keys}, stopped_early=False, heap_listed=False)
        _search_down(starts, roots, skip | {id(starts)}, deadline, node_budget, max_owners, result)
        if not all(result.owners[key] for key in index.keys):
            return None  # a budget stopped the walk: the full search decides
        return result
    finally:
        del roots
        local_roots.values.clear()


def _roots(allowed: dict, local_roots) -> list:
    """The roots the downward search starts from: allowed objects, then live frames' locals."""
    roots = [
        (root.name, "allowed" if root.allowed else "global", None, root.note if root.allowed else None, root.obj)
        for root in allowed.values()
    ]
    roots += [(name, "local", location, None, value) for name, location, value in local_roots.values]
    return roots


def _search_down(starts, roots, skip, deadline, node_budget, max_owners, result) -> None:
    """Step 1: down from the roots to the start objects; fills ``result``."""
    targets: dict = defaultdict(list)
    for key, entries in starts.items():
        for obj, suffix in entries:
            targets[id(obj)].append((key, suffix))
    obj = None  # a loop variable would be a reference the walk cannot explain
    found = downward_search(roots, targets, budget=node_budget, deadline=deadline, skip=skip | {id(targets)})
    for key, owners in found.items():
        if any(owner.kind != "local" for owner, _ in owners):
            result.live_rooted.add(key)  # objects the check holds: alive (locals: see upward._check_local_root)
        for owner, note in owners[:max_owners]:
            result.owners[key].append(owner)
            if note is not None:
                result.allowed.setdefault(key, note)
        if any(owner.kind != "allowed" for owner, _ in owners):
            result.allowed.pop(key, None)  # also held by something that is not allowed


def _full_search(index, allowed, deadline, max_depth, max_owners, node_budget, give_up_after) -> OwnerSearch:
    objects = gc.get_objects()  # while frozen: only the objects made during the check
    try:
        starts = locate_tensors(index, objects)
        if collector.is_frozen() and any(key not in starts for key in index.keys):
            collector.thaw()  # a block used by an older tensor object (a .grad, a resized tensor)
            objects = gc.get_objects()
            starts = locate_tensors(index, objects)
        ignore = {id(objects), id(starts), id(allowed)}
        frames = live_frames()
        local_roots = read_local_roots(frames, ignore)
        del frames
        result = OwnerSearch(owners={key: [] for key in index.keys}, stopped_early=False)
        # 1. Down from the roots already known: allowed objects and the locals of live frames.
        roots = _roots(allowed, local_roots)
        _search_down(starts, roots, ignore | {id(roots), id(local_roots.values)}, deadline, node_budget,
                     max_owners, result)
        del roots
        local_roots.values.clear()  # the locals' values: needed no more, and not to be found as holders
        # 2. Up from the rest, one heap pass per level.
        rest = {key: entries for key, entries in starts.items() if not result.owners[key]}
        below_allowed = {key: entries for key, entries in starts.items() if key in result.allowed}
        if not collector.is_frozen():
            # The heap list refers to every object: each pass over the heap would find it
            # among the referrers and go through its hundreds of thousands of referents
            # (ignored as the search's own) at every level. Only a frozen walk uses it.
            objects = None
        if below_allowed:
            _recheck_allowed(below_allowed, objects, local_roots, ignore, allowed, result, max_depth, deadline,
                             max_owners)
        if rest:
            _walk_up(rest, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners,
                     give_up_after)
            if result.given_up:
                return result
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


def _recheck_allowed(starts, objects, local_roots, ignore, allowed, result, max_depth, deadline,
                     max_owners) -> None:
    """Blocks step 1 found below an allowed root may be held by something else as well: the
    tensor also in a module list, its holder also in a global, a view of its storage kept
    elsewhere (the search from closed roots proved none of that, or it would have answered).
    Walk up for them; a named holder that is not allowed makes the block not allowed and joins
    its holders. What the walk cannot name (a reference from C) leaves step 1's answer."""
    scratch = OwnerSearch(owners={key: [] for key in starts}, stopped_early=False)
    _walk_up(starts, objects, local_roots, ignore, allowed, scratch, max_depth, deadline, max_owners)
    result.stopped_early |= scratch.stopped_early
    for key in starts:
        others = [owner for owner in scratch.owners[key] if owner.kind not in ("allowed", "unnamed")]
        if not others:
            continue
        result.allowed.pop(key, None)
        result.live_rooted |= scratch.live_rooted & {key}
        kept = [owner for owner in result.owners[key] if owner not in others]
        result.owners[key] = (others + kept)[:max_owners]


def _walk_up(starts, objects, local_roots, ignore, allowed, result, max_depth, deadline, max_owners,
             give_up_after=None) -> None:
    search = UpwardSearch(
        starts, objects, local_roots, ignore, allowed, max_depth=max_depth, deadline=deadline,
        max_owners=max_owners, new_objects=objects if collector.is_frozen() else None,
        give_up_after=give_up_after,
    )
    search.run()
    if search.given_up:
        result.given_up = True
        return
    result.stopped_early |= search.stopped_early
    result.live_rooted |= search.live_rooted
    for key in starts:
        owners = search.owners_of(key)
        if not owners:
            fallback = search.unnamed_owner(key)
            owners = [fallback] if fallback is not None else []
            if fallback is not None and search.held_outside(key):
                # The outermost object is held from outside what the collector tracks.
                result.notes[key] = _UNREFERRED.format(type=fallback.path.split(">", 1)[0].lstrip("<"))
                result.held_outside.add(key)
            elif fallback is not None:
                result.notes[key] = search.why_unnamed(key)
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
        viewers = untracked_viewers(objects, wanted)
        objects = None  # not to be a referrer the walk below goes through (see find_owners)
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
