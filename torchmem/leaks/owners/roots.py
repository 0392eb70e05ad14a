"""Named roots of the owner search: what a path from a block may start with.

A holder is worth reporting when it has a name a reader can find in the code: a module
global (``module.name``), a class attribute (``module.Class.name``), a live frame's local
(``function():name`` with file:line), or an object the caller named (``AllowedRoot``: a
pytest test's parametrize values and fixtures). This module knows those names: which
dicts are module namespaces, which objects are module globals, the locals of every live
frame, and which code is the leak machinery itself or the test runner's (named only as a
last resort).
"""

from __future__ import annotations

import functools
import os
import sys
import types
from collections import defaultdict
from dataclasses import dataclass

from torchmem.leaks.frame_locals import local_items
from torchmem._support.files import short_path
from torchmem.stacks.frames import RUNNER, origin

# The leak machinery itself: the torchmem.leaks package, and the pytest plugin that drives it.
_LEAKS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PYTEST_PLUGIN = os.path.join(os.path.dirname(_LEAKS_DIR.rstrip(os.sep)), "integrations", "pytest_plugin.py")

def is_own_file(filename: str) -> bool:
    """Files of the leak machinery itself, whose frames and locals are never owners."""
    path = os.path.abspath(filename)
    return path.startswith(_LEAKS_DIR) or path == _PYTEST_PLUGIN


def is_runner_file(filename: str) -> bool:
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


module_names = _ModuleNames()

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
global_values = _GlobalValues()


def warm_up() -> None:
    """Indexes the module globals of every module imported so far (tens of milliseconds in a
    large process), so that the first owner search does not pay for it: the pytest plugin
    calls it once collection has imported the test modules."""
    global_values.lookup(global_values)


def global_name(function) -> str | None:
    """``module.qualname`` if that name resolves to ``function`` (or a class), else None."""
    qualname = getattr(function, "__qualname__", "")
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    if module is None or "<" in qualname:
        return None
    value = module
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return f"{module.__name__}.{qualname}" if value is function else None


def class_name(cls: type) -> str:
    """How a report names a class: ``module.Qualname`` when that resolves to it; else the
    module global bound to it (a class made inside a function, ``Registry = make_registry()``);
    else ``module.Qualname`` as Python spells it (``make.<locals>.Registry``)."""
    resolved = global_name(cls)
    if resolved is not None:
        return resolved
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    namespace = getattr(module, "__dict__", None)
    if isinstance(namespace, dict):
        for name, value in list(namespace.items()):
            if value is cls and not name.startswith("__"):
                return f"{module.__name__}.{name}"
    return f"{cls.__module__}.{cls.__qualname__}"


def live_frames() -> list:
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
class LocalRoots:
    """The locals of live frames: ``by_id`` maps id(value) -> [(function, name, file:line)];
    ``runner`` is the same for frames of the test runner's code (named only as a last
    resort); ``values`` lists (root name, location, value) for the downward search."""

    by_id: dict
    runner: dict
    values: list


def read_local_roots(frames: list, ignore: set) -> LocalRoots:
    """The locals of ``frames``, read without leaving snapshots behind (``frame_locals``)."""
    roots: dict[int, list] = defaultdict(list)
    runner: dict[int, list] = defaultdict(list)
    values = []
    for frame in frames:
        ignore.add(id(frame))
        code = frame.f_code
        if is_own_file(code.co_filename):
            continue
        if not (code.co_flags & 0x1):  # CO_OPTIMIZED: module and class bodies are namespaces, not locals
            continue
        function = getattr(code, "co_qualname", code.co_name)
        location = f"{short_path(code.co_filename)}:{frame.f_lineno}"
        target = runner if is_runner_file(code.co_filename) else roots
        for name, value in local_items(frame):
            target[id(value)].append((function, name, location))
            if target is roots:
                values.append((f"{function}():{name}", location, value))
    return LocalRoots(roots, runner, values)


_LRU_CACHE_WRAPPER = getattr(functools, "_lru_cache_wrapper", ())
_LEADS_TO_A_NAME = (type, types.ModuleType, types.FunctionType, types.CellType) + (
    (_LRU_CACHE_WRAPPER,) if isinstance(_LRU_CACHE_WRAPPER, type) else ()
)


def leads_to_a_name(obj) -> bool:
    """True for a referrer that is, or is one step from, a named root: a class, a module, a
    function (globals, defaults, closure), a closure cell, an lru_cache wrapper, a module
    global, a module's namespace, or a class's namespace (a dict with ``__module__``)."""
    if isinstance(obj, _LEADS_TO_A_NAME):
        return True
    if type(obj) is dict:
        return isinstance(obj.get("__module__"), str) or module_names.name_of(obj) is not None
    return global_values.lookup(obj) is not None


def is_runner_module(name: str) -> bool:
    module = sys.modules.get(name)
    filename = getattr(module, "__file__", None)
    return bool(filename) and is_runner_file(filename)

