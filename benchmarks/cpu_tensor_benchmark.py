#!/usr/bin/env python3
"""CPU tensors: ``torch.empty(n)`` + ``del``, PyTorch's default CPU allocator vs torchmem.

What it measures: nanoseconds per ``t = torch.empty(nbytes, dtype=torch.uint8); del t``
for sizes from 4 KiB to 64 MiB (the tensor is never touched, so this is the allocator
plus PyTorch's fixed per-tensor cost, about a microsecond of Python and dispatcher
work). The default allocator is c10's DefaultCPUAllocator (posix_memalign/free, i.e.
glibc malloc, which serves large sizes with mmap/munmap); torchmem is installed with
``torchmem.install("cpu")`` and caches freed blocks.

How: time is the thread's CPU time by default (``--clock wall`` for elapsed time), which
other processes on a shared machine disturb less (on a virtual machine it still includes
time the hypervisor takes away, so slow phases of a busy host lasting seconds show up).
``--mode interleaved`` (the default): one process per round; inside it, for each size,
batches of the two allocators alternate (A B B A ..., swapping with
``torchmem.install("cpu")``/``uninstall("cpu")``, which c10 allows at any time; both
caches stay warm), so the two sides of each ratio ran milliseconds apart. Each figure
is the median over rounds of the per-process median over batches; the speedup is the
median over rounds of the per-process median of the per-batch-pair ratios.
``--mode processes``: each allocator in its own subprocess per round (ABBA order across
rounds), the original method; a slow phase then hits one side of a ratio only.
The result is a table with the speedup default/torchmem (> 1: torchmem is faster). A 0-byte row measures the floor, PyTorch's per-tensor cost without a real
allocation (c10 asks no allocator for 0 bytes' memory); "over floor" columns subtract it
to show what the allocator itself costs.

Run (torchmem's extension must be built into torchmem/_C*.so):
    PYTHONPATH=$PWD python3 benchmarks/cpu_tensor_benchmark.py
    PYTHONPATH=$PWD python3 benchmarks/cpu_tensor_benchmark.py --rounds 7 --json out.json
    PYTHONPATH=$PWD python3 benchmarks/cpu_tensor_benchmark.py --mode processes
It measures and prints; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench_util import format_bytes, parse_size

ALLOCATORS = ("default", "torchmem")
DEFAULT_SIZES = [0, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def worker(allocator: str, sizes: list[int], batch_seconds: float, batches: int,
           clock: str) -> dict:
    """Runs in the subprocess: measures every size with one allocator."""
    import torch

    now = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns

    torch.set_num_threads(1)
    if allocator == "torchmem":
        import torchmem

        torchmem.install("cpu")
    empty = torch.empty
    u8 = torch.uint8
    results = {}
    for nbytes in sizes:
        # Warm up (torchmem's cache, glibc's arenas) and calibrate a batch length.
        iterations = 64
        while True:
            start = now()
            for _ in range(iterations):
                t = empty(nbytes, dtype=u8)
                del t
            elapsed = now() - start
            if elapsed >= batch_seconds * 1e9 / 4 or iterations >= 1 << 22:
                break
            iterations *= 2
        iterations = max(16, int(iterations * batch_seconds * 1e9 / max(elapsed, 1)))
        per_batch = []
        for _ in range(batches):
            start = now()
            for _ in range(iterations):
                t = empty(nbytes, dtype=u8)
                del t
            per_batch.append((now() - start) / iterations)
        results[str(nbytes)] = statistics.median(per_batch)
    check = None
    if allocator == "torchmem":
        import torchmem

        # Proof that the tensors really came from torchmem.
        check = torchmem.memory_stats().get("allocation.all.allocated")
    return {"allocator": allocator, "ns_per_pair": results, "torchmem_allocations": check,
            "torch": torch.__version__}


def worker_interleaved(sizes: list[int], batch_seconds: float, batches: int,
                       clock: str) -> dict:
    """Runs in the subprocess: both allocators, batches alternating, for every size."""
    import torch

    import torchmem

    now = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns
    torch.set_num_threads(1)
    empty = torch.empty
    u8 = torch.uint8

    def use(allocator: str) -> None:
        if allocator == "torchmem":
            torchmem.install("cpu")
        else:
            torchmem.uninstall("cpu")

    def timed(nbytes: int, iterations: int) -> float:
        start = now()
        for _ in range(iterations):
            t = empty(nbytes, dtype=u8)
            del t
        return (now() - start) / iterations

    results = {a: {} for a in ALLOCATORS}
    ratios = {}
    for nbytes in sizes:
        counts = {}
        for allocator in ALLOCATORS:  # warm up and calibrate each side
            use(allocator)
            iterations = 64
            while True:
                start = now()
                timed(nbytes, iterations)
                elapsed = now() - start
                if elapsed >= batch_seconds * 1e9 / 4 or iterations >= 1 << 22:
                    break
                iterations *= 2
            counts[allocator] = max(16, int(iterations * batch_seconds * 1e9 / max(elapsed, 1)))
        per_batch = {a: [] for a in ALLOCATORS}
        pair_ratios = []
        for batch in range(batches):
            order = ALLOCATORS if batch % 2 == 0 else tuple(reversed(ALLOCATORS))
            for allocator in order:
                use(allocator)
                per_batch[allocator].append(timed(nbytes, counts[allocator]))
            pair_ratios.append(per_batch["default"][-1] / max(per_batch["torchmem"][-1], 1e-9))
        for allocator in ALLOCATORS:
            results[allocator][str(nbytes)] = statistics.median(per_batch[allocator])
        ratios[str(nbytes)] = statistics.median(pair_ratios)
    use("default")
    check = torchmem.memory_stats("cpu").get("allocation.all.allocated")
    return {"mode": "interleaved", "ns_per_pair": results, "speedup": ratios,
            "torchmem_allocations": check, "torch": torch.__version__}


def run_worker(allocator: str, args: argparse.Namespace) -> dict:
    """Runs one worker process: an allocator's own, or "interleaved" (both in one process)."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", allocator,
               "--sizes", ",".join(str(s) for s in args.sizes),
               "--batch-seconds", str(args.batch_seconds), "--batches", str(args.batches),
               "--clock", args.clock]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        sys.exit(f"cpu_tensor_benchmark: the {allocator} worker failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description="torch.empty + del on CPU: PyTorch's default CPU allocator vs torchmem "
                    "(separate processes, alternating A/B rounds, medians, ratios).")
    parser.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                        default=DEFAULT_SIZES,
                        help="comma-separated sizes in bytes (suffixes K, M, G allowed; 0 is the "
                             "floor row); default 0,4K,16K,64K,256K,1M,4M,16M,64M")
    parser.add_argument("--rounds", type=int, default=5,
                        help="A/B rounds (each round runs both allocators once, order "
                             "alternating); default 5")
    parser.add_argument("--batches", type=int, default=5,
                        help="timed batches per size within a process (median); default 5")
    parser.add_argument("--batch-seconds", type=float, default=0.05,
                        help="target duration of one batch; default 0.05")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu (default): the thread's CPU time, user + system (mmap, "
                             "munmap and page faults included), robust when other processes "
                             "share the cores; wall: elapsed time")
    parser.add_argument("--mode", choices=("interleaved", "processes"), default="interleaved",
                        help="interleaved (default): both allocators in one process per round, "
                             "batches alternating; processes: one process per allocator and "
                             "round")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--worker", choices=ALLOCATORS + ("interleaved",),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker == "interleaved":
        print(json.dumps(worker_interleaved(args.sizes, args.batch_seconds, args.batches,
                                            args.clock)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.sizes, args.batch_seconds, args.batches,
                                args.clock)))
        return

    samples: dict[str, dict[int, list[float]]] = {a: {s: [] for s in args.sizes}
                                                  for a in ALLOCATORS}
    round_speedups: dict[int, list[float]] = {s: [] for s in args.sizes}
    torchmem_allocations = None
    for round_index in range(args.rounds):
        if args.mode == "interleaved":
            result = run_worker("interleaved", args)
            torchmem_allocations = result["torchmem_allocations"]
            for size in args.sizes:
                for allocator in ALLOCATORS:
                    samples[allocator][size].append(result["ns_per_pair"][allocator][str(size)])
                round_speedups[size].append(result["speedup"][str(size)])
        else:
            order = ALLOCATORS if round_index % 2 == 0 else tuple(reversed(ALLOCATORS))
            for allocator in order:
                result = run_worker(allocator, args)
                if allocator == "torchmem":
                    torchmem_allocations = result["torchmem_allocations"]
                for size in args.sizes:
                    samples[allocator][size].append(result["ns_per_pair"][str(size)])
            for size in args.sizes:
                round_speedups[size].append(samples["default"][size][-1] /
                                            max(samples["torchmem"][size][-1], 1e-9))
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)

    rows = []
    medians = {a: {s: statistics.median(samples[a][s]) for s in args.sizes} for a in ALLOCATORS}
    floor = {a: medians[a].get(0) for a in ALLOCATORS}
    print(f"torch.empty(nbytes, dtype=torch.uint8) + del, ns per pair ({args.clock} time, "
          f"median of {args.rounds} rounds, {args.mode}; speedup = median of per-round ratios)")
    print(f"{'size':>12} {'default':>9} {'torchmem':>9} {'speedup':>8}   "
          f"{'default-floor':>13} {'torchmem-floor':>14}")
    for size in args.sizes:
        default = medians["default"][size]
        ours = medians["torchmem"][size]
        speedup = statistics.median(round_speedups[size])
        rows.append({"bytes": size, "default_ns": default, "torchmem_ns": ours,
                     "speedup_default_over_torchmem": speedup,
                     "round_speedups": round_speedups[size],
                     "default_samples": samples["default"][size],
                     "torchmem_samples": samples["torchmem"][size]})
        label = "0 B (floor)" if size == 0 else format_bytes(size)
        over = ""
        if size != 0 and floor["default"] is not None:
            over = (f"   {default - floor['default']:13.0f} "
                    f"{ours - floor['torchmem']:14.0f}")
        print(f"{label:>12} {default:9.0f} {ours:9.0f} {speedup:7.2f}x{over}")
    print(f"(torchmem served {torchmem_allocations} allocations in its last worker; "
          f"speedup = default ns / torchmem ns)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": args.rounds, "clock": args.clock, "mode": args.mode,
                       "batches": args.batches, "batch_seconds": args.batch_seconds,
                       "rows": rows}, out, indent=2)


if __name__ == "__main__":
    main()
