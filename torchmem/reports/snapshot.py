"""Memory snapshots in PyTorch's format, so PyTorch's own viewers draw torchmem's cache.

``torchmem.snapshot()`` returns the dictionary ``torch.cuda.memory._snapshot()``
returns for the native allocator (which a pluggable allocator such as torchmem
turns off), and ``torchmem.dump_snapshot(path)`` pickles it as
``torch.cuda.memory._dump_snapshot`` does. Both are accepted by
``torch.cuda._memory_viz`` (``segment_plot``, ``trace_plot``, ``segsum``, ``trace``,
``memory``, ``segments``, ``compare`` and ``python -m torch.cuda._memory_viz``) and by
https://pytorch.org/memory_viz (drag the pickle in; nothing is uploaded).

    import torchmem
    torchmem.install("cpu")
    torchmem.record_trace()         # optional: history for the timeline views
    ...                                # run the code to look at
    torchmem.dump_snapshot("mem.pickle")
    # python -m torch.cuda._memory_viz trace_plot mem.pickle -o mem.html

Schema (see ``torch/cuda/memory.py``'s ``_snapshot`` docstring)::

    {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
                   "requested_size", "stream", "segment_type": "small"|"large",
                   "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                   "blocks": [{"address", "size", "requested_size",
                               "state": "active_allocated"|"active_pending_free"|"inactive",
                               "frames": [{"filename", "line", "name"}, ...]}]}],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames",
                         "compile_context", "user_metadata", "pool_id"}, ...], ...],
     "allocator_settings": {...},
     "external_annotations": [],
     "torchmem": {"version", "device_names", "trace_max_entries"}}

Devices. PyTorch's snapshots and viewers know devices only by index, position in
``device_traces`` and ``segment["device"]``. torchmem keeps CUDA devices at their CUDA
index and puts the CPU after the last CUDA device (index ``torch.cuda.device_count()``
or one past the highest CUDA engine), which is the convention PyTorch's own
``_memory_viz._profile_to_snapshot`` uses for CPU memory. A snapshot of the CPU alone
(the usual case without a GPU, or ``snapshot("cpu")``) therefore has the CPU at index
0. ``snapshot["torchmem"]["device_names"][i]`` names device index ``i``.

History. Snapshots always carry the cache's state (segments and blocks). The
``device_traces`` (what the timeline views draw) are recorded only after
:func:`record_trace`, into a ring of ``max_entries`` events per device as in
``torch.cuda.memory._record_memory_history``. Frames appear on blocks and events whose
allocation ran while stack capture was on: :func:`record_trace` turns it on (through
``torchmem.record_history``); ``torchmem.record_history()`` alone gives frames on live
blocks without a trace.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

import torchmem
from torchmem._support.locks import ForkSafeLock
from torchmem._support.validate import require_int
from torchmem.reports import devices as _report_devices
from torchmem.reports.devices import DevicesArg

__all__ = ["snapshot", "dump_snapshot", "record_trace", "trace_max_entries", "DEFAULT_MAX_ENTRIES"]

# Events kept per device by record_trace(): about what torch's docs suggest for
# _record_memory_history (100k), a few MB of pickle without frames.
DEFAULT_MAX_ENTRIES = 100_000

# Pickle protocol 4: the unpickler inside pytorch.org/memory_viz (MemoryViz.js) accepts
# protocols 2..4 only, and Python 3.14 made 5 the default.
PICKLE_PROTOCOL = 4

_BLOCK_STATES = {
    "allocated": "active_allocated",
    "pending_free": "active_pending_free",
    "free": "inactive",
}
_SEGMENT_TYPES = {"small_pool": "small", "large_pool": "large"}
# torchmem has no private pools (torch.cuda.MemPool): every segment is in the default pool,
# which PyTorch reports as id (0, 0).
_DEFAULT_POOL_ID = (0, 0)

_trace_lock = ForkSafeLock()
_trace_max_entries = 0  # 0: not recording
_trace_turned_on_stacks = False


# --- recording history -------------------------------------------------------------


def record_trace(
    max_entries: int | None = DEFAULT_MAX_ENTRIES, *, stacks: bool = True, sample_interval: float | None = None
) -> None:
    """Records allocator history into snapshots' ``device_traces``; ``0``/``None`` stops.

    torchmem's counterpart of ``torch.cuda.memory._record_memory_history(max_entries=...)``:
    each device served by torchmem keeps its last ``max_entries`` events (``alloc``,
    ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``)
    in a ring, which :func:`snapshot` exports for the timeline views
    (``torch.cuda._memory_viz.trace_plot``, "Active Memory Timeline" on
    pytorch.org/memory_viz). Calling it again starts a new, empty history.

    ``stacks=True`` also turns on Python stack capture (``torchmem.record_history()``), so
    events and blocks carry the stack that allocated them; stopping turns it off again only
    if this function turned it on. Every device torchmem serves when it is called records,
    including CUDA devices not used yet; installing CUDA afterwards needs another call.

    While recording, a timeline also samples the memory in use per tag and per category
    (``torchmem.track``) every ``sample_interval`` seconds (default 0.05; 0 samples only at
    tracked forwards and optimizer steps), for ``torchmem.write_capture`` and the HTML
    report (:mod:`torchmem.reports.timeline`).
    """
    global _trace_max_entries, _trace_turned_on_stacks
    if max_entries is None:
        max_entries = 0
    from torchmem.reports import timeline

    if sample_interval is None:
        sample_interval = timeline.DEFAULT_INTERVAL
    require_int(max_entries, what="torchmem.record_trace: max_entries", minimum=0, meaning="0 stops")
    from torchmem.stacks import capture as stack_capture

    with _trace_lock:
        _report_devices.ensure_cuda_engines()
        for device in _report_devices.select(None, what="torchmem.record_trace"):
            device.engine.set_trace_capacity(max_entries)
        want_stacks = bool(max_entries) and stacks
        if want_stacks and not stack_capture.is_recording_history():
            stack_capture.record_history(True)
            _trace_turned_on_stacks = True
        elif not want_stacks and _trace_turned_on_stacks:
            # Only what this function turned on: a user's own record_history() stays on.
            stack_capture.record_history(False)
            _trace_turned_on_stacks = False
        _trace_max_entries = max_entries
    # Outside the lock: a sample reads the engines, and the sampler thread is joined.
    if max_entries:
        timeline.start(sample_interval)
    else:
        timeline.stop()


def trace_max_entries() -> int:
    """The ``max_entries`` of the current :func:`record_trace` (0 when not recording)."""
    return _trace_max_entries


# --- building the snapshot ------------------------------------------------------------


class _FrameCache:
    """Symbolizes each context id once per snapshot.

    Blocks and events allocated at the same line share one context id; giving them
    the same list object also lets pickle store it once (memo), which keeps snapshots
    with deep stacks small.
    """

    def __init__(self) -> None:
        from torchmem.stacks import frames as stack_frames

        self._frames_of = stack_frames.frames
        self._cache: dict[int, list[dict[str, Any]]] = {0: []}

    def __call__(self, context: int) -> list[dict[str, Any]]:
        frames = self._cache.get(context)
        if frames is None:
            frames = [
                {"filename": frame.filename, "line": int(frame.line), "name": frame.name}
                for frame in self._frames_of(context)
            ]
            self._cache[context] = frames
        return frames


def _device_indices(devices: list[_report_devices.ReportDevice]) -> dict[str, int]:
    """Snapshot device index of each device: CUDA keeps its index, the CPU goes after all of them."""
    indices = {d.name: d.device.index for d in devices if d.device.type == "cuda"}
    if any(d.device.type == "cpu" for d in devices):
        if indices:
            # Stable across snapshots of one process whatever subset is asked for.
            known = [index for index, _ in _report_devices.cuda_engines()]
            indices["cpu"] = max([torch.cuda.device_count()] + [index + 1 for index in known])
        else:
            indices["cpu"] = 0
    return indices


def _segment(raw: dict, device_index: int, frames: _FrameCache) -> dict:
    blocks = []
    allocated_size = active_size = requested_size = 0
    raw_blocks = raw["blocks"]
    expandable = raw.get("vmm", False)
    if expandable and raw_blocks and raw_blocks[-1]["state"] == "free":
        # As PyTorch shows an expandable segment: up to its last used block; the free tail
        # of the reserved address range is not memory.
        raw_blocks = raw_blocks[:-1]
    for block in raw_blocks:
        state = _BLOCK_STATES[block["state"]]
        active = state != "inactive"
        if state == "active_allocated":
            allocated_size += block["size"]
        if active:
            active_size += block["size"]
            requested_size += block["requested_size"]
        blocks.append(
            {
                "address": block["address"],
                "size": block["size"],
                # A free block requested nothing; the engine may keep the last request.
                "requested_size": block["requested_size"] if active else 0,
                "state": state,
                "frames": frames(block["context"]) if active else [],
            }
        )
    return {
        "device": device_index,
        "address": raw["address"],
        "total_size": sum(b["size"] for b in blocks) if expandable else raw["size"],
        "allocated_size": allocated_size,
        "active_size": active_size,
        "requested_size": requested_size,
        "stream": raw["stream"],
        "segment_type": _SEGMENT_TYPES[raw["pool"]],
        "segment_pool_id": _DEFAULT_POOL_ID,
        "is_expandable": expandable,
        # The segment's allocation context: torchmem does not capture one for segments.
        "frames": [],
        "blocks": blocks,
    }


def _trace(raw_entries: list[dict], frames: _FrameCache) -> list[dict]:
    entries = []
    # address -> requested size of the allocation that currently owns it. The engine
    # records frees with the rounded size; PyTorch records the requested size on alloc
    # and free alike, and its readers pair them up (trace() subtracts the free's size
    # from the alloc's), so frees take the size of their alloc when it is in the ring.
    requested: dict[int, int] = {}
    for raw in raw_entries:
        action = raw["action"]
        size = raw["size"]
        if action == "alloc":
            requested[raw["addr"]] = size
        elif action == "free_requested":
            size = requested.get(raw["addr"], size)
        elif action == "free_completed":
            size = requested.pop(raw["addr"], size)
        entry: dict[str, Any] = {"action": action}
        if action == "oom":
            # PyTorch puts the device's free bytes in 'device_free' (and no 'addr'); the
            # engine records the bytes free in its cache when the allocation failed.
            entry["device_free"] = raw["addr"]
        else:
            entry["addr"] = raw["addr"]
        entry.update(
            {
                "size": size,
                "stream": raw["stream"],
                "time_us": raw["time_us"],
                "frames": frames(raw["context"]),
                # What PyTorch writes when torch.compile and _set_memory_metadata are unused.
                "compile_context": "N/A",
                "user_metadata": "",
                "pool_id": _DEFAULT_POOL_ID,
            }
        )
        entries.append(entry)
    return entries


def _allocator_settings(devices: list[_report_devices.ReportDevice]) -> dict:
    max_split_size = -1
    if devices:
        max_split_size = int(devices[0].engine.memory_stats().get("max_split_size", -1))
    return {
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "max_split_size": max_split_size,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "roundup_power2_divisions": {},
        "graph_capture_record_stream_reuse": False,
    }


def snapshot(devices: DevicesArg = None) -> dict:
    """The state of torchmem's cache (and its recorded history) in PyTorch's snapshot schema.

    ``devices``: ``None`` for every device torchmem serves, or a device / list of devices
    (``"cpu"``, ``"cuda:0"``, ...). See the module docstring for the schema and for how
    devices map to snapshot indices (CUDA keeps its index; the CPU comes after the last
    CUDA device, or is 0 on its own). The result holds only plain Python values
    (dict, list, tuple, str, int, float, bool, None), so it pickles for any viewer.
    """
    chosen = _report_devices.select(devices, what="torchmem.snapshot")
    indices = _device_indices(chosen)
    frames = _FrameCache()
    slots = max(indices.values(), default=-1) + 1
    device_traces: list[list[dict]] = [[] for _ in range(slots)]
    device_names: list[str | None] = [None] * slots
    segments = []
    for device in chosen:
        index = indices[device.name]
        device_names[index] = device.name
        raw_segments = device.engine.segments()
        device_traces[index] = _trace(device.engine.trace(), frames)
        segments.extend(
            _segment(raw, index, frames) for raw in sorted(raw_segments, key=lambda s: s["address"])
        )
    return {
        "segments": segments,
        "device_traces": device_traces,
        "allocator_settings": _allocator_settings(chosen),
        "external_annotations": [],
        "torchmem": {
            "version": torchmem.__version__,
            "device_names": device_names,
            "trace_max_entries": _trace_max_entries,
        },
    }


def dump_snapshot(path: str | os.PathLike = "dump_snapshot.pickle", devices: DevicesArg = None) -> None:
    """Pickles :func:`snapshot` to ``path``, like ``torch.cuda.memory._dump_snapshot``.

    Open the file at https://pytorch.org/memory_viz or render it with
    ``python -m torch.cuda._memory_viz trace_plot|segment_plot|stats|trace PATH``.
    Raises ``FileNotFoundError``/``IsADirectoryError``/``PermissionError`` naming the path
    when it cannot be written.
    """
    path = _checked_path(path)
    # Snapshot first: a failure here must not leave an empty file behind.
    write_pickle(snapshot(devices), path)


def _checked_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"torchmem.dump_snapshot: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"torchmem.dump_snapshot: {path!r} is a directory; give a file name")
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"torchmem.dump_snapshot: cannot write {path!r}: the directory {directory!r} does not exist"
        )
    return path


def write_pickle(data: dict, path: str | os.PathLike) -> None:
    """Writes a snapshot dict the way viewers read it (pickle protocol 4)."""
    path = _checked_path(path)
    try:
        file = open(path, "wb")
    except OSError as error:
        raise type(error)(
            error.errno, f"torchmem.dump_snapshot: cannot write {path!r} ({error.strerror})"
        ) from None
    try:
        with file:
            pickle.dump(data, file, protocol=PICKLE_PROTOCOL)
    except BaseException:
        # A partial pickle would only confuse a viewer later.
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
