"""Capture files (.tmem): what they hold, how they are read back, compared and rendered as text,
and the allocation sites, categories and summary built on them."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import torchmem
from torchmem.reports import capture as _capture
from torchmem.reports import categories as _categories
from torchmem.reports import collect as _collect
from torchmem.reports import sites as _sites
from torchmem.reports import timeline as _timeline

KEPT: list = []  # a module global that "keeps for later": the leak a report must name


@pytest.fixture(autouse=True)
def recording():
    torchmem.install("cpu")
    torchmem.record_trace(sample_interval=0)
    yield
    torchmem.record_trace(0)
    for tracking in list(_categories._trackings):
        tracking.stop()
    KEPT.clear()


def _allocate_and_free(steps: int) -> None:
    for _ in range(steps):
        scratch = torch.empty(256 * 1024, dtype=torch.uint8)  # 256 KiB, freed each step
        del scratch


def _keep(count: int) -> None:
    for _ in range(count):
        KEPT.append(torch.empty(64 * 1024, dtype=torch.uint8))  # 64 KiB, kept


def test_a_capture_reads_back_with_the_sites_by_live_and_by_peak_bytes(tmp_path):
    with torchmem.tag("work"):
        _allocate_and_free(3)
        _keep(5)
    path = torchmem.write_capture(tmp_path / "run.tmem")
    capture = torchmem.load_capture(path)

    assert capture.data["format"] == "torchmem-capture" and capture.data["version"] == "1.0"
    live = capture.sites("cpu", by="live")
    assert (live[0].function, live[0].live_bytes, live[0].live_blocks) == ("_keep", 5 * 64 * 1024, 5)
    assert live[0].source == "KEPT.append(torch.empty(64 * 1024, dtype=torch.uint8))  # 64 KiB, kept"
    peak = capture.sites("cpu", by="peak")
    assert (peak[0].function, peak[0].peak_bytes) == ("_keep", 5 * 64 * 1024)
    scratch = next(site for site in peak if site.function == "_allocate_and_free")
    # One 256 KiB block at a time, however many steps: the site's peak is one block, alive now nothing.
    assert (scratch.peak_bytes, scratch.live_bytes, scratch.allocations) == (256 * 1024, 0, 3)
    assert live[0].tags == {"work": 5 * 64 * 1024}

    text = capture.render()
    assert "top allocation sites on cpu by live bytes" in text
    kept_line = next(line for line in text.splitlines() if "in _keep" in line)
    assert kept_line.split()[:3] == ["320.0", "KiB", "5"]
    report = json.loads(capture.to_json())
    assert report["devices"]["cpu"]["top_sites_by_peak"][0]["function"] == "_keep"


def test_the_peak_replayed_from_a_wrapped_trace_still_counts_the_blocks_alive_before_it(tmp_path):
    torchmem.record_trace(40, sample_interval=0)  # fewer events than the loop below makes
    _keep(4)
    _allocate_and_free(30)
    capture = torchmem.load_capture(torchmem.write_capture(tmp_path / "wrapped.tmem"))
    replayed = _sites.replay(capture.data, "cpu")
    in_use = capture.devices["cpu"]["summary"]["requested"]["current"]

    assert replayed.events == 40
    assert replayed.in_use[-1] == in_use  # the four kept blocks are counted from the first event
    assert replayed.peak_bytes == in_use + 256 * 1024


def test_a_newer_major_version_is_refused_and_a_newer_minor_version_is_read(tmp_path):
    path = torchmem.write_capture(tmp_path / "base.tmem")
    data = json.loads(gzip.decompress(open(path, "rb").read()))

    newer_minor = dict(data, version="1.7", something_new={"ignored": True})
    (tmp_path / "minor.tmem").write_bytes(gzip.compress(json.dumps(newer_minor).encode()))
    assert torchmem.load_capture(tmp_path / "minor.tmem").sites("cpu") is not None

    newer_major = dict(data, version="2.0")
    (tmp_path / "major.tmem").write_bytes(gzip.compress(json.dumps(newer_major).encode()))
    with pytest.raises(torchmem.CaptureFormatError, match=r"capture format 2\.0, newer than this torchmem .* upgrade"):
        torchmem.load_capture(tmp_path / "major.tmem")


def test_files_that_are_not_captures_get_errors_that_say_so(tmp_path):
    (tmp_path / "text.tmem").write_text("hello")
    with pytest.raises(torchmem.CaptureFormatError, match="is not a torchmem capture .not gzip data"):
        torchmem.load_capture(tmp_path / "text.tmem")
    (tmp_path / "other.tmem").write_bytes(gzip.compress(b'{"format": "something-else"}'))
    with pytest.raises(torchmem.CaptureFormatError, match="is not a torchmem capture"):
        torchmem.load_capture(tmp_path / "other.tmem")
    whole = open(torchmem.write_capture(tmp_path / "whole.tmem"), "rb").read()
    (tmp_path / "cut.tmem").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(torchmem.CaptureFormatError, match="is damaged"):
        torchmem.load_capture(tmp_path / "cut.tmem")
    with pytest.raises(FileNotFoundError):
        torchmem.load_capture(tmp_path / "missing.tmem")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        torchmem.write_capture(tmp_path / "no" / "such" / "dir.tmem")


def test_compare_to_shows_what_grew_by_site_and_by_tag(tmp_path):
    before = torchmem.load_capture(torchmem.write_capture(tmp_path / "before.tmem"))
    with torchmem.tag("cache"):
        _keep(3)
    after = torchmem.load_capture(torchmem.write_capture(tmp_path / "after.tmem"))

    by_site = after.compare_to(before, "site")
    assert by_site[0].key.endswith("in _keep") and (by_site[0].size_diff, by_site[0].count_diff) == (3 * 65536, 3)
    assert "KEPT.append" in by_site[0].source
    assert str(by_site[0]).startswith("+192.0 KiB (0 B -> 192.0 KiB), +3 blocks")
    by_tag = {d.key: d for d in after.compare_to(before, "tag")}
    assert by_tag["cache"].size_diff == 3 * 65536
    with pytest.raises(ValueError, match="by must be one of 'site', 'tag'"):
        after.compare_to(before, "line")


def test_tracking_splits_memory_into_parameters_gradients_optimizer_state_and_activations(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.Adam(model.parameters())
    torchmem.track(model, optimizer)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    loss = model(torch.randn(16, 64)).square().sum()
    after_forward = _timeline.samples()[-1]  # a tracked forward's end takes a sample
    assert after_forward["label"] == "forward"
    cpu = after_forward["devices"]["cpu"]["categories"]
    assert cpu["parameters"] == parameter_bytes and cpu["gradients"] == 0
    # Saved for backward: the input and the ReLU output (the Linear layers' weights are parameters).
    assert cpu["activations"] >= 16 * 128 * 4

    loss.backward()
    optimizer.step()
    del loss
    at_capture = torchmem.summary(format="dict")["devices"]["cpu"]
    categories = at_capture["categories"]
    assert categories["gradients"] == parameter_bytes
    assert categories["activations"] == 0  # backward released them
    # Adam keeps two moments per parameter, plus a step counter each.
    state = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values())
    assert categories["optimizer_state"] == state and state >= 2 * parameter_bytes
    assert sum(categories.values()) == at_capture["requested"]["current"]
    modules = {m["module"]: m for m in at_capture["top_modules"]}
    assert modules["Sequential.0"]["categories"]["parameters"] == (64 * 128 + 128) * 4

    capture = torchmem.load_capture(torchmem.write_capture(tmp_path / "tracked.tmem"))
    blocks = capture.devices["cpu"]["blocks"]
    tagged = dict(zip(blocks["address"], blocks["category"]))
    weight = model[0].weight
    assert tagged[weight.untyped_storage().data_ptr()] == "parameters"
    assert tagged[weight.grad.untyped_storage().data_ptr()] == "gradients"
    text = torchmem.summary()
    assert "memory in use by category (torchmem.track)" in text and "Sequential.0" in text


def test_track_refuses_what_is_not_a_model_or_optimizer_and_stop_removes_its_hooks():
    with pytest.raises(TypeError, match="expected torch.nn.Module or torch.optim.Optimizer objects, got list"):
        torchmem.track([1, 2])
    model = torch.nn.Linear(4, 4)
    with torchmem.track(model):
        assert model._forward_pre_hooks
    assert not model._forward_pre_hooks and not _categories.is_tracking()


def test_summary_lists_the_top_sites_by_live_and_by_peak_bytes():
    _allocate_and_free(2)
    _keep(2)
    text = torchmem.summary(top=3)
    live = text.split("top allocation sites by live bytes")[1].split("top allocation sites by peak")[0]
    assert "128.0 KiB" in live and "in _keep  KEPT.append(" in live
    peak = text.split("top allocation sites by peak bytes")[1]
    assert "256.0 KiB" in peak and "in _allocate_and_free" in peak
    assert "top_sites" not in torchmem.summary(format="dict", top=0)["devices"]["cpu"]


def test_leak_findings_travel_with_the_capture(tmp_path):
    with torchmem.leak_check(raise_on_leak=False) as report:
        _keep(1)
    capture = torchmem.load_capture(torchmem.write_capture(tmp_path / "leaky.tmem", leaks=report))
    finding = capture.leaks["report"]["findings"][0]
    assert [owner["path"] for owner in finding["owners"]] == [f"{__name__}.KEPT[0]"]
    assert any(frame["source"].startswith("KEPT.append(") for frame in finding["frames"])
    assert "64.0 KiB in 1 block" in capture.render()


def test_combined_captures_keep_each_rank(tmp_path):
    paths = []
    for rank in (1, 0):
        capture = _capture.Capture(_collect.collect())
        capture.data["meta"].update(rank=rank, world_size=2)
        paths.append(capture.write(tmp_path / f"run.rank{rank}.tmem"))
    combined = torchmem.combine_captures(paths, tmp_path / "job.tmem")
    assert [rank.meta["rank"] for rank in torchmem.load_capture(tmp_path / "job.tmem").ranks] == [0, 1]
    assert "(rank 1 of 2)" in combined.render()
