"""torchmem.rss_report: host RAM per process, split so that growth can be told apart.

The three answers it must give (the questions users ask about RSS growth):
* reading a memory-mapped file grows RSS as file-backed pages, not private memory;
* a worker that really allocates grows its own private memory, reported under its pid;
* a forked child writing to inherited memory shows copy-on-write, not new memory.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

import torchmem
from dataloader_helpers import GrowingDataset
from leak_helpers import torchmem_cpu  # noqa: F401  (autouse: torchmem serves CPU tensors)
from torchmem.host import rss as _rss

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
SIZE = 64 * MiB  # what each scenario maps, allocates or copies
# How far a part that should not move may drift: the interpreter and the report itself
# allocate a little between two reports.
NOISE = 8 * MiB
PAGE = mmap.PAGESIZE


def read_every_page(mapping) -> int:
    return sum(mapping[offset] for offset in range(0, len(mapping), PAGE))


def unique_bytes_of_mapping(path) -> int:
    """This process's unique (private clean + dirty) resident bytes of its mappings of
    `path`: the file's own contribution to USS."""
    return sum(m.private_clean + m.private_dirty
               for m in psutil.Process().memory_maps(grouped=True) if m.path == str(path))


def test_reading_a_memory_mapped_file_grows_rss_as_file_backed_pages_not_private_memory(tmp_path):
    path = tmp_path / "dataset.bin"
    path.write_bytes(os.urandom(SIZE))
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        before = torchmem.rss_report(children=False)
        read_every_page(mapping)
        after = torchmem.rss_report(children=False)
        delta = torchmem.rss_delta(before, after, threshold=NOISE)

        main = delta.main
        assert main.rss >= SIZE - NOISE  # RSS grew by the file...
        assert main.file_backed >= SIZE - NOISE  # ... as file-backed pages
        assert abs(main.private) < NOISE and main.new_private < NOISE  # not as private memory
        # The trap the split avoids: no other process maps the file, so USS counts it. Read
        # from the file's own mapping: the process-wide USS delta also moves whenever any
        # other process maps the same library pages (a process that imports torch makes
        # ~200 MiB of libtorch's pages shared and drops this process's USS by as much, RSS
        # unchanged), which is how this test once saw USS +13.5 MB in a full run.
        assert unique_bytes_of_mapping(path) >= SIZE - NOISE
        text = delta.render()
        assert "file-backed: pages of mapped files (memory-mapped data, libraries): page cache, not a leak" in text
        assert "private: new memory" not in text


