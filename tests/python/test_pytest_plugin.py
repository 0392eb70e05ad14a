"""The torchmem pytest plugin, run in fresh pytest subprocesses (clean allocator state).

Each run loads the plugin with ``-p torchmem.integrations.pytest_plugin`` (the checkout is not
installed, so its ``pytest11`` entry point is not registered) and with plugin autoloading
off, so only pytest and torchmem take part.
"""

from __future__ import annotations

import importlib
import os
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI (requirements.txt)
    import tomli as tomllib

import pytest

# Imported here, not first inside an in-process pytester run: such a run unloads the modules
# it imported when it ends, and importing torch a second time into one process crashes.
import torchmem
from torchmem.integrations import pytest_plugin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEAKY_MODULE = """
import pytest
import torch
import torchmem

KEPT = []


def test_leaks(torchmem_leak_check):
    KEPT.append(torch.zeros(1000))  # 4 KiB block


def test_clean(torchmem_leak_check):
    assert (torch.ones(1000) * 2).sum().item() == 2000


def test_small_leak():
    KEPT.append(torch.zeros(100))  # 512 B block


def test_tagged_cache():
    with torchmem.tag("cache"):
        KEPT.append(torch.zeros(1000))


def test_unchecked_leak():
    KEPT.append(torch.zeros(1000))
"""


@pytest.fixture
def run_pytest(pytester, monkeypatch):
    """Runs pytest in a subprocess with the plugin; returns its RunResult."""
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*args):
        return pytester.runpytest_subprocess("-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider", *args)

    return run


def test_the_fixture_fails_a_leaking_test_with_the_report_and_other_tests_are_not_checked(pytester, run_pytest):
    pytester.makepyfile(test_example=LEAKY_MODULE)

    result = run_pytest()

    # Only test_leaks and test_clean request the fixture; without it, a marker or an option
    # the other tests (which also leak) are not checked.
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "torchmem.leak_check: 4.0 KiB in 1 block allocated inside is still alive (reachable 4.0 KiB in 1 block)",
        "",
        "  4.0 KiB  reachable  cpu  tag=untagged",
        "      held by       test_example.KEPT[0]",
        "      allocated at  test_example.py:9  KEPT.append(torch.zeros(1000))  # 4 KiB block",
        "(torchmem pytest plugin: *torchmem.expect_alive(tensor)*",
        "*short test summary info*",
        "FAILED test_example.py::test_leaks - Failed: torchmem.leak_check: 4.0 KiB*",
    ], consecutive=True)


def test_marker_options_configure_each_test(pytester, run_pytest):
    pytester.makepyfile(test_marked="""
        import pytest
        import torch
        import torchmem

        KEPT = []
        LAZY = {}


        def lazily_initialized_table():
            if "table" not in LAZY:
                LAZY["table"] = torch.zeros(1000)
            return LAZY["table"]


        @pytest.mark.torchmem(allow_tags=("cache",))
        def test_allowed_tag():
            with torchmem.tag("cache"):
                KEPT.append(torch.zeros(1000))


        @pytest.mark.torchmem(max_leaked_bytes="4 KiB")
        def test_small_leak_tolerated():
            KEPT.append(torch.zeros(1000))


        @pytest.mark.torchmem(max_leaked_bytes=1024)
        def test_leak_above_the_limit():
            KEPT.append(torch.zeros(1000))


        @pytest.mark.torchmem(warmup=1)
        def test_first_use_initialization_is_warmup():
            assert lazily_initialized_table().sum().item() == 0


        @pytest.mark.torchmem(device="cpu", enabled=False)
        def test_opted_out():
            KEPT.append(torch.zeros(1000))


        @pytest.mark.torchmem(colour="red")
        def test_unknown_option():
            pass


        def test_not_marked():
            KEPT.append(torch.zeros(1000))


        def test_expected_survivor(torchmem_leak_check):
            KEPT.append(torchmem.expect_alive(torch.zeros(1000)))


        def test_fails_on_its_own(torchmem_leak_check):
            KEPT.append(torch.zeros(1000))
            assert False, "the test's own failure"
    """)

    result = run_pytest("-rA")

    result.assert_outcomes(passed=6, failed=3)
    result.stdout.fnmatch_lines([
        "PASSED test_marked.py::test_allowed_tag",
        "PASSED test_marked.py::test_small_leak_tolerated",
        "PASSED test_marked.py::test_first_use_initialization_is_warmup",
        "PASSED test_marked.py::test_opted_out",
        "PASSED test_marked.py::test_not_marked",
        "PASSED test_marked.py::test_expected_survivor",
    ], consecutive=False)
    result.stdout.fnmatch_lines([
        "*_ test_leak_above_the_limit _*",
        "torchmem.leak_check: 4.0 KiB in 1 block allocated inside is still alive (*); limit 1.0 KiB",
    ])
    result.stdout.fnmatch_lines([
        "*_ test_unknown_option _*",
        "@pytest.mark.torchmem on test_marked.py::test_unknown_option: unknown option(s) colour; "
        "known: device, allow_tags, warmup, max_leaked_bytes, enabled",
    ], consecutive=True)
    # A test failing on its own is not analyzed: its traceback keeps its locals alive.
    result.stdout.fnmatch_lines(["*_ test_fails_on_its_own _*", "*AssertionError: the test's own failure*"])
    result.stdout.no_fnmatch_line("*KEPT[[]4]*")


