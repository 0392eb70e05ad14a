"""Running the benchmarks: each function runs one section's tool(s), leaves the raw
output under ``raw/`` and returns what the report needs to know about the run (flags,
exit codes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from runall.common import BENCH, run


# --- 1. engine ----------------------------------------------------------------------------

def parse_benchmark_json(path: Path) -> dict:
    """{(variant, threads): {"real": ns, "cpu": ns, "device_allocs": n, "label": s}}."""
    data = json.loads(path.read_text())
    groups: dict = {}
    for entry in data.get("benchmarks", []):
        name = entry.get("run_name") or entry["name"]
        match = re.match(r"(.+?)(?:/real_time)?/threads:(\d+)", name)
        if not match:
            continue
        key = (match.group(1), int(match.group(2)))
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[entry.get("time_unit", "ns")]
        group = groups.setdefault(key, {"iterations": [], "median": None})
        if entry.get("error_occurred"):
            group["error"] = entry.get("error_message")
            continue
        sample = {"real": entry["real_time"] * scale, "cpu": entry["cpu_time"] * scale,
                  "device_allocs": entry.get("device_allocs"), "label": entry.get("label", "")}
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_name") == "median":
                group["median"] = sample
        else:
            group["iterations"].append(sample)
    result = {}
    for key, group in groups.items():
        if group.get("error"):
            result[key] = {"error": group["error"]}
        elif group["median"] is not None:
            result[key] = group["median"]
        elif group["iterations"]:
            its = group["iterations"]
            result[key] = {"real": statistics.median(s["real"] for s in its),
                           "cpu": statistics.median(s["cpu"] for s in its),
                           "device_allocs": max((s["device_allocs"] or 0) for s in its),
                           "label": its[0]["label"]}
    return result


def run_engine(args, raw: Path, files: list[Path]) -> dict:
    mix_dir = raw / "trace_mix"
    if mix_dir.exists():
        shutil.rmtree(mix_dir)
    mix_dir.mkdir()
    for i, f in enumerate(files):  # the benchmark reads a directory of *.csv
        (mix_dir / f"{i:03d}_{f.name}").symlink_to(f)
    binary = args.build_dir / "benchmarks" / "engine_benchmark"
    flags = [f"--traces_dir={mix_dir}", f"--benchmark_out={raw / 'engine.json'}",
             "--benchmark_out_format=json"]
    if args.quick:
        flags += ["--benchmark_min_time=0.02", "--benchmark_repetitions=1"]
    run([binary, *flags], log_file=raw / "engine.txt")
    result = {"flags": flags}
    if not args.quick and not args.no_profile and shutil.which("valgrind"):
        try:
            result["profile"] = profile_engine(args, raw, mix_dir)
        except (RuntimeError, subprocess.SubprocessError) as error:
            result["profile_error"] = str(error)
    return result


PROFILE_VARIANTS = ("engine/trace_mix/plain", "engine/trace_mix/tag_scope", "toy/trace_mix",
                    "std_set/trace_mix", "engine/one_size/plain", "engine/one_size/tag_scope",
                    "toy/one_size", "std_set/one_size")


def profile_engine(args, raw: Path, mix_dir: Path) -> dict:
    """Instructions per alloc+free pair under callgrind (timed loops only, 1 thread)."""
    binary = args.build_dir / "benchmarks" / "engine_benchmark"
    env = dict(os.environ, TORCHMEM_BENCH_DEBUG="1")
    out = {}
    for variant in PROFILE_VARIANTS:
        stem = variant.replace("/", "_")
        cg = raw / f"callgrind_{stem}.out"
        proc = run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={cg}", binary, f"--traces_dir={mix_dir}",
                    "--benchmark_repetitions=1", "--benchmark_min_time=0.02",
                    "--benchmark_enable_random_interleaving=false",
                    f"--benchmark_filter=^{variant}/real_time/threads:1$"],
                   env=env, log_file=raw / f"callgrind_{stem}.log")
        iterations = sum(int(m) for m in re.findall(r"timed loop of (\d+) iterations",
                                                     proc.stderr))
        annotate = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", str(cg)],
                                  capture_output=True, text=True).stdout
        (raw / f"callgrind_{stem}.txt").write_text(annotate)
        total = re.search(r"^\s*([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", annotate, re.M)
        total_ir = int(total.group(1).replace(",", "")) if total else 0
        entry = {"iterations": iterations, "ir": total_ir,
                 "ir_per_pair": total_ir / iterations if iterations else None}
        if variant.startswith("engine/"):
            entry["by_source"], entry["by_function"] = parse_annotate(annotate, iterations)
        out[variant] = entry
    return out


def short_function(name: str) -> str:
    """'ns::Class::Method(args) [clone ...]' -> 'Class::Method', templates dropped."""
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*", "", name)
    previous = None
    while previous != name:
        previous, name = name, re.sub(r"<[^<>]*>", "", name)
    name = name.strip().split(" ")[-1]  # drop a return type
    parts = [p for p in name.split("::") if p]
    return "::".join(parts[-2:]) if parts else name


def parse_annotate(text: str, iterations: int):
    """Self cost per pair by source file (inlined code counts where it was written) and by
    function (its own code plus what was inlined into it)."""
    by_source: dict[str, float] = {}
    by_function: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.+?):(.+?)(?: \[.*\])?$", line)
        if not match or "PROGRAM TOTALS" in line:
            continue
        ir = int(match.group(1).replace(",", ""))
        source = Path(match.group(2)).name
        function = short_function(match.group(3))
        by_source[source] = by_source.get(source, 0) + ir / max(iterations, 1)
        by_function[function] = by_function.get(function, 0) + ir / max(iterations, 1)
    return (dict(sorted(by_source.items(), key=lambda kv: -kv[1])),
            {k: v for k, v in sorted(by_function.items(), key=lambda kv: -kv[1]) if v >= 0.5})


# --- 2..5. the Python benchmarks ----------------------------------------------------------

def run_cuda(args, raw: Path, env: dict) -> dict:
    variants = "native,torchmem,torchmem_tag,torchmem_leak_check,native_history"
    flags = ["--variants", variants, "--json", raw / "cuda_e2e.json"]
    if args.quick:
        flags += ["--rounds", "1", "--batches", "2", "--batch-seconds", "0.005"]
    else:
        flags += ["--rounds", str(args.rounds)]
    run([sys.executable, BENCH / "cuda_e2e_benchmark.py", *flags], env=env,
        log_file=raw / "cuda_e2e.txt")
    return {"flags": [str(f) for f in flags]}


def run_cpu(args, raw: Path, env: dict) -> dict:
    flags = ["--json", raw / "cpu_tensors.json"]
    if args.quick:
        flags += ["--sizes", "0,4K,1M,64M", "--rounds", "1", "--batches", "2",
                  "--batch-seconds", "0.005"]
    else:
        flags += ["--sizes", "0,4K,16K,64K,256K,1M,4M,16M,64M", "--rounds", str(args.rounds)]
    run([sys.executable, BENCH / "cpu_tensor_benchmark.py", *flags], env=env,
        log_file=raw / "cpu_tensors.txt")
    return {"flags": [str(f) for f in flags]}


# The replays of section 4 through PyTorch and torchmem on the simulated device: (output
# name, trace_replay_native.py allocator, PYTORCH_CUDA_ALLOC_CONF, the engine variant it
# needs or None). Expandable segments select torchmem's VMM backend as they do PyTorch's.
CUDA_REPLAYS = (
    ("replay_native", "native", "", None),
    ("replay_native_expandable", "native", "expandable_segments:True", None),
    ("replay_torchmem_cuda", "torchmem", "", None),
    ("replay_torchmem_cuda_vmm", "torchmem", "expandable_segments:True", "vmm"),
)


def engine_variants(args) -> list[str]:
    """The engine variants trace_replay can replay in this build (``--list_variants``)."""
    proc = run([args.build_dir / "benchmarks" / "trace_replay", "--list_variants"], check=False)
    if proc.returncode != 0:  # a trace_replay from before variants: the one engine there was
        return ["pytorch"]
    return [v["name"] for v in json.loads(proc.stdout)["variants"]]


def run_fragmentation(args, raw: Path, env: dict, files: list[Path]) -> dict:
    repeat, warm = ("1", "1") if args.quick else ("3", "3")
    variants = engine_variants(args)
    engine_out = raw / "replay_engine.jsonl"
    proc = run([args.build_dir / "benchmarks" / "trace_replay", f"--repeat={5 if not args.quick else 1}",
                f"--warm_passes={5 if not args.quick else 1}", "--variants=all", *files],
               check=False, log_file=raw / "replay_engine.log")
    engine_out.write_text(proc.stdout)
    status = {"engine_exit": proc.returncode, "engine_variants": variants}
    for name, allocator, alloc_conf, needs in CUDA_REPLAYS:
        if needs is not None and needs not in variants:
            status[f"{name}_exit"] = f"not built: trace_replay has no {needs!r} variant"
            continue
        flags = ["--one-process", "--allocator", allocator, "--repeat", repeat, "--warm-passes",
                 warm, "--json", raw / f"{name}.jsonl"]
        if alloc_conf:
            flags += ["--alloc-conf", alloc_conf]
        if args.quick:
            flags.append("--no-fragmentation")
        proc = run([sys.executable, BENCH / "trace_replay_native.py", *flags, *files], env=env,
                   check=False, log_file=raw / f"{name}.txt")
        status[f"{name}_exit"] = proc.returncode
    return status


def run_stack(args, raw: Path, env: dict) -> dict:
    flags = ["--json", raw / "stack_capture.json"]
    if args.quick:
        flags += ["--rounds", "3", "--iterations", "2000"]
    run([sys.executable, BENCH / "stack_capture_overhead.py", *flags], env=env,
        log_file=raw / "stack_capture.txt")
    return {"flags": [str(f) for f in flags]}