def test_a_dataloader_worker_that_really_grows_is_reported_under_its_own_pid_as_private_memory():
    loader = DataLoader(
        GrowingDataset(length=8, grow_bytes=SIZE // 2), batch_size=4, num_workers=1,
        multiprocessing_context="fork", persistent_workers=True,
    )
    for _ in loader:  # epoch 1: the worker starts (and grows once)
        pass
    monitor = torchmem.RssMonitor()
    (worker,) = [entry for entry in monitor.first.children if entry.role == "DataLoader worker"]
    for _ in loader:  # epoch 2: the same worker grows again
        pass
    delta = monitor.sample()

    grown = delta.process(worker.pid)
    assert grown.status == "both" and grown.role == "DataLoader worker"
    assert grown.new_private >= SIZE // 2 - NOISE
    assert grown.rss >= SIZE // 2 - NOISE
    assert abs(delta.main.new_private) < NOISE  # the main process did not grow
    assert delta.torchmem_cpu == {"allocated": 0, "reserved": 0}
    text = delta.render()
    assert f"{worker.pid} DataLoader worker (pt_data_worker)" in text
    assert "private: new memory in this process (a leak, or a cache still filling)" in text
    del loader


def _write_inherited(buffer: bytearray, ready, go, done, release) -> None:
    """In a forked child: write one byte per page of a buffer inherited from the parent."""
    ready.set()
    go.wait(60)
    for offset in range(0, len(buffer), PAGE):
        buffer[offset] = 2
    done.set()
    release.wait(60)  # stays alive until the parent has measured


def test_a_fork_shares_the_parents_pages_and_a_child_writing_them_shows_copy_on_write_not_new_memory():
    context = multiprocessing.get_context("fork")
    ready, go, done, release = (context.Event() for _ in range(4))
    buffer = bytearray(b"\x01") * SIZE  # resident in the parent, inherited by the child
    prior = torchmem.rss_report()
    child = context.Process(target=_write_inherited, args=(buffer, ready, go, done, release))
    child.start()
    try:
        assert ready.wait(60)
        before = torchmem.rss_report()
        go.set()
        assert done.wait(60)
        after = torchmem.rss_report()
    finally:
        go.set()
        release.set()
        child.join(60)
    forked = torchmem.rss_delta(prior, before)
    delta = torchmem.rss_delta(before, after)

    # The fork: the parent's pages (the buffer among them) are now shared, not freed.
    assert forked.process(child.pid).status == "new"
    assert forked.main.became_shared >= SIZE - NOISE
    assert abs(forked.main.new_private) < NOISE
    assert "became shared: this process's pages are now shared with another one" in forked.render()
    # The child's writes: its inherited copy of the buffer turns private, page by page.
    copied = delta.process(child.pid)
    assert before.process(child.pid).shared_anonymous >= SIZE - NOISE  # inherited, still shared
    assert copied.copy_on_write >= SIZE - NOISE  # then the child's writes copied it
    assert abs(copied.new_private) < NOISE  # nothing new was allocated
    assert abs(copied.rss) < NOISE  # and RSS did not move: the pages changed hands
    assert "copy-on-write: pages shared with another process became this one's own" in delta.render()
    del buffer


def test_the_report_gives_torchmems_cpu_figures_for_the_main_process_and_the_delta_says_whose_growth_it_is():
    before = torchmem.rss_report(children=False)
    assert before.torchmem_cpu["installed"] is True
    assert before.torchmem_cpu["allocated"] == torchmem.memory_allocated("cpu")
    assert before.torchmem_cpu["reserved"] == torchmem.memory_reserved("cpu")

    tensor = torch.ones(SIZE // 4)  # written, so resident
    delta = torchmem.rss_delta(before, torchmem.rss_report(children=False))
    assert delta.torchmem_cpu["allocated"] == SIZE
    assert delta.main.new_private >= SIZE - NOISE
    assert "mostly torchmem's cache: tensors" in delta.render()
    del tensor


def test_private_growth_outside_torchmem_is_called_so():
    before = torchmem.rss_report(children=False)
    blob = b"\x01" * SIZE  # Python memory, not a tensor
    delta = torchmem.rss_delta(before, torchmem.rss_report(children=False))
    assert delta.main.new_private >= SIZE - NOISE
    assert "not torchmem's tensors: Python objects, pinned memory or another allocator" in delta.render()
    del blob


def test_the_parts_add_up_to_the_rss_and_the_report_renders_and_serializes():
    report = torchmem.rss_report()
    main = report.main
    assert main.role == "main" and main.pid == os.getpid()
    parts = sum(getattr(main, part) for part in _rss.PARTS)
    assert abs(parts - main.rss) < NOISE
    assert main.shared == main.rss - main.uss

    data = json.loads(report.to_json())
    assert data["processes"][0]["pid"] == os.getpid()
    assert set(data["processes"][0]) >= {"rss", "uss", "pss", "swap", "shared", *_rss.PARTS}
    assert data["torchmem_cpu"]["installed"] is True
    text = report.render()
    assert text.startswith("torchmem.rss_report: host memory (RSS) of")
    assert f"{os.getpid()}  main (" in text
    assert "file-backed  mapped files (libraries, memory-mapped datasets)" in text
    assert report.total("private") >= main.private


def test_a_monitor_keeps_only_its_first_and_latest_reports():
    monitor = torchmem.RssMonitor(children=False)
    first = monitor.first
    for _ in range(3):
        monitor.sample()
    assert monitor.samples == 3 and monitor.first is first and monitor.last is not first
    total = monitor.total()
    assert total.seconds == pytest.approx(monitor.last.time - first.time)


def test_bad_arguments_are_refused_with_a_message_that_says_what_to_pass():
    report = torchmem.rss_report(children=False)
    with pytest.raises(TypeError, match="children must be True or False"):
        torchmem.rss_report(children="yes")
    with pytest.raises(TypeError, match="before must be an RssReport"):
        torchmem.rss_delta({}, report)
    with pytest.raises(ValueError, match="threshold must be an int >= 0"):
        torchmem.rss_delta(report, report, threshold=-1)
    with pytest.raises(TypeError, match="threshold must be an int >= 0"):
        torchmem.RssMonitor(threshold=1.5)
    with pytest.raises(KeyError, match="pid 1 is not in this report"):
        report.process(1)
    with pytest.raises(ValueError, match="unknown part"):
        report.total("heap")


# --- python -m torchmem run --rss ------------------------------------------------------------------

SCRIPT = """\
    import mmap, sys
    with open(sys.argv[1], "rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    total = sum(mapping[offset] for offset in range(0, len(mapping), mmap.PAGESIZE))
    print("read", len(mapping))
"""


def test_the_cli_prints_the_rss_report_at_exit_and_writes_it_to_the_json_report(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(SIZE))
    script = tmp_path / "read.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--rss", "--json", "report.json", str(script), str(data)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "torchmem.rss_report: host memory (RSS) of" in result.stderr
    assert "host memory of this process since the script started:" in result.stderr
    assert "page cache, not a leak" in result.stderr  # the mapped file, named for what it is

    report = json.loads((tmp_path / "report.json").read_text())["rss"]
    (main,) = [entry for entry in report["at_exit"]["processes"] if entry["role"] == "main"]
    assert main["file_backed"] >= SIZE - NOISE
    (since,) = [entry for entry in report["since_start"]["processes"] if entry["role"] == "main"]
    assert since["file_backed"] >= SIZE - NOISE and abs(since["new_private"]) < NOISE


def test_without_the_flag_the_cli_reports_no_rss(tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("print('hi')\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--json", "report.json", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "rss_report" not in result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["rss"] is None
