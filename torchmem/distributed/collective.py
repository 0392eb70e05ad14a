"""Collective leak checks and growth monitors: one decision for the whole job.

A ``torchmem.leak_check`` that raises on the one rank that leaked while the others carry on
deadlocks the job at the next collective. The versions here end together on every rank::

    with torchmem.distributed.leak_check():        # every rank of the default group
        evaluate(ddp_model, loader)
    # -> on every rank, the same torchmem.distributed.DistributedLeakError naming the ranks
    #    that leaked, with their findings; or nothing on any rank

How an exit works. Each rank closes its own ``torchmem.leak_check`` (never raising), then
the ranks exchange a compact result (``all_gather_object``: the rank's leak totals, its
rendered findings, its torchmem version, the check's options and entry number, and the
error if its code raised). The decision is computed from that list, which is the same on
every rank, so every rank decides the same:

* versions, options or entry numbers differ -> ``CollectiveMismatchError`` on every rank;
* code raised inside on some ranks -> those ranks' errors propagate (with a note naming the
  others), and the other ranks raise ``RankFailedError`` naming them;
* any rank leaked more than ``max_leaked_bytes`` (outside warm-up) and ``raise_on_leak`` ->
  ``DistributedLeakError`` on every rank, the same message;
* the exchange itself fails (a rank died, or did not arrive within ``timeout`` seconds on
  Gloo) -> ``CollectiveError`` on every rank that got there.

Cost on exit: one ``all_gather_object`` of a few hundred bytes per rank when nothing leaked
(plus the findings' text when something did); with ``timeout`` on Gloo, a monitored barrier
first. Nothing is exchanged on entry, and nothing while the checked code runs.
"""

from __future__ import annotations

import functools
import sys

import torchmem
from torchmem.distributed import payload as _payload
from torchmem.leaks import check as _local_check
from torchmem.distributed.errors import (
    CollectiveMismatchError,
    DistributedLeakError,
    GrowthError,
    RankFailedError,
)
from torchmem.distributed.exchange import all_gather_bytes, group_info
from torchmem.distributed.job import format_ranks
from torchmem._support.files import short_path
from torchmem._support.notes import add_note
from torchmem._support.units import format_bytes
from torchmem._support.validate import require_seconds

__all__ = ["leak_check", "CollectiveLeakReport", "GrowthMonitor", "JobGrowthReport"]


def _caller_site(depth: int) -> str:
    frame = sys._getframe(depth)
    return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def _error_text(exc_type, exc) -> str:
    return f"{exc_type.__name__}: {exc}" if exc_type is not None else ""


def _exchange(info, what: str, outcome: dict, timeout) -> list[dict]:
    """Every rank's outcome (index = group rank); ``CollectiveMismatchError`` if a rank speaks
    another protocol or runs another torchmem version or other options."""
    received = all_gather_bytes(info, _payload.encode(outcome), what=what, timeout=timeout)
    outcomes, unreadable = [], {}
    for rank, data in enumerate(received):
        try:
            outcomes.append(_payload.decode(data))
        except _payload.ProtocolMismatch as error:
            unreadable[rank] = str(error)
            outcomes.append(None)
    if unreadable:
        lines = [f"  rank {rank}: {why}" for rank, why in unreadable.items()]
        raise CollectiveMismatchError(
            f"{what}: rank {info.rank} cannot read the result of {format_ranks(unreadable)}:\n"
            + "\n".join(lines)
            + f"\nThis rank runs torchmem {torchmem.__version__}. Install the same torchmem on every rank."
        )
    _check_agreement(what, outcomes)
    return outcomes


def _check_agreement(what: str, outcomes: list[dict]) -> None:
    """The same torchmem version, options and entry number on every rank, or an error that
    lists, for each difference, which ranks have which value."""
    fields = {"torchmem version": lambda outcome: outcome.get("version")}
    for option in sorted({name for outcome in outcomes for name in outcome.get("options", {})}):
        fields[f"option {option}"] = lambda outcome, option=option: repr(outcome.get("options", {}).get(option))
    fields["entry (times this check was entered)"] = lambda outcome: outcome.get("entry")
    differences = []
    for label, read in fields.items():
        values: dict = {}
        for rank, outcome in enumerate(outcomes):
            values.setdefault(read(outcome), []).append(rank)
        if len(values) > 1:
            parts = "; ".join(f"{format_ranks(ranks)}: {value}" for value, ranks in values.items())
            differences.append(f"  {label}: {parts}")
    if differences:
        raise CollectiveMismatchError(
            f"{what}: the ranks do not run the same check, so they cannot decide together:\n"
            + "\n".join(differences)
            + "\nRun the same torchmem version on every rank, create the check with the same options "
            "everywhere, and enter it on every rank the same number of times."
        )


