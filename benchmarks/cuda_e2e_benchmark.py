#!/usr/bin/env python3
"""CUDA tensors end to end on the simulated device: PyTorch's native allocator vs torchmem.

What it measures: nanoseconds per allocation + free through PyTorch's public entry
points, on the simulated CUDA device (tests/simcuda: allocations, frees, streams and
events are real, kernels are no-ops, so only host-side costs are timed):

* ``empty``: ``t = torch.empty(n, dtype=torch.uint8, device=cuda); del t`` for several
  sizes (default 4 KiB, 1 MiB, 16 MiB) -- the path every CUDA tensor takes;
* ``cca``: ``p = torch.cuda.caching_allocator_alloc(n); torch.cuda.caching_allocator_delete(p)``
  -- the interop API (its Python wrapper looks up the current device and stream and
  enters ``torch.cuda.device``, so it is dearer than ``empty``);
* ``raw``: ``torch._C._cuda_cudaCachingAllocator_raw_alloc(n, stream)`` + ``raw_delete``
  -- the C entry points under ``cca`` with no Python wrapper: the largest allocator share.

Variants, one process each (PyTorch lets a process swap its CUDA allocator only once,
before CUDA is initialized):

* ``native``: PyTorch's CUDACachingAllocator (the baseline);
* ``torchmem``: ``torchmem.install()`` (torchmem's complete CUDAAllocator, installed with
  ``change_current_allocator(torchmem.cuda_allocator())``);
* ``torchmem_tag``: the same, every allocation inside ``torchmem.tag("bench")``;
* ``torchmem_leak_check``: the same, inside ``torchmem.leak_check()``, which opens a
  leak scope and turns on Python stack capture (every allocation records its stack);
* ``torchmem_pluggable`` (optional, ``--variants``): the reduced route, a
  ``CUDAPluggableAllocator`` over torchmem's exported C entry points;
* ``torchmem_vmm`` (optional, ``--variants``): ``torchmem.install()`` with
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: torchmem's virtual-memory backend
  (cuMem* calls on the simulated device);
* ``native_expandable`` (optional, ``--variants``): PyTorch's allocator with
  ``expandable_segments:True`` (the simulated NVML is preloaded for it, as PyTorch needs);
* ``native_history`` (optional, ``--variants``): the native allocator with
  ``torch.cuda.memory._record_memory_history(stacks="python")``, PyTorch's own way to
  record allocation stacks, for comparison with ``torchmem_leak_check``.

The loops run ``--depth`` Python frames deep (default 30: training code allocates 20 to
60 frames deep); only stack capture depends on the depth.

Fixed cost: both allocators pay the same Python + dispatcher + TensorImpl cost around
the allocator call. The ``floor`` rows measure it in every process: ``empty`` of 0
bytes (no allocator call on the native side) and the ``cca`` wrapper with the raw C
entry points replaced by trivial Python functions. ``- floor`` columns in the report
subtract the floor to show the allocator's own share.

How: time is the thread's CPU time by default (``--clock wall`` for elapsed time),
which other processes on a shared machine disturb much less. Each round runs every
variant once in its own process, the order reversed every other round (ABBA), so a
drifting machine hits all alike; inside a process the batches go round-robin over the
cases. Each figure is the median over rounds of the per-process median over batches,
and ratios are the medians of the per-round ratios (the processes of one round ran
seconds apart). A second estimate, ``floor_normalized`` in the JSON, divides each
process's figures by its own floor of the same API first, which cancels a process that
ran slow as a whole. The first process of each variant
also checks that the allocations really went where they should (torchmem's counters,
or torch.cuda.memory_stats for native) and that capture was on inside the leak check.

Run (torchmem's extension must be built with CUDA into torchmem/_C*.so, and the
simulated device built: ``cmake -S tests/simcuda -B build/simcuda && cmake --build
build/simcuda -j2``; ``$TORCHMEM_SIMCUDA_DIR`` picks a build):
    PYTHONPATH=$PWD python3 benchmarks/cuda_e2e_benchmark.py
    PYTHONPATH=$PWD python3 benchmarks/cuda_e2e_benchmark.py --rounds 7 --json out.json
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
from pathlib import Path

from bench_util import at_depth, format_bytes, frames_here, parse_size

REPO_ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("native", "torchmem", "torchmem_tag", "torchmem_leak_check", "torchmem_pluggable",
            "native_history", "torchmem_vmm", "native_expandable")
# Variants run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
EXPANDABLE_VARIANTS = ("torchmem_vmm", "native_expandable")
DEFAULT_VARIANTS = ("native", "torchmem", "torchmem_tag", "torchmem_leak_check")
BASELINE = "native"
DEFAULT_SIZES = [4 << 10, 1 << 20, 16 << 20]
APIS = ("empty", "cca", "raw")


def case_names(apis: list[str], sizes: list[int]) -> list[str]:
    """Case keys: '<api>/floor' first, then '<api>/<bytes>'."""
    names = []
    for api in apis:
        names.append(f"{api}/floor")
        names.extend(f"{api}/{size}" for size in sizes)
    return names


def case_label(name: str) -> str:
    api, what = name.split("/")
    return f"{api} {what}" if what == "floor" else f"{api} {format_bytes(int(what))}"


# --- the worker (runs on the simulated device) ---------------------------------------

def make_loop(torch, name: str):
    """A function loop(iterations) -> None doing one case's alloc + free `iterations` times."""
    api, what = name.split("/")
    nbytes = 0 if what == "floor" else int(what)
    if api == "empty":
        empty, u8, cuda = torch.empty, torch.uint8, torch.device("cuda", 0)

        def loop(iterations):
            for _ in range(iterations):
                t = empty(nbytes, dtype=u8, device=cuda)
                del t
        return loop
    if api == "cca":
        alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
        if what == "floor":
            # The wrapper's own cost: the raw C entry points replaced by trivial functions
            # while this loop runs (caching_allocator_alloc looks them up on each call).
            def loop(iterations):
                saved = (torch._C._cuda_cudaCachingAllocator_raw_alloc,
                         torch._C._cuda_cudaCachingAllocator_raw_delete)
                torch._C._cuda_cudaCachingAllocator_raw_alloc = lambda size, stream: 1
                torch._C._cuda_cudaCachingAllocator_raw_delete = lambda ptr: None
                try:
                    for _ in range(iterations):
                        p = alloc(0)
                        delete(p)
                finally:
                    (torch._C._cuda_cudaCachingAllocator_raw_alloc,
                     torch._C._cuda_cudaCachingAllocator_raw_delete) = saved
            return loop

        def loop(iterations):
            for _ in range(iterations):
                p = alloc(nbytes)
                delete(p)
        return loop
    if api == "raw":
        stream = torch.cuda.current_stream(0).cuda_stream
        if what == "floor":
            # Two calls of C builtins with the same arity: the interpreter's share.
            raw_alloc, raw_delete = max, abs

            def loop(iterations):
                for _ in range(iterations):
                    p = raw_alloc(nbytes, stream)
                    raw_delete(p)
            return loop
        raw_alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
        raw_delete = torch._C._cuda_cudaCachingAllocator_raw_delete

        def loop(iterations):
            for _ in range(iterations):
                p = raw_alloc(nbytes, stream)
                raw_delete(p)
        return loop
    raise ValueError(f"unknown case {name}")


