"""Which Python objects use a block: tensors, storages, gradients and autograd graphs.

The start points of the owner search (``torchmem.leaks.owners``): for each block, the tensors
and untyped storages whose storage starts inside it, leaf tensors whose ``.grad`` does,
and tensors whose autograd graph saved one that does (memory PyTorch holds from C++).
"""

from __future__ import annotations

import bisect
import sys
from collections import defaultdict
from typing import Iterable

import torch

from torchmem import _C

BlockKey = tuple  # (device: str, address: int)

# On torch 2.9 (and, unmeasured, 2.10) reading the data pointer of an UntypedStorage object
# found in the heap corrupts torch.multiprocessing's shared_cache: after DataLoader workers
# sent batches, a later rebuild_storage_fd crashes in _free_weak_ref. Such a heap object can
# be a storage whose Python object torch keeps alive for C++ ("PyObject preservation",
# reworked by 2.11). There, bare storages are not start points: memory held only through
# one is reported without its holder (docs/limits.md).
_BARE_STORAGES_ARE_READABLE = torch.torch_version.__version__ >= (2, 11)

_MAX_GRAPH_VISITS = 200_000  # graph nodes visited, over all heads


def device_key(device) -> str:
    """``'cpu'``, ``'cuda:0'``: how blocks and tensors name their device here."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    return str(device)


class BlockIndex:
    """Blocks by device, searchable by any pointer inside them."""

    def __init__(self, blocks: Iterable[tuple]):
        by_device: dict[str, list] = defaultdict(list)
        for device, address, size in blocks:
            by_device[device_key(device)].append((address, size))
        self._starts: dict[str, list[int]] = {}
        self._ends: dict[str, list[int]] = {}
        for device, spans in by_device.items():
            spans.sort()
            self._starts[device] = [start for start, _ in spans]
            self._ends[device] = [start + size for start, size in spans]
        self._device_cache: dict = {}
        self.keys = [(device, start) for device, starts in self._starts.items() for start in starts]

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, device, pointer: int) -> BlockKey | None:
        """The key of the block containing ``pointer`` on ``device``, or None."""
        name = self._device_cache.get(device)
        if name is None:
            name = self._device_cache[device] = device_key(device)
        starts = self._starts.get(name)
        if not starts or pointer == 0:
            return None
        position = bisect.bisect_right(starts, pointer) - 1
        if position >= 0 and pointer < self._ends[name][position]:
            return (name, starts[position])
        return None


# --- which objects use a block ---------------------------------------------------------

_storage_of = torch._C.TensorBase.untyped_storage
_grad_of = torch._C.TensorBase.grad.__get__
_grad_fn_of = torch._C.TensorBase.grad_fn.__get__
_is_leaf = torch._C.TensorBase.is_leaf.__get__
_Node = torch.autograd.graph.Node
_requires_grad = torch._C.TensorBase.requires_grad.__get__


def _tensor_block(index: BlockIndex, tensor) -> BlockKey | None:
    try:
        storage = _storage_of(tensor)
        return index.find(storage.device, storage.data_ptr())
    except Exception:  # noqa: BLE001 - sparse, meta, fake and wrapper tensors have no plain storage
        return None


tensor_block = _tensor_block  # the block whose memory ``tensor``'s storage uses, or None


def _storage_block(index: BlockIndex, storage) -> BlockKey | None:
    try:
        return index.find(storage.device, storage.data_ptr())
    except Exception:  # noqa: BLE001
        return None


def _exact_types(objects: Iterable) -> set:
    """The types of ``objects`` by type(), not isinstance(): some proxies warn when asked for
    their __class__. A list (a heap's: 400,000 objects) is read in C."""
    return _C.types_of(objects) if isinstance(objects, list) else set(map(type, objects))


def _of_exact_types(objects: Iterable, types) -> list:
    """The items of ``objects`` whose type() is in ``types``; a list is read in C."""
    if isinstance(objects, list):
        return _C.objects_of_types(objects, set(types))
    return [obj for obj in objects if type(obj) in types]


def locate_tensors(index: BlockIndex, objects: Iterable, *, follow_graphs: bool = True) -> dict:
    """Start points of the owner search: for each block key, ``(object, suffix labels)``.

    The object is a tensor or storage using the block, or (for memory reachable only
    through C++) the Python object that reaches it, with labels saying how: a leaf
    tensor's ``.grad``, or a tensor saved in the autograd graph of a tensor or of an
    autograd node (``y.grad_fn``) that Python holds.
    """
    found: dict = defaultdict(list)
    if not len(index):
        return found
    # Classify each type once, then keep the objects of the wanted types.
    kinds: dict[type, int] = {}  # 1: tensor, 2: untyped storage, 3: autograd node
    for cls in _exact_types(objects):
        kind = (
            1 if issubclass(cls, torch.Tensor)
            else 2 if _BARE_STORAGES_ARE_READABLE and issubclass(cls, torch.UntypedStorage)
            else 3 if follow_graphs and issubclass(cls, _Node)
            else 0
        )
        if kind:
            kinds[cls] = kind
    wanted = kinds.keys()
    graph_heads = []  # (object Python holds, the graph node to walk from)
    for obj in _of_exact_types(objects, wanted):
        kind = kinds[type(obj)]
        if kind == 3:
            graph_heads.append((obj, obj))
            continue
        if kind == 2:
            key = _storage_block(index, obj)
            if key is not None:
                found[key].append((obj, ()))
            continue
        key = _tensor_block(index, obj)
        if key is not None:
            found[key].append((obj, ()))
        try:
            if _requires_grad(obj):
                if _is_leaf(obj):
                    grad = _grad_of(obj)
                    grad_key = None if grad is None else _tensor_block(index, grad)
                    if grad_key is not None:
                        found[grad_key].append((obj, (("attr", "grad"),)))
                elif follow_graphs and _grad_fn_of(obj) is not None:
                    graph_heads.append((obj, _grad_fn_of(obj)))
        except Exception:  # noqa: BLE001 - exotic subclasses may refuse these queries
            continue
    if graph_heads:
        _locate_in_graphs(index, graph_heads, found)
    return found


def _saved_tensors(node) -> Iterable[tuple[str, object]]:
    """``(attribute, tensor)`` for the tensors an autograd node saved for backward, and the
    leaf an ``AccumulateGrad`` node accumulates into (``.variable``)."""
    names = [name for name in dir(node) if name.startswith("_saved_")]
    if type(node).__name__ == "AccumulateGrad":
        names.append("variable")
    if type(node).__name__ == "BackwardCFunction" or hasattr(type(node), "saved_tensors"):
        names.append("saved_tensors")  # custom autograd.Function: ctx.save_for_backward
    for name in names:
        try:
            value = getattr(node, name)
        except Exception:  # noqa: BLE001 - saved values are freed once backward ran
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        for item in values:
            if isinstance(item, torch.Tensor):
                yield name, item


def _locate_in_graphs(index: BlockIndex, heads: list, found: dict) -> None:
    """Adds, for each block saved in the autograd graph of a head (a tensor with a
    ``grad_fn``, or a node), the start ``(head, graph label)``. Every head walks its own graph: a block reached from several
    heads gets a start from each, since some heads may be unreachable from Python (PyTorch
    keeps a tensor's Python object alive while its C++ tensor lives)."""
    nodes: dict[int, object] = {}  # keeps node wrappers alive so their ids stay unique
    saved: dict[int, list] = {}  # node id -> [(block key, label)]
    children: dict[int, list] = {}
    budget = _MAX_GRAPH_VISITS
    for head, root in heads:
        reached: dict = {}
        seen: set[int] = set()
        pending = [root]
        while pending and budget > 0:
            node = pending.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            budget -= 1
            node_id = id(node)
            if node_id not in nodes:
                nodes[node_id] = node
                saved[node_id] = [
                    (key, f"{type(node).__name__}.{name}")
                    for name, tensor in _saved_tensors(node)
                    if (key := _tensor_block(index, tensor)) is not None
                ]
                try:
                    children[node_id] = [child for child, _ in node.next_functions if child is not None]
                except Exception:  # noqa: BLE001
                    children[node_id] = []
            for key, label in saved[node_id]:
                reached.setdefault(key, label)
            pending.extend(children[node_id])
        for key, label in reached.items():
            found[key].append((head, (("graph", label),)))




# --- TorchScript modules ---------------------------------------------------------------


def _script_module_types() -> tuple:
    jit = sys.modules.get("torch.jit")
    cls = getattr(jit, "RecursiveScriptModule", None) if jit is not None else None
    return (cls,) if cls is not None else ()


def _script_tensors(module, depth: int = 0) -> Iterable[tuple[str, object]]:
    """``(attribute path, tensor)`` for the tensors a TorchScript module holds in C++:
    its attributes (a scripted torchmetrics ``Metric`` keeps its states there), parameters
    and buffers, and those of its submodules."""
    concrete = getattr(module, "_concrete_type", None)
    names = list(concrete.get_attributes()) if concrete is not None else []
    for name in names:
        try:
            value = getattr(module, name)
        except Exception:  # noqa: BLE001 - attributes TorchScript cannot hand to Python
            continue
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        for item in values:
            if isinstance(item, torch.Tensor):
                yield name, item
    try:
        for name, tensor in module.named_buffers(recurse=False):
            yield name, tensor
        for name, tensor in module.named_parameters(recurse=False):
            yield name, tensor
        children = list(module.named_children()) if depth < 8 else []
    except Exception:  # noqa: BLE001
        children = []
    for child_name, child in children:
        for name, tensor in _script_tensors(child, depth + 1):
            yield f"{child_name}.{name}", tensor


def script_module_starts(index: BlockIndex, objects: Iterable) -> dict:
    """For blocks held by TorchScript modules among ``objects``: ``(module, suffix)`` start
    points, the suffix saying which attribute of the module (held in C++) uses the block."""
    found: dict = defaultdict(list)
    types_ = _script_module_types()
    if not types_ or not len(index):
        return found
    script_type = types_[0]
    wanted = {cls for cls in _exact_types(objects) if issubclass(cls, script_type)}
    for obj in _of_exact_types(objects, wanted):
        for name, tensor in _script_tensors(obj):
            key = _tensor_block(index, tensor)
            if key is not None and all(start is not obj for start, _ in found[key]):
                found[key].append((obj, (("script", name),)))
    return found
