"""Locks that a forked child gets fresh.

A process that forks while another of its threads holds a lock gives the child that
lock held, and no thread in the child will ever release it: a DataLoader worker forked
while the main process's pin-memory thread was inside a torchmem call would hang on
its first torchmem call. ``ForkSafeLock`` is replaced by a new, unlocked lock in the
child (``os.register_at_fork``). The engine's C++ locks are handled the same way by
``csrc/torchmem/core/fork_safety.h``.

The child's state guarded by the lock is whatever it was at the fork: torchmem's
Python state changes under these locks in single assignments, never half-way.
"""

from __future__ import annotations

import os
import threading
import weakref

_all_locks: "weakref.WeakSet[ForkSafeLock]" = weakref.WeakSet()


class ForkSafeLock:
    """A ``threading.Lock`` that is unlocked again in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _all_locks.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info) -> None:
        self._lock.release()

    def _reset_in_child(self) -> None:
        self._lock = threading.Lock()


def _reset_all_in_child() -> None:
    for lock in list(_all_locks):
        lock._reset_in_child()


os.register_at_fork(after_in_child=_reset_all_in_child)
