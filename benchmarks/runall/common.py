"""Paths, goals and small helpers every part of run_all shares: formatting figures for
the report, running a child process with its output logged, reading JSON Lines."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
# The full set beside the repository when it is there, else the samples checked in.
DEFAULT_TRACES = (
    "/work/shared/traces"
    if os.path.isdir("/work/shared/traces")
    else str(BENCH / "traces")
)
SECTIONS = ("engine", "cuda", "cpu", "fragmentation", "stack")
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Goals (issue 5 / DESIGN.md "Performance").
ENGINE_BUDGET_NS = 50.0
ENGINE_TAG_BUDGET_NS = 80.0
CUDA_TAG_BUDGET = 1.00
CUDA_LEAK_BUDGET = 1.5
CPU_SPEEDUP_GOAL = 1.5
CPU_GOAL_MIN_BYTES = 1 * MIB


# --- small helpers ------------------------------------------------------------------------

def log(message: str) -> None:
    print(f"[run_all {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def format_bytes(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= KIB:
        return f"{n / KIB:.1f} KiB"
    return f"{n:.0f} B"


def size_label(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt(x, digits=0) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:,.{digits}f}"


def ratio(a, b, digits=2) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.{digits}f}×"


def run(command, *, log_file: Path | None = None, env=None, check=True, cwd=REPO,
        timeout=None) -> subprocess.CompletedProcess:
    """Runs a command; stdout+stderr also go to log_file."""
    log("$ " + " ".join(shlex.quote(str(c)) for c in command))
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
    if log_file is not None:
        log_file.write_text(proc.stdout + ("\n--- stderr ---\n" + proc.stderr if proc.stderr
                                           else ""))
    if check and proc.returncode != 0:
        raise RuntimeError(f"{Path(str(command[0])).name} exited with {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    return proc


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows
