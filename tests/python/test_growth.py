"""torchmem.GrowthMonitor: tags and allocation sites whose live bytes keep rising (the basics;
intermittent, noisy and not-a-leak loops are in test_growth_monitor.py)."""

from __future__ import annotations

import json

import pytest
import torch

import torchmem
from leak_helpers import line_of, torchmem_cpu  # noqa: F401
from torchmem import _C

HISTORY: list = []


@pytest.fixture(autouse=True)
def empty_history():
    HISTORY.clear()
    yield
    HISTORY.clear()


def leaky_step():
    with torchmem.tag("train"):
        activations = torch.randn(32, 32)
        (activations @ activations).sum().item()
    with torchmem.tag("history"):
        HISTORY.append(torch.zeros(256))  # alloc: history


def clean_step():
    with torchmem.tag("train"):
        activations = torch.randn(32, 32)
        (activations @ activations).sum().item()


def run(step, steps: int, **options) -> torchmem.GrowthReport:
    with torchmem.GrowthMonitor(**options) as monitor:
        for _ in range(steps):
            step()
            monitor.step()
    return monitor.report()


def test_a_tag_and_a_site_that_grow_every_step_are_reported_with_their_rate():
    report = run(leaky_step, steps=6, warmup=2)

    (tag,) = report.tags
    assert (tag.name, tag.device, tag.bytes_per_step, tag.total_bytes, tag.steps) == ("history", "cpu", 1024, 4096, 4)
    (site,) = report.sites
    assert (site.frame.filename, site.frame.line) == (__file__, line_of(leaky_step, "# alloc: history"))
    assert site.name == f"tests/python/test_growth.py:{site.frame.line}"
    assert site.bytes_per_step == 1024 and site.series == (2048, 3072, 4096, 5120, 6144)


def test_the_report_text_names_rate_total_tag_and_the_growing_line():
    text = run(leaky_step, steps=5, warmup=1).render()

    assert text.startswith("torchmem.GrowthMonitor: live memory grew on every one of the 4 steps after 1 warm-up")
    assert "+1.0 KiB/step   +4.0 KiB over 4 steps   4 of 4 steps   cpu      tag=history" in text
    assert "HISTORY.append(torch.zeros(256))  # alloc: history" in text


def test_a_loop_that_releases_what_it_allocates_has_no_growth():
    report = run(clean_step, steps=6, warmup=1)

    assert not report.has_growth
    assert report.render().startswith("torchmem.GrowthMonitor: no growth")


def test_growth_during_warmup_only_is_not_reported():
    calls = []

    def warms_up_then_settles():
        if len(calls) < 2:
            HISTORY.append(torch.zeros(256))
        calls.append(1)

    report = run(warms_up_then_settles, steps=6, warmup=2)

    assert not report.has_growth


def test_memory_that_goes_up_and_down_is_not_growth():
    calls = []

    def sawtooth():
        calls.append(1)
        if len(calls) % 2:
            HISTORY.append(torch.zeros(256))
        elif HISTORY:
            HISTORY.pop()

    report = run(sawtooth, steps=7, warmup=1)

    assert not report.has_growth


def test_too_few_steps_after_warmup_are_not_judged():
    report = run(leaky_step, steps=3, warmup=2)

    assert not report.has_growth
    assert "at least 2 measured steps are needed" in report.render()


def test_without_sites_only_tags_are_sampled_and_capture_stays_off():
    with torchmem.GrowthMonitor(warmup=1, by_site=False) as monitor:
        assert not _C.stack_capture_requested()
        for _ in range(4):
            leaky_step()
            monitor.step()

    assert [growth.kind for growth in monitor.report().growing] == ["tag"]


def test_stack_capture_is_on_while_the_monitor_runs():
    with torchmem.GrowthMonitor():
        assert _C.stack_capture_requested()
    assert not _C.stack_capture_requested()


def test_without_start_the_first_step_is_the_baseline_and_stop_ends_capture():
    monitor = torchmem.GrowthMonitor(warmup=0)
    for _ in range(3):
        leaky_step()
        monitor.step()
    monitor.stop()

    report = monitor.report()
    assert not _C.stack_capture_requested()
    assert (report.steps, report.measured_steps) == (3, 2)
    assert [(growth.name, growth.series) for growth in report.tags] == [("history", (1024, 2048, 3072))]


def test_the_report_converts_to_plain_data_and_json():
    report = run(leaky_step, steps=4, warmup=1)

    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert (data["steps"], data["warmup"], data["measured_steps"]) == (4, 1, 3)
    assert data["growing"][0] == {
        "kind": "tag", "device": "cpu", "name": "history", "growing": True, "bytes_per_step": 1024.0,
        "slope_error": 0.0, "total_bytes": 3072, "steps": 3, "rising_steps": 3, "allocation": 1024,
        "reason": "rose on 3 of 3 steps, slope +1.0 KiB/step, net +3.0 KiB (~3 allocations of 1.0 KiB)",
        "category": None, "series": [1024, 2048, 3072, 4096], "frame": None,
    }
    assert data["considered"] == [] and data["unseen_devices"] == []


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        torchmem.GrowthMonitor(warmup=-1)
    with pytest.raises(ValueError, match="min_steps must be an int >= 1"):
        torchmem.GrowthMonitor(min_steps=0)
    with pytest.raises(ValueError, match="not a device name"):
        torchmem.GrowthMonitor(devices=["gpu0"])


def test_the_monitor_keeps_bounded_state_however_long_the_loop_runs():
    # A monitor stepped every iteration of a days-long job must not grow with the steps:
    # it keeps a running summary per tag and site, and only the last values for reports.
    with torchmem.GrowthMonitor(warmup=1, by_site=False) as monitor:
        for _ in range(300):
            leaky_step()
            monitor.step()
    (growth,) = [growth for growth in monitor.report().tags if growth.name == "history"]
    assert growth.steps == 299
    assert growth.total_bytes == 299 * 1024
    assert len(growth.series) == 64
    assert growth.series[-1] - growth.series[0] == 63 * 1024
    assert all(len(trend.recent) <= 64 for trend in monitor._trends.values())
    assert all(len(trend.points) <= trend.MAX_POINTS for trend in monitor._trends.values())
