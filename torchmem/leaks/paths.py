"""Naming how objects hold each other: reference labels and the paths they render to.

``edge_labels(parent, child)`` says how one object refers to another (a dict item, a list
index, an attribute, a closure cell, ...); ``render_path`` turns a chain of labels into the
Python expression a user would type, e.g. ``trainer.state.eval_metrics['acc'].tp``.
"""

from __future__ import annotations

import functools
import gc
import sys
import types
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from torchmem.leaks.frame_locals import local_items


@dataclass(frozen=True)
class Owner:
    """One way a block is held.

    ``kind`` is ``"global"`` (module global), ``"class"`` (class attribute), ``"local"``
    (a live frame's local; ``location`` is its file:line), ``"cycle"`` (an object in an
    unreachable reference cycle), or ``"unnamed"`` (the search ended before a named root;
    the path starts at the outermost object it reached).
    """

    path: str
    kind: str
    location: str | None = None

    def to_dict(self) -> dict:
        """Plain data for JSON."""
        return {"path": self.path, "kind": self.kind, "location": self.location}



# --- how one object refers to another --------------------------------------------------


def _proxy_wraps(proxy, mapping: dict) -> bool:
    """True if a class's mappingproxy shows ``mapping`` (the class's own dict)."""
    if len(proxy) != len(mapping):
        return False
    return all(proxy.get(key, _MISSING) is value for key, value in list(mapping.items())[:4])


_MISSING = object()
_GENERATOR_FRAMES = (
    (types.GeneratorType, "gi_frame"),
    (types.CoroutineType, "cr_frame"),
    (types.AsyncGeneratorType, "ag_frame"),
)


def edge_labels(parent, child) -> list[tuple]:
    """How ``parent`` refers to ``child``, as labels ``render_path`` turns into Python:
    ``("item", key)``, ``("index", i)``, ``("attr", name)``, ``("dictof",)`` (the
    parent's ``__dict__``), ``("local", name)``, ``("key",)``, ``("member",)``, ``("call",
    arguments)`` (a result an ``lru_cache`` keeps), or ``("via", child type)`` when the
    reference is internal to C code."""
    if _LRU_CACHE_WRAPPER is not None and isinstance(parent, _LRU_CACHE_WRAPPER):
        labels = _lru_cache_labels(parent, child)
        if labels:
            return labels
    if isinstance(parent, dict):
        for key, value in dict.items(parent):
            if value is child:
                return [("item", key)]
        for key in dict.keys(parent):
            if key is child:
                return [("key",)]
    elif isinstance(parent, (list, tuple, deque)):
        fields = getattr(type(parent), "_fields", None)  # namedtuple: name the field
        for position, value in enumerate(list(parent) if isinstance(parent, deque) else parent):
            if value is child:
                if fields is not None and position < len(fields):
                    return [("attr", fields[position])]
                return [("index", position)]
    elif isinstance(parent, (set, frozenset)):
        return [("member",)]
    elif isinstance(parent, types.FrameType):
        if parent.f_back is child:  # a frame keeps its caller alive
            return [("caller", frame_name(child))]
        for name, value in local_items(parent):
            if value is child:
                return [("local", name)]
    for kind, attribute in _GENERATOR_FRAMES:
        if isinstance(parent, kind):
            frame = getattr(parent, attribute)
            if frame is not None:
                for name, value in local_items(frame):
                    if value is child:
                        return [("local", name)]
    if _is_ndarray(parent) and getattr(parent, "base", None) is child:
        return [("attr", "base")]
    for attribute in _known_attributes(parent):
        try:
            if getattr(parent, attribute) is child:
                return [("attr", attribute)]
        except Exception:  # noqa: BLE001
            continue
    labels = _instance_labels(parent, child)
    return labels if labels else [("via", type(child).__qualname__)]


# --- functools.lru_cache / functools.cache ------------------------------------------------
# The wrapper keeps its results in C: an unbounded cache in a dict {key: result} the wrapper
# refers to, a bounded one in links (key, result) that its traversal visits in turn. A kept
# result is named as the call that made it: ``module.load(300)``.

_LRU_CACHE_WRAPPER = getattr(functools, "_lru_cache_wrapper", None)
_LRU_CACHE_WRAPPER = _LRU_CACHE_WRAPPER if isinstance(_LRU_CACHE_WRAPPER, type) else None


def _lru_cache_labels(wrapper, child) -> list[tuple]:
    try:
        own = object.__getattribute__(wrapper, "__dict__")
    except AttributeError:
        own = None
    referents = gc.get_referents(wrapper)
    caches = [item for item in referents if type(item) is dict and item is not own]
    if len(caches) != 1:
        return []
    (cache,) = caches
    typed = bool(getattr(wrapper, "cache_parameters", dict)().get("typed", False))
    if child is cache:
        return [("cache", typed)]
    link_types = {type(value) for value in list(cache.values())[:1]}
    for position, item in enumerate(referents):
        if item is not child or position == 0:
            continue
        key = referents[position - 1]
        if type(key) in link_types and position >= 2:
            key = referents[position - 2]
        try:
            if key in cache:
                return [("call", call_arguments(key, typed))]
        except TypeError:  # an unhashable neighbour: not a key
            continue
    return []


