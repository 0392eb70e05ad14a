"""``torchmem.GrowthMonitor``: memory that keeps growing across the iterations of a loop.

A leak check needs a region that should end clean; a training loop never does (its
caches, optimizer state, logged history). What gives a slow leak away in a loop is live
memory that keeps rising once warm-up is over, even when it does not rise on every step
(something kept every N steps, a cache that misses sometimes, noise from temporaries)::

    monitor = torchmem.GrowthMonitor(warmup=2)
    for batch in loader:
        train_step(batch)
        monitor.step()
    print(monitor.report().render())

The verdict comes from the trend over all the steps after warm-up, not step by step
(``torchmem.leaks.growth_trend``): net growth of several allocations, a least-squares
slope beyond noise, a rising floor, and still rising over the last third of the steps. A
cache that fills and then stays flat, an optimizer creating its state, memory that rises
and falls back are not growth; the report shows each decision's slope, net bytes and
rising steps, and for the largest quiet series why they are not growth.

Each ``step()`` samples live bytes per tag (``torchmem.tag``; ``untagged`` for the rest)
and per allocation site: live blocks grouped by the line that allocated them (the
innermost frame outside PyTorch and the standard library). Stack capture is on while the
monitor runs, so sites are known for blocks allocated since it started.

Per-step cost: one ``tag_stats()`` per device (a few microseconds) and, with
``by_site=True``, one pass over the engine's live blocks (``allocated_blocks()``: about
2 µs per live block, i.e. ~9 ms per step with 5,000 live blocks, measured on a busy 2-core
machine) plus symbolizing stacks not seen before (once per distinct stack). With
``by_site=False`` a step costs about 5 µs. While the monitor runs, stack capture is on:
a fraction of a microsecond per allocation (see ``torchmem.stacks.capture``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from torchmem.runtime import devices as _devices
from torchmem.runtime import install as _install
from torchmem.leaks.growth_trend import Series, format_rate, judge
from torchmem.leaks.tensors import device_key
from torchmem.reports import categories as _categories
from torchmem.stacks import capture as stack_capture
from torchmem.stacks import frames as stack_frames
from torchmem._support.units import format_bytes
from torchmem._support.files import short_path, source_line
from torchmem._support.tables import render_table
from torchmem.stacks.frames import allocation_site

__all__ = ["GrowthMonitor", "GrowthReport", "Growth"]


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


_KINDS = (("tag", "per tag", "tag"), ("category", "per category", "category"), ("site", "per allocation site", "site"))
_MAX_CONSIDERED = 5  # quiet series shown with why they are not growth


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
        for kind, title, label in _KINDS:
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


class GrowthMonitor:
    """Samples live bytes per tag and per allocation site once per loop iteration.

    Args:
        warmup: steps whose growth is expected (first batches build caches, optimizer
            state, ...); growth is judged from the end of warm-up on.
        devices: devices to watch (``"cpu"``, ``"cuda:0"``, ...); default every device
            torchmem serves.
        by_site: also group live blocks by allocation site (turns stack capture on while
            the monitor runs). Off, a step is only a ``tag_stats()`` call per device.
        min_steps: steps after warm-up needed before anything is reported as growing.

    Call ``step()`` at the end of every iteration; ``report()`` any time. Usable as a
    context manager (``with GrowthMonitor() as monitor:``), which stops stack capture on
    exit; otherwise call ``stop()`` when done.
    """

    def __init__(self, warmup: int = 2, devices=None, *, by_site: bool = True, min_steps: int = 2):
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"torchmem.GrowthMonitor: warmup must be an int >= 0 (steps), got {warmup!r}")
        if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 1:
            raise ValueError(f"torchmem.GrowthMonitor: min_steps must be an int >= 1, got {min_steps!r}")
        self.warmup = warmup
        self.min_steps = min_steps
        self.by_site = bool(by_site)
        names = _devices.default_devices() if devices is None else (
            [devices] if isinstance(devices, (str, int)) or not hasattr(devices, "__iter__") else list(devices)
        )
        self.devices = [device_key(_devices.normalize(name)) for name in names]
        self.steps = 0
        # key -> Series of its live bytes from the baseline on; key is ("tag", device, tag),
        # ("category", device, category) or ("site", device, Frame)
        self._trends: dict[tuple, Series] = {}
        self._site_category: dict[tuple, str] = {}  # site key -> its main category at the latest sample
        self._samples = 0
        self._site_of_context: dict[int, object] = {}
        self._capture = None
        self._started = False
        self._sampled_at_start = False  # a sample before the first step (start() called first)
        self._unseen: set[str] = set()  # devices torchmem did not serve at some sample

    # --- lifetime ---------------------------------------------------------------------
    def start(self) -> "GrowthMonitor":
        """Starts capture (with ``by_site``) and samples the memory before the first step.
        Idempotent. Without it the first ``step()`` starts the monitor, and the loop's
        first iteration serves as the baseline (one step fewer is measured)."""
        return self._start(sample=True)

    def _start(self, *, sample: bool) -> "GrowthMonitor":
        if self._started:
            return self
        if self.by_site:
            self._capture = stack_capture.capturing()
            self._capture.__enter__()
        self._started = True
        if sample:
            self._sampled_at_start = True
            self._sample()
        return self

    def stop(self) -> None:
        """Stops stack capture. Samples so far are kept; ``report()`` still works."""
        if self._capture is not None:
            capture, self._capture = self._capture, None
            capture.__exit__(None, None, None)

    def __enter__(self) -> "GrowthMonitor":
        return self.start()

    def __exit__(self, *exc_info) -> bool:
        self.stop()
        return False

    # --- sampling ---------------------------------------------------------------------
    def step(self) -> None:
        """Records live bytes after one iteration. Call it once per iteration, at the same
        point of the loop each time."""
        if not self._started:
            self._start(sample=False)
        self.steps += 1
        self._sample()

    def _sample(self) -> None:
        # Sample k is taken after step k (sample 0 before the first step, when start() was
        # called); growth is judged from the sample at the end of warm-up (the baseline) on,
        # so earlier samples cost nothing.
        baseline = self._baseline()
        sample, self._samples = self._samples, self._samples + 1
        if sample < baseline:
            return
        values: dict[tuple, int] = {}
        site_categories: dict[tuple, dict[str, int]] = {}
        for device in self.devices:
            if not _install.is_installed(device):
                self._unseen.add(device)
                continue
            engine = _devices.engine(device)
            for row in engine.tag_stats():
                values[("tag", device, row["tag"])] = row["current_bytes"]
            if self.by_site:
                self._sample_blocks(engine, device, values, site_categories)
        for key, value in values.items():
            if key not in self._trends:
                # First seen now: it had no live bytes at the samples since the baseline.
                self._trends[key] = series = Series()
                series.pad(sample - baseline)
        for key, series in self._trends.items():
            series.add(values.get(key, 0))
        for key, by_category in site_categories.items():
            self._site_category[key] = max(by_category, key=by_category.get)

    def _sample_blocks(self, engine, device: str, values: dict, site_categories: dict) -> None:
        """Live bytes per allocation site and, while ``torchmem.track`` names a model or an
        optimizer, per category (parameters, gradients, optimizer state, ...)."""
        storages = _categories.classify_storages() if _categories.is_tracking() else None
        for block in engine.allocated_blocks():
            category = None
            if storages is not None:
                category = storages.get((device, block["address"]), (_categories.OTHER,))[0]
                key = ("category", device, category)
                values[key] = values.get(key, 0) + block["size"]
            site = self._site(block["context"])
            if site is not None:
                key = ("site", device, site)
                values[key] = values.get(key, 0) + block["size"]
                if category is not None:
                    tally = site_categories.setdefault(key, {})
                    tally[category] = tally.get(category, 0) + block["size"]

    def _baseline(self) -> int:
        return self.warmup if self._sampled_at_start else max(self.warmup - 1, 0)

    def _site(self, context: int):
        if not context:
            return None
        site = self._site_of_context.get(context, _UNKNOWN)
        if site is _UNKNOWN:
            site = self._site_of_context[context] = allocation_site(stack_frames.frames(context))
        return site

    # --- judging ----------------------------------------------------------------------
    def report(self) -> GrowthReport:
        """Tags, categories and sites whose live bytes grew over the steps after warm-up (see
        ``torchmem.leaks.growth_trend`` for the rule), judged once at least ``min_steps``
        steps are measured; with the largest quiet ones that rose, each saying why not."""
        measured = max(self._samples - self._baseline() - 1, 0)
        report = GrowthReport(
            steps=self.steps, warmup=self.warmup, min_steps=self.min_steps, measured_steps=measured,
            unseen_devices=[device for device in self.devices if device in self._unseen], devices=list(self.devices),
        )
        if measured < self.min_steps:
            return report
        considered = []
        for key, series in self._trends.items():
            if series.steps < 1 or series.last <= series.first:
                continue
            verdict = judge(series)
            growth = self._growth(key, series, verdict)
            (report.growing if verdict.growing else considered).append(growth)
        order = {kind: index for index, (kind, _, _) in enumerate(_KINDS)}
        report.growing.sort(key=lambda growth: (order[growth.kind], -growth.total_bytes))
        considered.sort(key=lambda growth: -growth.total_bytes)
        report.considered = considered[:_MAX_CONSIDERED]
        return report

    def _growth(self, key: tuple, series: Series, verdict) -> Growth:
        kind, device, what = key
        if kind == "site":
            name, frame = f"{short_path(what.filename)}:{what.line}", what
        else:
            name, frame = what, None
        return Growth(
            kind=kind, device=device, name=name, bytes_per_step=verdict.slope, total_bytes=verdict.net_bytes,
            steps=verdict.steps, series=tuple(series.recent), frame=frame, rising_steps=verdict.rising_steps,
            slope_error=verdict.slope_error, allocation=verdict.allocation, reason=verdict.reason,
            category=self._site_category.get(key), growing=verdict.growing,
        )


_UNKNOWN = object()
