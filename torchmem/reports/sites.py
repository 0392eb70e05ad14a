"""Where memory comes from: allocation sites, stacks, and the memory timeline of a capture.

A **site** is the line a user reads as "allocated at": the innermost frame of the
application's own code (neither PyTorch's, a runner's nor the standard library's; see
``torchmem.stacks.frames.allocation_site``), decided from the origins the capture stored
for each frame. Sites are measured two ways:

``live``  bytes of the blocks alive when the capture was taken;
``peak``  the most bytes the site held at once, and what it held at the moment the whole
          device peaked (``at_peak``), replayed from the trace.

The replay reads the trace's ``alloc`` and ``free_requested`` events (memory is in use
from the allocation until the program frees it). A trace whose ring wrapped starts
mid-run: blocks alive before its first event are counted from the frees that end them
and the blocks still alive at the capture, so totals are right from the first event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Site", "top_sites", "frames_of", "site_of_stack", "replay", "downsample"]

_APPLICATION = ("user", "library")
UNKNOWN_SITE = ("(no stack recorded)", 0, "")


def frames_of(data: dict, stack_id) -> list[dict]:
    """Frames of ``stack_id`` in a capture, innermost first."""
    raw = data.get("stacks", {}).get(str(stack_id)) or []
    return [
        {"filename": f[0], "line": f[1], "name": f[2], "origin": f[3], "source": f[4] if len(f) > 4 else ""}
        for f in raw
    ]


def site_of_stack(data: dict, stack_id) -> tuple[str, int, str]:
    """(file, line, function) of the allocation site of a stack; ``UNKNOWN_SITE`` when no
    stack was captured."""
    frames = [frame for frame in frames_of(data, stack_id) if frame["origin"] != "marker"]
    for frame in frames:
        if frame["origin"] in _APPLICATION:
            return frame["filename"], frame["line"], frame["name"]
    if frames:
        return frames[0]["filename"], frames[0]["line"], frames[0]["name"]
    return UNKNOWN_SITE


def application_stack(data: dict, stack_id) -> list[dict]:
    """The application's frames of a stack, outermost first (what an icicle draws)."""
    frames = [frame for frame in frames_of(data, stack_id) if frame["origin"] in _APPLICATION]
    return list(reversed(frames))


@dataclass
class Site:
    """One allocation line and what it holds. ``stacks``: ``{stack id: bytes}`` by the
    measure the list was sorted by."""

    filename: str
    line: int
    function: str
    source: str = ""
    live_bytes: int = 0
    live_blocks: int = 0
    peak_bytes: int = 0
    at_peak_bytes: int = 0
    allocations: int = 0
    tags: dict = field(default_factory=dict)
    categories: dict = field(default_factory=dict)
    stacks: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return (self.filename, self.line, self.function)

    @property
    def location(self) -> str:
        if self.line == 0:
            return self.filename
        return f"{self.filename}:{self.line} in {self.function}"

    def to_dict(self) -> dict:
        return {
            "filename": self.filename,
            "line": self.line,
            "function": self.function,
            "source": self.source,
            "live_bytes": self.live_bytes,
            "live_blocks": self.live_blocks,
            "peak_bytes": self.peak_bytes,
            "at_peak_bytes": self.at_peak_bytes,
            "allocations": self.allocations,
            "tags": self.tags,
            "categories": self.categories,
            "stacks": {str(k): v for k, v in self.stacks.items()},
        }


class _SiteTable:
    def __init__(self, data: dict):
        self.data = data
        self.sites: dict[tuple, Site] = {}
        self._of_stack: dict = {}

    def site(self, stack_id) -> Site:
        key = self._of_stack.get(stack_id)
        if key is None:
            key = self._of_stack[stack_id] = site_of_stack(self.data, stack_id)
        site = self.sites.get(key)
        if site is None:
            source = ""
            for frame in frames_of(self.data, stack_id):
                if (frame["filename"], frame["line"], frame["name"]) == key:
                    source = frame["source"]
                    break
            site = self.sites[key] = Site(*key, source=source)
        return site


