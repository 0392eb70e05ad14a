"""One report for a whole job: a row per rank, the imbalance between ranks, every rank's leaks.

``JobReport`` is what rank 0 builds from the ``RankReport`` of every rank (``gather``,
``python -m torchmem run`` under a launcher). As it reads::

    torchmem job report: 4 of 4 ranks reported
      rank  device  peak allocated  peak reserved  cache free (ext. frag.)  top tags by peak                 leaked
         0  cpu            8.6 MiB       12.0 MiB         3.4 MiB (41.2 %)  model 4.0 MiB, step 2.1 MiB      none
         1  cpu           16.6 MiB       20.0 MiB         3.4 MiB (41.2 %)  logging 8.0 MiB, model 4.0 MiB   1.0 MiB in 8 blocks
      ...
    imbalance: peak more than 1.2x the median of the ranks
      rank 1  cpu  peak allocated 16.6 MiB = 1.93x the median (8.6 MiB); tag=logging is 8.0 MiB above its median

    leak findings of rank 1
      torchmem.leak_check: 1.0 MiB in 8 blocks allocated inside are still alive ...

Imbalance compares ranks per device type (a rank's ``cuda:3`` with another's ``cuda:0``):
a rank is flagged when its peak exceeds ``ratio`` times the median over the ranks that
reported, by at least ``min_bytes`` (so that kilobytes of noise on an idle device are not
news); the tag whose peak on that rank exceeds its own median by most is named, as the
likely cause. With two ranks the median is their mean.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from torchmem._support.units import format_bytes
from torchmem.distributed.payload import RankReport

__all__ = ["JobReport", "Imbalance", "format_ranks", "DEFAULT_RATIO", "DEFAULT_MIN_BYTES"]

DEFAULT_RATIO = 1.2
DEFAULT_MIN_BYTES = 1 << 20
_TOP_TAGS = 3
_METRICS = (("allocated_peak", "peak allocated"), ("reserved_peak", "peak reserved"))


def format_ranks(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def device_type(name: str) -> str:
    return name.split(":", 1)[0]


@dataclass(frozen=True)
class Imbalance:
    """One rank whose peak on a device type is well above the other ranks'."""

    rank: int
    device_type: str
    metric: str  # "peak allocated" or "peak reserved"
    value: int
    median: float
    tag: str | None = None  # the tag most above its own median on this rank
    tag_excess: int = 0

    @property
    def ratio(self) -> float:
        return self.value / self.median if self.median else float("inf")

    def render(self) -> str:
        ratio = f"{self.ratio:.2f}x" if self.median else "more than any other rank:"
        line = (
            f"rank {self.rank}  {self.device_type}  {self.metric} {format_bytes(self.value)} = {ratio} the median "
            f"({format_bytes(round(self.median))})"
        )
        if self.tag is not None and self.tag_excess > 0:
            line += f"; tag={self.tag} is {format_bytes(self.tag_excess)} above its median"
        return line

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "device_type": self.device_type,
            "metric": self.metric,
            "value": self.value,
            "median": self.median,
            "ratio": None if not self.median else round(self.ratio, 4),
            "tag": self.tag,
            "tag_excess": self.tag_excess,
        }


