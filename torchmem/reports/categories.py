"""Memory by what it is: parameters, gradients, optimizer state, activations, other.

    model = Net().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    torchmem.track(model, optimizer)       # from here on, reports split memory by category
    ...
    print(torchmem.summary())              # categories (and per module) beside the tags

Once a model or an optimizer is named, the categories follow without the user opening
tags, through forward, backward and optimizer steps:

``parameters``       the storages of the tracked modules' parameters and buffers;
``gradients``        the storages of their ``.grad`` (and of any tensor in an optimizer's
                     parameter groups), wherever backward put them;
``optimizer_state``  every tensor in a tracked optimizer's ``state`` (Adam's moments, the
                     step counters, momentum buffers);
``activations``      tensors autograd saved for backward during a tracked module's forward,
                     until backward (or dropping the graph) releases them;
``other``            the rest of the memory in use: inputs, outputs not saved for backward,
                     temporaries, anything untracked code holds.

How it stays cheap. Parameters, gradients and optimizer state are not followed
allocation by allocation: they are found by their storages' data pointers when a report
or a sample asks (a walk over the tracked objects' tensors, tens of microseconds for a
few hundred parameters). Activations are seen through autograd's saved-tensor hooks
(``torch.autograd.graph.saved_tensors_hooks``), pushed only while a tracked module's
forward runs: each saved tensor is wrapped in a small object that records its storage
and the innermost tracked module running when it was saved, and that forgets it when
autograd releases it. A storage in two categories counts once, in the first of the order
above (a weight saved for backward is a parameter).

Bytes are the storages' sizes (what was requested), per device; ``other`` is the rest of
the engine's requested bytes in use on that device, so the categories of a device add up
to its memory in use.

Limits, said rather than hidden: tensors saved under another saved-tensor hook that a
library pushes inside the forward (``torch.utils.checkpoint``, CPU offloading) are that
hook's business and count as ``other``; where saved-tensor hooks are disabled
(``torch.autograd.graph.disable_saved_tensors_hooks``) activations are not seen, and
``tracking_notes()`` says so. Tensor subclasses without a plain storage (sparse, nested)
count as ``other``.
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from typing import Iterable, Iterator

import torch

__all__ = [
    "CATEGORIES",
    "PARAMETERS",
    "GRADIENTS",
    "OPTIMIZER_STATE",
    "ACTIVATIONS",
    "OTHER",
    "track",
    "Tracking",
    "is_tracking",
    "category_usage",
    "classify_storages",
    "tracking_notes",
]

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
OTHER = "other"
# In precedence order: a storage that is both counts in the first.
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, OTHER)

# (device name, storage data pointer): one storage, however many tensors view it.
StorageKey = tuple


_Parameter = torch.nn.Parameter
_CUDA_NAMES = [f"cuda:{index}" for index in range(64)]


def _device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"


def _tensor_device_name(tensor) -> str:
    # On every saved tensor of a tracked forward: plain attributes, no torch.device object.
    if tensor.is_cpu:
        return "cpu"
    if tensor.is_cuda:
        index = tensor.get_device()
        return _CUDA_NAMES[index] if index < len(_CUDA_NAMES) else f"cuda:{index}"
    return _device_name(tensor.device)


def _storage_of(tensor) -> tuple[StorageKey, int] | None:
    """(key, bytes) of a tensor's storage; None for tensors without a plain storage."""
    try:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if not pointer:  # meta tensors, empty storages: no memory
            return None
        return (_tensor_device_name(tensor), pointer), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


# --- activations: saved-tensor hooks ----------------------------------------------------


class _Saved:
    """What autograd keeps in place of a saved tensor while tracking: the tensor itself,
    and a registry entry that lives exactly as long as autograd keeps this object."""

    __slots__ = ("tensor", "_registry", "__weakref__")

    def __init__(self, tensor, registry: dict, entry: tuple):
        self.tensor = tensor
        self._registry = registry
        # dict assignment and pop are single operations under the GIL: the release below
        # may run on an autograd worker thread while the forward saves more.
        registry[id(self)] = entry

    def __del__(self):
        self._registry.pop(id(self), None)


class _ModuleStack(threading.local):
    def __init__(self):
        self.names: list[str] = []


