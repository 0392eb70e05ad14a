"""The local variables of live frames, read without keeping them alive afterwards.

The owner search names a local variable of a running function as a holder
(``train():batch``). Reading a running function's locals on Python 3.10-3.12 goes
through ``frame.f_locals``, which builds a *snapshot* dict and stores it on the frame:
it keeps a reference to every local until the frame ends or someone reads ``f_locals``
again. After a leak check's owner search, a function that then ``del``-eted a local would
still have its tensor alive in that snapshot, and an enclosing check would report it:
the search itself caused a leak. (3.13 made ``f_locals`` a write-through proxy, PEP 667:
nothing is stored.)

So on 3.10-3.12 ``local_items`` empties the snapshot of each function frame after reading
it, when that is safe:

* the dict is the frame's private snapshot: nobody else holds it (``locals()`` returns
  the same dict; code that kept it, ``ns = locals()``, keeps it as it is);
* no trace function is active (a debugger's trampoline writes the snapshot back into the
  frame after its callback, ``PyFrame_LocalsToFast``: emptying it then would unbind the
  frame's locals). Under a debugger the snapshots are left in place.

Module-level and class-body frames are not touched: their ``f_locals`` is the real
namespace.
"""

from __future__ import annotations

import inspect
import sys
import threading
import types

__all__ = ["local_items", "SNAPSHOTS_STAY"]

# True where reading f_locals stores nothing on the frame (3.13+): nothing to clean up.
SNAPSHOTS_STAY = sys.version_info < (3, 13)


def _tracing() -> bool:
    gettrace = getattr(threading, "gettrace", None)
    return sys.gettrace() is not None or (gettrace is not None and gettrace() is not None)


def local_items(frame: types.FrameType) -> list[tuple[str, object]]:
    """``(name, value)`` for the locals of ``frame`` (cell and free variables included),
    leaving no snapshot behind on Python 3.10-3.12 (see the module docstring)."""
    code = frame.f_code
    optimized = bool(code.co_flags & inspect.CO_OPTIMIZED)
    if not SNAPSHOTS_STAY or not optimized:
        return list(frame.f_locals.items())
    snapshot = frame.f_locals
    items = list(snapshot.items())
    # References to the snapshot: the frame's own, ``snapshot`` and getrefcount's argument.
    if frame.f_trace is None and not _tracing() and sys.getrefcount(snapshot) <= 3:
        snapshot.clear()
    del snapshot
    return items
