"""``torchmem.distributed.gather`` / ``all_gather``: every rank's memory in one ``JobReport``.

    job = torchmem.distributed.gather()          # collective; the JobReport on rank 0, None elsewhere
    if job is not None:
        print(job.render())                      # a row per rank, imbalance, leaks by rank
        job.imbalances                           # ranks whose peak > 1.2x the median
        job.tag_stats()[1]["cuda:1"]["logging"]  # any rank's tags

Each rank sends one ``RankReport`` (``torchmem.distributed.payload``): its devices' peaks,
fragmentation and tags, and, if given, a leak report and a growth report. Every rank of the
group must call it at the same point (it is a collective).
"""

from __future__ import annotations

from torchmem.distributed import payload as _payload
from torchmem.distributed.errors import CollectiveMismatchError
from torchmem.distributed.exchange import all_gather_bytes, gather_bytes, group_info
from torchmem.distributed.job import DEFAULT_MIN_BYTES, DEFAULT_RATIO, JobReport

__all__ = ["gather", "all_gather", "local_report"]


def _leak_report(leaks):
    """A ``LeakReport`` from a report or a (torchmem or torchmem.distributed) leak_check."""
    if leaks is None:
        return None
    report = getattr(leaks, "report", leaks)
    if report is None or not hasattr(report, "leaked"):
        raise TypeError(
            "torchmem.distributed.gather: leaks= takes a torchmem.LeakReport or a leak_check that has "
            f"exited at least once, got {leaks!r}"
        )
    return report


def _growth_report(growth):
    if growth is None:
        return None
    if hasattr(growth, "local_report"):  # torchmem.distributed.GrowthMonitor
        return growth.local_report()
    if hasattr(growth, "report") and callable(growth.report):  # torchmem.GrowthMonitor
        return growth.report()
    if hasattr(growth, "to_dict"):
        return growth
    raise TypeError(f"torchmem.distributed.gather: growth= takes a GrowthMonitor or a GrowthReport, got {growth!r}")


def local_report(rank: int, world_size: int, *, devices=None, leaks=None, growth=None,
                 max_tags: int = _payload.DEFAULT_MAX_TAGS,
                 max_findings: int = _payload.DEFAULT_MAX_FINDINGS) -> _payload.RankReport:
    """This process's ``RankReport`` (what ``gather`` sends), without communicating."""
    return _payload.collect(
        rank=rank, world_size=world_size, devices=devices, leaks=_leak_report(leaks),
        growth=_growth_report(growth), max_tags=max_tags, max_findings=max_findings,
    )


def _decode_all(received: list[bytes], what: str) -> list[_payload.RankReport]:
    reports, unreadable = [], {}
    for rank, data in enumerate(received):
        try:
            reports.append(_payload.RankReport.from_dict(_payload.decode(data)))
        except _payload.ProtocolMismatch as error:
            unreadable[rank] = str(error)
    if unreadable:
        raise CollectiveMismatchError(
            f"{what}: cannot read the report of "
            + "; ".join(f"rank {rank} ({why})" for rank, why in unreadable.items())
            + ". Install the same torchmem on every rank."
        )
    return reports


def gather(group=None, dst: int = 0, *, devices=None, leaks=None, growth=None, timeout: float | None = None,
           max_tags: int = _payload.DEFAULT_MAX_TAGS, max_findings: int = _payload.DEFAULT_MAX_FINDINGS,
           ratio: float = DEFAULT_RATIO, min_bytes: int = DEFAULT_MIN_BYTES) -> JobReport | None:
    """Collects every rank's ``RankReport`` on group rank ``dst``; returns the ``JobReport``
    there and None on the other ranks. Collective: every rank of ``group`` calls it.

    ``devices``: what each rank reports (default: every device torchmem serves there).
    ``leaks``: this rank's ``LeakReport`` (or a leak_check that exited) to include;
    ``growth``: a ``GrowthMonitor`` or ``GrowthReport``. ``timeout``: seconds to wait for the
    other ranks (Gloo; see ``torchmem.distributed.exchange``). ``ratio``/``min_bytes``: when a
    rank's peak counts as imbalance.
    """
    what = "torchmem.distributed.gather"
    info = group_info(group, what)
    if not 0 <= dst < info.size:
        raise ValueError(f"{what}: dst must be a rank of the group (0..{info.size - 1}), got {dst}")
    mine = local_report(info.rank, info.size, devices=devices, leaks=leaks, growth=growth,
                        max_tags=max_tags, max_findings=max_findings)
    received = gather_bytes(info, _payload.encode(mine.to_dict()), dst, what=what, timeout=timeout)
    if received is None:
        return None
    return JobReport(_decode_all(received, what), info.size, ratio=ratio, min_bytes=min_bytes)


def all_gather(group=None, *, devices=None, leaks=None, growth=None, timeout: float | None = None,
               max_tags: int = _payload.DEFAULT_MAX_TAGS, max_findings: int = _payload.DEFAULT_MAX_FINDINGS,
               ratio: float = DEFAULT_RATIO, min_bytes: int = DEFAULT_MIN_BYTES) -> JobReport:
    """``gather``, with the ``JobReport`` on every rank (so every rank can act on it alike)."""
    what = "torchmem.distributed.all_gather"
    info = group_info(group, what)
    mine = local_report(info.rank, info.size, devices=devices, leaks=leaks, growth=growth,
                        max_tags=max_tags, max_findings=max_findings)
    received = all_gather_bytes(info, _payload.encode(mine.to_dict()), what=what, timeout=timeout)
    return JobReport(_decode_all(received, what), info.size, ratio=ratio, min_bytes=min_bytes)
