"""Builds torchmem._C with CMake (the build of record) and packages it.

    pip install --no-build-isolation -e .    # editable: _C lands in ./torchmem
    pip install --no-build-isolation .       # regular install

Environment: TORCHMEM_BUILD_TYPE (Release), TORCHMEM_BUILD_DIR (build/python),
TORCHMEM_CMAKE_ARGS (extra -D options), MAX_JOBS (2).
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        output = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("TORCHMEM_BUILD_DIR", ROOT / "build" / "python"))
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('TORCHMEM_BUILD_TYPE', 'Release')}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DTORCHMEM_PYTHON_OUTPUT_DIR={output}",
            "-DTORCHMEM_BUILD_TESTS=OFF", "-DTORCHMEM_BUILD_BENCHMARKS=OFF",
            "-DTORCHMEM_BUILD_SIMCUDA=OFF",
            *shlex.split(os.environ.get("TORCHMEM_CMAKE_ARGS", "")),
        ]
        subprocess.check_call(configure)
        jobs = os.environ.get("MAX_JOBS", "2")
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C", "-j", jobs])


setup(ext_modules=[CMakeExtension("torchmem._C")], cmdclass={"build_ext": CMakeBuild})
