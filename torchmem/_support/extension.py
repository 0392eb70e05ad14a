"""Loading torchmem._C, with a clear error when it was built for another torch.

A C++ extension runs only with the torch whose headers and libraries it was built
against: c10's classes and symbols change between releases, and a torch built with
CUDA 12 loads libcudart.so.12 where a module built with CUDA 13 needs libcudart.so.13.
Run with another torch, the module fails to load with an undefined symbol, or loads
and misbehaves. So the package loads ``_C`` only through :func:`load` (the package's
``__getattr__`` routes ``from torchmem import _C`` here), which compares what the
module was built for (``_C.build_info``) with the torch, CUDA and Python running,
and raises :class:`ExtensionMismatchError` naming both and the command that rebuilds
it. When the loader refuses the module outright, the same facts are read from the
file itself: the module embeds them as one marker string.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import torch

# Written by csrc/torchmem/python/build_info.cc; keep the two in step.
_MARKER = re.compile(rb"torchmem-build-info: torch=([^ ;]+) cuda=([^ ;]+) python=([^ ;]+);")


class ExtensionMismatchError(ImportError):
    """torchmem._C was built for another torch, CUDA or Python than the one running."""


def running() -> dict[str, str]:
    """The versions of the running process, in build_info's terms."""
    return {
        "torch": torch.__version__.split("+")[0],
        "cuda": torch.version.cuda or "none",
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def mismatches(built: dict[str, str], now: dict[str, str]) -> list[str]:
    """What differs between a build and the running process, as readable lines.

    torch must be the same release (X.Y.Z); CUDA the same major version (the libcudart
    SONAME), unless the running torch has no CUDA; Python the same minor version.
    """
    problems = []
    if built["torch"] != now["torch"]:
        problems.append(f"torch: built against {built['torch']}, running {now['torch']}")
    if now["cuda"] != "none" and built["cuda"] != "none":
        if built["cuda"].split(".")[0] != now["cuda"].split(".")[0]:
            problems.append(f"CUDA: built with CUDA {built['cuda']}, this torch uses CUDA {now['cuda']}")
    if built["python"] != now["python"]:
        problems.append(f"Python: built for {built['python']}, running {now['python']}")
    return problems


def rebuild_command() -> str:
    """The command that rebuilds torchmem._C against the torch running now."""
    python = sys.executable
    root = Path(__file__).resolve().parents[2]
    if (root / "setup.py").is_file() and (root / "CMakeLists.txt").is_file():
        return (f"{python} -m pip install --no-build-isolation -e {root}   "
                f"(or, to rebuild in place only: cd {root} && {python} setup.py build_ext --inplace)")
    return (f"{python} -m pip install --no-build-isolation --no-deps --force-reinstall "
            "<torchmem source directory>")


def _error(built: dict[str, str], problems: list[str], what: str) -> ExtensionMismatchError:
    lines = [f"torchmem: {what}: torchmem._C was built for torch {built['torch']} "
             f"(CUDA {built['cuda']}, Python {built['python']}), but this process runs torch "
             f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}, Python {running()['python']})."]
    lines += [f"  {problem}" for problem in problems]
    lines.append(f"Rebuild torchmem against the torch in use: {rebuild_command()}")
    return ExtensionMismatchError("\n".join(lines))


def check(built: dict[str, str]) -> None:
    """Raises ExtensionMismatchError if `built` does not fit the running process."""
    problems = mismatches(built, running())
    if problems:
        raise _error(built, problems, "extension built for another torch")


def read_marker(path: Path) -> dict[str, str] | None:
    """build_info as embedded in an extension file, without loading it."""
    try:
        match = _MARKER.search(path.read_bytes())
    except OSError:
        return None
    if match is None:
        return None
    torch_version, cuda, python = (part.decode() for part in match.groups())
    return {"torch": torch_version, "cuda": cuda, "python": python}


def _builds_on_disk() -> list[Path]:
    package = Path(__file__).resolve().parents[1]
    return sorted(package.glob("_C.*.so")) + sorted(package.glob("_C.so"))


def load() -> ModuleType:
    """Imports torchmem._C and checks it fits the running torch, CUDA and Python."""
    try:
        module = importlib.import_module("torchmem._C")
    except ImportError as error:
        # Refused by the loader (or absent for this Python): say what is on disk.
        for path in _builds_on_disk():
            built = read_marker(path)
            if built is not None:
                problems = mismatches(built, running())
                if problems or not isinstance(error, ModuleNotFoundError):
                    raise _error(built, problems or [f"loading {path.name} failed: {error}"],
                                 "cannot load the extension") from error
        raise ImportError(
            f"torchmem: the extension torchmem._C is not built for this Python and torch ({error}); "
            f"build it: {rebuild_command()}") from error
    check(module.build_info)
    return module
