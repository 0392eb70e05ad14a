#!/usr/bin/env python3
"""What a leak check's exit costs, by what the checked code left behind.

What it measures: the CPU time of ``with torchmem.leak_check(raise_on_leak=False): ...``
(enter, body, exit with its collections and owner search) in a process whose heap is the
size of a pytest session of a metrics library (torch and torchmetrics imported: about
280,000 objects the collector tracks), for four bodies:

* ``nothing``: a tensor made and freed inside (no survivor: no collection at all);
* ``young cycle``: one metric-like object in a reference cycle, dropped just before the exit;
* ``old cycle``: the same, then enough allocation churn that the collector promoted it to
  its oldest generation before the exit (what a long test does);
* ``reachable``: a tensor kept by a module global (the owner search names it);
* ``old reachable``: the same, then the churn of ``old cycle``: the tensor is old, so the exit
  looks for garbage above it before the owner search (and finds none: the whole heap's
  collection follows).

Each figure is the median and the minimum over rounds of the thread's CPU time, in ms.
``--whole-heap-too`` also measures each body with the exit collecting the whole heap for
blocks the young collection left (the exit without ``collector.garbage_above``), the two
alternated round by round so that a loaded machine weighs on both alike.

Run (torchmem's extension must be built into torchmem/_C*.so):
    PYTHONPATH=$PWD python3 benchmarks/leak_check_exit_cost.py
    PYTHONPATH=$PWD python3 benchmarks/leak_check_exit_cost.py --rounds 41
    PYTHONPATH=$PWD python3 benchmarks/leak_check_exit_cost.py --whole-heap-too
It measures and prints; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time

import torch

import torchmem
from torchmem.leaks import collector

KEPT: list = []


class MetricLike:
    """Refers to itself as a torchmetrics Metric does (functools.wraps of a bound method)."""

    def __init__(self):
        self.total = torch.zeros(1024)
        update = self.update

        @functools.wraps(update)
        def wrapped(*args):
            return update(*args)

        self.update = wrapped

    def update(self, value):
        self.total = self.total + value


def nothing() -> None:
    t = torch.zeros(1024)
    del t


def young_cycle() -> None:
    MetricLike().update(torch.ones(1024))


def old_cycle() -> None:
    metric = MetricLike()
    metric.update(torch.ones(1024))
    # Churn: about 100 young collections' worth of tracked objects alive at once; the
    # collector moves what survives its middle generation into the oldest one.
    churn = [[None] for _ in range(70_000)]
    del churn, metric  # garbage now, in the oldest generation


def reachable() -> None:
    KEPT.append(torch.zeros(1024))


def old_reachable() -> None:
    KEPT.append(torch.zeros(1024))
    churn = [[None] for _ in range(70_000)]
    del churn


def one_round(body) -> float:
    KEPT.clear()
    gc.collect()
    started = time.thread_time()
    with torchmem.leak_check(raise_on_leak=False):
        body()
    return (time.thread_time() - started) * 1000


def measure(body, rounds: int, whole_heap_too: bool) -> tuple[list, list]:
    subset_found = getattr(collector, "garbage_above", None)  # absent in a checkout from before it
    times, whole_heap = [], []
    for _ in range(rounds):
        times.append(one_round(body))
        if whole_heap_too:
            collector.garbage_above = lambda index: None  # the exit's whole-heap collection
            try:
                whole_heap.append(one_round(body))
            finally:
                collector.garbage_above = subset_found
    return times, whole_heap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--whole-heap-too", action="store_true",
                        help="also measure the exit collecting the whole heap (alternated)")
    args = parser.parse_args()
    torchmem.install("cpu")
    try:
        import torchmetrics  # noqa: F401 - a realistic heap
    except ImportError:
        pass
    gc.collect()
    print(f"objects the collector tracks: {len(gc.get_objects())}")
    header = f"{'body':<14}{'median ms':>12}{'min ms':>10}"
    if args.whole_heap_too:
        header += f"{'whole heap median':>20}{'min':>8}{'ratio':>8}"
    print(header)
    for name, body in (("nothing", nothing), ("young cycle", young_cycle), ("old cycle", old_cycle),
                       ("reachable", reachable), ("old reachable", old_reachable)):
        times, whole_heap = measure(body, args.rounds, args.whole_heap_too)
        line = f"{name:<14}{statistics.median(times):>12.2f}{min(times):>10.2f}"
        if whole_heap:
            ratio = statistics.median(times) / statistics.median(whole_heap)
            line += f"{statistics.median(whole_heap):>20.2f}{min(whole_heap):>8.2f}{ratio:>8.2f}"
        print(line)
    KEPT.clear()


if __name__ == "__main__":
    main()
