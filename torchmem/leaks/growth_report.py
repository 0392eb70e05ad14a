"""What a ``GrowthMonitor`` reports: each tag, category and site it judged, and the text.

``Growth`` is one series and its verdict (slope, net bytes, rising steps, and why);
``GrowthReport`` holds the growing ones and the largest quiet ones, and renders them as
tables (``rich``, through ``torchmem._support.tables``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from torchmem.leaks.growth_trend import format_rate
from torchmem._support.files import source_line
from torchmem._support.tables import render_table
from torchmem._support.units import format_bytes

__all__ = ["Growth", "GrowthReport", "KINDS"]


@dataclass(frozen=True)
class Growth:
    """One tag, category or allocation site, and the verdict on its live bytes after warm-up.

    ``kind`` is ``"tag"``, ``"category"`` (``torchmem.track``'s categories, while tracking)
    or ``"site"``; ``name`` is the tag, the category, or ``file:line`` of the site
    (``frame`` is its ``Frame``). ``bytes_per_step`` is the least-squares slope over the
    measured steps (``slope_error`` its standard error), ``total_bytes`` the net change
    from the end of warm-up, ``rising_steps`` how many of the ``steps`` rose, ``allocation``
    the typical rise of one step. ``reason`` says why it is growth or why not. ``series``
    holds the last live-byte values from the end of warm-up on. ``category`` is, for a site,
    the category most of its live bytes are in (None when nothing is tracked).
    """

    kind: str
    device: str
    name: str
    bytes_per_step: float
    total_bytes: int
    steps: int
    series: tuple
    frame: object = None
    rising_steps: int = 0
    slope_error: float = 0.0
    allocation: int = 0
    reason: str = ""
    category: str | None = None
    growing: bool = True

    @property
    def rate(self) -> str:
        """``+32.0 KiB/step ± 239 B``: the slope, with its error when there is noise."""
        return format_rate(self.bytes_per_step, self.slope_error)

    def to_dict(self) -> dict:
        """Plain data for JSON."""
        frame = self.frame
        return {
            "kind": self.kind,
            "device": self.device,
            "name": self.name,
            "growing": self.growing,
            "bytes_per_step": self.bytes_per_step,
            "slope_error": self.slope_error,
            "total_bytes": self.total_bytes,
            "steps": self.steps,
            "rising_steps": self.rising_steps,
            "allocation": self.allocation,
            "reason": self.reason,
            "category": self.category,
            "series": list(self.series),
            "frame": None if frame is None else {"filename": frame.filename, "line": frame.line, "name": frame.name},
        }


# (kind, section title, column header), in the order a report shows them.
KINDS = (("tag", "per tag", "tag"), ("category", "per category", "category"), ("site", "per allocation site", "site"))


@dataclass
class GrowthReport:
    """What a ``GrowthMonitor`` saw: the tags, categories and sites whose live bytes grew
    over the steps after warm-up (``growing``), and the largest of those that rose without
    being a leak's trend (``considered``: each says why not)."""

    steps: int
    warmup: int
    min_steps: int
    measured_steps: int = 0
    growing: list = field(default_factory=list)
    considered: list = field(default_factory=list)
    # Devices the monitor watched that torchmem did not serve at some step: their memory
    # never reached its engines, so growth there could not be seen.
    unseen_devices: list = field(default_factory=list)
    devices: list = field(default_factory=list)

    @property
    def has_growth(self) -> bool:
        """True if any tag, category or site grew over the measured steps."""
        return bool(self.growing)

    @property
    def tags(self) -> list[Growth]:
        """The growing tags, largest growth first."""
        return [growth for growth in self.growing if growth.kind == "tag"]

    @property
    def categories(self) -> list[Growth]:
        """The growing categories (only while ``torchmem.track`` names a model or optimizer)."""
        return [growth for growth in self.growing if growth.kind == "category"]

    @property
    def sites(self) -> list[Growth]:
        """The growing allocation sites, largest growth first."""
        return [growth for growth in self.growing if growth.kind == "site"]

    def to_dict(self) -> dict:
        """Plain data: step counts, every growing tag, category and site, and the quiet ones considered."""
        return {
            "steps": self.steps,
            "warmup": self.warmup,
            "min_steps": self.min_steps,
            "measured_steps": self.measured_steps,
            "growing": [growth.to_dict() for growth in self.growing],
            "considered": [growth.to_dict() for growth in self.considered],
            "unseen_devices": list(self.unseen_devices),
        }

    def to_json(self, **kwargs) -> str:
        """``to_dict()`` as JSON (keyword arguments go to ``json.dumps``; indent 2 by default)."""
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def render(self) -> str:
        """The report as text: per tag, category and site, largest growth first, each with
        its slope, net bytes and the steps that rose; then what rose without a trend, and why."""
        measured = self.measured_steps
        after = f"{measured} steps after {self.warmup} warm-up step(s)"
        if measured < self.min_steps:
            return (
                f"torchmem.GrowthMonitor: {self.steps} step(s) seen, {self.warmup} of them warm-up; "
                f"at least {self.min_steps} measured steps are needed to judge growth"
            )
        seen = [device for device in self.devices if device not in self.unseen_devices]
        if self.unseen_devices and not seen:
            return f"torchmem.GrowthMonitor: cannot judge growth: {self._unseen()}"
        if not self.growing:
            lines = [f"torchmem.GrowthMonitor: no growth: no tag or allocation site kept growing over the {after}"]
        elif all(growth.rising_steps == growth.steps for growth in self.growing):
            lines = [f"torchmem.GrowthMonitor: live memory grew on every one of the {after}"]
        else:
            lines = [f"torchmem.GrowthMonitor: live memory grew over the {after}"]
        for kind, title, label in KINDS:
            entries = [growth for growth in self.growing if growth.kind == kind]
            if entries:
                lines.append(f"  {title}")
                lines.append(_table(entries, label))
        if self.considered:
            lines.append("  rose, but not a leak's trend (why not):")
            rows = [
                [f"+{format_bytes(g.total_bytes)}", g.device, _what(g), g.reason] for g in self.considered
            ]
            lines.append(render_table(["net", "device", "tag / site", "why not"], rows,
                                      justify=["right", "left", "left", "left"], indent="    "))
        if self.unseen_devices:
            lines.append(f"  not seen: {self._unseen()}")
        if self.growing:
            lines.append(
                "  growth: net gain of several allocations, a slope beyond noise, a rising floor, "
                "and still rising over the last third of the steps"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def _unseen(self) -> str:
        names = ", ".join(self.unseen_devices)
        kinds = sorted({device.split(":")[0] for device in self.unseen_devices})
        calls = " and ".join(f"torchmem.install({kind!r})" for kind in kinds)
        return (
            f"torchmem did not serve {names} while the monitor ran, so memory allocated there never "
            f"reached it; call {calls} before the loop (or run the script with `python -m torchmem run`)"
        )


def _what(growth: Growth) -> str:
    if growth.kind == "tag":
        return f"tag={growth.name}"
    if growth.kind == "category":
        return f"category={growth.name}"
    code = source_line(growth.frame.filename, growth.frame.line) if growth.frame else ""
    return f"{growth.name}  {code}".rstrip()


def _table(entries: list, label: str) -> str:
    with_category = label == "site" and any(growth.category for growth in entries)
    header = ["per step", "net", "rose on", "device"] + (["category"] if with_category else []) + [label]
    rows = []
    for growth in entries:
        row = [growth.rate, f"+{format_bytes(growth.total_bytes)} over {growth.steps} steps",
               f"{growth.rising_steps} of {growth.steps} steps", growth.device]
        if with_category:
            row.append(growth.category or "-")
        rows.append(row + [_what(growth)])
    justify = ["right", "right", "right", "left"] + (["left"] if with_category else []) + ["left"]
    return render_table(header, rows, justify=justify, indent="    ")
