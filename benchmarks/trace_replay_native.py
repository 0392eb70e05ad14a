#!/usr/bin/env python3
"""Replays allocation traces through PyTorch's native CUDA caching allocator.

The counterpart of ``trace_replay`` (the C++ tool that replays the same traces through
torchmem's engine): same input, same replay rules, same JSON keys, so the two outputs can
be compared line by line (``--compare``).

Input: CSV traces in the format of ../shared/traces (``op,addr,size,stream``; see its
README). Replay rules (as in trace_replay.cc):
  * ``alloc`` -> ``torch.cuda.caching_allocator_alloc(size, device=0, stream=...)``;
    ``free`` -> ``torch.cuda.caching_allocator_delete(ptr)`` of the pointer returned for
    that trace address (addresses are only identifiers). Stream 0 is the default stream;
    each other stream id gets its own ``torch.cuda.Stream``.
  * a ``free`` of an address not allocated inside the trace is ignored (and counted);
    an ``alloc`` of an address still live frees the old block first (the trace lost
    its free; counted as implicit); 0-byte allocs are skipped (counted).
  * ``empty_cache`` rows call ``torch.cuda.empty_cache()`` (unless --no-empty-cache);
    ``segment_*`` rows are the original allocator's responses, not inputs; they,
    ``oom`` and unknown ops are ignored and counted.
Output per trace, one JSON object per line: ops replayed, peak reserved / allocated /
requested (``torch.cuda.memory_stats()``), final reserved, num_device_alloc/free, ns per
op (the thread's CPU time by default, ``--clock wall`` for elapsed time; median of
--repeat timed replays, each from an empty cache; it includes Python's per-call cost,
measured separately as ``python_loop_ns_per_op`` by the same loop over no-op functions), the same for --warm-passes passes over a warm cache (survivors freed
after each pass, like the steps of a training loop: warm_ns_per_op, warm_device_allocs,
warm_peak_reserved_bytes), and the fragmentation (from ``torch.cuda.memory_snapshot()``) at the
operation where reserved bytes first reached their peak and where allocated bytes did.

Device: by default each trace runs in a subprocess (all in one with ``--one-process``) on
the simulated CUDA device (tests/simcuda, LD_PRELOAD from ``tests/simcuda/simcuda.py``; it
reserves memory lazily, so a 60 GiB peak costs nothing). ``--device real`` runs on the machine's CUDA device.
``--allocator torchmem`` replays through torchmem's CUDA allocator instead
(``torchmem.install()``; needs torchmem built with CUDA), with figures from
``torchmem.memory_stats()``/``torchmem.fragmentation()``. ``--alloc-conf CONF`` sets
``PYTORCH_CUDA_ALLOC_CONF`` for the replay (PyTorch's defaults otherwise), e.g.
``expandable_segments:True`` for PyTorch's expandable segments (on the simulated device
the fake NVML is then preloaded too, which PyTorch needs for them). On the simulated
device each row also says which driver/runtime memory calls the first replay made
(``device_calls``: cudaMalloc, cudaFree, cuMemCreate, cuMemMap, cuMemUnmap, ...), as the
device counted them, with their modelled driver time and the calls that synchronize
(``cold_driver``), and the same per warm pass (``warm_step_driver``);
benchmarks/driver_time.py tabulates them for the four allocators.

Run:
    python3 benchmarks/trace_replay_native.py                      # every trace in ../shared/traces
    python3 benchmarks/trace_replay_native.py path/to/trace.csv --repeat 5 --json out.jsonl
    build/bench/benchmarks/trace_replay > engine.jsonl
    python3 benchmarks/trace_replay_native.py --compare engine.jsonl --json native.jsonl
    python3 benchmarks/trace_replay_native.py --one-process        # one worker for all traces
It measures and prints; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The full set beside the repository when it is there, else the samples checked in.
DEFAULT_TRACES = (
    "/work/shared/traces"
    if os.path.isdir("/work/shared/traces")
    else os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces")
)

ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, EMPTY_CACHE, OOM, UNKNOWN = range(7)
OPS = {"alloc": ALLOC, "free": FREE, "segment_alloc": SEGMENT_ALLOC,
       "segment_free": SEGMENT_FREE, "empty_cache": EMPTY_CACHE, "oom": OOM}


# --- reading traces (the rules of benchmarks/trace_csv.h) ----------------------------

def read_trace(path: str) -> list[tuple[int, int, int, int]]:
    """(op, addr, size, stream) tuples of a CSV trace; raises ValueError on bad rows."""
    events = []
    columns = (0, 1, 2, 3)
    first = True
    with open(path, newline="") as stream:
        for line_number, line in enumerate(stream, 1):
            text = line.strip()
            if not text:
                continue
            fields = [f.strip() for f in text.split(",")]
            if first:
                first = False
                if fields[0] not in OPS:
                    names = {name: i for i, name in enumerate(fields)}
                    if not all(k in names for k in ("op", "addr", "size")):
                        raise ValueError(f"{path}:1: header must name the columns op, addr, "
                                         f"size (and stream): {text}")
                    columns = (names["op"], names["addr"], names["size"], names.get("stream", -1))
                    continue
            op_col, addr_col, size_col, stream_col = columns
            try:
                events.append((OPS.get(fields[op_col], UNKNOWN), int(fields[addr_col]),
                               int(fields[size_col]),
                               int(fields[stream_col]) if stream_col >= 0 else 0))
            except (ValueError, IndexError):
                raise ValueError(f"{path}:{line_number}: expected op,addr,size,stream with "
                                 f"unsigned decimal integers: {text}") from None
    return events


def list_traces(path: str) -> list[str]:
    if os.path.isdir(path):
        return sorted(str(p) for p in Path(path).glob("*.csv") if p.is_file())
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such trace file or directory: {path}")
    return [path]


# --- the worker (runs on the CUDA device) -------------------------------------------

class Allocator:
    """The allocator under test: alloc/delete functions, stats, fragmentation."""

    def __init__(self, kind: str):
        import torch

        self.torch = torch
        self.kind = kind
        if kind == "torchmem":
            import torchmem

            torchmem.install()
            self.torchmem = torchmem
        torch.cuda.init()
        self.streams = {0: 0}
        self.device = simulated_device_control()

    def stream(self, stream_id: int) -> int:
        handle = self.streams.get(stream_id)
        if handle is None:
            handle = self.torch.cuda.Stream(device=0).cuda_stream
            self.streams[stream_id] = handle
        return handle

    def stats(self) -> dict:
        if self.kind == "torchmem":
            return self.torchmem.memory_stats("cuda")
        return self.torch.cuda.memory_stats(0)

    def current(self) -> tuple[int, int]:
        stats = self.stats()
        return stats.get("reserved_bytes.all.current", 0), stats.get(
            "allocated_bytes.all.current", 0)

    def reset(self) -> None:
        if self.kind == "torchmem":
            self.torchmem.empty_cache("cuda")
            self.torchmem.reset_peak_memory_stats("cuda")
            self.torchmem.reset_accumulated_memory_stats("cuda")
        else:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats(0)
            self.torch.cuda.reset_accumulated_memory_stats(0)

    def empty_cache(self) -> None:
        if self.kind == "torchmem":
            self.torchmem.empty_cache("cuda")
        else:
            self.torch.cuda.empty_cache()

    def fragmentation(self) -> dict:
        if self.kind == "torchmem":
            report = self.torchmem.fragmentation("cuda")
            report = report.get("all", report)
            # torchmem's Python names -> the names trace_replay prints.
            names = {"largest_free_extent": "largest_free_block", "free_extents": "free_blocks"}
            keys = ("reserved_bytes", "allocated_bytes", "requested_bytes", "free_bytes",
                    "largest_free_extent", "free_extents", "inactive_split_bytes",
                    "internal_waste_bytes", "external_fragmentation")
            return {k: report.get(names.get(k, k)) for k in keys}
        # PyTorch merges adjacent free blocks at once: every inactive block is a free extent.
        result = dict(reserved_bytes=0, allocated_bytes=0, requested_bytes=0, free_bytes=0,
                      largest_free_extent=0, free_extents=0, inactive_split_bytes=0,
                      internal_waste_bytes=0)
        for segment in self.torch.cuda.memory_snapshot():
            result["reserved_bytes"] += segment["total_size"]
            live = any(b["state"] != "inactive" for b in segment["blocks"])
            for block in segment["blocks"]:
                if block["state"] == "inactive":
                    result["free_bytes"] += block["size"]
                    result["free_extents"] += 1
                    result["largest_free_extent"] = max(result["largest_free_extent"],
                                                        block["size"])
                    if live:
                        result["inactive_split_bytes"] += block["size"]
                elif block["state"] == "active_allocated":
                    result["allocated_bytes"] += block["size"]
                    result["requested_bytes"] += block.get("requested_size", block["size"])
        result["internal_waste_bytes"] = result["allocated_bytes"] - result["requested_bytes"]
        free = result["free_bytes"]
        result["external_fragmentation"] = (
            round(1.0 - result["largest_free_extent"] / free, 4) if free else 0.0)
        return result


# The memory calls of the CUDA runtime and driver a replay is judged by.
DEVICE_CALLS = ("cudaMalloc", "cudaFree", "cuMemCreate", "cuMemRelease", "cuMemMap",
                "cuMemUnmap", "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree",
                "cudaStreamSynchronize")
# The calls whose modelled time (the simulated device's cost model, tests/simcuda/README.md)
# is an allocator's driver time: the memory calls, the waits, and the events of the
# cross-stream bookkeeping. Device switches (cudaGetDevice/cudaSetDevice), which every
# allocator makes alike per allocation through PyTorch, are left out.
DRIVER_TIME_CALLS = DEVICE_CALLS + (
    "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaEventRecord", "cudaEventQuery",
    "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaMemGetInfo")


def driver_time(device) -> dict:
    """Driver calls, their modelled time and the synchronizing calls since the device's
    counters were last reset."""
    return {"calls": {name: device.call_count(name) for name in DEVICE_CALLS},
            "modelled_us": round(sum(device.modelled_ns(name) for name in DRIVER_TIME_CALLS)
                                 / 1000.0, 1),
            "synchronizing_calls": device.synchronizing_calls()}


def simulated_device_control():
    """simcuda.Control() when this process runs on the simulated device, else None."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "simcuda"))
    try:
        import simcuda  # noqa: E402

        return simcuda.Control()
    except (ImportError, RuntimeError):
        return None
    finally:
        sys.path.pop(0)