def calibrate(loop, now, batch_seconds: float) -> int:
    """Warms up (the allocator's cache) and returns the iterations of one batch."""
    iterations = 32
    while True:
        start = now()
        loop(iterations)
        elapsed = now() - start
        if elapsed >= batch_seconds * 1e9 / 4 or iterations >= 1 << 22:
            break
        iterations *= 2
    return max(16, int(iterations * batch_seconds * 1e9 / max(elapsed, 1)))


def run_cases(torch, cases, now, batch_seconds, batches, depth):
    """Batches go round-robin over the cases (the order rotating), so a slow phase of a
    busy machine during the process hits every case alike."""
    loops = {name: make_loop(torch, name) for name in cases}

    def body():
        counts = {name: calibrate(loops[name], now, batch_seconds) for name in cases}
        per_batch = {name: [] for name in cases}
        for batch in range(batches):
            shift = batch % len(cases)
            for name in cases[shift:] + cases[:shift]:
                start = now()
                loops[name](counts[name])
                per_batch[name].append((now() - start) / counts[name])
        return frames_here(), per_batch

    frames, per_batch = at_depth(depth, body)
    results = {name: {"median": statistics.median(values), "batches": values}
               for name, values in per_batch.items()}
    return results, frames


def worker(variant: str, cases: list[str], batch_seconds: float, batches: int, clock: str,
           depth: int) -> dict:
    """Runs in the subprocess: measures every case with one allocator variant."""
    import contextlib

    import torch

    now = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns
    torch.set_num_threads(1)
    torchmem = None
    if variant.startswith("torchmem"):
        import torchmem

        if variant == "torchmem_pluggable":
            from torchmem.runtime import cuda as torchmem_cuda

            torchmem_cuda.install_pluggable_allocator()  # before anything initializes CUDA
        else:
            torchmem.install()  # before anything initializes CUDA
    torch.cuda.init()
    torch.empty(1, device="cuda")  # CUDA context, streams, first segment
    if variant == "native_history":
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")

    if variant == "torchmem_tag":
        context = torchmem.tag("bench")
    elif variant == "torchmem_leak_check":
        context = torchmem.leak_check()
    else:
        context = contextlib.nullcontext()
    before = None
    if torchmem is not None:
        before = torchmem.memory_stats("cuda").get("allocation.all.allocated", 0)
    with context:
        capture_on = None
        if torchmem is not None:
            capture_on = bool(torchmem._C.stack_capture_requested())
        results, frames = run_cases(torch, cases, now, batch_seconds, batches, depth)
        tag_allocations = None
        if variant == "torchmem_tag":
            tag_allocations = torchmem.tag_stats("cuda").get("bench")
    check = {"variant": variant, "capture_on_inside": capture_on,
             "tag_allocations": tag_allocations}
    if torchmem is not None:
        check["torchmem_allocations"] = (
            torchmem.memory_stats("cuda").get("allocation.all.allocated", 0) - (before or 0))
        check["native_allocations"] = None
        check["stack_table"] = {k: v for k, v in torchmem._C.capture_stats().items()
                                if k in ("interned_stacks", "distinct_frames")}
        check["extension"] = torchmem._C.__file__
        # Where the blocks came from: pages mapped (virtual memory) or cudaMalloc'd segments.
        check["vmm_maps"] = torchmem.memory_stats("cuda").get("vmm.num_map", 0)
    else:
        check["native_allocations"] = torch.cuda.memory_stats(0).get(
            "allocation.all.allocated", 0)
        check["torchmem_allocations"] = None
    if variant == "native_history":
        torch.cuda.memory._record_memory_history(enabled=None)
    return {"variant": variant, "results": results, "frames": frames, "check": check,
            "torch": torch.__version__, "clock": clock}


