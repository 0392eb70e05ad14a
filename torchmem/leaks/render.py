"""A leak report as text: the summary line, then findings grouped as a reader scans them.

Findings that read the same (kind, device, tag, category, allocation lines, cycle) are one
group with their total size; leaks come first, largest first, each with its holders and the
allocation stack from the line the user wrote outward. While ``torchmem.track`` names a model
or optimizer, a group's first line says what its memory is (``category=gradients (Net.fc)``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import TYPE_CHECKING, Iterable

from torchmem._support.files import short_path, source_line
from torchmem._support.units import format_bytes
from torchmem.leaks.owners import Owner
from torchmem.leaks.kinds import ALLOWED, CYCLE, KINDS, LEAKED_KINDS, PENDING, REACHABLE
from torchmem.runtime.tags import UNTAGGED
from torchmem.stacks.frames import folds_runner_frames, is_library, is_marker, is_users_own

if TYPE_CHECKING:  # annotations only: the report module imports this one to render itself
    from torchmem.leaks.report import Finding, LeakReport

_STACK_LINES = 4  # frames shown under "allocated at", from the allocation site outward

_KIND_NOTES = {
    CYCLE: "reference cycle: freed only by gc",
    PENDING: "freed, waiting for other streams' events",
}


def _summary(report: LeakReport) -> str:
    if report.aborted is not None:
        return f"torchmem.leak_check: not analyzed, the checked code raised ({report.aborted})"
    if not report.finished:
        return "torchmem.leak_check: still running (the report is filled when the check exits)"
    leaked = _tally(report.leaked)
    uncounted = report.uncounted_cycles
    others = []
    if uncounted:
        others.append(f"cycle garbage not counted {_amount(uncounted)} (cycles={report.cycle_policy})")
    others += [f"{kind} {_amount(report.of_kind(kind))}" for kind in (PENDING, ALLOWED) if report.of_kind(kind)]
    if not leaked and report.unseen:
        # Never "no leaks" about memory the check could not see.
        return f"torchmem.leak_check: not checked: {report.unseen}" + (f"; also {', '.join(others)}" if others else "")
    if not leaked:
        head = "torchmem.leak_check: no leaks"
        if report.warmup:
            head += f" (warm-up entry {report.entry}: survivors are allowed)"
        return head + (f"; {', '.join(others)}" if others else "")
    blocks = sum(count for count, _ in leaked.values())
    parts = ", ".join(f"{kind} {format_bytes(size)} in {_blocks(count)}" for kind, (count, size) in leaked.items())
    head = (
        f"torchmem.leak_check: {format_bytes(report.leaked_bytes)} in {_blocks(blocks)} allocated inside "
        f"{'is' if blocks == 1 else 'are'} still alive ({parts})"
    )
    if report.max_leaked_bytes:
        head += f"; limit {format_bytes(report.max_leaked_bytes)}"
    if report.unseen:
        others.insert(0, f"not checked: {report.unseen}")
    return head + (f"; also {', '.join(others)}" if others else "")


def _tally(findings: list[Finding]) -> dict:
    """``{kind: (blocks, bytes)}`` in report order."""
    out: dict = {}
    for kind in KINDS:
        chosen = [finding for finding in findings if finding.kind == kind]
        if chosen:
            out[kind] = (len(chosen), sum(finding.size for finding in chosen))
    return out


def _amount(findings: list[Finding]) -> str:
    return f"{format_bytes(sum(finding.size for finding in findings))} in {_blocks(len(findings))}"


def _blocks(count: int) -> str:
    return f"{count} block{'s' if count != 1 else ''}"


def _group_key(finding: Finding) -> tuple:
    # Blocks that read the same in the report (same kind, device, tag, category, allocation
    # lines and cycle) are shown once, with their total size and their holders.
    return (finding.kind, finding.counted, finding.device, finding.tag, finding.category, finding.module,
            _stack_lines(finding), finding.cycle_types, finding.cycle, finding.note)


def _group_order(group: list[Finding]) -> tuple:
    # Leaks first (reachable and counted cycles together, largest first), then cycles not
    # counted, pending, allowed.
    first = group[0]
    rank = 0 if first.leaked else 1 if first.kind == CYCLE else 1 + KINDS.index(first.kind)
    return (rank, -sum(finding.size for finding in group))


def render_lines(report: LeakReport, max_groups: int) -> Iterable[str]:
    """The lines of ``report.render()``."""
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
    tag = first.tag if first.tag is not None else UNTAGGED
    kind = first.kind if first.counted else f"{first.kind}, not counted"
    yield f"  {amount}  {kind}  {first.device}  tag={tag}{category_label(first)}"
    explained = False
    if first.kind in LEAKED_KINDS or first.owners:
        explained = yield from _render_holders(group)
    if first.cycle:
        yield f"      cycle         {first.cycle}"
    if first.note and not explained:
        yield f"      {'why' if first.kind == CYCLE else 'note':<14}{first.note}"
    yield from _render_stack(first)


def category_label(finding: Finding) -> str:
    """``  category=gradients (Net.fc)`` while ``torchmem.track`` names a model or optimizer
    (the module when the block belongs to one); empty when nothing was tracked."""
    if finding.category is None:
        return ""
    return f"  category={finding.category}" + (f" ({finding.module})" if finding.module else "")


def _render_holders(group: list[Finding]):
    """The "held by" lines; returns True when they already said what the note says."""
    seen: dict[str, Owner] = {}
    for finding in group:
        for owner in finding.owners:
            seen.setdefault(owner.path, owner)
    note = _KIND_NOTES.get(group[0].kind)
    suffix = f"   ({note})" if note else ""
    if not seen:
        first = group[0]
        if first.kind == REACHABLE and first.note:
            yield f"      held by       ({first.note})"
            return True
        if first.kind == CYCLE:
            yield "      held by       garbage in which no tensor using it was found" + suffix
        else:
            yield "      held by       no holder found" + suffix
        return False
    owners = sorted(_fold_indices(list(seen.values())), key=lambda entry: len(entry[1]))  # shortest first
    shown = owners[:4]
    for index, (owner, path) in enumerate(shown):
        label = "held by" if index == 0 else ""
        where = f"   [{owner.location}]" if owner.location else ""
        unnamed = "   (no named root found above it)" if owner.kind == "unnamed" else ""
        yield f"      {label:<14}{path}{where}{unnamed}{suffix if index == 0 else ''}"
    if len(owners) > len(shown):
        yield f"      {'':<14}... and {len(owners) - len(shown)} more"
    return False


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
        if len(shown) == _STACK_LINES or folds_runner_frames(frame):
            break
        shown.append(frame)
    while shown and is_marker(shown[-1]):  # a fold at the end (what torch did inside) says little
        shown.pop()
    lines = []
    for frame in shown:
        if is_marker(frame):
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
    real_shown = [frame for frame in shown if not is_marker(frame)]
    if not real_shown or not all(is_library(frame) for frame in real_shown):
        return None
    for frame in frames[frames.index(real_shown[-1]) + 1:]:
        if folds_runner_frames(frame):
            return None  # the runner's frames: the user's code was not on the stack
        if is_users_own(frame):
            return frame
    return None


def _render_stack(finding: Finding) -> Iterable[str]:
    for index, line in enumerate(_stack_lines(finding)):
        yield f"      {'allocated at' if index == 0 else '':<14}{line}"