def replay(events, allocator: Allocator, alloc, delete, empty_cache: bool,
           observe=None, counts: dict | None = None) -> dict:
    """Replays `events` with the functions given; returns the live map (addr -> ptr)."""
    torch = allocator.torch
    oom_error = getattr(torch, "OutOfMemoryError", RuntimeError)
    live = {}
    c = counts if counts is not None else {}
    ops = allocs = frees = unknown = implicit = zero = failed = empties = 0
    segment_rows = oom_rows = unknown_ops = 0
    stream_of = allocator.stream
    for index, (op, addr, size, stream) in enumerate(events):
        if op == ALLOC:
            if size == 0:
                zero += 1
                continue
            old = live.pop(addr, None)
            if old is not None:
                delete(old)
                implicit += 1
                ops += 1
            try:
                ptr = alloc(size, 0, stream_of(stream))
            except oom_error as error:
                failed += 1
                ops += 1
                c.setdefault("first_error", str(error).splitlines()[0])
                continue
            live[addr] = ptr
            allocs += 1
            ops += 1
        elif op == FREE:
            ptr = live.pop(addr, None)
            if ptr is None:
                unknown += 1
                continue
            delete(ptr)
            frees += 1
            ops += 1
        elif op == EMPTY_CACHE:
            if not empty_cache:
                continue
            allocator.empty_cache()
            empties += 1
            ops += 1
        else:
            if op in (SEGMENT_ALLOC, SEGMENT_FREE):
                segment_rows += 1
            elif op == OOM:
                oom_rows += 1
            else:
                unknown_ops += 1
            continue
        if observe is not None:
            observe(index)
    c.update(ops_replayed=ops, allocs=allocs, frees=frees, empty_cache_calls=empties,
             ignored_unknown_frees=unknown, implicit_frees=implicit, zero_size_allocs=zero,
             failed_allocs=failed, ignored_segment_rows=segment_rows,
             ignored_oom_rows=oom_rows, ignored_unknown_ops=unknown_ops)
    c["_live"] = live
    return c


