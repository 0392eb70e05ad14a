#!/usr/bin/env python3
"""A third-party test suite with and without torchmem's pytest plugin, as a user runs it.

    python3 benchmarks/third_party_suite.py CHECKOUT TEST_PATH [TEST_PATH ...] [options]

    # torchmetrics 1.9.0 (a checkout of its v1.9.0 tag outside this repository):
    python3 benchmarks/third_party_suite.py /path/to/torchmetrics \\
        tests/unittests/bases tests/unittests/wrappers \\
        --ignore tests/unittests/wrappers/test_feature_share.py --repeat 3

For each repetition it runs the named tests twice in fresh pytest processes, alternating
which goes first (A/B, then B/A): plain ``python -m pytest -p no:torchmem`` (an installed
torchmem's plugin not loaded) and the same with
``-p torchmem.integrations.pytest_plugin --torchmem --torchmem-device DEVICE`` (this checkout's
torchmem, through ``PYTHONPATH``). It prints:

- pass / fail / error / skip counts of each run;
- every test that passes plainly but fails under torchmem, with the plugin's report;
- the time ratio (torchmem / plain): the whole process (wall and CPU time) and the summed
  call phases of the tests that pass both ways (what a clean test pays);
- the analysis time per failing test: the plugin's own measurement (the
  ``torchmem_analysis_ms`` and ``torchmem_analysis_cpu_ms`` properties it records in the
  JUnit XML: wall time, and the analysing thread's CPU time, which the machine's load
  affects less) and the difference of the test's call phase with and without the plugin
  (available for any version).

Timings are medians over repetitions, with the load average before and after each run:
the machine may be shared, so compare CPU times and repeat. It is a benchmark: it
asserts nothing, and its exit status says only whether the runs could be made.

``--plant-leak DIR`` writes one test into the checkout's ``DIR`` for the runs (removed after):
it appends a tensor it computes to a module-level list, a leak any user would want failed. The
script then says whether it passed plainly and failed under the plugin, with the holder the
report names.

What the suite needs: its own test dependencies (for torchmetrics' bases/ and wrappers/:
``pip install 'scikit-learn>1.5,<1.8' cachier==4.1.0`` on top of this repository's
requirements). ``wrappers/test_feature_share.py`` builds Inception networks at import,
which downloads weights from the network: ignore it offline. The suite's own ``addopts``
are replaced by ``-o addopts=`` (they name plugins the tests do not need:
``--doctest-plus``); pass others after ``--``.
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
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAIN = "plain"
TORCHMEM = "torchmem"


@dataclass
class TestResult:
    outcome: str  # passed, failed, error, skipped
    call_seconds: float
    message: str = ""
    properties: dict = field(default_factory=dict)


@dataclass
class Run:
    mode: str
    wall_seconds: float
    cpu_seconds: float
    load_before: float
    load_after: float
    returncode: int
    tests: dict  # test id -> TestResult
    output_tail: str

    def count(self, outcome: str) -> int:
        return sum(1 for result in self.tests.values() if result.outcome == outcome)


def _load() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


def _parse_junit(path: str) -> dict:
    """test id -> TestResult from a JUnit XML file written by pytest."""
    tests = {}
    root = ElementTree.parse(path).getroot()
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                # An error in teardown after a passing call is still a failed test for the user.
                outcome = "failed" if child.tag == "failure" else "error"
                message = (child.get("message") or "") + "\n" + (child.text or "")
                break
            if child.tag == "skipped":
                outcome = "skipped"
        properties = {
            prop.get("name"): prop.get("value")
            for props in case.findall("properties")
            for prop in props.findall("property")
        }
        tests[test_id] = TestResult(outcome, float(case.get("time") or 0.0), message.strip(), properties)
    return tests


def run_suite(args, mode: str) -> Run:
    """One pytest process over the named tests; ``mode`` is PLAIN or TORCHMEM."""
    with tempfile.TemporaryDirectory(prefix="third_party_suite_") as scratch:
        junit = os.path.join(scratch, "junit.xml")
        command = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "-o", "junit_duration_report=call", f"--junitxml={junit}",
            # An installed torchmem registers the plugin through its entry point; loading
            # this checkout's copy by module name too would make pytest refuse to start
            # ("Plugin already registered under a different name"), and the plain run
            # should not load it at all.
            "-p", "no:torchmem",
        ]
        for ignored in args.ignore:
            command.append(f"--ignore={ignored}")
        if mode == TORCHMEM:
            command += ["-p", "torchmem.integrations.pytest_plugin", "--torchmem",
                        f"--torchmem-device={args.device}"]
            command += args.torchmem_args
        command += args.pytest_args + args.paths
        env = dict(os.environ)
        env["PYTHONPATH"] = args.repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        load_before = _load()
        usage_before = os.times()
        start = time.perf_counter()
        completed = subprocess.run(command, cwd=args.checkout, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        usage_after = os.times()
        cpu = (usage_after.children_user - usage_before.children_user) + (
            usage_after.children_system - usage_before.children_system
        )
        if not os.path.exists(junit):
            sys.exit(f"{mode} run wrote no JUnit XML (exit {completed.returncode}):\n{completed.stdout[-4000:]}"
                     f"\n{completed.stderr[-4000:]}")
        tests = _parse_junit(junit)
    return Run(mode, wall, cpu, load_before, _load(), completed.returncode, tests,
               (completed.stdout + completed.stderr)[-2000:])


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def summarize(runs: list[Run], show_reports: int) -> dict:
    """Prints the comparison and returns it as plain data."""
    plain = [run for run in runs if run.mode == PLAIN]
    checked = [run for run in runs if run.mode == TORCHMEM]
    print("\n== runs ==")
    for run in runs:
        print(f"  {run.mode:<9} passed {run.count('passed'):>4}  failed {run.count('failed'):>4}  "
              f"error {run.count('error'):>3}  skipped {run.count('skipped'):>3}   wall {run.wall_seconds:6.1f} s  "
              f"cpu {run.cpu_seconds:6.1f} s   load {run.load_before:.2f} -> {run.load_after:.2f}  "
              f"(exit {run.returncode})")
    # Tests that pass plainly in every plain run but fail under torchmem in some run.
    # The planted test is no torchmem-only failure but the leak it should catch: counted in
    # "== planted leak ==" below, not here.
    passing_plain = set.intersection(*(
        {test for test, result in run.tests.items() if result.outcome == "passed" and not _is_planted(test)}
        for run in plain
    ))
    torchmem_failures: dict[str, TestResult] = {}
    for run in checked:
        for test in sorted(passing_plain):
            result = run.tests.get(test)
            if result is not None and result.outcome in ("failed", "error"):
                torchmem_failures.setdefault(test, result)
    clean = [test for test in passing_plain
             if all(run.tests.get(test) and run.tests[test].outcome == "passed" for run in checked)]
    considered = len(passing_plain)
    print(f"\n== torchmem-only failures: {len(torchmem_failures)} of {considered} tests that pass without the "
          f"plugin ({100.0 * len(torchmem_failures) / max(considered, 1):.2f}%) ==")
    for position, (test, result) in enumerate(torchmem_failures.items()):
        if position < show_reports:
            print(f"\n--- {test}\n{result.message[:6000]}")
        else:
            print(f"  {test}")
    # Time ratios: whole process, and summed call phases of clean tests.
    def ratio(metric) -> float | None:
        pairs = [metric(b) / metric(a) for a, b in zip(plain, checked) if metric(a) > 0]
        return _median(pairs)

    wall_ratio = ratio(lambda run: run.wall_seconds)
    cpu_ratio = ratio(lambda run: run.cpu_seconds)
    calls_ratio = ratio(lambda run: sum(run.tests[test].call_seconds for test in clean))
    # Analysis per failing test: the plugin's own figure, and the call-phase difference.
    own = [float(result.properties["torchmem_analysis_ms"]) / 1000.0
           for run in checked for test in torchmem_failures
           if (result := run.tests.get(test)) is not None and "torchmem_analysis_ms" in result.properties]
    own_cpu = [float(result.properties["torchmem_analysis_cpu_ms"]) / 1000.0
               for run in checked for test in torchmem_failures
               if (result := run.tests.get(test)) is not None and "torchmem_analysis_cpu_ms" in result.properties]
    differences = []
    for test in torchmem_failures:
        plain_call = _median([run.tests[test].call_seconds for run in plain if test in run.tests])
        checked_call = _median([run.tests[test].call_seconds for run in checked
                                if test in run.tests and run.tests[test].outcome in ("failed", "error")])
        if plain_call is not None and checked_call is not None:
            differences.append(checked_call - plain_call)
    print("\n== cost (torchmem / plain, medians over repetitions) ==")
    print(f"  whole process: wall {wall_ratio:.3f}x, cpu {cpu_ratio:.3f}x")
    print(f"  call phases of the {len(clean)} tests that pass both ways: {calls_ratio:.3f}x")
    print(f"  analysis per failing test: {_ms(_median(own))} median (plugin's figure, {len(own)} samples, "
          f"max {_ms(max(own) if own else None)}; CPU {_ms(_median(own_cpu))} median); "
          f"call-phase difference {_ms(_median(differences))} median")
    return {
        "runs": [{"mode": run.mode, "passed": run.count("passed"), "failed": run.count("failed"),
                  "error": run.count("error"), "skipped": run.count("skipped"), "wall_s": run.wall_seconds,
                  "cpu_s": run.cpu_seconds, "load_before": run.load_before, "load_after": run.load_after}
                 for run in runs],
        "tests_passing_plain": considered,
        "torchmem_only_failures": {test: result.message for test, result in torchmem_failures.items()},
        "wall_ratio": wall_ratio, "cpu_ratio": cpu_ratio, "clean_call_ratio": calls_ratio,
        "analysis_ms_median": None if not own else 1000 * _median(own),
        "analysis_ms_max": None if not own else 1000 * max(own),
        "analysis_cpu_ms_median": None if not own_cpu else 1000 * _median(own_cpu),
        "call_difference_ms_median": None if not differences else 1000 * _median(differences),
    }


PLANTED_MODULE = "test_torchmem_planted_leak"
PLANTED_TEST = f"""# Written by torchmem's benchmarks/third_party_suite.py --plant-leak for one run; removed after.
import torch

