"""The owner search without a pass over the heap, when the roots provably hold everything.

A unittest-style test keeps tensors on ``self`` (an allowed root) until its exit: listing the
whole heap (``gc.get_objects``) and classifying every object to find the tensors that use the
blocks costs tens of milliseconds per test, though the walk down from the roots alone finds
them all. That listing may be skipped only when no object outside the walk can use a block or
hold a path to it:

1. the walk down from the roots (``downward``'s rules) ends within its budget: every object it
   visited (``S``) has had its referents looked at;
2. every block has a tensor in ``S`` using it, plain (no ``.grad`` or autograd graph start),
   all of a block's tensors share one storage, which starts at the block (it owns the memory);
3. that storage's C++ use count is the number of tensors in ``S`` using it, plus its one
   Python storage object, plus the bases of views in ``S`` that are not in ``S`` themselves
   (a view of a temporary), each held by nothing but those views: no other tensor, storage
   or C++ holder refers to it;
4. every object of ``S`` on a path from a root to such a tensor, except the roots, is referred
   to only by objects of ``S`` (its reference count less the references from ``S``): nothing
   outside, Python, C or untracked, holds it.

Then the tensors a pass over the heap would find are exactly those found in ``S``, and the
downward search gives the result the full search gives. If any condition fails the caller
runs the full search, unchanged.
"""

from __future__ import annotations

import sys
from collections import defaultdict, deque

import torch

from torchmem.leaks.owners.downward import _SKIP_DOWN, _children
from torchmem.leaks.owners.roots import module_names
from torchmem.leaks.tensors import BlockIndex, locate_tensors

_storage_of = torch._C.TensorBase.untyped_storage
_requires_grad = torch._C.TensorBase.requires_grad.__get__
_is_leaf = torch._C.TensorBase.is_leaf.__get__
_Node = torch.autograd.graph.Node
# The number of references to a C++ storage; not in every torch build: without it, no fast path.
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
_tensor_use_count = getattr(torch._C.TensorBase, "_use_count", None)  # references to a tensor's C++ object


def _impl_python_reference() -> int | None:
    """The Python references a tensor object gets while C++ also holds its tensor (a view's
    base): 1 where PyTorch's tensor keeps its Python object alive then, 0 where it does not;
    measured, since that scheme changed across versions. None if neither (no fast path)."""
    base = torch.empty(0)
    alone = sys.getrefcount(base)
    view = base[:]
    shared = sys.getrefcount(base)
    del view
    return shared - alone if shared - alone in (0, 1) else None


_IMPL_PYTHON_REFERENCE = _impl_python_reference()