@dataclass
class Replay:
    """The trace of one device replayed: the in-use series, its peak, and per stack the
    bytes at the peak and the most each site held at once."""

    times: list = field(default_factory=list)
    in_use: list = field(default_factory=list)
    reserved_times: list = field(default_factory=list)
    reserved: list = field(default_factory=list)
    peak_bytes: int = 0
    peak_time_us: int | None = None
    stack_at_peak: dict = field(default_factory=dict)
    site_peak: dict = field(default_factory=dict)  # site key -> bytes
    site_sources: dict = field(default_factory=dict)  # site key -> source line
    allocations_per_stack: dict = field(default_factory=dict)
    events: int = 0


def replay(data: dict, device: str) -> Replay:
    """Replays a device's trace (see the module docstring)."""
    figures = data["devices"][device]
    trace = figures["trace"]
    actions = trace["actions"]
    code = {name: actions.index(name) for name in ("alloc", "free_requested", "segment_alloc", "segment_free") if
            name in actions}
    alloc, free = code.get("alloc", -1), code.get("free_requested", -1)
    seg_alloc, seg_free = code.get("segment_alloc", -1), code.get("segment_free", -1)
    result = Replay(events=len(trace["action"]))
    if not trace["action"]:
        return result
    sites = _SiteTable(data)
    site_key = {}

    def key_of(stack):
        key = site_key.get(stack)
        if key is None:
            key = site_key[stack] = sites.site(stack).key
        return key

    # Blocks alive before the first event: freed in the trace without being allocated there,
    # or alive at the capture without an allocation in the trace.
    seen: set = set()
    live: dict[int, tuple[int, int]] = {}  # address -> (bytes, stack)
    for action, address, size, stack in zip(trace["action"], trace["addr"], trace["size"], trace["stack"]):
        if action == alloc:
            seen.add(address)
        elif action == free and address not in seen:
            seen.add(address)
            live[address] = (size, stack)
    blocks = figures["blocks"]
    for address, requested, stack in zip(blocks["address"], blocks["requested"], blocks["stack"]):
        if address not in seen:
            live[address] = (requested, stack)
    in_use = sum(size for size, _ in live.values())
    per_stack: dict = {}
    per_site: dict = {}
    for size, stack in live.values():
        per_stack[stack] = per_stack.get(stack, 0) + size
        k = key_of(stack)
        per_site[k] = per_site.get(k, 0) + size
    site_peak = dict(per_site)

    # Reserved before the first event: the capture's reserved bytes less the trace's net.
    net_reserved = 0
    for action, size in zip(trace["action"], trace["size"]):
        if action == seg_alloc:
            net_reserved += size
        elif action == seg_free:
            net_reserved -= size
    reserved = max(0, figures["summary"]["reserved"]["current"] - net_reserved)

    times, series = result.times, result.in_use
    reserved_times, reserved_series = result.reserved_times, result.reserved
    first_time = trace["time_us"][0]
    times.append(first_time)
    series.append(in_use)
    reserved_times.append(first_time)
    reserved_series.append(reserved)
    peak, peak_index = in_use, 0
    allocations = result.allocations_per_stack
    for index, (action, address, size, stack, when) in enumerate(
        zip(trace["action"], trace["addr"], trace["size"], trace["stack"], trace["time_us"])
    ):
        if action == alloc:
            live[address] = (size, stack)
            in_use += size
            allocations[stack] = allocations.get(stack, 0) + 1
            k = key_of(stack)
            value = per_site.get(k, 0) + size
            per_site[k] = value
            if value > site_peak.get(k, 0):
                site_peak[k] = value
        elif action == free:
            entry = live.pop(address, None)
            if entry is None:
                continue
            size, stack = entry
            in_use -= size
            k = key_of(stack)
            per_site[k] = per_site.get(k, 0) - size
        elif action == seg_alloc or action == seg_free:
            reserved += size if action == seg_alloc else -size
            reserved_times.append(when)
            reserved_series.append(reserved)
            continue
        else:
            continue
        times.append(when)
        series.append(in_use)
        if in_use > peak:
            peak, peak_index = in_use, index
    result.peak_bytes = peak
    result.site_peak = site_peak
    result.site_sources = {key: site.source for key, site in sites.sites.items()}
    result.peak_time_us = trace["time_us"][peak_index]
    result.stack_at_peak = _stacks_at(trace, figures, alloc, free, peak_index, per_stack_start=per_stack)
    return result