def free_all(live: dict, delete) -> None:
    for ptr in live.values():
        delete(ptr)
    live.clear()


def worker_replay(path: str, args: argparse.Namespace, allocator: Allocator) -> dict:
    torch = allocator.torch
    now = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    events = read_trace(path)
    if args.raw:
        raw_alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc

        def alloc(size, device, stream):
            return raw_alloc(size, stream)
        delete = torch._C._cuda_cudaCachingAllocator_raw_delete
    else:
        def alloc(size, device, stream):
            return torch.cuda.caching_allocator_alloc(size, device, stream)
        delete = torch.cuda.caching_allocator_delete

    # Pass 1 (observed): where reserved and allocated first reach their peaks.
    allocator.reset()
    peaks = {"reserved": (-1, -1), "allocated": (-1, -1)}

    def observe(index):
        reserved, allocated = allocator.current()
        if reserved > peaks["reserved"][0]:
            peaks["reserved"] = (reserved, index)
        if allocated > peaks["allocated"][0]:
            peaks["allocated"] = (allocated, index)

    if allocator.device is not None:
        allocator.device.reset_call_counts()
    counts = replay(events, allocator, alloc, delete, not args.no_empty_cache, observe)
    stats = allocator.stats()
    cold = driver_time(allocator.device) if allocator.device is not None else None
    device_calls = cold["calls"] if cold is not None else None
    live = counts.pop("_live")
    free_all(live, delete)

    # Pass 2: fragmentation at those two operations.
    fragmentation = {}
    if not args.no_fragmentation:
        allocator.reset()
        wanted = {peaks["reserved"][1]: "fragmentation_at_peak_reserved",
                  peaks["allocated"][1]: "fragmentation_at_peak_allocated"}
        snapshots = {}

        def snapshot(index):
            if index in wanted:
                snapshots[index] = allocator.fragmentation()

        second = replay(events, allocator, alloc, delete, not args.no_empty_cache, snapshot)
        free_all(second.pop("_live"), delete)
        for index, key in ((peaks["reserved"][1], "fragmentation_at_peak_reserved"),
                           (peaks["allocated"][1], "fragmentation_at_peak_allocated")):
            fragmentation[key] = snapshots.get(index)

    # Timed passes, each from an empty cache.
    times = []
    for _ in range(args.repeat):
        allocator.reset()
        start = now()
        timed = replay(events, allocator, alloc, delete, not args.no_empty_cache)
        elapsed = now() - start
        free_all(timed.pop("_live"), delete)
        times.append(elapsed / max(timed["ops_replayed"], 1))

    # Warm passes: the trace again and again from a warm cache (survivors freed at the end
    # of each pass), like the steps of a training loop; the first pass is not timed.
    warm_times = []
    warm = {}
    if args.warm_passes > 0:
        allocator.reset()
        first = replay(events, allocator, alloc, delete, not args.no_empty_cache)
        free_all(first.pop("_live"), delete)
        before = allocator.stats().get("num_device_alloc", 0) or 0
        if allocator.device is not None:
            allocator.device.reset_call_counts()
        for _ in range(args.warm_passes):
            start = now()
            timed = replay(events, allocator, alloc, delete, not args.no_empty_cache)
            free_all(timed.pop("_live"), delete)
            warm_times.append((now() - start) / max(timed["ops_replayed"], 1))
        warm_stats = allocator.stats()
        warm = {"warm_ns_per_op": round(statistics.median(warm_times), 1),
                "warm_passes": args.warm_passes,
                "warm_device_allocs": (warm_stats.get("num_device_alloc", 0) or 0) - before,
                "warm_peak_reserved_bytes": warm_stats.get("reserved_bytes.all.peak", 0)}
        if allocator.device is not None:
            # Per warm step: the driver work a training step would pay.
            total = driver_time(allocator.device)
            steps = args.warm_passes
            warm["warm_step_driver"] = {
                "calls": {name: round(count / steps, 2) for name, count in total["calls"].items()},
                "modelled_us": round(total["modelled_us"] / steps, 1),
                "synchronizing_calls": round(total["synchronizing_calls"] / steps, 2)}

    # The same loop over no-op functions: Python's share of the time per op.
    counter = iter(range(1, 1 << 62))

    def fake_alloc(size, device, stream):
        return next(counter)

    def fake_delete(ptr):
        return None

    loop_times = []
    for _ in range(max(args.repeat, 1)):
        start = now()
        fake = replay(events, allocator, fake_alloc, fake_delete, False)
        loop_times.append((now() - start) / max(fake["ops_replayed"], 1))

    peak_reserved = stats.get("reserved_bytes.all.peak", 0)
    peak_requested = stats.get("requested_bytes.all.peak", 0)
    result = {
        "trace": Path(path).stem,
        "allocator": ("pytorch_native" if allocator.kind == "native" else "torchmem_cuda")
                     + ("_expandable" if expandable(args.alloc_conf) else ""),
        "alloc_conf": args.alloc_conf,
        "events": len(events),
    }
    result.update({k: v for k, v in counts.items() if k != "first_error"})
    result.update({
        "peak_reserved_bytes": peak_reserved,
        "peak_allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
        "peak_requested_bytes": peak_requested,
        "final_reserved_bytes": stats.get("reserved_bytes.all.current", 0),
        "peak_reserved_over_peak_requested":
            round(peak_reserved / peak_requested, 4) if peak_requested else 0.0,
        "num_device_alloc": stats.get("num_device_alloc"),
        "num_device_free": stats.get("num_device_free"),
        "ns_per_op": round(statistics.median(times), 1) if times else 0.0,
        "python_loop_ns_per_op": round(statistics.median(loop_times), 1),
        "clock": args.clock,
        "timed_repeats": args.repeat,
        **warm,
        "api": "raw" if args.raw else "caching_allocator_alloc",
    })
    result.update(fragmentation)
    if device_calls is not None:
        result["device_calls"] = device_calls
        result["cold_driver"] = cold
    if "first_error" in counts:
        result["first_error"] = counts["first_error"]
    result["path"] = path
    return result