# --- the parent ------------------------------------------------------------------------

def simulated_environment() -> dict:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "simcuda"))
    import simcuda  # noqa: E402

    try:
        env = simcuda.environment(memory_bytes="64G")
    except simcuda.SimcudaNotBuilt as error:
        sys.exit(f"cuda_e2e_benchmark: {error}")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH", ""), str(REPO_ROOT)) if p)  # a PYTHONPATH given wins
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # PyTorch's defaults for the native allocator
    env.pop("PYTORCH_ALLOC_CONF", None)
    return env


def run_worker(variant: str, args: argparse.Namespace, env: dict) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", variant,
               "--apis", ",".join(args.apis), "--sizes", ",".join(str(s) for s in args.sizes),
               "--batch-seconds", str(args.batch_seconds), "--batches", str(args.batches),
               "--clock", args.clock, "--depth", str(args.depth)]
    if variant in EXPANDABLE_VARIANTS:
        env = dict(env, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        if variant == "native_expandable":  # PyTorch's expandable segments need NVML
            import simcuda  # on sys.path since simulated_environment()

            env["LD_PRELOAD"] = simcuda.preload(nvml=True)
    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if completed.returncode != 0:
        sys.exit(f"cuda_e2e_benchmark: the {variant} worker failed (exit "
                 f"{completed.returncode}):\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def summarize(samples: dict, variants: list[str], cases: list[str]) -> dict:
    """Medians over rounds, per-round ratios to the baseline and their medians.

    Two kinds of figures. Raw: medians over rounds of each process's figure. Normalized:
    each process's figure divided by its own floor of the same API (measured round-robin
    with the case, and independent of the allocator: it makes no allocator call), times
    the median floor of all processes. The second cancels a process that ran slow as a
    whole, which on a busy virtual machine happens to a process or two in every run (the
    hypervisor's time away counts as the thread's CPU time).
    """
    medians = {v: {c: statistics.median(samples[v][c]) for c in cases} for v in variants}
    floors = {api: statistics.median(x for v in variants for x in samples[v][f"{api}/floor"])
              for api in {c.split("/")[0] for c in cases}}

    def scaled(v, c):  # per round: the figure in units of its process's floor
        floor = f"{c.split('/')[0]}/floor"
        return [a / fa for a, fa in zip(samples[v][c], samples[v][floor]) if fa > 0]

    normalized = {v: {c: statistics.median(scaled(v, c)) * floors[c.split("/")[0]]
                      for c in cases} for v in variants}
    ratios = {}
    for v in variants:
        ratios[v] = {}
        for c in cases:
            pairs = [a / b for a, b in zip(samples[v][c], samples[BASELINE][c]) if b > 0]
            scaled_pairs = [a / b for a, b in zip(scaled(v, c), scaled(BASELINE, c)) if b > 0]
            ratios[v][c] = {"median": statistics.median(pairs) if pairs else float("nan"),
                            "min": min(pairs, default=float("nan")),
                            "max": max(pairs, default=float("nan")),
                            "floor_normalized": statistics.median(scaled_pairs)
                            if scaled_pairs else float("nan")}
    # The allocator's own share: ns over the floor, from the normalized figures.
    over_floor = {v: {c: normalized[v][c] - floors[c.split("/")[0]] for c in cases
                      if not c.endswith("/floor")} for v in variants}
    return {"medians": medians, "normalized_medians": normalized, "floors": floors,
            "ratios": ratios, "over_floor": over_floor}


def main() -> int:
    parser = argparse.ArgumentParser(
        description="torch.empty(device='cuda') + del and caching_allocator_alloc/delete on "
                    "the simulated CUDA device: PyTorch's native allocator vs torchmem (plain, "
                    "with a tag, inside a leak_check); one process per variant, alternating "
                    "rounds, medians and ratios to native.")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)} (default "
                             f"{','.join(DEFAULT_VARIANTS)}); 'native' is always included")
    parser.add_argument("--apis", default="empty,cca,raw",
                        help="comma-separated, from empty, cca, raw (default all)")
    parser.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                        default=DEFAULT_SIZES,
                        help="comma-separated sizes in bytes (K, M, G suffixes allowed); "
                             "default 4K,1M,16M")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds; each runs every variant once, order reversed every other "
                             "round (default 5)")
    parser.add_argument("--batches", type=int, default=5,
                        help="timed batches per case within a process (median); default 5")
    parser.add_argument("--batch-seconds", type=float, default=0.04,
                        help="target duration of one batch; default 0.04")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu (default): the thread's CPU time; wall: elapsed time")
    parser.add_argument("--depth", type=int, default=30,
                        help="Python frames at the allocation, about (default 30)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.apis = [a for a in args.apis.split(",") if a]
    for api in args.apis:
        if api not in APIS:
            parser.error(f"unknown api {api!r}; choose from {', '.join(APIS)}")
    cases = case_names(args.apis, args.sizes)

    if args.worker:
        # --depth counts frames at the allocation; the worker's own frames come first.
        extra = max(0, args.depth - 8)
        print(json.dumps(worker(args.worker, cases, args.batch_seconds, args.batches,
                                args.clock, extra)))
        return 0

    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if BASELINE not in variants:
        variants.insert(0, BASELINE)
    env = simulated_environment()
    samples = {v: {c: [] for c in cases} for v in variants}
    checks, frames, torch_version = {}, None, None
    started = time.monotonic()
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else list(reversed(variants))
        for variant in order:
            result = run_worker(variant, args, env)
            checks.setdefault(variant, result["check"])
            frames, torch_version = result["frames"], result["torch"]
            for c in cases:
                samples[variant][c].append(result["results"][c]["median"])
        print(f"round {round_index + 1}/{args.rounds} done "
              f"({time.monotonic() - started:.0f} s)", file=sys.stderr)

    summary = summarize(samples, variants, cases)
    medians, ratios = summary["medians"], summary["ratios"]
    print(f"CUDA alloc + free on the simulated device, ns per pair ({args.clock} time, median of "
          f"{args.rounds} alternating rounds; ratio = median of per-round variant/native; "
          f"{frames} Python frames at the allocation)")
    print("raw medians (in parentheses: median of per-round ratios to native; "
          "[floor-normalized ratio])")
    header = f"{'case':>14}" + "".join(f" {v:>26}" for v in variants)
    print(header)
    for c in cases:
        cells = []
        for v in variants:
            text = f"{medians[v][c]:.0f}"
            if v != BASELINE:
                text += (f" ({ratios[v][c]['median']:.2f}x)"
                         f"[{ratios[v][c]['floor_normalized']:.2f}]")
            cells.append(f" {text:>26}")
        print(f"{case_label(c):>14}" + "".join(cells))
    print("allocator share (ns over the floor of the same API, floor-normalized figures):")
    for c in cases:
        if c.endswith("/floor"):
            continue
        print(f"{case_label(c):>14}" + "".join(
            f" {summary['over_floor'][v][c]:>26.0f}" for v in variants))
    for v in variants:
        print(f"check {v}: {checks[v]}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": args.rounds, "clock": args.clock, "batches": args.batches,
                       "batch_seconds": args.batch_seconds, "depth": args.depth,
                       "frames": frames, "torch": torch_version, "variants": variants,
                       "cases": cases, "samples": samples, "checks": checks, **summary},
                      out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
