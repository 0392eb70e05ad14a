"""The HTML report: one self-contained page that answers "what holds my memory, where was
it allocated, what leaked".

    torchmem.write_html("memory.html")                     # this process, now
    torchmem.write_html("memory.html", "train.tmem")       # a saved capture
    torchmem.load_capture("train.tmem").write_html("memory.html")

The page has, per device: memory over time (in use, stacked by tag and by category, with
the reserved line and out-of-memory moments), the top allocation sites by peak and by live
bytes with their stacks and source lines, an icicle of the Python stacks holding memory
at the peak and at the capture, memory by category and module, and the cache's segments
with what is free in them; then the leak findings with their holders, the out-of-memory
details, and for a distributed job a row per rank.

Libraries. The page is laid out by a Jinja2 template (``templates/report.html.j2``) and its
charts are drawn by plotly.js, inlined from the ``plotly`` package (``plotly.offline.
get_plotlyjs()``), so the file opens anywhere without a network. Plotly was chosen for its
stacked area charts with a shared hover, and its icicle charts (click to zoom into a
stack), both built in; the price is ~4.7 MB of JavaScript in each file. The figures are
written as plotly.js JSON directly (not through plotly.py's figure objects, whose
validation costs more than the data). Long series are thinned (each bucket keeps its
maximum, so a peak is never smoothed away), so a page of 100k trace events stays quick.
"""

from __future__ import annotations

import html as _html
import json
import os
import re
from typing import Iterable

from torchmem._support.units import format_bytes
from torchmem.reports import sites as _sites
from torchmem.reports import text as _text

__all__ = ["write_html", "render_html"]

# Points per timeline series, and nodes per icicle: beyond these a browser slows and a
# reader sees no more.
MAX_POINTS = 1500
MAX_ICICLE_NODES = 400
MAX_SEGMENTS_DRAWN = 48
_ICICLE_LEVELS = 10
MAX_BLOCKS_PER_SEGMENT = 400
TOP_SITES = 15

# Categories in a fixed colour order, so two reports read alike.
_CATEGORY_COLOURS = {
    "parameters": "#4c78a8",
    "gradients": "#f58518",
    "optimizer_state": "#54a24b",
    "activations": "#e45756",
    "other": "#bab0ac",
}
_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def _colour(name: str, index: dict) -> str:
    if name not in index:
        index[name] = _PALETTE[len(index) % len(_PALETTE)]
    return index[name]


def _mib(values: Iterable) -> list:
    return [None if v is None else round(v / 2**20, 4) for v in values]


def _seconds(times: list, origin: int) -> list:
    return [round((t - origin) / 1e6, 6) for t in times]


# --- charts -------------------------------------------------------------------------------


def _timeline_figures(data: dict, device: str, replay, origin: int, colours: dict, prefix: str = "") -> list[dict]:
    """Memory over time: by tag (and by category when tracked), with in use and reserved lines."""
    figures = []
    samples = data.get("samples") or {}
    series = (samples.get("devices") or {}).get(device)
    times = samples.get("time_us") or []
    lines = []
    if replay.times:
        t, v = _sites.downsample(replay.times, replay.in_use, MAX_POINTS)
        lines.append({"type": "scatter", "mode": "lines", "name": "in use (trace)", "x": _seconds(t, origin),
                      "y": _mib(v), "line": {"color": "#222", "width": 1.5, "shape": "hv"}})
    if replay.reserved_times:
        t, v = _sites.downsample(replay.reserved_times + replay.times[-1:],
                                 replay.reserved + replay.reserved[-1:], MAX_POINTS)
        lines.append({"type": "scatter", "mode": "lines", "name": "reserved (cache)", "x": _seconds(t, origin),
                      "y": _mib(v), "line": {"color": "#888", "width": 1, "dash": "dot", "shape": "hv"}})
    oom_shapes = _oom_markers(data, device, origin)
    keep = _thin_indices(times, series["in_use"] if series else [], MAX_POINTS)
    x = _seconds([times[i] for i in keep], origin)
    for kind, title in (("tags", "memory in use by tag"), ("categories", "memory in use by category")):
        stacked = []
        if series and series.get(kind):
            names = list(series[kind])
            if kind == "categories":
                names = [n for n in _CATEGORY_COLOURS if n in series[kind]]
            else:
                names.sort(key=lambda n: -max(series[kind][n] or [0]))
            for name in names:
                colour = _CATEGORY_COLOURS.get(name) if kind == "categories" else _colour(name, colours)
                stacked.append({"type": "scatter", "mode": "lines", "name": name.replace("_", " "),
                                "x": x, "y": _mib(series[kind][name][i] for i in keep), "stackgroup": kind,
                                "line": {"width": 0.5, "color": colour}, "fillcolor": colour})
        if kind == "categories" and not stacked:
            continue
        if not stacked and not lines:
            continue
        figures.append({
            "id": f"{prefix}timeline-{kind}-{_slug(device)}",
            "title": title,
            "data": stacked + lines,
            "layout": {
                "height": 340, "margin": {"l": 60, "r": 20, "t": 10, "b": 40},
                "xaxis": {"title": {"text": "seconds"}, "rangemode": "tozero"},
                "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"},
                "hovermode": "x unified", "legend": {"orientation": "h", "y": -0.2},
                "shapes": oom_shapes,
            },
        })
    return figures