def test_ini_options_turn_the_check_on_for_every_test(pytester, run_pytest):
    pytester.makeini("""
        [pytest]
        torchmem_autouse = true
        torchmem_device = cpu
        torchmem_max_leaked_bytes = 1 KiB
        torchmem_allow_tags = cache warmup
    """)
    pytester.makepyfile(test_example=LEAKY_MODULE)

    result = run_pytest("-rA")

    # test_leaks and test_unchecked_leak leave 4 KiB; the 512 B leak is under the limit;
    # the cache is an allowed tag.
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["torchmem: leak check on every test (device=cpu)"])
    result.stdout.fnmatch_lines(["FAILED test_example.py::test_unchecked_leak*"])


def test_command_line_options_override_the_ini_file(pytester, run_pytest):
    pytester.makeini("""
        [pytest]
        torchmem_autouse = false
        torchmem_max_leaked_bytes = 0
    """)
    pytester.makepyfile(test_example=LEAKY_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device", "cpu", "--torchmem-max-leaked-bytes=1024")

    # --torchmem checks every test although the ini file says not to; the 512 B leak is
    # within the command line's limit although the ini file allows none.
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(["PASSED test_example.py::test_small_leak"])
    result.stdout.fnmatch_lines(["FAILED test_example.py::test_unchecked_leak*"])


def test_a_bad_device_setting_is_a_usage_error(pytester, run_pytest):
    pytester.makepyfile(test_example="def test_nothing():\n    pass\n")

    result = run_pytest("--torchmem", "--torchmem-device=tpu")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown device 'tpu'; use 'cpu', 'cuda', 'cuda:N' or 'auto'*"])


def test_a_cuda_install_that_comes_too_late_says_to_install_before_cuda_init(monkeypatch):
    def too_late(device="cuda"):
        raise RuntimeError("CUDA is already initialized in this process")

    monkeypatch.setattr(torchmem, "is_installed", lambda device="cuda": False)
    monkeypatch.setattr(torchmem, "install", too_late)

    with pytest.raises(pytest.UsageError, match="must be installed before CUDA is initialized") as raised:
        pytest_plugin._install("cuda", where="at pytest startup")
    assert "--torchmem-device=cuda" in str(raised.value)


def test_the_plugin_is_registered_as_a_pytest11_entry_point():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        project = tomllib.load(file)["project"]

    assert project["entry-points"]["pytest11"] == {"torchmem": "torchmem.integrations.pytest_plugin"}
    assert importlib.import_module("torchmem.integrations.pytest_plugin") is pytest_plugin
    assert callable(pytest_plugin.pytest_addoption) and callable(pytest_plugin.pytest_runtest_call)
