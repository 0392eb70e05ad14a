"""Failing the process at exit when ``run`` found a leak (``--fail-on-leak``).

``run`` reports from an ``atexit`` function, after the script's own ``atexit`` code, and by
then Python has already chosen the exit status (the script's ``sys.exit`` value): no
``atexit`` function can change it. So :func:`arm` registers, before torch or the script is
imported, a last ``atexit`` function (``atexit`` calls functions in reverse order of
registration, so the first registered runs last, after every other one, torch's and the
script's included); when the report asked for a failure it flushes stdout and stderr and
ends the process with that status through ``os._exit``. What it skips is only the
interpreter's final teardown (the script's globals were already released for the leak
report, so their files are closed by then).
"""

from __future__ import annotations

import atexit
import os
import sys

_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False,
             "": False}
ENV_VAR = "TORCHMEM_FAIL_ON_LEAK"

_override: int | None = None
_armed = False


def from_environment(environ=None) -> bool:
    """``TORCHMEM_FAIL_ON_LEAK`` as a boolean (1/0, true/false, yes/no, on/off); ValueError otherwise."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    key = value.strip().lower()
    if key not in _BOOLEANS:
        raise ValueError(f"{ENV_VAR}={value!r}: use 1 or 0 (true/false, yes/no, on/off)")
    return _BOOLEANS[key]


def arm() -> None:
    """Registers the last atexit function; call before torch and the script are imported."""
    global _armed
    if not _armed:
        atexit.register(_exit_with_override)
        _armed = True


def fail_with(code: int) -> None:
    """The process exits with ``code`` once every atexit function has run."""
    global _override
    _override = code


def _exit_with_override() -> None:
    if _override is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced by the script
            pass
    os._exit(_override)
