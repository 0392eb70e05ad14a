"""Real leaks, and real non-leaks, in training code, with torch and torchmetrics.

(a) The Composer bug (mosaicml/composer#3153, fixed by #3180): every batch the trainer
    deep-copied its torchmetrics metrics and computed on the copy. A Metric refers to
    itself (``metric.update`` wraps the bound method ``metric.update``), so every copy is a
    reference cycle: its tensors are freed only when the cyclic collector runs, which for
    objects in its oldest generation can be very late. Memory grew until the run died.
(b) Leaks something still holds: losses appended to a list with their graphs, an
    activation cached on a module attribute, a global cache keyed by step.
(c) Loops that only look like leaks: a clean loop, an optimizer creating its state on the
    first step (warm-up), memory the allocator keeps cached.
"""

from __future__ import annotations

import gc
import inspect

import pytest
import torch
from torch import nn

import torchmem
from composer_model import ComposerLikeTrainer, run_composer_like_training
from leak_helpers import collector_paused, line_of, owner_paths, site_of, torchmem_cpu  # noqa: F401

STEP_CACHE: dict = {}


@pytest.fixture(autouse=True)
def clean_globals():
    STEP_CACHE.clear()
    yield
    STEP_CACHE.clear()
    gc.collect()


# --- (a) the Composer bug ------------------------------------------------------------------
# The trainer lives in composer_model.py, shared with the CUDA session
# (tests/python/cuda/test_cuda_scenarios.py). On CPU too the deep copies come from torchmem:
# torch.UntypedStorage(n), which deepcopy uses, allocates through c10's default CPU
# allocator, which torchmem stands in for while installed.


def test_composer_bug_fails_the_default_check_naming_the_deepcopy_line():
    trainer = ComposerLikeTrainer()
    with collector_paused(), torchmem.GrowthMonitor(warmup=1) as monitor:
        with pytest.raises(torchmem.LeakError) as raised:
            with torchmem.leak_check():  # the defaults: cycles="repeating", cycle_repeats=8
                run_composer_like_training(trainer, steps=10, monitor=monitor)

    report = raised.value.report
    deepcopy_line = (
        inspect.getsourcefile(ComposerLikeTrainer),
        line_of(ComposerLikeTrainer._compute_and_log_metrics, "metrics = deepcopy(metrics)"),
    )
    copied = [finding for finding in report.cycle if site_of(finding) == deepcopy_line]
    # Each batch copies both metrics' states (tp, fp, tn, fn) and their defaults.
    assert len(copied) == 10 * 2 * 8
    assert all(finding.counted and finding.device == "cpu" and finding.tag == "metrics" for finding in copied)
    assert all("10 separate cycles held by Binary" in finding.note for finding in copied)
    assert {path for finding in copied for path in owner_paths(finding)} >= {
        "<BinaryAccuracy>.tp", "<BinaryF1Score>.fn", "<BinaryAccuracy>._defaults['tp']",
    }
    # What the copies computed (each copy caches its result) repeats too.
    computed = [finding for finding in report.cycle if finding not in copied]
    assert len(computed) == 20 and all(finding.counted for finding in computed)
    assert {owner_paths(finding)[0] for finding in computed} == {"<BinaryAccuracy>._computed", "<BinaryF1Score>._computed"}
    text = report.render()
    assert "metrics = deepcopy(metrics)  # the bug, removed by mosaicml/composer#3180" in text
    assert "BinaryAccuracy.update.__wrapped__.__self__ is the same BinaryAccuracy" in text
    # The live metrics' own state (rebound by every update) is reachable, by name.
    test = "test_composer_bug_fails_the_default_check_naming_the_deepcopy_line()"
    reachable = sorted(path for finding in report.reachable for path in owner_paths(finding))
    assert reachable == sorted(
        f"{test}:trainer.state.train_metrics['{name}'].{state}"
        for name in ("acc", "f1") for state in ("tp", "fp", "tn", "fn")
    )
    # Live memory grew on every step at the deepcopy line: both metrics' 8 states, 512 B each.
    site_growth = [growth for growth in monitor.report().sites if growth.frame.line == deepcopy_line[1]]
    assert len(site_growth) == 1 and site_growth[0].bytes_per_step == 2 * 8 * 512
    gc.collect()


def test_a_reused_check_around_each_step_judges_each_step_on_its_own():
    trainer = ComposerLikeTrainer()
    preds = torch.tensor([0.9, 0.2, 0.7, 0.4])
    target = torch.tensor([1, 0, 0, 1])
    check = torchmem.leak_check(raise_on_leak=False)
    reports = []
    with collector_paused():
        for _ in range(3):
            with check as report:
                trainer.train_batch(preds, target)
            reports.append(report)

    # Each exit collects the step's copies, so under a check around each step they never pile
    # up: one cycle per metric and step is an object in a cycle, not counted, on every step
    # (issue 23: a reused check judges each entry on its own). A check around the loop, or a
    # GrowthMonitor stepped per batch, catches the copies piling up.
    for report in reports:
        assert report.cycle and report.uncounted_cycles == report.cycle
        assert all(finding.note.startswith("not counted: 1 separate cycle held by") for finding in report.cycle)


