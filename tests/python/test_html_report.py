"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``, installed by
scripts/install.sh) loads one page that has every part, once, takes a screenshot and dumps
the DOM after the page's scripts ran; the test reads what a user would see there."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest
import torch

import torchmem
from torchmem.reports import capture as _capture
from torchmem.reports import categories as _categories
from torchmem.reports import collect as _collect

HOARD: list = []  # what the page's leak section must name


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("the HTML report test needs Debian's chromium: apt-get install chromium (scripts/install.sh "
                "installs it)", pytrace=False)


def _run_a_tracked_training_loop_that_hoards_and_runs_out_of_memory():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters())
    tracking = torchmem.track(model, optimizer)
    with torchmem.leak_check(raise_on_leak=False) as report:
        for _ in range(3):
            with torchmem.tag("train"):
                loss = model(torch.randn(32, 64)).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            with torchmem.tag("history"):
                HOARD.append(torch.zeros(32 * 1024))  # 128 KiB a step, "for later"
    torchmem.set_memory_limit(64 * 2**20, "cpu")
    try:
        with pytest.raises(torch.OutOfMemoryError) as error:
            torch.empty(256 * 2**20, dtype=torch.uint8)
    finally:
        torchmem.set_memory_limit(0, "cpu")
    return report, str(error.value), tracking


@pytest.fixture
def page(tmp_path):
    torchmem.install("cpu")
    torchmem.record_trace(sample_interval=0.01)
    try:
        report, oom_message, tracking = _run_a_tracked_training_loop_that_hoards_and_runs_out_of_memory()
        ranks = []
        for rank in (0, 1):
            data = _collect.collect(leaks=report, oom_message=oom_message, label="train.py")
            data["meta"].update(rank=rank, world_size=2)
            ranks.append(_capture.Capture(data))
        single = _capture.Capture(_collect.collect(leaks=report, oom_message=oom_message, label="train.py"))
    finally:
        torchmem.record_trace(0)
        for active in list(_categories._trackings):
            active.stop()
        HOARD.clear()
    job_path = torchmem.write_html(tmp_path / "job.html", ranks)
    return {"single": single, "job_path": job_path, "tmp": tmp_path}


def test_the_report_loads_in_chromium_with_every_part_and_no_script_error(page):
    screenshot = page["tmp"] / "report.png"
    result = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,2400",
         f"--screenshot={screenshot}", "--dump-dom", f"file://{page['job_path']}"],
        capture_output=True, text=True, timeout=180,
    )
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert "data-script-errors" not in body, re.search(r'id="torchmem-errors"[^>]*>([^<]*)', dom).group(1)
    drawn = int(re.search(r'data-charts-drawn="(\d+)"', body).group(1))
    # Per rank: the timelines by tag and by category, two icicles; and the job's timeline per rank.
    assert drawn == 2 * 4 + 1
    assert dom.count('class="main-svg"') >= drawn  # plotly drew an SVG into every chart
    # Every chart has a place of its own on the page (two ranks with a "cpu" each must not
    # draw into the first rank's charts), and plotly drew into each.
    places = re.findall(r'<div class="chart[^"]*" id="([^"]+)"', dom)
    assert len(places) == len(set(places)) == drawn, places
    assert len(re.findall(r'<div class="chart[^"]*js-plotly-plot[^"]*" id="', dom)) == drawn
    assert screenshot.stat().st_size > 50_000

    text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
    words = " ".join(text.split())
    # A row per rank.
    assert re.search(r"rank device peak in use .* 0 cpu .* 1 cpu ", words)
    # Where memory was allocated: the hoarding line, with its source, by live bytes.
    live_table = words.split("top allocation sites by live bytes")[1]
    assert "HOARD.append(torch.zeros(32 * 1024))" in live_table.split("top allocation sites")[0]
    # What leaked: the holder and the line.
    assert "384.0 KiB in 3 blocks reachable cpu · tag=history" in words
    assert f"held by {__name__}.HOARD[0..2]" in words and "test_html_report.py:" in words
    # Categories, per module.
    assert re.search(r"optimizer state [\d.]+ KiB", words) and "Sequential.0" in words
    # The cache's segments, drawn block by block.
    assert dom.count("<rect ") > 4
    # Out of memory: the request and torchmem's message.
    assert "256.0 MiB" in words.split("Out of memory")[-1]
    assert "out of memory" in words.split("Out of memory")[-1].lower()


def test_the_page_is_one_file_that_needs_no_network(page, tmp_path):
    path = page["single"].write_html(tmp_path / "single.html")
    text = open(path, encoding="utf-8").read()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"?https?:", text)
    assert "Plotly.newPlot" in text and text.count("<script") == 4
    assert "</script>" not in text.split('id="torchmem-charts"')[1].split("</script>")[0]
    # From a saved capture too, with the same parts.
    capture_path = page["single"].write(tmp_path / "single.tmem")
    again = torchmem.write_html(tmp_path / "again.html", capture_path)
    assert os.path.getsize(again) > 1_000_000 and 'id="leaks"' in open(again, encoding="utf-8").read()
    with pytest.raises(TypeError, match="capture must be None, a Capture, a .tmem path or a list"):
        torchmem.write_html(tmp_path / "x.html", 42)