def worker_main(args: argparse.Namespace) -> int:
    allocator = Allocator(args.allocator)
    status = 0
    for path in args.paths:
        try:
            print(json.dumps(worker_replay(path, args, allocator)), flush=True)
        except ValueError as error:
            print(f"trace_replay_native: {error}", file=sys.stderr)
            status = 1
    return status


# --- the parent ---------------------------------------------------------------------

def expandable(alloc_conf: str) -> bool:
    """Whether a PYTORCH_CUDA_ALLOC_CONF value turns expandable segments on."""
    options = dict(item.split(":", 1) for item in alloc_conf.replace(" ", "").split(",")
                   if ":" in item)
    return options.get("expandable_segments", "False").lower() == "true"


def device_environment(args: argparse.Namespace) -> dict:
    if args.device == "real":
        env = dict(os.environ)
    else:
        sys.path.insert(0, str(REPO_ROOT / "tests" / "simcuda"))
        import simcuda  # noqa: E402

        try:
            # PyTorch's expandable segments need NVML, as on any machine with a GPU.
            env = simcuda.environment(memory_bytes=args.memory,
                                      nvml=expandable(args.alloc_conf))
        except simcuda.SimcudaNotBuilt as error:
            sys.exit(f"trace_replay_native: {error}")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH", ""), str(REPO_ROOT)) if p)  # a PYTHONPATH given wins
    # PyTorch's defaults (no expandable segments, no max_split_size) unless --alloc-conf.
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if args.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    return env


