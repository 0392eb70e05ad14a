"""The owner search's first step: down from the roots it already knows.

Objects the caller allowed and the locals of live frames are known without any pass over
the heap; a breadth-first walk along their referents finds most holders at a bounded cost.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from collections import defaultdict, deque

from torchmem.leaks.owners.roots import module_names
from torchmem.leaks.paths import Owner, edge_labels, render_path

def _children(obj) -> list:
    """What the downward search follows from ``obj``: its referents, and for a numpy array
    (which the collector does not track, so it reports no referents) its ``.base``."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        base = obj.base
        return [] if base is None else [base]
    return gc.get_referents(obj)


_SKIP_DOWN = (type, types.ModuleType, types.FrameType, types.CodeType, types.BuiltinFunctionType, str, bytes)


def downward_search(roots: list, targets: dict, *, budget: int, deadline: float, skip: set) -> dict:
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
        if isinstance(obj, _SKIP_DOWN) or module_names.name_of(obj) is not None:
            continue
        for child in _children(obj):
            child_id = id(child)
            if child_id in parent or child_id in skip or child is None:
                continue
            parent[child_id] = (obj_id, parent[obj_id][1])
            nodes[child_id] = child
            queue.append(child)
    return found
