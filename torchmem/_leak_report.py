"""What a leak check found: ``Finding``, ``LeakReport`` (text and JSON) and ``LeakError``."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from torchmem import _stack
from torchmem._leak_format import is_installed_package, format_bytes, is_stdlib, short_path, source_line
from torchmem._owners import Owner

# Kinds, in the order a report lists them. Only the first two count as leaked.
REACHABLE = "reachable"
CYCLE = "cycle"
PENDING = "pending"
ALLOWED = "allowed"
KINDS = (REACHABLE, CYCLE, PENDING, ALLOWED)
LEAKED_KINDS = (REACHABLE, CYCLE)
_STACK_LINES = 4  # frames shown under "allocated at", from the allocation site outward

_KIND_NOTES = {
    CYCLE: "reference cycle: freed only by gc",
    PENDING: "freed, waiting for other streams' events",
}


_is_marker = _stack.is_marker  # a Frame standing for folded frames
_is_internal = _stack.is_internal


def allocation_site(frames):
    """The frame a user reads as "allocated at": the innermost frame that is neither
    PyTorch's nor the standard library's (``copy.deepcopy`` is never the answer), else
    the innermost real frame; None for an empty stack. ``frames`` innermost first."""
    real = [frame for frame in frames if not _is_marker(frame)]
    for frame in real:
        if not _is_internal(frame) and not is_stdlib(frame.filename):
            return frame
    return real[0] if real else None


@dataclass(frozen=True)
class Finding:
    """One block allocated inside a leak check that was still allocated when it ended.

    ``kind``: ``"reachable"`` (still held after gc; ``owners`` name the holders),
    ``"cycle"`` (freed only by ``gc.collect()``: a reference cycle held it; ``cycle_types``
    and ``cycle`` describe the cycle), ``"pending"`` (freed, waiting for other streams'
    events) or ``"allowed"`` (``note`` says why). ``size`` is the block's (rounded) size,
    what the allocator holds; ``frames`` is the allocation's Python stack, user frames
    first with torch internals folded (empty when capture was off).
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

    @property
    def allocation_site(self):
        """The frame a user reads as "allocated at" (see ``allocation_site``)."""
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
    owner_search_stopped_early: bool = False
    aborted: str | None = None

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
        """Reachable and cycle-held findings: memory the checked code left behind."""
        return [finding for finding in self.findings if finding.kind in LEAKED_KINDS]

    @property
    def leaked_bytes(self) -> int:
        """Bytes (block sizes) of the reachable and cycle-held findings."""
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
        return "\n".join(_render(self, max_groups))

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


# --- rendering ------------------------------------------------------------------------


def _summary(report: LeakReport) -> str:
    totals = report.totals()
    if report.aborted is not None:
        return f"torchmem.leak_check: not analyzed, the checked code raised ({report.aborted})"
    if not report.finished:
        return "torchmem.leak_check: still running (the report is filled when the check exits)"
    leaked = [(kind, totals[kind]) for kind in LEAKED_KINDS if totals[kind]["blocks"]]
    others = [
        f"{kind} {format_bytes(totals[kind]['bytes'])} in {_blocks(totals[kind]['blocks'])}"
        for kind in (PENDING, ALLOWED) if totals[kind]["blocks"]
    ]
    if not leaked:
        head = "torchmem.leak_check: no leaks"
        if report.warmup:
            head += f" (warm-up entry {report.entry}: survivors are allowed)"
        return head + (f"; {', '.join(others)}" if others else "")
    blocks = sum(total["blocks"] for _, total in leaked)
    parts = ", ".join(f"{kind} {format_bytes(total['bytes'])} in {_blocks(total['blocks'])}" for kind, total in leaked)
    head = (
        f"torchmem.leak_check: {format_bytes(report.leaked_bytes)} in {_blocks(blocks)} allocated inside "
        f"{'is' if blocks == 1 else 'are'} still alive ({parts})"
    )
    if report.max_leaked_bytes:
        head += f"; limit {format_bytes(report.max_leaked_bytes)}"
    return head + (f"; also {', '.join(others)}" if others else "")


def _blocks(count: int) -> str:
    return f"{count} block{'s' if count != 1 else ''}"


def _group_key(finding: Finding) -> tuple:
    # Blocks that read the same in the report (same kind, device, tag, allocation lines and
    # cycle) are shown once, with their total size and their holders.
    return (finding.kind, finding.device, finding.tag, _stack_lines(finding), finding.cycle_types,
            finding.cycle, finding.note)


def _group_order(group: list[Finding]) -> tuple:
    # Leaks first (reachable and cycle-held together, largest first), then pending, allowed.
    kind = group[0].kind
    return (0 if kind in LEAKED_KINDS else KINDS.index(kind), -sum(finding.size for finding in group))


def _render(report: LeakReport, max_groups: int) -> Iterable[str]:
    yield _summary(report)
    groups: dict[tuple, list[Finding]] = defaultdict(list)
    for finding in report.findings:
        groups[_group_key(finding)].append(finding)
    ordered = sorted(groups.values(), key=_group_order)
    for position, group in enumerate(ordered):
        if position == max_groups:
            rest = len(ordered) - max_groups
            yield f"  ... and {rest} more group{'s' if rest != 1 else ''} (LeakReport.to_dict() lists every block)"
            break
        yield ""
        yield from _render_group(group)
    if report.owner_search_stopped_early:
        yield ""
        yield "  (the holder search stopped at its depth/time budget; some holders may be incomplete)"