def call_arguments(key, typed: bool = False) -> str:
    """The arguments of the call an ``lru_cache`` key stands for, as Python: ``300``,
    ``301, scale=2.0`` (positional arguments, then ``name=value``; ``typed`` caches add the
    arguments' types at the end, which are left out)."""
    if not isinstance(key, (tuple, list)):
        return _argument(key)  # one int or str argument is its own key
    parts = list(key)
    mark = next((index for index, part in enumerate(parts) if type(part) is object), None)
    if mark is None:
        positional, keywords = parts, []
        if typed:
            positional = positional[:len(positional) // 2]
    else:
        positional, keywords = parts[:mark], parts[mark + 1:]
        if typed:
            count = (len(keywords) - len(positional)) // 3
            keywords = keywords[:2 * count]
    texts = [_argument(value) for value in positional]
    texts += [f"{keywords[index]}={_argument(keywords[index + 1])}" for index in range(0, len(keywords) - 1, 2)]
    return ", ".join(texts)


def _argument(value) -> str:
    if isinstance(value, (str, int, float, bool, bytes, type(None))):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"<{type(value).__qualname__}>"


def _is_ndarray(obj) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(obj, numpy.ndarray)


def _known_attributes(parent) -> tuple[str, ...]:
    if isinstance(parent, types.CellType):
        return ("cell_contents",)
    if isinstance(parent, types.MethodType):
        return ("__self__", "__func__")
    if isinstance(parent, types.FunctionType):
        return ("__closure__", "__defaults__", "__kwdefaults__", "__globals__")
    if isinstance(parent, functools.partial):
        return ("func", "args", "keywords")
    if isinstance(parent, property):
        return ("fget", "fset", "fdel")
    if isinstance(parent, (staticmethod, classmethod)):
        return ("__func__",)
    return ()


def _instance_labels(parent, child) -> list[tuple]:
    try:
        namespace = object.__getattribute__(parent, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__, or a class that hides it
        namespace = None
    if isinstance(namespace, dict):
        if namespace is child:
            return [("dictof",)]
        for name, value in dict.items(namespace):
            if value is child:
                return [("attr", name)]
    elif isinstance(namespace, types.MappingProxyType):  # a class: its dict hides behind a proxy
        if isinstance(child, dict) and _proxy_wraps(namespace, child):
            return [("dictof",)]
        for name, value in namespace.items():
            if value is child:
                return [("attr", name)]
    for cls in type(parent).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            descriptor = cls.__dict__.get(slot)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    if descriptor.__get__(parent, cls) is child:
                        return [("attr", slot)]
                except AttributeError:  # an unset slot
                    continue
    return []


_MODULE_CONTAINERS = ("_parameters", "_buffers", "_modules")  # nn.Module: model.weight, not model._parameters['weight']


def _format_key(key) -> str:
    if isinstance(key, (str, int, float, bool, bytes)) or key is None:
        text = repr(key)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(key, tuple) and all(isinstance(part, (str, int, float, bool)) for part in key):
        return repr(key)
    return f"<{type(key).__qualname__}>"


def frame_name(frame: types.FrameType) -> str:
    """``main() [train.py:49]``: a frame as a report names it."""
    from torchmem._support.files import short_path

    return f"{frame.f_code.co_name}() [{short_path(frame.f_code.co_filename)}:{frame.f_lineno}]"


def object_name(obj) -> str:
    """The name of an object a path starts from: ``<Type>``, or the frame's function."""
    if isinstance(obj, types.FrameType):
        return f"<frame of {frame_name(obj)}>"
    return f"<{type(obj).__name__}>"


def _normalize(labels: list[tuple]) -> list[tuple]:
    """Collapses ``__dict__['name']`` into ``.name`` and nn.Module's ``._parameters['w']``
    (``_buffers``, ``_modules``) into ``.w`` (``[0]`` for Sequential's numbered children),
    and a run of callers (frame -> its caller -> ...) into one hop naming the last."""
    out: list[tuple] = []
    for label in labels:
        if label[0] == "caller" and out and out[-1][0] == "callers":
            out[-1] = ("callers", out[-1][1] + 1, label[1])
            continue
        if label[0] == "caller":
            out.append(("callers", 1, label[1]))
            continue
        if label[0] == "item" and out and out[-1][0] == "cache":  # an unbounded lru_cache's dict
            out[-1] = ("call", call_arguments(label[1], out[-1][1]))
            continue
        if label[0] == "item" and out and isinstance(label[1], str):
            previous = out[-1]
            if previous[0] == "dictof" and label[1].isidentifier():
                out[-1] = ("attr", label[1])
                continue
            if previous[0] == "attr" and previous[1] in _MODULE_CONTAINERS:
                if label[1].isidentifier():
                    out[-1] = ("attr", label[1])
                    continue
                if label[1].isdigit():
                    out[-1] = ("index", int(label[1]))
                    continue
        out.append(label)
    return out


def render_path(base: str, labels: Iterable[tuple]) -> str:
    """``render_path('trainer', [("attr", "state"), ("item", "acc")])`` -> ``trainer.state['acc']``."""
    out = base
    for label in _normalize(list(labels)):
        kind = label[0]
        if kind == "dictof":
            out += ".__dict__"
        elif kind == "attr":
            name = label[1]
            out += f".{name}" if isinstance(name, str) and name.isidentifier() else f".__dict__[{name!r}]"
        elif kind == "item":
            out += f"[{_format_key(label[1])}]"
        elif kind == "index":
            out += f"[{label[1]}]"
        elif kind == "local":
            out += f":{label[1]}"
        elif kind == "call":
            out += f"({label[1]})"
        elif kind == "cache":  # the cache dict itself, nothing below it
            out += ".<cache>"
        elif kind == "key":
            out += ".<key>"
        elif kind == "member":
            out += ".<member>"
        elif kind == "graph":
            out += f" (in its autograd graph: {label[1]})"
        elif kind == "script":
            out += f" (in its TorchScript module: {label[1]})"
        elif kind == "callers":  # frames keeping their callers alive, down to label[2]
            hops = f"{label[1]} frames out" if label[1] > 1 else "its caller"
            out += f" -> ({hops}) {label[2]}"
        else:  # "via": a reference held inside C code
            out += f" -> <{label[1]}>"
    return out


