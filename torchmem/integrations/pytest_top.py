"""pytest: ``--torchmem-top N``, the tests that used and left the most memory, at the end.

    pytest --torchmem-top 10

After the session, two tables: the N tests whose own allocations peaked highest (per
device: the most they had alive at once, on top of what was allocated before them), and
the N tests that left the most of their own allocations alive when they returned
(before fixtures' teardown; what a leak check would examine, cycles included). Every
test is measured (:mod:`torchmem.integrations.pytest_limits`), on every device torchmem
serves; torchmem is installed for the CPU (or the device ``--torchmem-device`` names).
"""

from __future__ import annotations

import argparse

import pytest

from torchmem.integrations import pytest_limits


def pytest_addoption(parser) -> None:
    group = parser.getgroup("torchmem", "torchmem leak checks")
    group.addoption(
        "--torchmem-top", default=None, dest="torchmem_top", metavar="N", type=_count,
        help="after the session, list the N tests whose own allocations peaked highest and the N that left the "
             "most of them alive (every test is measured)",
    )


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tests, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a number of tests >= 1, got {number}")
    return number


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    top = config.getoption("torchmem_top", None)
    if not top:
        return
    results = config.stash.get(pytest_limits.RESULTS_KEY, [])
    terminalreporter.write_sep("=", "torchmem: memory per test")
    terminalreporter.write_line(render(results, top))


def render(results: list, top: int) -> str:
    """The two tables, from ``[(nodeid, {device: DeviceUsage}, outcome)]``."""
    from torchmem._support.tables import render_table
    from torchmem._support.units import format_bytes

    rows = [(nodeid, usage, outcome) for nodeid, measured, outcome in results for usage in measured.values()]
    if not rows:
        return "no test was measured"
    lines = []
    by_peak = sorted(rows, key=lambda row: (-row[1].peak_bytes, row[0], row[1].device))[:top]
    lines.append(f"the {len(by_peak)} highest peaks of a test's own allocations:")
    lines.append(render_table(
        ["peak", "left alive", "device", "test", ""],
        [[format_bytes(u.peak_bytes) + ("" if u.complete else " (at least)"), format_bytes(u.alive_bytes), u.device,
          nodeid, "" if outcome == "passed" else outcome] for nodeid, u, outcome in by_peak],
        justify=["right", "right", "left", "left", "left"],
    ))
    alive = [row for row in rows if row[1].alive_bytes > 0]
    by_alive = sorted(alive, key=lambda row: (-row[1].alive_bytes, row[0], row[1].device))[:top]
    if by_alive:
        lines.append("")
        count = len(by_alive)
        lines.append(f"the {count} test{'s' if count != 1 else ''} that left the most of their own allocations alive "
                     "when they returned:" if count != 1 else
                     "the 1 test that left some of its own allocations alive when it returned:")
        lines.append(render_table(
            ["left alive", "blocks", "device", "test"],
            [[format_bytes(u.alive_bytes), f"{u.alive_blocks:,}", u.device, nodeid] for nodeid, u, _ in by_alive],
            justify=["right", "right", "left", "left"],
        ))
    else:
        lines.append("")
        lines.append("no test left any of its own allocations alive when it returned")
    return "\n".join(lines)
