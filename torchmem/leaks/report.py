"""What a leak check found: ``Finding``, ``LeakReport`` (text and JSON) and ``LeakError``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from torchmem.leaks.kinds import ALLOWED, CYCLE, KINDS, LEAKED_KINDS, PENDING, REACHABLE
from torchmem.leaks.render import render_lines
from torchmem.stacks.frames import allocation_site

__all__ = ["Finding", "LeakReport", "LeakError", "REACHABLE", "CYCLE", "PENDING", "ALLOWED", "KINDS", "LEAKED_KINDS"]


@dataclass(frozen=True)
class Finding:
    """One block allocated inside a leak check that was still allocated when it ended.

    ``kind``: ``"reachable"`` (still held after gc; ``owners`` name the holders),
    ``"cycle"`` (freed only by ``gc.collect()``: a reference cycle held it; ``cycle_types``
    and ``cycle`` describe the cycle), ``"pending"`` (freed, waiting for other streams'
    events) or ``"allowed"`` (``note`` says why). ``counted`` is False for cycle-held
    blocks the cycle policy does not count as leaked (``torchmem.leaks.cycle_policy``;
    ``note`` says why). ``size`` is the block's (rounded) size,
    what the allocator holds; ``frames`` is the allocation's Python stack, user frames
    first with torch internals folded (empty when capture was off). ``category`` is what the
    block is while ``torchmem.track`` names a model or optimizer (``"parameters"``,
    ``"gradients"``, ``"optimizer_state"``, ``"activations"`` or ``"other"``; None when
    nothing is tracked), ``module`` the tracked module it belongs to, when known.
    """

    kind: str
    device: str
    address: int
    size: int
    requested_size: int
    tag: str | None
    stream: int
    frames: tuple = ()
    owners: tuple = ()
    cycle_types: tuple = ()
    sequence: int = 0
    cycle: str | None = None
    note: str | None = None
    counted: bool = True
    context: int = 0
    category: str | None = None
    module: str | None = None

    @property
    def leaked(self) -> bool:
        """True if this block counts as leaked: reachable, or cycle-held and counted."""
        return self.kind in LEAKED_KINDS and self.counted

    @property
    def allocation_site(self):
        """The frame a user reads as "allocated at" (see ``torchmem.stacks.frames.allocation_site``)."""
        return allocation_site(self.frames)

    def to_dict(self) -> dict:
        """Plain data for JSON."""
        return {
            "kind": self.kind,
            "device": self.device,
            "address": self.address,
            "size": self.size,
            "requested_size": self.requested_size,
            "tag": self.tag,
            "stream": self.stream,
            "sequence": self.sequence,
            "frames": [{"filename": f.filename, "line": f.line, "name": f.name} for f in self.frames],
            "owners": [owner.to_dict() for owner in self.owners],
            "cycle_types": list(self.cycle_types),
            "cycle": self.cycle,
            "note": self.note,
            "counted": self.counted,
            "category": self.category,
            "module": self.module,
        }


@dataclass
class LeakReport:
    """Everything one leak-check entry found. Filled when the check exits.

    ``with torchmem.leak_check(raise_on_leak=False) as report: ...`` hands it out
    before it is filled; read it after the block.
    """

    entry: int = 1
    warmup: bool = False
    max_leaked_bytes: int = 0
    findings: list = field(default_factory=list)
    finished: bool = False
    gc_collected: bool = False
    # (passes over the heap, objects examined) when the garbage above the blocks left decided
    # them without collecting the whole heap (``collector.garbage_above``); None otherwise.
    subset_collection: tuple | None = None
    owner_search_stopped_early: bool = False
    aborted: str | None = None
    cycle_policy: str = "repeating"
    unseen: str | None = None  # memory allocated inside that the check could not see, and why
    analysis_seconds: float = 0.0  # wall time of the exit's analysis (collections, owner search)
    analysis_cpu_seconds: float = 0.0  # the analysing thread's CPU time (less sensitive to load)

    # --- queries ------------------------------------------------------------------
    def of_kind(self, kind: str) -> list[Finding]:
        """Findings of one kind (``"reachable"``, ``"cycle"``, ``"pending"``, ``"allowed"``)."""
        if kind not in KINDS:
            raise ValueError(f"LeakReport.of_kind: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        return [finding for finding in self.findings if finding.kind == kind]

    @property
    def reachable(self) -> list[Finding]:
        """Blocks still held after garbage collection."""
        return self.of_kind(REACHABLE)

    @property
    def cycle(self) -> list[Finding]:
        """Blocks that only ``gc.collect()`` freed: held by reference cycles."""
        return self.of_kind(CYCLE)

    @property
    def pending(self) -> list[Finding]:
        """Blocks freed but waiting for other streams' events (not leaks)."""
        return self.of_kind(PENDING)

    @property
    def allowed(self) -> list[Finding]:
        """Expected survivors: allowed tags, ``expect_alive``, returned values, warm-up."""
        return self.of_kind(ALLOWED)

    @property
    def leaked(self) -> list[Finding]:
        """Memory the checked code left behind: reachable findings, and the cycle-held ones
        the cycle policy counts."""
        return [finding for finding in self.findings if finding.leaked]

    @property
    def uncounted_cycles(self) -> list[Finding]:
        """Cycle-held blocks the cycle policy did not count (each ``note`` says why)."""
        return [finding for finding in self.findings if finding.kind == CYCLE and not finding.counted]

    @property
    def leaked_bytes(self) -> int:
        """Bytes (block sizes) of the leaked findings."""
        return sum(finding.size for finding in self.leaked)

    @property
    def has_leaks(self) -> bool:
        """True if any block was leaked (regardless of ``max_leaked_bytes``)."""
        return bool(self.leaked)

    @property
    def exceeds_limit(self) -> bool:
        """True if leaked bytes exceed ``max_leaked_bytes`` (what makes a check raise)."""
        return self.leaked_bytes > self.max_leaked_bytes

    def totals(self) -> dict[str, dict[str, int]]:
        """``{kind: {"blocks": n, "bytes": b}}`` for every kind."""
        out = {kind: {"blocks": 0, "bytes": 0} for kind in KINDS}
        for finding in self.findings:
            out[finding.kind]["blocks"] += 1
            out[finding.kind]["bytes"] += finding.size
        return out

    # --- output -------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain data: totals, flags and every finding."""
        return {
            "entry": self.entry,
            "warmup": self.warmup,
            "finished": self.finished,
            "aborted": self.aborted,
            "gc_collected": self.gc_collected,
            "owner_search_stopped_early": self.owner_search_stopped_early,
            "cycle_policy": self.cycle_policy,
            "unseen": self.unseen,
            "analysis_seconds": self.analysis_seconds,
            "analysis_cpu_seconds": self.analysis_cpu_seconds,
            "max_leaked_bytes": self.max_leaked_bytes,
            "leaked_bytes": self.leaked_bytes,
            "totals": self.totals(),
            "findings": [finding.to_dict() for finding in self.findings],
        }

    def to_json(self, **kwargs) -> str:
        """``to_dict()`` as JSON (keyword arguments go to ``json.dumps``; indent 2 by default)."""
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def render(self, max_groups: int = 20) -> str:
        """The report as text: a summary line, then findings grouped by kind, device, tag
        and allocation site (largest first), each with holders and the allocation stack."""
        return "\n".join(render_lines(self, max_groups))

    def __str__(self) -> str:
        return self.render()


class LeakError(AssertionError):
    """Raised by ``torchmem.leak_check`` when blocks allocated inside leaked (more bytes than
    ``max_leaked_bytes``). ``.report`` is the ``LeakReport``; the message is its text.

    An ``AssertionError``, so test runners report it as a failed assertion.
    """

    def __init__(self, report: LeakReport):
        super().__init__(report.render())
        self.report = report
