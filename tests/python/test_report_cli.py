"""``torchmem run`` writing captures and the HTML report, and ``torchmem report`` / ``stats`` /
``diff`` reading them, as a user runs them: subprocesses, exit codes, files, what is printed."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap

import pytest

import torchmem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRAIN = """\
    import sys
    import torch
    import torchmem

    model = torch.nn.Linear(64, 64)
    HISTORY = []
    steps = int(sys.argv[1])
    for step in range(steps):
        with torchmem.tag("train"):
            loss = model(torch.randn(32, 64)).square().mean()
            loss.backward()
        with torchmem.tag("history"):
            HISTORY.append(torch.zeros(4096))  # 16 KiB a step, kept
    import builtins
    builtins.KEPT_FOREVER = HISTORY  # survives the script's globals: a leak at exit
"""


def cli(*args, cwd, env=None) -> subprocess.CompletedProcess:
    environment = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    environment.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-m", "torchmem", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of the same script (3 and 5 steps): the default capture, and --capture/--html."""
    tmp = tmp_path_factory.mktemp("runs")
    (tmp / "train.py").write_text(textwrap.dedent(TRAIN))
    first = cli("run", "--device", "cpu", "train.py", "3", cwd=tmp)
    second = cli("run", "--device", "cpu", "--capture", "after.tmem", "--html", "after.html", "train.py", "5", cwd=tmp)
    return tmp, first, second


def test_run_writes_a_capture_named_after_the_script_and_its_pid_by_default(runs):
    tmp, first, _ = runs
    assert first.returncode == 0, first.stderr[-3000:]
    (default,) = [name for name in os.listdir(tmp) if name.startswith("torchmem-train.")]
    assert re.fullmatch(r"torchmem-train\.\d+\.tmem", default)
    assert f"capture written to {tmp / default}" in first.stderr
    assert f"  render it: torchmem report {default} --html memory.html" in first.stderr
    capture = torchmem.load_capture(tmp / default)
    assert capture.label == "train.py"
    # The leak check's findings are in it, and the state before the globals were released.
    assert capture.leaks["report"]["leaked_bytes"] == 3 * 16384
    sites = {site.source: site.live_bytes for site in capture.sites("cpu")}
    assert sites['HISTORY.append(torch.zeros(4096))  # 16 KiB a step, kept'] == 3 * 16384
    assert sites["model = torch.nn.Linear(64, 64)"] == 64 * 64 * 4 + 64 * 4
    # Stacks end at the script's <module> frame, as under python train.py: torchmem run's own
    # frames are cut.
    outermost = {capture.stack(stack)[-1]["filename"] + ":" + capture.stack(stack)[-1]["name"]
                 for stack in capture.devices["cpu"]["blocks"]["stack"] if stack}
    assert outermost == {"train.py:<module>"}


def test_run_writes_the_html_report_it_is_asked_for(runs):
    tmp, _, second = runs
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"capture written to {tmp / 'after.tmem'}" in second.stderr
    assert f"HTML report written to {tmp / 'after.html'}" in second.stderr
    page = (tmp / "after.html").read_text()
    assert "HISTORY.append(torch.zeros(4096))" in page and 'id="leaks"' in page


def test_run_refuses_to_overwrite_a_capture_or_page_without_force(runs):
    tmp, _, _ = runs
    refused = cli("run", "--device", "cpu", "--capture", "after.tmem", "train.py", "1", cwd=tmp)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "python -m torchmem run: --capture after.tmem: the file exists; pass -f/--force to overwrite it")
    refused = cli("run", "--device", "cpu", "--no-capture", "--html", "after.html", "train.py", "1", cwd=tmp)
    assert refused.returncode == 2 and "--html after.html: the file exists; pass -f/--force" in refused.stderr
    both = cli("run", "--no-capture", "--capture", "x.tmem", "train.py", "1", cwd=tmp)
    assert both.returncode == 2 and "--capture PATH and --no-capture contradict each other" in both.stderr


