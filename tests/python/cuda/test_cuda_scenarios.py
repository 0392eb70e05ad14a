"""The Composer bug on CUDA tensors, where the deep copies themselves come from torchmem.

On the simulated device kernels do not run (values are arbitrary), but every allocation,
copy and free is real, which is all a leak check looks at.
"""

import gc
import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402

import torchmem  # noqa: E402
from composer_model import ComposerLikeTrainer, run_composer_like_training  # noqa: E402
from leak_helpers import collector_paused, line_of, owner_paths, site_of  # noqa: E402


def test_composer_bug_on_cuda_fails_the_default_check_naming_the_deepcopy_line():
    trainer = ComposerLikeTrainer(device="cuda")
    with collector_paused(), torchmem.GrowthMonitor(warmup=1) as monitor:
        with pytest.raises(torchmem.LeakError) as raised:
            with torchmem.leak_check(devices=["cuda:0"]):  # the default cycle policy
                run_composer_like_training(trainer, steps=10, monitor=monitor)
    report = raised.value.report

    deepcopy_line = (
        inspect.getsourcefile(ComposerLikeTrainer),
        line_of(ComposerLikeTrainer._compute_and_log_metrics, "metrics = deepcopy(metrics)"),
    )
    copied = [finding for finding in report.cycle if site_of(finding) == deepcopy_line]
    # Each batch copies both metrics' states (tp, fp, tn, fn) and their defaults.
    assert len(copied) == 10 * 2 * 8
    assert all(finding.counted and finding.device == "cuda:0" and finding.tag == "metrics" for finding in copied)
    assert all("10 separate cycles held by Binary" in finding.note for finding in copied)
    assert {path for finding in copied for path in owner_paths(finding)} >= {
        "<BinaryAccuracy>.tp", "<BinaryF1Score>.fn", "<BinaryAccuracy>._defaults['tp']",
    }
    text = report.render()
    assert "metrics = deepcopy(metrics)  # the bug, removed by mosaicml/composer#3180" in text
    assert "(reference cycle: freed only by gc)" in text
    site_growth = [g for g in monitor.report().sites if g.frame.line == deepcopy_line[1]]
    assert len(site_growth) == 1 and site_growth[0].bytes_per_step == 2 * 8 * 512
    gc.collect()


def test_composer_fixed_on_cuda_has_no_cycle_and_no_growth():
    class FixedTrainer(ComposerLikeTrainer):
        def _compute_and_log_metrics(self, metrics: dict) -> None:
            computed = {name: metric.compute() for name, metric in metrics.items()}
            self.logged.append({name: float(value) for name, value in computed.items()})

    trainer = FixedTrainer(device="cuda")
    with collector_paused(), torchmem.GrowthMonitor(warmup=1, by_site=False) as monitor:
        with torchmem.leak_check(raise_on_leak=False, devices=["cuda:0"]) as report:
            run_composer_like_training(trainer, steps=10, monitor=monitor)
    assert report.cycle == []
    assert not monitor.report().has_growth
