"""pytest plugin: fail tests whose code leaves torchmem blocks alive.

Registered as the ``torchmem`` ``pytest11`` entry point. A test is checked when it

* requests the ``torchmem_leak_check`` fixture,
* carries ``@pytest.mark.torchmem(...)`` (``enabled=False`` opts a test out), or
* runs under ``pytest --torchmem`` / ``torchmem_autouse = true`` (every test).

The check wraps the test's call phase (after fixtures are set up, before they are torn
down): blocks allocated while the test body ran and still allocated when it returned fail
the test, with the leak report as the failure message. A test that fails on its own is
not analyzed (its traceback keeps its locals alive).

Settings, most specific first: the marker's keywords, then command-line options, then
ini options, then defaults::

    @pytest.mark.torchmem(device="cpu", allow_tags=("cache",), warmup=1, max_leaked_bytes="4 KiB")

    pytest --torchmem --torchmem-device=cpu --torchmem-max-leaked-bytes=0

    [pytest]  (or [tool.pytest.ini_options])
    torchmem_autouse = true
    torchmem_device = cpu
    torchmem_max_leaked_bytes = 1 KiB
    torchmem_allow_tags = cache warmup

``warmup=N`` runs the test body N extra times, unchecked, before the checked run, for code
that builds lasting state on first use (lazy caches, optimizer state). ``device="auto"``
(the default) means CUDA when PyTorch sees a GPU, else CPU. CPU checks install torchmem's
CPU allocator on first use; CUDA checks need torchmem installed before CUDA is initialized.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import pytest

_MARKER = "torchmem"
_FIXTURE = "torchmem_leak_check"
_MARKER_KEYWORDS = ("device", "allow_tags", "warmup", "max_leaked_bytes", "enabled")


@dataclass(frozen=True)
class CheckOptions:
    """How one test is checked (after marker, command line and ini were combined)."""

    enabled: bool
    device: str
    allow_tags: tuple
    warmup: int
    max_leaked_bytes: int


class MarkerError(ValueError):
    """A ``@pytest.mark.torchmem`` with arguments it does not take; fails that test."""


_OPTIONS_KEY = pytest.StashKey[CheckOptions]()
_CHECK_KEY = pytest.StashKey[object]()
_HINT = (
    "(torchmem pytest plugin: tensors allocated by this test are still alive after it returned. Keep "
    "expected survivors with torchmem.expect_alive(tensor), or configure the check with "
    "@pytest.mark.torchmem(allow_tags=..., warmup=..., max_leaked_bytes=..., enabled=False))"
)


def pytest_addoption(parser) -> None:
    """Registers ``--torchmem*`` command-line options and ``torchmem_*`` ini options."""
    group = parser.getgroup("torchmem", "torchmem leak checks")
    # Command-line options default to None so an unset flag falls back to the ini value.
    group.addoption(
        "--torchmem", action="store_true", default=None, dest="torchmem",
        help="check every test for torchmem blocks left alive (ini: torchmem_autouse)",
    )
    group.addoption(
        "--torchmem-device", default=None, dest="torchmem_device", metavar="DEVICE",
        help="device whose blocks are checked: cpu, cuda, cuda:N or auto (ini: torchmem_device; default auto)",
    )
    group.addoption(
        "--torchmem-max-leaked-bytes", default=None, dest="torchmem_max_leaked_bytes", metavar="SIZE",
        help="leaked bytes tolerated per test, e.g. 4096 or '4 KiB' (ini: torchmem_max_leaked_bytes; default 0)",
    )
    parser.addini("torchmem_autouse", type="bool", default=False, help="check every test for torchmem leaks")
    parser.addini("torchmem_device", default="auto", help="device whose blocks are checked (cpu, cuda[:N], auto)")
    parser.addini("torchmem_max_leaked_bytes", default="0", help="leaked bytes tolerated per test")
    parser.addini("torchmem_allow_tags", type="args", default=[], help="torchmem tags whose blocks may survive")


def pytest_configure(config) -> None:
    """Registers the marker, reads the session-wide settings, installs CUDA early if asked."""
    config.addinivalue_line(
        "markers",
        "torchmem(device='auto', allow_tags=(), warmup=0, max_leaked_bytes=0, enabled=True): check this test "
        "for torchmem blocks still alive when it returns, with these settings",
    )
    defaults = _config_defaults(config)
    config.stash[_OPTIONS_KEY] = defaults
    if defaults.enabled and defaults.device.startswith("cuda"):
        # CUDA's allocator can only be swapped before CUDA is initialized: do it before
        # collection imports test modules.
        _install(defaults.device, where="at pytest startup")


def pytest_report_header(config) -> str | None:
    """Says in the session header when every test is checked."""
    defaults = config.stash.get(_OPTIONS_KEY, None)
    if defaults is not None and defaults.enabled:
        return f"torchmem: leak check on every test (device={defaults.device})"
    return None


def _config_defaults(config) -> CheckOptions:
    def pick(option: str, ini: str):
        value = config.getoption(option)
        return value if value is not None else config.getini(ini)

    try:
        from torchmem._support.units import parse_bytes

        return CheckOptions(
            enabled=bool(pick("torchmem", "torchmem_autouse")),
            device=_resolve_device(pick("torchmem_device", "torchmem_device")),
            allow_tags=tuple(config.getini("torchmem_allow_tags")),
            warmup=0,
            max_leaked_bytes=parse_bytes(
                pick("torchmem_max_leaked_bytes", "torchmem_max_leaked_bytes"),
                what="torchmem: --torchmem-max-leaked-bytes / torchmem_max_leaked_bytes",
            ),
        )
    except (TypeError, ValueError) as error:
        raise pytest.UsageError(str(error)) from None


def _resolve_device(device) -> str:
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"torchmem: device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    device = device.strip()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = device.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"torchmem: unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return device


def _options_for(item) -> CheckOptions:
    options = item.config.stash.get(_OPTIONS_KEY, None)
    if options is None:  # plugin registered late (e.g. by pytest_plugins in a conftest)
        options = item.config.stash[_OPTIONS_KEY] = _config_defaults(item.config)
    uses_fixture = _FIXTURE in getattr(item, "fixturenames", ())
    marker = item.get_closest_marker(_MARKER)
    if marker is None:
        return replace(options, enabled=options.enabled or uses_fixture)
    if marker.args:
        raise MarkerError(
            f"@pytest.mark.torchmem takes keyword arguments only ({', '.join(_MARKER_KEYWORDS)}); "
            f"got positional {marker.args!r} on {item.nodeid}"
        )
    unknown = sorted(set(marker.kwargs) - set(_MARKER_KEYWORDS))
    if unknown:
        raise MarkerError(
            f"@pytest.mark.torchmem on {item.nodeid}: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(_MARKER_KEYWORDS)}"
        )
    kwargs = marker.kwargs
    try:
        from torchmem.leaks.check import _normalize_tags
        from torchmem._support.units import parse_bytes

        warmup = kwargs.get("warmup", 0)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0 (extra unchecked runs), got {warmup!r}")
        return CheckOptions(
            enabled=bool(kwargs.get("enabled", True)),
            device=_resolve_device(kwargs.get("device", options.device)),
            allow_tags=tuple(sorted(_normalize_tags(kwargs.get("allow_tags", options.allow_tags)))),
            warmup=warmup,
            max_leaked_bytes=parse_bytes(
                kwargs.get("max_leaked_bytes", options.max_leaked_bytes), what="max_leaked_bytes"
            ),
        )
    except (TypeError, ValueError) as error:
        raise MarkerError(f"@pytest.mark.torchmem on {item.nodeid}: {error}") from None


def _checked_options(item) -> CheckOptions:
    try:
        return _options_for(item)
    except MarkerError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)  # outside the except: no "during handling" chain


def _install(device: str, *, where: str) -> None:
    import torchmem

    if device == "cpu":
        torchmem.install("cpu")
        return
    if torchmem.is_installed("cuda"):
        return
    try:
        torchmem.install("cuda")
    except RuntimeError as error:
        raise pytest.UsageError(
            f"torchmem: cannot check CUDA memory ({where}): {error}\n"
            "torchmem must be installed before CUDA is initialized. Set the device at startup "
            "(pytest --torchmem-device=cuda, or torchmem_device = cuda in the ini file) so the plugin "
            "installs it before tests are collected, or call torchmem.install() at the top of your "
            "conftest.py; use device='cpu' to check CPU memory instead."
        ) from None


def _install_for_test(device: str, item) -> None:
    try:
        _install(device, where=f"for {item.nodeid}")
        return
    except pytest.UsageError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)


def _make_check(options: CheckOptions):
    import torchmem

    return torchmem.leak_check(
        raise_on_leak=False,
        allow_tags=options.allow_tags,
        warmup=options.warmup,
        max_leaked_bytes=options.max_leaked_bytes,
        devices=[options.device],
    )


def pytest_collection_modifyitems(session, config, items) -> None:
    """Installs torchmem for CUDA before any test runs if a collected test checks CUDA."""
    # While it is still possible: a CUDA install after CUDA initialization fails.
    for item in items:
        try:
            options = _options_for(item)
        except MarkerError:
            continue  # fails that test when it runs
        if options.enabled and options.device.startswith("cuda"):
            try:
                _install(options.device, where=f"for {item.nodeid}")
            except pytest.UsageError:
                continue  # fails that test, with the explanation, when it runs


@pytest.fixture
def torchmem_leak_check(request):
    """Checks this test for torchmem blocks still alive when its body returns; fails it
    with the leak report. Yields the ``torchmem.leak_check`` (its ``.report`` is filled
    after the body ran). Configure it with ``@pytest.mark.torchmem(...)``."""
    options = _checked_options(request.node)
    _install_for_test(options.device, request.node)
    check = _make_check(options)
    request.node.stash[_CHECK_KEY] = check
    yield check


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Runs the test's call phase inside a leak check (after ``warmup`` unchecked runs) and
    fails the test with the report when it leaked more than allowed."""
    options = _checked_options(item)
    if not options.enabled:
        return (yield)
    _install_for_test(options.device, item)
    check = item.stash.get(_CHECK_KEY, None) or _make_check(options)
    for _ in range(options.warmup):
        with check:
            item.runtest()
    check.__enter__()
    try:
        result = yield
    except BaseException:
        check.__exit__(*sys.exc_info())
        raise
    check.__exit__(None, None, None)
    if check.report.exceeds_limit:
        pytest.fail(f"{check.report.render()}\n{_HINT}", pytrace=False)
    return result
