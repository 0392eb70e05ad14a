"""pytest: ``--torchmem-capture-dir DIR``, a capture file per test, to render later.

    pytest --torchmem-capture-dir captures/
    torchmem report captures/tests_test_model.py__test_forward.tmem --html forward.html

Each test's call phase writes ``DIR/<test id>.tmem`` (the id with characters a file name
should not hold replaced by ``_``): the allocator's trace while the test ran (the
timeline, the sites by peak bytes), the blocks alive when it returned with their
allocation stacks, the cache's segments, and the leak check's findings when the test
was checked. Written after the leak check, whatever the test's outcome; a capture that
cannot be written is a warning, not a failed test.
"""

from __future__ import annotations

import os
import re
import warnings

import pytest

from torchmem.integrations import pytest_plugin

_DIRECTORY_KEY = pytest.StashKey[str]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("torchmem", "torchmem leak checks")
    group.addoption(
        "--torchmem-capture-dir", default=None, dest="torchmem_capture_dir", metavar="DIR",
        help="write a capture (.tmem) per test into DIR: its trace, what it left alive, its leak findings "
             "(render with torchmem report)",
    )


def pytest_configure(config) -> None:
    directory = config.getoption("torchmem_capture_dir", None)
    if not directory:
        return
    path = os.path.abspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise pytest.UsageError(f"--torchmem-capture-dir {directory}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise pytest.UsageError(f"--torchmem-capture-dir {directory}: cannot create it ({error.strerror})") from None
    config.stash[_DIRECTORY_KEY] = path


def file_name(nodeid: str) -> str:
    """``tests/test_x.py::test_a[cpu-1]`` -> ``tests_test_x.py__test_a[cpu-1].tmem``."""
    name = nodeid.replace("::", "__").replace("/", "_").replace(os.sep, "_")
    return re.sub(r"[^A-Za-z0-9._\-\[\]]", "_", name)[:200] + ".tmem"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """Outermost around the test body (outside the leak check, so its findings are in)."""
    directory = item.config.stash.get(_DIRECTORY_KEY, None)
    if directory is None:
        return (yield)
    options = pytest_plugin._checked_options(item)  # noqa: SLF001 - the device the test names
    pytest_plugin._install_for_test(options.device, item)  # noqa: SLF001
    from torchmem.reports import snapshot

    started = snapshot.trace_max_entries() == 0
    if started:
        snapshot.record_trace(sample_interval=0.01)
    try:
        return (yield)
    finally:
        try:
            _write(item, os.path.join(directory, file_name(item.nodeid)))
        finally:
            if started:
                snapshot.record_trace(0)


def _write(item, path: str) -> None:
    from torchmem.reports import capture

    check = item.stash.get(pytest_plugin._CHECK_KEY, None)  # noqa: SLF001 - the test's leak check, if any
    report = getattr(check, "report", None)
    try:
        capture.write_capture(path, leaks=report if getattr(report, "findings", None) is not None else None,
                              label=item.nodeid)
    except Exception as error:  # noqa: BLE001 - a capture must not fail the test it describes
        warnings.warn(f"torchmem: no capture for {item.nodeid}: {error}", pytest.PytestWarning, stacklevel=1)
