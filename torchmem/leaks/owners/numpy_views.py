"""What the owner search's walk cannot see by itself: numpy arrays viewing a tensor.

numpy arrays are not tracked by Python's collector, so ``gc.get_referrers`` never names
them as a tensor's holders; they are found from the tracked objects (and untracked
containers) that hold them.
"""

from __future__ import annotations

import gc
import itertools
import sys
from collections import defaultdict

def untracked_viewers(objects: list, wanted: set[int]) -> dict[int, list[list]]:
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
