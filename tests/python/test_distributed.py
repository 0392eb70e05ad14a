"""torchmem.distributed with CPU tensors over Gloo: ranks are new processes, each with torchmem.

Each scenario runs once (a module-scoped fixture spawning the ranks, see distributed_ranks.py)
and the tests below read what every rank saw. Every run is bounded: spawn() stops ranks that
outlive its timeout, and the process groups share it, so a failure never hangs the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import distributed_ranks as ranks
import torchmem.distributed as tmd
from torchmem.distributed import launcher
from torchmem.distributed.job import JobReport, format_ranks
from torchmem.distributed.payload import ProtocolMismatch, RankReport, decode, encode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 120  # seconds for one spawned run, and its process group's timeout
MiB = 1 << 20


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """What both ranks of ranks.ddp_and_collectives saw (index = rank)."""
    flags = tmp_path_factory.mktemp("flags")
    return tmd.spawn(ranks.ddp_and_collectives, world_size=2, args=(str(flags),), check=False, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def four_ranks():
    return tmd.spawn(ranks.four_ranks, world_size=4, check=False, timeout=TIMEOUT)


# --- a collective leak check -----------------------------------------------------------------


def test_a_leak_on_rank_1_only_raises_the_same_error_on_every_rank_naming_rank_1(two_ranks):
    leak0, leak1 = two_ranks[0]["leak"], two_ranks[1]["leak"]
    assert leak0["type"] == leak1["type"] == "DistributedLeakError"
    assert leak0["message"] == leak1["message"]
    message = leak0["message"]
    assert "rank 1 leaked 192.0 KiB in 3 blocks (rank 0: no leaks)" in message
    assert "held by       distributed_ranks.HISTORY[0..2]" in message
    assert "HISTORY.append(torch.zeros(16 * KiB))" in message


def test_with_four_ranks_the_leak_of_rank_1_is_reported_alike_on_all_four(four_ranks):
    messages = {outcome["leak"]["message"] for outcome in four_ranks}
    assert len(messages) == 1
    (message,) = messages
    assert {outcome["leak"]["type"] for outcome in four_ranks} == {"DistributedLeakError"}
    assert "rank 1 leaked 4.0 KiB in 1 block (ranks 0, 2-3: no leaks)" in message
    assert "distributed_ranks.HISTORY[0]" in message


def test_an_error_on_one_rank_inside_a_check_stops_every_rank(two_ranks):
    own, other = two_ranks[0]["raised"], two_ranks[1]["raised"]
    assert own["type"] == "ValueError" and own["message"] == "bad batch on rank 0"
    assert "rank 1 raise RankFailedError" in own["notes"][0]
    assert other["type"] == "RankFailedError"
    assert "rank 0: ValueError: bad batch on rank 0" in other["message"]


def test_ranks_that_run_the_check_with_other_options_get_the_same_clear_error(two_ranks):
    errors = [outcome["options_mismatch"] for outcome in two_ranks]
    assert {error["type"] for error in errors} == {"CollectiveMismatchError"}
    assert errors[0]["message"] == errors[1]["message"]
    assert "option max_leaked_bytes: rank 0: 0; rank 1: 100" in errors[0]["message"]


def test_ranks_with_different_torchmem_versions_get_the_same_clear_error(two_ranks):
    errors = [outcome["version_mismatch"] for outcome in two_ranks]
    assert {error["type"] for error in errors} == {"CollectiveMismatchError"}
    assert errors[0]["message"] == errors[1]["message"]
    assert "torchmem version: rank 0: " in errors[0]["message"]
    assert "rank 1: 0.0.1" in errors[0]["message"]


def test_a_rank_that_arrives_after_the_timeout_fails_every_rank_within_it(four_ranks):
    late = [outcome["late"] for outcome in four_ranks]
    assert {outcome["type"] for outcome in late} == {"CollectiveError"}
    assert "rank 3 did not arrive within 1 s" in late[0]["message"]  # rank 0 knows who


def test_a_rank_that_crashes_inside_a_check_fails_the_others_at_once(tmp_path):
    with pytest.raises(tmd.SpawnError) as raised:
        tmd.spawn(ranks.crash_inside_a_check, world_size=2, args=(str(tmp_path / "store"),), check=False,
                  timeout=TIMEOUT)
    error = raised.value
    assert "rank 1" in str(error) and "exited with code 7" in error.failures[1]
    survivor = error.results[0]
    assert survivor["type"] == "CollectiveError"
    assert "the exchange between ranks failed" in survivor["message"]
    assert survivor["seconds"] < TIMEOUT / 2  # noticed when the peer's sockets closed, not at a timeout


def test_a_barrier_inside_a_check_is_not_a_leak_on_any_supported_torch():
    # torch 2.9-2.11 keep the last barrier's 1-byte tensor in a C++ static until the next
    # barrier: allowed, with a note naming torch as the holder. Later torch frees it.
    outcomes = tmd.spawn(ranks.barrier_inside_a_check, world_size=2, check=False, timeout=TIMEOUT)
    keeps_it = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 12)
    for outcome in outcomes:
        assert outcome["leaked_bytes"] == 0
        if keeps_it:
            assert outcome["allowed"] == [(1, f"kept by torch {torch.__version__.split('+')[0]} itself: "
                                              "ProcessGroup::barrier holds the last barrier's 1-byte tensor in a "
                                              "C++ static until the next barrier (torch 2.12 frees it)")]
        else:
            assert outcome["allowed"] == []


def test_a_destroyed_process_group_is_a_clear_error_not_a_hang():
    outcomes = tmd.spawn(ranks.destroyed_group, world_size=2, check=False, timeout=TIMEOUT)
    for outcome in outcomes:
        assert outcome["type"] == "RuntimeError"
        assert "no process group in this process" in outcome["message"]
        assert "init_process_group" in outcome["message"]


# --- growth ----------------------------------------------------------------------------------


def test_growth_on_one_rank_fails_the_growth_check_on_every_rank(two_ranks):
    errors = [outcome["growth"] for outcome in two_ranks]
    assert {error["type"] for error in errors} == {"GrowthError"}
    assert errors[0]["message"] == errors[1]["message"]
    assert "grew on every step after warm-up on rank 1 (rank 0: no growth)" in errors[0]["message"]
    assert "tag=cache" in errors[0]["message"]
    assert two_ranks[0]["growth_ranks"] == two_ranks[1]["growth_ranks"] == [1]


# --- the job report --------------------------------------------------------------------------


def test_gather_gives_rank_0_the_job_report_and_it_flags_the_imbalanced_rank(two_ranks):
    assert two_ranks[1]["gather_on_this_rank"] is None
    job = JobReport.from_dict(two_ranks[0]["gather_on_this_rank"])
    assert [report.rank for report in job.ranks] == [0, 1]
    (allocated, reserved) = job.imbalances
    assert (allocated.rank, allocated.metric, allocated.tag) == (1, "peak allocated", "logging")
    assert allocated.ratio > 1.2 and allocated.tag_excess >= 2 * MiB  # 4 MiB above the other; median of 2 = mean
    text = two_ranks[0]["gather_text"]
    assert "torchmem job report: 2 of 2 ranks reported" in text
    assert re.search(r"rank 1  cpu  peak allocated 4\.\d MiB = 1\.\d+x the median", text)
    assert "tag=logging is 2.0 MiB above its median" in text


def test_all_gather_gives_every_rank_the_same_verdict(two_ranks):
    assert two_ranks[0]["all_gather_imbalance"] == two_ranks[1]["all_gather_imbalance"]
    assert two_ranks[0]["all_gather_imbalance"][0]["rank"] == 1


def test_with_four_ranks_one_rank_well_above_the_median_is_flagged(four_ranks):
    for outcome in four_ranks:
        assert outcome["ranks"] == [0, 1, 2, 3]
        assert [(i["rank"], i["metric"], i["tag"]) for i in outcome["imbalances"]] == [
            (2, "peak allocated", "eval_cache"),
            (2, "peak reserved", "eval_cache"),
        ]


# --- attribution of DDP's and FSDP's own work ------------------------------------------------


def test_ddp_buckets_hooks_and_gloo_work_are_charged_to_the_loops_tags(two_ranks):
    for outcome in two_ranks:
        assert outcome["untagged_allocations_in_loop"] == 0  # nothing DDP or Gloo did escaped the tags
        assert outcome["ddp_bytes"] >= (64 * 128 + 128 + 128 * 8 + 8) * 4  # buckets made at DDP(...)
        assert outcome["step_allocations"] > 0


def test_an_async_collective_is_charged_to_the_tag_it_was_issued_in(two_ranks):
    # The all_gather's buffer is allocated by a Gloo worker after rank 0 entered tag("later").
    for outcome in two_ranks:
        assert outcome["async_tags"]["comm"] >= 1
        assert outcome["async_tags"]["later"] == 0


def test_fsdp2_all_gather_and_reduce_scatter_buffers_follow_the_tags():
    for outcome in tmd.spawn(ranks.fsdp2_tags, world_size=2, check=False, timeout=TIMEOUT):
        assert outcome["untagged_allocations_in_loop"] == 0
        assert outcome["shard_current"] > 0  # the sharded parameters
        assert outcome["forward_peak"] >= outcome["full_first_layer"]  # an unsharded layer, all-gathered
        assert outcome["backward_allocations"] > 0  # gradients, reduce-scatter


# --- spawn and the pytest plugin -------------------------------------------------------------


def test_spawn_raises_the_job_report_when_a_rank_leaked():
    with pytest.raises(tmd.DistributedLeakError) as raised:
        tmd.spawn(ranks.leak_on_rank_1, world_size=2, timeout=TIMEOUT)
    assert raised.value.job.leaked_ranks == [1]
    assert "rank 1 leaked 16.0 KiB in 1 block (rank 0: no leaks)" in str(raised.value)


def test_spawn_refuses_a_function_the_ranks_cannot_import():
    with pytest.raises(TypeError, match="define it at module level"):
        tmd.spawn(lambda rank, world_size: None, world_size=2)


def test_the_pytest_fixture_fails_a_test_whose_process_group_leaked_on_one_rank(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(
        test_ranks="""
        import pytest
        import distributed_ranks

        def test_leaky_rank(torchmem_distributed):
            torchmem_distributed.spawn(distributed_ranks.leak_on_rank_1, world_size=2)

        @pytest.mark.torchmem(allow_tags=("logging",))
        def test_allowed(torchmem_distributed):
            torchmem_distributed.spawn(distributed_ranks.leak_on_rank_1, world_size=2)

        def test_appends_to_its_argument(torchmem_distributed):
            torchmem_distributed.spawn(distributed_ranks.append_to_argument, world_size=2, args=([],))

        @pytest.mark.torchmem(cycles="always")
        def test_a_cycle_counts_under_cycles_always(torchmem_distributed):
            torchmem_distributed.spawn(distributed_ranks.cycle_on_rank_1, world_size=2)
        """
    )
    result = pytester.runpytest_subprocess("-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider",
                                           timeout=TIMEOUT)
    # The marker's options (cycles, allow_arguments) reach every rank's check.
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*test_leaky_rank*", "*rank 1 leaked 16.0 KiB in 1 block (rank 0: no leaks)*"])
    result.stdout.fnmatch_lines(["*test_a_cycle_counts_under_cycles_always*", "*rank 1 leaked 16.0 KiB*"])
    assert "test_appends_to_its_argument" not in "".join(line for line in result.stdout.lines if "FAILED" in line)


# --- the pieces, without processes -----------------------------------------------------------


def _rank(rank: int, peak: int, tags=(), leaks=None) -> RankReport:
    figures = {
        "allocated_peak": peak, "allocated_current": 0, "reserved_peak": peak, "reserved_current": 0,
        "free_bytes": 0, "largest_free_block": 0, "external_fragmentation": 0.0, "ooms": 0, "alloc_retries": 0,
        "tags": [list(tag) for tag in tags], "tags_dropped": 0,
    }
    return RankReport(rank=rank, world_size=4, devices={f"cuda:{rank}": figures}, leaks=leaks)


def test_imbalance_compares_each_rank_with_the_median_of_the_same_device_type():
    reports = [_rank(0, 10 * MiB), _rank(1, 10 * MiB), _rank(2, 11 * MiB), _rank(3, 13 * MiB, [("cache", 0, 3 * MiB, 1, 1)])]
    job = JobReport(reports, 4)
    flagged = {(imbalance.rank, imbalance.metric) for imbalance in job.imbalances}
    assert flagged == {(3, "peak allocated"), (3, "peak reserved")}  # 13 > 1.2 x 10.5; 11 is not
    assert job.imbalances[0].tag == "cache"


def test_imbalance_ignores_differences_below_min_bytes():
    job = JobReport([_rank(0, 100), _rank(1, 1000)], 2)
    assert job.imbalances == []
    assert JobReport([_rank(0, 100), _rank(1, 1000)], 2, min_bytes=0).imbalances[0].rank == 1


def test_the_job_report_names_missing_ranks_and_why():
    job = JobReport([_rank(0, MiB)], 3, {1: "no report after waiting 5 s", 2: "crashed"})
    text = job.render()
    assert "torchmem job report: 1 of 3 ranks reported" in text
    assert "rank 1: no report after waiting 5 s" in text and "rank 2: crashed" in text
    assert JobReport.from_dict(job.to_dict()).render() == text


def test_the_job_report_shows_each_ranks_growth():
    growing = {"steps": 6, "warmup": 2, "min_steps": 2, "measured_steps": 4, "growing": [
        {"kind": "tag", "device": "cuda:1", "name": "metrics", "bytes_per_step": 65536.0, "total_bytes": 262144,
         "steps": 4, "series": [0, 65536, 131072, 196608, 262144], "frame": None}]}
    report = _rank(1, MiB)
    report.growth = growing
    text = JobReport([_rank(0, MiB), report], 2).render()
    assert "growth on rank 1 (every step after warm-up)" in text
    assert "+64.0 KiB/step  cuda:1  tag=metrics" in text


def test_a_collective_check_without_a_process_group_says_what_to_do():
    with pytest.raises(RuntimeError, match="no process group in this process; call torch.distributed.init_process_group"):
        with tmd.leak_check():
            pass
    with pytest.raises(RuntimeError, match="exited without a matching enter"):
        tmd.leak_check().__exit__(None, None, None)


def test_rank_sets_read_as_ranges():
    assert format_ranks([3]) == "rank 3"
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_payloads_round_trip_and_a_foreign_protocol_is_refused():
    data = _rank(0, MiB).to_dict()
    assert decode(encode(data)) == data
    assert RankReport.from_dict(decode(encode(data))) == _rank(0, MiB)
    with pytest.raises(ProtocolMismatch, match="protocol 99"):
        decode(b"TMD" + bytes([99]) + encode(data)[4:])
    with pytest.raises(ProtocolMismatch, match="not a torchmem.distributed payload"):
        decode(b"hello")


def test_every_rank_writes_its_own_file_with_its_rank_in_the_name():
    assert launcher.rank_path("out/mem.pickle", 3) == os.path.join("out", "mem.rank3.pickle")
    assert launcher.rank_path("report", 1) == "report.rank1"
    assert launcher.rank_path("/scratch/rank{rank}/mem.pickle", 2) == "/scratch/rank2/mem.pickle"


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 does not fit WORLD_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ],
)
def test_a_launch_environment_that_makes_no_sense_is_refused_with_the_reason(environ, message):
    with pytest.raises(launcher.LaunchError, match=message):
        launcher.detect(environ)


def test_one_process_or_no_launcher_is_not_a_job():
    assert launcher.detect({}) is None
    assert launcher.detect({"RANK": "0", "WORLD_SIZE": "1"}) is None
    env = launcher.detect({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "29500",
                           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "abc",
                           "TORCHELASTIC_RESTART_COUNT": "2"})
    assert (env.rank, env.world_size, env.agent_store, env.run_id, env.attempt) == (1, 4, True, "abc", 2)


def test_pytest_on_every_rank_fails_a_test_that_leaked_on_one_rank_on_all_of_them(pytester):
    # torchrun -m pytest: each rank runs the session; the plugin's per-test check is collective.
    pytester.makeconftest(
        """
        import torch.distributed as dist

        def pytest_configure(config):
            dist.init_process_group("gloo")

        def pytest_unconfigure(config):
            dist.destroy_process_group()
        """
    )
    pytester.makepyfile(
        test_ranks="""
        import torch, torch.distributed as dist

        KEPT = []

        def test_leaks_on_rank_1(torchmem_leak_check):
            if dist.get_rank() == 1:
                KEPT.append(torch.zeros(1024))

        def test_the_ranks_still_meet_afterwards(torchmem_leak_check):
            dist.barrier()
        """
    )
    env = dict(os.environ, PYTHONPATH=ROOT, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "pytest",
         "-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider", "-q", "test_ranks.py"],
        cwd=pytester.path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    output = result.stdout
    assert output.count("1 failed, 1 passed") == 2, output[-5000:]  # both ranks, the same outcome
    assert output.count("rank 1 leaked 4.0 KiB in 1 block (rank 0: no leaks)") >= 2


@pytest.mark.parametrize("other_garbage", [False, True])
def test_a_tensor_another_thread_releases_during_the_check_is_not_reported_as_a_leak(other_garbage):
    # A Gloo worker drops its reference to a collective's tensor a moment after the collective
    # returned; if that happens while the check collects garbage, the block is gone without the
    # garbage collector having freed it. Simulated deterministically: a gc callback drops the
    # last reference when the check's first collection starts (with and without other garbage
    # for that collection to find).
    import gc

    import torch
    import torchmem

    torchmem.install("cpu")
    held = {}

    def release(phase, info):
        if phase == "start":
            held.clear()

    gc.collect()
    with torchmem.leak_check(raise_on_leak=False) as report:
        held["tensor"] = torch.zeros(4096)
        if other_garbage:
            loop = []
            loop.append(loop)
            del loop
        gc.callbacks.append(release)
    try:
        assert report.findings == [], report.render()
    finally:
        gc.callbacks.remove(release)


# --- torchrun -m pytest: every exchange names its test --------------------------------------

RANK_CONFTEST = """
import json, os
import torch.distributed as dist

