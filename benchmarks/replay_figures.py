"""Compares the placement figures of two trace_replay runs, byte for byte.

trace_replay prints one JSON object per trace and engine variant; everything
in it but the timings is deterministic (peaks, device calls, fragmentation).
An engine change that must not change a single placement decision shows
identical figures before and after:

    build-before/benchmarks/trace_replay --repeat=1 --warm_passes=1 > before.jsonl
    build/release/benchmarks/trace_replay --repeat=1 --warm_passes=1 > after.jsonl
    python3 benchmarks/replay_figures.py before.jsonl after.jsonl

Exit status 0 and "identical" if every row matches, 1 and the rows that
differ otherwise (2 if a file has no rows).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Fields that measure time (or say how it was measured), or where the trace
# was read from: everything else is a placement figure.
TIMING_FIELDS = {"ns_per_op", "warm_ns_per_op", "clock", "timed_repeats", "path"}


def figures(path: Path) -> dict[tuple[str, str], str]:
    """(trace, variant) -> the row without its timings, as canonical JSON."""
    rows = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        key = (row.get("trace", "?"), row.get("variant", "?"))
        rows[key] = json.dumps({k: v for k, v in row.items() if k not in TIMING_FIELDS},
                               sort_keys=True)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    before, after = figures(Path(argv[1])), figures(Path(argv[2]))
    if not before or not after:
        print(f"no rows in {argv[1] if not before else argv[2]}", file=sys.stderr)
        return 2
    differ = [key for key in sorted(before.keys() | after.keys())
              if before.get(key) != after.get(key)]
    for trace, variant in differ:
        print(f"differs: {trace} ({variant})\n  before: {before.get((trace, variant))}\n"
              f"  after:  {after.get((trace, variant))}")
    if differ:
        print(f"{len(differ)} of {len(before.keys() | after.keys())} rows differ")
        return 1
    variants = sorted({variant for _, variant in before})
    print(f"identical: {len(before)} rows ({len(before) // max(len(variants), 1)} traces x "
          f"{', '.join(variants)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
