"""GrowthMonitor on the (simulated) CUDA device: an intermittent leak of CUDA memory is
growth, a CUDA cache that fills and then stays flat is not, and a growing site shows its
category while a model is tracked."""

from __future__ import annotations

import torch
from torch import nn

import torchmem

KiB = 1024


def monitor_loop(step, steps: int = 40, warmup: int = 2) -> torchmem.GrowthReport:
    with torchmem.GrowthMonitor(warmup=warmup, devices=["cuda:0"]) as monitor:
        for index in range(steps):
            step(index)
            monitor.step()
    return monitor.report()


def test_cuda_memory_kept_every_other_step_is_growth_and_a_filled_cache_is_not():
    kept, cache = [], {}

    def step(index):
        batch = torch.randn(64, 256, device="cuda")
        with torchmem.tag("cache"):
            cache.setdefault(min(index, 9), torch.zeros(4 * KiB, device="cuda"))
        with torchmem.tag("history"):
            if index % 2:
                kept.append(batch.clone())  # kept: 64 KiB every other step

    report = monitor_loop(step)

    assert [(growth.name, growth.device, growth.rising_steps, growth.total_bytes) for growth in report.tags] == [
        ("history", "cuda:0", 19, 19 * 64 * KiB)
    ]
    assert [growth.device for growth in report.sites] == ["cuda:0"]
    assert "kept.append(batch.clone())  # kept: 64 KiB every other step" in report.render()
    (cache_tag,) = [growth for growth in report.considered if growth.name == "cache"]
    assert cache_tag.reason.startswith("stopped growing")


def test_a_growing_cuda_site_shows_its_category_while_the_model_is_tracked():
    model = nn.Linear(16, 16).cuda()

    def step(index):
        model.register_buffer(f"seen_{index}", torch.zeros(KiB, device="cuda"))  # a buffer per step

    with torchmem.track(model):
        report = monitor_loop(step, steps=12, warmup=1)

    (site,) = report.sites
    assert (site.device, site.category) == ("cuda:0", "parameters")
    assert [growth.name for growth in report.categories] == ["parameters"]
