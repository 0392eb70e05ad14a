"""Builds torchmem's extension modules with CMake (the build of record) and packages them.

One extension is declared (torchmem._C); its CMake build also writes
torchmem/lib/libtorchmem.so (the engine both modules share) and, for a CUDA
build of torch, torchmem._C_cuda next to it.

    pip install --no-build-isolation -e .    # editable: _C lands in ./torchmem
    pip install --no-build-isolation .       # regular install

Environment: TORCHMEM_BUILD_TYPE (Release), TORCHMEM_BUILD_DIR (build/python),
TORCHMEM_CMAKE_ARGS (extra -D options), MAX_JOBS (2).
"""

import os
import shlex
import shutil
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
        subprocess.check_call(
            ["cmake", "--build", str(build_dir), "--target", "torchmem_python_modules", "-j", jobs]
        )
        self._module_dir = output

    def copy_extensions_to_source(self) -> None:
        """In-place builds: setuptools copies the declared extension; copy its companions too."""
        super().copy_extensions_to_source()
        built = getattr(self, "_module_dir", None)
        if built is None:
            return
        package = ROOT / "torchmem"
        for companion in [*built.glob("_C_cuda*.so"), *built.glob("lib/*.so")]:
            target = package / companion.relative_to(built)
            target.parent.mkdir(exist_ok=True)
            shutil.copy2(companion, target)


setup(ext_modules=[CMakeExtension("torchmem._C")], cmdclass={"build_ext": CMakeBuild})
