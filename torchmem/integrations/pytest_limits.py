"""pytest: a limit on a test's peak memory, ``@pytest.mark.torchmem(limit_peak="256 MiB")``.

The peak is that of the test's own allocations (blocks allocated while its body ran, on
top of whatever was already allocated), per device torchmem serves: a test whose own
allocations were ever more than ``limit_peak`` alive at once on a device fails, with the
lines that held the memory at that peak::

    torchmem: this test's own allocations peaked at 300.0 MiB on cpu, over its limit_peak of 256.0 MiB
      what the test held at that peak, by the line that allocated it:
         at peak   allocated at
       200.0 MiB   test_model.py:12 in test_forward   hidden = torch.zeros(...)

As with pytest-memray's ``limit_memory``, but for the memory torchmem serves (GPU memory
included) and per device. The marker also turns on the leak check, as any
``@pytest.mark.torchmem`` does; ``enabled=False`` turns the leak check off and keeps the
limit. Measured by :class:`torchmem.reports.window.AllocationWindow` around the test's
call phase (fixtures' setup and teardown are not the test's), which records the
allocator's trace while the test runs when nothing else does.

This module also measures every test when ``--torchmem-top N`` asks for the table of the
tests that used the most (:mod:`torchmem.integrations.pytest_top`).
"""

from __future__ import annotations

import pytest

from torchmem.integrations import pytest_plugin

LIMIT_KEYWORD = "limit_peak"
_TOP_SITES = 5

# The figures of the tests measured so far, for the end-of-session table:
# [(nodeid, {device: DeviceUsage}, outcome)]
RESULTS_KEY = pytest.StashKey[list]()


def pytest_configure(config) -> None:
    config.stash[RESULTS_KEY] = []


def _limit(item) -> int | None:
    marker = item.get_closest_marker(pytest_plugin._MARKER)  # noqa: SLF001 - the plugin's marker
    if marker is None or LIMIT_KEYWORD not in marker.kwargs:
        return None
    from torchmem._support.units import parse_bytes

    value = marker.kwargs[LIMIT_KEYWORD]
    try:
        limit = parse_bytes(value, what=LIMIT_KEYWORD)
        problem = None if limit > 0 else f"{LIMIT_KEYWORD} must be more than 0 bytes, got {value!r}"
    except (TypeError, ValueError) as error:
        problem = str(error)
    if problem is not None:
        pytest.fail(f"@pytest.mark.torchmem on {item.nodeid}: {problem}", pytrace=False)
    return limit


def _measuring_all(config) -> bool:
    return bool(config.getoption("torchmem_top", None))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item):
    """Innermost around the test body (inside the leak check's warm-up runs): measures the
    test's own allocations and fails it when they peaked over its ``limit_peak``."""
    limit = _limit(item)
    if limit is None and not _measuring_all(item.config):
        return (yield)
    options = pytest_plugin._checked_options(item)  # noqa: SLF001 - the device the test names
    pytest_plugin._install_for_test(options.device, item)  # noqa: SLF001
    from torchmem.reports.window import AllocationWindow

    window = AllocationWindow()
    window.start()
    try:
        result = yield
    except BaseException:
        usage = window.stop()
        item.config.stash[RESULTS_KEY].append((item.nodeid, usage, "failed"))
        raise  # the test failed on its own: that is its verdict
    usage = window.stop()
    over = [figures for figures in usage.values() if limit is not None and figures.peak_bytes > limit]
    item.config.stash[RESULTS_KEY].append((item.nodeid, usage, "over limit" if over else "passed"))
    if over:
        pytest.fail("\n\n".join(_explain(figures, limit) for figures in over), pytrace=False)
    return result


def _explain(figures, limit: int) -> str:
    from torchmem._support.tables import render_table
    from torchmem._support.units import format_bytes

    lines = [
        f"torchmem: this test's own allocations peaked at {format_bytes(figures.peak_bytes)} on {figures.device}, "
        f"over its {LIMIT_KEYWORD} of {format_bytes(limit)}"
    ]
    if not figures.complete:
        lines.append("  (the allocator's trace lost the test's first events: the peak was at least this)")
    sites = figures.top_sites(_TOP_SITES)
    if sites:
        lines.append("  what the test held at that peak, by the line that allocated it:")
        rows = [[format_bytes(size), location, source] for size, location, source in sites]
        lines.append(render_table(["at peak", "allocated at", ""], rows, justify=["right", "left", "left"],
                                  indent="    "))
    return "\n".join(lines)
