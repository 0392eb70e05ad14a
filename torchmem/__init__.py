"""torchmem: PyTorch's allocator, with accounting you can ask questions.

    import torchmem
    torchmem.install()                  # CUDA tensors now come from torchmem (before CUDA init)
    torchmem.install("cpu")             # CPU tensors too

    with torchmem.tag("metrics"):       # per-tag accounting
        metric.update(preds, target)

    with torchmem.leak_check():         # blocks allocated inside and still alive at exit
        evaluate(model, loader)         # -> torchmem.LeakError naming the holder

    torchmem.memory_stats()             # torch.cuda.memory_stats() keys
    torchmem.tag_stats(); torchmem.fragmentation(); torchmem.summary(); torchmem.snapshot()

Public names are loaded on first use, so ``import torchmem`` stays cheap.
"""

from __future__ import annotations

import importlib

import torch  # noqa: F401  (loads libc10 and friends before torchmem._C)

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # installing
    "install": "torchmem._install",
    "uninstall": "torchmem._install",
    "is_installed": "torchmem._install",
    # attribution
    "tag": "torchmem._tags",
    "current_tag": "torchmem._tags",
    # statistics
    "memory_stats": "torchmem._stats",
    "memory_allocated": "torchmem._stats",
    "max_memory_allocated": "torchmem._stats",
    "memory_reserved": "torchmem._stats",
    "max_memory_reserved": "torchmem._stats",
    "reset_peak_memory_stats": "torchmem._stats",
    "reset_accumulated_memory_stats": "torchmem._stats",
    "tag_stats": "torchmem._stats",
    "fragmentation": "torchmem._stats",
    "empty_cache": "torchmem._stats",
    "set_memory_limit": "torchmem._stats",
    # leaks and growth
    "leak_check": "torchmem._leak",
    "expect_alive": "torchmem._leak",
    "LeakError": "torchmem._leak",
    "LeakReport": "torchmem._leak",
    "Finding": "torchmem._leak",
    "GrowthMonitor": "torchmem._growth",
    "GrowthReport": "torchmem._growth",
    # host RAM per process (RSS: private, shared, file-backed)
    "rss_report": "torchmem._rss",
    "rss_delta": "torchmem._rss",
    "RssReport": "torchmem._rss",
    "RssDelta": "torchmem._rss",
    "RssMonitor": "torchmem._rss",
    # DataLoader workers
    "worker_init_fn": "torchmem._workers",
    # stacks and history
    "record_history": "torchmem._stack",
    # reports
    "summary": "torchmem._summary",
    "snapshot": "torchmem._snapshot",
    "dump_snapshot": "torchmem._snapshot",
    "record_trace": "torchmem._snapshot",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmem' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
