"""What changed between two captures, by allocation site or by tag.

Modelled on ``tracemalloc.Snapshot.compare_to``: ``new.compare_to(old, "site")`` returns
one :class:`Difference` per site (or tag) present in either capture, the biggest change
of live bytes first, each with the sizes and block counts before and after::

    for difference in new.compare_to(old, "site")[:10]:
        print(difference)
    # +12.0 MiB (48.0 MiB -> 60.0 MiB), +3 blocks  train.py:42 in step  cache.append(x)

Live bytes are the blocks alive when each capture was taken (requested sizes) on every
device of the capture; a site's identity is its file (as the report shows it), line and
function, so the two captures may come from different runs of the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmem._support.tables import render_table
from torchmem._support.units import format_bytes

__all__ = ["Difference", "compare", "render"]

BY = ("site", "tag")


@dataclass(frozen=True)
class Difference:
    """One site (or tag) compared: ``key`` names it; sizes in bytes."""

    key: str
    old_bytes: int
    new_bytes: int
    old_blocks: int
    new_blocks: int
    source: str = ""

    @property
    def size_diff(self) -> int:
        return self.new_bytes - self.old_bytes

    @property
    def count_diff(self) -> int:
        return self.new_blocks - self.old_blocks

    def __str__(self) -> str:
        sign = "+" if self.size_diff >= 0 else "-"
        text = (f"{sign}{format_bytes(abs(self.size_diff))} ({format_bytes(self.old_bytes)} -> "
                f"{format_bytes(self.new_bytes)}), {self.count_diff:+,} blocks  {self.key}")
        return text + (f"  {self.source}" if self.source else "")

    def to_dict(self) -> dict:
        return {"key": self.key, "old_bytes": self.old_bytes, "new_bytes": self.new_bytes,
                "size_diff": self.size_diff, "old_blocks": self.old_blocks, "new_blocks": self.new_blocks,
                "count_diff": self.count_diff, "source": self.source}


def _totals(capture, by: str) -> dict[str, tuple[int, int, str]]:
    """``{key: (bytes, blocks, source)}`` of the live blocks of every device (every rank)."""
    from torchmem.reports import sites

    out: dict[str, list] = {}
    parts = capture.ranks or [capture]
    for part in parts:
        data = part.data
        for figures in data["devices"].values():
            blocks = figures["blocks"]
            for size, stack, tag in zip(blocks["requested"], blocks["stack"], blocks["tag"]):
                if by == "tag":
                    key, source = tag or "untagged", ""
                else:
                    filename, line, function = sites.site_of_stack(data, stack)
                    key = f"{filename}:{line} in {function}" if line else filename
                    source = next((f["source"] for f in sites.frames_of(data, stack)
                                   if (f["filename"], f["line"]) == (filename, line)), "")
                entry = out.setdefault(key, [0, 0, source])
                entry[0] += size
                entry[1] += 1
    return {key: (value[0], value[1], value[2]) for key, value in out.items()}


def compare(old, new, by: str = "site") -> list[Difference]:
    """``new`` against ``old`` (two ``Capture`` objects), largest absolute change first."""
    if by not in BY:
        raise ValueError(f"torchmem capture compare: by must be one of {', '.join(map(repr, BY))}, got {by!r}")
    before, after = _totals(old, by), _totals(new, by)
    differences = []
    for key in set(before) | set(after):
        old_bytes, old_blocks, old_source = before.get(key, (0, 0, ""))
        new_bytes, new_blocks, new_source = after.get(key, (0, 0, ""))
        differences.append(Difference(key, old_bytes, new_bytes, old_blocks, new_blocks, new_source or old_source))
    differences.sort(key=lambda d: (-abs(d.size_diff), -d.new_bytes, d.key))
    return differences


def render(differences: list[Difference], by: str, old_label: str, new_label: str, top: int = 20) -> str:
    """The comparison as a text table (changes only; unchanged entries are left out)."""
    changed = [d for d in differences if d.size_diff or d.count_diff]
    lines = [f"torchmem diff by {by}: {new_label} against {old_label}"]
    if not changed:
        lines.append("  no change in live memory")
        return "\n".join(lines)
    grown = sum(d.size_diff for d in changed)
    lines.append(f"  live memory {'+' if grown >= 0 else '-'}{format_bytes(abs(grown))} in total, "
                 f"{len(changed)} {by}{'s' if len(changed) != 1 else ''} changed")
    rows = []
    for d in changed[:top]:
        sign = "+" if d.size_diff >= 0 else "-"
        name = d.key + (f"  {d.source}" if d.source else "")
        rows.append([f"{sign}{format_bytes(abs(d.size_diff))}", format_bytes(d.old_bytes), format_bytes(d.new_bytes),
                     f"{d.count_diff:+,}", name])
    lines.append(render_table(["change", "before", "after", "blocks", by], rows,
                              justify=["right", "right", "right", "right", "left"]))
    if len(changed) > top:
        lines.append(f"  ... {len(changed) - top} more")
    return "\n".join(lines)