def test_run_no_capture_writes_nothing(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    result = cli("run", "--device", "cpu", "--no-capture", "train.py", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["train.py"]
    assert "capture written" not in result.stderr


def test_report_renders_a_capture_as_text_json_and_html(runs):
    tmp, _, _ = runs
    text = cli("report", "after.tmem", "--top", "3", cwd=tmp)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"torchmem capture: train.py  (after.tmem)\n")
    live = text.stdout.split("top allocation sites on cpu by live bytes")[1].split("\n\n")[0]
    assert re.search(r"80\.0 KiB +5 +80\.0 KiB +train\.py:13 in <module>  HISTORY\.append", live)
    assert "torchmem.leak_check: 80.0 KiB in 5 blocks allocated inside are still alive" in text.stdout

    as_json = cli("report", "after.tmem", "--json", cwd=tmp)
    figures = json.loads(as_json.stdout)
    assert figures["devices"]["cpu"]["top_sites_by_live"][0]["live_bytes"] == 5 * 16384
    assert figures["leaks"]["leaked_bytes"] == 5 * 16384

    page = cli("report", "after.tmem", "--html", "again.html", cwd=tmp)
    assert page.returncode == 0 and page.stdout.strip() == f"HTML report written to {tmp / 'again.html'}"
    refused = cli("report", "after.tmem", "--html", "again.html", cwd=tmp)
    assert refused.returncode == 2 and "pass -f/--force to overwrite it" in refused.stderr
    assert cli("report", "after.tmem", "--html", "again.html", "-f", cwd=tmp).returncode == 0


def test_report_says_what_is_wrong_with_a_file_that_is_not_a_capture(tmp_path):
    missing = cli("report", "nothere.tmem", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "python -m torchmem report: nothere.tmem: no such file (torchmem run writes torchmem-<script>.<pid>.tmem)")
    (tmp_path / "notes.tmem").write_text("not a capture")
    damaged = cli("report", "notes.tmem", cwd=tmp_path)
    assert damaged.returncode == 1
    assert damaged.stderr.strip() == (
        "python -m torchmem report: 'notes.tmem' is not a torchmem capture (not gzip data; captures are written by "
        "torchmem.write_capture or torchmem run)")


def test_stats_counts_the_allocations_of_the_trace(runs):
    tmp, _, _ = runs
    result = cli("stats", "after.tmem", cwd=tmp)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("torchmem stats: train.py  (after.tmem)\n\ncpu\n")
    # Five steps: each a forward and backward (several blocks) and 16 KiB kept.
    allocations = int(re.search(r"allocations +([\d,]+)", out).group(1).replace(",", ""))
    assert allocations >= 5 * 4
    often = out.split("lines that allocated most often")[1].split("\n\n")[0]
    assert re.search(r"\n +5 +80\.0 KiB +train\.py:13 in <module>  HISTORY\.append", often)
    figures = json.loads(cli("stats", "after.tmem", "--json", cwd=tmp).stdout)
    assert figures["devices"]["cpu"]["allocations"] == allocations


def test_diff_shows_what_grew_between_two_runs_by_site_and_by_tag(runs):
    tmp, _, _ = runs
    (before,) = [name for name in os.listdir(tmp) if name.startswith("torchmem-train.")]
    by_site = cli("diff", before, "after.tmem", cwd=tmp)
    assert by_site.returncode == 0, by_site.stderr
    lines = by_site.stdout.splitlines()
    assert lines[0] == f"torchmem diff by site: after.tmem against {before}"
    assert lines[1] == "  live memory +32.0 KiB in total, 1 site changed"
    assert re.fullmatch(r" +\+32\.0 KiB +48\.0 KiB +80\.0 KiB +\+2 +train\.py:13 in <module>  HISTORY\.append.*",
                        lines[3])
    by_tag = cli("diff", before, "after.tmem", "--by", "tag", cwd=tmp)
    assert re.search(r"\+32\.0 KiB +48\.0 KiB +80\.0 KiB +\+2 +history", by_tag.stdout)
    same = cli("diff", "after.tmem", "after.tmem", cwd=tmp)
    assert same.stdout.splitlines()[1] == "  no change in live memory"


def test_a_report_on_a_terminal_shows_its_progress_and_in_a_pipe_does_not(runs):
    tmp, _, _ = runs
    piped = cli("report", "after.tmem", "--html", "piped.html", cwd=tmp)
    assert piped.stderr == ""
    # On a terminal (a pseudo-terminal here) rich shows the step while it runs.
    env = dict(os.environ, PYTHONPATH=ROOT, COLUMNS="200", TERM="xterm")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(tmp)
        os.execvpe(sys.executable, [sys.executable, "-m", "torchmem", "report", "after.tmem", "--html", "tty.html"],
                   env)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    seen = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0
    assert "torchmem: reading after.tmem" in seen
    assert "torchmem: writing the HTML report tty.html" in seen
    assert "HTML report written to" in seen


def test_the_oom_report_option_writes_the_report_at_the_first_error(tmp_path):
    (tmp_path / "oom.py").write_text(textwrap.dedent("""\
        import torch, torchmem
        torchmem.set_memory_limit(16 * 2**20, "cpu")
        def step():
            kept = torch.zeros(8 * 2**20, dtype=torch.uint8)
            return kept + torch.zeros(12 * 2**20, dtype=torch.uint8)
        step()
    """))
    result = cli("run", "--device", "cpu", "--no-capture", "--oom-report", "oom", "oom.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "torch.OutOfMemoryError" in result.stderr
    assert "torchmem: out of memory: report written to" in result.stderr
    assert sorted(name.rsplit(".", 1)[1] for name in os.listdir(tmp_path / "oom")) == ["html", "tmem"]
    refused = cli("run", "--oom-report", "oom.py", "oom.py", cwd=tmp_path)
    assert refused.returncode == 2 and "--oom-report oom.py:" in refused.stderr


def test_quiet_run_writes_the_default_capture_without_a_word(tmp_path):
    (tmp_path / "clean.py").write_text("import torch\nx = torch.ones(10).sum()\n")
    result = cli("run", "-q", "--device", "cpu", "clean.py", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == ""
    (capture,) = [name for name in os.listdir(tmp_path) if name.endswith(".tmem")]
    assert torchmem.load_capture(tmp_path / capture).label == "clean.py"
    named = cli("run", "-q", "--device", "cpu", "--capture", "named.tmem", "clean.py", cwd=tmp_path)
    assert f"capture written to {tmp_path / 'named.tmem'}" in named.stderr


def test_report_of_several_captures_is_one_report_with_each_of_them(runs):
    tmp, _, _ = runs
    (before,) = [name for name in os.listdir(tmp) if name.startswith("torchmem-train.")]
    text = cli("report", before, "after.tmem", cwd=tmp)
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("torchmem capture: train.py") == 2
    assert "48.0 KiB in 3 blocks" in text.stdout and "80.0 KiB in 5 blocks" in text.stdout
    page = cli("report", before, "after.tmem", "--html", "both.html", cwd=tmp)
    assert page.returncode == 0, page.stderr
    page_text = (tmp / "both.html").read_text()
    # Not ranks of a job: each capture by its place, with its own leaks.
    assert "Capture #1: train.py" in page_text and "Capture #2: train.py" in page_text
    assert "None" not in re.sub(r"<script.*?</script>", "", page_text, flags=re.S)
    assert "48.0 KiB in 3 blocks" in page_text and "80.0 KiB in 5 blocks" in page_text
