"""The README's own example, ``python -m torchmem run examples/leaky_training.py``, as a user
reads it: 19 per-step copies, each in its own reference cycle, counted as leaked.

The script's classes become garbage with their instances once ``run`` releases the script's
globals; every instance refers to its class, so judged by connectivity all 19 cycles were one
"island" and the report said "no leaks". The cycle policy decides from what repeats instead.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_readme_example_counts_each_steps_copy_as_a_leak():
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "examples/leaky_training.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )

    # run leaves its capture where it ran, as memray does: named in the report, removed here.
    written = [line.split("capture written to ", 1)[1] for line in result.stderr.splitlines()
               if line.startswith("capture written to ")]
    for path in written:
        os.unlink(path)
    assert result.returncode == 0, result.stderr
    assert [os.path.basename(path) for path in written] == [f"torchmem-leaky_training.{_pid(result.stderr)}.tmem"]
    report = result.stderr
    assert (
        "torchmem.leak_check: 304.0 KiB in 19 blocks allocated inside are still alive (cycle 304.0 KiB in 19 blocks)"
        in report
    ), report
    assert "no leaks" not in report
    assert "  304.0 KiB in 19 blocks  cycle  cpu  tag=logging\n" in report
    assert "counted: 19 separate cycles held by StepReport, each dropped on its own" in report
    assert "allocated at  examples/leaky_training.py:31  self.state = metric.total.clone()" in report


def _pid(report: str) -> str:
    return report.split("torchmem-leaky_training.", 1)[1].split(".", 1)[0]
