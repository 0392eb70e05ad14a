"""``torchmem.summary()``: one readable page per device — peak, reserved, tags, fragmentation.

    print(torchmem.summary())                  # text, every device torchmem serves
    torchmem.summary("cpu", format="json")     # the same figures as JSON
    torchmem.summary(format="dict")["devices"]["cpu"]["allocated"]["peak"]

The dict form holds only JSON types (string keys, lists, ints, floats, bools, None), so
``json.loads(summary(format="json")) == summary(format="dict")``.
"""

from __future__ import annotations

import json

import torchmem
from torchmem.runtime import install as _install
from torchmem.reports import categories as _categories
from torchmem.reports import devices as _report_devices
from torchmem._support.tables import render_rows, render_table
from torchmem._support.units import format_bytes
from torchmem._support.validate import require_int
from torchmem.reports.devices import DevicesArg

__all__ = ["summary", "FORMATS"]

FORMATS = ("text", "json", "dict")

# Figures of the fragmentation report carried into the summary, per pool as well.
_FREE_SPACE_KEYS = (
    "free_bytes",
    "largest_free_block",
    "external_fragmentation",
    "internal_waste_bytes",
    "free_blocks",
    "pending_free_bytes",
    "inactive_split_bytes",
)


# Allocation sites listed per device by live and by peak bytes.
DEFAULT_TOP_SITES = 5


def summary(devices: DevicesArg = None, format: str = "text", top: int = DEFAULT_TOP_SITES):  # noqa: A002
    """What torchmem's allocator holds, per device: a text table, JSON, or a dict.

    For each device: allocated / reserved / requested bytes (current and peak), live and
    total allocations, device segments obtained and released, allocation retries and
    out-of-memory errors (``num_alloc_retries``/``num_ooms``, as in
    ``torch.cuda.memory_stats()``), every tag's current and peak bytes and live blocks
    (``torchmem.tag``; memory allocated outside every tag is ``"untagged"``), and the
    fragmentation of the cache: bytes free in cached segments, the largest free block,
    external fragmentation (``1 - largest free block / free bytes``: how much of the free
    memory a single large request could not use) and internal waste (bytes allocated
    beyond what was requested, from rounding).

    ``devices``: ``None`` for every device torchmem serves (CUDA devices that never allocated
    are left out), or a device / list of devices.
    ``format``: ``"text"`` (returns a str to print), ``"json"`` (a str) or ``"dict"``.

    ``top``: how many allocation sites to list per device by live bytes (the blocks alive
    now, by the line that allocated them: needs stack capture, ``torchmem.record_history()``)
    and by peak bytes (the most each line held at once: needs the trace,
    ``torchmem.record_trace()``); 0 for none. When ``torchmem.track(model, optimizer)`` is
    on, memory in use by category (parameters, gradients, optimizer state, activations,
    other) and the modules holding the most.
    """
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"torchmem.summary: format must be one of {', '.join(map(repr, FORMATS))}; got {format!r}")
    require_int(top, what="torchmem.summary: top", minimum=0, meaning="sites listed per device")
    data = summary_dict(devices, top=top)
    if format == "dict":
        return data
    if format == "json":
        return json.dumps(data, indent=2)
    return render(data)


