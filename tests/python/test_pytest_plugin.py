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
        "known: device, allow_tags, warmup, max_leaked_bytes, enabled, cycles, cycle_repeats, allow_arguments, limit_peak",
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


TORCH_FREE_MODULE = """
import sys


def test_nothing_heavy_is_imported_while_the_plugin_is_off():
    assert "torchmem.integrations.pytest_plugin" in sys.modules  # the plugin is loaded ...
    heavy = sorted(name for name in sys.modules
                   if name.split(".")[0] in ("torch", "numpy") or name.startswith(("torchmem.runtime", "torchmem._C")))
    assert heavy == []  # ... and costs nothing: no torch, no extension
"""


def test_the_plugin_imports_nothing_heavy_when_no_test_is_checked(pytester, run_pytest):
    # A torch-free project in an environment where torchmem is installed: pytest-memray's
    # rule, a plugin that is off costs nothing (torch alone takes seconds to import).
    pytester.makepyfile(test_plain=TORCH_FREE_MODULE)
    pytester.makeini("[pytest]\ntorchmem_device = auto\ntorchmem_cycles = repeating\n")

    result = run_pytest("-v")

    result.assert_outcomes(passed=1)


def test_a_bad_device_setting_is_refused_even_when_no_test_is_checked(pytester, run_pytest):
    pytester.makepyfile(test_plain=TORCH_FREE_MODULE)

    result = run_pytest("--torchmem-device=tpu")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown device 'tpu'*"])


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


# --- cycles, the test's arguments ------------------------------------------------------

CYCLIC_MODULE = """
import functools
import gc

import pytest
import torch


@pytest.fixture(autouse=True)
def collector_paused():
    # Garbage stays until the leak check collects it, as it does for long stretches of a real
    # process: an automatic collection between the test's return and the check's exit would
    # free a cycle first, or not, depending on where the collector's count stood.
    gc.disable()
    yield
    gc.enable()


class MetricLike:
    # Refers to itself as a torchmetrics Metric does (update wraps the bound method).
    def __init__(self):
        self.total = torch.zeros(128)
        self.update = functools.wraps(self.update)(lambda *args, _update=self.update: _update(*args))

    def update(self, value):
        self.total = self.total + value


def test_builds_one_metric():
    MetricLike().update(torch.ones(128))


def test_drops_a_metric_every_step():
    for _ in range(8):
        MetricLike().update(torch.ones(128))


@pytest.mark.parametrize("metric", [MetricLike()])
def test_updates_a_parametrized_metric(metric):
    metric.update(torch.ones(128))


@pytest.fixture(scope="module")
def shared():
    return MetricLike()


def test_updates_a_module_fixture(shared):
    shared.update(torch.ones(128))
"""


