"""torchmem.distributed with CUDA tensors: two ranks, one simulated GPU each, over Gloo.

NCCL cannot run on the simulated device (it embeds its own CUDA runtime and needs the real
driver), so these runs use Gloo, which copies CUDA tensors through host memory on CUDA streams
of its own. Rank functions are in cuda_ranks.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import cuda_ranks
import torchmem.distributed as tmd
from torchmem.distributed.job import JobReport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TIMEOUT = 180
MiB = 1 << 20


def test_ddp_on_two_gpus_reports_the_leak_of_rank_1_on_every_rank_and_the_imbalance():
    rank0, rank1 = tmd.spawn(cuda_ranks.ddp, world_size=2, devices=("cuda",), check=False, timeout=TIMEOUT)
    assert (rank0["device"], rank1["device"]) == ("cuda:0", "cuda:1")
    assert rank0["leak"] == rank1["leak"]
    assert rank0["leak"]["type"] == "DistributedLeakError"
    message = rank0["leak"]["message"]
    assert "rank 1 leaked 768.0 KiB in 3 blocks (rank 0: no leaks)" in message
    assert "cuda:1  tag=logging" in message and "held by       cuda_ranks.HISTORY[0..2]" in message
    # DDP's buckets, hooks and Gloo's copies were all charged to the loop's tags.
    assert rank0["untagged_allocations_in_loop"] == rank1["untagged_allocations_in_loop"] == 0

    assert rank1["job"] is None
    job = JobReport.from_dict(rank0["job"])
    assert sorted(job.rank(1).devices) == ["cuda:1"]
    flagged = {(imbalance.rank, imbalance.device_type, imbalance.metric, imbalance.tag) for imbalance in job.imbalances}
    assert (1, "cuda", "peak allocated", "logging") in flagged
    assert "rank 1  cuda  peak allocated" in rank0["job_text"]


def test_a_block_gloo_used_on_its_own_stream_waits_for_it_under_its_tag():
    for outcome in tmd.spawn(cuda_ranks.comm_stream, world_size=2, devices=("cuda",), check=False, timeout=TIMEOUT):
        assert outcome["pending_after_free"] >= MiB
        assert "no leaks; pending 1.0 MiB in 1 block" in outcome["report"]
        assert "pending  cuda:" in outcome["report"] and "tag=grads" in outcome["report"]
        assert outcome["pending_after_sync"] == 0


def test_fsdp2_buffers_on_its_own_streams_follow_the_tags():
    for outcome in tmd.spawn(cuda_ranks.fsdp2, world_size=2, devices=("cuda",), check=False, timeout=TIMEOUT):
        assert outcome["untagged_allocations_in_loop"] == 0
        assert outcome["shard_current"] > 0
        assert outcome["forward_peak"] >= 2 * (1 << 16) * 4  # a whole layer's parameters, all-gathered
        assert outcome["backward_allocations"] > 0


TRAIN = """\
    import gc, os
    import torch, torch.distributed as dist
    import torchmem
    import steplog

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    weight = torch.nn.Parameter(torch.ones(1 << 16, device="cuda"))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.ParameterList([weight]))
    for step in range(3):
        with torchmem.tag("step"):
            (torch.randn(1 << 16, device="cuda") * weight).sum().backward()
            weight.grad = None
        if rank == 1:
            with torchmem.tag("logging"):
                steplog.HISTORY.append(torch.zeros(1 << 16, device="cuda"))
    dist.destroy_process_group()
    del model
    gc.collect()  # DDP's own reference cycles: what is left at exit is the planted leak
"""


def test_torchrun_on_two_gpus_gives_one_report_for_the_job(tmp_path):
    (tmp_path / "steplog.py").write_text("HISTORY = []\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "torchmem",
         "run", "--device", "cuda", "--json", str(tmp_path / "job.json"), "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    stderr = result.stderr
    assert stderr.count("torchmem job report: 2 of 2 ranks reported") == 1
    lines = stderr.splitlines()
    assert any(line.split()[:2] == ["0", "cuda:0"] and line.endswith("none") for line in lines)
    assert any(line.split()[:2] == ["1", "cuda:1"] and "768.0 KiB in 3 blocks" in line for line in lines)
    assert "leak findings of rank 1" in stderr and "held by       steplog.HISTORY[0..2]" in stderr
    assert (tmp_path / "job.rank0.json").exists() and (tmp_path / "job.rank1.json").exists()