def _thin_indices(times: list, totals: list, limit: int) -> list[int]:
    """Indices of samples to draw: all, or per time bucket the one with the most in use."""
    if len(times) <= limit:
        return list(range(len(times)))
    start, width = times[0], max(1, (times[-1] - times[0]) / limit)
    best: dict[int, int] = {}
    for i, t in enumerate(times):
        bucket = int((t - start) / width)
        j = best.get(bucket)
        if j is None or (totals[i] or 0) > (totals[j] or 0):
            best[bucket] = i
    return sorted(best.values())


def _oom_markers(data: dict, device: str, origin: int) -> list[dict]:
    oom = data.get("oom") or {}
    return [
        {"type": "line", "x0": (e["time_us"] - origin) / 1e6, "x1": (e["time_us"] - origin) / 1e6, "yref": "paper",
         "y0": 0, "y1": 1, "line": {"color": "#d62728", "width": 2}}
        for e in oom.get("events", []) if e["device"] == device
    ]


def _icicle(data: dict, stacks: dict, figure_id: str, title: str) -> dict | None:
    """An icicle of application stacks (outermost at the top) weighted by bytes."""
    total = sum(stacks.values())
    if total <= 0:
        return None
    nodes: dict[str, list] = {"": ["", "all stacks", 0, "all stacks"]}  # id -> [parent, label, value, hover]
    for stack, size in stacks.items():
        if size <= 0:
            continue
        frames = _sites.application_stack(data, stack)
        path = ""
        nodes[""][2] += size
        if not frames:
            frames = [{"filename": "(no stack recorded)", "line": 0, "name": "", "source": ""}]
        for frame in frames:
            label = f"{frame['name']} {os.path.basename(frame['filename'])}:{frame['line']}" if frame["line"] else \
                frame["filename"]
            node = f"{path}/{frame['filename']}:{frame['line']}:{frame['name']}"
            if node not in nodes:
                hover = f"{frame['filename']}:{frame['line']} in {frame['name']}"
                if frame.get("source"):
                    hover += "<br>" + _html.escape(frame["source"])
                nodes[node] = [path, label, 0, hover]
            nodes[node][2] += size
            path = node
    # Keep the biggest nodes (a parent is always at least as big as its children, so
    # keeping by size keeps every kept node's parent).
    if len(nodes) > MAX_ICICLE_NODES:
        kept = sorted(nodes, key=lambda n: -nodes[n][2])[:MAX_ICICLE_NODES]
        nodes = {n: nodes[n] for n in kept}
    ids = list(nodes)
    depth = max((i.count("/") for i in ids), default=0) + 1
    return {
        "id": figure_id,
        "title": title,
        "data": [{
            "type": "icicle", "ids": [i or "all" for i in ids],
            "parents": [("all" if nodes[i][0] == "" else nodes[i][0]) if i else "" for i in ids],
            "labels": [nodes[i][1] for i in ids], "values": [nodes[i][2] for i in ids],
            "customdata": [[format_bytes(nodes[i][2]), nodes[i][3]] for i in ids],
            "branchvalues": "total", "tiling": {"orientation": "v"},
            "hovertemplate": "%{customdata[1]}<br>%{customdata[0]} (%{percentRoot:.1%})<extra></extra>",
            "maxdepth": _ICICLE_LEVELS,
        }],
        # plotly gives each shown level the same height: size the chart by its depth.
        "layout": {"height": 40 + 44 * min(depth, _ICICLE_LEVELS), "margin": {"l": 5, "r": 5, "t": 5, "b": 5}},
    }


