"""torchmem: PyTorch's allocator, with accounting you can ask questions.

    import torchmem
    torchmem.install()                  # CUDA tensors now come from torchmem (before CUDA init)
    torchmem.install("cpu")             # CPU tensors too
    # or: torch.cuda.memory.change_current_allocator(torchmem.cuda_allocator())

    with torchmem.tag("metrics"):       # per-tag accounting
        metric.update(preds, target)

    with torchmem.leak_check():         # blocks allocated inside and still alive at exit
        evaluate(model, loader)         # -> torchmem.LeakError naming the holder

    torchmem.memory_stats()             # torch.cuda.memory_stats() keys
    torchmem.tag_stats(); torchmem.fragmentation(); torchmem.summary(); torchmem.snapshot()

    torchmem.track(model, optimizer)    # memory by category: parameters, gradients, ...
    torchmem.record_trace()             # the timeline, then:
    torchmem.write_html("memory.html")  # a report to open in a browser (or write_capture)
    torchmem.oom_report("oom/")         # capture + HTML report at the first out-of-memory error

Public names are loaded on first use, so ``import torchmem`` stays cheap. The public API
is the names listed here; the subpackages are its implementation:

    runtime/       installing into PyTorch, the engine per device, tags, statistics
    stacks/        capturing allocation stacks, and whose code each frame is
    leaks/         leak checks, their reports, the owner search, growth across steps
    reports/       summary(), snapshots in PyTorch's format, captures, the HTML report, categories
    host/          resident set size per process (DataLoader workers included)
    integrations/  the pytest plugin, ``python -m torchmem`` (run, demo), DataLoader workers
    distributed/   many ranks, one answer: job reports, collective leak checks (torch.distributed)
    _support/      small helpers shared by all of the above
"""

from __future__ import annotations

import importlib

# No `import torch` here: `import torchmem` (and the pytest plugin, loaded in every pytest
# session where torchmem is installed) must not pay for torch until a name is used. The
# extension loader imports torch (libc10 and friends) before torchmem._C.

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # installing
    "install": "torchmem.runtime.install",
    "uninstall": "torchmem.runtime.install",
    "is_installed": "torchmem.runtime.install",
    "cuda_allocator": "torchmem.runtime.cuda",
    # attribution
    "tag": "torchmem.runtime.tags",
    "current_tag": "torchmem.runtime.tags",
    # statistics
    "memory_stats": "torchmem.runtime.stats",
    "memory_allocated": "torchmem.runtime.stats",
    "max_memory_allocated": "torchmem.runtime.stats",
    "memory_reserved": "torchmem.runtime.stats",
    "max_memory_reserved": "torchmem.runtime.stats",
    "reset_peak_memory_stats": "torchmem.runtime.stats",
    "reset_accumulated_memory_stats": "torchmem.runtime.stats",
    "tag_stats": "torchmem.runtime.stats",
    "fragmentation": "torchmem.runtime.stats",
    "empty_cache": "torchmem.runtime.stats",
    "set_memory_limit": "torchmem.runtime.stats",
    # leaks and growth
    "leak_check": "torchmem.leaks.check",
    "expect_alive": "torchmem.leaks.check",
    "LeakError": "torchmem.leaks.check",
    "LeakReport": "torchmem.leaks.check",
    "Finding": "torchmem.leaks.check",
    "UnseenMemoryWarning": "torchmem.leaks.check",
    "GrowthMonitor": "torchmem.leaks.growth",
    "GrowthReport": "torchmem.leaks.growth",
    # host RAM per process (RSS: private, shared, file-backed)
    "rss_report": "torchmem.host.rss",
    "rss_delta": "torchmem.host.rss",
    "RssReport": "torchmem.host.rss",
    "RssDelta": "torchmem.host.rss",
    "RssMonitor": "torchmem.host.rss",
    # DataLoader workers
    "worker_init_fn": "torchmem.integrations.workers",
    # stacks and history
    "record_history": "torchmem.stacks.capture",
    # reports
    "summary": "torchmem.reports.summary",
    "snapshot": "torchmem.reports.snapshot",
    "dump_snapshot": "torchmem.reports.snapshot",
    "record_trace": "torchmem.reports.snapshot",
    # captures and the HTML report
    "write_capture": "torchmem.reports.capture",
    "load_capture": "torchmem.reports.capture",
    "combine_captures": "torchmem.reports.capture",
    "Capture": "torchmem.reports.capture",
    "CaptureFormatError": "torchmem.reports.capture",
    "write_html": "torchmem.reports.html",
    "oom_report": "torchmem.reports.oom_report",
    # memory by category (parameters, gradients, optimizer state, activations)
    "track": "torchmem.reports.categories",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


# Subpackages reachable as attributes (``torchmem.distributed.gather()``), loaded on first use.
_SUBPACKAGES = ("distributed",)


def __getattr__(name: str):
    if name == "_C":
        # `from torchmem import _C` (every module that needs the extension) lands here
        # once: the load checks that the extension was built for the torch running.
        from torchmem._support import extension

        return extension.load()
    if name in _SUBPACKAGES:
        return importlib.import_module(f"torchmem.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmem' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