def summary_dict(devices: DevicesArg = None, top: int = 0) -> dict:
    """The dict form of :func:`summary` (see there); ``top`` sites per device (0: no
    ``top_sites`` key, and no cost)."""
    chosen = _report_devices.select(devices, what="torchmem.summary", skip_unused_cuda=True)
    out = {
        "torchmem_version": torchmem.__version__,
        "devices": {device.name: _device_summary(device) for device in chosen},
    }
    if top:
        for device in chosen:
            out["devices"][device.name]["top_sites"] = _top_sites(device, top)
    in_use = {name: d["requested"]["current"] for name, d in out["devices"].items()}
    for name, usage in _categories.category_usage(in_use).items():
        modules = sorted(usage["modules"].items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        out["devices"][name]["categories"] = usage["categories"]
        out["devices"][name]["top_modules"] = [
            {"module": module, "bytes": sum(figures.values()), "categories": figures}
            for module, figures in modules[: top or DEFAULT_TOP_SITES]
        ]
    return out


def _top_sites(device: _report_devices.ReportDevice, top: int) -> dict:
    """The device's ``top`` allocation sites by live and by peak bytes (see :func:`summary`)."""
    from torchmem.reports import collect, sites

    stacks = collect.StackTable()
    engine = device.engine
    reserved = int(engine.memory_stats()["reserved_bytes.all.current"])
    figures = {
        "trace": collect.trace_columns(engine, stacks),
        "blocks": collect.block_columns(engine, device.name, stacks, _categories.classify_storages()),
        "summary": {"reserved": {"current": reserved}},
    }
    data = {"stacks": stacks.table, "devices": {device.name: figures}}
    replayed = {device.name: sites.replay(data, device.name)}

    def rows(by: str) -> list[dict]:
        return [
            {"site": site.location, "source": site.source, "live_bytes": site.live_bytes,
             "live_blocks": site.live_blocks, "peak_bytes": site.peak_bytes}
            for site in sites.top_sites(data, device.name, by=by, limit=top, replayed=replayed)
        ]

    has_trace = bool(figures["trace"]["action"])
    return {
        "stacks_captured": any(figures["blocks"]["stack"]) or any(figures["trace"]["stack"]),
        "trace_recorded": has_trace,
        "by_live": rows("live"),
        "by_peak": rows("peak") if has_trace else [],
    }


def _current_peak(stats: dict, key: str) -> dict:
    return {"current": int(stats[f"{key}.all.current"]), "peak": int(stats[f"{key}.all.peak"])}


def _free_space(raw: dict) -> dict:
    out = {key: raw[key] for key in _FREE_SPACE_KEYS}
    out["external_fragmentation"] = float(out["external_fragmentation"])
    return out


def _device_summary(device: _report_devices.ReportDevice) -> dict:
    engine = device.engine
    stats = engine.memory_stats()
    fragmentation = engine.fragmentation()
    tags = []
    for row in engine.tag_stats():
        tags.append(
            {
                "tag": row["tag"],
                "current_bytes": int(row["current_bytes"]),
                "peak_bytes": int(row["peak_bytes"]),
                "live_blocks": int(row["live_blocks"]),
                "allocations": int(row["allocations"]),
                "requested_bytes": int(row["requested_bytes"]),
            }
        )
    # Biggest holders first; tags that never allocated anything are noise.
    tags = [tag for tag in tags if tag["allocations"] or tag["current_bytes"] or tag["peak_bytes"]]
    tags.sort(key=lambda tag: (-tag["current_bytes"], -tag["peak_bytes"], tag["tag"]))
    free = _free_space(fragmentation)
    free["small_pool"] = _free_space(fragmentation["small_pool"])
    free["large_pool"] = _free_space(fragmentation["large_pool"])
    free["free_block_histogram"] = [
        {"lower_bound": int(lower), "count": int(count), "bytes": int(size)}
        for lower, count, size in fragmentation["free_block_histogram"]
    ]
    return {
        "device": device.name,
        "installed": _install.is_installed(device.device.type),
        "memory_limit": int(engine.memory_limit),
        "allocated": _current_peak(stats, "allocated_bytes"),
        "reserved": _current_peak(stats, "reserved_bytes"),
        "requested": _current_peak(stats, "requested_bytes"),
        "active": _current_peak(stats, "active_bytes"),
        "allocations": {
            "current": int(stats["allocation.all.current"]),
            "peak": int(stats["allocation.all.peak"]),
            "total": int(stats["allocation.all.allocated"]),
        },
        "segments": {
            "current": int(stats["segment.all.current"]),
            "peak": int(stats["segment.all.peak"]),
        },
        "device_allocs": int(stats["num_device_alloc"]),
        "device_frees": int(stats["num_device_free"]),
        "alloc_retries": int(stats["num_alloc_retries"]),
        "ooms": int(stats["num_ooms"]),
        "tags": tags,
        "fragmentation": free,
    }


# --- text -------------------------------------------------------------------------------


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Aligned columns, the first row as header: the first column left-aligned, the others
    right-aligned (numbers)."""
    return render_table(rows[0], rows[1:], indent=indent).splitlines()


def _rows(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Aligned columns without a header row."""
    return render_rows(rows, indent=indent).splitlines()


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.1f} %"


