"""The pytest plugin's memory figures per test: ``@pytest.mark.torchmem(limit_peak=...)``,
``--torchmem-top N`` and ``--torchmem-capture-dir DIR``, run in fresh pytest subprocesses
as a user runs them (see test_pytest_plugin.py for how the plugin is loaded)."""

from __future__ import annotations

import os
import re

import pytest

import torchmem  # noqa: F401 - imported before any in-process pytester run (see test_pytest_plugin.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PEAKS_MODULE = """
import pytest
import torch

KEPT = []


@pytest.mark.torchmem(limit_peak="8 MiB", device="cpu")
def test_over_the_limit():
    hidden = torch.zeros(6 * 2**20, dtype=torch.uint8)
    scratch = torch.ones(3 * 2**20, dtype=torch.uint8)
    del hidden, scratch
    small = torch.zeros(1024, dtype=torch.uint8)


@pytest.mark.torchmem(limit_peak="8 MiB", device="cpu")
def test_under_the_limit_twice():
    for _ in range(2):
        block = torch.zeros(5 * 2**20, dtype=torch.uint8)
        del block


@pytest.mark.torchmem(limit_peak="8 MiB", device="cpu", enabled=False)
def test_under_the_limit_but_keeps_memory():
    KEPT.append(torch.zeros(2 * 2**20, dtype=torch.uint8))


@pytest.mark.torchmem(limit_peak="a lot", device="cpu")
def test_bad_limit():
    pass
"""


@pytest.fixture
def run_pytest(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*args):
        return pytester.runpytest_subprocess("-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider",
                                             *args)

    return run


def test_limit_peak_fails_a_test_whose_own_allocations_peaked_above_it_with_the_lines(pytester, run_pytest):
    # 16 MiB allocated before the tests and freed inside one must not count for or against it.
    pytester.makeconftest("import torch, torchmem\ntorchmem.install('cpu')\nBEFORE = torch.zeros(4 * 2**20)\n")
    pytester.makepyfile(test_peaks=PEAKS_MODULE)

    result = run_pytest("-v")

    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "test_peaks.py::test_under_the_limit_twice PASSED" in out
    # Kept 2 MiB, but its leak check is off: only the limit applies, and it is met.
    assert "test_peaks.py::test_under_the_limit_but_keeps_memory PASSED" in out
    result.stdout.fnmatch_lines([
        "torchmem: this test's own allocations peaked at 9.0 MiB on cpu, over its limit_peak of 8.0 MiB",
        "  what the test held at that peak, by the line that allocated it:",
        "    at peak   allocated at*",
        "    6.0 MiB   test_peaks.py:9 in test_over_the_limit    hidden = torch.zeros(6 * 2**20, dtype=torch.uint8)",
        "    3.0 MiB   test_peaks.py:10 in test_over_the_limit   scratch = torch.ones(3 * 2**20, dtype=torch.uint8)",
    ])
    result.stdout.fnmatch_lines([
        "@pytest.mark.torchmem on test_peaks.py::test_bad_limit: limit_peak: 'a lot' is not a size; write bytes*",
    ])
    assert "During handling" not in out


TOP_MODULE = """
import torch

KEPT = []


def test_big():
    x = torch.zeros(3 * 2**20, dtype=torch.uint8)
    y = torch.zeros(2 * 2**20, dtype=torch.uint8)


def test_keeps():
    KEPT.append(torch.zeros(1 * 2**20, dtype=torch.uint8))


def test_small():
    torch.zeros(1024, dtype=torch.uint8)


def test_fails():
    torch.zeros(4 * 2**20, dtype=torch.uint8)
    assert False
"""


def test_top_lists_the_tests_with_the_highest_peaks_and_what_they_left_alive(pytester, run_pytest):
    pytester.makeconftest("import torchmem\ntorchmem.install('cpu')\n")
    pytester.makepyfile(test_top=TOP_MODULE)

    result = run_pytest("--torchmem-top", "3", "--torchmem-device", "cpu")

    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    table = out.split("torchmem: memory per test")[1]
    result.stdout.fnmatch_lines([
        "*= torchmem: memory per test =*",
        "the 3 highest peaks of a test's own allocations:",
        "     peak   left alive   device   test",
        "  5.0 MiB          0 B   cpu      test_top.py::test_big",
        "  4.0 MiB          0 B   cpu      test_top.py::test_fails   failed",
        "  1.0 MiB      1.0 MiB   cpu      test_top.py::test_keeps",
        "",
        "the 1 test that left some of its own allocations alive when it returned:",
        "  left alive   blocks   device   test",
        "     1.0 MiB        1   cpu      test_top.py::test_keeps",
    ])
    assert "test_small" not in table  # fourth by peak


def test_top_refuses_a_count_that_is_not_one(pytester, run_pytest):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run_pytest("--torchmem-top", "zero")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*argument --torchmem-top: expected a number of tests, got 'zero'"])


def test_capture_dir_writes_a_capture_per_test_with_its_trace_and_leak_findings(pytester, run_pytest):
    pytester.makeconftest("import torchmem\ntorchmem.install('cpu')\n")
    pytester.makepyfile(test_top=TOP_MODULE)

    result = run_pytest("--torchmem-capture-dir", "captures", "--torchmem", "--torchmem-device", "cpu")

    result.assert_outcomes(passed=2, failed=2)  # test_keeps leaks, test_fails fails
    captures = pytester.path / "captures"
    assert sorted(os.listdir(captures)) == [
        "test_top.py__test_big.tmem", "test_top.py__test_fails.tmem", "test_top.py__test_keeps.tmem",
        "test_top.py__test_small.tmem",
    ]
    keeps = torchmem.load_capture(captures / "test_top.py__test_keeps.tmem")
    assert keeps.label == "test_top.py::test_keeps"
    assert keeps.leaks["report"]["findings"][0]["size"] == 2**20
    assert re.search(r"held by +test_top.KEPT\[0\]", keeps.leaks["text"])
    big = torchmem.load_capture(captures / "test_top.py__test_big.tmem")
    (site, second) = big.sites("cpu", by="peak")[:2]
    assert (site.peak_bytes, site.source) == (3 * 2**20, "x = torch.zeros(3 * 2**20, dtype=torch.uint8)")
    assert second.source == "y = torch.zeros(2 * 2**20, dtype=torch.uint8)"
    assert "top allocation sites on cpu by peak bytes" in big.render()


def test_capture_dir_that_is_a_file_is_a_usage_error(pytester, run_pytest):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    (pytester.path / "taken").write_text("")
    result = run_pytest("--torchmem-capture-dir", "taken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--torchmem-capture-dir taken: exists and is not a directory"])
