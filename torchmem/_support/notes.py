"""Notes on an exception (PEP 678) on every supported Python.

``BaseException.add_note`` exists from Python 3.11. On 3.10 the same note goes into the
exception's ``__notes__`` list, as PEP 678 specifies and its backport (``exceptiongroup``,
which pytest installs on 3.10) does: code that reads ``__notes__`` sees it on every
version, and pytest shows it under the error on 3.10 as it does on 3.11+.
"""

from __future__ import annotations


def add_note(error: BaseException, note: str) -> None:
    """Adds ``note`` to ``error``'s notes (``error.add_note(note)`` where it exists)."""
    if not isinstance(note, str):
        raise TypeError(f"a note must be a str, not {type(note).__name__}")
    method = getattr(error, "add_note", None)
    if method is not None:
        method(note)
        return
    notes = getattr(error, "__notes__", None)
    if notes is None:
        notes = []
        error.__notes__ = notes
    notes.append(note)