def test_composer_after_the_fix_has_no_cycle_held_memory():
    class FixedTrainer(ComposerLikeTrainer):
        def _compute_and_log_metrics(self, metrics: dict) -> None:
            computed = {name: metric.compute() for name, metric in metrics.items()}
            self.logged.append({name: float(value) for name, value in computed.items()})

    trainer = FixedTrainer()
    with collector_paused(), torchmem.GrowthMonitor(warmup=1, by_site=False) as monitor:
        with torchmem.leak_check(raise_on_leak=False) as report:
            run_composer_like_training(trainer, steps=10, monitor=monitor)

    assert report.cycle == []
    assert not monitor.report().has_growth


# --- (b) leaks something still holds -----------------------------------------------------


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def train_keeping_losses(model: nn.Module, losses: list, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        losses.append(loss)  # the bug: keeps every step's loss and its graph


def test_losses_appended_with_their_graphs_are_reachable_through_the_list():
    model = make_model()
    losses: list = []

    with torchmem.leak_check(raise_on_leak=False) as report:
        train_keeping_losses(model, losses, steps=3)

    test = "test_losses_appended_with_their_graphs_are_reachable_through_the_list()"
    assert report.findings and all(finding.kind == "reachable" for finding in report.findings)
    for finding in report.findings:
        assert any(path.startswith(f"{test}:losses[") for path in owner_paths(finding)), finding
    paths = {path for finding in report.findings for path in owner_paths(finding)}
    assert {f"{test}:losses[0]", f"{test}:losses[2]"} <= paths
    assert f"{test}:losses[1] (in its autograd graph: AddmmBackward0._saved_mat1)" in paths
    assert "losses[0..2]" in report.render()


class CachingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(x).relu()
        self.last_hidden = hidden  # the bug: the module keeps the activation alive
        return self.head(hidden)


def test_an_activation_cached_on_a_module_attribute_is_reachable_through_it():
    model = CachingModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with torchmem.leak_check(raise_on_leak=False) as report:
        for _ in range(3):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    test = "test_an_activation_cached_on_a_module_attribute_is_reachable_through_it()"
    (finding,) = report.findings  # earlier steps' activations were replaced and freed
    assert finding.kind == "reachable"
    assert owner_paths(finding) == [f"{test}:model.last_hidden"]
    assert site_of(finding) == (__file__, line_of(CachingModel.forward, "hidden = self.encoder(x).relu()"))


def train_with_step_cache(model: nn.Module, steps: int) -> None:
    for step in range(steps):
        output = model(torch.randn(4, 8))
        STEP_CACHE[step] = output.detach()  # the bug: a cache nobody evicts


def test_a_global_cache_keyed_by_step_is_reachable_through_the_module_global():
    model = make_model()

    with torchmem.leak_check(raise_on_leak=False) as report:
        train_with_step_cache(model, steps=3)

    assert sorted(path for finding in report.findings for path in owner_paths(finding)) == [
        f"{__name__}.STEP_CACHE[{step}]" for step in range(3)
    ]
    assert all(finding.kind == "reachable" for finding in report.findings)
    assert f"held by       {__name__}.STEP_CACHE[0..2]" in report.render()


# --- (c) no leaks ------------------------------------------------------------------------


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def test_a_clean_training_loop_has_no_findings_and_no_growth():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.0)

    with torchmem.GrowthMonitor(warmup=1) as monitor, torchmem.leak_check() as report:
        for _ in range(5):
            train_step(model, optimizer)
            monitor.step()

    assert report.findings == []
    assert not monitor.report().has_growth


def test_optimizer_state_created_on_the_first_step_is_allowed_as_warmup():
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    check = torchmem.leak_check(warmup=1)
    reports = []

    for _ in range(4):
        with check as report:
            train_step(model, optimizer)
        reports.append(report)

    first, *later = reports
    # Adam's exp_avg, exp_avg_sq and step for each of the 4 parameters.
    assert len(first.allowed) == 12 and first.leaked == []
    assert {finding.note for finding in first.allowed} == {"warm-up entry 1 of 1"}
    assert all(report.findings == [] for report in later)


def test_without_warmup_the_same_optimizer_state_is_reported_and_named():
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    with pytest.raises(torchmem.LeakError) as raised:
        with torchmem.leak_check():
            train_step(model, optimizer)

    paths = {path for finding in raised.value.report.reachable for path in owner_paths(finding)}
    assert any(".state[" in path and path.endswith("['exp_avg']") for path in paths), paths


def test_memory_the_allocator_keeps_cached_between_batches_is_no_finding():
    def batches():
        for _ in range(4):
            yield torch.randn(256, 1024)  # 1 MiB per batch

    with torchmem.leak_check() as report:
        total = sum(batch.mean().item() for batch in batches())

    stats = torchmem.memory_stats("cpu")
    assert isinstance(total, float)
    assert stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"] >= 1 << 20
    assert report.findings == []