# --- leak_check ------------------------------------------------------------------------------


class CollectiveLeakReport:
    """What every rank's leak check found at one exit of a collective ``leak_check``.

    ``outcomes[r]`` is group rank ``r``'s result: ``leaks`` (``payload.compact_leaks``: totals,
    groups, the rank's rendered report in ``text``) and ``error`` (what its code raised, or None).
    """

    def __init__(self, site: str, entry: int, outcomes: list[dict]):
        self.site = site
        self.entry = entry
        self.outcomes = outcomes

    @property
    def world_size(self) -> int:
        return len(self.outcomes)

    @property
    def leaked_ranks(self) -> list[int]:
        """Ranks with leaked (reachable or cycle-held) blocks, whatever their limit."""
        return [rank for rank, outcome in enumerate(self.outcomes) if outcome["leaks"] and outcome["leaks"]["leaked_blocks"]]

    @property
    def exceeding_ranks(self) -> list[int]:
        """Ranks that leaked more than ``max_leaked_bytes`` outside warm-up: why a check raises."""
        return [rank for rank, outcome in enumerate(self.outcomes) if outcome["leaks"] and outcome["leaks"]["exceeds_limit"]]

    @property
    def failures(self) -> dict[int, str]:
        """Ranks whose checked code raised, and what."""
        return {rank: outcome["error"] for rank, outcome in enumerate(self.outcomes) if outcome["error"]}

    @property
    def exceeds_limit(self) -> bool:
        return bool(self.exceeding_ranks)

    @property
    def has_leaks(self) -> bool:
        return bool(self.leaked_ranks)

    @property
    def leaked_bytes(self) -> int:
        return sum(outcome["leaks"]["leaked_bytes"] for outcome in self.outcomes if outcome["leaks"])

    def render(self) -> str:
        """The same text on every rank: which ranks leaked, then each one's findings."""
        head = f"torchmem.distributed.leak_check (entered at {self.site}, entry {self.entry}, {self.world_size} ranks): "
        leaked = self.leaked_ranks
        clean = [rank for rank in range(self.world_size) if rank not in leaked and rank not in self.failures]
        if self.failures:
            head += f"{format_ranks(self.failures)} raised inside the check"
            if leaked:
                head += f"; {format_ranks(leaked)} leaked"
        elif leaked:
            total = sum(self.outcomes[rank]["leaks"]["leaked_blocks"] for rank in leaked)
            head += (
                f"{format_ranks(leaked)} leaked {format_bytes(self.leaked_bytes)} in {total} "
                f"block{'s' if total != 1 else ''}"
            )
            if clean:
                head += f" ({format_ranks(clean)}: no leaks)"
        else:
            head += "no leaks on any rank"
        lines = [head]
        for rank, error in self.failures.items():
            lines += ["", f"rank {rank} raised {error}"]
        for rank in leaked:
            lines += ["", f"rank {rank}:"]
            lines += [f"  {line}" if line else "" for line in self.outcomes[rank]["leaks"]["text"].splitlines()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict:
        return {
            "site": self.site,
            "entry": self.entry,
            "world_size": self.world_size,
            "leaked_ranks": self.leaked_ranks,
            "exceeding_ranks": self.exceeding_ranks,
            "failures": {str(rank): error for rank, error in self.failures.items()},
            "ranks": self.outcomes,
        }


class leak_check:  # noqa: N801 - used like a function, as torchmem.leak_check is
    """``torchmem.leak_check`` for a distributed job: every rank leaves together and decides
    the same (see the module's docstring). A context manager and a decorator, reusable.

    Args:
        group: the process group whose ranks check together (default: the whole job). Every
            rank of it must enter and exit the check.
        timeout: seconds every rank waits for the others at exit before raising
            ``CollectiveError`` naming the missing ranks (Gloo groups; other backends are
            bounded by the group's own timeout). None: the group's timeout.
        raise_on_leak: raise ``DistributedLeakError`` on every rank when any rank leaked
            more than ``max_leaked_bytes``; otherwise only fill ``job``.
        **options: the options of ``torchmem.leak_check`` (``gc_collect``, ``allow_tags``,
            ``warmup``, ``capture_stacks``, ``max_leaked_bytes``, ``devices``).

    ``with ... as report`` binds this rank's ``LeakReport``; after the exit, ``check.report``
    is this rank's latest report and ``check.job`` the ``CollectiveLeakReport`` of all ranks.
    """

    def __init__(self, *, group=None, timeout: float | None = None, raise_on_leak: bool = True, **options):
        timeout = require_seconds(timeout, what="torchmem.distributed.leak_check: timeout", allow_none=True)
        self._local = torchmem.leak_check(raise_on_leak=False, **options)
        self.group = group
        self.timeout = timeout
        self.raise_on_leak = bool(raise_on_leak)
        self.job: CollectiveLeakReport | None = None
        self._site = "?"
        self._info = None

    @property
    def report(self):
        """This rank's latest ``LeakReport``."""
        return self._local.report

    def _options(self) -> dict:
        local = self._local
        return {
            "raise_on_leak": self.raise_on_leak,
            "gc_collect": local.gc_collect,
            "allow_tags": sorted(local.allow_tags),
            "warmup": local.warmup,
            "capture_stacks": local.capture_stacks,
            "max_leaked_bytes": local.max_leaked_bytes,
            "cycles": getattr(local, "cycles", None),
            "cycle_repeats": getattr(local, "cycle_repeats", None),
            "allow_held_by": sorted(root.name for root in getattr(local, "allowed_roots", ())),
            # device types, not indices: rank r checking cuda:r is the same check
            "devices": None if local.devices is None else sorted({name.split(":")[0] for name in local.devices}),
        }

    def __repr__(self) -> str:
        return f"<torchmem.distributed.leak_check {self._local.entries} entries, group={self.group!r}>"

    def __enter__(self):
        return self._enter(_caller_site(2))

    def _enter(self, site: str):
        self._info = group_info(self.group, "torchmem.distributed.leak_check")
        self._site = site
        return self._local._enter(site=site)

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if self._info is None or self._local._open is None:
            return self._local.__exit__(exc_type, exc, traceback)  # raises what is wrong: nothing to exchange
        what = f"torchmem.distributed.leak_check (entered at {self._site})"
        local_error = None
        try:
            self._local.__exit__(exc_type, exc, traceback)
        except Exception as error:  # noqa: BLE001 - misuse errors: still take part in the exchange
            local_error = error
        failure = exc if exc_type is not None else local_error
        report = self._local.report
        outcome = {
            "version": torchmem.__version__,
            "options": self._options(),
            "entry": self._local.entries,
            "rank": self._info.rank,
            "global_rank": self._info.global_rank,
            "error": _error_text(type(failure), failure) if failure is not None else None,
            "leaks": None if report is None or failure is not None else _payload.compact_leaks(report),
        }
        outcomes = _exchange(self._info, what, outcome, self.timeout)
        job = self.job = CollectiveLeakReport(self._site, self._local.entries, outcomes)
        failures = job.failures
        if failure is not None:
            others = [rank for rank in failures if rank != self._info.rank]
            stopped = [rank for rank in range(self._info.size) if rank not in failures]
            if others:
                add_note(failure, f"torchmem.distributed: {format_ranks(others)} also raised inside this check")
            if stopped:
                add_note(
                    failure,
                    f"torchmem.distributed: {format_ranks(stopped)} raise RankFailedError, since this rank "
                    "raised inside the collective check",
                )
            if local_error is not None and exc_type is None:
                raise local_error
            return False
        if failures:
            raise RankFailedError(
                f"{what}: {format_ranks(failures)} raised inside the check, so every rank stops here "
                "(carrying on would wait forever at a collective those ranks never reach):\n"
                + "\n".join(f"  rank {rank}: {error}" for rank, error in failures.items()),
                failures,
            )
        if self.raise_on_leak and job.exceeds_limit:
            raise DistributedLeakError(job, report)
        return False

    def __call__(self, func):
        """Checks every call of ``func`` collectively (every rank must call it); tensors it
        returns are allowed to survive, as with ``torchmem.leak_check``."""
        if not callable(func):
            raise TypeError(
                f"torchmem.distributed.leak_check(...) decorates a function, got {type(func).__name__}; "
                "write @torchmem.distributed.leak_check() (with parentheses)"
            )

        code = getattr(func, "__code__", None)
        site = (
            f"{short_path(code.co_filename)}:{code.co_firstlineno} ({func.__qualname__})"
            if code is not None else getattr(func, "__qualname__", repr(func))
        )

        @functools.wraps(func)
        def checked(*args, **kwargs):
            self._enter(site)
            try:
                result = func(*args, **kwargs)
            except BaseException:
                if not self.__exit__(*sys.exc_info()):
                    raise
                return None
            # As with torchmem.leak_check: what the function returns may outlive it.
            opened = self._local._open
            if opened is not None:
                for tensor in _local_check._returned_tensors(result):
                    identity = _local_check._block_identity(tensor)
                    if identity is not None:
                        opened.returned.add(identity)
            self.__exit__(None, None, None)
            return result

        return checked


# --- GrowthMonitor ---------------------------------------------------------------------------


class JobGrowthReport:
    """What every rank's ``GrowthMonitor`` saw: ``outcomes[r]`` has ``has_growth``, ``text``
    (the rank's rendered ``GrowthReport``) and ``data`` (its ``to_dict()``)."""

    def __init__(self, outcomes: list[dict]):
        self.outcomes = outcomes

    @property
    def growing_ranks(self) -> list[int]:
        return [rank for rank, outcome in enumerate(self.outcomes) if outcome["has_growth"]]

    @property
    def has_growth(self) -> bool:
        return bool(self.growing_ranks)

    def render(self) -> str:
        growing = self.growing_ranks
        size = len(self.outcomes)
        if not growing:
            steps = sorted({outcome["data"]["steps"] for outcome in self.outcomes})
            return (
                f"torchmem.distributed.GrowthMonitor ({size} ranks): no growth on any rank "
                f"({', '.join(map(str, steps))} steps)"
            )
        others = [rank for rank in range(size) if rank not in growing]
        lines = [
            f"torchmem.distributed.GrowthMonitor ({size} ranks): live memory grew on every step after "
            f"warm-up on {format_ranks(growing)}" + (f" ({format_ranks(others)}: no growth)" if others else "")
        ]
        for rank in growing:
            lines += ["", f"rank {rank}:"]
            lines += [f"  {line}" for line in self.outcomes[rank]["text"].splitlines()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict:
        return {"growing_ranks": self.growing_ranks, "ranks": [outcome["data"] for outcome in self.outcomes]}


class GrowthMonitor:
    """``torchmem.GrowthMonitor`` on every rank, judged together.

    ``step()`` is local and cheap (no communication). ``report()`` and ``check()`` are
    collective: every rank of ``group`` calls them at the same point. ``check()`` raises
    ``GrowthError`` on every rank when any rank grew, naming the ranks; ``local_report()`` is
    this rank's own ``GrowthReport``. Arguments as ``torchmem.GrowthMonitor``, plus ``group``
    and ``timeout`` as in ``torchmem.distributed.leak_check``.
    """

    def __init__(self, warmup: int = 2, devices=None, *, group=None, timeout: float | None = None,
                 by_site: bool = True, min_steps: int = 2):
        self._local = torchmem.GrowthMonitor(warmup, devices, by_site=by_site, min_steps=min_steps)
        self.group = group
        self.timeout = timeout
        self._reports = 0

    def start(self) -> "GrowthMonitor":
        self._local.start()
        return self

    def stop(self) -> None:
        self._local.stop()

    def step(self) -> None:
        self._local.step()

    @property
    def steps(self) -> int:
        return self._local.steps

    def __enter__(self) -> "GrowthMonitor":
        return self.start()

    def __exit__(self, *exc_info) -> bool:
        self.stop()
        return False

    def local_report(self):
        """This rank's ``GrowthReport`` (no communication)."""
        return self._local.report()

    def report(self) -> JobGrowthReport:
        """Every rank's growth, on every rank (collective)."""
        what = "torchmem.distributed.GrowthMonitor.report()"
        info = group_info(self.group, what)
        self._reports += 1
        local = self._local.report()
        outcome = {
            "version": torchmem.__version__,
            "options": {"warmup": self._local.warmup, "min_steps": self._local.min_steps, "by_site": self._local.by_site},
            "entry": self._reports,
            "rank": info.rank,
            "has_growth": local.has_growth,
            "text": local.render(),
            "data": local.to_dict(),
        }
        return JobGrowthReport(_exchange(info, what, outcome, self.timeout))

    def check(self) -> JobGrowthReport:
        """``report()``, raising ``GrowthError`` on every rank if any rank grew."""
        job = self.report()
        if job.has_growth:
            raise GrowthError(job)
        return job

