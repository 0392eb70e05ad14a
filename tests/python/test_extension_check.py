"""torchmem._C runs only with the torch it was built against, and says so when it is not.

The extension records what it was built for (torch release, CUDA version, Python);
loading it through the package compares that with the running process and, on a
mismatch, raises an ImportError that names both and the command that rebuilds it.
"""

from __future__ import annotations

import sys

import pytest
import torch

import torchmem
from torchmem._support import extension


def test_the_built_extension_records_the_running_torch_cuda_and_python():
    from torchmem import _C

    built = _C.build_info
    assert built["torch"] == torch.__version__.split("+")[0]
    assert built["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    if torch.version.cuda is not None and built["cuda"] != "none":
        assert built["cuda"].split(".")[0] == torch.version.cuda.split(".")[0]
    assert extension.mismatches(built, extension.running()) == []


def test_the_marker_in_the_file_says_the_same_as_the_loaded_module():
    from torchmem import _C

    assert extension.read_marker(__import__("pathlib").Path(_C.__file__)) == {
        key: _C.build_info[key] for key in ("torch", "cuda", "python")
    }


def test_another_torch_release_is_refused_with_both_versions_and_the_rebuild_command():
    built = dict(extension.running(), torch="2.9.1")
    if built["torch"] == extension.running()["torch"]:
        built["torch"] = "2.15.0"
    with pytest.raises(ImportError) as raised:
        extension.check(built)
    message = str(raised.value)
    assert f"built against {built['torch']}, running {extension.running()['torch']}" in message
    assert "Rebuild torchmem against the torch in use:" in message
    assert sys.executable in message


def test_another_cuda_major_or_python_is_refused():
    now = {"torch": "2.14.1", "cuda": "13.0", "python": "3.11"}
    assert extension.mismatches({**now, "cuda": "12.8"}, now) == [
        "CUDA: built with CUDA 12.8, this torch uses CUDA 13.0"
    ]
    assert extension.mismatches({**now, "python": "3.12"}, now) == ["Python: built for 3.12, running 3.11"]
    # A CUDA minor version apart loads the same libcudart; a CPU-only torch has none to match.
    assert extension.mismatches({**now, "cuda": "13.2"}, now) == []
    assert extension.mismatches(now, {**now, "cuda": "none"}) == []


def test_the_package_loads_the_extension_through_the_check(monkeypatch):
    assert torchmem._C is extension.load()
