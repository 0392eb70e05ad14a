"""What run_all needs before it measures: a description of the machine and of the code
measured, the C++ tools and the simulated device built, the torchmem extension the Python
benchmarks load, their environment, and the trace files."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from runall.common import REPO, log, run


# --- machine and code description ---------------------------------------------------------

def machine_info() -> dict:
    info = {"cores": os.cpu_count(), "load_start": os.getloadavg(),
            "kernel": platform.release(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for key, name in (("Model name", "cpu_model"), ("Hypervisor vendor", "hypervisor"),
                          ("L2 cache", "l2"), ("L3 cache", "l3")):
            match = re.search(rf"^{key}:\s*(.+)$", lscpu, re.M)
            if match:
                info[name] = match.group(1).strip()
    except OSError:
        pass
    if "cpu_model" not in info:
        try:
            match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
            info["cpu_model"] = match.group(1).strip() if match else platform.processor()
        except OSError:
            info["cpu_model"] = platform.processor() or "unknown"
    try:
        match = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        info["memory_gib"] = int(match.group(1)) / (1 << 20) if match else None
    except OSError:
        info["memory_gib"] = None
    try:
        info["torch"] = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.__version__)"],
            capture_output=True, text=True, timeout=120).stdout.strip() or "not importable"
    except (OSError, subprocess.TimeoutExpired):
        info["torch"] = "unknown"
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                            capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "csrc", "torchmem",
                                "benchmarks", "CMakeLists.txt"], cwd=REPO,
                               capture_output=True, text=True).stdout.splitlines()
        info["git_dirty_files"] = len(dirty)
    except OSError:
        info["git_commit"], info["git_dirty_files"] = "unknown", 0
    return info


def extension_path() -> Path | None:
    found = sorted((REPO / "torchmem").glob("_C*.so"))
    return found[0] if found else None


def newest_source_mtime() -> tuple[float, str]:
    newest, name = 0.0, ""
    for path in list((REPO / "csrc").rglob("*.cc")) + list((REPO / "csrc").rglob("*.h")):
        mtime = path.stat().st_mtime
        if mtime > newest:
            newest, name = mtime, str(path.relative_to(REPO))
    return newest, name


# --- building -----------------------------------------------------------------------------

def cuda_cmake_args() -> list[str]:
    root = os.environ.get("CUDAToolkit_ROOT")
    if not root and not Path("/usr/local/cuda/include/cuda_runtime_api.h").exists() and \
            (REPO / "build" / "cuda-toolkit").is_dir():
        root = str(REPO / "build" / "cuda-toolkit")
    return [f"-DCUDAToolkit_ROOT={root}"] if root else []


def build(args, raw: Path) -> dict:
    """Configures build/bench if needed and builds the benchmark tools and simcuda."""
    build_dir = args.build_dir
    notes = {}
    if not args.no_build:
        if not (build_dir / "build.ninja").exists() and not (build_dir / "Makefile").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            run(["cmake", "-S", REPO, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
                 "-DTORCHMEM_BUILD_PYTHON=OFF", "-DTORCHMEM_BUILD_TESTS=OFF",
                 "-DTORCHMEM_BUILD_BENCHMARKS=ON", "-DTORCHMEM_BUILD_CUDA=ON",
                 "-DTORCHMEM_BUILD_SIMCUDA=ON", f"-DPython3_EXECUTABLE={sys.executable}",
                 *cuda_cmake_args()], log_file=raw / "build_configure.log")
        start = time.monotonic()
        run(["cmake", "--build", build_dir, "-j", str(args.jobs), "--target", "engine_benchmark",
             "trace_replay", "simcudart", "simcuda_driver"], log_file=raw / "build.log")
        notes["build_seconds"] = round(time.monotonic() - start, 1)
    for tool in ("engine_benchmark", "trace_replay"):
        if not (build_dir / "benchmarks" / tool).exists():
            raise RuntimeError(f"{build_dir}/benchmarks/{tool} is missing (run without --no-build)")
    if not (build_dir / "simcuda" / "libcudart.so.13").exists():
        raise RuntimeError(f"{build_dir}/simcuda/libcudart.so.13 is missing (run without "
                           "--no-build)")
    newest, name = newest_source_mtime()
    notes["newest_source"] = name
    ext = extension_path()
    tree_ok = ext is not None and ext.stat().st_mtime + 1 >= newest
    if args.extension == "tree" or (args.extension == "auto" and tree_ok):
        if ext is None:
            raise RuntimeError("torchmem/_C*.so is missing: pip install --no-build-isolation -e . "
                               "(or run with --extension build)")
        notes["extension"] = str(ext.relative_to(REPO))
        notes["extension_stale"] = not tree_ok
    else:
        if args.no_build and not (args.build_dir.parent / "bench-python").exists():
            raise RuntimeError("no private torchmem._C build and --no-build given")
        package_root = private_extension(args, raw)
        notes["python_path"] = str(package_root)
        ext = next(package_root.glob("torchmem/_C*.so"))
        notes["extension"] = str(ext.relative_to(REPO) if ext.is_relative_to(REPO) else ext)
        notes["extension_private"] = True
        notes["extension_reason"] = ("torchmem/_C*.so is missing" if extension_path() is None else
                                     f"torchmem/_C*.so is older than {name}" if not tree_ok else
                                     "--extension build")
        notes["extension_stale"] = ext.stat().st_mtime + 1 < newest_source_mtime()[0]
    engine_binary = build_dir / "benchmarks" / "engine_benchmark"
    notes["engine_binary_stale"] = newest > engine_binary.stat().st_mtime + 1
    return notes


def private_extension(args, raw: Path) -> Path:
    """Builds torchmem._C from the current sources into build/bench-python and assembles a
    package there (the tree's modules and subpackages, symlinked, plus that _C), leaving
    torchmem/ alone; returns the directory to put first on PYTHONPATH."""
    build_dir = args.build_dir.parent / "bench-python"
    package = build_dir / "pkg" / "torchmem"
    package.mkdir(parents=True, exist_ok=True)
    if not args.no_build:
        log(f"building a private torchmem._C from the current sources in {build_dir}")
        if not (build_dir / "build.ninja").exists():
            run(["cmake", "-S", REPO, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DTORCHMEM_BUILD_TESTS=OFF", "-DTORCHMEM_BUILD_BENCHMARKS=OFF",
                 "-DTORCHMEM_BUILD_SIMCUDA=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
                 f"-DTORCHMEM_PYTHON_OUTPUT_DIR={package}", *cuda_cmake_args()],
                log_file=raw / "build_python_configure.log")
        run(["cmake", "--build", build_dir, "-j", str(args.jobs), "--target", "_C"],
            log_file=raw / "build_python.log")
    for stale in package.iterdir():
        if stale.is_symlink():
            stale.unlink()
    for source in (REPO / "torchmem").iterdir():
        # Modules and subpackages (torchmem/runtime/, ...); not the tree's own _C.
        if source.suffix == ".py" or (source.is_dir() and (source / "__init__.py").exists()):
            (package / source.name).symlink_to(source)
    if not list(package.glob("_C*.so")):
        raise RuntimeError(f"no _C*.so in {package} after the build")
    return package.parent


def child_env(args, notes: dict | None = None) -> dict:
    env = dict(os.environ)
    first = [notes["python_path"]] if notes and notes.get("python_path") else []
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (*first, str(REPO), env.get("PYTHONPATH", "")) if p)
    env["TORCHMEM_SIMCUDA_DIR"] = str(args.simcuda_dir or (args.build_dir / "simcuda"))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def trace_files(paths: list[str]) -> list[Path]:
    files = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(sorted(q for q in path.glob("*.csv") if q.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise SystemExit(f"run_all: no such trace file or directory: {p}")
    if not files:
        raise SystemExit(f"run_all: no *.csv traces in {' '.join(paths)} (use --traces)")
    return [f.resolve() for f in files]
