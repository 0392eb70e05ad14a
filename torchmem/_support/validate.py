"""Checks of integer and seconds options, worded the same everywhere.

One helper for every API argument, pytest option and command-line flag that takes a count
or a duration, so that ``warmup=-1``, ``--steps 1`` and ``--dist-timeout 0`` are refused with
the same shape of message (what, the allowed range, what it means, what was given):

    require_int(warmup, what="torchmem.leak_check: warmup", minimum=0, meaning="extra unchecked runs")
    require_seconds(timeout, what="torchmem.distributed.leak_check: timeout", allow_none=True)

``argparse_int`` / ``argparse_seconds`` wrap them as argparse ``type=`` functions: argparse
then prints ``argument --steps: must be an int between 3 and 100 ...`` and exits with 2.
"""

from __future__ import annotations

import argparse
import math


def _range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an int between {minimum} and {maximum}"
    if minimum is not None:
        return f"an int >= {minimum}"
    if maximum is not None:
        return f"an int <= {maximum}"
    return "an int"


def _int_problem(value, minimum, maximum, meaning) -> tuple[type, str] | None:
    """(exception type, "must be ..., got ...") when ``value`` is not an acceptable int."""
    explained = f" ({meaning})" if meaning else ""
    expected = f"must be {_range_text(minimum, maximum)}{explained}, got {value!r}"
    # bool is an int subclass: warmup=True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        return TypeError, expected
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        return ValueError, expected
    return None


def _seconds_problem(value, allow_none, allow_zero) -> tuple[type, str] | None:
    if value is None and allow_none:
        return None
    bound = ">= 0" if allow_zero else "> 0"
    expected = f"must be seconds {bound}{' or None' if allow_none else ''}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return TypeError, expected
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        return ValueError, expected
    return None


def require_int(value, *, what: str, minimum: int | None = 0, maximum: int | None = None, meaning: str = "") -> int:
    """``value`` when it is an int (not a bool) within ``[minimum, maximum]``; else ValueError
    (TypeError for a value of another type) naming ``what``, the range and ``meaning``."""
    problem = _int_problem(value, minimum, maximum, meaning)
    if problem is not None:
        error_type, text = problem
        raise error_type(f"{what} {text}")
    return value


def require_seconds(value, *, what: str, allow_none: bool = False, allow_zero: bool = False) -> float | None:
    """``value`` as float seconds when it is a finite number > 0 (>= 0 with ``allow_zero``);
    None passes when ``allow_none``; else ValueError / TypeError naming ``what``."""
    problem = _seconds_problem(value, allow_none, allow_zero)
    if problem is not None:
        error_type, text = problem
        raise error_type(f"{what} {text}")
    return None if value is None else float(value)


def argparse_int(minimum: int | None = 0, maximum: int | None = None, meaning: str = ""):
    """An argparse ``type=`` that parses an int and checks it like :func:`require_int`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = text  # reported as "got '...'"
        problem = _int_problem(value, minimum, maximum, meaning)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem[1])  # argparse adds "argument --name: "
        return value

    return parse


def argparse_seconds(*, allow_zero: bool = False):
    """An argparse ``type=`` that parses seconds and checks them like :func:`require_seconds`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = text
        problem = _seconds_problem(value, False, allow_zero)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem[1])
        return value

    return parse
