"""Memory a module allocated while it was imported and keeps in its globals: not a leak.

A library often makes constants when it is imported (``_EPS_SMOOTHING = tensor(1e-16)`` in
torchmetrics' chrf) and keeps them in its module globals for the life of the process. When
the import happens while the script runs (``import torchmetrics`` in the script, or a lazy
import in a library), ``run``'s leak check sees a block allocated inside it and still alive
at exit; it is the library's by design, not the script's leak.

Such a block is recognized by two facts the report already holds: its allocation stack's
innermost module-level frame (``<module>``) is another module's top-level code, i.e. the
block was allocated while that module was being imported; and everything that holds it is
module-level state (a module global or a class attribute), which lives as long as the
process. It is then reported as allowed, "import-time, kept by module globals", naming the
module. Memory the script's own top-level code put into another module (``json.cache =
tensor``) was allocated by the script's ``<module>`` frame and stays a leak.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from torchmem.leaks.kinds import ALLOWED, REACHABLE

# Holders that live as long as the process: module globals and class attributes.
_LASTING_HOLDERS = ("global", "class")


def _normalized(path: str) -> str:
    return os.path.normcase(os.path.abspath(path))


def _module_names() -> dict[str, str]:
    """``{normalized file: module name}`` of the modules imported now."""
    names = {}
    main = sys.modules.get("__main__")
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # The program itself is no import, under any alias (multiprocessing adds __mp_main__).
        if isinstance(path, str) and module is not main and name not in ("__main__", "__mp_main__"):
            names.setdefault(_normalized(path), name)
    return names


def importing_module(finding, main_file: str | None, names: dict[str, str]) -> str | None:
    """The module whose import allocated ``finding``'s block, or None (the script's own code,
    or no stack)."""
    main = _normalized(main_file) if main_file else None
    for frame in finding.frames:  # innermost first
        if frame.name != "<module>" or frame.filename in ("...", ""):
            continue
        path = _normalized(frame.filename)
        if path == main:
            return None
        # Only a module imported under its name counts: the program's own top-level code
        # (the script, or pytest's __main__ under which every test runs) is not an import.
        return names.get(path)
    return None


def _kept_by_module_state(finding) -> bool:
    return finding.kind == REACHABLE and bool(finding.owners) and all(
        owner.kind in _LASTING_HOLDERS for owner in finding.owners
    )


def classify(report, main_file: str | None):
    """``report`` with the import-time blocks kept by module globals reported as allowed."""
    if not any(_kept_by_module_state(finding) for finding in report.findings):
        # The pytest plugin asks after every test; mapping every imported module's file
        # costs tens of milliseconds in a large environment, so only a candidate pays it.
        return report
    names = _module_names()
    findings = []
    changed = False
    for finding in report.findings:
        module = None
        if _kept_by_module_state(finding):
            module = importing_module(finding, main_file, names)
        if module is None:
            findings.append(finding)
            continue
        note = (
            f"import-time, kept by module globals: allocated while {module} was imported, held for the life "
            "of the process (not a leak of the script)"
        )
        findings.append(dataclasses.replace(finding, kind=ALLOWED, note=note))
        changed = True
    return dataclasses.replace(report, findings=findings) if changed else report
