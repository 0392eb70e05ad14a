"""GrowthMonitor's verdict comes from the trend after warm-up, as real loops leak and do not leak.

Real leaks are intermittent (something kept every N steps, a cache that misses sometimes)
and noisy (temporaries of varying size in the same tag); real loops that do not leak grow
for a while (a cache that fills, an optimizer creating its state) or rise and fall back.
Each test runs the loop under ``GrowthMonitor`` and asserts what the report says.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchmem
from leak_helpers import line_of, torchmem_cpu  # noqa: F401

KiB = 1024
KEPT: list = []
CACHE: dict = {}
SCRATCH: list = []


@pytest.fixture(autouse=True)
def empty_globals():
    yield
    KEPT.clear()
    CACHE.clear()
    SCRATCH.clear()


def monitor_loop(step, steps: int = 40, warmup: int = 2, **options) -> torchmem.GrowthReport:
    with torchmem.GrowthMonitor(warmup=warmup, **options) as monitor:
        for index in range(steps):
            step(index)
            monitor.step()
    return monitor.report()


def keep_64_kib(index: int) -> None:
    with torchmem.tag("history"):
        KEPT.append(torch.zeros(16 * KiB))  # kept: 64 KiB


def temporaries(index: int) -> None:
    with torchmem.tag("train"):
        activations = torch.randn(64, 64)
        (activations @ activations).sum().item()


# --- intermittent leaks: rows 4 and 5 of issue 23 -------------------------------------------


def test_64_kib_kept_every_other_step_is_growth_with_its_rate_net_bytes_and_rising_steps():
    def step(index):
        temporaries(index)
        if index % 2:
            keep_64_kib(index)

    report = monitor_loop(step)

    assert report.has_growth
    (tag,) = report.tags
    # Kept on steps 1, 3, ..., 39; the baseline (after warm-up's 2 steps) holds the first.
    assert (tag.name, tag.total_bytes, tag.steps, tag.rising_steps) == ("history", 19 * 64 * KiB, 38, 19)
    assert tag.bytes_per_step == pytest.approx(32 * KiB, rel=0.01)
    (site,) = report.sites
    assert site.frame.line == line_of(keep_64_kib, "# kept: 64 KiB")
    text = report.render()
    assert text.startswith("torchmem.GrowthMonitor: live memory grew over the 38 steps after 2 warm-up step(s)")
    assert "+32.0 KiB/step ± 239 B   +1.2 MiB over 38 steps   19 of 38 steps   cpu      tag=history" in text
    assert "KEPT.append(torch.zeros(16 * KiB))  # kept: 64 KiB" in text
    assert site.reason == (
        "rose on 19 of 38 steps, slope +32.0 KiB/step ± 239 B, net +1.2 MiB (~19 allocations of 64.0 KiB)"
    )


def test_kept_on_every_step_but_one_is_growth():
    def step(index):
        if index != 20:
            keep_64_kib(index)

    report = monitor_loop(step)

    (tag,) = report.tags
    assert (tag.name, tag.rising_steps, tag.steps, tag.total_bytes) == ("history", 37, 38, 37 * 64 * KiB)
    assert "37 of 38 steps" in report.render()


def test_kept_every_fifth_step_is_growth():
    report = monitor_loop(lambda index: index % 5 == 4 and keep_64_kib(index))

    (tag,) = report.tags
    assert (tag.name, tag.rising_steps, tag.total_bytes) == ("history", 8, 8 * 64 * KiB)


def test_a_site_first_seen_after_warmup_is_growth():
    # The leak starts on step 10 (a code path taken from then on): before it, the site had
    # no live bytes at all, so it is first seen long after the end of warm-up.
    def step(index):
        temporaries(index)
        if index >= 10:
            keep_64_kib(index)

    report = monitor_loop(step)

    (site,) = report.sites
    assert site.frame.line == line_of(keep_64_kib, "# kept: 64 KiB")
    assert (site.steps, site.rising_steps, site.total_bytes) == (38, 30, 30 * 64 * KiB)
    assert site.series[:10] == (0,) * 9 + (64 * KiB,)  # samples after steps 2-10, then 11


# --- noise --------------------------------------------------------------------------------------


def noisy_leak(index: int, noise: random.Random) -> None:
    with torchmem.tag("train"):
        SCRATCH[:] = [torch.zeros(noise.randrange(1, 16) * KiB)]  # scratch: 4-60 KiB, replaced every step
        KEPT.append(torch.zeros(4 * KiB))  # leak: 16 KiB per step


def test_a_leak_under_noise_is_growth_and_the_noise_alone_is_not():
    noise = random.Random(23)
    report = monitor_loop(lambda index: noisy_leak(index, noise))

    assert [growth.name for growth in report.tags] == ["train"]
    assert [growth.frame.line for growth in report.sites] == [line_of(noisy_leak, "# leak: 16 KiB per step")]
    assert report.tags[0].rising_steps < report.tags[0].steps  # the noise made some steps fall
    assert report.sites[0].bytes_per_step == 16 * KiB


def test_noise_that_does_not_grow_is_not_growth():
    noise = random.Random(5)

    def step(index):
        with torchmem.tag("train"):
            SCRATCH[:] = [torch.zeros(noise.randrange(1, 64) * KiB)]

    report = monitor_loop(step)

    assert not report.has_growth
    assert report.render().startswith("torchmem.GrowthMonitor: no growth")


# --- growth that is not a leak ------------------------------------------------------------------


def fill_cache(index: int) -> None:
    with torchmem.tag("cache"):
        key = min(index, 10)  # the cache holds 11 entries once step 10 has run
        if key not in CACHE:
            CACHE[key] = torch.zeros(16 * KiB)  # cache entry


def test_a_cache_that_fills_then_stays_flat_is_not_growth_and_the_report_says_why():
    report = monitor_loop(fill_cache)

    assert not report.has_growth
    text = report.render()
    assert text.startswith(
        "torchmem.GrowthMonitor: no growth: no tag or allocation site kept growing over the 38 steps"
    )
    considered = {growth.kind: growth for growth in report.considered}
    assert considered["tag"].name == "cache" and considered["tag"].total_bytes == 9 * 64 * KiB
    assert considered["tag"].reason.startswith("stopped growing: slope +0 B/step over the last 12 steps")
    assert "rose, but not a leak's trend (why not):" in text
    assert "+576.0 KiB   cpu      tag=cache" in text


def test_an_optimizer_creating_its_state_on_the_first_step_is_not_growth():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.Adam(model.parameters())
    batch = torch.randn(16, 64)

    def train_step(index):
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()  # Adam's moments: made on the first step, updated in place after

    # warmup=0: the first step, which creates the gradients and the optimizer's state, is measured.
    report = monitor_loop(train_step, steps=20, warmup=0)

    assert not report.has_growth
    reasons = [growth.reason for growth in report.considered]
    assert reasons and all("not kept step after step" in reason for reason in reasons)


def test_memory_that_rises_and_falls_back_is_not_growth():
    def rise_then_fall(index):
        if index < 20:
            keep_64_kib(index)
        else:
            KEPT.pop()

    assert not monitor_loop(rise_then_fall).has_growth


def test_buffers_accumulated_and_flushed_every_few_steps_are_not_growth():
    def accumulate_and_flush(index):
        keep_64_kib(index)
        if index % 6 == 5:
            KEPT.clear()  # flushed: written to a log every 6 steps

    report = monitor_loop(accumulate_and_flush)

    assert not report.has_growth
    (history,) = [growth for growth in report.considered if growth.kind == "tag"]
    assert history.reason == (
        "net +128.0 KiB is only 2 step increase(s) of ~64.0 KiB (fewer than 3): not kept step after step"
    )


# --- categories ----------------------------------------------------------------------------------


class GrowingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def remember(self, index: int) -> None:
        self.register_buffer(f"seen_{index}", torch.zeros(4 * KiB))  # a buffer per step


def test_a_growing_site_shows_the_category_its_memory_is_in():
    model = GrowingModel()
    with torchmem.track(model):
        report = monitor_loop(model.remember, steps=12, warmup=1)

    (site,) = report.sites
    assert site.category == "parameters"
    (category,) = report.categories
    assert (category.name, category.total_bytes) == ("parameters", 11 * 16 * KiB)
    text = report.render()
    assert "  per category\n" in text
    assert "cpu      parameters   tests/python/test_growth_monitor.py:" in text
    assert "# a buffer per step" in text


# --- a monitor that cannot see -------------------------------------------------------------------


def test_a_monitor_on_a_device_torchmem_does_not_serve_says_it_cannot_judge():
    torchmem.uninstall("cpu")
    try:
        report = monitor_loop(keep_64_kib, steps=6)
    finally:
        torchmem.install("cpu")

    assert not report.has_growth
    assert report.unseen_devices == ["cpu"]
    assert report.render() == (
        "torchmem.GrowthMonitor: cannot judge growth: torchmem did not serve cpu while the monitor ran, so "
        "memory allocated there never reached it; call torchmem.install('cpu') before the loop (or run the "
        "script with `python -m torchmem run`)"
    )


# --- the documentation's example -----------------------------------------------------------------


def test_the_example_in_docs_growth_md_prints_what_the_page_shows(tmp_path):
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "growth.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", page, re.S).group(1)
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))

    result = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True)

    assert result.returncode == 0, result.stderr
    assert result.stdout == shown