def _ranks_figure(ranks: list[dict]) -> dict | None:
    lines = []
    origin = None
    replays = []
    for index, rank in enumerate(ranks):
        for device in rank["devices"]:
            replayed = _sites.replay(rank, device)
            if replayed.times:
                replays.append((_part_name(rank["meta"], index), device, replayed))
                origin = replayed.times[0] if origin is None else min(origin, replayed.times[0])
    for name, device, replayed in replays:
        t, v = _sites.downsample(replayed.times, replayed.in_use, MAX_POINTS)
        lines.append({"type": "scatter", "mode": "lines", "name": f"rank {name} {device}",
                      "x": _seconds(t, origin), "y": _mib(v), "line": {"shape": "hv", "width": 1.2}})
    if not lines:
        return None
    return {"id": "timeline-ranks", "title": "memory in use per rank", "data": lines,
            "layout": {"height": 320, "margin": {"l": 60, "r": 20, "t": 10, "b": 40},
                       "xaxis": {"title": {"text": "seconds"}}, "yaxis": {"title": {"text": "MiB"}},
                       "hovermode": "x unified", "legend": {"orientation": "h", "y": -0.25}}}


# --- sections -------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _stack_rows(data: dict, stacks: dict, limit: int = 3) -> list[dict]:
    """The heaviest stacks of a site, each as frames (innermost first, markers kept)."""
    out = []
    for stack, size in sorted(stacks.items(), key=lambda kv: -kv[1])[:limit]:
        frames = [f for f in _sites.frames_of(data, stack) if f["origin"] != "runner"]
        out.append({"bytes": format_bytes(size), "frames": frames})
    return out


def _site_rows(data: dict, sites: list) -> list[dict]:
    return [
        {
            "location": site.location, "source": site.source,
            "live": format_bytes(site.live_bytes), "live_blocks": f"{site.live_blocks:,}",
            "peak": format_bytes(site.peak_bytes), "at_peak": format_bytes(site.at_peak_bytes),
            "allocations": f"{site.allocations:,}",
            "tags": ", ".join(f"{t} {format_bytes(b)}" for t, b in sorted(site.tags.items(), key=lambda kv: -kv[1])),
            "categories": ", ".join(f"{c.replace('_', ' ')} {format_bytes(b)}"
                                    for c, b in sorted(site.categories.items(), key=lambda kv: -kv[1])
                                    if c != "other" or len(site.categories) > 1),
            "stacks": _stack_rows(data, site.stacks),
        }
        for site in sites
    ]


_STATE_CLASS = ("allocated", "pending", "free")


def _segments(figures: dict, colours: dict) -> dict:
    segments = figures["segments"]
    rows = []
    for segment in sorted(segments, key=lambda s: -s["size"]):
        blocks = segment["blocks"]
        free = [b[1] for b in blocks if b[3] == 2]
        allocated = sum(b[1] for b in blocks if b[3] == 0)
        row = {
            "address": f"{segment['address']:#x}", "pool": segment["pool"].replace("_", " "),
            "stream": segment["stream"], "size": format_bytes(segment["size"]),
            "allocated": format_bytes(allocated), "free": format_bytes(sum(free)),
            "largest_free": format_bytes(max(free, default=0)), "blocks": len(blocks),
            "rects": [],
        }
        if len(rows) < MAX_SEGMENTS_DRAWN and segment["size"]:
            row["rects"] = _segment_rects(segment, colours)
        rows.append(row)
    return {"rows": rows, "drawn": min(len(rows), MAX_SEGMENTS_DRAWN), "total": len(rows)}