def worker_command(args: argparse.Namespace, paths: list[str]) -> list[str]:
    """The command line of a worker that replays `paths` with this run's settings."""
    command = [sys.executable, os.path.abspath(__file__), "--worker",
               "--allocator", args.allocator, "--repeat", str(args.repeat),
               "--warm-passes", str(args.warm_passes), "--clock", args.clock,
               "--alloc-conf", args.alloc_conf]
    for flag in ("raw", "no_empty_cache", "no_fragmentation"):
        if getattr(args, flag):
            command.append("--" + flag.replace("_", "-"))
    return command + paths


def run_trace(path: str, args: argparse.Namespace, env: dict) -> dict | None:
    command = worker_command(args, [path])
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"trace_replay_native: {path} failed (exit {proc.returncode}):\n"
              f"{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_traces_one_process(paths: list[str], args: argparse.Namespace, env: dict):
    """Replays every trace in one worker process (saves the start-up of torch and CUDA per
    trace: a few seconds each); the allocator is emptied and its statistics reset before
    each trace, so each starts from an empty cache as in a fresh process. Yields
    (path, result or None) in order."""
    command = worker_command(args, paths)
    with tempfile.TemporaryFile(mode="w+") as errors:  # a pipe could fill up and block
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=errors,
                                text=True)
        results = {}
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                results[row["path"]] = row
        proc.wait()
        errors.seek(0)
        stderr = errors.read()
    if proc.returncode != 0:
        print(f"trace_replay_native: the worker exited with {proc.returncode}:\n"
              f"{stderr[-3000:]}", file=sys.stderr)
    for path in paths:
        yield path, results.get(path)


