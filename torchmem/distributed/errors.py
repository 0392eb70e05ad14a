"""The errors of ``torchmem.distributed``: each says which ranks, what happened, what to do.

Every error raised by a collective (``leak_check``, ``GrowthMonitor.check``, ``all_gather``)
is raised on every rank that took part, with the same message, so that no rank carries on
into a collective the others will never join.
"""

from __future__ import annotations

from torchmem.leaks.report import LeakError

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "RankFailedError",
    "DistributedLeakError",
    "GrowthError",
]


class CollectiveError(RuntimeError):
    """The exchange between ranks failed: a rank crashed, hung past the timeout, or left the
    process group. ``ranks`` lists the ranks known not to have arrived (may be empty when the
    backend does not say)."""

    def __init__(self, message: str, ranks: tuple = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)


class CollectiveMismatchError(RuntimeError):
    """Ranks run different torchmem versions, or the same collective with different options,
    or are not at the same entry of it: their results cannot be combined into one decision."""


class RankFailedError(RuntimeError):
    """Raised on the ranks whose own code succeeded when other ranks raised inside the same
    collective check: carrying on would leave them waiting at a collective the failed ranks
    never reach. ``failures`` maps rank -> the error it raised (text)."""

    def __init__(self, message: str, failures: dict):
        super().__init__(message)
        self.failures = dict(failures)


class DistributedLeakError(LeakError):
    """Raised on every rank when any rank's collective leak check leaked more than allowed.

    ``.job`` is the ``CollectiveLeakReport`` (every rank's findings; ``.leaked_ranks``),
    ``.report`` this rank's own ``LeakReport``. The message is the same on every rank.
    """

    def __init__(self, job, report):
        AssertionError.__init__(self, job.render())
        self.job = job
        self.report = report


class GrowthError(AssertionError):
    """Raised on every rank by ``torchmem.distributed.GrowthMonitor.check()`` when live memory
    grew on every step after warm-up on any rank. ``.job`` is the ``JobGrowthReport``."""

    def __init__(self, job):
        super().__init__(job.render())
        self.job = job
