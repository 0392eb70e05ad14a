"""Runs the leak corpus (tests/scenarios/*.py) in every mode that applies, on CPU and on the
simulated CUDA device, and scores what torchmem told the user against each scenario's header.

    python tests/scenarios/runner.py                       # everything, a table on stdout
    python tests/scenarios/runner.py --devices cpu --modes leak_check,growth
    python tests/scenarios/runner.py --markdown docs/leak-corpus.md --json /tmp/corpus.json

Modes, each reading what a user reads:

* ``leak_check``: ``with torchmem.leak_check(raise_on_leak=False) as report:`` around the
  program's loop (header ``check = "loop"``), or a reused ``torchmem.leak_check(warmup=)`` on
  each step (``check = "step"``); the ``LeakReport`` (its findings, as ``to_json`` has them).
* ``pytest``: the program as a test, ``pytest --torchmem``; the test's outcome and the
  failure text the plugin printed (from ``--junitxml``).
* ``run``: ``python -m torchmem run --json PATH scenario.py``; the JSON report written at exit
  (its ``leaks``, and any per-step growth it carries).
* ``growth``: ``torchmem.GrowthMonitor(warmup=)`` stepped after each iteration; its report.

Scores: verdict right (leak or clean, as the header says), allocating line right (a leaked
block or a growing site is reported at the ``# ALLOC`` line; leak scenarios only) and owner
right (a holder path of a block allocated there contains the header's ``owner``; leak
scenarios, where the report names holders: not ``growth``, which names sites, nor ``run`` when
the memory was freed with the script's globals and only its growth per step reports it).

The leak_check and growth modes of all scenarios run in one process per device (``--worker``),
the pytest mode in one pytest session per device, and ``run`` in one process per scenario and
device (it is a whole program), up to ``--jobs`` processes at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCENARIO_DIR = Path(__file__).resolve().parent
ROOT = SCENARIO_DIR.parents[1]
sys.path.insert(0, str(SCENARIO_DIR))
import _corpus  # noqa: E402

DEVICES = ("cpu", "cuda")
IN_PROCESS_MODES = ("leak_check", "growth")


@dataclass
class Observation:
    """What one mode told the user about one scenario on one device."""

    scenario: str
    mode: str
    device: str
    verdict: str | None = None  # "leak" / "clean"; None when the mode failed to give one
    sites: list = field(default_factory=list)  # [file name, line] of each leaked block or growing site
    owners_at_alloc: list = field(default_factory=list)  # holder texts of leaked blocks allocated at the ALLOC line
    text: str = ""  # what the user read (report text, or the failure), for the table's evidence
    error: str | None = None
    names_holders: bool = True  # False when the verdict rests on growth, which names sites only


@dataclass
class Score:
    scenario: str
    mode: str
    device: str
    expected: str
    verdict: str | None
    verdict_ok: bool
    line_ok: bool | None  # None: not scored (clean scenario)
    owner_ok: bool | None  # None: not scored (clean scenario, or the growth mode)
    text: str = ""
    error: str | None = None

    @property
    def all_ok(self) -> bool:
        return self.verdict_ok and self.line_ok is not False and self.owner_ok is not False

    @property
    def key(self) -> str:
        return f"{self.scenario}[{self.mode}-{self.device}]"


# --- reading what the user reads ---------------------------------------------------------

def _findings_observation(observation: Observation, header, findings: list[dict]) -> None:
    """Fills ``sites``/``owners_at_alloc`` from leaked findings (``Finding.to_dict()`` shape)."""
    from torchmem.stacks.frames import Frame, allocation_site  # noqa: PLC0415 - the rule reports use

    for finding in findings:
        site = allocation_site([Frame(f["filename"], f["line"], f["name"]) for f in finding.get("frames") or []])
        if site is None:
            continue
        observation.sites.append([Path(site.filename).name, site.line])
        if Path(site.filename).name == header.path.name and site.line == header.alloc_line:
            observation.owners_at_alloc += [owner["path"] for owner in finding.get("owners", [])]
            if finding.get("note"):
                observation.owners_at_alloc.append(finding["note"])


def _leaked(finding: dict) -> bool:
    return finding["kind"] in ("reachable", "cycle") and finding.get("counted", True)


def observe_leak_reports(header, mode: str, device: str, reports: list) -> Observation:
    """A ``LeakReport`` list (one per check entry) as the user reads it."""
    observation = Observation(header.name, mode, device)
    leaked = [finding for report in reports for finding in report.to_dict()["findings"] if _leaked(finding)]
    observation.verdict = "leak" if leaked else "clean"
    _findings_observation(observation, header, leaked)
    observation.text = "\n\n".join(report.render() for report in reports if report.has_leaks) or reports[-1].render()
    return observation


def observe_growth(header, device: str, report) -> Observation:
    observation = Observation(header.name, "growth", device)
    observation.verdict = "leak" if report.has_growth else "clean"
    observation.names_holders = False
    for growth in report.sites:
        if growth.frame is not None:
            observation.sites.append([Path(growth.frame.filename).name, growth.frame.line])
    observation.text = report.render()
    return observation


# The plugin's failure text: group heads ("  1.0 KiB in 2 blocks  reachable  cpu  tag=x"),
# "held by" lines and "allocated at  file:line  source".
_GROUP_HEAD = re.compile(r"^  \S.* in \d+ blocks?  (?P<kind>[a-z]+(?:, not counted)?)  ")
_HELD_BY = re.compile(r"^      (?:held by)?\s+(?P<holder>\S.*)$")
_ALLOCATED_AT = re.compile(r"^      allocated at  (?P<file>\S+?):(?P<line>\d+)")


def observe_report_text(header, mode: str, device: str, text: str, failed: bool) -> Observation:
    """The plugin's failure text, group by group (the shape ``LeakReport.render`` prints)."""
    observation = Observation(header.name, mode, device, text=text)
    observation.verdict = "leak" if failed else "clean"
    kind, holders = None, []
    for line in text.splitlines():
        head = _GROUP_HEAD.match(line)
        if head:
            kind, holders = head.group("kind"), []
            continue
        if kind is None or kind.endswith("not counted") or kind not in ("reachable", "cycle"):
            continue
        allocated = _ALLOCATED_AT.match(line)
        if allocated:
            site = [Path(allocated.group("file")).name, int(allocated.group("line"))]
            observation.sites.append(site)
            if site == [header.path.name, header.alloc_line]:
                observation.owners_at_alloc += holders
            kind = None  # the rest of the group is its stack
            continue
        held = _HELD_BY.match(line)
        if held:
            holders.append(held.group("holder"))
    return observation


