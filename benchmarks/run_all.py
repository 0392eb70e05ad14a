#!/usr/bin/env python3
"""One command for every benchmark: builds what is missing, measures, writes the report.

    python3 benchmarks/run_all.py                      # full run (about 10 minutes on 2 cores)
    python3 benchmarks/run_all.py --quick              # smoke run (about a minute; CI)
    python3 benchmarks/run_all.py --traces DIR_OR_CSV [DIR_OR_CSV ...]
    python3 benchmarks/run_all.py --report-only        # rewrite the report from raw/ outputs

What it runs, in one process tree, torchmem against PyTorch's own allocators:

1. engine: ``engine_benchmark`` (Google Benchmark: ns per alloc+free pair on cache hits,
   one size and the traces' size mix, 1 and 2 threads, plain and with a tag and a leak
   scope; toy and std::set baselines; random interleaving of repetitions, medians),
   plus, in the full run when valgrind is installed, instructions per pair under
   callgrind (independent of the machine's load) and where they go;
2. CUDA end to end (``cuda_e2e_benchmark.py``) on the simulated device: ``torch.empty``
   on CUDA and ``caching_allocator_alloc/delete``, PyTorch's native allocator vs torchmem
   (plain, with a tag, inside a leak_check with stack capture) and native with
   ``_record_memory_history``; one process per variant, ABBA rounds;
3. CPU tensors (``cpu_tensor_benchmark.py``): 4 KiB .. 64 MiB, default CPU allocator vs
   torchmem, ABBA rounds of processes;
4. fragmentation: every trace replayed through torchmem's engine (``trace_replay``, each
   engine variant it has: PyTorch-identical today, the VMM backend of issue 12 once built)
   and through PyTorch's native CUDA allocator on the simulated device
   (``trace_replay_native.py``), with its defaults and with
   ``expandable_segments:True``, and, as a cross-check, through torchmem's CUDA
   allocator on the same device and the same Python path (with expandable segments too,
   once the VMM variant exists);
5. stack capture overhead (``stack_capture_overhead.py``) by stack depth, next to the
   end-to-end costs of leak_check and of ``_record_memory_history`` from (2).

Outputs: ``benchmarks/results/README.md`` (machine, command, one table per measurement
with ratios to the baseline, a goals table) and PNG plots next to it; raw outputs of
every tool under ``benchmarks/results/raw/`` (gitignored). ``--quick`` writes to
``benchmarks/results/raw/quick/`` instead, so a smoke run never overwrites the report.

Building: configures ``build/bench`` (CMake, Release, Ninja: engine, benchmarks, the
simulated CUDA device; no Python module, no tests) if it has no build files, then
builds the targets it needs (a no-op when up to date; ``--no-build`` skips it). The
Python benchmarks load the torchmem._C in ``torchmem/`` (``pip install -e .``) unless it
is missing or older than a source under ``csrc/`` (others edit the tree): then run_all
builds one from the current sources into ``build/bench-python`` and runs the Python
benchmarks against a package assembled there, leaving ``torchmem/`` alone
(``--extension tree|build`` forces either).

Timing: CPU time of the measuring thread wherever the tool allows (other processes on a
shared machine disturb it much less than wall time), A/B alternation, medians. Nothing
here asserts anything about time; the goals table reports met or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from runall.build import build, child_env, machine_info, trace_files
from runall.common import BENCH, DEFAULT_TRACES, REPO, SECTIONS, log
from runall.measure import run_cpu, run_cuda, run_engine, run_fragmentation, run_stack
from runall.report import Report


# --- main ---------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(
        description="Runs every torchmem benchmark against PyTorch's own allocators and writes "
                    "benchmarks/results/README.md with tables, a goals table and plots.")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run (about a minute): tiny samples, the two smallest traces; "
                             "writes to benchmarks/results/raw/quick/")
    parser.add_argument("--traces", nargs="+", metavar="DIR_OR_CSV",
                        help="trace files or directories of *.csv traces (default "
                             "$TORCHMEM_TRACES_DIR, else /work/shared/traces, else benchmarks/traces)")
    parser.add_argument("--only", help=f"comma-separated sections to run, from {','.join(SECTIONS)}")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip")
    parser.add_argument("--rounds", type=int, default=7,
                        help="A/B rounds of the CUDA and CPU benchmarks (default 7)")
    parser.add_argument("--out", type=Path,
                        help="report directory (default benchmarks/results; --quick: "
                             "benchmarks/results/raw/quick; --only/--skip: "
                             "benchmarks/results/raw/partial, so a partial run never replaces "
                             "the full report)")
    parser.add_argument("--build-dir", type=Path, default=REPO / "build" / "bench",
                        help="CMake build directory for the C++ tools and the simulated device "
                             "(default build/bench)")
    parser.add_argument("--simcuda-dir", type=Path,
                        help="directory with the simulated device's libraries (default "
                             "<build-dir>/simcuda)")
    parser.add_argument("--no-build", action="store_true", help="use the binaries as they are")
    parser.add_argument("--no-profile", action="store_true", help="skip the callgrind profile")
    parser.add_argument("--extension", choices=("auto", "tree", "build"), default="auto",
                        help="which torchmem._C the Python benchmarks load: tree = torchmem/_C*.so; "
                             "build = one built from the current sources into build/bench-python "
                             "(torchmem/ untouched); auto (default) = tree unless it is missing or "
                             "older than a source under csrc/")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", "2")),
                        help="build jobs (default $MAX_JOBS or 2)")
    parser.add_argument("--report-only", action="store_true",
                        help="do not measure: rewrite the report from the raw outputs of the "
                             "last run in the output directory")
    args = parser.parse_args()
    args.build_dir = args.build_dir.resolve()
    default_out = (BENCH / "results" / "raw" / "quick" if args.quick else
                   BENCH / "results" / "raw" / "partial" if args.only or args.skip else
                   BENCH / "results")
    out = (args.out or default_out).resolve()
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)

    if args.report_only:
        meta = json.loads((raw / "run.json").read_text())
        for stale in out.glob("*.png"):
            stale.unlink()
        path = Report(out, raw, meta).write()
        print(path)
        return 0

    started = time.monotonic()
    command = "python3 benchmarks/run_all.py" + "".join(
        " " + shlex.quote(a) for a in sys.argv[1:])
    sections = [s for s in (args.only.split(",") if args.only else SECTIONS) if s]
    for s in sections + [s for s in args.skip.split(",") if s]:
        if s not in SECTIONS:
            parser.error(f"unknown section {s!r}; choose from {', '.join(SECTIONS)}")
    sections = [s for s in sections if s not in args.skip.split(",")]
    traces = args.traces or [os.environ.get("TORCHMEM_TRACES_DIR") or DEFAULT_TRACES]
    files = trace_files(traces)
    replay_files = files
    if args.quick:
        replay_files = sorted(files, key=lambda f: f.stat().st_size)[:2]

    log(f"sections: {', '.join(sections)}; {len(files)} traces; results in {out}")
    meta = {"quick": args.quick, "command": command, "build_dir": str(
        args.build_dir.relative_to(REPO) if args.build_dir.is_relative_to(REPO) else args.build_dir),
        "traces": [str(f) for f in files], "replay_traces": [str(f) for f in replay_files],
        "sections_run": sections, "sections": {}, "errors": {}, "section_seconds": {}}
    meta["machine"] = machine_info()
    log(f"load average at start: {meta['machine']['load_start']}")
    for stale in list(raw.glob("*.json")) + list(raw.glob("*.jsonl")) + list(out.glob("*.png")):
        stale.unlink()

    t0 = time.monotonic()
    meta["build"] = build(args, raw)
    meta["section_seconds"]["build"] = time.monotonic() - t0
    env = child_env(args, meta["build"])

    steps = {"engine": lambda: run_engine(args, raw, files),
             "cuda": lambda: run_cuda(args, raw, env),
             "cpu": lambda: run_cpu(args, raw, env),
             "fragmentation": lambda: run_fragmentation(args, raw, env, replay_files),
             "stack": lambda: run_stack(args, raw, env)}
    for section in SECTIONS:
        if section not in sections:
            continue
        log(f"section {section} ...")
        t0 = time.monotonic()
        try:
            meta["sections"][section] = steps[section]()
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            meta["errors"][section] = str(error).strip().splitlines()[0][:300] if str(error) else repr(error)
            log(f"section {section} failed: {error}")
        meta["section_seconds"][section] = time.monotonic() - t0
        log(f"section {section} done in {meta['section_seconds'][section]:.0f} s")

    meta["load_end"] = os.getloadavg()
    meta["elapsed_seconds"] = time.monotonic() - started
    (raw / "run.json").write_text(json.dumps(meta, indent=2, default=str))
    path = Report(out, raw, meta).write()
    log(f"report: {path} ({meta['elapsed_seconds']:.0f} s in all)")
    return 1 if meta["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