def closed_starts(index: BlockIndex, roots: list, *, budget: int, skip: set) -> dict | None:
    """The start points of every block in ``index`` (as ``locate_tensors`` gives them),
    found among the objects reachable from ``roots`` (``(name, kind, location, note, object)``)
    when the conditions of this module hold; None when one fails."""
    if _storage_use_count is None or _tensor_use_count is None or _IMPL_PYTHON_REFERENCE is None or not len(index):
        return None
    members: dict[int, object] = {}  # the only container here holding the walked objects
    root_ids = set()
    queue: deque = deque()
    for *_, obj in roots:
        if id(obj) not in members and id(obj) not in skip:
            members[id(obj)] = obj
            root_ids.add(id(obj))
            queue.append(obj)
    children: dict[int, list] = {}  # id -> ids of its referents in S (with repeats: each is a reference)
    while queue:
        if len(members) > budget:
            return None
        obj = queue.popleft()
        if isinstance(obj, _SKIP_DOWN) or module_names.name_of(obj) is not None:
            continue  # not entered: what it refers to is not known to be in S
        ids = children[id(obj)] = []
        for child in _children(obj):
            if child is None or id(child) in skip:
                continue
            ids.append(id(child))
            if id(child) not in members:
                members[id(child)] = child
                queue.append(child)
        child = None
    obj = queue = None
    for obj in members.values():
        cls = type(obj)  # type(), not isinstance(): some proxies warn when asked for __class__
        if issubclass(cls, _Node) or (issubclass(cls, torch.Tensor) and _requires_grad(obj) and not _is_leaf(obj)):
            # An autograd graph: the full search. Asked here, reading a graph would make
            # Python objects for its nodes that the full search would then find as well.
            return None
    obj = cls = None
    starts = locate_tensors(index, list(members.values()))
    if any(key not in starts for key in index.keys):
        return None
    # The bases of views the walk did not reach: a view of a temporary
    # (``torch.arange(4.0).unsqueeze(1).expand(4, 3)``) holds its base's C++ tensor, and with it
    # the base's Python object. They hold the block too; allowed below only when nothing else
    # holds them, as the full search would find no other holder for them either.
    outside_bases: dict[int, object] = {}
    bases_of_block: dict = defaultdict(set)
    for key, entries in starts.items():
        for start, _ in entries:
            base = start._base if isinstance(start, torch.Tensor) else None
            if base is not None and id(base) not in members:
                outside_bases[id(base)] = base
                bases_of_block[key].add(id(base))
    base = start = None
    storages = []  # kept alive while their use counts are read
    for key, entries in starts.items():
        cdatas = set()
        for start, suffix in entries:
            if suffix or not isinstance(start, torch.Tensor):
                return None  # a .grad, an autograd graph or a bare storage: the full search
            storage = _storage_of(start)
            storages.append(storage)
            cdatas.add(storage._cdata)
            if storage.data_ptr() != key[1]:
                return None  # a storage inside the block that does not own it (from_blob)
        distinct_storage_objects = len({id(storage) for storage in storages if storage._cdata in cdatas})
        expected_uses = len(entries) + len(bases_of_block[key]) + distinct_storage_objects
        if len(cdatas) != 1 or _storage_use_count(cdatas.pop()) != expected_uses:
            return None
        storages.clear()
    start_ids = {id(start) for entries in starts.values() for start, _ in entries}
    own_refs = defaultdict(int)  # references this function holds besides ``members``, or C++ ones explained
    for key, entries in starts.items():
        views_of = defaultdict(int)  # id(base) -> views of it among the block's tensors
        for start, _ in entries:
            base = start._base
            if base is not None:
                views_of[id(base)] += 1
        base = None
        for start, _ in entries:
            own_refs[id(start)] += 1
            # Who else holds its C++ tensor (besides its Python object): only the views of it
            # found here (a view's C++ tensor holds its base); a .grad's owner, an autograd
            # graph or a C++ cache would be one more: the full search.
            cpp_holders = _tensor_use_count(start) - 1
            if cpp_holders != views_of[id(start)]:
                return None
            if cpp_holders:
                own_refs[id(start)] += _IMPL_PYTHON_REFERENCE
        for base_id in bases_of_block[key]:
            if not _held_only_by_its_views(outside_bases, base_id, views_of[base_id]):
                return None
    start = storage = None  # loop variables: references the count below would not explain
    if not _held_only_from_inside(members, children, root_ids, start_ids, own_refs):
        return None
    return starts


def _held_only_by_its_views(bases: dict, base_id: int, views: int) -> bool:
    """A view's base outside the walk: a plain tensor whose C++ tensor only ``views`` (found
    in the walk) hold, and whose Python object only that C++ tensor holds."""
    base = bases[base_id]
    if _requires_grad(base) or _tensor_use_count(base) - 1 != views:
        return False
    base = None
    probe = {0: object()}
    baseline = _refcount(probe, 0) - 1  # the references of this frame and of the call
    return _refcount(bases, base_id) - baseline - 1 == _IMPL_PYTHON_REFERENCE


def _held_only_from_inside(members: dict, children: dict, root_ids: set, start_ids: set, own_refs: dict) -> bool:
    """Condition 4: the objects of ``S`` that lead to a start, roots apart, have no reference
    from outside ``S``."""
    parents: dict[int, list] = defaultdict(list)
    internal: dict[int, int] = defaultdict(int)
    for parent_id, ids in children.items():
        for child_id in ids:
            internal[child_id] += 1
            parents[child_id].append(parent_id)
    leading = set(start_ids)
    pending = list(start_ids)
    while pending:
        child_id = pending.pop()
        if child_id in root_ids:
            continue  # a root may be held from anywhere: what holds it is not a path to it
        for parent_id in parents[child_id]:
            if parent_id not in leading:
                leading.add(parent_id)
                pending.append(parent_id)
    # The references of this frame and of the call itself, measured on an object that only
    # ``members`` holds, with the same code as below.
    probe = {0: object()}
    baseline = _refcount(probe, 0) - 1
    for obj_id in leading - root_ids:
        if _refcount(members, obj_id) - baseline - 1 - own_refs.get(obj_id, 0) != internal[obj_id]:
            return False
    return True


def _refcount(holder: dict, key) -> int:
    return sys.getrefcount(holder[key])
