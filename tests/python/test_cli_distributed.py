"""``python -m torchmem run`` on every rank of a job: under torchrun, and under a launcher that only
sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (here, the test itself). Run as users run them, in
subprocesses; every run has a timeout, and --dist-timeout bounds every wait between ranks."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240

# DDP on CPU tensors. Rank 1 logs 256 KiB on every step into a module-level list of another
# module that it never clears (a leak that outlives the script's globals) and peaks 4 MiB higher
# than rank 0 under tag "logging". The process group is destroyed before exit, and the script
# collects its garbage (DDP's own reference cycles) so that what is left is the planted leak.
STEPLOG = """\
    HISTORY = []
"""

TRAIN = """\
    import gc
    import torch, torch.distributed as dist
    import torchmem
    import steplog

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        with torchmem.tag("step"):
            model(torch.randn(8, 32)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        if rank == 1:
            with torchmem.tag("logging"):
                steplog.HISTORY.append(torch.zeros(64 * 1024))  # 256 KiB, every step
                scratch = torch.ones(1 << 20)
                del scratch
    dist.destroy_process_group()
    del model, optimizer
    gc.collect()
    print(f"rank {rank} trained")
"""


def environment(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, **extra)
    for name in ("PYTHONWARNINGS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if name not in extra:
            env.pop(name, None)
    return env


def write(path, source: str) -> str:
    path.write_text(textwrap.dedent(source))
    return str(path)


def torchrun(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "torchmem", *args],
        cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(commands: list[list[str]], cwd) -> list[subprocess.CompletedProcess]:
    """Starts one process per rank with the variables a launcher sets; waits for all of them."""
    port = str(free_port())
    processes = [
        subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(RANK=str(rank), WORLD_SIZE=str(len(commands)), LOCAL_RANK=str(rank),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
        )
        for rank, command in enumerate(commands)
    ]
    results = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


def run_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "torchmem", "run", *args]


def test_torchrun_gives_one_report_for_the_job_naming_the_rank_that_leaked(tmp_path):
    write(tmp_path / "steplog.py", STEPLOG)
    script = write(tmp_path / "train.py", TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    result = torchrun("run", "--json", str(out / "job.json"), "--snapshot", str(out / "mem.pickle"), script,
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "rank 0 trained" in result.stdout and "rank 1 trained" in result.stdout
    stderr = result.stderr
    assert stderr.count("torchmem job report: 2 of 2 ranks reported") == 1
    assert "torchmem summary" not in stderr  # no per-rank reports: one for the job
    assert "torchmem: rank 1 sent its report to rank 0" in stderr
    assert "exit codes: ranks 0-1: 0" in stderr
    # The table: a row per rank, rank 1 with its leak.
    assert any(line.split()[:2] == ["0", "cpu"] and line.endswith("none") for line in stderr.splitlines())
    assert any(line.split()[:2] == ["1", "cpu"] and "768.0 KiB in 3 blocks" in line for line in stderr.splitlines())
    # Imbalance, and rank 1's findings labelled with its rank.
    assert "rank 1  cpu  peak allocated" in stderr and "tag=logging" in stderr
    assert "leak findings of rank 1" in stderr
    assert "768.0 KiB in 3 blocks  reachable  cpu  tag=logging" in stderr
    assert "held by       steplog.HISTORY[0..2]" in stderr
    assert "steplog.HISTORY.append(torch.zeros(64 * 1024))" in stderr

    job = json.loads((out / "job.json").read_text())
    assert job["ranks_reported"] == [0, 1] and job["leaked_ranks"] == [1]
    assert {flag["rank"] for flag in job["imbalance"]["flagged"]} == {1}
    for rank in (0, 1):
        own = json.loads((out / f"job.rank{rank}.json").read_text())
        assert (own["rank"], own["world_size"]) == (rank, 2)
        with open(out / f"mem.rank{rank}.pickle", "rb") as file:
            assert "segments" in pickle.load(file)
        assert job["ranks"][rank]["files"]["snapshot"] == str(out / f"mem.rank{rank}.pickle")


def test_under_any_launcher_rank_0_reports_a_rank_that_died_without_its_report(tmp_path):
    script = write(
        tmp_path / "train.py",
        """\
        import os
        import torch, torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            os._exit(3)  # no exception, no exit handlers: as a native crash or a kill would end it
        kept = torch.ones(1000)
        print("rank 0 finished")
        """,
    )
    # 8 s: the ranks must also meet before the script starts, whatever the machine's load.
    rank0, rank1 = launch([run_command("--dist-timeout", "8", script)] * 2, cwd=tmp_path)
    assert rank1.returncode == 3
    assert rank0.returncode == 0, rank0.stderr[-5000:]
    assert "torchmem job report: 1 of 2 ranks reported" in rank0.stderr
    assert "rank 1: no report after waiting 8 s: the rank ended before torchmem's exit hook ran" in rank0.stderr


def test_ranks_with_different_torchmem_versions_or_options_refuse_to_start_alike(tmp_path):
    script = write(tmp_path / "train.py", "print('the script ran')\n")
    older = [sys.executable, "-c",
             "import sys, torchmem; torchmem.__version__ = '0.0.1'; "
             "from torchmem.integrations.cli import main; sys.exit(main(sys.argv[1:]))",
             "run", "--dist-timeout", "60", "--no-leak-report", script]
    rank0, rank1 = launch([run_command("--dist-timeout", "60", script), older], cwd=tmp_path)
    for rank, result in enumerate((rank0, rank1)):
        assert result.returncode == 2, result.stderr[-3000:]
        assert "the script ran" not in result.stdout
        assert f"(rank {rank} of 2): the ranks of this job run torchmem differently" in result.stderr
        assert "torchmem version: rank 0: " in result.stderr and "rank 1: 0.0.1" in result.stderr
        assert "--no-leak-report: rank 0: False; rank 1: True" in result.stderr
    assert rank0.stderr.split("):", 1)[1] == rank1.stderr.split("):", 1)[1]  # the same verdict


def test_a_rank_not_under_torchmem_is_named_after_the_timeout(tmp_path):
    script = write(tmp_path / "train.py", "print('the script ran')\n")
    rank0, rank1 = launch([run_command("--dist-timeout", "2", script), [sys.executable, script]], cwd=tmp_path)
    assert rank1.returncode == 0  # plain python: knows nothing of torchmem
    assert rank0.returncode == 2
    assert "rank 1 of 2 did not start under torchmem within 2 s" in rank0.stderr


def test_when_torchrun_stops_rank_0_because_rank_1_crashed_rank_0_still_reports(tmp_path):
    script = write(
        tmp_path / "train.py",
        """\
        import os, time
        import torch, torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            time.sleep(0.5)
            os._exit(3)
        kept = torch.ones(1000)
        for _ in range(600):  # rank 0 works on until torchrun stops it (SIGTERM)
            time.sleep(0.1)
        """,
    )
    result = torchrun("run", "--dist-timeout", "60", script, cwd=tmp_path)
    assert result.returncode != 0
    stderr = result.stderr
    assert "torchmem job report: 1 of 2 ranks reported" in stderr
    assert "exit codes: rank 0: 143 (terminated by SIGTERM)" in stderr
    assert "rank 1: no report after waiting until rank 0 was told to stop (SIGTERM)" in stderr


@pytest.mark.parametrize(
    "environ, argv, message",
    [
        ({"RANK": "0"}, [], "RANK is set but WORLD_SIZE is not"),
        ({}, ["--dist-timeout", "0"], "argument --dist-timeout: must be seconds > 0"),
    ],
)
def test_a_bad_launch_environment_or_timeout_is_a_usage_error(tmp_path, monkeypatch, capsys, environ, argv, message):
    # In this process: the command line is refused before torchmem installs anything.
    from torchmem.integrations import cli

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    script = write(tmp_path / "train.py", "print('the script ran')\n")
    assert cli.main(["run", *argv, script]) == 2
    assert message in capsys.readouterr().err


def test_no_job_report_gives_every_rank_its_own_report(tmp_path):
    script = write(tmp_path / "train.py", "import torch\nkept = torch.ones(10)\n")
    results = launch([run_command("--no-job-report", script)] * 2, cwd=tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "torchmem summary: cpu" in result.stderr
        assert f"train.py (rank {results.index(result)} of 2) exited with code 0" in result.stderr
        assert "torchmem job report" not in result.stderr


def test_fail_on_leak_under_torchrun_fails_the_rank_that_leaked_and_says_why(tmp_path):
    write(tmp_path / "steplog.py", STEPLOG)
    script = write(tmp_path / "train.py", TRAIN)
    result = torchrun("run", "--fail-on-leak", "--dist-timeout", "120", script, cwd=tmp_path)

    assert result.returncode != 0, result.stderr[-3000:]  # the job fails: rank 1 exited 1
    assert "torchmem (rank 1 of 2): exit code 1: the script leaked 768.0 KiB in 3 blocks (--fail-on-leak)" \
        in result.stderr, result.stderr[-3000:]
    assert "torchmem (rank 0 of 2): exit code 1" not in result.stderr


def test_the_job_report_names_the_rank_whose_memory_grew_per_step(tmp_path):
    script = write(tmp_path / "train.py", """\
        import os
        import torch

        model = torch.nn.Linear(32, 32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        history = []
        for step in range(10):
            out = model(torch.randn(8, 32))
            out.sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if os.environ["RANK"] == "1":
                history.append(out.detach())  # kept every step, on rank 1 only
    """)
    result = torchrun("run", "--dist-timeout", "120", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr[-3000:]
    job = result.stderr.split("torchmem job report", 1)[1]
    assert "growth on rank 1" in job, job
    assert "growth on rank 0" not in job
    assert "train.py:8" in job.split("growth on rank 1", 1)[1]
