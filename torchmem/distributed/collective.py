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

import os
import sys

import torchmem
from torchmem import LeakError
from torchmem.distributed import payload as _payload
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
    labels = [outcome.get("label") for outcome in outcomes]
    if len(set(labels)) > 1:
        # Checked first: ranks at different tests also disagree on everything else.
        lines = [f"  rank {rank}: {label}" for rank, label in enumerate(labels)]
        raise CollectiveMismatchError(
            f"{what}: the ranks are not at the same check, so they cannot decide together:\n"
            + "\n".join(lines)
            + "\nA rank skipped, failed before or ran a different test or step than the others; each rank's "
            "own output says which."
        )
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

    def __init__(self, site: str, entry: int, outcomes: list[dict], label: str | None = None):
        self.site = site  # where the check was left (file:line outside torchmem)
        self.entry = entry
        self.outcomes = outcomes
        self.label = label  # what the check was for (the pytest node id), when given

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
        where = f"for {self.label}" if self.label else f"exited at {self.site}, entry {self.entry}"
        head = f"torchmem.distributed.leak_check ({where}, {self.world_size} ranks): "
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
            "label": self.label,
            "entry": self.entry,
            "world_size": self.world_size,
            "leaked_ranks": self.leaked_ranks,
            "exceeding_ranks": self.exceeding_ranks,
            "failures": {str(rank): error for rank, error in self.failures.items()},
            "ranks": self.outcomes,
        }


class leak_check(torchmem.leak_check):  # noqa: N801 - used like a function, as torchmem.leak_check is
    """``torchmem.leak_check`` for a distributed job: every rank leaves together and decides
    the same (see the module's docstring). A context manager and a decorator, reusable.

    It *is* a ``torchmem.leak_check`` (the same entering, classifying and decorating: what a
    decorated function returns is allowed, ``allowed_roots`` set on it reach the
    classification); only its exit differs: after the local check has classified, the ranks
    exchange their results and decide together.

    Args:
        group: the process group whose ranks check together (default: the whole job). Every
            rank of it must enter and exit the check.
        timeout: seconds every rank waits for the others at exit before raising
            ``CollectiveError`` naming the missing ranks (Gloo groups; other backends are
            bounded by the group's own timeout). None: the group's timeout.
        raise_on_leak: raise ``DistributedLeakError`` on every rank when any rank leaked
            more than ``max_leaked_bytes``; otherwise only fill ``job``.
        label: what this exit is for (the pytest plugin gives the test's node id): ranks
            that exit with different labels are at different points of the program, and
            every rank raises ``CollectiveMismatchError`` naming each rank's label.
        **options: the options of ``torchmem.leak_check`` (``gc_collect``, ``allow_tags``,
            ``warmup``, ``capture_stacks``, ``max_leaked_bytes``, ``devices``, ``cycles``,
            ``cycle_repeats``, ``allow_held_by``).

    ``with ... as report`` binds this rank's ``LeakReport``; after the exit, ``check.report``
    is this rank's latest report and ``check.job`` the ``CollectiveLeakReport`` of all ranks.
    """

    def __init__(self, *, group=None, timeout: float | None = None, raise_on_leak: bool = True,
                 label: str | None = None, **options):
        # The local exit never raises a leak: the ranks decide together (LeakError is caught
        # below in any case, should the local check raise one).
        super().__init__(raise_on_leak=False, **options)
        self.timeout = require_seconds(timeout, what="torchmem.distributed.leak_check: timeout", allow_none=True)
        self.collective_raise_on_leak = bool(raise_on_leak)
        self.group = group
        self.label = label
        self.job: CollectiveLeakReport | None = None
        self._exits = 0  # exits so far; with ``entries`` (the local check's count) tells an open check

    def _options(self) -> dict:
        return {
            "raise_on_leak": self.collective_raise_on_leak,
            "gc_collect": self.gc_collect,
            "allow_tags": sorted(self.allow_tags),
            "warmup": self.warmup,
            "capture_stacks": self.capture_stacks,
            "max_leaked_bytes": self.max_leaked_bytes,
            "cycles": self.cycles,
            "cycle_repeats": self.cycle_repeats,
            # device types, not indices: rank r checking cuda:r is the same check
            "devices": None if self.devices is None else sorted({name.split(":")[0] for name in self.devices}),
        }

    def __repr__(self) -> str:
        return f"<torchmem.distributed.leak_check {self.entries} entries, group={self.group!r}, label={self.label!r}>"

    def __enter__(self):
        # Before the checked code runs: a missing process group is said now, not after it.
        group_info(self.group, "torchmem.distributed.leak_check")
        return super().__enter__()

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if self.entries <= self._exits:  # never entered, or exited twice: the local check says so
            return super().__exit__(exc_type, exc, traceback)
        self._exits += 1
        site = _outer_site()
        what = f"torchmem.distributed.leak_check (exited at {site}" + (
            f", for {self.label})" if self.label else ")"
        )
        info = group_info(self.group, "torchmem.distributed.leak_check")
        local_error = None
        try:
            super().__exit__(exc_type, exc, traceback)
        except LeakError:
            pass  # decided together below
        except Exception as error:  # noqa: BLE001 - misuse errors: still take part in the exchange
            local_error = error
        failure = exc if exc_type is not None else local_error
        report = self.report
        outcome = {
            "version": torchmem.__version__,
            "options": self._options(),
            "entry": self.entries,
            "label": self.label,
            "rank": info.rank,
            "global_rank": info.global_rank,
            "error": _error_text(type(failure), failure) if failure is not None else None,
            "leaks": None if report is None or failure is not None else _payload.compact_leaks(report),
        }
        outcomes = _exchange(info, what, outcome, self.timeout)
        job = self.job = CollectiveLeakReport(site, self.entries, outcomes, self.label)
        failures = job.failures
        if failure is not None:
            others = [rank for rank in failures if rank != info.rank]
            stopped = [rank for rank in range(info.size) if rank not in failures]
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
        if self.collective_raise_on_leak and job.exceeds_limit:
            raise DistributedLeakError(job, report)
        return False


def _outer_site() -> str:
    """file:line of the innermost frame outside torchmem: where the user's check ends."""
    frame = sys._getframe(1)
    while frame is not None and _is_torchmem_file(frame.f_code.co_filename):
        frame = frame.f_back
    return "?" if frame is None else f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


_PACKAGE_DIR = os.path.dirname(os.path.abspath(torchmem.__file__))


def _is_torchmem_file(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


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