def _segment_rects(segment: dict, colours: dict) -> list[dict]:
    size = segment["size"]
    rects = []
    blocks = segment["blocks"]
    # Many tiny blocks: merge neighbours of the same state into one rectangle.
    merge = len(blocks) > MAX_BLOCKS_PER_SEGMENT
    for offset, length, requested, state, tag in blocks:
        if merge and rects and rects[-1]["state"] == state and (state != 0 or rects[-1]["tag"] == tag):
            rects[-1]["w"] = round((offset + length) / size * 1000 - rects[-1]["x"], 3)
            rects[-1]["count"] += 1
            rects[-1]["bytes"] += length
            continue
        rects.append({"x": round(offset / size * 1000, 3), "w": round(length / size * 1000, 3), "state": state,
                      "tag": tag, "count": 1, "bytes": length})
    for rect in rects:
        state = _STATE_CLASS[rect["state"]]
        rect["fill"] = _colour(rect["tag"] or "untagged", colours) if rect["state"] == 0 else (
            "#f2a541" if rect["state"] == 1 else "#e8e8e8")
        what = f"{rect['count']} blocks" if rect["count"] > 1 else "block"
        rect["title"] = f"{what}, {format_bytes(rect['bytes'])}, {state.replace('pending', 'freed, pending')}" + (
            f", tag={rect['tag'] or 'untagged'}" if rect["state"] == 0 else "")
    return rects


_LAST_INDEX = re.compile(r"\[(\d+)\](?!.*\[\d+\])")


def _fold_owner_paths(owners: list[dict]) -> list[dict]:
    """``HOARD[0]``, ``HOARD[1]``, ``HOARD[2]`` -> one holder ``HOARD[0..2]`` (paths that
    differ only in their last index), as the text report shows them."""
    groups: dict[tuple, list] = {}
    for owner in owners:
        match = _LAST_INDEX.search(owner["path"])
        if match is None:
            groups.setdefault((owner["path"], None, owner.get("location")), []).append((0, owner))
            continue
        key = (owner["path"][: match.start()], owner["path"][match.end():], owner.get("location"))
        groups.setdefault(key, []).append((int(match.group(1)), owner))
    out = []
    for (head, tail, location), members in groups.items():
        if tail is None or len(members) == 1:
            out.extend(owner for _, owner in members)
            continue
        values = sorted({value for value, _ in members})
        contiguous = values == list(range(values[0], values[0] + len(values)))
        inner = f"{values[0]}..{values[-1]}" if contiguous else ", ".join(map(str, values))
        out.append({"path": f"{head}[{inner}]{tail}", "location": location})
    return out


def _leak_groups(leaks: dict | None) -> list[dict]:
    """Findings grouped by kind, tag, category, allocation stack and cycle, largest first,
    with their holders folded."""
    if not leaks:
        return []
    groups: dict[tuple, dict] = {}
    for finding in leaks["report"]["findings"]:
        frames = tuple((f["filename"], f["line"], f["name"]) for f in finding["frames"])
        # Captures older than categories in leak findings carry neither key.
        category, module = finding.get("category"), finding.get("module")
        key = (finding["kind"], finding["counted"], finding["device"], finding["tag"], category, module, frames,
               tuple(finding.get("cycle_types") or ()), finding.get("cycle"), finding.get("note"))
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "kind": finding["kind"], "counted": finding["counted"], "device": finding["device"],
                "tag": finding["tag"] or "untagged", "category": category, "module": module,
                "owners": [], "cycle": finding.get("cycle"),
                "note": finding.get("note"), "frames": [f for f in finding["frames"] if f["line"]][:8],
                "bytes": 0, "blocks": 0,
            }
        group["owners"].extend(owner for owner in finding["owners"] if owner not in group["owners"])
        group["bytes"] += finding["size"]
        group["blocks"] += 1
    ordered = sorted(groups.values(), key=lambda g: (not (g["kind"] in ("reachable", "cycle") and g["counted"]),
                                                     -g["bytes"]))
    for group in ordered:
        group["owners"] = _fold_owner_paths(group["owners"])
        group["size"] = format_bytes(group["bytes"])
        group["leaked"] = group["kind"] in ("reachable", "cycle") and group["counted"]
    return ordered


