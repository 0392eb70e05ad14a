"""Gathering a capture from the running process (see :mod:`torchmem.reports.capture`).

Everything is read through the engines' bindings (``trace()``, ``allocated_blocks()``,
``segments()``, ``memory_stats()``, ``tag_stats()``) and the timeline's samples; stacks are
symbolized once each, with the origin of every frame (whose code it is, decided here,
where the files are) and the source text of the application's lines, so a capture
renders the same on another machine.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time

import torch

import torchmem
from torchmem._support.files import short_path, source_line

_STATE_CODES = {"allocated": 0, "pending_free": 1, "free": 2}
STATE_NAMES = ("allocated", "pending_free", "free")


class StackTable:
    """Symbolizes engine context ids into the capture's stack table, once each."""

    def __init__(self):
        from torchmem.stacks import frames as stack_frames

        self._frames = stack_frames
        self.table: dict[str, list] = {}
        self._runner_trim = _runner_frame()

    def __call__(self, context: int) -> int:
        if not context:
            return 0
        key = str(context)
        if key not in self.table:
            frames = []
            for frame in self._frames.frames(context):
                if self._runner_trim is not None and (frame.name, os.path.normcase(frame.filename)) == self._runner_trim:
                    break  # torchmem run's own frames, outside the script
                origin = "marker" if self._frames.is_marker(frame) else self._frames.origin(frame.filename)
                source = source_line(frame.filename, frame.line) if origin in ("user", "library") else ""
                frames.append([short_path(frame.filename), int(frame.line), frame.name, origin, source])
            self.table[key] = frames
        return context


def _runner_frame():
    """(function name, file) of ``torchmem run``'s frame that executes the script: stacks
    end there, as under ``python script.py``."""
    from torchmem.integrations.runner import target

    return target.runner_frame()


def trace_columns(engine, stacks: StackTable) -> dict:
    from torchmem.reports import snapshot

    entries = engine.trace()
    actions: list[str] = []
    action_index: dict[str, int] = {}
    columns: dict[str, list] = {"action": [], "addr": [], "size": [], "stream": [], "stack": [], "time_us": []}
    for entry in entries:
        name = entry["action"]
        index = action_index.get(name)
        if index is None:
            index = action_index[name] = len(actions)
            actions.append(name)
        columns["action"].append(index)
        columns["addr"].append(entry["addr"])
        columns["size"].append(entry["size"])
        columns["stream"].append(entry["stream"])
        columns["stack"].append(stacks(entry["context"]))
        columns["time_us"].append(entry["time_us"])
    return {
        "recorded": snapshot.trace_max_entries() > 0 or bool(entries),
        "max_entries": snapshot.trace_max_entries(),
        "actions": actions,
        **columns,
    }


def block_columns(engine, device: str, stacks: StackTable, storages: dict) -> dict:
    columns: dict[str, list] = {
        key: [] for key in ("address", "size", "requested", "tag", "stream", "stack", "sequence", "category", "module")
    }
    for block in engine.allocated_blocks():
        columns["address"].append(block["address"])
        columns["size"].append(block["size"])
        columns["requested"].append(block["requested_size"])
        columns["tag"].append(block["tag"])
        columns["stream"].append(block["stream"])
        columns["stack"].append(stacks(block["context"]))
        columns["sequence"].append(block["sequence"])
        category, module, _ = storages.get((device, block["address"]), (None, None, 0))
        columns["category"].append(category)
        columns["module"].append(module)
    return columns


def _segments(engine) -> list[dict]:
    out = []
    for segment in sorted(engine.segments(), key=lambda s: s["address"]):
        base = segment["address"]
        out.append(
            {
                "address": base,
                "size": segment["size"],
                "pool": segment["pool"],
                "stream": segment["stream"],
                "vmm": bool(segment.get("vmm", False)),
                # [offset, size, requested, state (0 allocated, 1 pending free, 2 free), tag]
                "blocks": [
                    [
                        block["address"] - base,
                        block["size"],
                        block["requested_size"] if block["state"] != "free" else 0,
                        _STATE_CODES.get(block["state"], 2),
                        block["tag"],
                    ]
                    for block in segment["blocks"]
                ],
            }
        )
    return out