def pytest_configure(config):
    dist.init_process_group("gloo")

def pytest_unconfigure(config):
    dist.destroy_process_group()

def pytest_runtest_logreport(report):
    # What each rank saw, per test and phase, for the test to read (torchrun mixes the outputs).
    if report.failed or report.when == "call" or report.skipped:
        with open(f"outcomes.rank{os.environ['RANK']}.jsonl", "a") as out:
            out.write(json.dumps({"test": report.nodeid.split("::")[-1], "when": report.when,
                                  "outcome": report.outcome, "text": str(report.longrepr or "")}) + "\\n")
"""


def torchrun_pytest(pytester, *args) -> list[dict]:
    """Runs pytest on 2 ranks under torchrun; returns each rank's {test: [phase outcomes]}."""
    pytester.makeconftest(RANK_CONFTEST)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "pytest",
         "-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider", "-q", *args],
        cwd=pytester.path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    import json

    per_rank = []
    for rank in range(2):
        seen: dict = {}
        path = pytester.path / f"outcomes.rank{rank}.jsonl"
        assert path.exists(), result.stdout[-3000:] + result.stderr[-3000:]
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            seen.setdefault(entry["test"], []).append(entry)
        per_rank.append(seen)
    return per_rank


def test_torchrun_pytest_allows_a_tests_own_arguments_and_keeps_the_ranks_on_the_same_test(pytester):
    pytester.makepyfile(
        test_ranks="""
        import pytest, torch, torch.distributed as dist

        KEPT = []

        @pytest.mark.parametrize("history", [[]])
        def test_appends_to_its_parametrize_argument(history, torchmem_leak_check):
            history.append(torch.zeros(1024))  # the test's input, allowed (as in one process)

        @pytest.fixture
        def shard():
            if dist.get_rank() == 1:
                raise RuntimeError("no shard on rank 1")
            return 1

        def test_uses_a_fixture_that_fails_on_rank_1(shard, torchmem_leak_check):
            pass

        def test_after_the_fixture_error(torchmem_leak_check):
            if dist.get_rank() == 0:
                KEPT.append(torch.zeros(256))  # 1 KiB, leaked by this test on rank 0
        """
    )
    ranks = torchrun_pytest(pytester, "test_ranks.py", "--torchmem-dist-timeout=60")

    for seen in ranks:
        # Marker options (allow_arguments) reach the check that classifies: passes on both ranks.
        (argument,) = seen["test_appends_to_its_parametrize_argument[history0]"]
        assert argument["outcome"] == "passed", argument["text"]
        # The ranks stay on the same test after rank 1's fixture error: the next test's leak is its own.
        (after,) = [entry for entry in seen["test_after_the_fixture_error"] if entry["when"] == "call"]
        assert after["outcome"] == "failed"
        assert "for test_ranks.py::test_after_the_fixture_error" in after["text"]
        assert "rank 0 leaked 1.0 KiB in 1 block (rank 1: no leaks)" in after["text"]
    (setup_error,) = ranks[1]["test_uses_a_fixture_that_fails_on_rank_1"]
    assert setup_error["when"] == "setup" and "no shard on rank 1" in setup_error["text"]
    (rank0,) = ranks[0]["test_uses_a_fixture_that_fails_on_rank_1"]
    assert rank0["when"] == "call" and rank0["outcome"] == "failed"
    assert "rank 1 raised inside the check" in rank0["text"] and "RuntimeError: no shard on rank 1" in rank0["text"]


def test_torchrun_pytest_ranks_at_different_tests_fail_naming_both(pytester):
    pytester.makepyfile(
        test_mismatch="""
        import os

        if os.environ["RANK"] == "1":
            def test_only_on_rank_1(torchmem_leak_check):
                pass

        def test_on_every_rank(torchmem_leak_check):
            pass
        """
    )
    ranks = torchrun_pytest(pytester, "test_mismatch.py", "--torchmem-dist-timeout=30")

    first = {0: "test_on_every_rank", 1: "test_only_on_rank_1"}
    for rank, seen in enumerate(ranks):
        entry = next(e for e in seen[first[rank]] if e["when"] == "call")
        assert entry["outcome"] == "failed"
        assert "the ranks are not at the same check" in entry["text"]
        assert "rank 0: test_mismatch.py::test_on_every_rank" in entry["text"]
        assert "rank 1: test_mismatch.py::test_only_on_rank_1" in entry["text"]
