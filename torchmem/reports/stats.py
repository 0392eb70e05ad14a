"""A capture's allocation statistics (``torchmem stats CAPTURE``), like ``memray stats``:
per device, how many allocations the trace holds and how many bytes they asked for, the
sizes they came in, and the lines that allocated most often and the most bytes.

Counts come from the trace's ``alloc`` events (``torchmem.record_trace``), so they cover
what the ring kept: when it wrapped, the earliest events are gone, and the text says so.
"""

from __future__ import annotations

from torchmem._support.tables import render_table
from torchmem._support.units import format_bytes

__all__ = ["stats_dict", "render_stats"]

# Upper bounds of the size classes (bytes); the last class is everything above.
_SIZE_CLASSES = (512, 4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20, 256 * 2**20)


def _class_label(index: int) -> str:
    if index == 0:
        return f"<= {format_bytes(_SIZE_CLASSES[0])}"
    if index == len(_SIZE_CLASSES):
        return f"> {format_bytes(_SIZE_CLASSES[-1])}"
    return f"{format_bytes(_SIZE_CLASSES[index - 1])} - {format_bytes(_SIZE_CLASSES[index])}"


def _device_stats(data: dict, name: str, top: int) -> dict:
    from torchmem.reports import sites

    figures = data["devices"][name]
    trace = figures["trace"]
    actions = trace["actions"]
    alloc = actions.index("alloc") if "alloc" in actions else -1
    free = actions.index("free_requested") if "free_requested" in actions else -1
    classes = [[0, 0] for _ in range(len(_SIZE_CLASSES) + 1)]
    per_site: dict[tuple, list] = {}
    site_of: dict = {}
    allocations = frees = allocated_bytes = 0
    for action, size, stack in zip(trace["action"], trace["size"], trace["stack"]):
        if action == free:
            frees += 1
            continue
        if action != alloc:
            continue
        allocations += 1
        allocated_bytes += size
        index = next((i for i, bound in enumerate(_SIZE_CLASSES) if size <= bound), len(_SIZE_CLASSES))
        classes[index][0] += 1
        classes[index][1] += size
        key = site_of.get(stack)
        if key is None:
            key = site_of[stack] = sites.site_of_stack(data, stack)
        entry = per_site.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += size
    source = {}
    for stack, key in site_of.items():
        if key not in source:
            source[key] = next((f["source"] for f in sites.frames_of(data, stack)
                                if (f["filename"], f["line"], f["name"]) == key), "")

    def site_rows(order):
        rows = sorted(per_site.items(), key=order)[:top]
        return [{"location": _location(key), "source": source.get(key, ""), "allocations": count, "bytes": size}
                for key, (count, size) in rows]

    summary = figures["summary"]
    replayed = sites.replay(data, name)
    max_entries = trace.get("max_entries") or 0
    return {
        "trace_events": len(trace["action"]),
        "trace_max_entries": max_entries,
        "trace_wrapped": bool(max_entries) and len(trace["action"]) >= max_entries,
        "allocations": allocations,
        "frees": frees,
        "allocated_bytes": allocated_bytes,
        "peak_in_use": replayed.peak_bytes if trace["action"] else summary["requested"]["peak"],
        "in_use_at_capture": summary["requested"]["current"],
        "reserved_peak": summary["reserved"]["peak"],
        "size_classes": [{"sizes": _class_label(i), "allocations": count, "bytes": size}
                         for i, (count, size) in enumerate(classes) if count],
        "most_allocations": site_rows(lambda item: (-item[1][0], -item[1][1], item[0])),
        "most_bytes": site_rows(lambda item: (-item[1][1], -item[1][0], item[0])),
    }


def _location(key: tuple) -> str:
    filename, line, function = key
    return filename if not line else f"{filename}:{line} in {function}"


def stats_dict(capture, top: int = 5) -> dict:
    """The statistics as plain data, per device (per rank for a job's capture)."""
    if capture.data.get("ranks"):
        return {"label": capture.label, "ranks": [stats_dict(rank, top) for rank in capture.ranks]}
    return {"label": capture.label,
            "devices": {name: _device_stats(capture.data, name, top) for name in capture.data["devices"]}}


def render_stats(capture, top: int = 5) -> str:
    """The statistics as text."""
    if capture.data.get("ranks"):
        return "\n\n".join(render_stats(rank, top) for rank in capture.ranks)
    lines = [f"torchmem stats: {capture.label}" + (f"  ({capture.source})" if capture.source else "")]
    for name, figures in stats_dict(capture, top)["devices"].items():
        lines += ["", f"{name}"]
        if not figures["trace_events"]:
            lines.append("  no trace recorded: allocation counts need one (torchmem run records it; in code, "
                         "torchmem.record_trace())")
            lines.append(f"  in use at the capture {format_bytes(figures['in_use_at_capture'])}, "
                         f"peak {format_bytes(figures['peak_in_use'])}, "
                         f"reserved peak {format_bytes(figures['reserved_peak'])}")
            continue
        lines.append(render_table(None, [
            ["allocations", f"{figures['allocations']:,}"],
            ["frees", f"{figures['frees']:,}"],
            ["bytes allocated", format_bytes(figures["allocated_bytes"])],
            ["peak in use", format_bytes(figures["peak_in_use"])],
            ["in use at the capture", format_bytes(figures["in_use_at_capture"])],
            ["reserved peak", format_bytes(figures["reserved_peak"])],
        ]))
        if figures["trace_wrapped"]:
            lines.append(f"  (the trace kept its last {figures['trace_max_entries']:,} events: earlier ones are "
                         "not counted)")
        lines += ["", "  allocation sizes"]
        lines.append(render_table(["sizes", "allocations", "bytes"],
                                  [[c["sizes"], f"{c['allocations']:,}", format_bytes(c["bytes"])]
                                   for c in figures["size_classes"]], indent="    "))
        for key, title in (("most_allocations", "lines that allocated most often"),
                           ("most_bytes", "lines that allocated the most bytes")):
            lines += ["", f"  {title}"]
            lines.append(render_table(
                ["allocations", "bytes", "allocated at"],
                [[f"{s['allocations']:,}", format_bytes(s["bytes"]),
                  s["location"] + (f"  {s['source']}" if s["source"] else "")] for s in figures[key]],
                justify=["right", "right", "left"], indent="    "))
    return "\n".join(lines)
