#!/usr/bin/env python3
"""Per-test outcome of PyTorch's tests under PyTorch's allocator and under torchmem.

Reads the JUnit XML files that scripts/run_pytorch_allocator_tests.sh writes (a
directory per allocator, a file per test) and
prints a Markdown table: one row per test with its outcome under each allocator and,
where they differ or torchmem's run failed, the first line of the failure.
"""

from __future__ import annotations

import sys
from pathlib import Path
import xml.etree.ElementTree as ElementTree


def outcomes(directory: str) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | skipped, first line of the message), from every file."""
    results: dict[str, tuple[str, str]] = {}
    cases = [case for path in sorted(Path(directory).glob("*.xml"))
             for case in ElementTree.parse(path).getroot().iter("testcase")]
    for case in cases:
        name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                text = element.get("message") or element.text or ""
                message = text.strip().splitlines()[0][:160] if text.strip() else ""
                break
        results[name] = (outcome, message)
    return results


def main(native_dir: str, torchmem_dir: str) -> None:
    native, ours = outcomes(native_dir), outcomes(torchmem_dir)
    print("| test | PyTorch's allocator | torchmem | torchmem's failure (or why skipped) |")
    print("|---|---|---|---|")
    for name in sorted(set(native) | set(ours)):
        theirs, mine = native.get(name, ("not run", "")), ours.get(name, ("not run", ""))
        note = mine[1] if mine[0] != "passed" else ""
        print(f"| {name} | {theirs[0]} | {mine[0]} | {note.replace('|', '/')} |")
    for label, results in (("PyTorch's allocator", native), ("torchmem", ours)):
        counts = {kind: sum(1 for r in results.values() if r[0] == kind)
                  for kind in ("passed", "failed", "skipped")}
        print(f"\n{label}: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped")


if __name__ == "__main__":
    main(*sys.argv[1:3])