def _stacks_at(trace: dict, figures: dict, alloc: int, free: int, stop: int, per_stack_start: dict) -> dict:
    """Bytes per stack alive right after event ``stop`` (a second pass, to avoid copying the
    table at every new peak)."""
    per_stack = dict(per_stack_start)
    seen: set = set()
    live: dict[int, tuple[int, int]] = {}
    for action, address, size, stack in zip(trace["action"], trace["addr"], trace["size"], trace["stack"]):
        if action == alloc:
            seen.add(address)
        elif action == free and address not in seen:
            seen.add(address)
            live[address] = (size, stack)
    blocks = figures["blocks"]
    for address, requested, stack in zip(blocks["address"], blocks["requested"], blocks["stack"]):
        if address not in seen:
            live[address] = (requested, stack)
    for index in range(stop + 1):
        action = trace["action"][index]
        if action == alloc:
            address, size, stack = trace["addr"][index], trace["size"][index], trace["stack"][index]
            live[address] = (size, stack)
            per_stack[stack] = per_stack.get(stack, 0) + size
        elif action == free:
            entry = live.pop(trace["addr"][index], None)
            if entry is not None:
                per_stack[entry[1]] = per_stack.get(entry[1], 0) - entry[0]
    return {stack: size for stack, size in per_stack.items() if size > 0}


def top_sites(data: dict, device: str | None = None, *, by: str = "live", limit: int | None = None,
              replayed: dict | None = None) -> list[Site]:
    """Allocation sites of one device (or all), largest first by ``by``: ``"live"`` or
    ``"peak"``. ``replayed``: ``{device: Replay}`` already computed."""
    if by not in ("live", "peak"):
        raise ValueError(f"sites: by must be 'live' or 'peak', got {by!r}")
    devices = [device] if device is not None else list(data.get("devices", {}))
    for name in devices:
        if name not in data.get("devices", {}):
            known = ", ".join(data.get("devices", {})) or "none"
            raise ValueError(f"sites: the capture has no device {name!r} (it has: {known})")
    table = _SiteTable(data)
    for name in devices:
        figures = data["devices"][name]
        blocks = figures["blocks"]
        for size, stack, tag, category in zip(blocks["requested"], blocks["stack"], blocks["tag"], blocks["category"]):
            site = table.site(stack)
            site.live_bytes += size
            site.live_blocks += 1
            tag = tag or "untagged"
            site.tags[tag] = site.tags.get(tag, 0) + size
            category = category or "other"
            site.categories[category] = site.categories.get(category, 0) + size
            if by == "live":
                site.stacks[stack] = site.stacks.get(stack, 0) + size
        result = (replayed or {}).get(name) or replay(data, name)
        for key, value in result.site_peak.items():
            site = table.sites.get(key)
            if site is None:
                site = table.sites[key] = Site(*key, source=result.site_sources.get(key, ""))
            site.peak_bytes += value
        for stack, value in result.stack_at_peak.items():
            site = table.site(stack)
            site.at_peak_bytes += value
            if by == "peak":
                site.stacks[stack] = site.stacks.get(stack, 0) + value
        for stack, count in result.allocations_per_stack.items():
            table.site(stack).allocations += count
    measure = (lambda s: (s.live_bytes, s.peak_bytes)) if by == "live" else (lambda s: (s.peak_bytes, s.live_bytes))
    sites = [site for site in table.sites.values() if measure(site)[0] > 0]
    sites.sort(key=lambda s: (*(-v for v in measure(s)), s.filename, s.line))
    return sites[:limit] if limit is not None else sites


def downsample(times: list, values: list, buckets: int = 1500) -> tuple[list, list]:
    """A step series thinned to about ``buckets`` points, keeping each bucket's maximum (a
    peak is never smoothed away) and the last value."""
    if len(times) <= buckets:
        return list(times), list(values)
    start, end = times[0], times[-1]
    width = max(1, (end - start) / buckets)
    out_t, out_v = [], []
    current, best_t, best_v = None, None, None
    for t, v in zip(times, values):
        bucket = int((t - start) / width)
        if bucket != current:
            if current is not None:
                out_t.append(best_t)
                out_v.append(best_v)
            current, best_t, best_v = bucket, t, v
        elif v > best_v:
            best_t, best_v = t, v
    out_t.append(best_t)
    out_v.append(best_v)
    if out_t[-1] != times[-1]:
        out_t.append(times[-1])
        out_v.append(values[-1])
    return out_t, out_v
