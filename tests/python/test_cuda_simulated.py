"""Runs the CUDA test suite (tests/python/cuda) on the simulated CUDA device.

PyTorch can swap its CUDA allocator only once per process and before CUDA is
initialized, and the simulated runtime must be preloaded before the process
starts, so the CUDA tests run in a pytest session of their own: a subprocess
with tests/simcuda's libraries in LD_PRELOAD, two simulated devices, and
torchmem installed by that session's conftest before anything touches CUDA.
The CUDA calls PyTorch and torchmem made are traced to
build/simcuda-calls.txt.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "simcuda"))
import simcuda  # noqa: E402


def test_cuda_suite_passes_on_the_simulated_device(tmp_path):
    trace = tmp_path / "calls.txt"
    env = simcuda.environment(device_count=2, memory_bytes="16G", trace=str(trace))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "tests" / "python" / "cuda"), "-q",
         "-p", "no:cacheprovider", "-p", "pytester"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    print(result.stdout[-20000:])
    print(result.stderr[-5000:], file=sys.stderr)
    assert result.returncode == 0, "the CUDA suite failed on the simulated device (output above)"
    assert " passed" in result.stdout

    counts, unsupported = simcuda.read_trace(trace)
    calls = sorted(counts.items(), key=lambda item: (item[0][0], -item[1]))
    report = ROOT / "build" / "simcuda-calls.txt"
    report.parent.mkdir(exist_ok=True)
    report.write_text(
        "".join(f"{library} {call} {count}\n" for (library, call), count in calls)
        + "".join(f"unsupported {library} {call}\n" for library, call in sorted(unsupported))
    )
    assert counts.get(("runtime", "cudaMalloc"), 0) > 0, "torchmem never reached cudaMalloc"
