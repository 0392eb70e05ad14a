"""Tables laid out by rich (torchmem/_support/tables.py) read as before: the job report's row
per rank, columns aligned, numbers right-aligned, no borders."""

from __future__ import annotations

from torchmem.distributed.job import JobReport, RankReport

MiB = 2**20


def _rank(rank: int, peak: int, tags=()) -> RankReport:
    figures = {
        "allocated_peak": peak, "allocated_current": 0, "reserved_peak": peak, "reserved_current": 0,
        "free_bytes": 123456, "largest_free_block": 0, "external_fragmentation": 0.25, "ooms": 0, "alloc_retries": 0,
        "tags": [list(tag) for tag in tags], "tags_dropped": 0,
    }
    return RankReport(rank=rank, world_size=12, devices={f"cuda:{rank}": figures}, leaks=None)


def test_the_job_report_has_an_aligned_row_per_rank():
    reports = [_rank(0, 10 * MiB), _rank(10, 11 * MiB), _rank(3, 1300 * MiB, [("cache", 0, 3 * MiB, 1, 1)])]
    lines = JobReport(reports, 12).render().splitlines()
    assert lines[:5] == [
        "torchmem job report: 3 of 12 ranks reported",
        "  rank  device   peak allocated  peak reserved  cache free (ext. frag.)  top tags by peak  leaked",
        "     0  cuda:0         10.0 MiB       10.0 MiB       120.6 KiB (25.0 %)  -                 not checked",
        "     3  cuda:3          1.3 GiB        1.3 GiB       120.6 KiB (25.0 %)  cache 3.0 MiB     not checked",
        "    10  cuda:10        11.0 MiB       11.0 MiB       120.6 KiB (25.0 %)  -                 not checked",
    ]
