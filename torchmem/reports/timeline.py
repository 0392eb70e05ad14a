"""Memory over time per tag and per category: samples taken while a timeline records.

The engines' trace (``torchmem.record_trace()``) says exactly when every block was
allocated and freed, but not under which tag, and nothing in the engine knows what a
tensor *is* (a parameter, an activation). So beside the trace, a recording keeps
**samples**: at each one, per device, the bytes in use (requested), reserved, per tag
and per category (:mod:`torchmem.reports.categories`). Samples are taken

* every ``interval`` seconds by a background thread (default 50 ms: a sample costs a
  few tens of microseconds per device, plus the category walk when something is tracked);
* at the moments tracked models and optimizers mark (end of a forward, before and after
  an optimizer step), which is where a training step's peaks are;
* when the user asks: ``torchmem.reports.timeline.sample("epoch 3")``.

A recording keeps at most ``max_samples`` samples: when full, every other one is dropped
and the interval doubles, so a long run keeps an even picture of its whole length.
"""

from __future__ import annotations

import atexit
import threading
import time

from torchmem._support.locks import ForkSafeLock
from torchmem._support.validate import require_seconds

__all__ = ["start", "stop", "is_recording", "sample", "sample_if_recording", "samples", "DEFAULT_INTERVAL"]

DEFAULT_INTERVAL = 0.05
DEFAULT_MAX_SAMPLES = 20_000

_lock = ForkSafeLock()
_recording: "_Recording | None" = None
_stop_at_exit_registered = False


class _Recording:
    def __init__(self, interval: float, max_samples: int):
        self.interval = interval
        self.max_samples = max_samples
        self.samples: list[dict] = []
        # Per device, the per-module breakdown at the sample with the most memory in use, and
        # at the latest sample (a breakdown per sample would cost more than the samples).
        self.modules_at_peak: dict[str, dict] = {}
        self.modules_last: dict[str, dict] = {}
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, entry: dict) -> None:
        self.samples.append(entry)
        if len(self.samples) > self.max_samples:
            # Every other periodic sample goes; the labelled ones (forward ends, steps, the
            # user's) stay unless they alone fill the recording.
            kept = [s for i, s in enumerate(self.samples) if s["label"] or i % 2 == 0]
            self.samples = kept if len(kept) <= self.max_samples else self.samples[::2]
            self.interval *= 2

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                take_sample("")
            except Exception:  # noqa: BLE001 - a sampler must never break the program it watches
                pass


def start(interval: float = DEFAULT_INTERVAL, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
    """Starts recording samples (again, empty, if already recording). ``interval`` 0: no
    background thread, only the samples tracking and the user take."""
    global _recording
    require_seconds(interval, what="torchmem timeline: interval", allow_zero=True)
    stop()
    recording = _Recording(float(interval), max_samples)
    with _lock:
        _recording = recording
    if interval:
        global _stop_at_exit_registered
        if not _stop_at_exit_registered:
            # Before the interpreter finalizes: a sampler still inside an engine call (the
            # bindings release the GIL there) must not outlive what it reads.
            atexit.register(stop)
            _stop_at_exit_registered = True
        recording.thread = threading.Thread(target=recording.run, name="torchmem-timeline", daemon=True)
        recording.thread.start()
    take_sample("start")


def stop() -> None:
    """Stops the background sampler; the samples stay readable until the next start."""
    recording = _recording
    if recording is None:
        return
    recording.stopped.set()
    thread = recording.thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=5)
    recording.thread = None


def is_recording() -> bool:
    recording = _recording
    return recording is not None and not recording.stopped.is_set()


def sample(label: str = "") -> None:
    """Takes one sample now, labelled (``"epoch 3"``); shown on the report's timeline."""
    if not isinstance(label, str):
        raise TypeError(f"torchmem timeline: label must be a str, got {type(label).__name__}")
    if not is_recording():
        raise RuntimeError(
            "torchmem timeline: not recording; call torchmem.record_trace() first (torchmem run records)"
        )
    take_sample(label)


def sample_if_recording(label: str) -> None:
    if is_recording():
        try:
            take_sample(label)
        except Exception:  # noqa: BLE001 - called from the user's hooks: never break them
            pass


def samples() -> list[dict]:
    """The samples of the current (or last) recording, oldest first."""
    recording = _recording
    return list(recording.samples) if recording is not None else []


def take_sample(label: str) -> None:
    """One sample of every device torchmem serves (see the module docstring)."""
    from torchmem.reports import categories
    from torchmem.reports import devices as report_devices

    recording = _recording
    if recording is None:
        return
    devices = {}
    in_use = {}
    for device in report_devices.select(None, what="torchmem timeline"):
        stats = device.engine.memory_stats()
        tags = {}
        for row in device.engine.tag_stats():
            if row["requested_bytes"]:
                tags[row["tag"]] = int(row["requested_bytes"])
        in_use[device.name] = int(stats["requested_bytes.all.current"])
        devices[device.name] = {
            "in_use": in_use[device.name],
            "reserved": int(stats["reserved_bytes.all.current"]),
            "tags": tags,
        }
    now = time.time_ns() // 1000
    usage = categories.category_usage(in_use)
    for device, figures in usage.items():
        devices[device]["categories"] = figures["categories"]
    with _lock:
        if _recording is not recording:
            return
        recording.add({"time_us": now, "label": label, "devices": devices})
        for device, figures in usage.items():
            breakdown = {"time_us": now, "in_use": in_use[device], "modules": figures["modules"]}
            recording.modules_last[device] = breakdown
            peak = recording.modules_at_peak.get(device)
            if peak is None or in_use[device] >= peak["in_use"]:
                recording.modules_at_peak[device] = breakdown


def module_breakdowns() -> dict[str, dict]:
    """``{device: {"at_peak": breakdown, "last": breakdown}}``, each ``{"time_us", "in_use",
    "modules": {module: {category: bytes}}}``, for devices with tracked modules."""
    recording = _recording
    if recording is None:
        return {}
    with _lock:
        return {
            device: {"at_peak": recording.modules_at_peak.get(device), "last": last}
            for device, last in recording.modules_last.items()
        }
