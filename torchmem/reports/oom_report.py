"""A report written at the first out-of-memory error, as Composer's ``OOMObserver`` does.

    torchmem.oom_report("oom/")          # or TORCHMEM_OOM_REPORT=oom/, or torchmem run --oom-report oom/
    train()                              # the first out-of-memory error writes, in oom/:
                                         #   torchmem-oom-<script>.<pid>.tmem  (the capture)
                                         #   torchmem-oom-<script>.<pid>.html  (the HTML report)

What the program sees does not change: the same ``torch.OutOfMemoryError`` with the same
message reaches it, whether the report is written or writing it fails (a failure is one
line on stderr). One report per process: the first error is the one that explains, the
later ones follow from it.

When it is written:

* CUDA (torchmem serving it): at the moment of the error, before it is raised, through
  PyTorch's out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``, the
  hook Composer's ``OOMObserver`` uses), which torchmem's CUDA allocator calls without
  holding its own lock. The blocks alive then are the ones the report shows, even if
  the program catches the error and carries on.
* CPU: c10's CPU allocator has no such observer, so the report is written when an
  out-of-memory error ends the program (uncaught: ``sys.excepthook``, which ``torchmem
  run`` also goes through). The traceback still holds the frames of the failed call, so
  their tensors are still alive and in the report. An error the program catches on the
  CPU writes nothing; say so rather than pretend.

Enabling starts the trace (``torchmem.record_trace()``, with allocation stacks) unless
one is already recording, so that the page has a timeline and the sites by peak bytes;
``trace=False`` keeps only the state at the error (what is alive, the cache's segments).
"""

from __future__ import annotations

import os
import sys
import threading

import torch

from torchmem._support.units import format_bytes

__all__ = ["oom_report", "ENVIRONMENT_VARIABLE"]

ENVIRONMENT_VARIABLE = "TORCHMEM_OOM_REPORT"


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.directory: str | None = None
        self.trace = True
        self.started_trace = False
        self.traced_devices: tuple = ()  # what was installed when this module started the trace
        self.written: list[str] | None = None  # [capture, html] once written
        self.attempted = False  # one report per process, written or not
        self.cuda_observer_attached = False
        self.previous_excepthook = None


_state = _State()


def oom_report(directory: str | os.PathLike | None, *, trace: bool = True) -> str | None:
    """At the first out-of-memory error, writes the capture and the HTML report into
    ``directory`` (created if missing); ``None`` turns it off. Returns the directory.

    ``trace``: also record the trace (the timeline, sites by peak bytes, allocation stacks)
    from now on, unless a trace is already recording.
    """
    if directory is None:
        _disable()
        return None
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"torchmem.oom_report: directory must be a str or os.PathLike, got {type(directory).__name__}")
    path = os.path.abspath(os.fspath(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"torchmem.oom_report: {os.fspath(directory)!r} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise type(error)(
            error.errno, f"torchmem.oom_report: cannot create {os.fspath(directory)!r} ({error.strerror})"
        ) from None
    if not os.access(path, os.W_OK):
        raise PermissionError(f"torchmem.oom_report: {os.fspath(directory)!r} is not writable")
    with _state.lock:
        _state.directory = path
        _state.trace = trace
        _state.written = None
        _state.attempted = False
    _arm()
    return path


def enable_from_environment() -> str | None:
    """``oom_report($TORCHMEM_OOM_REPORT)`` when the variable is set and nothing enabled it yet."""
    value = os.environ.get(ENVIRONMENT_VARIABLE)
    if not value or _state.directory is not None:
        return _state.directory
    try:
        return oom_report(value)
    except OSError as error:
        # A setting in the environment must not stop the program it was meant to watch.
        print(f"torchmem: {ENVIRONMENT_VARIABLE}={value}: no out-of-memory report ({error})", file=sys.stderr)
        return None


def after_install() -> None:
    """Called by ``torchmem.install()``: the environment variable, and the observer on a
    CUDA allocator installed after ``oom_report()`` was called."""
    enable_from_environment()
    if _state.directory is not None:
        _arm()


def written() -> list[str] | None:
    """``[capture path, HTML path]`` once a report was written, else ``None``."""
    return None if _state.written is None else list(_state.written)


def _disable() -> None:
    from torchmem.reports import snapshot

    with _state.lock:
        _state.directory = None
        started, _state.started_trace = _state.started_trace, False
    if started:
        snapshot.record_trace(0)
    # The CUDA observer cannot be detached from PyTorch: it stays, and does nothing.
    if _state.previous_excepthook is not None and sys.excepthook is _excepthook:
        sys.excepthook = _state.previous_excepthook
        _state.previous_excepthook = None


def _arm() -> None:
    from torchmem.reports import snapshot
    from torchmem.runtime import install

    served = tuple(install.installed_devices())
    recording = snapshot.trace_max_entries() > 0
    if _state.trace and served and (not recording or (_state.started_trace and served != _state.traced_devices)):
        # Again after a new device is installed: record_trace covers the devices served
        # when it is called (and starts a new, empty history, so only then).
        snapshot.record_trace()
        _state.started_trace = True
        _state.traced_devices = served
    if sys.excepthook is not _excepthook:
        _state.previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
    if not _state.cuda_observer_attached and install.is_installed("cuda"):
        # Attached once: PyTorch keeps observers for the life of the process.
        torch._C._cuda_attach_out_of_memory_observer(_cuda_observer)  # noqa: SLF001
        _state.cuda_observer_attached = True


def _cuda_observer(device: int, requested: int, capacity: int, free: int) -> None:
    # Called by the allocator just before it raises torch.OutOfMemoryError. Anything
    # raised here would replace that error, so nothing is.
    try:
        message = (
            f"CUDA out of memory on cuda:{device}: tried to allocate {format_bytes(requested)}; "
            f"{format_bytes(free)} of the device's {format_bytes(capacity)} free"
        )
        _write(message)
    except BaseException as error:  # noqa: BLE001 - see above
        _say(f"could not write the out-of-memory report: {error}")


def _excepthook(exc_type, exc, tb) -> None:
    try:
        if _is_out_of_memory(exc):
            _write(f"{exc_type.__name__}: {exc}")
    except BaseException as error:  # noqa: BLE001 - the program's traceback must still print
        _say(f"could not write the out-of-memory report: {error}")
    hook = _state.previous_excepthook or sys.__excepthook__
    hook(exc_type, exc, tb)


def _is_out_of_memory(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _write(message: str) -> None:
    with _state.lock:
        if _state.directory is None or _state.attempted:
            return
        _state.attempted = True
        directory = _state.directory
    # `attempted` is set first: an out-of-memory error inside the report's own work, or a
    # second one while it is written, is not reported again.
    from torchmem.reports import capture as _capture
    from torchmem.reports import collect, html

    base = os.path.join(directory, _capture.default_capture_path().replace("torchmem-", "torchmem-oom-", 1))
    report = _capture.Capture(collect.collect(oom_message=message))
    capture_path = report.write(base)
    html_path = html.write_html(base[: -len(_capture.SUFFIX)] + ".html", report)
    with _state.lock:
        _state.written = [capture_path, html_path]
    _say(f"out of memory: report written to {html_path} (capture {capture_path})")


def _say(line: str) -> None:
    try:
        print(f"torchmem: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed by the program: nothing to tell
        pass
