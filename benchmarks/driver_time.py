#!/usr/bin/env python3
"""Driver calls and modelled driver time of a cold pass and of a warm step, per trace.

Replays each trace (../shared/traces) on the simulated CUDA device with four allocators:
PyTorch's default, PyTorch's expandable segments, torchmem with PyTorch's placement and
torchmem with its virtual-memory placement (``expandable_segments:True``). For each it
reports what the device counted: in the cold pass (from an empty cache) and per warm step
(the trace again from the warm cache, survivors freed after each pass, as the steps of a
training loop), the segment calls (cudaMalloc/cudaFree, or cuMemCreate/cuMemMap/cuMemUnmap/
cuMemSetAccess), the calls that wait for the GPU (cudaStreamSynchronize, cudaFree,
cuMemUnmap, ...) and the time the cost model charges for them (tests/simcuda/README.md,
"Cost model": defaults from published measurements where they exist, assumptions
otherwise; ``--costs`` replaces them). Peak reserved bytes come with each row, so memory
and driver time are read side by side.

It measures and prints; it asserts nothing. The modelled time is not a GPU measurement.

Run:
    python3 benchmarks/driver_time.py                        # every trace, four allocators
    python3 benchmarks/driver_time.py path/to/trace.csv --json rows.jsonl
    python3 benchmarks/driver_time.py --costs "cuMemMap=50us;cuMemSetAccess=50us"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

ALLOCATORS = (
    ("PyTorch default", "native", ""),
    ("PyTorch expandable", "native", "expandable_segments:True"),
    ("torchmem", "torchmem", ""),
    ("torchmem VMM", "torchmem", "expandable_segments:True"),
)


def replay(paths: list[str], allocator: str, alloc_conf: str, warm_passes: int,
           costs: str | None) -> dict[str, dict]:
    """trace_replay_native.py's rows for one allocator, by trace name."""
    # A process per trace: the simulated driver holds a file descriptor per physical page,
    # and a trace's pages must not count against the next one's.
    command = [sys.executable, str(HERE / "trace_replay_native.py"),
               "--allocator", allocator, "--alloc-conf", alloc_conf, "--repeat", "0",
               "--warm-passes", str(warm_passes), "--no-fragmentation", *paths]
    env = dict(os.environ)
    if costs:
        env["SIMCUDA_COSTS"] = costs
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"driver_time: {allocator} {alloc_conf or '(defaults)'} failed:\n"
              f"{proc.stderr[-3000:]}", file=sys.stderr)
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["trace"]] = row
    return rows


def segment_calls(calls: dict, expandable: bool) -> str:
    if expandable:
        names = ("cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemSetAccess")
    else:
        names = ("cudaMalloc", "cudaFree")
    return " / ".join(f"{calls.get(name, 0):g}" for name in names)


def mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="traces or directories (default: "
                        "trace_replay_native.py's, ../shared/traces)")
    parser.add_argument("--warm-passes", type=int, default=2,
                        help="warm steps averaged (default 2)")
    parser.add_argument("--costs", help="SIMCUDA_COSTS override, e.g. 'cuMemMap=50us'")
    parser.add_argument("--json", metavar="FILE", help="also write every row as JSON lines")
    args = parser.parse_args()

    results = {}
    for label, allocator, conf in ALLOCATORS:
        results[label] = replay(args.paths, allocator, conf, args.warm_passes, args.costs)
    traces = sorted(set().union(*(rows.keys() for rows in results.values())))
    if args.json:
        with open(args.json, "w") as out:
            for label, rows in results.items():
                for row in rows.values():
                    out.write(json.dumps(dict(row, driver_time_label=label)) + "\n")

    print("| trace | allocator | peak reserved MiB | cold: segment calls | cold: sync calls "
          "| cold: modelled ms | warm step: segment calls | warm step: sync calls "
          "| warm step: modelled µs |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|")
    status = 0
    for trace in traces:
        for label, allocator, conf in ALLOCATORS:
            row = results[label].get(trace)
            if row is None or "cold_driver" not in row:
                print(f"| `{trace}` | {label} | no result | | | | | | |")
                status = 1
                continue
            expandable = bool(conf)
            cold, warm = row["cold_driver"], row.get("warm_step_driver", {})
            print(f"| `{trace}` | {label} | {mib(row['peak_reserved_bytes'])} "
                  f"| {segment_calls(cold['calls'], expandable)} "
                  f"| {cold['synchronizing_calls']} | {cold['modelled_us'] / 1000:,.2f} "
                  f"| {segment_calls(warm.get('calls', {}), expandable)} "
                  f"| {warm.get('synchronizing_calls', 0):g} "
                  f"| {warm.get('modelled_us', 0):,.1f} |")
    print("\nsegment calls: cudaMalloc / cudaFree, or cuMemCreate / cuMemMap / cuMemUnmap / "
          "cuMemSetAccess for the expandable rows; sync calls: calls that wait for the GPU.")
    return status


if __name__ == "__main__":
    sys.exit(main())