_KEPT = []


def test_planted_leak():
    _KEPT.append(torch.ones(256) * 2)  # kept by a module-level list after the test: a leak
    assert float(_KEPT[-1].sum()) == 512.0
"""


def plant_leak(checkout: str, directory: str) -> str:
    """Writes the planted test into ``checkout/directory``; returns its path."""
    folder = os.path.join(checkout, directory)
    if not os.path.isdir(folder):
        sys.exit(f"--plant-leak: {folder} is not a directory of the checkout")
    path = os.path.join(folder, f"{PLANTED_MODULE}.py")
    if os.path.exists(path):
        sys.exit(f"--plant-leak: {path} exists already; remove it first")
    with open(path, "w") as out:
        out.write(PLANTED_TEST)
    return path


def _is_planted(test: str) -> bool:
    return PLANTED_MODULE in test and test.endswith("test_planted_leak")


def report_planted(runs: list[Run]) -> dict:
    """Whether each run saw the planted test as it should: passed plainly, failed under the
    plugin (with the first line of the report that names its holder)."""
    outcomes: dict[str, list] = {PLAIN: [], TORCHMEM: []}
    held_by = ""
    for run in runs:
        for name, result in run.tests.items():
            if _is_planted(name):
                outcomes[run.mode].append(result.outcome)
                for line in (result.message or "").splitlines():
                    if "held by" in line and not held_by:
                        held_by = line.strip()
    caught = outcomes[PLAIN] and all(o == "passed" for o in outcomes[PLAIN]) and outcomes[TORCHMEM] and all(
        o in ("failed", "error") for o in outcomes[TORCHMEM])
    print(f"\n== planted leak ==\n  plain: {', '.join(outcomes[PLAIN]) or 'not run'}; "
          f"torchmem: {', '.join(outcomes[TORCHMEM]) or 'not run'}; caught: {'yes' if caught else 'NO'}"
          + (f"\n  {held_by}" if held_by else ""))
    return {"plain": outcomes[PLAIN], "torchmem": outcomes[TORCHMEM], "caught": bool(caught), "held_by": held_by}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="the third-party checkout; pytest runs there")
    parser.add_argument("paths", nargs="+", help="test paths, relative to the checkout")
    parser.add_argument("--ignore", action="append", default=[], help="a path to leave out (repeatable)")
    parser.add_argument("--device", default="cpu", help="--torchmem-device for the plugin runs (default cpu)")
    parser.add_argument("--repeat", type=int, default=1, help="A/B pairs to run, alternating the order")
    parser.add_argument("--torchmem-arg", dest="torchmem_args", action="append", default=[],
                        help="an extra pytest argument for the plugin runs only (repeatable)")
    parser.add_argument("--show-reports", type=int, default=20, help="failures printed with their report")
    parser.add_argument("--json", help="also write the figures as JSON here")
    parser.add_argument("--repo", default=REPO,
                        help="the torchmem checkout (built in place) the plugin runs come from; default this one "
                             "(another worktree measures an older version with the same script)")
    parser.add_argument("--plant-leak", metavar="DIR",
                        help="a test directory of the checkout to plant a leaking test in for the runs")
    parser.add_argument("pytest_args", nargs="*", default=[], help=argparse.SUPPRESS)
    if argv is None:
        argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1:]
    args = parser.parse_args(argv)
    args.pytest_args = extra
    args.checkout = os.path.abspath(args.checkout)
    args.repo = os.path.abspath(args.repo)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    print(f"torchmem {args.repo}; checkout {args.checkout}; tests {' '.join(args.paths)}; device {args.device}; "
          f"{args.repeat} A/B pair(s); python {sys.version.split()[0]}; cores {os.cpu_count()}")
    planted = plant_leak(args.checkout, args.plant_leak) if args.plant_leak else None
    runs = []
    try:
        for repetition in range(args.repeat):
            order = (PLAIN, TORCHMEM) if repetition % 2 == 0 else (TORCHMEM, PLAIN)
            for mode in order:
                run = run_suite(args, mode)
                print(f"  [{repetition + 1}/{args.repeat}] {mode}: {run.count('passed')} passed, "
                      f"{run.count('failed') + run.count('error')} failed, {run.wall_seconds:.1f} s wall, "
                      f"load {run.load_before:.2f}", flush=True)
                runs.append(run)
    finally:
        if planted is not None:
            os.remove(planted)
    runs.sort(key=lambda run: run.mode != PLAIN)  # stable: plain runs first, each in order
    figures = summarize(runs, args.show_reports)
    if planted is not None:
        figures["planted_leak"] = report_planted(runs)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