def test_cycles_that_repeat_fail_and_the_test_arguments_hold_memory_allowed(pytester, run_pytest):
    pytester.makepyfile(test_cycles=CYCLIC_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu")

    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_cycles.py::test_drops_a_metric_every_step*"])
    result.stdout.fnmatch_lines(["*counted: 8 separate cycles held by MetricLike*"])


def test_the_report_names_the_module_level_parametrize_list_not_pytest_frames(pytester, run_pytest):
    pytester.makepyfile(test_cycles=CYCLIC_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu", "--torchmem-allow-arguments=no",
                        "-k", "parametrized or fixture")

    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*held by       test_cycles.test_updates_a_parametrized_metric.pytestmark[[]0].args[[]1][[]0].total*"])
    result.stdout.fnmatch_lines(["*held by       <fixture 'shared'>.total*"])
    result.stdout.no_fnmatch_line("*_pytest/runner.py*")


def test_cycles_option_on_the_command_line_ini_marker_and_fixture_parameter(pytester, run_pytest):
    pytester.makeini("""
        [pytest]
        torchmem_cycles = always
    """)
    pytester.makepyfile(test_cycles=CYCLIC_MODULE + """

@pytest.mark.torchmem(cycles="never")
def test_marked_never():
    for _ in range(8):
        MetricLike().update(torch.ones(128))


@pytest.mark.parametrize("torchmem_leak_check", [{"cycle_repeats": 2}], indirect=True)
def test_fixture_parameter(torchmem_leak_check):
    for _ in range(2):
        MetricLike().update(torch.ones(128))
""")

    from_ini = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu", "-k", "builds_one or marked or fixture_param")
    # ini: every cycle counts (test_builds_one_metric fails); the marker says never; the
    # fixture's parameter keeps the ini's policy... "always" counts its cycles too.
    from_ini.assert_outcomes(passed=1, failed=2)
    from_ini.stdout.fnmatch_lines(["PASSED test_cycles.py::test_marked_never"])

    from_command_line = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu", "--torchmem-cycles=repeating",
                                   "-k", "builds_one or fixture_param")
    # The command line overrides the ini file; the fixture's parameter counts 2 repeats.
    from_command_line.assert_outcomes(passed=1, failed=1)
    from_command_line.stdout.fnmatch_lines(["FAILED test_cycles.py::test_fixture_parameter*"])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (("--torchmem-cycles=sometimes",), "*--torchmem-cycles / torchmem_cycles must be 'repeating'*"),
        (("--torchmem-cycle-repeats=1",), "*--torchmem-cycle-repeats / torchmem_cycle_repeats must be an int >= 2*"),
        (("--torchmem-allow-arguments=maybe",), "*--torchmem-allow-arguments / torchmem_allow_arguments must be yes or no*"),
        (("--torchmem-dist-timeout=0",), "*--torchmem-dist-timeout / torchmem_dist_timeout must be seconds > 0, got 0.0*"),
        (("--torchmem-dist-timeout=soon",), "*--torchmem-dist-timeout / torchmem_dist_timeout must be seconds > 0, got 'soon'*"),
    ],
)
def test_bad_cycle_and_argument_settings_are_usage_errors(pytester, run_pytest, arguments, message):
    pytester.makepyfile(test_example="def test_nothing():\n    pass\n")

    result = run_pytest("--torchmem", "--torchmem-device=cpu", *arguments)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_bad_cycle_option_on_a_marker_fails_that_test(pytester, run_pytest):
    pytester.makepyfile(test_example="""
import pytest

@pytest.mark.torchmem(cycles="sometimes")
def test_bad():
    pass
""")

    result = run_pytest("-rA", "--torchmem-device=cpu")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.torchmem on test_example.py::test_bad: cycles must be 'repeating'*"])


def test_the_junit_xml_records_what_a_check_found_and_its_analysis_time(pytester, run_pytest):
    pytester.makepyfile(test_cycles=CYCLIC_MODULE)

    run_pytest("--torchmem", "--torchmem-device=cpu", "-k", "builds_one", "--junitxml=junit.xml")

    xml = (pytester.path / "junit.xml").read_text()
    assert 'name="torchmem_leaked_bytes" value="0"' in xml
    assert 'name="torchmem_analysis_ms"' in xml and 'name="torchmem_analysis_cpu_ms"' in xml


# --- a module imported for the first time inside a test ------------------------------------

LAZY_LIBRARY = """
import torch

_EPS_SMOOTHING = torch.ones(256)  # made at import, kept for the session
"""

LAZY_IMPORTS = """
def test_imports_a_library_on_first_use():
    import lazylib  # noqa: F401


def test_puts_a_tensor_into_a_module_global():
    import torch, lazylib
    lazylib.CACHE = torch.ones(512)  # the test's own doing
"""


def test_what_a_library_makes_at_import_inside_a_test_is_not_the_tests_leak(pytester, run_pytest):
    pytester.makepyfile(lazylib=LAZY_LIBRARY, test_lazy=LAZY_IMPORTS)

    result = run_pytest("--torchmem", "--torchmem-device=cpu", "-p", "no:randomly")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_lazy.py::test_puts_a_tensor_into_a_module_global*"])
    result.stdout.fnmatch_lines(["*held by       lazylib.CACHE*"])


