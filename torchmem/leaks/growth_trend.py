"""Is this series of live bytes a leak's trend? The decision behind ``GrowthMonitor``.

A leak in a training loop rarely adds memory on every step: it keeps something every N
steps (logging), when a cache misses, on all steps but the one that reuses a buffer; the
same tag also carries temporaries whose size varies from step to step. Memory that is
*not* a leak rises too, for a while: a cache that fills and then stays full, an optimizer
creating its state on its first step, buffers that accumulate and are flushed.

So the verdict is taken from the whole window after warm-up, not step by step. A series
grows when all of these hold (each failure is the reason given for a quiet series):

1. **net growth of several allocations**: it ends at least ``min(3, steps)`` times its
   typical step increase (the median rise between samples) above where it started: one
   lazily created buffer (optimizer state) is one allocation, not a trend;
2. **a trend beyond noise**: the least-squares slope over the window is positive and at
   least ``3`` standard errors: memory that only jitters has a slope within its errors;
3. **a rising floor**: the lowest value of the window's last third is above the lowest of
   its first third: memory that rises and falls back (accumulate, flush) does not;
4. **still growing**: over the window's last third (at least 3 samples) the slope is
   positive beyond noise too, and that third adds at least one typical increase: a cache
   that filled and then stayed flat has stopped.

Memory is bounded however long the loop runs: the window keeps at most ``MAX_POINTS``
samples, evenly spaced (every second one is dropped when it fills, so a long loop is seen
at a coarser stride), with exact counts of steps and rising steps beside it.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass

from torchmem._support.units import format_bytes

__all__ = ["Series", "Verdict", "judge", "format_rate", "MIN_ALLOCATIONS", "SLOPE_ERRORS"]

MIN_ALLOCATIONS = 3  # net growth, in typical step increases, that makes a trend (fewer steps: all of them)
SLOPE_ERRORS = 3.0  # how many standard errors the slope must stand above zero


class Series:
    """Live bytes of one tag or site at the samples from the baseline (the end of warm-up)
    on. ``add`` one value per sample; a key first seen later is ``padded`` with zeros."""

    MAX_POINTS = 256
    RECENT = 64

    def __init__(self) -> None:
        self.samples = 0  # values added since the baseline
        self.first = 0
        self.last = 0
        self.rising_steps = 0  # steps whose value was above the previous one
        self.stride = 1
        self.points: list[tuple[int, int]] = []  # (sample since baseline, value), every stride-th sample
        self.recent: collections.deque[int] = collections.deque(maxlen=self.RECENT)

    def pad(self, samples: int) -> None:
        """``samples`` values of 0: the samples at which the key had no live bytes yet."""
        for _ in range(samples):
            self.add(0)

    def add(self, value: int) -> None:
        index = self.samples
        if index == 0:
            self.first = value
        elif value > self.last:
            self.rising_steps += 1
        self.last = value
        self.samples += 1
        self.recent.append(value)
        if index % self.stride == 0:
            self.points.append((index, value))
            if len(self.points) > self.MAX_POINTS:
                self.points = self.points[::2]
                self.stride *= 2

    @property
    def steps(self) -> int:
        """Steps measured: the samples after the baseline."""
        return max(self.samples - 1, 0)

    def window(self) -> list[tuple[int, int]]:
        """The kept samples, the latest always among them."""
        if self.points and self.points[-1][0] != self.samples - 1:
            return self.points + [(self.samples - 1, self.last)]
        return list(self.points)


@dataclass(frozen=True)
class Verdict:
    """Why a series is (or is not) growth. ``slope`` and ``slope_error`` are bytes per step
    (least squares over the window); ``allocation`` the typical step increase."""

    growing: bool
    reason: str
    steps: int
    rising_steps: int
    net_bytes: int
    slope: float
    slope_error: float
    allocation: int


def _fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares slope and its standard error, in exact integer arithmetic until the
    last division (a series that rises by the same amount every step has exactly that slope)."""
    n = len(points)
    sum_x = sum(x for x, _ in points)
    sum_y = sum(y for _, y in points)
    sxx = n * sum(x * x for x, _ in points) - sum_x * sum_x
    sxy = n * sum(x * y for x, y in points) - sum_x * sum_y
    syy = n * sum(y * y for _, y in points) - sum_y * sum_y
    if sxx == 0:
        return 0.0, 0.0
    slope = sxy / sxx
    if n <= 2:
        return slope, 0.0
    # Residual variance / Sxx, with the common factor n folded in: (Sxx*Syy - Sxy^2) / ((n-2) Sxx^2).
    variance = (sxx * syy - sxy * sxy) / ((n - 2) * sxx * sxx)
    return slope, max(variance, 0.0) ** 0.5


def _beyond_noise(slope: float, error: float) -> bool:
    return slope > 0 and slope >= SLOPE_ERRORS * error


def format_rate(slope: float, error: float) -> str:
    """``+32.0 KiB/step ± 239 B``: a slope, with its standard error when there is noise."""
    sign = "+" if slope >= 0 else "-"
    text = f"{sign}{format_bytes(round(abs(slope)))}/step"
    return f"{text} ± {format_bytes(round(error))}" if error >= 0.5 else text


def judge(series: Series) -> Verdict:
    """The verdict on one series (at least 2 steps: the caller checks ``min_steps``)."""
    window = series.window()
    values = [value for _, value in window]
    net = series.last - series.first
    rises = [after - before for before, after in zip(values, values[1:]) if after > before]
    allocation = round(statistics.median(rises)) if rises else 0
    slope, error = _fit(window) if len(window) >= 2 else (0.0, 0.0)
    steps = series.steps

    def verdict(growing: bool, reason: str) -> Verdict:
        return Verdict(growing, reason, steps, series.rising_steps, net, slope, error, allocation)

    if net <= 0:
        return verdict(False, "ends where it started" if net == 0 else f"fell by {format_bytes(-net)}")
    needed = min(MIN_ALLOCATIONS, steps)
    kept = net / allocation if allocation else 0
    if kept < needed:
        return verdict(
            False,
            f"net +{format_bytes(net)} is only {kept:.0f} step increase(s) of ~{format_bytes(allocation)} "
            f"(fewer than {needed}): not kept step after step",
        )
    if not _beyond_noise(slope, error):
        return verdict(False, f"no trend beyond noise: slope {format_rate(slope, error)}")
    third = max(1, len(values) // 3)
    floor_first, floor_last = min(values[:third]), min(values[-third:])
    if floor_last <= floor_first:
        return verdict(
            False,
            f"falls back: lowest in the last third {format_bytes(floor_last)}, "
            f"not above the first third's {format_bytes(floor_first)}",
        )
    tail = window[-min(len(window), max(3, -(-len(window) // 3))):]
    tail_slope, tail_error = _fit(tail)
    tail_steps = tail[-1][0] - tail[0][0]
    if not _beyond_noise(tail_slope, tail_error) or tail_slope * tail_steps < allocation:
        return verdict(
            False,
            f"stopped growing: slope {format_rate(tail_slope, tail_error)} over the last {tail_steps} steps "
            "(a cache that filled, state made once)",
        )
    return verdict(
        True,
        f"rose on {series.rising_steps} of {steps} steps, slope {format_rate(slope, error)}, "
        f"net +{format_bytes(net)} (~{kept:.0f} allocations of {format_bytes(allocation)})",
    )