def observe_run_json(header, device: str, data: dict) -> Observation:
    """``python -m torchmem run --json``: the leaks at exit, and the growth per training step
    (``growth.report``, shaped as ``GrowthReport.to_dict()``)."""
    observation = Observation(header.name, "run", device)
    leaks = data.get("leaks") or {}
    leaked = [finding for finding in leaks.get("findings", []) if _leaked(finding)]
    _findings_observation(observation, header, leaked)
    section = data.get("growth") or {}
    report = section.get("report") or {}  # ``run``'s growth per training step (GrowthReport.to_dict())
    growing = [growth for growth in report.get("growing", []) if growth.get("growing", True)]
    for growth in growing:
        frame = growth.get("frame")
        if growth.get("kind") == "site" and frame:
            observation.sites.append([Path(frame["filename"]).name, frame["line"]])
    observation.verdict = "leak" if leaked or growing else "clean"
    observation.names_holders = bool(leaked)  # memory freed with the script's globals is named by site only
    return observation


# --- the modes -----------------------------------------------------------------------------

def _import(header):
    """The scenario's module, loaded afresh: each mode starts from new globals (an empty
    history, an empty cache), as a new run of the program would."""
    import importlib  # noqa: PLC0415

    if header.name in sys.modules:
        return importlib.reload(sys.modules[header.name])
    return importlib.import_module(header.name)


def run_leak_check(header, device: str) -> Observation:
    import torchmem  # noqa: PLC0415

    module = _import(header)
    with _corpus.collector(header.collector):
        state = _corpus.prepare(module)
        if header.check == "loop":
            allowed = {"state": state} if header.allow_state else None
            with torchmem.leak_check(raise_on_leak=False, allow_held_by=allowed) as report:
                _corpus.loop(module, state)
            reports = [report]
        else:
            check = torchmem.leak_check(raise_on_leak=False, warmup=header.warmup)
            reports = []
            _corpus.loop(module, state, wrap_step=check, after_step=lambda: reports.append(check.report))
        del state
    return observe_leak_reports(header, "leak_check", device, reports)