def _device_section(data: dict, device: str, origin: int, colours: dict, charts: list, prefix: str = "") -> dict:
    """``prefix``: what makes this part's chart ids unique on a page of many (a job's ranks,
    where every rank has a ``cpu``)."""
    figures = data["devices"][device]
    summary = figures["summary"]
    replayed = _sites.replay(data, device)
    timelines = _timeline_figures(data, device, replayed, origin, colours, prefix)
    charts.extend(timelines)
    by_live = _sites.top_sites(data, device, by="live", limit=TOP_SITES, replayed={device: replayed})
    by_peak = _sites.top_sites(data, device, by="peak", limit=TOP_SITES, replayed={device: replayed})
    icicles = []
    for stacks, kind, title in ((replayed.stack_at_peak, "peak", "Python stacks holding memory at the peak"),
                                (_live_stacks(figures), "live", "Python stacks holding memory at the capture")):
        figure = _icicle(data, stacks, f"{prefix}icicle-{kind}-{_slug(device)}", title)
        if figure is not None:
            charts.append(figure)
            icicles.append(figure)
    categories = _text.category_totals(data, device)
    modules = ((data.get("modules") or {}).get(device) or {}).get("at_peak")
    module_rows = []
    if modules:
        for name, values in sorted(modules["modules"].items(), key=lambda kv: -sum(kv[1].values()))[:20]:
            module_rows.append({"module": name, "bytes": format_bytes(sum(values.values())),
                                "parts": ", ".join(f"{c.replace('_', ' ')} {format_bytes(b)}"
                                                   for c, b in sorted(values.items(), key=lambda kv: -kv[1]))})
    fragmentation = summary["fragmentation"]
    return {
        "name": device,
        "slug": _slug(device),
        "summary": summary,
        "figures": {
            "peak_in_use": format_bytes(max(summary["requested"]["peak"], replayed.peak_bytes)),
            "in_use": format_bytes(summary["requested"]["current"]),
            "peak_reserved": format_bytes(summary["reserved"]["peak"]),
            "reserved": format_bytes(summary["reserved"]["current"]),
            "free_in_cache": format_bytes(fragmentation["free_bytes"]),
            "largest_free": format_bytes(fragmentation["largest_free_block"]),
            "external": f"{fragmentation['external_fragmentation'] * 100:.1f} %",
            "live_blocks": f"{summary['allocations']['current']:,}",
            "ooms": summary["ooms"],
        },
        "trace_events": replayed.events,
        "trace_recorded": figures["trace"]["recorded"],
        "stacks_captured": any(figures["blocks"]["stack"]) or any(figures["trace"]["stack"]),
        "timelines": timelines,
        "icicles": icicles,
        "by_live": _site_rows(data, by_live),
        "by_peak": _site_rows(data, by_peak) if replayed.events else [],
        "tags": [dict(t, current=format_bytes(t["current_bytes"]), peak=format_bytes(t["peak_bytes"]),
                      colour=_colour(t["tag"], colours)) for t in summary["tags"]],
        "categories": _category_rows(categories),
        "categories_at_peak": _category_rows(_categories_at_peak_sample(data, device)),
        "modules": module_rows,
        "segments": _segments(figures, colours),
    }


def _category_rows(categories: dict) -> list[dict]:
    total = max(1, sum(categories.values()))
    return [{"name": c.replace("_", " "), "bytes": format_bytes(b), "share": f"{b / total * 100:.1f} %",
             "colour": _CATEGORY_COLOURS.get(c, "#999")}
            for c, b in sorted(categories.items(), key=lambda kv: -kv[1])]


def _categories_at_peak_sample(data: dict, device: str) -> dict:
    """Bytes per category at the sample with the most memory in use (when tracked)."""
    series = ((data.get("samples") or {}).get("devices") or {}).get(device) or {}
    categories = series.get("categories") or {}
    in_use = series.get("in_use") or []
    if not categories or not in_use:
        return {}
    peak = max(range(len(in_use)), key=lambda i: in_use[i] or 0)
    return {name: values[peak] for name, values in categories.items() if values[peak]}


def _live_stacks(figures: dict) -> dict:
    out: dict = {}
    blocks = figures["blocks"]
    for size, stack in zip(blocks["requested"], blocks["stack"]):
        out[stack] = out.get(stack, 0) + size
    return out


def _origin(data: dict) -> int:
    times = []
    for figures in data["devices"].values():
        if figures["trace"]["time_us"]:
            times.append(figures["trace"]["time_us"][0])
    samples = data.get("samples") or {}
    if samples.get("time_us"):
        times.append(samples["time_us"][0])
    return min(times) if times else data.get("meta", {}).get("created_us", 0)


