"""Regenerates the HTML report screenshots in docs/images/ (run by hand after changing the page).

    python scripts/report_screenshots.py

Runs examples/leaky_training.py's loop in this process with torchmem (CPU), the model and
optimizer tracked, a leak check around it, writes the capture and the HTML report to
build/report-example/, and takes screenshots of the page with headless Chromium.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import torch  # noqa: E402

import torchmem  # noqa: E402


def main() -> int:
    import leaky_training

    torchmem.install("cpu")
    torchmem.record_trace(sample_interval=0.005)
    original = torch.optim.SGD

    class TrackedSGD(original):  # track the example's model and optimizer as a user would
        def __init__(self, params, *args, **kwargs):
            params = list(params)
            super().__init__(params, *args, **kwargs)
            torchmem.track(*_modules_of(params), self)

    torch.optim.SGD = TrackedSGD
    try:
        with torchmem.leak_check(raise_on_leak=False) as report:
            leaky_training.main(steps=40)
    finally:
        torch.optim.SGD = original
    out = os.path.join(ROOT, "build", "report-example")
    os.makedirs(out, exist_ok=True)
    capture = torchmem.write_capture(os.path.join(out, "leaky_training.tmem"), leaks=report,
                                     label="examples/leaky_training.py")
    page = torchmem.write_html(os.path.join(out, "leaky_training.html"), capture)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    for name, height in (("report-top", 1500), ("report-full", 6200)):
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size=1400,{height}",
                        f"--screenshot={os.path.join(ROOT, 'docs', 'images', name + '.png')}", f"file://{page}"],
                       check=True, capture_output=True)
    print(f"wrote {capture}, {page} and docs/images/report-*.png")
    return 0


def _modules_of(params):
    """The example's model: the module whose parameters these are (found through gc)."""
    import gc

    wanted = {id(p) for p in params}
    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.Sequential) and {id(p) for p in obj.parameters()} == wanted:
            return [obj]
    return []


if __name__ == "__main__":
    sys.exit(main())
