"""What ``torchmem run`` runs, and running it as ``__main__`` the way ``python`` does.

A script is compiled and executed in a fresh ``__main__`` module; ``-m module`` is found
with :func:`importlib.util.find_spec` (a package runs its ``__main__``), as ``python -m``
finds it. runpy's public functions are not used because they run the code in a temporary
module that is swapped out of ``sys.modules`` when the code returns, and ``run`` needs the
script to stay ``__main__``, with its own globals, until it has reported at exit.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import io
import os
import sys
import traceback
import types
from dataclasses import dataclass


@dataclass
class Target:
    """What to run: a script path or a module name, and the arguments it sees."""

    script: str | None
    module: str | None
    args: list

    @property
    def label(self) -> str:
        return self.script if self.script is not None else f"-m {self.module}"


def code_for(target: Target, transform=None) -> tuple[types.CodeType, dict]:
    """The code object to run and the module attributes ``__main__`` gets, like Python's.

    ``transform(tree) -> tree``, when given, rewrites the program's syntax tree before it is
    compiled (``--step-on`` decorates the script's step function; line numbers are kept).
    Raises OSError for a script that cannot be read, SyntaxError, and ImportError with
    Python's wording for a module that cannot be found or run."""
    if target.script is not None:
        path = os.path.abspath(target.script)
        with io.open_code(path) as file:
            source = file.read()
        # Absolute, as Python 3.9+ makes a script's __file__ and code file names.
        code = _compile(source, path, transform)
        return code, {"__file__": path, "__cached__": None, "__spec__": None, "__package__": None}
    spec, code = _module_code(target.module)
    if transform is not None:
        source = spec.loader.get_source(spec.name) if hasattr(spec.loader, "get_source") else None
        if source is not None:
            code = _compile(source, spec.origin, transform)
    return code, {
        "__file__": spec.origin,
        "__cached__": spec.cached,
        "__spec__": spec,
        "__package__": spec.parent,
        "__loader__": spec.loader,
    }


def _compile(source, path: str, transform) -> types.CodeType:
    if transform is None:
        return compile(source, path, "exec", dont_inherit=True)
    tree = transform(ast.parse(source, path))
    return compile(tree, path, "exec", dont_inherit=True)


def _module_code(name: str):
    """(spec, code) of module ``name`` as ``python -m name`` resolves it."""
    if name.startswith("."):
        raise ImportError("Relative module names not supported")
    try:
        # Imports the parent packages, as python -m does.
        spec = importlib.util.find_spec(name)
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        message = f"Error while finding module specification for {name!r} ({type(error).__name__}: {error})"
        if name.endswith(".py"):
            message += f". Try using '{name[:-3]}' instead of '{name}' as the module name."
        raise ImportError(message) from error
    if spec is None:
        raise ImportError(f"No module named {name}")
    if spec.submodule_search_locations is not None:  # a package: run its __main__
        if name == "__main__" or name.endswith(".__main__"):
            raise ImportError("Cannot use package as __main__ module")
        try:
            return _module_code(f"{name}.__main__")
        except ImportError as error:
            raise ImportError(f"{error}; {name!r} is a package and cannot be directly executed") from None
    loader = spec.loader
    if loader is None or not hasattr(loader, "get_code"):
        raise ImportError(f"{name!r} is a namespace package and cannot be executed")
    code = loader.get_code(name)
    if code is None:
        raise ImportError(f"No code object available for {name}")
    return spec, code


def execute(target: Target, code: types.CodeType, attributes: dict, on_module=None) -> int:
    """Runs ``code`` as ``__main__`` with the target's argv; returns the exit code Python would.

    ``on_module(module)`` is called with the new ``__main__`` before the code runs."""
    module = types.ModuleType("__main__")
    module.__dict__.update(attributes)
    module.__dict__["__builtins__"] = builtins
    if target.script is not None:
        # A script's directory is first on sys.path (python script.py); with -m it stays cwd.
        sys.path[0] = os.path.dirname(os.path.abspath(target.script))
        sys.argv[:] = [target.script, *target.args]
    else:
        sys.argv[:] = [attributes["__file__"] or target.module, *target.args]
    # The script is __main__ while it runs (pickle, multiprocessing and `if __name__ ==
    # "__main__"` depend on it) and stays so until torchmem has reported.
    sys.modules["__main__"] = module
    if on_module is not None:
        on_module(module)
    try:
        exec(code, module.__dict__)
    except SystemExit as exit_:
        return exit_code(exit_)
    except KeyboardInterrupt:
        print_exception(*sys.exc_info())
        return 130  # 128 + SIGINT, what a shell reports for Ctrl-C
    except BaseException:
        print_exception(*sys.exc_info())
        return 1
    return 0


def runner_frame() -> tuple[str, str]:
    """(function name, normalized file) of the frame that executes the script: stacks are cut
    there, so the script's ``<module>`` frame is outermost, as under ``python script.py``."""
    return execute.__name__, _HERE


_HERE = os.path.normcase(os.path.abspath(__file__))


def exit_code(exit_: SystemExit) -> int:
    """What Python exits with for ``SystemExit(code)``."""
    code = exit_.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def print_exception(exc_type, exc, tb) -> None:
    """Prints a traceback as Python would for the script: without torchmem's own frames."""
    while tb is not None and os.path.normcase(os.path.abspath(tb.tb_frame.f_code.co_filename)) == _HERE:
        tb = tb.tb_next
    try:
        sys.excepthook(exc_type, exc.with_traceback(tb), tb)
    finally:
        # The frames of the traceback hold the script's locals (tensors among them); free
        # them now rather than leave them to the garbage collector and the leak report.
        if tb is not None:
            traceback.clear_frames(tb)
        exc.__traceback__ = None


# The name under which ``--step-on`` wraps the script's own step function (a dunder global
# of ``__main__``: kept when the script's globals are released at exit).
STEP_DECORATOR = "__torchmem_step__"
