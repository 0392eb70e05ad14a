"""``python -m torchmem demo``: the Composer metrics leak, caught and named.

Composer's Trainer logged its training metrics after every batch through
``_compute_and_log_metrics``, whose first line was ``metrics = deepcopy(metrics)``
(mosaicml/composer#3153, fixed by PR #3180). A torchmetrics ``Metric`` refers to itself
(its ``update`` and ``compute`` are wrapped in closures over the bound methods, stored
on the instance), so every copy is a reference cycle: dropping it frees nothing, only
the garbage collector can, and it does not notice memory held by tensors. Device
memory grew by the size of the metric state on every batch until the run died.

The demo trains a tiny classifier with a miniature of that Trainer, first with the
bug and then with the fix (compute on the metrics themselves), each loop under
``torchmem.leak_check`` and ``torchmem.GrowthMonitor``, and prints what they report.
"""

from __future__ import annotations

import copy
import gc
import sys
import textwrap

import torch
from torch import nn
from torch.nn import functional as F

import torchmem
from torchmem._support.units import format_bytes

# 512 classes: the confusion matrix is 512 x 512 int64 = 2 MiB of tensor state per
# Metric, big enough to stand out and small enough to run anywhere in a few seconds.
NUM_CLASSES = 512
FEATURES = 64
BATCH = 64
MIN_STEPS, MAX_STEPS = 3, 100
STATE_SIZE = format_bytes(NUM_CLASSES * NUM_CLASSES * 8)  # int64 confusion matrix


INTRO = """\
torchmem demo: the Composer metrics leak (mosaicml/composer#3153)

A tiny classifier trains for {steps} steps on {devices}. As in Composer's Trainer before PR #3180,
every batch logs its metrics through `metrics = copy.deepcopy(metrics)`; the metric, a
torchmetrics MulticlassConfusionMatrix, holds {state} of tensors. A torchmetrics Metric refers
to itself, so each copy is a reference cycle: only Python's garbage collector can free it, and
the collector does not count tensor memory. (It is paused during the loops so that the demo is
the same on every run; in a long job the copies reach its oldest generation, rarely scanned.)
"""

class MiniTrainer:
    """The part of Composer's Trainer that matters here: a model, training metrics updated
    every batch, and ``_compute_and_log_metrics`` logging them (and keeping the latest values)."""

    def __init__(self, device: torch.device, fixed: bool):
        from torchmetrics.classification import MulticlassConfusionMatrix

        # The same weights and data on every run: the demo's output is meant to be reproducible.
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(0)
        self.fixed = fixed
        self.model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES)).to(device)
        self.train_metrics = {"ConfusionMatrix": MulticlassConfusionMatrix(num_classes=NUM_CLASSES).to(device)}
        self.inputs = torch.randn(BATCH, FEATURES, generator=generator).to(device)
        self.targets = torch.randint(0, NUM_CLASSES, (BATCH,), generator=generator).to(device)
        self.latest: dict[str, torch.Tensor] = {}  # the last value of each metric, as a logger keeps it

    def train_batch(self) -> float:
        outputs = self.model(self.inputs)
        loss = F.cross_entropy(outputs, self.targets)
        loss.backward()
        # Plain SGD by hand: torch.optim would import TorchDynamo (seconds) for nothing here.
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.add_(parameter.grad, alpha=-0.05)
                parameter.grad = None
        with torchmem.tag("metrics"):  # per-tag accounting: the reports say "tag=metrics"
            for metric in self.train_metrics.values():
                metric.update(outputs.detach(), self.targets)
            if self.fixed:
                self._compute_and_log_metrics_fixed(self.train_metrics)
            else:
                self._compute_and_log_metrics(self.train_metrics)
        return loss.item()

    def _compute_and_log_metrics(self, metrics: dict) -> None:
        """Composer before PR #3180."""
        metrics = copy.deepcopy(metrics)  # the bug: each copy is a reference cycle holding tensors
        for name, metric in metrics.items():
            self.latest[name] = metric.compute()

    def _compute_and_log_metrics_fixed(self, metrics: dict) -> None:
        """The fix (PR #3180): ``compute()`` leaves a metric's state alone, so no copy is needed."""
        for name, metric in metrics.items():
            self.latest[name] = metric.compute()