CLASS_SETUP_MODULE = """
import unittest

import torch


class Miner:
    # Keeps its last batch's pairs, as pytorch-metric-learning's HDCMiner does.
    def __call__(self, embeddings):
        self.pairs = embeddings[embeddings.sum(1) > 0].clone()
        return self.pairs


class TestSharedMiner(unittest.TestCase):
    registry = []  # defined by the class body: lives as long as the module

    @classmethod
    def setUpClass(cls):
        cls.miner = Miner()

    def test_mines_with_the_class_miner(self):
        self.miner(torch.ones(64, 4))

    def test_appends_to_the_class_registry(self):
        type(self).registry.append(torch.ones(64))


class TestPytestStyle:
    @classmethod
    def setup_class(cls):
        cls.miner = Miner()

    def test_mines_with_the_class_miner(self):
        self.miner(torch.ones(64, 4))
"""


def test_state_a_class_setup_gave_the_tests_is_allowed_and_class_body_lists_still_fail(pytester, run_pytest):
    pytester.makepyfile(test_class_setup=CLASS_SETUP_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_class_setup.py::TestSharedMiner::test_appends_to_the_class_registry*"])
    result.stdout.fnmatch_lines(["*held by       test_class_setup.TestSharedMiner.registry[[]0]*"])


def test_a_class_setup_names_the_holder_when_arguments_are_not_allowed(pytester, run_pytest):
    pytester.makepyfile(test_class_setup=CLASS_SETUP_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu", "--torchmem-allow-arguments=no",
                        "-k", "mines_with")

    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*held by       test_class_setup.TestSharedMiner.miner.pairs*"])
    result.stdout.fnmatch_lines(["*held by       test_class_setup.TestPytestStyle.miner.pairs*"])


INSTANCE_STATE_MODULE = """
import unittest

import torch

KEPT = []


class TestSetUpState(unittest.TestCase):
    # unittest runs setUp in pytest's call phase; the instance lives until the test's teardown.
    def setUp(self):
        self.data = torch.ones(64)

    def test_uses_the_setup_state(self):
        self.result = self.data * 2

    def test_still_fails_a_module_global(self):
        KEPT.append(self.data * 3)


class TestPytestStyle:
    def test_keeps_on_self(self):
        self.result = torch.ones(64) * 2
"""


def test_state_on_the_tests_own_instance_is_released_at_teardown_and_allowed(pytester, run_pytest):
    pytester.makepyfile(test_instance_state=INSTANCE_STATE_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_instance_state.py::TestSetUpState::test_still_fails_a_module_global*"])
    result.stdout.fnmatch_lines(["*held by       test_instance_state.KEPT[[]0]*"])


FIXTURE_AND_GLOBAL_MODULE = """
import pytest
import torch

KEPT = []


@pytest.fixture
def state():
    return {}


def test_keeps_a_tensor_in_its_fixture(state):
    state["t"] = torch.ones(1024)


def test_keeps_it_in_its_fixture_and_a_module_global(state):
    state["t"] = torch.ones(1024)
    KEPT.append(state["t"])
"""


def test_a_block_an_argument_holds_fails_when_a_module_global_holds_it_too(pytester, run_pytest):
    pytester.makepyfile(test_fixture_and_global=FIXTURE_AND_GLOBAL_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["FAILED test_fixture_and_global.py::test_keeps_it_in_its_fixture_and_a_module_global*"])
    result.stdout.fnmatch_lines(["*test_fixture_and_global.KEPT[[]0]*"])  # among its holders


def test_the_tests_own_instance_names_the_holder_when_arguments_are_not_allowed(pytester, run_pytest):
    pytester.makepyfile(test_instance_state=INSTANCE_STATE_MODULE)

    result = run_pytest("-rA", "--torchmem", "--torchmem-device=cpu", "--torchmem-allow-arguments=no",
                        "-k", "setup_state")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*held by       <test_instance_state.TestSetUpState instance of test_uses_the_setup_state>.data*"])