def run_growth(header, device: str) -> Observation:
    import torchmem  # noqa: PLC0415

    module = _import(header)
    with _corpus.collector(header.collector):
        state = _corpus.prepare(module)
        with torchmem.GrowthMonitor(warmup=header.warmup) as monitor:
            _corpus.loop(module, state, after_step=monitor.step)
        del state
    return observe_growth(header, device, monitor.report())


def worker(device: str, modes: list[str], names: list[str] | None) -> list[dict]:
    """The in-process modes of every scenario, in this process (``--worker``)."""
    import torchmem  # noqa: PLC0415

    if device == "cuda":
        torchmem.install()  # CUDA first: PyTorch takes an allocator only before CUDA starts
    torchmem.install("cpu")
    out = []
    for header in _corpus.all_headers():
        if names and header.name not in names:
            continue
        for mode in modes:
            if mode not in header.modes:
                continue
            try:
                observation = (run_leak_check if mode == "leak_check" else run_growth)(header, device)
            except Exception as error:  # noqa: BLE001 - a crash is scored, with its message
                observation = Observation(header.name, mode, device, error=f"{type(error).__name__}: {error}")
            out.append(asdict(observation))
    return out


def _environment(device: str) -> dict:
    env = dict(os.environ)
    if device == "cuda":
        sys.path.insert(0, str(ROOT / "tests" / "simcuda"))
        import simcuda  # noqa: PLC0415

        env = simcuda.environment(device_count=1, memory_bytes="16G")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(SCENARIO_DIR), env.get("PYTHONPATH", "")]))
    env[_corpus.DEVICE_ENV] = device
    return env


