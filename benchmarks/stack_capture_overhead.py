#!/usr/bin/env python3
"""What Python stack capture costs per allocation: capture off vs on, one process.

What it measures: nanoseconds per ``t = torch.empty(256); del t`` on CPU tensors
allocated by torchmem (``torchmem.install("cpu")``), with stack capture off and on,
the allocation made at several Python stack depths (capture walks every frame, so
its cost grows with depth; real training code allocates 20 to 60 frames deep).
"on - off" is what capture adds to an allocation in the steady state: the stack
was seen before, so the hook walks the frames, hashes them and finds the interned
stack under a shared lock, without taking the GIL (torch.empty releases it).

A separate row measures the first sight of a stack (a new code object every
allocation): interning it takes the GIL once to keep the code object alive. That
cost is paid once per allocation site, not per allocation.

For comparison, the design notes (DESIGN.md, "Performance") put PyTorch's
``torch.cuda.memory._record_memory_history`` at about 2 us per allocation: it
takes the GIL and gathers the stack on every allocation. It needs a CUDA device,
so it is cited here; ``cuda_e2e_benchmark.py --variants native,native_history``
measures it on the simulated CUDA device (and ``run_all.py`` reports both).

How: capture off and on alternate within each round (off/on, then on/off, so a
drifting machine hits both); each figure is the median (and the minimum, the
least disturbed) over rounds of ns per iteration of a timed loop. Same process,
same allocator, same cache state. Time is the thread's CPU time by default
(``--clock wall`` for elapsed time), which other processes on a shared machine
disturb much less.

Run (torchmem's extension must be built into torchmem/_C*.so):
    PYTHONPATH=$PWD python3 benchmarks/stack_capture_overhead.py
    PYTHONPATH=$PWD python3 benchmarks/stack_capture_overhead.py --rounds 31 --depths 0 50 200
    PYTHONPATH=$PWD python3 benchmarks/stack_capture_overhead.py --json out.json
It measures and prints; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

from bench_util import at_depth, frames_here

PYTORCH_RECORD_HISTORY_NS = 2000  # DESIGN.md: ~2 us per allocation
_now = time.thread_time_ns  # --clock: CPU time of this thread (default) or perf_counter_ns


def timed_loop(iterations: int) -> tuple[float, int]:
    """(ns per torch.empty(256) + del, Python frames at the allocation)."""
    import torch

    empty = torch.empty
    depth = frames_here()
    start = _now()
    for _ in range(iterations):
        t = empty(256)
        del t
    return (_now() - start) / iterations, depth


def first_sight(count: int) -> float:
    """ns per allocation made from a code object never seen before."""
    import torch

    sites = []
    for i in range(count):
        namespace = {"torch": torch}
        exec(compile("def site():\n    t = torch.empty(256)\n", f"<site-{i}>", "exec"), namespace)
        sites.append(namespace["site"])
    start = _now()
    for site in sites:
        site()
    return (_now() - start) / count


def measure(depths: list[int], rounds: int, iterations: int) -> dict:
    import torch

    import torchmem
    from torchmem.stacks import capture as stack_capture
    from torchmem import _C

    torch.set_num_threads(1)
    torchmem.install("cpu")
    samples: dict[tuple[int, bool], list[float]] = {}
    frame_counts: dict[int, int] = {}
    for depth in depths:  # warm the cache and intern each depth's stack
        with stack_capture.capturing():
            at_depth(depth, timed_loop, 1000)
        at_depth(depth, timed_loop, 1000)
    for round_index in range(rounds):
        # off/on, then on/off: a drifting machine hits both modes alike.
        order = (False, True) if round_index % 2 == 0 else (True, False)
        for depth in depths:
            for capture in order:
                with stack_capture.capturing() if capture else contextlib.nullcontext():
                    ns, frame_counts[depth] = at_depth(depth, timed_loop, iterations)
                samples.setdefault((depth, capture), []).append(ns)
    first = {False: [], True: []}
    for round_index in range(3):
        for capture in (False, True):
            with stack_capture.capturing() if capture else contextlib.nullcontext():
                first[capture].append(first_sight(500))
    stats = _C.capture_stats()
    stack_capture.prune(lambda: [b["context"] for b in _C.cpu_engine().allocated_blocks()])
    return {
        "samples": samples,
        "frames": frame_counts,
        "first_sight": {capture: statistics.median(values) for capture, values in first.items()},
        "stats": stats,
        "stats_after_prune": _C.capture_stats(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 25, 95])
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu (default): the thread's CPU time; wall: elapsed time")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    global _now
    _now = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns

    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CPU tensors through torchmem; "
          f"{args.rounds} rounds x {args.iterations} iterations per mode and depth; {args.clock} time")
    out = measure(args.depths, args.rounds, args.iterations)
    samples = out["samples"]
    print()
    print("ns per torch.empty(256) + del       median over rounds        min over rounds")
    print(f"{'Python frames':>14} {'off':>8} {'on':>8} {'on - off':>9} {'off':>10} {'on':>8} {'on - off':>9}")
    for depth in args.depths:
        off, on = samples[(depth, False)], samples[(depth, True)]
        med_off, med_on = statistics.median(off), statistics.median(on)
        print(f"{out['frames'][depth]:>14} {med_off:>8.0f} {med_on:>8.0f} {med_on - med_off:>9.0f} "
              f"{min(off):>10.0f} {min(on):>8.0f} {min(on) - min(off):>9.0f}")
    first = out["first_sight"]
    print(f"{'first sight':>14} {first[False]:>8.0f} {first[True]:>8.0f} {first[True] - first[False]:>9.0f}"
          "   (new code object each time: interned under the GIL, once per site)")
    print(f"{'PyTorch':>14} {'':>8} {'':>8} {PYTORCH_RECORD_HISTORY_NS:>9}"
          "   (_record_memory_history per allocation, cited from DESIGN.md; needs a GPU)")
    stats, after = out["stats"], out["stats_after_prune"]
    print()
    print(f"stack table: {stats['interned_stacks']} stacks, {stats['distinct_frames']} distinct frames, "
          f"{stats['code_objects_held']} code objects held, {stats['bytes_used']} bytes; GIL taken "
          f"{stats['gil_acquisitions']} times (new code objects only); GIL-free walk: {stats['gil_free_walk']}")
    print(f"after prune: {after['interned_stacks']} stacks, {after['code_objects_held']} code objects, "
          f"{after['bytes_used']} bytes")
    if args.json:
        rows = []
        for depth in args.depths:
            off, on = samples[(depth, False)], samples[(depth, True)]
            rows.append({"depth": depth, "frames": out["frames"][depth],
                         "off_ns": statistics.median(off), "on_ns": statistics.median(on),
                         "on_minus_off_ns": statistics.median(on) - statistics.median(off),
                         "min_off_ns": min(off), "min_on_ns": min(on),
                         "paired_on_minus_off_ns": statistics.median(
                             [b - a for a, b in zip(off, on)]),
                         "off_samples": off, "on_samples": on})
        with open(args.json, "w") as stream:
            json.dump({"rounds": args.rounds, "iterations": args.iterations, "clock": args.clock,
                       "torch": torch.__version__, "rows": rows,
                       "first_sight": {"off_ns": first[False], "on_ns": first[True]},
                       "stats": stats, "stats_after_prune": after,
                       "pytorch_record_history_cited_ns": PYTORCH_RECORD_HISTORY_NS}, stream,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
