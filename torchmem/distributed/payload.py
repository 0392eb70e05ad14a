"""What one rank sends: its memory figures, tags and leak findings, as plain data.

A ``RankReport`` is built from this process's torchmem (``collect``), travels as bytes
(``encode``/``decode``: compact JSON, zlib-compressed) through ``gather_object`` or the
launcher's store, and is rendered by rank 0 (``torchmem.distributed.job``).

Plain JSON rather than pickle so that ranks running different torchmem versions can still
read each other's header and say so (``PROTOCOL`` and the version come first), and so that
nothing a peer sends is executed. The size is bounded: at most ``max_tags`` tags per device
and ``max_findings`` leak groups (the rest are counted, not sent); ``docs/distributed.md`` ("Scale")
gives the measured bytes per tag and per finding.
"""

from __future__ import annotations

import json
import os
import socket
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torchmem

__all__ = ["PROTOCOL", "RankReport", "collect", "compact_leaks", "encode", "decode", "ProtocolMismatch"]

# Bumped when the meaning of a field changes; ranks with different protocols are refused.
PROTOCOL = 1
_MAGIC = b"TMD"  # torchmem distributed payload, followed by one byte: the protocol

DEFAULT_MAX_TAGS = 64
DEFAULT_MAX_FINDINGS = 20


class ProtocolMismatch(ValueError):
    """A payload from a torchmem that speaks another protocol (or is not a payload at all)."""


@dataclass
class RankReport:
    """One rank's memory as rank 0 needs it for the job report.

    ``devices`` maps a device name (``"cpu"``, ``"cuda:0"``) to its figures: ``allocated_peak``,
    ``allocated_current``, ``reserved_peak``, ``reserved_current``, ``free_bytes`` (free in
    torchmem's cache), ``largest_free_block``, ``external_fragmentation`` (0..1), ``ooms``,
    ``alloc_retries``, and ``tags``: ``[name, current, peak, live_blocks, allocations]`` rows,
    largest peak first (``tags_dropped`` counts those beyond ``max_tags``).
    ``leaks`` is ``compact_leaks(report)`` or None when no leak check ran; ``growth`` a
    ``GrowthReport.to_dict()`` or None. ``status`` says how the rank ended when that matters
    ("terminated by SIGTERM"); ``files`` lists what the rank wrote (snapshot, JSON).
    """

    rank: int
    world_size: int
    host: str = ""
    pid: int = 0
    torchmem_version: str = ""
    devices: dict = field(default_factory=dict)
    leaks: dict | None = None
    growth: dict | None = None
    exit_code: int | None = None
    status: str | None = None
    files: dict = field(default_factory=dict)

    @property
    def leaked_blocks(self) -> int | None:
        """Leaked (reachable + cycle) blocks, None when no leak check ran on this rank."""
        return None if self.leaks is None else self.leaks["leaked_blocks"]

    @property
    def leaked_bytes(self) -> int | None:
        return None if self.leaks is None else self.leaks["leaked_bytes"]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RankReport":
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


def collect(
    *,
    rank: int,
    world_size: int,
    devices=None,
    leaks=None,
    growth=None,
    summary: dict | None = None,
    max_tags: int = DEFAULT_MAX_TAGS,
    max_findings: int = DEFAULT_MAX_FINDINGS,
) -> RankReport:
    """This process's ``RankReport``: figures of every device torchmem serves (or ``devices``),
    plus the leak report (``LeakReport``) and growth report (``GrowthReport``) if given.
    ``summary``: a ``torchmem.summary(format="dict")`` taken earlier, to report that moment."""
    if summary is None:
        from torchmem.reports.summary import summary_dict

        summary = summary_dict(devices)
    return RankReport(
        rank=rank,
        world_size=world_size,
        host=socket.gethostname(),
        pid=os.getpid(),
        torchmem_version=torchmem.__version__,
        devices={name: _device_figures(figures, max_tags) for name, figures in summary["devices"].items()},
        leaks=None if leaks is None else compact_leaks(leaks, max_findings),
        growth=None if growth is None else growth.to_dict(),
    )


