"""How the capture and the HTML report scale with the trace: write, read, render, and load in
a real browser, for a training-like loop that fills the trace ring.

    python benchmarks/report_scale.py                 # 100k trace events (record_trace's default)
    python benchmarks/report_scale.py --events 20000 --chromium /usr/bin/chromium

Prints one line per measure. The browser figure is the page's own: milliseconds from the
start of navigation until every chart is drawn (``data-drawn-ms`` on ``<body>``), read
from the DOM that headless Chromium dumps; the wall time of the Chromium process
(start-up included) is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import torchmem


def _workload(events: int) -> None:
    """A loop with three tags and a tracked model: ~8 trace events per step."""
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchmem.track(model, optimizer)
    kept = []
    step = 0
    engine = torchmem._C.cpu_engine()
    while True:
        with torchmem.tag("forward"):
            loss = model(torch.randn(32, 128)).square().mean()
        with torchmem.tag("backward"):
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            with torchmem.tag("cache"):
                kept.append(torch.zeros(4096))
        step += 1
        if step % 500 == 0 and len(engine.trace()) >= events:
            break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()

    torchmem.install("cpu")
    torchmem.record_trace(args.events)
    start = time.perf_counter()
    _workload(args.events)
    print(f"workload: {time.perf_counter() - start:.1f} s, trace events {len(torchmem._C.cpu_engine().trace()):,}")

    with tempfile.TemporaryDirectory() as directory:
        capture_path = os.path.join(directory, "scale.tmem")
        start = time.perf_counter()
        torchmem.write_capture(capture_path)
        print(f"write_capture: {time.perf_counter() - start:.2f} s, {os.path.getsize(capture_path) / 2**20:.2f} MiB")
        start = time.perf_counter()
        capture = torchmem.load_capture(capture_path)
        print(f"load_capture: {time.perf_counter() - start:.2f} s")
        start = time.perf_counter()
        capture.render()
        print(f"render (text): {time.perf_counter() - start:.2f} s")
        html_path = os.path.join(directory, "scale.html")
        start = time.perf_counter()
        capture.write_html(html_path)
        print(f"write_html: {time.perf_counter() - start:.2f} s, {os.path.getsize(html_path) / 2**20:.2f} MiB")
        if not args.chromium:
            print("browser: no chromium found (apt-get install chromium)")
            return 0
        start = time.perf_counter()
        dom = subprocess.run(
            [args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
             "--dump-dom", f"file://{html_path}"],
            capture_output=True, text=True, timeout=300,
        ).stdout
        wall = time.perf_counter() - start
        drawn = re.search(r'data-drawn-ms="(\d+)"', dom)
        errors = re.search(r'data-script-errors="(\d+)"', dom)
        print(f"browser: charts drawn {drawn.group(1) if drawn else '?'} ms after navigation start "
              f"(chromium process {wall:.1f} s wall), script errors: {errors.group(1) if errors else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