def _part_name(meta: dict, index: int) -> str:
    """A rank's number, or for captures combined that were not ranks of a job (``torchmem
    report a.tmem b.tmem``) their place on the page."""
    rank = meta.get("rank")
    return str(rank) if rank is not None else f"#{index + 1}"


def _rank_rows(ranks: list[dict]) -> list[dict]:
    rows = []
    for index, rank in enumerate(ranks):
        for device, figures in rank["devices"].items():
            summary = figures["summary"]
            leaks = (rank.get("leaks") or {}).get("report") or {}
            rows.append({
                "rank": _part_name(rank["meta"], index), "device": device,
                "peak": format_bytes(summary["requested"]["peak"]),
                "peak_reserved": format_bytes(summary["reserved"]["peak"]),
                "free_in_cache": format_bytes(summary["fragmentation"]["free_bytes"]),
                "top_tags": ", ".join(f"{t['tag']} {format_bytes(t['peak_bytes'])}" for t in
                                      sorted(summary["tags"], key=lambda t: -t["peak_bytes"])[:3]),
                "leaked": format_bytes(leaks.get("leaked_bytes", 0)) if leaks else "no check",
                "ooms": summary["ooms"],
            })
    return rows


def _page(capture) -> tuple[dict, list]:
    data = capture.data
    charts: list[dict] = []
    colours: dict = {}
    parts = capture.ranks or [capture]
    ranks = []
    for index, part in enumerate(parts):
        part_data = part.data
        origin = _origin(part_data)
        prefix = f"part{index}-" if len(parts) > 1 else ""
        devices = [_device_section(part_data, name, origin, colours, charts, prefix) for name in part_data["devices"]]
        leaks = part_data.get("leaks")
        groups = _leak_groups(leaks)
        ranks.append({
            "label": part.label,
            "rank": _part_name(part.meta, index),
            "devices": devices,
            "leaks": leaks,
            "leak_groups": groups,
            "leaked_bytes": format_bytes((leaks or {}).get("report", {}).get("leaked_bytes", 0)) if leaks else None,
            "oom": part_data.get("oom"),
            "tracking": part_data.get("tracking") or {},
            "meta": part.meta,
        })
    job = None
    if capture.ranks:
        figure = _ranks_figure([r.data for r in capture.ranks])
        if figure is not None:
            charts.append(figure)
        missing = sorted((capture.meta.get("missing_ranks") or {}).items(), key=lambda item: int(item[0]))
        job = {"rows": _rank_rows([r.data for r in capture.ranks]), "figure": figure, "missing": missing}
    return {"title": capture.label, "parts": ranks, "job": job, "meta": capture.meta,
            "source": capture.source}, charts


def _environment():
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("torchmem.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["bytes"] = format_bytes
    return environment


def _script_json(value) -> str:
    # Inside <script>: "</" would end the element early.
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def render_html(capture) -> str:
    """The report page of a ``Capture`` as a string."""
    import plotly
    from plotly.offline import get_plotlyjs

    page, charts = _page(capture)
    template = _environment().get_template("report.html.j2")
    import torchmem

    return template.render(
        page=page,
        charts_json=_script_json(charts),
        plotly_js=get_plotlyjs(),
        plotly_version=plotly.__version__,
        torchmem_version=torchmem.__version__,
    )


def write_html(path: str | os.PathLike, capture=None, *, leaks=None) -> str:
    """Writes the HTML report to ``path``; returns the path.

    ``capture``: ``None`` for this process now (``leaks``: a ``LeakReport`` to include),
    a ``Capture``, the path of a ``.tmem`` file, or a list of those (the ranks of a job:
    one page with a row per rank). Overwrites ``path``.
    """
    from torchmem.reports import capture as _capture

    if capture is None:
        from torchmem.reports import collect

        capture = _capture.Capture(collect.collect(leaks=leaks))
    elif isinstance(capture, (list, tuple)):
        capture = _capture.combine_captures(capture)
    elif isinstance(capture, (str, os.PathLike)):
        capture = _capture.load_capture(capture)
    elif not isinstance(capture, _capture.Capture):
        raise TypeError(
            f"torchmem.write_html: capture must be None, a Capture, a .tmem path or a list of them, got "
            f"{type(capture).__name__}"
        )
    path = _capture._checked_output(path, "torchmem.write_html")
    text = render_html(capture)
    temporary = f"{path}.{os.getpid()}.partial"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)
    return path
