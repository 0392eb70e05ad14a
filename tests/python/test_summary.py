"""torchmem.summary(): peak and current memory, tags and fragmentation per device, as text, JSON or dict."""

from __future__ import annotations

import json
import re

import pytest
import torch

import torchmem
from torchmem.reports import summary as _summary
from torchmem import _C


@pytest.fixture(autouse=True)
def torchmem_cpu():
    torchmem.install("cpu")
    yield
    torchmem.install("cpu")  # a test below uninstalls; leave the process as the others expect


def rows(text: str, title: str) -> list[str]:
    """The lines of ``text`` from the one starting with ``title`` to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_the_dict_form_has_the_figures_of_memory_stats():
    keep = torch.empty(1 << 20, dtype=torch.uint8)
    data = torchmem.summary(format="dict")
    cpu = data["devices"]["cpu"]
    stats = _C.cpu_engine().memory_stats()

    assert data["torchmem_version"] == torchmem.__version__
    assert cpu["device"] == "cpu" and cpu["installed"] is True
    assert cpu["allocated"] == {"current": stats["allocated_bytes.all.current"], "peak": stats["allocated_bytes.all.peak"]}
    assert cpu["reserved"] == {"current": stats["reserved_bytes.all.current"], "peak": stats["reserved_bytes.all.peak"]}
    assert cpu["requested"]["current"] == stats["requested_bytes.all.current"]
    assert cpu["allocations"] == {
        "current": stats["allocation.all.current"],
        "peak": stats["allocation.all.peak"],
        "total": stats["allocation.all.allocated"],
    }
    assert (cpu["alloc_retries"], cpu["ooms"]) == (stats["num_alloc_retries"], stats["num_ooms"])
    assert (cpu["device_allocs"], cpu["device_frees"]) == (stats["num_device_alloc"], stats["num_device_free"])
    del keep


def test_peak_allocated_remembers_memory_already_freed():
    torchmem.reset_peak_memory_stats("cpu")
    before = torchmem.summary(format="dict")["devices"]["cpu"]["allocated"]["current"]
    big = torch.empty(50 << 20, dtype=torch.uint8)
    del big
    cpu = torchmem.summary(format="dict")["devices"]["cpu"]

    assert cpu["allocated"]["current"] == before
    assert cpu["allocated"]["peak"] >= before + (50 << 20)


def test_each_tag_has_current_and_peak_bytes_and_live_blocks():
    with torchmem.tag("summary-test-tag"):
        kept = [torch.empty(1000, dtype=torch.uint8), torch.empty(3000, dtype=torch.uint8)]
        dropped = torch.empty(10_000, dtype=torch.uint8)
    del dropped
    tags = {tag["tag"]: tag for tag in torchmem.summary(format="dict")["devices"]["cpu"]["tags"]}
    mine = tags["summary-test-tag"]

    assert mine["live_blocks"] == 2
    assert mine["current_bytes"] == 1024 + 3072  # sizes rounded to 512 bytes
    assert mine["peak_bytes"] == 1024 + 3072 + 10240
    assert mine["requested_bytes"] == 4000
    assert mine["allocations"] >= 3
    assert "untagged" in tags
    del kept


def test_tags_are_listed_biggest_first():
    with torchmem.tag("summary-test-big"):
        big = torch.empty(8 << 20, dtype=torch.uint8)
    tags = torchmem.summary(format="dict")["devices"]["cpu"]["tags"]
    current = [tag["current_bytes"] for tag in tags]

    assert current == sorted(current, reverse=True)
    assert tags[0]["tag"] == "summary-test-big" or tags[0]["current_bytes"] >= big.nbytes
    del big


def test_fragmentation_figures_are_the_engines():
    keep = [torch.empty(size, dtype=torch.uint8) for size in (100_000, 3 << 20)]
    hole = torch.empty(200_000, dtype=torch.uint8)
    more = torch.empty(100_000, dtype=torch.uint8)
    del hole  # a free block between two live ones
    fragmentation = torchmem.summary(format="dict")["devices"]["cpu"]["fragmentation"]
    engine = _C.cpu_engine().fragmentation()

    for key in ("free_bytes", "largest_free_block", "internal_waste_bytes", "free_blocks", "pending_free_bytes"):
        assert fragmentation[key] == engine[key], key
    assert fragmentation["external_fragmentation"] == pytest.approx(engine["external_fragmentation"])
    assert fragmentation["small_pool"]["free_bytes"] == engine["small_pool"]["free_bytes"]
    assert fragmentation["large_pool"]["free_bytes"] == engine["large_pool"]["free_bytes"]
    assert [(h["lower_bound"], h["count"], h["bytes"]) for h in fragmentation["free_block_histogram"]] == [
        tuple(entry) for entry in engine["free_block_histogram"]
    ]
    assert fragmentation["free_bytes"] >= 200_000
    del keep, more


def test_json_is_the_dict_form_exactly():
    keep = torch.empty(1000)
    with torchmem.tag("summary-json"):
        tagged = torch.empty(10)
    as_json = torchmem.summary(format="json")

    assert json.loads(as_json) == torchmem.summary(format="dict")
    del keep, tagged


def test_text_shows_every_section_with_human_sizes():
    with torchmem.tag("summary-text-tag"):
        keep = torch.empty(3 << 20, dtype=torch.uint8)
    text = torchmem.summary()

    assert text.startswith("torchmem summary: cpu\n")
    for label in ("allocated", "reserved", "requested", "live blocks", "segments"):
        assert re.search(rf"^  {label}\s+\S+", text, re.MULTILINE), label
    assert re.search(r"alloc retries \d+\s+OOMs \d+", text)
    assert re.search(r"^  summary-text-tag\s+3\.0 MiB\s+3\.0 MiB\s+1\s+1$", text, re.MULTILINE)
    for label in ("free in cache", "largest free block", "external", "internal waste"):
        assert re.search(rf"^    {label}\s+\d", text, re.MULTILINE), label
    assert re.search(r"^    external\s+\d+\.\d %", text, re.MULTILINE)
    del keep


def test_text_columns_are_aligned_on_their_right_edge():
    with torchmem.tag("a-rather-long-tag-name-for-alignment"):
        keep = torch.empty(5000, dtype=torch.uint8)
    text = torchmem.summary()

    memory_table = rows(text, "current")[:6]  # header, allocated, reserved, requested, live blocks, segments
    tag_table = rows(text, "tag")
    for table in (memory_table, tag_table):
        header = table[0]
        for column in ("current", "peak"):
            edge = header.index(column) + len(column)
            for line in table[1:]:
                assert line[edge - 1] != " " and (len(line) == edge or line[edge] == " "), (column, line)
    del keep


def test_text_says_when_torchmem_no_longer_serves_the_device():
    torchmem.uninstall("cpu")
    try:
        text = torchmem.summary("cpu")
    finally:
        torchmem.install("cpu")

    assert "not installed now" in text.splitlines()[0]


def test_the_oom_count_follows_out_of_memory_errors():
    before = torchmem.summary(format="dict")["devices"]["cpu"]["ooms"]
    torchmem.set_memory_limit(64 << 20, "cpu")
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1 << 30, dtype=torch.uint8)
    finally:
        torchmem.set_memory_limit(0, "cpu")
    after = torchmem.summary(format="dict")["devices"]["cpu"]

    assert after["ooms"] == before + 1
    assert f"OOMs {after['ooms']:,}" in _summary.render(torchmem.summary(format="dict"))


def test_a_memory_limit_is_shown():
    torchmem.set_memory_limit(1 << 30, "cpu")
    try:
        data = torchmem.summary(format="dict")
        text = torchmem.summary()
    finally:
        torchmem.set_memory_limit(0, "cpu")

    assert data["devices"]["cpu"]["memory_limit"] == 1 << 30
    assert "limit 1.0 GiB" in text


def test_summary_of_no_device_in_particular_covers_the_installed_ones():
    assert list(torchmem.summary(format="dict")["devices"]) == ["cpu"]


@pytest.mark.parametrize("format", ["html", "TEXT", None, 1])
def test_an_unknown_format_is_refused(format):
    with pytest.raises(ValueError, match="format must be one of 'text', 'json', 'dict'"):
        torchmem.summary(format=format)


@pytest.mark.parametrize(
    "devices, error",
    [("gpu", ValueError), ("cuda:0", ValueError), (object(), TypeError), ([], ValueError)],
)
def test_an_unknown_device_is_refused(devices, error):
    with pytest.raises(error, match="torchmem.summary"):
        torchmem.summary(devices)
