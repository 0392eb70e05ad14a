"""``torchmem run --html PATH`` on every rank of a job: rank 0 writes one page for the job, a
row and a section per rank, from every rank's capture (sent with the job report through the
launcher's store), and says which ranks the page lacks and why. Run as users run them: under
torchrun, in subprocesses, every run with a timeout and --dist-timeout bounding every wait."""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240

STEPLOG = """\
    HISTORY = []
"""

# Rank 1 logs 256 KiB a step into a list of another module that it never clears: a leak that
# outlives the script's globals, in rank 1's section of the page only. With CRASH set, rank 1
# ends by os._exit, before torchmem's exit hook: it sends neither its report nor its capture.
TRAIN = """\
    import os
    import torch, torch.distributed as dist
    import steplog

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        total = torch.ones(1024) * rank
        dist.all_reduce(total)
        if rank == 1:
            steplog.HISTORY.append(torch.zeros(64 * 1024))  # 256 KiB, every step
    dist.destroy_process_group()
    print(f"rank {rank} trained", flush=True)
    if rank == 1 and os.environ.get("CRASH"):
        os._exit(0)
"""


def _environment(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, **extra)
    for name in ("PYTHONWARNINGS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CRASH"):
        if name not in extra:
            env.pop(name, None)
    return env


def _torchrun(*args: str, cwd, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "torchmem", *args],
        cwd=cwd, env=_environment(**extra), capture_output=True, text=True, timeout=TIMEOUT,
    )


def _script(tmp_path) -> str:
    (tmp_path / "steplog.py").write_text(textwrap.dedent(STEPLOG))
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TRAIN))
    return str(path)


def _load_in_chromium(path) -> str:
    """The page's DOM after headless Chromium ran its scripts (Debian's ``chromium``)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("this test needs Debian's chromium: apt-get install chromium (scripts/install.sh installs it)")
    result = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", f"file://{path}"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _page_text(path) -> str:
    """The page's visible text, roughly: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def test_rank_0_writes_one_page_for_the_job_with_a_section_per_rank(tmp_path):
    script = _script(tmp_path)
    page = tmp_path / "job.html"
    result = _torchrun("run", "--html", str(page), "--no-capture", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "rank 0 trained" in result.stdout and "rank 1 trained" in result.stdout
    assert result.stderr.count(f"job HTML report written to {page} (ranks 0-1)") == 1, result.stderr[-5000:]
    assert "has no section for rank" not in result.stderr
    # One page: no rank writes one of its own, and --no-capture left no capture behind.
    assert sorted(os.listdir(tmp_path)) == ["job.html", "steplog.py", "train.py"]
    text = _page_text(page)
    assert "train.py (rank 0 of 2)" in text and "train.py (rank 1 of 2)" in text
    # Rank 1's section has its leak, held by steplog.HISTORY; rank 0's says it leaked nothing.
    rank_0, rank_1 = text.split("Rank 1: ")[0].split("Rank 0: ")[1], text.split("Rank 1: ")[1]
    assert "steplog.HISTORY" in rank_1 and "steplog.HISTORY" not in rank_0
    assert "768.0 KiB in 3 blocks" in rank_1
    # The page runs in a browser: no script error, and every chart (each rank's own) drawn.
    dom = _load_in_chromium(page)
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert "data-script-errors" not in body, re.search(r'id="torchmem-errors"[^>]*>([^<]*)', dom).group(1)
    places = re.findall(r'<div class="chart[^"]*" id="([^"]+)"', dom)
    assert len(places) == len(set(places)) == int(re.search(r'data-charts-drawn="(\d+)"', body).group(1)) > 2


def test_a_rank_that_sent_nothing_is_named_and_the_page_has_the_others(tmp_path):
    script = _script(tmp_path)
    page = tmp_path / "job.html"
    result = _torchrun("run", "--html", str(page), "--no-capture", "--dist-timeout", "10", script, cwd=tmp_path,
                       CRASH="1")
    assert "rank 1 trained" in result.stdout, result.stderr[-5000:]
    stderr = result.stderr
    assert f"job HTML report written to {page} (rank 0)" in stderr, stderr[-5000:]
    assert "torchmem: the job HTML report has no section for rank 1: no report after waiting 10 s" in stderr
    text = _page_text(page)
    assert "train.py (rank 0 of 2)" in text and "(rank 1 of 2)" not in text
    # The page says so too, in the ranks' table.
    assert "no capture from this rank: no report after waiting 10 s" in text


def test_with_no_job_report_every_rank_writes_a_page_and_files_of_its_own(tmp_path):
    """--no-job-report: each rank reports alone, so each writes its own page (``job.rank1.html``)
    and JSON, instead of every rank writing (or refusing to overwrite) the same file."""
    script = _script(tmp_path)
    port = str(_free_port())
    command = [sys.executable, "-m", "torchmem", "run", "--no-job-report", "--no-capture", "--html", "job.html",
               "--json", "run.json", script]
    processes = [
        subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_environment(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
        for rank in (0, 1)
    ]
    results = [process.communicate(timeout=TIMEOUT) + (process.returncode,) for process in processes]
    for rank, (stdout, stderr, code) in enumerate(results):
        assert code == 0, stderr[-5000:]
        assert f"HTML report written to {tmp_path / f'job.rank{rank}.html'}" in stderr, stderr[-3000:]
        assert f"JSON report written to {tmp_path / f'run.rank{rank}.json'}" in stderr
        assert f"train.py (rank {rank} of 2)" in _page_text(tmp_path / f"job.rank{rank}.html")
    assert not (tmp_path / "job.html").exists() and not (tmp_path / "run.json").exists()
    assert "steplog.HISTORY" in _page_text(tmp_path / "job.rank1.html")
    assert "steplog.HISTORY" not in _page_text(tmp_path / "job.rank0.html")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