def _samples(devices: list[str]) -> dict:
    from torchmem.reports import timeline

    samples = timeline.samples()
    out = {"time_us": [], "label": [], "devices": {}}
    for device in devices:
        out["devices"][device] = {"in_use": [], "reserved": [], "tags": {}, "categories": {}}
    for index, sample in enumerate(samples):
        out["time_us"].append(sample["time_us"])
        out["label"].append(sample["label"])
        for device in devices:
            figures = sample["devices"].get(device)
            series = out["devices"][device]
            series["in_use"].append(figures["in_use"] if figures else None)
            series["reserved"].append(figures["reserved"] if figures else None)
            for kind in ("tags", "categories"):
                values = figures.get(kind, {}) if figures else {}
                for name, value in values.items():
                    column = series[kind].get(name)
                    if column is None:
                        # A tag first seen now had nothing before.
                        column = series[kind][name] = [0] * index
                    column.append(value)
                for name, column in series[kind].items():
                    if len(column) < index + 1:
                        column.append(0)
    return out


def _oom(devices: dict, oom_message: str | None) -> dict | None:
    events = []
    ooms = 0
    for name, device in devices.items():
        ooms += device["summary"]["ooms"]
        trace = device["trace"]
        if "oom" not in trace["actions"]:
            continue
        code = trace["actions"].index("oom")
        for i, action in enumerate(trace["action"]):
            if action == code:
                events.append(
                    {
                        "device": name,
                        "time_us": trace["time_us"][i],
                        "requested": trace["size"][i],
                        "free_then": trace["addr"][i],
                        "stack": trace["stack"][i],
                    }
                )
    if not ooms and not events and oom_message is None:
        return None
    return {"count": ooms, "events": events, "message": oom_message}


def _rank() -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except (ImportError, RuntimeError, ValueError):
        pass
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None and rank.isdigit() and world.isdigit():
        return int(rank), int(world)
    return None, None


def leaks_section(report) -> dict | None:
    """The capture's ``leaks`` section for a ``LeakReport`` (``None``: no check ran)."""
    if report is None:
        return None
    data = report.to_dict()
    # Source lines beside the frames, for a report read where the files are not.
    for finding in data["findings"]:
        for frame in finding["frames"]:
            frame["source"] = source_line(frame["filename"], frame["line"]) if frame["line"] else ""
            frame["filename"] = short_path(frame["filename"])
    return {"report": data, "text": report.render()}


def collect(*, leaks=None, oom_message: str | None = None, label: str | None = None, devices=None) -> dict:
    """The capture of this process now, as the plain dict a ``.tmem`` file holds."""
    from torchmem.reports import capture as capture_format
    from torchmem.reports import categories, summary, timeline

    stacks = StackTable()
    summary_data = summary.summary_dict(devices)
    storages = categories.classify_storages()
    from torchmem.reports import devices as report_devices

    chosen = report_devices.select(devices, what="torchmem.write_capture", skip_unused_cuda=devices is None)
    per_device = {}
    for device in chosen:
        engine = device.engine
        device_summary = summary_data["devices"].get(device.name) or summary._device_summary(device)
        per_device[device.name] = {
            "summary": device_summary,
            "trace": trace_columns(engine, stacks),
            "blocks": block_columns(engine, device.name, stacks, storages),
            "segments": _segments(engine),
        }
    rank, world_size = _rank()
    # A last sample, so the timeline's samples reach the moment of the capture.
    timeline.sample_if_recording("capture")
    data = {
        "format": capture_format.FORMAT,
        "version": capture_format.version_string(),
        "meta": {
            "created_us": time.time_ns() // 1000,
            "torchmem_version": torchmem.__version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "cwd": os.getcwd(),
            "label": label,
            "rank": rank,
            "world_size": world_size,
        },
        "devices": per_device,
        "samples": _samples(list(per_device)),
        "modules": timeline.module_breakdowns(),
        "tracking": {"active": categories.is_tracking(), "notes": categories.tracking_notes()},
        "leaks": leaks_section(leaks),
        "stacks": stacks.table,
    }
    data["oom"] = _oom(per_device, oom_message)
    return data
