"""What a window of time allocated itself: the peak of its own allocations per device, what
of them is still alive at its end, and the lines that held the most at the peak.

    window = AllocationWindow()
    window.start()
    run_the_test()
    for device, usage in window.stop().items():
        print(device, usage.peak_bytes, usage.alive_bytes, usage.top_sites(3))

Own allocations are the blocks allocated inside the window (by any thread); a block
allocated before it and freed inside it does not lower the figure, so the peak is what
the window's code needed on top of what was already there. It is measured from the
engines' trace (``torchmem.record_trace``), replayed: if no trace is recording, the
window records one (with allocation stacks) while it is open and stops it after; if one
is, the window reads its events (wall-clock times) without touching it. A ring that
wrapped inside the window lost the window's first events: ``complete`` is False then,
and the figures are what the remaining events show.

The engine keeps no peak per scope, and resetting the peak statistics would change what
the measured code reads from ``torchmem.max_memory_allocated()``: the trace changes
nothing the code observes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["AllocationWindow", "DeviceUsage", "TRACE_ENTRIES"]

# Events the window's own trace keeps per device (a ring): a test allocating more than
# this loses its first events and says so (``complete``).
TRACE_ENTRIES = 262_144


@dataclass
class DeviceUsage:
    """One device's figures for a window."""

    device: str
    peak_bytes: int = 0  # the most of the window's own allocations alive at once
    alive_bytes: int = 0  # own allocations still allocated when the window closed
    alive_blocks: int = 0
    allocations: int = 0
    complete: bool = True  # False: the trace ring lost events from the window's start
    at_peak: dict = field(default_factory=dict)  # stack id -> bytes alive at the peak
    stacks: dict = field(default_factory=dict)  # the symbolized stacks of at_peak

    def top_sites(self, limit: int = 5) -> list[tuple[int, str, str]]:
        """``(bytes at the peak, "file:line in function", source line)``, largest first: the
        lines whose allocations made the peak."""
        from torchmem.reports import sites

        data = {"stacks": self.stacks}
        per_site: dict[tuple, int] = {}
        source: dict[tuple, str] = {}
        for stack, size in self.at_peak.items():
            key = sites.site_of_stack(data, stack)
            per_site[key] = per_site.get(key, 0) + size
            if key not in source:
                source[key] = next(
                    (f["source"] for f in sites.frames_of(data, stack) if (f["filename"], f["line"], f["name"]) == key),
                    "",
                )
        ordered = sorted(per_site.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return [(size, _location(key), source[key]) for key, size in ordered]


def _location(key: tuple) -> str:
    filename, line, function = key
    return filename if not line else f"{filename}:{line} in {function}"


class AllocationWindow:
    """Measures the allocations made between :meth:`start` and :meth:`stop` on every device
    torchmem serves (see the module docstring)."""

    def __init__(self, entries: int = TRACE_ENTRIES):
        self.entries = entries
        self._started_trace = False
        self._start_us = 0

    def start(self) -> None:
        from torchmem.reports import snapshot

        if snapshot.trace_max_entries() == 0:
            # No background sampler (sample_interval=0): the window needs the events only.
            snapshot.record_trace(self.entries, sample_interval=0)
            self._started_trace = True
        # Trace times are the engine's wall clock in microseconds (system_clock), as here.
        self._start_us = time.time_ns() // 1000

    def stop(self) -> dict[str, DeviceUsage]:
        """Per device name, the window's figures; stops the trace the window started."""
        from torchmem.reports import collect, devices, snapshot

        capacity = snapshot.trace_max_entries()
        stacks = collect.StackTable()
        try:
            out = {}
            for device in devices.select(None, what="torchmem: the test's allocations"):
                out[device.name] = _replay(device.name, device.engine.trace(), self._start_us, capacity, stacks)
            return out
        finally:
            if self._started_trace:
                snapshot.record_trace(0)
                self._started_trace = False


def _replay(name: str, entries: list, start_us: int, capacity: int, stacks) -> DeviceUsage:
    usage = DeviceUsage(name)
    # The ring is full and its oldest event is inside the window: earlier ones were lost.
    if entries and capacity and len(entries) >= capacity and entries[0]["time_us"] >= start_us:
        usage.complete = False
    own: dict[int, tuple[int, int]] = {}  # address -> (bytes, stack) of the window's live blocks
    in_use = 0
    per_stack: dict[int, int] = {}
    peak_index = -1
    window = [entry for entry in entries if entry["time_us"] >= start_us]
    for index, entry in enumerate(window):
        action = entry["action"]
        if action == "alloc":
            own[entry["addr"]] = (entry["size"], entry["context"])
            in_use += entry["size"]
            usage.allocations += 1
            if in_use > usage.peak_bytes:
                usage.peak_bytes, peak_index = in_use, index
        elif action == "free_requested":
            block = own.pop(entry["addr"], None)
            if block is not None:
                in_use -= block[0]
    usage.alive_bytes = in_use
    usage.alive_blocks = len(own)
    # A second pass to the peak: what was alive then, per stack.
    live: dict[int, tuple[int, int]] = {}
    for entry in window[: peak_index + 1]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = (entry["size"], entry["context"])
        elif entry["action"] == "free_requested":
            live.pop(entry["addr"], None)
    for size, context in live.values():
        stack = stacks(context)
        per_stack[stack] = per_stack.get(stack, 0) + size
    usage.at_peak = per_stack
    usage.stacks = {str(stack): stacks.table.get(str(stack), []) for stack in per_stack if stack}
    return usage