def _render_group(group: list[Finding]) -> Iterable[str]:
    first = group[0]
    size = sum(finding.size for finding in group)
    amount = format_bytes(size) if len(group) == 1 else f"{format_bytes(size)} in {len(group)} blocks"
    tag = first.tag if first.tag is not None else "untagged"
    yield f"  {amount}  {first.kind}  {first.device}  tag={tag}"
    if first.kind in LEAKED_KINDS:
        yield from _render_holders(group)
    if first.cycle:
        yield f"      cycle         {first.cycle}"
    if first.note:
        yield f"      note          {first.note}"
    yield from _render_stack(first)


def _render_holders(group: list[Finding]) -> Iterable[str]:
    seen: dict[str, Owner] = {}
    for finding in group:
        for owner in finding.owners:
            seen.setdefault(owner.path, owner)
    note = _KIND_NOTES.get(group[0].kind)
    suffix = f"   ({note})" if note else ""
    if not seen:
        yield "      held by       no Python object refers to it (held from C++, e.g. by an autograd graph " \
              "or a C++ module)" + suffix
        return
    owners = sorted(_fold_indices(list(seen.values())), key=lambda entry: len(entry[1]))  # shortest first
    shown = owners[:4]
    for index, (owner, path) in enumerate(shown):
        label = "held by" if index == 0 else ""
        where = f"   [{owner.location}]" if owner.location else ""
        unnamed = "   (no named root found above it)" if owner.kind == "unnamed" else ""
        yield f"      {label:<14}{path}{where}{unnamed}{suffix if index == 0 else ''}"
    if len(owners) > len(shown):
        yield f"      {'':<14}... and {len(owners) - len(shown)} more"


_INDEX = re.compile(r"\[(\d+)\]")


def _fold_indices(owners: list[Owner]) -> list[tuple[Owner, str]]:
    """``losses[0]``, ``losses[1]``, ``losses[2]`` -> one line ``losses[0..2]``: paths that
    differ only in their last integer index are shown once."""
    groups: dict[tuple, list[tuple[int, Owner]]] = defaultdict(list)
    order: list[tuple] = []
    for owner in owners:
        matches = list(_INDEX.finditer(owner.path))
        if not matches:
            key = (owner.path, None, owner.kind, owner.location)
            value = 0
        else:
            last = matches[-1]
            key = (owner.path[:last.start()], owner.path[last.end():], owner.kind, owner.location)
            value = int(last.group(1))
        if key not in groups:
            order.append(key)
        groups[key].append((value, owner))
    out = []
    for key in order:
        members = groups[key]
        first = members[0][1]
        if len(members) == 1 or key[1] is None:
            out.extend((owner, owner.path) for _, owner in members)
            continue
        values = sorted(value for value, _ in members)
        contiguous = values == list(range(values[0], values[0] + len(values)))
        inner = f"{values[0]}..{values[-1]}" if contiguous else ", ".join(map(str, values))
        out.append((first, f"{key[0]}[{inner}]{key[1]}"))
    return out


def _stack_lines(finding: Finding) -> tuple[str, ...]:
    """The "allocated at" lines: the allocation site with its source, then the frames it was
    called from (folded torch frames included), up to the end of the user's code."""
    site = finding.allocation_site
    if site is None:
        return ("(no stack recorded: capture_stacks=False, or allocated before capture began)",)
    frames = list(finding.frames)
    shown = []
    for frame in frames[frames.index(site):]:
        # Folded runner frames (pytest, runpy, threading) mean the user's code ends here.
        if len(shown) == _STACK_LINES or (_is_marker(frame) and " internal frame" in frame.name):
            break
        shown.append(frame)
    while shown and _is_marker(shown[-1]):  # a fold at the end (what torch did inside) says little
        shown.pop()
    lines = []
    for frame in shown:
        if _is_marker(frame):
            lines.append(f"... {frame.name}")
            continue
        code = source_line(frame.filename, frame.line) if frame is site else ""
        lines.append(f"{short_path(frame.filename)}:{frame.line}  {code or 'in ' + frame.name + '()'}")
    caller = _first_own_code_caller(frames, shown)
    if caller is not None:
        lines.append(f"called from {short_path(caller.filename)}:{caller.line}  "
                     f"{source_line(caller.filename, caller.line) or 'in ' + caller.name + '()'}")
    return tuple(lines)


def _first_own_code_caller(frames: list, shown: list):
    """When every frame shown is an installed package's (torchmetrics, a trainer library),
    the frame where the user's own code called into them, if the stack reaches it:
    the line to change is usually there."""
    real_shown = [frame for frame in shown if not _is_marker(frame)]
    if not real_shown or not all(is_installed_package(frame.filename) for frame in real_shown):
        return None
    for frame in frames[frames.index(real_shown[-1]) + 1:]:
        if _is_marker(frame) and " internal frame" in frame.name:
            return None  # the runner's frames: the user's code was not on the stack
        if _is_marker(frame) or _is_internal(frame) or is_stdlib(frame.filename):
            continue
        if not is_installed_package(frame.filename):
            return frame
    return None


def _render_stack(finding: Finding) -> Iterable[str]:
    for index, line in enumerate(_stack_lines(finding)):
        yield f"      {'allocated at' if index == 0 else '':<14}{line}"
