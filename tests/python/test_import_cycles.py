"""Modules that used to import each other (one of the two imports hidden inside a function)
now import in one direction only, and each imports alone in a fresh interpreter (issue 22)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAIRS = [
    ("torchmem.leaks.render", "torchmem.leaks.report"),
    ("torchmem.runtime.devices", "torchmem.runtime.install"),
]


def _runtime_imports(module: str) -> set[str]:
    """Modules ``module`` imports anywhere in its file (inside functions too), except in
    ``if TYPE_CHECKING:`` blocks, which never run."""
    path = os.path.join(ROOT, *module.split(".")) + ".py"
    tree = ast.parse(open(path).read())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for statement in node.body for child in ast.walk(statement))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("first, second", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_the_two_modules_do_not_import_each_other(first, second):
    assert not (second in _runtime_imports(first) and first in _runtime_imports(second))


@pytest.mark.parametrize("module", sorted({name for pair in PAIRS for name in pair}))
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