class Tracking:
    """The models and optimizers :func:`track` follows. ``stop()`` (or leaving it as a
    context manager) removes every hook it added; the objects are held weakly, so tracking
    never keeps a model alive."""

    def __init__(self, objects: Iterable, *, activations: bool, modules: bool = True):
        self._modules: list[tuple[weakref.ref, str]] = []
        self._optimizers: list[weakref.ref] = []
        self._handles: list = []
        self._saved: dict[int, tuple] = {}  # id(_Saved) -> (storage key, bytes, module name)
        self._stack = _ModuleStack()
        self._depth = threading.local()
        self._activations = activations
        # Submodules' hooks only name the module that saved an activation: without
        # activations, or with modules=False, the root's hooks are all there is.
        self._per_module = modules and activations
        self.notes: list[str] = []
        self._hook_contexts: list = []
        roots: dict[str, int] = defaultdict(int)
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                root = type(obj).__name__
                roots[root] += 1
                if roots[root] > 1:
                    root = f"{root}#{roots[root]}"
                self._add_module(obj, root)
            elif isinstance(obj, torch.optim.Optimizer):
                self._add_optimizer(obj)
            else:
                self.stop()
                raise TypeError(
                    f"torchmem.track: expected torch.nn.Module or torch.optim.Optimizer objects, got "
                    f"{type(obj).__name__}"
                )

    # --- setting up ---------------------------------------------------------------------

    def _add_module(self, model: torch.nn.Module, root: str) -> None:
        self._modules.append((weakref.ref(model), root))
        for name, module in model.named_modules() if self._per_module else [("", model)]:
            label = f"{root}.{name}" if name else root
            self._handles.append(module.register_forward_pre_hook(self._entering(label, module is model)))
            self._handles.append(
                module.register_forward_hook(self._leaving(module is model), always_call=True)
            )

    def _add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizers.append(weakref.ref(optimizer))
        # After backward and before the step: gradients are there, activations are gone.
        self._handles.append(optimizer.register_step_pre_hook(lambda *_: _sample("optimizer step")))
        self._handles.append(optimizer.register_step_post_hook(lambda *_: _sample("after optimizer step")))

    def _entering(self, label: str, is_root: bool):
        def pre_hook(module, args):
            self._stack.names.append(label)
            if is_root and self._activations:
                depth = getattr(self._depth, "value", 0)
                self._depth.value = depth + 1
                if depth == 0:
                    self._push_saved_tensor_hooks()
            return None

        return pre_hook

    def _leaving(self, is_root: bool):
        def hook(module, args, output):
            if self._stack.names:
                self._stack.names.pop()
            if is_root and self._activations:
                self._depth.value -= 1
                if self._depth.value == 0:
                    self._pop_saved_tensor_hooks()
                    # The end of a forward: the activations are all there.
                    _sample("forward")
            return None

        return hook

    def _push_saved_tensor_hooks(self) -> None:
        context = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        try:
            context.__enter__()
        except RuntimeError as error:  # hooks disabled by the code running (e.g. a compiler)
            note = f"activations not seen in some forwards: saved-tensor hooks are disabled there ({error})"
            if note not in self.notes:
                self.notes.append(note)
            context = None
        self._hook_contexts.append(context)

    def _pop_saved_tensor_hooks(self) -> None:
        context = self._hook_contexts.pop() if self._hook_contexts else None
        if context is not None:
            context.__exit__(None, None, None)

    def _pack(self, tensor):
        if isinstance(tensor, _Parameter) or isinstance(tensor._base, _Parameter):
            # A weight saved for backward (a Linear saves its weight's transpose, a view)
            # is not memory kept alive for backward: it is a parameter whether saved or not,
            # and counts as one (the order of CATEGORIES). Not wrapping it halves the work
            # of a Linear's forward.
            return tensor
        found = _storage_of(tensor)
        if found is None:
            return tensor
        key, nbytes = found
        module = self._stack.names[-1] if self._stack.names else None
        return _Saved(tensor, self._saved, (key, nbytes, module))

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    # --- reading ------------------------------------------------------------------------

    def storages(self) -> Iterator[tuple[StorageKey, int, str, str | None]]:
        """(storage key, bytes, category, module) for every storage tracked now, a storage
        possibly more than once (the caller keeps the first)."""
        module_of_parameter: dict[int, str] = {}
        for model_ref, root in self._modules:
            model = model_ref()
            if model is None:
                continue
            named = list(model.named_parameters(remove_duplicate=True))
            for name, parameter in named:
                owner = name.rpartition(".")[0]
                label = f"{root}.{owner}" if owner else root
                module_of_parameter[id(parameter)] = label
                found = _storage_of(parameter)
                if found is not None:
                    yield found[0], found[1], PARAMETERS, label
            for name, buffer in model.named_buffers(remove_duplicate=True):
                owner = name.rpartition(".")[0]
                found = _storage_of(buffer)
                if found is not None:
                    yield found[0], found[1], PARAMETERS, f"{root}.{owner}" if owner else root
            for name, parameter in named:
                if parameter.grad is not None:
                    found = _storage_of(parameter.grad)
                    if found is not None:
                        yield found[0], found[1], GRADIENTS, module_of_parameter[id(parameter)]
        for optimizer_ref in self._optimizers:
            optimizer = optimizer_ref()
            if optimizer is None:
                continue
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    label = module_of_parameter.get(id(parameter))
                    if parameter.grad is not None:
                        found = _storage_of(parameter.grad)
                        if found is not None:
                            yield found[0], found[1], GRADIENTS, label
            for parameter, state in list(optimizer.state.items()):
                label = module_of_parameter.get(id(parameter))
                values = state.values() if isinstance(state, dict) else ()
                for value in list(values):
                    if isinstance(value, torch.Tensor):
                        found = _storage_of(value)
                        if found is not None:
                            yield found[0], found[1], OPTIMIZER_STATE, label
        for key, nbytes, module in list(self._saved.values()):
            yield key, nbytes, ACTIVATIONS, module

    def stop(self) -> None:
        """Removes every hook this tracking added (activations saved meanwhile are still
        released normally)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._hook_contexts:
            self._pop_saved_tensor_hooks()
        with _registry_lock:
            if self in _trackings:
                _trackings.remove(self)

    def __enter__(self) -> "Tracking":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


_registry_lock = threading.Lock()
_trackings: list[Tracking] = []


def track(*objects, activations: bool = True, modules: bool = True) -> Tracking:
    """Splits memory by category (parameters, gradients, optimizer state, activations,
    other), per module, for the given models (``torch.nn.Module``) and optimizers.

    Returns a :class:`Tracking`; ``stop()`` it (or use ``with torchmem.track(...):``) to
    remove its hooks. ``activations=False`` leaves autograd's saved tensors alone (no
    saved-tensor hooks): activations then count as ``other``. ``modules=False`` hooks the
    models only, not each submodule: activations count under the model's name, and a
    tracked forward costs a hook pair per model instead of per submodule (about 12 us a
    Linear layer per step, ``benchmarks/track_cost.py``). Several calls combine.
    """
    if not objects:
        raise TypeError("torchmem.track: name at least one model (torch.nn.Module) or optimizer")
    tracking = Tracking(objects, activations=activations, modules=modules)
    with _registry_lock:
        _trackings.append(tracking)
    return tracking


def is_tracking() -> bool:
    """True while some :func:`track` is active."""
    return bool(_trackings)


def tracking_notes() -> list[str]:
    """What the active trackings could not see (each note says why)."""
    return [note for tracking in list(_trackings) for note in tracking.notes]


def classify_storages() -> dict[StorageKey, tuple[str, str | None, int]]:
    """``{(device, data pointer): (category, module, bytes)}`` for every storage tracked now (the
    first category in :data:`CATEGORIES` order wins); empty when nothing is tracked."""
    out: dict[StorageKey, tuple[str, str | None, int]] = {}
    for tracking in list(_trackings):
        for key, nbytes, category, module in tracking.storages():
            if key not in out:
                out[key] = (category, module, nbytes)
    return out


def category_usage(in_use: dict[str, int]) -> dict[str, dict]:
    """Bytes per category (and per module and category) on each device named in ``in_use``.

    ``in_use``: ``{device name: requested bytes in use}`` (the engines' figures); ``other``
    is what the tracked categories leave of it. Returns ``{device: {"categories": {category:
    bytes}, "modules": {module: {category: bytes}}}}``; empty when nothing is tracked.
    """
    if not _trackings:
        return {}
    categories: dict[str, dict[str, int]] = {device: dict.fromkeys(CATEGORIES, 0) for device in in_use}
    modules: dict[str, dict[str, dict[str, int]]] = {device: {} for device in in_use}
    for (device, _), (category, module, nbytes) in classify_storages().items():
        if device not in categories:
            continue  # a device torchmem does not serve: not part of its memory
        categories[device][category] += nbytes
        if module is not None:
            per_module = modules[device].setdefault(module, {})
            per_module[category] = per_module.get(category, 0) + nbytes
    for device, total in in_use.items():
        tracked = sum(categories[device][category] for category in CATEGORIES if category != OTHER)
        categories[device][OTHER] = max(0, total - tracked)
    return {device: {"categories": categories[device], "modules": modules[device]} for device in in_use}


def _sample(label: str) -> None:
    """Records a timeline sample at a moment tracking knows is interesting (end of a
    forward, before and after an optimizer step), when a timeline is being recorded."""
    from torchmem.reports import timeline

    timeline.sample_if_recording(label)