def _worker_job(device: str, modes: list[str], names, workdir: Path) -> list[Observation]:
    out_path = workdir / f"worker-{device}.json"
    command = [sys.executable, str(Path(__file__)), "--worker", "--devices", device, "--modes", ",".join(modes),
               "--json", str(out_path)] + (["--only", ",".join(names)] if names else [])
    result = subprocess.run(command, env=_environment(device), cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"the {device} worker failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return [Observation(**item) for item in json.loads(out_path.read_text())]


_PYTEST_TEMPLATE = '''\
"""Generated by tests/scenarios/runner.py: each corpus scenario as a test, run with --torchmem."""
import pytest

import _corpus
{imports}

{tests}
'''

# Scenarios with ``collector = "paused"`` keep the collector off for the whole test, the
# plugin's check included: a collection that happened to run between the test's end and the
# check would decide the result instead of the program.
_PYTEST_CONFTEST = '''\
import gc

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    paused = item.get_closest_marker("corpus_collector_paused") is not None
    if paused:
        gc.collect()
        gc.disable()
    yield
    if paused:
        gc.enable()


def pytest_configure(config):
    config.addinivalue_line("markers", "corpus_collector_paused: the collector is off for the whole test")
'''


def _pytest_job(device: str, headers: list, workdir: Path) -> list[Observation]:
    """One pytest session running every scenario that applies as a test, with the plugin on."""
    chosen = [header for header in headers if "pytest" in header.modes]
    if not chosen:
        return []
    imports = "\n".join(f"import {header.name}" for header in chosen)
    tests = "\n\n".join(
        ("@pytest.mark.corpus_collector_paused\n" if header.collector == "paused" else "")
        + f"def test_{header.name}():\n    _corpus.drive({header.name})\n"
        for header in chosen
    )
    folder = workdir / f"pytest-{device}"
    folder.mkdir()
    (folder / "test_corpus_generated.py").write_text(_PYTEST_TEMPLATE.format(imports=imports, tests=tests))
    (folder / "conftest.py").write_text(_PYTEST_CONFTEST)
    junit = folder / "junit.xml"
    command = [sys.executable, "-m", "pytest", str(folder), "-q", "-p", "no:cacheprovider", "--torchmem",
               "--torchmem-device", device, f"--junitxml={junit}", "-o", "junit_logging=no",
               "--rootdir", str(folder)]
    result = subprocess.run(command, env=_environment(device), cwd=folder, capture_output=True, text=True)
    if not junit.exists():
        raise RuntimeError(f"pytest ({device}) wrote no JUnit XML:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    by_name = {header.name: header for header in chosen}
    observations = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        header = by_name[case.get("name").removeprefix("test_")]
        problems = [element for element in case if element.tag in ("failure", "error")]
        text = "\n".join((element.get("message") or "") + "\n" + (element.text or "") for element in problems)
        observation = observe_report_text(header, "pytest", device, text, failed=bool(problems))
        if problems and "torchmem.leak_check" not in text:
            observation.verdict, observation.error = None, text[-2000:]  # failed for another reason
        observations.append(observation)
    return observations


def _run_job(header, device: str, workdir: Path) -> Observation:
    """``python -m torchmem run --json`` on the scenario as a script."""
    json_path = workdir / f"run-{header.name}-{device}.json"
    command = [sys.executable, "-m", "torchmem", "run", "--device", device, "--json", str(json_path), str(header.path)]
    # cwd: the work folder, which takes the files ``run`` writes by default (its capture)
    result = subprocess.run(command, env=_environment(device), cwd=workdir, capture_output=True, text=True)
    if not json_path.exists():
        return Observation(header.name, "run", device, error=f"exit {result.returncode}, no JSON:\n{result.stderr[-3000:]}")
    observation = observe_run_json(header, device, json.loads(json_path.read_text()))
    observation.text = result.stderr[result.stderr.find("leaks at exit"):][:4000]
    return observation


# --- scoring and tables ---------------------------------------------------------------------

def score(header, observation: Observation) -> Score:
    leak = header.verdict == "leak"
    alloc = [header.path.name, header.alloc_line]
    line_ok = owner_ok = None
    if leak:
        line_ok = alloc in observation.sites
        if observation.names_holders:
            owner_ok = any(header.owner in text for text in observation.owners_at_alloc)
    return Score(
        scenario=header.name, mode=observation.mode, device=observation.device, expected=header.verdict,
        verdict=observation.verdict, verdict_ok=observation.verdict == header.verdict,
        line_ok=line_ok, owner_ok=owner_ok, text=observation.text, error=observation.error,
    )


def run_corpus(devices=DEVICES, modes=_corpus.MODES, names=None, jobs: int | None = None,
               run_names: dict | None = None) -> list[Score]:
    """Runs every (scenario, mode, device) that applies and returns the scores.
    ``run_names``: ``{device: names}`` limits the ``run`` mode (a process per scenario, the
    costly one) on that device to those scenarios."""
    headers = [header for header in _corpus.all_headers() if not names or header.name in names]
    by_name = {header.name: header for header in headers}
    jobs = jobs or os.cpu_count() or 2
    observations: list[Observation] = []
    with tempfile.TemporaryDirectory(prefix="torchmem-corpus-") as temporary, \
            concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        workdir = Path(temporary)
        futures = []
        in_process = [mode for mode in modes if mode in IN_PROCESS_MODES]
        for device in devices:
            if in_process:
                futures.append(pool.submit(_worker_job, device, in_process, names, workdir))
            if "pytest" in modes:
                futures.append(pool.submit(_pytest_job, device, headers, workdir))
        for device in devices:
            if "run" in modes:
                chosen = (run_names or {}).get(device)
                futures += [pool.submit(lambda h=header, d=device: [_run_job(h, d, workdir)])
                            for header in headers
                            if "run" in header.modes and (chosen is None or header.name in chosen)]
        for future in futures:
            observations += future.result()
    order = {name: index for index, name in enumerate(by_name)}
    observations.sort(key=lambda o: (order[o.scenario], _corpus.MODES.index(o.mode), DEVICES.index(o.device)))
    return [score(by_name[observation.scenario], observation) for observation in observations]


def totals(scores: list[Score]) -> list[dict]:
    """Per mode and device, and overall: cases, verdict / line / owner right."""
    groups: dict[tuple, list[Score]] = {}
    for item in scores:
        groups.setdefault((item.mode, item.device), []).append(item)
    groups[("all", "")] = scores
    rows = []
    for (mode, device), items in groups.items():
        lines = [item.line_ok for item in items if item.line_ok is not None]
        owners = [item.owner_ok for item in items if item.owner_ok is not None]
        rows.append({
            "mode": mode, "device": device, "cases": len(items),
            "verdict": (sum(item.verdict_ok for item in items), len(items)),
            "line": (sum(lines), len(lines)), "owner": (sum(owners), len(owners)),
        })
    return rows


def _ratio(pair) -> str:
    right, total = pair
    return f"{right}/{total} ({100 * right / total:.0f}%)" if total else "-"


def _mark(item: Score | None) -> str:
    if item is None:
        return ""
    if item.error or item.verdict is None:
        return "error"
    marks = ["✓" if item.verdict_ok else "✗"]
    marks += ["-" if value is None else "✓" if value else "✗" for value in (item.line_ok, item.owner_ok)]
    return "".join(marks)


def markdown(scores: list[Score], command: str) -> str:
    headers = {header.name: header for header in _corpus.all_headers()}
    columns = [(mode, device) for mode in _corpus.MODES for device in DEVICES
               if any(item.mode == mode and item.device == device for item in scores)]
    lines = [f"Produced by `{command}`.", "", "| mode | device | cases | verdict right | line right | owner right |",
             "|:---|:---|---:|---:|---:|---:|"]
    for row in totals(scores):
        lines.append(f"| {row['mode']} | {row['device']} | {row['cases']} | {_ratio(row['verdict'])} | "
                     f"{_ratio(row['line'])} | {_ratio(row['owner'])} |")
    lines += ["", "Per scenario: verdict, line, owner (`✓` right, `✗` wrong, `-` not scored; blank: the mode "
              "does not apply).", "",
              "| scenario | expected | kind | " + " | ".join(f"{m} {d}" for m, d in columns) + " |",
              "|:---|:---|:---|" + "|".join(":---:" for _ in columns) + "|"]
    index = {(item.scenario, item.mode, item.device): item for item in scores}
    for name in dict.fromkeys(item.scenario for item in scores):
        header = headers[name]
        cells = [_mark(index.get((name, mode, device))) for mode, device in columns]
        lines.append(f"| [{name}]({header.report}) | {header.verdict} | {header.kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def print_table(scores: list[Score]) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    console = Console()
    table = Table(title="torchmem leak corpus")
    for column in ("scenario", "mode", "device", "expected", "said", "verdict", "line", "owner"):
        table.add_column(column)
    for item in scores:
        flag = lambda value: "-" if value is None else ("[green]right" if value else "[red]wrong")  # noqa: E731
        said = item.verdict or f"[red]{(item.error or 'error').splitlines()[0][:40]}"
        table.add_row(item.scenario, item.mode, item.device, item.expected, said,
                      flag(item.verdict_ok), flag(item.line_ok), flag(item.owner_ok))
    console.print(table)
    summary = Table(title="totals")
    for column in ("mode", "device", "cases", "verdict right", "line right", "owner right"):
        summary.add_column(column)
    for row in totals(scores):
        summary.add_row(row["mode"], row["device"], str(row["cases"]), _ratio(row["verdict"]),
                        _ratio(row["line"]), _ratio(row["owner"]))
    console.print(summary)


def _write_markdown(path: Path, table: str) -> None:
    """Replaces the text between the corpus table markers in ``path`` (or writes the table)."""
    begin, end = "<!-- corpus-table:begin -->", "<!-- corpus-table:end -->"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        text = text[: text.index(begin) + len(begin)] + "\n" + table + text[text.index(end):]
    else:
        text = f"{text}{begin}\n{table}{end}\n"
    path.write_text(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default=",".join(DEVICES), help="cpu,cuda (default both)")
    parser.add_argument("--modes", default=",".join(_corpus.MODES), help="comma list of " + ",".join(_corpus.MODES))
    parser.add_argument("--only", default="", help="comma list of scenario names")
    parser.add_argument("--jobs", type=int, default=None, help="processes at a time (default: CPU count)")
    parser.add_argument("--json", help="write the scores (or, with --worker, the observations) as JSON")
    parser.add_argument("--markdown", help="write the table into this markdown file, between its corpus-table markers")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    devices, modes = args.devices.split(","), args.modes.split(",")
    names = [name for name in args.only.split(",") if name] or None
    bad = [d for d in devices if d not in DEVICES] + [m for m in modes if m not in _corpus.MODES]
    if bad:
        parser.error(f"unknown device or mode: {', '.join(bad)}")
    if args.worker:
        Path(args.json).write_text(json.dumps(worker(devices[0], modes, names)))
        return 0
    scores = run_corpus(devices, modes, names, args.jobs)
    print_table(scores)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(item) for item in scores], indent=1))
    if args.markdown:
        shown = ["python tests/scenarios/runner.py"] + (argv if argv is not None else sys.argv[1:])
        shown = [part for index, part in enumerate(shown)
                 if part not in ("--markdown", "--json") and shown[index - 1] not in ("--markdown", "--json")]
        _write_markdown(Path(args.markdown), markdown(scores, " ".join(shown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