def _device_text(name: str, d: dict) -> list[str]:
    title = f"torchmem summary: {name}"
    if not d["installed"]:
        title += "  (not installed now: PyTorch's own allocator serves new tensors)"
    lines = [title]
    memory_rows = [
        ["", "current", "peak"],
        ["allocated", format_bytes(d["allocated"]["current"]), format_bytes(d["allocated"]["peak"])],
        ["reserved", format_bytes(d["reserved"]["current"]), format_bytes(d["reserved"]["peak"])],
        ["requested", format_bytes(d["requested"]["current"]), format_bytes(d["requested"]["peak"])],
        ["live blocks", f"{d['allocations']['current']:,}", f"{d['allocations']['peak']:,}"],
        ["segments", f"{d['segments']['current']:,}", f"{d['segments']['peak']:,}"],
    ]
    lines += _table(memory_rows)
    counters = (
        f"  allocations {d['allocations']['total']:,}   segments obtained {d['device_allocs']:,}, "
        f"released {d['device_frees']:,}   alloc retries {d['alloc_retries']:,}   OOMs {d['ooms']:,}"
    )
    if d["memory_limit"]:
        counters += f"   limit {format_bytes(d['memory_limit'])}"
    lines.append(counters)

    lines.append("")
    if d["tags"]:
        tag_rows = [["tag", "current", "peak", "live blocks", "allocations"]]
        for tag in d["tags"]:
            tag_rows.append(
                [
                    tag["tag"],
                    format_bytes(tag["current_bytes"]),
                    format_bytes(tag["peak_bytes"]),
                    f"{tag['live_blocks']:,}",
                    f"{tag['allocations']:,}",
                ]
            )
        lines += _table(tag_rows)
    else:
        lines.append("  tags: nothing allocated yet")

    f = d["fragmentation"]
    lines.append("")
    lines.append("  fragmentation of the cache (free memory torchmem holds for reuse)")
    frag_rows = [
        [
            "free in cache",
            format_bytes(f["free_bytes"]),
            f"small pool {format_bytes(f['small_pool']['free_bytes'])}, "
            f"large pool {format_bytes(f['large_pool']['free_bytes'])}, {f['free_blocks']:,} free blocks",
        ],
        ["largest free block", format_bytes(f["largest_free_block"]), "the largest request served without a new segment"],
        [
            "external",
            _percent(f["external_fragmentation"]),
            "1 - largest free block / free in cache",
        ],
        ["internal waste", format_bytes(f["internal_waste_bytes"]), "allocated beyond requested (rounding)"],
    ]
    if f["pending_free_bytes"]:
        frag_rows.append(
            ["pending free", format_bytes(f["pending_free_bytes"]), "freed, waiting on other streams' events"]
        )
    # The note column is text: left-align it by rendering it outside the numeric table.
    numeric = _rows([row[:2] for row in frag_rows], indent="    ")
    lines += [f"{line}   {row[2]}" for line, row in zip(numeric, frag_rows)]
    if "categories" in d:
        lines += ["", *_category_text(d)]
    if "top_sites" in d:
        lines += ["", *_sites_text(d["top_sites"])]
    return lines


def _category_text(d: dict) -> list[str]:
    total = sum(d["categories"].values())
    rows = [
        [category.replace("_", " "), format_bytes(size), _percent(size / total) if total else "-"]
        for category, size in d["categories"].items()
    ]
    lines = ["  memory in use by category (torchmem.track)"]
    lines += _table([["category", "bytes", "share"], *rows])
    if d.get("top_modules"):
        module_rows = [
            [m["module"], format_bytes(m["bytes"]),
             ", ".join(f"{c.replace('_', ' ')} {format_bytes(b)}" for c, b in sorted(m["categories"].items(),
                                                                                    key=lambda kv: -kv[1]))]
            for m in d["top_modules"]
        ]
        lines += [""]
        lines += render_table(["module", "bytes", "of which"], module_rows, justify=["left", "right", "left"]
                              ).splitlines()
    return lines


def _sites_text(top: dict) -> list[str]:
    def where(site: dict) -> str:
        return f"{site['site']}  {site['source']}" if site["source"] else site["site"]

    lines = ["  top allocation sites by live bytes (blocks alive now, by the line that allocated them)"]
    if not top["stacks_captured"]:
        lines.append("    no stacks captured: torchmem.record_history() (or record_trace()) records where blocks come from")
    if top["by_live"]:
        rows = [[format_bytes(s["live_bytes"]), f"{s['live_blocks']:,}", where(s)] for s in top["by_live"]]
        lines += render_table(["live", "blocks", "allocated at"], rows, justify=["right", "right", "left"],
                              indent="    ").splitlines()
    else:
        lines.append("    nothing alive")
    lines.append("  top allocation sites by peak bytes (the most each line held at once)")
    if not top["trace_recorded"]:
        lines.append("    no trace recorded: torchmem.record_trace() records one (torchmem run does)")
    else:
        rows = [[format_bytes(s["peak_bytes"]), format_bytes(s["live_bytes"]), where(s)] for s in top["by_peak"]]
        lines += render_table(["peak", "live now", "allocated at"], rows, justify=["right", "right", "left"],
                              indent="    ").splitlines()
    return lines


def render(data: dict) -> str:
    """The text form of a :func:`summary` dict."""
    devices = data["devices"]
    if not devices:
        return "torchmem summary: no device to report (torchmem serves none yet)"
    blocks = [_device_text(name, d) for name, d in devices.items()]
    return "\n\n".join("\n".join(block) for block in blocks)
