"""The owner search reads running functions' locals without keeping them alive, on every
Python torchmem supports (torchmem/leaks/frame_locals.py). Each interpreter on PATH
(python3.10 ... python3.13) runs frame_locals_check.py, which needs no torch."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "torchmem", "leaks", "frame_locals.py")
VERSIONS = ("3.10", "3.11", "3.12", "3.13")


def interpreter(version: str) -> str | None:
    """This Python, a pyenv-installed one, or one on PATH (pyenv's shims answer only for the
    versions its configuration selects, so its installs are looked up directly)."""
    if sys.version.startswith(version + "."):
        return sys.executable
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python")))
        if found:
            return found[-1]
    python = shutil.which(f"python{version}")
    if python and subprocess.run([python, "-c", ""], capture_output=True).returncode == 0:
        return python
    return None


@pytest.mark.parametrize("version", VERSIONS)
def test_reading_another_threads_locals_leaves_nothing_alive(version):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on PATH")
    result = subprocess.run([python, os.path.join(HERE, "frame_locals_check.py"), MODULE],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ") for line in result.stdout.splitlines())
    assert lines["local_items"] == "freed"
    # What the fix is for: before 3.13, plain f_locals leaves a snapshot that keeps it.
    assert lines["f_locals"] == ("kept" if version in ("3.10", "3.11", "3.12") else "freed")
