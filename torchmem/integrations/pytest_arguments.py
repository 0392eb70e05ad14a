"""The objects a pytest test was given, as roots a leak check allows memory to be held by.

A test that updates a metric it received from ``@pytest.mark.parametrize`` leaves the
metric's new state in an object pytest keeps for the whole session (the parametrize list
was built when the module was imported); a fixture's value lives as long as its scope.
That memory is held by the test's inputs, not left behind by the code under test. The
plugin passes these objects to the check (``allow_arguments``), which reports such
memory as allowed and names its holder by the module-level object that really keeps it
(``tests.test_x.test_update.pytestmark[0].args[1][0]``), not by pytest's own frames.

A test class's class-scoped setup (unittest's ``setUpClass``, pytest's ``setup_class``) is a
fixture too: the objects it puts on the class are the tests' shared inputs, and a test that
updates one (a stateful miner or metric that keeps its last batch) leaves that state there.
What the class body defined is not: a class-level list a test appends to lives as long as the
module, as a module global would. The two are told apart by a snapshot of the class's
namespace the plugin takes before the class's first test is set up
(``pytest_plugin.pytest_runtest_setup``; ids, not the objects, so it keeps nothing alive).

A test method's own instance (``self``) is an input of the same kind: pytest makes a fresh one
for each test of a class (unittest's ``TestCase(methodName)`` too, whose ``setUp`` runs in the
call phase) and drops it at the test's teardown, so what ``setUp`` or the test put on ``self``
is released with it, after the check.
"""

from __future__ import annotations

import types

from torchmem.leaks.owners import AllowedRoot
from torchmem.leaks.paths import render_path

_PARAMETRIZE_NOTE = (
    "held through the test's argument {name!r}, a @pytest.mark.parametrize value: built when the module was "
    "imported and kept by pytest for the whole session (allow_arguments)"
)
_FIXTURE_NOTE = "held through the test's fixture {name!r} (scope {scope}; allow_arguments)"
_CLASS_SETUP_NOTE = (
    "held through {owner}.{name}, set by the class's setup (setUpClass / setup_class: a class-scoped "
    "fixture; allow_arguments)"
)
_INSTANCE_NOTE = (
    "held through the test's own instance of {owner} (self): pytest makes one per test and drops it at "
    "the test's teardown (allow_arguments)"
)
# Code a class can gain after its body ran (a decorator, a plugin's hook): not state a setup
# gave the tests, and a function would lend its closure's contents an allowance.
_NOT_SETUP_STATE = (types.FunctionType, types.MethodType, classmethod, staticmethod, property, type)
_MAX_DEPTH = 4  # parametrize argvalues: list -> tuple of values -> ParameterSet -> values


def argument_roots(item, *, exclude=(), allowed: bool = True,
                   class_body_before_setup: dict | None = None) -> tuple[AllowedRoot, ...]:
    """An ``AllowedRoot`` per argument of ``item`` (a pytest Function): parametrize values
    named by the module-level object that holds them, fixtures by name and scope, and what
    the class-scoped setup added to the test's class (given ``class_body_before_setup``,
    ``{name: id(value)}`` of the class before that setup). With
    ``allowed=False`` they only name holders (memory they hold still fails the test)."""
    funcargs = getattr(item, "funcargs", None) or {}
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    roots = []
    for name, value in funcargs.items():
        if name in exclude or name == "request" or _is_atom(value):
            continue
        if name in params and params[name] is value:
            path = _parametrize_path(item, value) or f"<parametrize value {name!r} of {item.name}>"
            roots.append(AllowedRoot(path, value, _PARAMETRIZE_NOTE.format(name=name), allowed))
        else:
            note = _FIXTURE_NOTE.format(name=name, scope=_scope(item, name))
            roots.append(AllowedRoot(f"<fixture {name!r}>", value, note, allowed))
    roots.extend(_class_setup_roots(item, class_body_before_setup, allowed))
    roots.extend(_instance_root(item, allowed))
    return tuple(roots)