def _device_figures(device: dict, max_tags: int) -> dict:
    tags = sorted(device["tags"], key=lambda tag: (-tag["peak_bytes"], tag["tag"]))
    fragmentation = device["fragmentation"]
    return {
        "allocated_peak": device["allocated"]["peak"],
        "allocated_current": device["allocated"]["current"],
        "reserved_peak": device["reserved"]["peak"],
        "reserved_current": device["reserved"]["current"],
        "free_bytes": fragmentation["free_bytes"],
        "largest_free_block": fragmentation["largest_free_block"],
        "external_fragmentation": round(fragmentation["external_fragmentation"], 4),
        "ooms": device["ooms"],
        "alloc_retries": device["alloc_retries"],
        "tags": [
            [tag["tag"], tag["current_bytes"], tag["peak_bytes"], tag["live_blocks"], tag["allocations"]]
            for tag in tags[:max_tags]
        ],
        "tags_dropped": max(0, len(tags) - max_tags),
    }


def compact_leaks(report, max_findings: int = DEFAULT_MAX_FINDINGS) -> dict:
    """A ``LeakReport`` as the job report needs it: totals, the decision, the rank's own
    rendered report (``text``, at most ``max_findings`` groups) and the leaked blocks grouped
    by (kind, device, tag, allocation site) with their first holder, largest first;
    ``by_device`` gives ``[blocks, bytes]`` leaked per device."""
    groups: dict[tuple, dict] = defaultdict(lambda: {"bytes": 0, "blocks": 0, "holder": None})
    for finding in report.leaked:
        site = finding.allocation_site
        where = None if site is None else f"{site.filename}:{site.line}"
        group = groups[(finding.kind, finding.device, finding.tag or "untagged", where)]
        group["bytes"] += finding.size
        group["blocks"] += 1
        if group["holder"] is None and finding.owners:
            group["holder"] = finding.owners[0].path
    ordered = sorted(groups.items(), key=lambda item: -item[1]["bytes"])
    totals = report.totals()
    leaked = report.leaked
    by_device: dict[str, list[int]] = {}
    for finding in leaked:
        blocks_bytes = by_device.setdefault(finding.device, [0, 0])
        blocks_bytes[0] += 1
        blocks_bytes[1] += finding.size
    return {
        "leaked_bytes": report.leaked_bytes,
        "leaked_blocks": len(leaked),
        "max_leaked_bytes": report.max_leaked_bytes,
        "exceeds_limit": bool(report.exceeds_limit and not report.warmup),
        "warmup": report.warmup,
        "aborted": report.aborted,
        "totals": {kind: [total["blocks"], total["bytes"]] for kind, total in totals.items()},
        "by_device": by_device,
        "groups": [
            {"kind": kind, "device": device, "tag": tag, "site": site, **values}
            for (kind, device, tag, site), values in ordered[:max_findings]
        ],
        "groups_dropped": max(0, len(ordered) - max_findings),
        "text": report.render(max_groups=max_findings),
    }


def encode(data: dict) -> bytes:
    """``data`` (plain JSON types) as the bytes a rank sends."""
    body = json.dumps(data, separators=(",", ":"), sort_keys=False).encode()
    return _MAGIC + bytes([PROTOCOL]) + zlib.compress(body, 6)


def decode(payload: bytes) -> dict:
    """The dict a peer ``encode``-d; ``ProtocolMismatch`` if it speaks another protocol."""
    if not isinstance(payload, (bytes, bytearray)) or payload[: len(_MAGIC)] != _MAGIC or len(payload) < 4:
        raise ProtocolMismatch(
            "not a torchmem.distributed payload (a rank runs a torchmem without distributed support, "
            "or something else wrote torchmem's keys)"
        )
    protocol = payload[len(_MAGIC)]
    if protocol != PROTOCOL:
        raise ProtocolMismatch(
            f"the payload uses torchmem.distributed protocol {protocol}, this rank speaks {PROTOCOL}"
        )
    return json.loads(zlib.decompress(payload[len(_MAGIC) + 1 :]))