class JobReport:
    """Every rank's ``RankReport``, and what they say together.

    ``missing`` maps ranks that sent nothing to the reason. ``title`` heads the text
    (what ran). ``ratio`` and ``min_bytes`` set when a rank's peak counts as imbalance.
    """

    def __init__(
        self,
        ranks: list[RankReport],
        world_size: int,
        missing: dict[int, str] | None = None,
        *,
        title: str | None = None,
        ratio: float = DEFAULT_RATIO,
        min_bytes: int = DEFAULT_MIN_BYTES,
    ):
        if ratio <= 1:
            raise ValueError(f"torchmem.distributed: the imbalance ratio must be > 1 (e.g. 1.2), got {ratio!r}")
        self.ranks = sorted(ranks, key=lambda report: report.rank)
        self.world_size = world_size
        self.missing = dict(sorted((missing or {}).items()))
        self.title = title
        self.ratio = ratio
        self.min_bytes = min_bytes

    # --- queries ----------------------------------------------------------------------
    def rank(self, rank: int) -> RankReport:
        for report in self.ranks:
            if report.rank == rank:
                return report
        raise KeyError(f"rank {rank} sent no report (reported: {format_ranks(r.rank for r in self.ranks)})")

    @property
    def leaked_ranks(self) -> list[int]:
        """Ranks whose leak check found leaked (reachable or cycle-held) blocks."""
        return [report.rank for report in self.ranks if report.leaked_blocks]

    def tag_stats(self) -> dict[int, dict[str, dict[str, dict]]]:
        """``{rank: {device: {tag: {"current_bytes", "peak_bytes", "live_blocks", "allocations"}}}}``."""
        return {
            report.rank: {
                device: {
                    name: {"current_bytes": current, "peak_bytes": peak, "live_blocks": live, "allocations": allocs}
                    for name, current, peak, live, allocs in figures["tags"]
                }
                for device, figures in report.devices.items()
            }
            for report in self.ranks
        }

    @property
    def imbalances(self) -> list[Imbalance]:
        """Ranks whose peak (allocated or reserved) on a device type exceeds ``ratio`` x the
        median of the ranks, by at least ``min_bytes``; largest ratio first."""
        found = []
        for kind in self._device_types():
            per_rank = {report.rank: self._sum(report, kind) for report in self.ranks if self._has(report, kind)}
            if len(per_rank) < 2:
                continue
            for key, label in _METRICS:
                values = {rank: figures[key] for rank, figures in per_rank.items()}
                median = statistics.median(values.values())
                for rank, value in values.items():
                    if value > self.ratio * median and value - median >= self.min_bytes:
                        tag, excess = self._likely_tag(kind, rank)
                        found.append(Imbalance(rank, kind, label, value, median, tag, excess))
        found.sort(key=lambda imbalance: (-imbalance.ratio, imbalance.rank))
        return found

    def _device_types(self) -> list[str]:
        kinds = {device_type(name) for report in self.ranks for name in report.devices}
        return sorted(kinds, key=lambda kind: (kind != "cuda", kind))

    @staticmethod
    def _has(report: RankReport, kind: str) -> bool:
        return any(device_type(name) == kind for name in report.devices)

    @staticmethod
    def _sum(report: RankReport, kind: str) -> dict:
        total = {"allocated_peak": 0, "reserved_peak": 0, "tags": {}}
        for name, figures in report.devices.items():
            if device_type(name) != kind:
                continue
            total["allocated_peak"] += figures["allocated_peak"]
            total["reserved_peak"] += figures["reserved_peak"]
            for tag, _current, peak, _live, _allocs in figures["tags"]:
                total["tags"][tag] = total["tags"].get(tag, 0) + peak
        return total

    def _likely_tag(self, kind: str, rank: int) -> tuple[str | None, int]:
        """The tag whose peak on ``rank`` exceeds its median over the ranks by most."""
        tags_per_rank = {report.rank: self._sum(report, kind)["tags"] for report in self.ranks if self._has(report, kind)}
        names = {name for tags in tags_per_rank.values() for name in tags}
        best, best_excess = None, 0
        for name in sorted(names):
            median = statistics.median(tags.get(name, 0) for tags in tags_per_rank.values())
            excess = tags_per_rank[rank].get(name, 0) - median
            if excess > best_excess:
                best, best_excess = name, int(excess)
        return best, best_excess

    # --- output -----------------------------------------------------------------------
    def render(self) -> str:
        """The report as text: the table, imbalance, exit codes, leaks and growth by rank, missing ranks."""
        reported = len(self.ranks)
        head = f"torchmem job report: {reported} of {self.world_size} ranks reported"
        if self.title:
            head += f" ({self.title})"
        lines = [head]
        hosts = sorted({report.host for report in self.ranks if report.host})
        if len(hosts) > 1:
            for host in hosts:
                lines.append(f"  host {host}: {format_ranks(r.rank for r in self.ranks if r.host == host)}")
        if self.ranks:
            lines += self._table()
        exit_line = self._exit_codes()
        if exit_line:
            lines.append(exit_line)
        imbalances = self.imbalances
        if imbalances:
            lines.append(
                f"imbalance: peak more than {self.ratio:g}x the median of the ranks "
                f"(and {format_bytes(self.min_bytes)} above it)"
            )
            lines += [f"  {imbalance.render()}" for imbalance in imbalances]
        else:
            lines.append(
                f"imbalance: none (no rank's peak is above {self.ratio:g}x the median by "
                f"{format_bytes(self.min_bytes)} or more)"
            )
        no_check = [report.rank for report in self.ranks if report.leaks is None]
        for report in self.ranks:
            if report.leaks is not None and (report.leaks["leaked_blocks"] or report.leaks["aborted"]):
                lines += ["", f"leak findings of rank {report.rank}"]
                lines += [f"  {line}" if line else "" for line in report.leaks["text"].splitlines()]
        if self.ranks and not self.leaked_ranks:
            checked = [report.rank for report in self.ranks if report.leaks is not None]
            if checked:
                lines.append(f"leaks: none on {format_ranks(checked)}")
        if no_check:
            lines.append(f"leaks: not checked on {format_ranks(no_check)}")
        for report in self.ranks:
            growing = (report.growth or {}).get("growing") or []
            if growing:
                lines += ["", f"growth on rank {report.rank} (every step after warm-up)"]
                for growth in growing:
                    lines.append(
                        f"  +{format_bytes(round(growth['bytes_per_step']))}/step  {growth['device']}  "
                        f"{'tag=' if growth['kind'] == 'tag' else ''}{growth['name']}"
                    )
        if self.missing:
            lines += ["", "ranks that sent no report"]
            lines += [f"  rank {rank}: {why}" for rank, why in self.missing.items()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def _table(self) -> list[str]:
        rows = [["rank", "device", "peak allocated", "peak reserved", "cache free (ext. frag.)", "top tags by peak", "leaked"]]
        for report in self.ranks:
            by_device = (report.leaks or {}).get("by_device", {})
            for name, figures in sorted(report.devices.items(), key=lambda item: (device_type(item[0]) != "cuda", item[0])):
                top = ", ".join(f"{tag} {format_bytes(peak)}" for tag, _c, peak, _l, _a in figures["tags"][:_TOP_TAGS] if peak)
                if report.leaks is None:
                    leaked = "not checked"
                else:
                    blocks, size = by_device.get(name, (0, 0))
                    leaked = "none" if not blocks else f"{format_bytes(size)} in {blocks} block{'s' if blocks != 1 else ''}"
                rows.append(
                    [
                        str(report.rank),
                        name,
                        format_bytes(figures["allocated_peak"]),
                        format_bytes(figures["reserved_peak"]),
                        f"{format_bytes(figures['free_bytes'])} ({figures['external_fragmentation'] * 100:.1f} %)",
                        top or "-",
                        leaked,
                    ]
                )
            if not report.devices:
                rows.append([str(report.rank), "-", "-", "-", "-", "-", "-"])
        from torchmem._support.tables import render_table

        justify = ["right", "left", "right", "right", "right", "left", "left"]
        return render_table(rows[0], rows[1:], justify=justify, gap=2).splitlines()

    def _exit_codes(self) -> str | None:
        codes: dict[str, list[int]] = {}
        for report in self.ranks:
            if report.exit_code is None and report.status is None:
                continue
            label = str(report.exit_code) if report.exit_code is not None else "?"
            if report.status:
                label += f" ({report.status})"
            codes.setdefault(label, []).append(report.rank)
        if not codes:
            return None
        parts = [f"{format_ranks(ranks)}: {label}" for label, ranks in sorted(codes.items(), key=lambda item: item[1][0])]
        return "exit codes: " + "; ".join(parts)

    def to_dict(self) -> dict:
        """Plain data: every rank's report, the missing ranks and the imbalance found."""
        return {
            "world_size": self.world_size,
            "title": self.title,
            "ranks_reported": [report.rank for report in self.ranks],
            "ranks_missing": {str(rank): why for rank, why in self.missing.items()},
            "imbalance": {
                "ratio": self.ratio,
                "min_bytes": self.min_bytes,
                "flagged": [imbalance.to_dict() for imbalance in self.imbalances],
            },
            "leaked_ranks": self.leaked_ranks,
            "ranks": [report.to_dict() for report in self.ranks],
        }

    def to_json(self, **kwargs) -> str:
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "JobReport":
        return cls(
            [RankReport.from_dict(rank) for rank in data["ranks"]],
            data["world_size"],
            {int(rank): why for rank, why in data.get("ranks_missing", {}).items()},
            title=data.get("title"),
            ratio=data.get("imbalance", {}).get("ratio", DEFAULT_RATIO),
            min_bytes=data.get("imbalance", {}).get("min_bytes", DEFAULT_MIN_BYTES),
        )