def _instance_root(item, allowed: bool) -> list[AllowedRoot]:
    """The test's own instance of its class, made for this test alone (pytest's ``instance``;
    read from the item's ``__dict__`` so that asking does not make one)."""
    cls = getattr(item, "cls", None)
    instance = vars(item).get("_instance")
    if cls is None or instance is None or not isinstance(instance, cls):
        return []
    owner = f"{cls.__module__}.{cls.__qualname__}"
    return [AllowedRoot(f"<{owner} instance of {item.name}>", instance, _INSTANCE_NOTE.format(owner=owner), allowed)]


def _class_setup_roots(item, body: dict | None, allowed: bool) -> list[AllowedRoot]:
    """The objects the class-scoped setup put on the test's class (added or replaced since
    ``body``, ``{name: id(value)}`` of the class before that setup), named ``module.Class.attribute``."""
    cls = getattr(item, "cls", None)
    if cls is None or body is None:
        return []
    owner = f"{cls.__module__}.{cls.__qualname__}"
    roots = []
    for name, value in list(vars(cls).items()):
        if body.get(name) == id(value) or _is_atom(value) or isinstance(value, _NOT_SETUP_STATE):
            continue
        note = _CLASS_SETUP_NOTE.format(owner=owner, name=name)
        roots.append(AllowedRoot(f"{owner}.{name}", value, note, allowed))
    return roots


def _is_atom(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes))


def _scope(item, name: str) -> str:
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", {}).get(name) if info is not None else None
    if not definitions:
        return "unknown"
    scope = getattr(definitions[-1], "scope", "unknown")
    return getattr(scope, "value", scope)


def _parametrize_path(item, value) -> str | None:
    """``module.test_fn.pytestmark[i].args[1][j]`` (or the class's or module's marks)
    where the parametrize mark that produced ``value`` keeps it."""
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    cls = getattr(item, "cls", None)
    if module is None:
        return None
    holders = []
    if function is not None:
        holders.append((f"{module.__name__}.{function.__qualname__}", function))
    if cls is not None:
        holders.append((f"{module.__name__}.{cls.__qualname__}", cls))
    holders.append((module.__name__, module))
    for base, holder in holders:
        marks = getattr(holder, "pytestmark", None)
        if marks is None:
            continue
        listed = marks if isinstance(marks, list) else [marks]
        for position, mark in enumerate(listed):
            if getattr(mark, "name", None) != "parametrize":
                continue
            labels = _find(getattr(mark, "args", ()), value, _MAX_DEPTH)
            if labels is not None:
                where = f"{base}.pytestmark[{position}]" if isinstance(marks, list) else f"{base}.pytestmark"
                return render_path(f"{where}.args", labels)
            labels = _find(getattr(mark, "kwargs", {}), value, _MAX_DEPTH)
            if labels is not None:
                where = f"{base}.pytestmark[{position}]" if isinstance(marks, list) else f"{base}.pytestmark"
                return render_path(f"{where}.kwargs", labels)
    return None


def _find(container, value, depth: int) -> list | None:
    """Labels from ``container`` down to ``value`` (identity) through tuples, lists, dicts
    and pytest's ``ParameterSet`` (a namedtuple), or None."""
    if container is value:
        return []
    if depth == 0:
        return None
    if isinstance(container, dict):
        items = [(("item", key), child) for key, child in container.items()]
    elif isinstance(container, (list, tuple)):
        fields = getattr(type(container), "_fields", None)
        items = [
            ((("attr", fields[index]) if fields and index < len(fields) else ("index", index)), child)
            for index, child in enumerate(container)
        ]
    else:
        return None
    for label, child in items:
        below = _find(child, value, depth - 1)
        if below is not None:
            return [label] + below
    return None


__all__ = ["argument_roots"]