def print_comparison(results: list[dict], engine_file: str) -> None:
    """Peak reserved of torchmem's engine (trace_replay) vs this allocator, per trace."""
    engine = {}
    with open(engine_file) as stream:
        for line in stream:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                engine[row["trace"]] = row
    gib = float(1 << 30)
    print(f"\n{'trace':36} {'peak req':>8} {'native':>8} {'torchmem':>8} {'tm/nat':>7} "
          f"{'warm nat':>8} {'warm tm':>8} {'tm/nat':>7} {'dev allocs n/tm':>15} "
          f"{'ns/op native (py loop)':>22} {'ns/op tm':>8}")
    ratios, warm_ratios = [], []
    for row in results:
        other = engine.get(row["trace"])
        if other is None:
            continue
        native, ours = row["peak_reserved_bytes"], other["peak_reserved_bytes"]
        ratio = ours / native if native else float("nan")
        ratios.append(ratio)
        warm_native = row.get("warm_peak_reserved_bytes")
        warm_ours = other.get("warm_peak_reserved_bytes")
        warm_ratio = (warm_ours / warm_native) if warm_native and warm_ours else float("nan")
        if warm_native and warm_ours:
            warm_ratios.append(warm_ratio)
        print(f"{row['trace'][:36]:36} {row['peak_requested_bytes'] / gib:8.3f} "
              f"{native / gib:8.3f} {ours / gib:8.3f} {ratio:7.3f} "
              f"{(warm_native or 0) / gib:8.3f} {(warm_ours or 0) / gib:8.3f} {warm_ratio:7.3f} "
              f"{row['num_device_alloc']:>7}/{other['num_device_alloc']:<7} "
              f"{row['ns_per_op']:>13.0f} ({row['python_loop_ns_per_op']:>5.0f}) "
              f"{other['ns_per_op']:>8.0f}")
    if ratios:
        print(f"GiB; peak reserved torchmem/native: worse on {sum(r > 1 for r in ratios)} of "
              f"{len(ratios)} traces, max {max(ratios):.3f}; warm passes: worse on "
              f"{sum(r > 1 for r in warm_ratios)} of {len(warm_ratios)}, "
              f"max {max(warm_ratios, default=float('nan')):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Replay CSV allocation traces through PyTorch's native CUDA caching "
                    "allocator (on the simulated device by default) and print one JSON "
                    "object per trace, with the keys of trace_replay.")
    parser.add_argument("paths", nargs="*",
                        help="trace files or directories of *.csv traces (default: "
                             "$TORCHMEM_TRACES_DIR, else /work/shared/traces, else benchmarks/traces)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed replays per trace, median reported (default 3)")
    parser.add_argument("--warm-passes", type=int, default=5,
                        help="timed passes from a warm cache after an untimed one, survivors "
                             "freed after each (default 5; 0: none)")
    parser.add_argument("--allocator", choices=("native", "torchmem"), default="native",
                        help="PyTorch's native allocator (default) or torchmem's CUDA "
                             "allocator via torchmem.install()")
    parser.add_argument("--alloc-conf", default="", metavar="CONF",
                        help="PYTORCH_CUDA_ALLOC_CONF for the replay, e.g. "
                             "expandable_segments:True (default: none, PyTorch's defaults)")
    parser.add_argument("--device", choices=("sim", "real"), default="sim",
                        help="simulated CUDA device (default) or the machine's own")
    parser.add_argument("--memory", default="1T",
                        help="capacity of the simulated device (default 1T; reserved lazily)")
    parser.add_argument("--raw", action="store_true",
                        help="call torch._C._cuda_cudaCachingAllocator_raw_alloc/raw_delete "
                             "directly (less Python per op) instead of "
                             "torch.cuda.caching_allocator_alloc/delete")
    parser.add_argument("--no-empty-cache", action="store_true",
                        help="ignore empty_cache rows")
    parser.add_argument("--no-fragmentation", action="store_true",
                        help="skip the replay that takes snapshots at the peaks")
    parser.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    parser.add_argument("--compare", metavar="ENGINE_JSONL",
                        help="trace_replay's output: print peak reserved side by side")
    parser.add_argument("--from-json", metavar="NATIVE_JSONL",
                        help="do not replay: read this script's earlier --json output (for "
                             "--compare)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu (default): the thread's CPU time, robust when other processes "
                             "share the cores; wall: elapsed time")
    parser.add_argument("--one-process", action="store_true",
                        help="replay all traces in one process (cache emptied and statistics "
                             "reset between traces) instead of one process per trace")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        return worker_main(args)
    if args.from_json:
        with open(args.from_json) as stream:
            results = [json.loads(line) for line in stream if line.startswith("{")]
        if args.compare:
            print_comparison(results, args.compare)
        return 0

    paths = args.paths or [os.environ.get("TORCHMEM_TRACES_DIR") or DEFAULT_TRACES]
    files = []
    for path in paths:
        try:
            files.extend(list_traces(path))
        except FileNotFoundError as error:
            print(f"trace_replay_native: {error}", file=sys.stderr)
            return 1
    env = device_environment(args)
    results = []
    status = 0
    out = open(args.json, "w") if args.json else None
    if args.one_process:
        outcomes = run_traces_one_process(files, args, env)
    else:
        outcomes = ((path, run_trace(path, args, env)) for path in files)
    for path, result in outcomes:
        if result is None:
            print(f"trace_replay_native: no result for {path}", file=sys.stderr)
            status = 1
            continue
        results.append(result)
        line = json.dumps(result)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
    if out:
        out.close()
    if args.compare:
        print_comparison(results, args.compare)
    return status


if __name__ == "__main__":
    sys.exit(main())
