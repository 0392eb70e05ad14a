"""The leak corpus (tests/scenarios): programs in the shape of public leak reports, each run in
every mode that applies (``leak_check``, the pytest plugin, ``python -m torchmem run``,
``GrowthMonitor``) on CPU and on the simulated CUDA device, asserting what the user reads: the
verdict, the allocating line and the owner the report names (tests/scenarios/runner.py reads
the reports: ``LeakReport`` findings, the plugin's failure text, ``run``'s JSON, the growth
report). Each scenario's expected verdict is checked first without torchmem
(tests/scenarios/truth.py), so the corpus is not circular.

Cases that fail on main because of a verdict bug being fixed under issue 23 are listed, with
the issue's row they wait on, in EXPECTED_FAILURES (strict: a fixed case fails loudly until
its line is removed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "scenarios"
sys.path.insert(0, str(SCENARIOS))
import _corpus  # noqa: E402
import runner  # noqa: E402

# `python -m torchmem run` is a process per scenario, the costly mode: on the simulated CUDA
# device it runs for these (a leak through a list, a cycle leak, a clean loop with optimizer
# state); on CPU for every scenario it applies to. The documented table runs it for all.
CUDA_RUN = ("loss_history_keeps_graphs", "composer_deepcopy_metrics", "optimizer_state_first_step")

# The cases that fail on main because of a verdict bug being fixed under issue 23, each with
# the row of the issue it waits on ({(scenario, mode, device): row}); strict, so a fixed case
# fails until its line is removed. Empty since main merged issue23-checks, -growth and -run
# (at 3fc2a7f it held 17 cases: `run` without steps (row 3) and reporting chrf's import-time
# constant (row 2), GrowthMonitor on growth every other step (row 4) and on all steps but one
# (row 5), the reused check counting one cycle per call, and the class-level shared dict
# named without its root).
EXPECTED_FAILURES: dict[tuple[str, str, str], str] = {}


def _cases():
    cases = []
    for header in _corpus.all_headers():
        for mode in header.modes:
            for device in runner.DEVICES:
                if mode == "run" and device == "cuda" and header.name not in CUDA_RUN:
                    continue
                reason = EXPECTED_FAILURES.get((header.name, mode, device))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                cases.append(pytest.param(header.name, mode, device, marks=marks, id=f"{header.name}-{mode}-{device}"))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def scores(simcuda_dir):
    """Every case, run once: the in-process modes in one process per device, pytest in one
    session per device, ``run`` in a process per scenario (two at a time on two cores)."""
    os.environ.setdefault("TORCHMEM_SIMCUDA_DIR", str(simcuda_dir))
    results = runner.run_corpus(run_names={"cuda": CUDA_RUN})
    return {(item.scenario, item.mode, item.device): item for item in results}


def test_the_corpus_is_large_and_says_what_each_program_is():
    headers = _corpus.all_headers()
    leaks = [header for header in headers if header.verdict == "leak"]
    clean = [header for header in headers if header.verdict == "clean"]
    assert len(headers) >= 30 and len(leaks) >= 15 and len(clean) >= 10
    assert {mode for header in headers for mode in header.modes} == set(_corpus.MODES)
    for header in headers:
        marked = header.path.read_text().splitlines()[header.alloc_line - 1]
        assert marked.rstrip().endswith(_corpus.ALLOC_MARKER), header.name
    # Every expected failure names a case that runs.
    ran = {tuple(case.values) for case in CASES}
    assert set(EXPECTED_FAILURES) <= ran, set(EXPECTED_FAILURES) - ran


def test_each_expected_verdict_holds_without_torchmem():
    """tests/scenarios/truth.py measures with PyTorch's profiler, in a process that never
    imports torchmem, whether each program's memory is really kept (grows with the steps) or
    really freed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCENARIOS), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, str(SCENARIOS / "truth.py")], env=env, cwd=ROOT,
                            capture_output=True, text=True)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("ok", "DIFF"))]
    assert len(lines) == len(_corpus.all_headers())
    assert all(line.startswith("ok") for line in lines)


@pytest.mark.parametrize(("scenario", "mode", "device"), CASES)
def test_what_the_user_reads(scores, scenario, mode, device):
    item = scores[(scenario, mode, device)]
    shown = f"{item.key}: expected {item.expected}, torchmem said {item.verdict}\n{item.error or item.text}"
    assert item.error is None, shown
    assert item.verdict_ok, shown
    assert item.line_ok is not False, f"the report does not name the # ALLOC line\n{shown}"
    assert item.owner_ok is not False, f"no holder named contains the expected owner\n{shown}"
