"""A capture as text and as the report's JSON (``Capture.render()``, ``Capture.to_json()``)."""

from __future__ import annotations

from torchmem._support.tables import render_table
from torchmem._support.units import format_bytes
from torchmem.reports import sites as _sites

__all__ = ["render_capture", "report_dict", "render_sites", "category_totals"]


def category_totals(data: dict, device: str) -> dict[str, int]:
    """Bytes per category at the capture (from the live blocks' categories), when tracked."""
    blocks = data["devices"][device]["blocks"]
    if not any(blocks["category"]):
        return {}
    totals: dict[str, int] = {}
    for size, category in zip(blocks["requested"], blocks["category"]):
        name = category or "other"
        totals[name] = totals.get(name, 0) + size
    return totals


def render_sites(sites: list, by: str, indent: str = "  ") -> list[str]:
    """A table of sites: bytes by ``by`` first, then the other measure, the line and its source."""
    if not sites:
        return [f"{indent}(none)"]
    if by == "live":
        header = ["live", "blocks", "peak", "allocated at"]
        rows = [[format_bytes(s.live_bytes), f"{s.live_blocks:,}", format_bytes(s.peak_bytes), _where(s)] for s in sites]
    else:
        header = ["peak", "at device peak", "live", "allocated at"]
        rows = [[format_bytes(s.peak_bytes), format_bytes(s.at_peak_bytes), format_bytes(s.live_bytes), _where(s)]
                for s in sites]
    justify = ["right"] * (len(header) - 1) + ["left"]
    return render_table(header, rows, justify=justify, indent=indent).splitlines()


def _where(site) -> str:
    text = site.location
    if site.source:
        text += f"  {site.source}"
    return text


def render_capture(capture, top: int = 10) -> str:
    from torchmem.reports import summary

    data = capture.data
    if data.get("ranks"):
        return "\n\n".join(render_capture(rank, top) for rank in capture.ranks)
    lines = [f"torchmem capture: {capture.label}" + (f"  ({capture.source})" if capture.source else "")]
    devices = {name: figures["summary"] for name, figures in data["devices"].items()}
    lines.append(summary.render({"devices": devices}))
    for name in data["devices"]:
        replayed = {name: _sites.replay(data, name)}
        lines += ["", f"top allocation sites on {name} by live bytes"]
        lines += render_sites(_sites.top_sites(data, name, by="live", limit=top, replayed=replayed), "live")
        if data["devices"][name]["trace"]["action"]:
            lines += ["", f"top allocation sites on {name} by peak bytes"]
            lines += render_sites(_sites.top_sites(data, name, by="peak", limit=top, replayed=replayed), "peak")
        else:
            lines += ["", f"  peak bytes per site: no trace recorded on {name} (torchmem.record_trace() records one)"]
        totals = category_totals(data, name)
        if totals:
            lines += ["", f"memory by category on {name} (live blocks at the capture)"]
            rows = [[category, format_bytes(size)] for category, size in sorted(totals.items(), key=lambda kv: -kv[1])]
            lines.append(render_table(["category", "bytes"], rows))
    oom = data.get("oom")
    if oom:
        lines += ["", f"out of memory: {oom['count']} error(s)"]
        for event in oom["events"]:
            lines.append(f"  {event['device']}: {format_bytes(event['requested'])} requested, "
                         f"{format_bytes(event['free_then'])} free in the cache then")
        if oom.get("message"):
            lines += ["  " + line for line in oom["message"].splitlines()]
    leaks = data.get("leaks")
    lines.append("")
    lines.append(leaks["text"] if leaks else "leaks: no leak check ran for this capture")
    return "\n".join(lines)


def report_dict(capture, top: int = 20) -> dict:
    """The report's figures as plain data (what ``torchmem report --json`` prints)."""
    data = capture.data
    if data.get("ranks"):
        return {"label": capture.label, "ranks": [report_dict(rank, top) for rank in capture.ranks]}
    devices = {}
    for name, figures in data["devices"].items():
        replayed = {name: _sites.replay(data, name)}
        devices[name] = {
            "summary": figures["summary"],
            "top_sites_by_live": [s.to_dict() for s in _sites.top_sites(data, name, by="live", limit=top,
                                                                         replayed=replayed)],
            "top_sites_by_peak": [s.to_dict() for s in _sites.top_sites(data, name, by="peak", limit=top,
                                                                         replayed=replayed)],
            "categories": category_totals(data, name),
            "trace_events": len(figures["trace"]["action"]),
        }
    return {
        "label": capture.label,
        "meta": capture.meta,
        "devices": devices,
        "oom": data.get("oom"),
        "leaks": (data.get("leaks") or {}).get("report"),
    }