def _loop(device: torch.device, fixed: bool, steps: int, out) -> tuple:
    """Trains ``steps`` batches under a leak check and a growth monitor; returns their reports."""
    trainer = MiniTrainer(device, fixed)
    # One batch before the checks: autograd and the metric build their lazy state on first use.
    trainer.train_batch()
    # The collector is paused so that the demo is the same on every run. In a real job the
    # copies live just as long: they reach its oldest generation, which it rarely scans.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torchmem.leak_check(raise_on_leak=False) as leaks, torchmem.GrowthMonitor(warmup=1) as growth:
            for step in range(1, steps + 1):
                loss = trainer.train_batch()
                growth.step()
                allocated = format_bytes(torchmem.memory_allocated(device))
                print(f"    step {step}  loss {loss:.3f}  allocated on {device}: {allocated}", file=out)
            # The trainer keeps the latest metric values on purpose: declared, not leaked.
            for value in trainer.latest.values():
                torchmem.expect_alive(value)
        growth_report = growth.report()
    finally:
        if gc_was_enabled:
            gc.enable()
    # A Metric is a reference cycle itself: free this trainer's now, not during the next loop.
    del trainer
    gc.collect()
    return leaks, growth_report


def _indent(text: str) -> str:
    return textwrap.indent(text, "    ")


def _run_on(device: torch.device, steps: int, out) -> bool:
    """Both loops on one device; True when the buggy one is caught and the fixed one is clean."""
    print(f"1) the loop with the bug, on {device}: every batch deep-copies the metrics to log them", file=out)
    leaks, growth = _loop(device, fixed=False, steps=steps, out=out)
    print("", file=out)
    print("  torchmem.leak_check() around the loop:", file=out)
    print(_indent(leaks.render()), file=out)
    print("", file=out)
    print("  torchmem.GrowthMonitor(), stepped once per batch:", file=out)
    print(_indent(growth.render()), file=out)
    caught = bool(leaks.leaked) and growth.has_growth

    print("", file=out)
    print(f"2) the fixed loop (PR #3180), on {device}: compute() on the metrics themselves, no copy", file=out)
    fixed_leaks, fixed_growth = _loop(device, fixed=True, steps=steps, out=out)
    print("", file=out)
    print(_indent(fixed_leaks.render()), file=out)
    print("", file=out)
    print(_indent(fixed_growth.render()), file=out)
    clean = not fixed_leaks.has_leaks and not fixed_growth.has_growth
    return caught and clean


def _devices(choice: str) -> list[torch.device]:
    from torchmem.integrations import devices

    return [torch.device(kind, 0) if kind == "cuda" else torch.device(kind) for kind in devices.device_types(choice)]


def check_steps(steps) -> int:
    """``steps`` when the demo can run that many; ValueError / TypeError otherwise."""
    from torchmem._support.validate import require_int

    return require_int(
        steps, what="steps", minimum=MIN_STEPS, maximum=MAX_STEPS,
        meaning=f"a warm-up step and two to judge growth; each buggy step keeps {STATE_SIZE} more alive",
    )


def main(device: str = "auto", steps: int = 10, out=None) -> int:
    """Runs the demo; returns 0 when torchmem caught the leak and the fixed loop is clean."""
    out = sys.stdout if out is None else out
    check_steps(steps)
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        print("torchmem demo: needs torchmetrics (pip install torchmetrics)", file=sys.stderr)
        return 1
    devices = _devices(device)
    for each in devices:
        torchmem.install(each.type)

    # Tensors this small gain nothing from intra-op threads, and on a busy machine OpenMP's
    # spinning threads made each op about a hundred times slower (seconds per loop).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_demo(devices, steps, out)
    finally:
        torch.set_num_threads(threads)


def _run_demo(devices: list[torch.device], steps: int, out) -> int:
    names = " and ".join(str(each) for each in devices)
    print(INTRO.format(steps=steps, devices=names, state=STATE_SIZE), file=out)
    ok = True
    for each in devices:
        ok = _run_on(each, steps, out) and ok
        print("", file=out)
    print(
        textwrap.dedent(
            """\
            Find this in your own code:
              python -m torchmem run train.py           summary and leaks at exit (--snapshot, --json)
              with torchmem.leak_check(): ...           in a test: fails with this report
              torchmem.GrowthMonitor().step()           once per training step"""
        ),
        file=out,
    )
    if not ok:
        print("torchmem demo: the reports above are not what the demo expects (see above)", file=sys.stderr)
    return 0 if ok else 1
