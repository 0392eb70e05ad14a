"""The out-of-memory report (``torchmem.oom_report``, ``TORCHMEM_OOM_REPORT``): at the first
out-of-memory error the capture and the HTML report are written, and the program sees the
same error it would have seen without them.

Each case runs a small program in a subprocess: CUDA ones on the simulated device (its
capacity 1 GiB), so PyTorch's own out-of-memory path runs as on hardware.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import torchmem
from torchmem.reports import capture as _capture

ROOT = Path(__file__).resolve().parents[2]

CUDA_PROGRAM = textwrap.dedent(
    """
    import os, sys
    import torch, torchmem
    torchmem.install()
    if sys.argv[1] != "-":
        torchmem.oom_report(sys.argv[1])
    kept = [torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(3)]
    for attempt in range(2):
        try:
            torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as error:
            print("caught", type(error).__module__, type(error).__name__, error)
    print("carried on with", len(kept), "blocks")
    """
)


def _run(program: str, tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(program)
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True)


def _files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_cuda_the_first_error_writes_capture_and_page_and_the_program_sees_the_same_error(tmp_path, simcuda_dir):
    import simcuda

    env = simcuda.environment(memory_bytes="1G")
    without = _run(CUDA_PROGRAM, tmp_path, "-", env=env)
    assert without.returncode == 0, without.stderr[-3000:]
    reports = tmp_path / "oom"
    with_report = _run(CUDA_PROGRAM, tmp_path, str(reports), env=env)
    assert with_report.returncode == 0, with_report.stderr[-3000:]

    # The program saw the same errors, word for word, both times, and carried on.
    assert with_report.stdout == without.stdout
    assert with_report.stdout.count("caught torch OutOfMemoryError CUDA out of memory. Tried to allocate 2.00 GiB") == 2
    assert "carried on with 3 blocks" in with_report.stdout

    # One report, for the first error.
    pid = re.search(r"torchmem-oom-train\.(\d+)\.html", with_report.stderr).group(1)
    assert _files(reports) == [f"torchmem-oom-train.{pid}.html", f"torchmem-oom-train.{pid}.tmem"]
    assert with_report.stderr.count("torchmem: out of memory: report written to") == 1
    assert f"{reports}/torchmem-oom-train.{pid}.html (capture {reports}/torchmem-oom-train.{pid}.tmem)" in (
        with_report.stderr
    )

    # The capture holds the state at the error: what was alive, where it was allocated.
    capture = torchmem.load_capture(reports / f"torchmem-oom-train.{pid}.tmem")
    assert capture.oom["message"] == (
        "CUDA out of memory on cuda:0: tried to allocate 2.0 GiB; 832.0 MiB of the device's 1.0 GiB free"
    )
    assert [event["requested"] for event in capture.oom["events"]] == [2 * 2**30]
    top = capture.sites("cuda:0", by="live")[0]
    assert (top.live_bytes, top.live_blocks) == (3 * 64 * 2**20, 3)
    assert top.source == 'kept = [torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(3)]'
    assert "kept = [torch.empty(64 * 2**20" in capture.render()

    page = (reports / f"torchmem-oom-train.{pid}.html").read_text()
    assert "Out of memory" in page and "tried to allocate 2.0 GiB" in page
    assert "kept = [torch.empty(64 * 2**20, dtype=torch.uint8, device=&#34;cuda&#34;)" in page or (
        "kept = [torch.empty(64 * 2**20, dtype=torch.uint8, device=&quot;cuda&quot;)" in page
    )


def test_cuda_the_environment_variable_turns_it_on(tmp_path, simcuda_dir):
    import simcuda

    env = simcuda.environment(memory_bytes="1G")
    env["TORCHMEM_OOM_REPORT"] = str(tmp_path / "from-env")
    result = _run(CUDA_PROGRAM, tmp_path, "-", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [name.rsplit(".", 1)[1] for name in _files(tmp_path / "from-env")] == ["html", "tmem"]


CPU_PROGRAM = textwrap.dedent(
    """
    import sys
    import torch, torchmem
    torchmem.install("cpu")
    if sys.argv[1] != "-":
        torchmem.oom_report(sys.argv[1])
        if len(sys.argv) > 2:  # the directory goes away: the report cannot be written
            import os; os.rmdir(sys.argv[1])
    torchmem.set_memory_limit(64 * 2**20, "cpu")

    def step():
        activations = torch.zeros(40 * 2**20, dtype=torch.uint8)
        return activations + torch.ones(40 * 2**20, dtype=torch.uint8)

    step()
    """
)


def _traceback_error(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.startswith("torch.OutOfMemoryError")][0]


def test_cpu_an_uncaught_error_writes_the_report_with_the_failed_frames_tensors_alive(tmp_path):
    without = _run(CPU_PROGRAM, tmp_path, "-")
    reports = tmp_path / "oom"
    with_report = _run(CPU_PROGRAM, tmp_path, str(reports))

    # The same exit code and error line as without the report.
    assert without.returncode == with_report.returncode == 1
    assert _traceback_error(with_report.stderr) == _traceback_error(without.stderr)
    assert "return activations + torch.ones(40 * 2**20" in with_report.stderr

    (capture_name,) = [name for name in _files(reports) if name.endswith(".tmem")]
    capture = torchmem.load_capture(reports / capture_name)
    assert capture.oom["message"].startswith("OutOfMemoryError: ")
    # The local of the failed call was still alive (the traceback held its frame).
    sites = {site.source: site.live_bytes for site in capture.sites("cpu", by="live")}
    assert sites.get("activations = torch.zeros(40 * 2**20, dtype=torch.uint8)") == 40 * 2**20


def test_a_report_that_cannot_be_written_says_so_and_leaves_the_error_alone(tmp_path):
    without = _run(CPU_PROGRAM, tmp_path, "-")
    broken = _run(CPU_PROGRAM, tmp_path, str(tmp_path / "gone"), "remove it")
    assert broken.returncode == 1
    assert _traceback_error(broken.stderr) == _traceback_error(without.stderr)
    assert "torchmem: could not write the out-of-memory report: torchmem.write_capture: cannot write" in broken.stderr


def test_bad_directories_are_refused_when_enabling(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    try:
        torchmem.oom_report(afile)
    except NotADirectoryError as error:
        assert "exists and is not a directory" in str(error)
    else:
        raise AssertionError("a file was accepted as the report directory")
    try:
        torchmem.oom_report(42)
    except TypeError as error:
        assert "directory must be a str or os.PathLike, got int" in str(error)
    else:
        raise AssertionError("42 was accepted as the report directory")
    assert _capture.SUFFIX == ".tmem"
