"""Where a training step ends, found without changing the script: ``run``'s growth check.

A leak in a training loop shows as live memory that rises step after step; at exit it is
often gone (the script's globals are released first), so ``run`` samples memory at the end
of every step with a ``torchmem.GrowthMonitor`` and reports what grew per step. Steps are:

* every ``torch.optim.Optimizer.step()`` (PyTorch's global optimizer step post-hook,
  ``torch.optim.optimizer.register_optimizer_step_post_hook``, in every supported torch),
  so plain loops, Lightning and HF Trainer are covered with no change; or
* every return of the functions named with ``--step-on module:function`` (or
  ``module:Class.method``; ``__main__`` or the script's own module name for the script's
  functions), for loops without a torch optimizer or with several optimizers per step.
  ``--step-on`` replaces the optimizer hook.

A function of another module is wrapped where the module defines it, when the module is
imported (or at once if it already is): code that copied the function before that (``from
m import f`` run earlier) calls the unwrapped one. A function of the script itself is
wrapped as the script defines it (``run`` compiles the script, and gives the definition a
decorator).
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import sys

SCRIPT_MODULES = ("__main__",)


class StepSpecError(ValueError):
    """A ``--step-on`` value that is not ``module:function``."""


def parse_step_on(spec: str) -> tuple[str, tuple[str, ...]]:
    """``"pkg.mod:Class.method"`` -> ``("pkg.mod", ("Class", "method"))``."""
    module, sep, attribute = spec.partition(":")
    parts = tuple(attribute.split(".")) if attribute else ()
    if not sep or not module or not parts or not all(part.isidentifier() for part in parts) or not all(
        piece.isidentifier() for piece in module.split(".")
    ):
        raise StepSpecError(
            f"--step-on {spec}: expected module:function or module:Class.method "
            "(e.g. --step-on train:train_step, or __main__:train_step for the script's own function)"
        )
    return module, parts


class StepWatcher:
    """Calls ``on_step()`` at the end of every training step (see the module docstring)."""

    def __init__(self, on_step, step_on: list[str] = (), script_module: str | None = None):
        self.on_step = on_step
        self.targets = [parse_step_on(spec) for spec in step_on]
        # The names the script's functions are reached by: __main__, or the -m module's name.
        self.script_names = set(SCRIPT_MODULES) | ({script_module} if script_module else set())
        self.steps = 0
        self.source = "optimizer" if not self.targets else "--step-on"
        self.unresolved: dict[str, str] = {}  # spec -> why it was not wrapped (reported at exit)
        self._hook = None
        self._finder = None
        self._depth = 0  # nested calls of wrapped functions count once

    # --- the optimizer hook -----------------------------------------------------------
    def start(self) -> None:
        if not self.targets:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self._step())
            return
        pending = []
        for module, parts in self.targets:
            if module in self.script_names:
                continue  # wrapped when the script is compiled (decorate_script)
            if module in sys.modules:
                self._wrap(module, parts)
            else:
                pending.append((module, parts))
        if pending:
            self._finder = _WrapOnImport(self, pending)
            sys.meta_path.insert(0, self._finder)
            for module, parts in pending:
                self.unresolved[_spec(module, parts)] = f"module {module} was never imported"

    def stop(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None

    def _step(self) -> None:
        self.steps += 1
        self.on_step()

    # --- --step-on ----------------------------------------------------------------------
    def wrapper(self, function):
        """``function`` wrapped to end a step when its outermost call returns."""

        @functools.wraps(function)
        def step_function(*args, **kwargs):
            self._depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._step()

        return step_function

    def _wrap(self, module_name: str, parts: tuple[str, ...]) -> None:
        spec = _spec(module_name, parts)
        owner = sys.modules[module_name]
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                self.unresolved[spec] = f"{module_name} has no attribute {'.'.join(parts[:-1])}"
                return
        function = getattr(owner, parts[-1], None)
        if not callable(function):
            self.unresolved[spec] = f"{module_name} has no function {'.'.join(parts)}"
            return
        setattr(owner, parts[-1], self.wrapper(function))
        self.unresolved.pop(spec, None)

    def script_decorations(self) -> dict[tuple[str, ...], str]:
        """``{(function,) or (Class, method): spec}`` to wrap in the script's own code."""
        return {parts: _spec(module, parts) for module, parts in self.targets if module in self.script_names}

    def decorate_script(self, tree: ast.Module, namespace_name: str) -> ast.Module:
        """Adds ``@<namespace_name>(...)`` to the script's definitions named by ``--step-on``:
        the definition stays where it is (line numbers unchanged) and is wrapped when defined."""
        wanted = self.script_decorations()
        if not wanted:
            return tree
        found = set()

        def decorate(node, parts):
            if parts in wanted:
                decorator = ast.Name(id=namespace_name, ctx=ast.Load())
                ast.copy_location(decorator, node)
                node.decorator_list.insert(0, decorator)  # outermost: the step ends after every decorator
                found.add(parts)

        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                decorate(node, (node.name,))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        decorate(item, (node.name, item.name))
        for parts, spec in wanted.items():
            if parts not in found:
                self.unresolved[spec] = f"the script defines no top-level {'.'.join(parts)}"
        return ast.fix_missing_locations(tree)


def _spec(module: str, parts: tuple[str, ...]) -> str:
    return f"{module}:{'.'.join(parts)}"


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps ``--step-on`` functions of a module right after the module is imported."""

    def __init__(self, watcher: StepWatcher, pending: list):
        self.watcher = watcher
        self.pending = {}
        for module, parts in pending:
            self.pending.setdefault(module, []).append(parts)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        # Let the other finders find it, then wrap its loader's exec_module.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        partss = self.pending.pop(name)
        watcher = self.watcher

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                exec_module(module)
                for parts in partss:
                    watcher._wrap(name, parts)

            def __getattr__(self, attribute):  # get_code, get_source, is_package, ... of the real loader
                return getattr(loader, attribute)

        spec.loader = _Loader()
        return spec
